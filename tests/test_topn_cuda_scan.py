"""The CUDA tensor-core top-n scan (issue 35 item 2).

Without a GPU: its selection (topn/topn_select.h: threshold, buffer,
bitonic flushes, the slices' lists merged) and its split of float32 queries
run on the host through rcn_fast._C test aids, against the numpy reference.
With a GPU (marked gpu): the scan against the CPU path at odd sizes.
"""

from __future__ import annotations

import numpy as np
import pytest

import rcn_fast
from rcn_fast import _native
from rcn_fast.search.reference import select_topn
from tests.conftest import requires_gpu

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


def _cpu(aid: str = "topn_select_emulated"):
    """rcn_fast._C with the test aid ``aid``, or skip."""
    mod, why = _native.cpu_module()
    if mod is None or not hasattr(mod, aid):
        pytest.skip(f"rcn_fast._C without the test aid {aid}: {why}")
    return mod


def _emulated(scores, k, slice_rows, round_, merge_round):
    mod = _cpu()
    out_s = np.empty((scores.shape[0], k), np.float32)
    out_i = np.empty((scores.shape[0], k), np.int64)
    mod.topn_select_emulated(np.ascontiguousarray(scores, np.float32), k, slice_rows, round_, merge_round,
                             out_s, out_i)
    return out_s, out_i


def _reference(scores, k):
    ids = np.broadcast_to(np.arange(scores.shape[1], dtype=np.int64), scores.shape)
    return select_topn(scores.astype(np.float32), ids, k)


# ------------------------------------------------------------------ the selection, on the host


