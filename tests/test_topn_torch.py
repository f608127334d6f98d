"""The torch backend of top-n (issue 35 item 1, issue 45 item 2): the exact
recipe (one float32-output GEMM + ``topk`` per chunk) with the ordering rules
applied only where they change the result, finished on the device without a
host synchronisation. Run on CPU tensors against the numpy reference: the
code is the one CUDA tensors run (the finishing: rcn_fast._C's
``topn_finish_rows``, the code of the CUDA kernel), with ``torch.mm``'s
``out_dtype`` emulated where the CPU build lacks it. Every exactness test
runs both finishings: on the device, and host-checked in torch ops (what a
device without the extension gets)."""

from __future__ import annotations

import numpy as np
import pytest

import rcn_fast
from rcn_fast.search import topn_reference
from rcn_fast.search import torch_backend as tb
from rcn_fast.search import torch_checked as tc

torch = pytest.importorskip("torch")

DTYPES = ["float32", "float16", "bfloat16"]


def _t(x, dtype):
    return torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32)).to(getattr(torch, dtype))


def _ref(q, c, k):
    """The numpy reference on the values the torch inputs hold."""
    with np.errstate(invalid="ignore"):  # NaN and inf in the inputs: NaN scores, never returned
        return topn_reference(q.float().numpy(), c.float().numpy(), k)


def _check(q, c, k, *, rtol=0.0, **kw):
    """Ids equal to the reference; scores too (``rtol``: random floats,
    whose float32 sums depend on the BLAS's order)."""
    s, i = tb.topn_torch(q, c, k, **kw)
    rs, ri = _ref(q, c, k)
    np.testing.assert_array_equal(i.numpy(), ri)
    np.testing.assert_allclose(s.numpy(), rs, rtol=rtol, atol=0)
    return s, i


@pytest.fixture(autouse=True, params=["device", "checked"])
def finishing(request, monkeypatch):
    """Every test twice: with the device finishing (rcn_fast._C on CPU
    tensors) and with the host-checked finishing in torch ops."""
    if request.param == "checked":
        monkeypatch.setattr(tb, "device_finisher", lambda corpus, k: (None, None))
    else:
        assert tb.device_finisher(torch.zeros((1, 1)), 10)[0] is not None, "rcn_fast._C has no topn_finish_rows"
    return request.param


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


def test_no_sort_of_a_whole_chunk_even_with_ties(monkeypatch, finishing):
    """Sorts only ever see the [Q, 2k] merge (never a chunk). Host-checked:
    the tie fix-up runs only for the rows whose k-th place is tied; on the
    device the finishing decides per row (csrc/topn/topn_block_select.h)."""
    rng = np.random.default_rng(8)
    k, chunk = 5, 400
    widths, fixed = [], []
    real_sort, real_fix = torch.sort, tc.ties_lowest_id

    def sort(x, *a, **kw):
        widths.append(x.shape[-1])
        return real_sort(x, *a, **kw)

    def fix(torch_, s, kk):
        fixed.append(s.shape[0])
        return real_fix(torch_, s, kk)

    monkeypatch.setattr(torch, "sort", sort)
    monkeypatch.setattr(tc, "ties_lowest_id", fix)
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
    assert max(widths) <= 2 * k and fixed == ([4] if finishing == "checked" else [])


def test_chunk_rows_follow_memory():
    assert tb.chunk_rows(512, "cpu") == tb.CPU_CHUNK_ROWS
    assert tb.chunk_rows(1, "cuda") * 4 == tb.GPU_SCORE_BYTES_MAX  # 1M rows a chunk and more at Q = 1
    assert tb.chunk_rows(512, "cuda") * 512 * 4 <= tb.GPU_SCORE_BYTES_MAX
    assert tb.chunk_rows(512, "cuda") >= 1_000_000  # a 1M-row corpus in one GEMM at Q = 512
    assert tb.chunk_rows(32, "cuda", free_bytes=1 << 30) == (1 << 29) // (4 * 32)
    assert tb.chunk_rows(1 << 20, "cuda", free_bytes=1 << 20) == tb.MIN_CHUNK_ROWS
    assert tb.chunk_rows(4, "cuda", row_bytes=12, free_bytes=1 << 21) == tb.MIN_CHUNK_ROWS
    assert tb.chunk_rows(4, "cuda", row_bytes=12, free_bytes=1 << 31) == (1 << 30) // 28


# ------------------------------------------------------------------ no host synchronisation (issue 45 item 2)

