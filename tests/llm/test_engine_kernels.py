"""The native matrix products with GGML-format weights (rcn_fast._C.quant_matmul)
against the plain numpy references (rcn_fast.testing.ggml_blocks): every
weight format (the K-quants included), both arithmetics (float32
activations; llama.cpp's 8-bit activations), every compiled kernel variant
this CPU runs, odd sizes, M = 1 and M > 1, strided inputs and outputs, edge
values; the 8-bit activation blocks bit for bit; batch and thread
invariance (bitwise); bad arguments."""

from __future__ import annotations

import numpy as np
import pytest

from rcn_fast import _native
from rcn_fast.testing import ggml_blocks as gb

_C = _native.cpu_module()[0]
if _C is None or not hasattr(_C, "quant_activations"):
    pytest.skip(f"rcn_fast._C with quant_activations is not built ({_native.cpu_module()[1]})", allow_module_level=True)


def _isas() -> list[str]:
    out = []
    for isa in ("generic", "avx2", "avx512", "avx512vnni"):
        try:
            _C.quant_matmul(np.zeros((1, 32), np.float32), np.zeros((1, 34), np.uint8), gb.Q8_0, 32,
                            np.zeros((1, 1), np.float32), isa=isa)
            out.append(isa)
        except ValueError:
            pass
    return out


ISAS = _isas()
SIZES = [(1, 1, 32), (1, 37, 96), (2, 5, 64), (3, 13, 160), (5, 9, 32), (17, 23, 128), (70, 41, 576)]
KSIZES = [(1, 1, 256), (1, 37, 512), (2, 5, 256), (3, 13, 768), (6, 9, 256), (17, 23, 512), (40, 7, 1024)]
BLOCKED = ["Q4_0", "Q4_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K"]


def _sizes(qname: str) -> list[tuple[int, int, int]]:
    return KSIZES if gb.QTYPES[qname] in gb.KQUANTS else SIZES


