"""The torch backend of top-n (issue 35 item 1): the exact recipe (one
float32-output GEMM + ``topk`` per chunk) with the ordering rules applied only
where they change the result. Run on CPU tensors against the numpy
reference: the code is the one CUDA tensors run, with ``torch.mm``'s
``out_dtype`` emulated where the CPU build lacks it."""

from __future__ import annotations

import numpy as np
import pytest

import rcn_fast
from rcn_fast.search import topn_reference
from rcn_fast.search import torch_backend as tb

torch = pytest.importorskip("torch")

DTYPES = ["float32", "float16", "bfloat16"]


def _t(x, dtype):
    return torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32)).to(getattr(torch, dtype))


def _ref(q, c, k):
    """The numpy reference on the values the torch inputs hold."""
    return topn_reference(q.float().numpy(), c.float().numpy(), k)


def _check(q, c, k, **kw):
    s, i = tb.topn_torch(q, c, k, **kw)
    rs, ri = _ref(q, c, k)
    np.testing.assert_array_equal(i.numpy(), ri)
    np.testing.assert_array_equal(s.numpy(), rs)
    return s, i


@pytest.fixture
def out_dtype_mm(monkeypatch):
    """``torch.mm(..., out_dtype=float32)`` on the CPU, as a GPU build has it
    (products of half-precision values are exact in float32, so upcasting
    computes the same thing); records every call's input dtypes."""
    calls = []
    real_mm = torch.mm

    def mm(a, b, *args, out_dtype=None, **kw):
        calls.append((a.dtype, b.dtype, out_dtype))
        if out_dtype is None:
            return real_mm(a, b, *args, **kw)
        return real_mm(a.float(), b.float(), *args, **kw).to(out_dtype)

    monkeypatch.setattr(torch, "mm", mm)
    monkeypatch.setattr(tb, "_OUT_DTYPE_OK", {})
    return calls


# ------------------------------------------------------------------ exactness


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("qdtype", ["float32", "same"])
@pytest.mark.parametrize("Q,N,d,k,chunk", [(1, 1, 1, 1, None), (1, 257, 13, 10, 100), (3, 1000, 37, 17, 333),
                                           (7, 50, 5, 64, 16), (5, 129, 64, 128, None)])
def test_matches_the_reference_on_integer_data(dtype, qdtype, Q, N, d, k, chunk):
    """Small integers: every product and sum is exact in float32 whatever the
    order, so scores and ids (ties included: many) must equal the reference."""
    rng = np.random.default_rng(Q * 1000 + N + d)
    q = _t(rng.integers(-3, 4, (Q, d)), "float32" if qdtype == "float32" else dtype)
    c = _t(rng.integers(-3, 4, (N, d)), dtype)
    _check(q, c, k, chunk=chunk)
    if dtype != "float32" and qdtype == "float32":
        _check(q, c, k, chunk=chunk, split=True)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_float32_query_split_is_exact_to_float32_rounding(dtype):
    """A float32 query on a half-precision corpus, split into terms of the
    corpus dtype: the same ids as upcasting, scores within float32 rounding."""
    rng = np.random.default_rng(3)
    q = torch.from_numpy(rng.standard_normal((6, 96)).astype(np.float32)) * torch.logspace(-3, 3, 6)[:, None]
    c = _t(rng.standard_normal((2000, 96)), dtype)
    rs, ri = _ref(q, c, 25)
    s, i = tb.topn_torch(q, c, 25, chunk=700, split=True)
    assert (i.numpy() == ri).mean() >= 0.99
    np.testing.assert_allclose(s.numpy(), rs, rtol=2e-6, atol=0)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_split_query_represents_the_query(dtype):
    rng = np.random.default_rng(4)
    q = torch.from_numpy(rng.standard_normal((9, 50)).astype(np.float32)) * torch.logspace(-30, 30, 9)[:, None]
    q[2] = 0.0
    terms, scales = tb.split_query(torch, q, dtype)
    n_terms = tb.SPLIT_TERMS[dtype][0]
    assert terms.dtype == getattr(torch, dtype) and terms.shape == (n_terms * 9, 50)
    assert scales.shape == (n_terms * 9, 1)
    m, _ = torch.frexp(scales)
    assert bool((m == 0.5).all())  # powers of two: the scaling is exact
    back = (terms.float() * scales).view(n_terms, 9, 50).sum(0)
    err = ((back - q).abs().amax(1) / q.abs().amax(1).clamp(min=1e-38))
    assert float(err.max()) <= (2.0**-23 if dtype == "float16" else 0.0)