@pytest.mark.parametrize("Q,N,k,slice_rows,round_,merge_round", [
    (3, 1000, 17, 128, 16, 32),    # many flushes, many slices
    (2, 50, 64, 7, 3, 5),           # k beyond a slice and beyond N
    (4, 300, 5, 1000, 64, 256),     # one slice
    (1, 1, 1, 1, 1, 1),
    (2, 4097, 100, 2048, 64, 256),  # the kernel's sizes: 64-row rounds, 256-candidate merge rounds
    (1, 600, 256, 300, 256, 256),   # the largest k
])
def test_selection_matches_the_reference_with_ties_and_non_finite(Q, N, k, slice_rows, round_, merge_round):
    rng = np.random.default_rng(N + k)
    s = np.round(rng.standard_normal((Q, N)), 1).astype(np.float32)  # many ties
    s[0, ::7] = np.nan
    s[-1, ::5] = -np.inf
    s[0, N // 2] = np.inf
    s[-1, N // 3] = np.inf
    got = _emulated(s, k, slice_rows, round_, merge_round)
    ref = _reference(s, k)
    np.testing.assert_array_equal(got[1], ref[1])
    np.testing.assert_array_equal(got[0], ref[0])


@settings(max_examples=60, deadline=None)
@given(Q=st.integers(1, 3), N=st.integers(0, 300), k=st.integers(1, 70), slice_rows=st.integers(1, 120),
       round_=st.integers(1, 40), merge_round=st.integers(1, 40), levels=st.integers(1, 6),
       nonfinite=st.booleans())
def test_selection_property(Q, N, k, slice_rows, round_, merge_round, levels, nonfinite):
    rng = np.random.default_rng(Q * 7919 + N * 31 + k)
    s = rng.integers(0, levels, (Q, N)).astype(np.float32)  # few distinct values: ties everywhere
    if nonfinite and N:
        s[rng.random((Q, N)) < 0.2] = np.nan
        s[rng.random((Q, N)) < 0.1] = -np.inf
        s[rng.random((Q, N)) < 0.05] = np.inf
    got = _emulated(s, k, slice_rows, round_, merge_round)
    ref = _reference(s, k)
    np.testing.assert_array_equal(got[1], ref[1])
    np.testing.assert_array_equal(got[0], ref[0])


def test_selection_rejects_bad_sizes():
    mod = _cpu()
    s = np.zeros((1, 4), np.float32)
    out_s, out_i = np.empty((1, 2), np.float32), np.empty((1, 2), np.int64)
    with pytest.raises(ValueError, match="slice_rows"):
        mod.topn_select_emulated(s, 2, 0, 1, 1, out_s, out_i)
    with pytest.raises(ValueError, match="k"):
        mod.topn_select_emulated(s, 0, 1, 1, 1, out_s, out_i)


# ------------------------------------------------------------------ the query split, on the host


def _split(q, dtype):
    mod = _cpu()
    n_terms = 2 if dtype == "float16" else 3
    terms = np.empty((n_terms,) + q.shape, np.uint16)
    scales = np.empty((n_terms, q.shape[0]), np.float32)
    assert mod.topn_split_queries(np.ascontiguousarray(q, np.float32), dtype, terms, scales) == n_terms
    return terms, scales


def _as_float(bits, dtype):
    if dtype == "float16":
        return bits.view(np.float16).astype(np.float32)
    ml_dtypes = pytest.importorskip("ml_dtypes")
    return bits.view(ml_dtypes.bfloat16).astype(np.float32)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_split_represents_the_query_and_equals_the_torch_split(dtype):
    rng = np.random.default_rng(9)
    q = (rng.standard_normal((7, 45)) * np.logspace(-30, 30, 7)[:, None]).astype(np.float32)
    q[3] = 0.0
    q[4, 0] = 3e38  # the largest binade: the row scale stops at 2^127
    terms, scales = _split(q, dtype)
    m, _ = np.frexp(scales)
    assert (m == 0.5).all()
    back = (_as_float(terms, dtype) * scales[:, :, None]).sum(0)
    err = np.abs(back - q).max(1) / np.maximum(np.abs(q).max(1), 1e-38)
    assert err.max() <= (2.0**-23 if dtype == "float16" else 0.0)
    torch = pytest.importorskip("torch")
    from rcn_fast.search.torch_backend import split_query

    t_terms, t_scales = split_query(torch, torch.from_numpy(q), dtype)
    np.testing.assert_array_equal(t_terms.view(torch.int16).numpy().view(np.uint16).reshape(terms.shape), terms)
    np.testing.assert_array_equal(t_scales.numpy().reshape(scales.shape), scales)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_split_rounds_to_nearest_even_like_numpy(dtype):
    """The first term is the row / scale rounded to the corpus dtype: the
    shared header's bit-level conversions (float16 subnormals included)
    against numpy's / ml_dtypes' casts."""
    rng = np.random.default_rng(10)
    bits = rng.integers(0, 2**31, 4000, dtype=np.int64).astype(np.uint32)
    x = bits.view(np.float32)
    x = x[np.isfinite(x) & (np.abs(x) < 1)]
    x = np.concatenate([x, np.float32([2.0**-25, 2.0**-24 * 1.5, 2.0**-25 * 1.0000001, 6.1e-5, 0.99999994,
                                       1 - 2.0**-12, 1 - 2.0**-13, 0.0])])
    x = np.where(np.arange(x.size) % 2, -x, x).astype(np.float32)
    q = np.concatenate([np.float32([0.75]), x])[None, :]  # row scale 1: the terms see x itself
    terms, _ = _split(q, dtype)
    if dtype == "float16":
        want = q.astype(np.float16).view(np.uint16)
    else:
        ml_dtypes = pytest.importorskip("ml_dtypes")
        want = q.astype(ml_dtypes.bfloat16).view(np.uint16)
    np.testing.assert_array_equal(terms[0], want)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_split_keeps_a_non_finite_value_in_the_first_term(dtype):
    """+-inf and NaN are the first term as they are and zero after it (so a
    GEMM of the terms scores them as a float32 GEMM does); they do not count
    for the row scale."""
    q = np.float32([[0.75, np.inf, -np.inf, np.nan, 0.5]])
    terms, scales = _split(q, dtype)
    first = _as_float(terms[0], dtype)
    assert first[0, 1] == np.inf and first[0, 2] == -np.inf and np.isnan(first[0, 3])
    assert (terms[1:, 0, 1:4] == 0).all()
    assert scales[0, 0] == 1.0  # the finite values' largest magnitude, 0.75, sets the scale
    np.testing.assert_array_equal(first[0, [0, 4]], [0.75, 0.5])


# ------------------------------------------------------------------ the scan on a GPU


def _gpu_topn(q, c, k, algorithm):
    """rcn_fast._cuda.topn with one algorithm (0 auto, 1 tiled, 2 the scan)."""
    import torch

    mod = _native.cuda_module()[0]
    q, c = (x if x.stride(-1) == 1 else x.contiguous() for x in (q, c))
    scores = torch.empty((q.shape[0], k), dtype=torch.float32, device=c.device)
    ids = torch.empty((q.shape[0], k), dtype=torch.int64, device=c.device)
    mod.topn(q, c, k, scores, ids, torch.cuda.current_stream().cuda_stream, algorithm)
    return scores, ids


@requires_gpu
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("qdtype", ["float32", "same"])
@pytest.mark.parametrize("Q,N,d,k", [(1, 1, 8, 1), (1, 5003, 72, 100), (7, 3001, 136, 17), (33, 1999, 64, 256),
                                     (130, 777, 8, 5), (3, 100, 768, 150)])
def test_scan_matches_the_cpu_on_integer_data(dtype, qdtype, Q, N, d, k):
    """Small integers: every product and sum is exact, so the scan must give
    the CPU's scores and ids exactly, ties (many) by lower id."""
    from rcn_fast.search.topn import CUDA_MMA

    check_integer_data(lambda q, c, kk: _gpu_topn(q, c, kk, CUDA_MMA), dtype, qdtype, Q, N, d, k)


def check_integer_data(run, dtype, qdtype, Q, N, d, k):
    """Small integers: every product and sum is exact, so ``run(q, c, k)``
    (CUDA tensors) must give the CPU's scores and ids exactly, ties (many)
    by lower id."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(Q + N + d + k)
    c = torch.from_numpy(rng.integers(-3, 4, (N, d)).astype(np.float32)).to(getattr(torch, dtype))
    q = torch.from_numpy(rng.integers(-3, 4, (Q, d)).astype(np.float32))
    if qdtype == "same":
        q = q.to(c.dtype)
    kk = min(k, N)
    s, i = run(q.cuda(), c.cuda(), kk)
    rs, ri = rcn_fast.topn(q, c, kk, backend="native")
    np.testing.assert_array_equal(i.cpu().numpy(), ri.numpy())
    np.testing.assert_array_equal(s.cpu().numpy(), rs.numpy())


@requires_gpu
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_scan_on_random_data_agrees_with_the_cpu(dtype):
    torch = pytest.importorskip("torch")
    from rcn_fast.search.topn import CUDA_MMA

    rng = np.random.default_rng(12)
    c = torch.from_numpy(rng.standard_normal((20011, 200)).astype(np.float32)).to(getattr(torch, dtype))
    q = torch.from_numpy(rng.standard_normal((37, 200)).astype(np.float32))
    s, i = _gpu_topn(q.cuda(), c.cuda(), 100, CUDA_MMA)
    rs, ri = rcn_fast.topn(q, c, 100, backend="native")
    assert (i.cpu().numpy() == ri.numpy()).mean() >= 0.999
    np.testing.assert_allclose(s.cpu().numpy(), rs.numpy(), rtol=1e-5, atol=1e-5)


@requires_gpu
def test_scan_non_finite_strides_and_fallbacks():
    torch = pytest.importorskip("torch")
    from rcn_fast.search.topn import CUDA_MMA, CUDA_TILED

    rng = np.random.default_rng(13)
    base = torch.from_numpy(rng.integers(-2, 3, (400, 48)).astype(np.float32)).half()
    q = torch.from_numpy(rng.integers(1, 3, (3, 40)).astype(np.float32))
    for c in (base[:, :40], base[::2, 8:48]):  # strided rows, 16-byte aligned
        for qq in (q, q.half()):
            s, i = _gpu_topn(qq.cuda(), c.cuda(), 30, CUDA_MMA)
            rs, ri = rcn_fast.topn(qq, c, 30, backend="native")
            np.testing.assert_array_equal(i.cpu().numpy(), ri.numpy())
            np.testing.assert_array_equal(s.cpu().numpy(), rs.numpy())
    # non-finite corpus values, queries in the corpus dtype (not split): as on the CPU
    bad = base.clone()
    bad[5, 3] = float("nan")
    bad[9, 0] = float("inf")
    bad[11, 1] = float("-inf")
    s, i = _gpu_topn(q.half().cuda(), bad[:, :40].cuda(), 30, CUDA_MMA)
    rs, ri = rcn_fast.topn(q.half(), bad[:, :40], 30, backend="native")
    np.testing.assert_array_equal(i.cpu().numpy(), ri.numpy())
    assert i[0, 0].item() == 9 and 5 not in i.cpu().numpy() and 11 not in i.cpu().numpy()
    unaligned = base.cuda()[:, 1:41]  # rows off 16-byte alignment: the tiled kernel serves auto
    with pytest.raises(ValueError, match="aligned"):
        _gpu_topn(q.cuda(), unaligned, 30, CUDA_MMA)
    s, i = rcn_fast.topn(q.cuda(), unaligned, 30, backend="cuda")
    rs, ri = rcn_fast.topn(q, base[:, 1:41], 30, backend="native")
    np.testing.assert_array_equal(i.cpu().numpy(), ri.numpy())
    with pytest.raises(ValueError, match="float32 corpus"):
        _gpu_topn(q.cuda(), base.float().cuda()[:, :40], 5, CUDA_MMA)
    s1, i1 = _gpu_topn(q.cuda(), base.cuda()[:, :40], 30, CUDA_TILED)
    np.testing.assert_array_equal(i1.cpu().numpy(), rcn_fast.topn(q, base[:, :40], 30, backend="native")[1].numpy())


@requires_gpu
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_scan_scores_non_finite_queries_as_float32_does(dtype):
    """A float32 query with +-inf or NaN (split: the value is the first term,
    zeros after): the scan returns what the CPU's float32 scan returns."""
    torch = pytest.importorskip("torch")
    from rcn_fast.search.topn import CUDA_MMA

    rng = np.random.default_rng(14)
    c = torch.from_numpy(rng.integers(-2, 3, (500, 16)).astype(np.float32)).to(getattr(torch, dtype))
    q = torch.from_numpy(rng.integers(-2, 3, (4, 16)).astype(np.float32))
    q[0, 3], q[1, 0], q[2, 5], q[3, 1], q[3, 2] = np.inf, -np.inf, np.nan, np.inf, -np.inf
    s, i = _gpu_topn(q.cuda(), c.cuda(), 20, CUDA_MMA)
    rs, ri = rcn_fast.topn(q, c, 20, backend="native")
    np.testing.assert_array_equal(i.cpu().numpy(), ri.numpy())
    np.testing.assert_array_equal(s.cpu().numpy(), rs.numpy())