SYNC_METHODS = ("item", "tolist", "__bool__", "nonzero", "cpu", "numpy", "__int__", "__float__", "__index__")


@pytest.fixture
def host_syncs(monkeypatch):
    """Counts the calls that make the host wait for the device (on a GPU:
    a synchronisation) made through torch.Tensor while a test runs."""
    calls = []
    for name in SYNC_METHODS:
        real = getattr(torch.Tensor, name)

        def counted(self, *a, _real=real, _name=name, **kw):
            calls.append(_name)
            return _real(self, *a, **kw)

        monkeypatch.setattr(torch.Tensor, name, counted)
    return calls


@pytest.mark.parametrize("dtype,qdtype", [("float32", "float32"), ("float16", "float16"), ("bfloat16", "float32"),
                                          ("float16", "float32")])
def test_the_hot_path_never_waits_for_the_device(out_dtype_mm, host_syncs, finishing, dtype, qdtype):
    """The default finishing neither reads a value on the host nor asks for
    one (no .item / .tolist / bool(tensor) / nonzero / .cpu ...): one chunk
    or several, ties, NaN, -inf and a split float32 query included. The
    host-checked finishing (no extension) reads one set of flags a chunk."""
    rng = np.random.default_rng(9)
    c = rng.integers(-3, 4, (700, 24)).astype(np.float32)
    c[[3, 50, 400]] = np.nan
    c[[7, 8]] = -np.inf
    q = _t(rng.integers(-2, 3, (6, 24)), qdtype)
    c = _t(c, dtype)
    for chunk in (None, 256):
        host_syncs.clear()
        s, i = tb.topn_torch(q, c, 40, chunk=chunk)
        syncs = list(host_syncs)
        rs, ri = _ref(q, c, 40)
        np.testing.assert_array_equal(i.numpy(), ri)
        if finishing == "device":
            assert syncs == [], syncs
        else:
            assert 0 < len(syncs) <= (3 if chunk is None else 3 * 3) * 2


def test_the_dispatch_path_adds_no_synchronisation(host_syncs, finishing):
    q, c = torch.randn(3, 16), torch.randn(300, 16).half()
    rcn_fast.topn(q.half(), c, 7, backend="torch")
    rcn_fast.topn(q, c, 7, backend="torch")
    assert (host_syncs == []) == (finishing == "device")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype,qdtype", [("float16", "float16"), ("bfloat16", "float32"), ("float32", "float32")])
def test_no_synchronisation_on_a_gpu(dtype, qdtype):
    """torch's sync debug mode raises on any host synchronisation: the
    default CUDA top-n (whatever the dispatcher picks) and the torch
    backend make none."""
    rng = np.random.default_rng(10)
    c = _t(rng.standard_normal((50_000, 64)), dtype).cuda()
    q = _t(rng.standard_normal((9, 64)), qdtype).cuda()
    for backend in (None, "torch"):
        rcn_fast.topn(q, c, 100, backend=backend)  # warm-up: the out_dtype probe, streams
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            s, i = rcn_fast.topn(q, c, 100, backend=backend)
        finally:
            torch.cuda.set_sync_debug_mode("default")
        rs, ri = rcn_fast.topn(q.cpu(), c.cpu(), 100)
        assert (i.cpu().numpy() == ri).mean() >= 0.999


# ------------------------------------------------------------------ the device finishing itself


def _native_finish():
    from rcn_fast import _native

    return _native.cpu_module()[0]


def _finish(s, k, **kw):
    mod = _native_finish()
    top = torch.topk(s, min(k + 1, s.shape[1]), dim=1)
    out_s = torch.empty((s.shape[0], k))
    out_i = torch.empty((s.shape[0], k), dtype=torch.int64)
    mod.topn_finish_rows(s, top.values, top.indices, k, kw.pop("id_base", 0), out_s, out_i, **kw)
    return out_s, out_i