# ------------------------------------------------------------------ the ordering rules


@pytest.mark.parametrize("dtype", DTYPES)
def test_ties_go_to_the_lower_id_within_and_across_chunks(dtype):
    q = _t(np.ones((2, 4)), dtype)
    c = np.zeros((300, 4), np.float32)
    c[[5, 17, 120, 121, 250, 299], 0] = 1.0  # six rows tie for first place
    c[[3, 200], 0] = 2.0
    c = _t(c, dtype)
    for chunk in (None, 7, 64, 121):
        s, i = _check(q, c, 5, chunk=chunk)
        assert i[0].tolist() == [3, 200, 5, 17, 120]
    s, i = _check(q, c, 300, chunk=50)  # every row: the zeros in id order after the ones
    assert i[0, :8].tolist() == [3, 200, 5, 17, 120, 121, 250, 299] and i[0, 8:11].tolist() == [0, 1, 2]


@pytest.mark.parametrize("dtype", DTYPES)
def test_nan_and_minus_inf_never_returned_plus_inf_first(dtype):
    c = np.arange(40, dtype=np.float32).reshape(20, 2) / 10
    c[[1, 7]] = np.nan
    c[[4, 12]] = -np.inf
    c[[9, 15]] = np.inf
    q = _t(np.ones((1, 2)), dtype)
    c = _t(c, dtype)
    for chunk in (None, 3, 8):
        s, i = _check(q, c, 20, chunk=chunk)
        ids = i[0].tolist()
        assert ids[:2] == [9, 15] and 1 not in ids and 7 not in ids and 4 not in ids and 12 not in ids
        assert ids[-4:] == [-1] * 4 and torch.isneginf(s[0, -4:]).all()


def test_nan_rows_of_a_split_query_are_rescored_exactly(out_dtype_mm):
    """An infinite corpus value times a zero remainder term is NaN in the
    split GEMM; the NaN shows in the selection and the row is rescored with
    both sides upcast, so the +inf score ranks first as on the CPU."""
    c = np.full((10, 3), 0.5, np.float32)
    c[4, 1] = np.inf
    q = torch.tensor([[1.0, 2.0, 0.25]])  # exact in float16: remainder terms are zero
    s, i = _check(q, _t(c, "float16"), 3)
    assert i[0, 0] == 4 and torch.isposinf(s[0, 0])


@pytest.mark.parametrize("dtype", DTYPES)
def test_k_beyond_n_pads_and_zero_queries(dtype):
    rng = np.random.default_rng(5)
    c = _t(rng.standard_normal((6, 3)), dtype)
    q = _t(rng.standard_normal((2, 3)), dtype)
    s, i = rcn_fast.topn(q, c, 9, backend="torch")
    assert i.shape == (2, 9) and (i[:, 6:] == -1).all() and torch.isneginf(s[:, 6:]).all()
    assert sorted(i[0, :6].tolist()) == list(range(6))
    s, i = rcn_fast.topn(q[:0], c, 4, backend="torch")
    assert s.shape == (0, 4) and i.shape == (0, 4)


@pytest.mark.parametrize("dtype", DTYPES)
def test_non_contiguous_inputs(dtype):
    rng = np.random.default_rng(6)
    big_c = _t(rng.integers(-2, 3, (90, 20)), dtype)
    big_q = _t(rng.integers(-2, 3, (8, 40)), dtype)
    c, q = big_c[::3, ::2], big_q[1::2, 5:25:2]  # strided rows and columns
    assert not c.is_contiguous() and not q.is_contiguous()
    s, i = rcn_fast.topn(q, c, 11, backend="torch")
    rs, ri = _ref(q, c, 11)
    np.testing.assert_array_equal(i.numpy(), ri)
    np.testing.assert_array_equal(s.numpy(), rs)


# ------------------------------------------------------------------ the recipe, and its cost


