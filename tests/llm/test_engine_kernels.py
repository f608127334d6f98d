"""The native matrix products with GGML-format weights (rcn_fast._C.quant_matmul)
against the plain numpy reference (rcn_fast.testing.ggml_blocks): every
weight format, every compiled kernel variant this CPU runs, odd sizes,
M = 1 and M > 1, strided inputs and outputs, edge values; batch and thread
invariance (bitwise); bad arguments."""

from __future__ import annotations

import numpy as np
import pytest

from rcn_fast import _native
from rcn_fast.testing import ggml_blocks as gb

_C = _native.cpu_module()[0]
if _C is None or not hasattr(_C, "quant_matmul"):
    pytest.skip(f"rcn_fast._C with quant_matmul is not built ({_native.cpu_module()[1]})", allow_module_level=True)


def _isas() -> list[str]:
    out = []
    for isa in ("generic", "avx2", "avx512"):
        try:
            _C.quant_matmul(np.zeros((1, 32), np.float32), np.zeros((1, 34), np.uint8), gb.Q8_0, 32,
                            np.zeros((1, 1), np.float32), isa=isa)
            out.append(isa)
        except ValueError:
            pass
    return out


ISAS = _isas()
SIZES = [(1, 1, 32), (1, 37, 96), (2, 5, 64), (3, 13, 160), (5, 9, 32), (17, 23, 128), (70, 41, 576)]


def _reference(x: np.ndarray, w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """float64 product and the bound of float32 rounding for it."""
    ref = x.astype(np.float64) @ w.T.astype(np.float64)
    scale = np.abs(x).astype(np.float64) @ np.abs(w).T.astype(np.float64)
    return ref, scale


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("qname", list(gb.QTYPES))
@pytest.mark.parametrize("M,N,K", SIZES)
def test_matmul_equals_float32_reference(isa, qname, M, N, K, rng):
    qt = gb.QTYPES[qname]
    raw = gb.random_blocks(qt, N, K, rng)
    w = gb.dequantize(raw, qt, K)
    got = np.empty((M, N), np.float32)
    _C.quant_matmul(np.zeros((M, K), np.float32), raw, qt, K, got, isa=isa)
    assert not got.any()
    x = rng.standard_normal((M, K)).astype(np.float32)
    _C.quant_matmul(x, raw, qt, K, got, isa=isa)
    ref, scale = _reference(x, w)
    assert np.all(np.abs(got - ref) <= 2e-6 * scale + 1e-30), (isa, qname, np.abs(got - ref).max())


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("qname", ["F16", "F32"])
@pytest.mark.parametrize("K", [1, 7, 15, 17, 33, 100])
def test_plain_rows_of_any_length(isa, qname, K, rng):
    qt = gb.QTYPES[qname]
    raw = gb.random_blocks(qt, 11, K, rng)
    x = rng.standard_normal((6, K)).astype(np.float32)
    for M in (1, 6):
        got = np.empty((M, 11), np.float32)
        _C.quant_matmul(x[:M], raw, qt, K, got, isa=isa)
        ref, scale = _reference(x[:M], gb.dequantize(raw, qt, K))
        assert np.all(np.abs(got - ref) <= 2e-6 * scale + 1e-30)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("qname", ["Q4_0", "Q4_1", "Q8_0"])
def test_edge_values(isa, qname, rng):
    """Zero, negative zero, subnormal and large scales; extreme quants."""
    qt = gb.QTYPES[qname]
    raw = gb.random_blocks(qt, 9, 64, rng, edge=True)
    w = gb.dequantize(raw, qt, 64)
    deq = np.empty_like(w)
    _C.quant_dequantize(raw, qt, 64, deq)
    np.testing.assert_array_equal(deq, w)
    x = rng.standard_normal((3, 64)).astype(np.float32)
    got = np.empty((3, 9), np.float32)
    _C.quant_matmul(x, raw, qt, 64, got, isa=isa)
    ref, scale = _reference(x, w)
    assert np.all(np.abs(got - ref) <= 2e-6 * scale + 1e-30)


@pytest.mark.parametrize("isa", ISAS)
def test_strided_inputs_bias_and_accumulate(isa, rng):
    raw = gb.random_blocks(gb.Q4_1, 19, 96, rng)
    w = gb.dequantize(raw, gb.Q4_1, 96)
    big = rng.standard_normal((12, 200)).astype(np.float32)
    x = big[::2, 5:101]  # rows 400 floats apart, not contiguous
    assert not x.flags.c_contiguous
    out = np.full((6, 40), 7.0, np.float32)
    y = out[:, 3:22]
    bias = rng.standard_normal(19).astype(np.float32)
    _C.quant_matmul(x, raw, gb.Q4_1, 96, y, bias=bias, accumulate=True, isa=isa)
    ref, scale = _reference(x, w)
    assert np.all(np.abs(y - (7.0 + bias + ref)) <= 2e-6 * scale + 1e-5)
    assert (out[:, :3] == 7.0).all() and (out[:, 22:] == 7.0).all()


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("qname", list(gb.QTYPES))
def test_batch_and_thread_invariance(isa, qname, rng):
    """A row's result is the same bits alone, in any batch, on any thread count."""
    qt = gb.QTYPES[qname]
    K = 160
    raw = gb.random_blocks(qt, 45, K, rng)
    x = rng.standard_normal((37, K)).astype(np.float32)
    full = np.empty((37, 45), np.float32)
    _C.quant_matmul(x, raw, qt, K, full, num_threads=1, isa=isa)
    for rows in ([0], [5, 6], [1, 2, 3], list(range(9, 30)), list(range(37))):
        part = np.empty((len(rows), 45), np.float32)
        _C.quant_matmul(x[rows], raw, qt, K, part, num_threads=2, isa=isa)
        np.testing.assert_array_equal(part, full[rows])


def test_info_names_the_variant_in_use():
    info = _C.quant_info()
    assert info["isa"] in ISAS and info["isa"] in info["compiled"].split(",")
    assert info["lanes"] in (8, 16)


def test_bad_arguments_are_named(rng):
    x = np.zeros((2, 64), np.float32)
    y = np.zeros((2, 3), np.float32)
    raw = gb.random_blocks(gb.Q8_0, 3, 64, rng)
    with pytest.raises(ValueError, match="qtype"):
        _C.quant_matmul(x, raw, 12, 64, y)
    with pytest.raises(ValueError, match="multiple of 32"):
        _C.quant_matmul(np.zeros((2, 48), np.float32), raw, gb.Q8_0, 48, y)
    with pytest.raises(ValueError, match="w: holds"):
        _C.quant_matmul(x, raw[:2], gb.Q8_0, 64, y)
    with pytest.raises(ValueError, match="x: expected 32 columns"):
        _C.quant_matmul(x, raw, gb.Q8_0, 32, y)
    with pytest.raises(ValueError, match="y: expected M rows"):
        _C.quant_matmul(x, raw, gb.Q8_0, 64, np.zeros((3, 3), np.float32))
    with pytest.raises(ValueError, match="bias"):
        _C.quant_matmul(x, raw, gb.Q8_0, 64, y, bias=np.zeros(2, np.float32))
    with pytest.raises(ValueError, match="isa"):
        _C.quant_matmul(x, raw, gb.Q8_0, 64, y, isa="sse9")
    with pytest.raises(ValueError, match="contiguous"):
        _C.quant_matmul(np.zeros((64, 2), np.float32).T, raw, gb.Q8_0, 64, y)