def _reference(x: np.ndarray, w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """float64 product and the bound of float32 rounding for it."""
    ref = x.astype(np.float64) @ w.T.astype(np.float64)
    scale = np.abs(x).astype(np.float64) @ np.abs(w).T.astype(np.float64)
    return ref, scale


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("qname", list(gb.QTYPES))
@pytest.mark.parametrize("size", range(len(SIZES)))
def test_matmul_equals_float32_reference(isa, qname, size, rng):
    qt = gb.QTYPES[qname]
    M, N, K = _sizes(qname)[size]
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
@pytest.mark.parametrize("qname", BLOCKED)
def test_edge_values(isa, qname, rng):
    """Zero, negative zero, subnormal and large scales; extreme quants; both arithmetics."""
    qt = gb.QTYPES[qname]
    K = gb.block_of(qt) * 2
    raw = gb.random_blocks(qt, 9, K, rng, edge=True)
    w = gb.dequantize(raw, qt, K)
    deq = np.empty_like(w)
    _C.quant_dequantize(raw, qt, K, deq)
    np.testing.assert_array_equal(deq.view(np.uint32), w.view(np.uint32))
    x = rng.standard_normal((3, K)).astype(np.float32)
    got = np.empty((3, 9), np.float32)
    _C.quant_matmul(x, raw, qt, K, got, isa=isa)
    ref, scale = _reference(x, w)
    assert np.all(np.abs(got - ref) <= 2e-6 * scale + 1e-30)
    _C.quant_matmul(x, raw, qt, K, got, isa=isa, activations="q8")
    ref, scale = gb.q8_products(x, raw, qt, K)
    assert np.all(np.abs(got - ref) <= 4e-6 * scale + 1e-30)


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
@pytest.mark.parametrize("act", ["f32", "q8"])
def test_batch_and_thread_invariance(isa, qname, act, rng):
    """A row's result is the same bits alone, in any batch, on any thread count."""
    qt = gb.QTYPES[qname]
    K = 512 if qt in gb.KQUANTS else 160
    raw = gb.random_blocks(qt, 45, K, rng)
    x = rng.standard_normal((37, K)).astype(np.float32)
    full = np.empty((37, 45), np.float32)
    _C.quant_matmul(x, raw, qt, K, full, num_threads=1, isa=isa, activations=act)
    for rows in ([0], [5, 6], [1, 2, 3], list(range(9, 30)), list(range(37))):
        part = np.empty((len(rows), 45), np.float32)
        _C.quant_matmul(x[rows], raw, qt, K, part, num_threads=2, isa=isa, activations=act)
        np.testing.assert_array_equal(part, full[rows])
    for cols in ([0], [3, 4, 5, 6, 7], list(range(1, 44))):  # any run of weight rows (the tile's columns)
        part = np.empty((37, len(cols)), np.float32)
        _C.quant_matmul(x, np.ascontiguousarray(raw[cols]), qt, K, part, num_threads=1, isa=isa, activations=act)
        np.testing.assert_array_equal(part, full[:, cols])


@pytest.mark.parametrize("qname", BLOCKED)
@pytest.mark.parametrize("M,N", [(1, 37), (3, 16), (9, 45), (70, 24)])
def test_q8_products_are_the_same_bits_everywhere(qname, M, N, rng):
    """The 8-bit arithmetic is defined block by block (an exact integer sum,
    one fused multiply-add): every variant, the interleaved copy or the
    rows as they are, any M and any thread count give the same bits."""
    qt = gb.QTYPES[qname]
    K = 512 if qt in gb.KQUANTS else 96
    raw = gb.random_blocks(qt, N, K, rng)
    x = rng.standard_normal((M, K)).astype(np.float32)
    want = None
    for isa in ISAS:
        for packed in (False, True):
            for threads in (1, 2):
                got = np.empty((M, N), np.float32)
                _C.quant_matmul(x, raw, qt, K, got, num_threads=threads, isa=isa, activations="q8", packed=packed)
                if want is None:
                    want = got
                np.testing.assert_array_equal(got, want, err_msg=f"{isa} packed={packed} threads={threads}")
    one = np.empty((1, N), np.float32)
    _C.quant_matmul(x[-1:], raw, qt, K, one, activations="q8", packed=True)
    np.testing.assert_array_equal(one[0], want[-1])


def _odd_activations(rng: np.random.Generator, M: int, K: int) -> np.ndarray:
    """Rows with every case of the quantisers: gaussian, zero blocks, ties at
    .5 after scaling, a largest value of each sign, huge and tiny values,
    inf and NaN (their blocks only)."""
    x = rng.standard_normal((M, K)).astype(np.float32)
    x[1, :256] = 0.0
    x[2, :32] = np.arange(32, dtype=np.float32) - 15.5  # many exact halves after the 127 / amax scaling
    x[3, 7], x[3, 9] = -5.0, 5.0  # equal magnitudes, the first negative
    x[4] *= np.float32(3e37)
    x[5] *= np.float32(1e-40)
    x[6, 40], x[7, 300] = np.inf, np.nan
    return x


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("qname", ["Q8_0", "Q4_K"])
def test_activation_blocks_are_the_reference_bits(isa, qname, rng):
    qt = gb.QTYPES[qname]
    x = _odd_activations(rng, 9, 512)
    got = np.frombuffer(_C.quant_activations(x, qt, isa=isa), dtype=gb.XBLOCK32 if qt == gb.Q8_0 else gb.XBLOCK256)
    want = gb.quantize_activations(x, qt).ravel()
    assert got.shape == want.shape
    for name in want.dtype.names:
        np.testing.assert_array_equal(np.ascontiguousarray(got[name]).view(np.uint8),
                                      np.ascontiguousarray(want[name]).view(np.uint8), err_msg=name)
    blk = 32 if qt == gb.Q8_0 else 256
    bad = ~np.isfinite(x.reshape(-1, blk)).all(-1)
    assert np.isnan(got["d"][bad]).all() and not np.isnan(got["d"][~bad]).any()


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("qname", BLOCKED)
@pytest.mark.parametrize("size", range(len(SIZES)))
def test_q8_products_equal_llamacpp_arithmetic(isa, qname, size, rng):
    """8-bit activations: the integer block sums times the block scales,
    as computed exactly in numpy, up to float32 rounding of the scales and
    the sum."""
    qt = gb.QTYPES[qname]
    M, N, K = _sizes(qname)[size]
    raw = gb.random_blocks(qt, N, K, rng)
    x = rng.standard_normal((M, K)).astype(np.float32)
    got = np.empty((M, N), np.float32)
    _C.quant_matmul(x, raw, qt, K, got, isa=isa, activations="q8")
    ref, scale = gb.q8_products(x, raw, qt, K)
    assert np.all(np.abs(got - ref) <= 4e-6 * scale + 1e-30), (isa, qname, np.abs(got - ref).max())
    _C.quant_matmul(x, raw, qt, K, got, isa=isa, activations="q8", packed=True)
    assert np.all(np.abs(got - ref) <= 4e-6 * scale + 1e-30), (isa, qname, "packed", np.abs(got - ref).max())
    # the float32 arithmetic is a different number (the activations are not rounded there)
    exact, escale = _reference(x, gb.dequantize(raw, qt, K))
    assert np.abs(got - exact).max() > 1e-4 * escale.max()


@pytest.mark.parametrize("qname", BLOCKED)
def test_dequantisation_equals_gguf_py(qname, rng):
    """The engine's dequantisation and this file's numpy one equal gguf-py's
    (llama.cpp's own Python) bit for bit."""
    gguf = pytest.importorskip("gguf")
    from gguf import quants

    qt = gb.QTYPES[qname]
    K = gb.block_of(qt) * 3
    raw = gb.random_blocks(qt, 11, K, rng, edge=True)
    theirs = quants.dequantize(raw, gguf.GGMLQuantizationType(qt)).astype(np.float32)
    ours = np.empty((11, K), np.float32)
    _C.quant_dequantize(raw, qt, K, ours)
    np.testing.assert_array_equal(ours.view(np.uint32), theirs.view(np.uint32))
    np.testing.assert_array_equal(gb.dequantize(raw, qt, K).view(np.uint32), theirs.view(np.uint32))


def test_info_names_the_variant_in_use():
    info = _C.quant_info()
    assert info["isa"] in ISAS and info["isa"] in info["compiled"].split(",")
    assert info["lanes"] in (8, 16)
    assert "avx512vnni" not in ISAS or "avx512" in ISAS  # VNNI only where AVX-512 is


def test_bad_arguments_are_named(rng):
    x = np.zeros((2, 64), np.float32)
    y = np.zeros((2, 3), np.float32)
    raw = gb.random_blocks(gb.Q8_0, 3, 64, rng)
    with pytest.raises(ValueError, match="qtype"):
        _C.quant_matmul(x, raw, 10, 64, y)  # Q2_K: not multiplied
    with pytest.raises(ValueError, match="multiple of 32"):
        _C.quant_matmul(np.zeros((2, 48), np.float32), raw, gb.Q8_0, 48, y)
    with pytest.raises(ValueError, match="multiple of 256"):
        _C.quant_matmul(x, raw, gb.Q4_K, 64, y)
    with pytest.raises(ValueError, match="activations"):
        _C.quant_matmul(x, raw, gb.Q8_0, 64, y, activations="int4")
    with pytest.raises(ValueError, match="float32 activations"):
        _C.quant_activations(x, gb.F16)
    with pytest.raises(ValueError, match="multiple of 256"):
        _C.quant_activations(x, gb.Q6_K)
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