def test_default_on_half_precision_is_one_float32_output_gemm(out_dtype_mm):
    """Where torch.mm has out_dtype (the GPU), the corpus is never upcast:
    one half-precision GEMM per chunk with float32 output; a float32 query
    is split into terms stacked in that one GEMM."""
    rng = np.random.default_rng(7)
    c = _t(rng.integers(-3, 4, (500, 16)), "bfloat16")
    q = _t(rng.integers(-3, 4, (3, 16)), "bfloat16")
    _check(q, c, 10, chunk=200)
    assert out_dtype_mm and all(a == b == torch.bfloat16 and o == torch.float32 for a, b, o in out_dtype_mm)
    assert len(out_dtype_mm) == 3 + 1  # three chunks (+ the capability probe)
    out_dtype_mm.clear()
    _check(q.float(), c, 10, chunk=200)
    gemms = [x for x in out_dtype_mm if x[2] is not None]
    assert all(a == b == torch.bfloat16 for a, b, _ in gemms) and len(gemms) == 3
    assert not [x for x in out_dtype_mm if x[2] is None]  # no upcast GEMM


def _exact_ints(rng, shape) -> "torch.Tensor":
    """float32 integers in [-1000, 1000]: at d <= 8 every product and partial
    sum is an integer below 2^24, exact in float32, so torch's GEMM and the
    numpy reference give the same bits whatever order either sums in (random
    normal data differs in the last bit on some CPUs), and the wide range
    keeps ties between scores as rare as on random data."""
    return torch.from_numpy(rng.integers(-1000, 1001, shape).astype(np.float32))


def test_no_sort_of_a_whole_chunk_even_with_ties(monkeypatch):
    """Sorts only ever see the [Q, 2k] merge (never a chunk); the tie fix-up
    runs only for the rows whose k-th place is tied."""
    rng = np.random.default_rng(8)
    k, chunk = 5, 400
    widths, fixed = [], []
    real_sort, real_fix = torch.sort, tb._ties_lowest_id

    def sort(x, *a, **kw):
        widths.append(x.shape[-1])
        return real_sort(x, *a, **kw)

    def fix(torch_, s, kk):
        fixed.append(s.shape[0])
        return real_fix(torch_, s, kk)

    monkeypatch.setattr(torch, "sort", sort)
    monkeypatch.setattr(tb, "_ties_lowest_id", fix)
    q = _exact_ints(rng, (4, 8))
    c = _exact_ints(rng, (1200, 8))
    _check(q, c, k, chunk=chunk)
    assert widths and max(widths) <= 2 * k and not fixed  # random data: no tie, no fix-up
    widths.clear()
    _check(q, c, k)  # one chunk, no tie: topk's output as it is, no sort at all
    assert widths == [] and not fixed
    c[:, :] = _exact_ints(rng, (1200, 8))
    c[[10, 20, 30, 40, 50, 60], :] = 1500.0  # query 0..3 all see six equal best rows in chunk 0
    q = q.abs()
    widths.clear()
    _check(q, c, k, chunk=chunk)
    assert max(widths) <= 2 * k and fixed == [4]


def test_chunk_rows_follow_memory():
    assert tb.chunk_rows(512, "cpu") == tb.CPU_CHUNK_ROWS
    assert tb.chunk_rows(1, "cuda") * 4 == tb.GPU_SCORE_BYTES_MAX  # 1M rows a chunk and more at Q = 1
    assert tb.chunk_rows(512, "cuda") * 512 * 4 <= tb.GPU_SCORE_BYTES_MAX
    assert tb.chunk_rows(512, "cuda") >= 1_000_000  # a 1M-row corpus in one GEMM at Q = 512
    assert tb.chunk_rows(32, "cuda", free_bytes=1 << 30) == (1 << 29) // (4 * 32)
    assert tb.chunk_rows(1 << 20, "cuda", free_bytes=1 << 20) == tb.MIN_CHUNK_ROWS
    assert tb.chunk_rows(4, "cuda", row_bytes=12, free_bytes=1 << 21) == tb.MIN_CHUNK_ROWS
    assert tb.chunk_rows(4, "cuda", row_bytes=12, free_bytes=1 << 31) == (1 << 30) // 28