@pytest.mark.parametrize("k", [1, 3, 16, 100])
def test_finish_rows_matches_the_reference_on_adversarial_rows(k):
    """Rows of few distinct values (ties at and across the k-th place),
    NaN (more than k of them), -inf, rows shorter than k + 1, strided
    score rows: the same result as the numpy selection."""
    rng = np.random.default_rng(k)
    for n in (1, k, k + 1, 2 * k + 3, 1500):
        base = rng.integers(-4, 5, (11, n + 5)).astype(np.float32)
        base[0] = 1.0  # all tied
        base[1, ::2] = np.nan  # NaN everywhere
        base[2, : n // 2] = -np.inf
        base[3] = np.nan
        base[4, rng.permutation(n)[: min(n, k + 7)]] = np.nan
        s = torch.from_numpy(base)[:, 2 : n + 2]  # rows 5 + n apart
        got_s, got_i = _finish(s, k, id_base=1000)
        ref_s, ref_i = tb_reference(s.numpy(), k)
        np.testing.assert_array_equal(got_i.numpy(), np.where(ref_i >= 0, ref_i + 1000, -1))
        np.testing.assert_array_equal(got_s.numpy(), ref_s)


def tb_reference(s, k):
    from rcn_fast.search.reference import select_topn

    return select_topn(s, np.broadcast_to(np.arange(s.shape[1]), s.shape).astype(np.int64), k)


def test_finish_rows_rescores_nan_of_a_split_query():
    """With queries and the chunk's corpus rows, a NaN score is recomputed
    in float32 before it is judged (inf * 0 of a split term)."""
    c = torch.full((6, 3), 0.5).half()
    c[4, 1] = float("inf")
    q = torch.tensor([[1.0, 2.0, 0.25]])
    s = torch.full((1, 6), 1.75)
    s[0, 4] = float("nan")  # what the split GEMM gives row 4
    got_s, got_i = _finish(s, 3, queries=q, corpus=c)
    assert got_i.tolist() == [[4, 0, 1]] and torch.isposinf(got_s[0, 0])
    got_s, got_i = _finish(s, 3)  # no rescoring: the NaN is never returned
    assert got_i.tolist() == [[0, 1, 2]]


def test_finish_rows_names_bad_arguments():
    mod = _native_finish()
    s = torch.zeros((2, 8))
    top = torch.topk(s, 6, dim=1)
    out = torch.empty((2, 5)), torch.empty((2, 5), dtype=torch.int64)
    with pytest.raises(ValueError, match="top_s, top_i"):
        mod.topn_finish_rows(s, top.values[:, :5].contiguous(), top.indices[:, :5].contiguous(), 5, 0, *out)
    with pytest.raises(ValueError, match="k: expected"):
        mod.topn_finish_rows(s, top.values, top.indices, 0, 0, *out)
    with pytest.raises(ValueError, match="scores_out, ids_out"):
        mod.topn_finish_rows(s, top.values, top.indices, 5, 0, out[0][:1], out[1])
    with pytest.raises(ValueError, match="queries, corpus"):
        mod.topn_finish_rows(s, top.values, top.indices, 5, 0, *out, queries=torch.zeros((2, 3)))
    with pytest.raises(ValueError, match="queries, corpus"):
        mod.topn_finish_rows(s, top.values, top.indices, 5, 0, *out, queries=torch.zeros((2, 3)),
                             corpus=torch.zeros((7, 3)))


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_split_in_torch_ops_equals_the_kernels_split(dtype):
    """torch ops (split_query) and csrc/topn/topn_select.h (the CUDA kernel's
    split, run on the host by rcn_fast._C) give the same bits, non-finite
    values included (the first term as it is, zeros after)."""
    from rcn_fast import _native

    mod = _native.cpu_module()[0]
    rng = np.random.default_rng(11)
    q = (rng.standard_normal((7, 33)) * np.logspace(-30, 30, 7)[:, None]).astype(np.float32)
    q[1, 3], q[2, 0], q[3, :] = np.inf, -np.inf, np.nan
    q[4, 5], q[4, 6] = np.nan, 1e-40
    terms, scales = tb.split_query(torch, torch.from_numpy(q), dtype)
    n_terms = tb.SPLIT_TERMS[dtype][0]
    k_terms = np.zeros((n_terms, 7, 33), np.uint16)
    k_scales = np.zeros((n_terms, 7), np.float32)
    assert mod.topn_split_queries(q, dtype, k_terms, k_scales) == n_terms
    ours = terms.view(torch.int16).numpy().view(np.uint16).reshape(n_terms, 7, 33)
    nan = np.isnan(terms.float().numpy()).reshape(n_terms, 7, 33)
    assert (nan == np.isnan(k_terms.view(np.float16) if dtype == "float16"
                            else (k_terms.astype(np.uint32) << 16).view(np.float32))).all()
    np.testing.assert_array_equal(np.where(nan, 0, ours), np.where(nan, 0, k_terms))
    np.testing.assert_array_equal(scales.numpy().reshape(n_terms, 7), k_scales)
    assert (ours[1:, 1, 3] == 0).all() and (ours[1:, 3] == 0).all()
