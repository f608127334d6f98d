"""The Gram sampler (issue 45 item 5; csrc/sampling/sampling_gram.h,
csrc/sampling/cuda/sampling_gram.cu): a block a question makes the Gram
matrix of its candidates once and the subsets' steps read its rows.

Without a GPU: rcn_fast._C's emulation runs the kernel's logic on the host:
the Gram matrix through the kernel's own mma.m16n8k16 fragment code
(sampling_gram.h) and a host model of the instruction written from the PTX
ISA's fragment layout (so an index mistake in the fragments shows), the
relevances in the kernel's order, the subsets by the shared run_subset. The
Gram matrix equals float32 sums of the exact products in column order (to
the bit for float16/bfloat16); the whole sampler agrees with the CPU
sampler as the CUDA contract says (ids of at least 99.5% of the subsets,
log-probabilities to 1e-5). With a GPU (marked gpu): the kernel against
the CPU sampler, the distribution, the errors.
"""

from __future__ import annotations

import numpy as np
import pytest

from rcn_fast import _native
from rcn_fast.sampling import sample_subsets
from tests.conftest import requires_gpu
from tests.test_sampling import _cast, _compare, _data, check_distribution, check_edge_cases, gpu_draw_cases

DTYPES = ["float32", "float16", "bfloat16"]


def _mod():
    mod = _native.cpu_module()[0]
    if not hasattr(mod, "sample_subsets_gram_emulated"):
        pytest.skip("rcn_fast._C without the Gram sampler's test aids")
    return mod


def _bits(c):
    """(array for the binding, uint16_is_bf16) of candidates in any dtype."""
    if c.dtype.name == "bfloat16":
        return c.view(np.uint16), True
    return c, False


def _emulated(q, c, N, K, *, tau=1.0, seed=0, first="relevance", mask=None):
    mod = _mod()
    B = c.shape[0]
    ids = np.empty((B, N, K), np.int64)
    lp = np.empty((B, N, K), np.float32)
    arr, bf16 = _bits(c)
    mod.sample_subsets_gram_emulated(q, arr, mask, np.arange(B, dtype=np.int64), tau, seed, first == "relevance",
                                     ids, lp, bf16)
    return ids, lp


def _gram(c, b):
    mod = _mod()
    n = c.shape[1]
    npad = -(-n // 16) * 16
    out = np.empty((npad, npad), np.float32)
    arr, bf16 = _bits(c)
    mod.sampling_gram_matrix(arr, b, out, bf16)
    return out


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("n,d", [(1, 1), (7, 3), (16, 64), (100, 768), (128, 130), (33, 200)])
def test_the_tensor_core_gram_is_the_exact_products_summed_in_column_order(dtype, n, d):
    """Through the kernel's fragments and the PTX layout model: every entry
    equals the float32 running sum of the exact products, columns in order
    (the model adds in that order), to the bit; padding rows and columns 0."""
    rng = np.random.default_rng(n * 100 + d)
    _, c = _data(rng, 2, n, d)
    c = _cast(c, dtype)
    G = _gram(c, 1)
    e = c[1].astype(np.float32)
    prods = e[:, None, :] * e[None, :, :]  # exact: products of 11- or 8-bit significands
    want = np.cumsum(prods, axis=2, dtype=np.float32)[:, :, -1]
    np.testing.assert_array_equal(G[:n, :n], want)
    assert (G[n:] == 0).all() and (G[:, n:] == 0).all()


def test_the_float32_gram_matches_float64():
    rng = np.random.default_rng(5)
    _, c = _data(rng, 1, 50, 300)
    G = _gram(c, 0)
    want = c[0].astype(np.float64) @ c[0].astype(np.float64).T
    np.testing.assert_allclose(G[:50, :50], want, rtol=1e-5, atol=1e-4)


def test_the_gram_binding_names_bad_arguments():
    mod = _mod()
    c = np.zeros((2, 5, 4), np.float32)
    with pytest.raises(ValueError, match="out"):
        mod.sampling_gram_matrix(c, 0, np.empty((5, 5), np.float32))
    with pytest.raises(ValueError, match="b: expected"):
        mod.sampling_gram_matrix(c, 2, np.empty((16, 16), np.float32))
    with pytest.raises(ValueError, match="128"):
        mod.sampling_gram_matrix(np.zeros((1, 129, 4), np.float32), 0, np.empty((144, 144), np.float32))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("first", ["uniform", "relevance"])
@pytest.mark.parametrize("B,n,d,N,K", [(1, 1, 1, 1, 1), (3, 7, 3, 5, 4), (5, 33, 17, 7, 6), (2, 100, 64, 9, 5),
                                       (4, 13, 40, 3, 20), (2, 128, 96, 9, 5)])
def test_the_gram_sampler_agrees_with_the_cpu_sampler(dtype, first, B, n, d, N, K):
    rng = np.random.default_rng(B * 1000 + n + d)
    q, c = _data(rng, B, n, d, scale=0.5)
    c = _cast(c, dtype)
    mask = np.ones((B, n), np.uint8)
    mask[-1, ::3] = 0 if n > 1 else 1
    got = _emulated(q, c, N, K, tau=0.7, seed=3, first=first, mask=mask)
    ref = sample_subsets(q, c, N, K, tau=0.7, seed=3, first=first, valid=mask.astype(bool), backend="native",
                         return_logprobs=True)
    _compare(*got, *ref, atol=2e-5)


def test_the_gram_sampler_edge_cases_and_errors():
    q, c = check_edge_cases(lambda q, c, N, K, tau, mask: _emulated(q, c, N, K, tau=tau, seed=1, mask=mask))
    bad = c.copy()
    bad[1, 7, 2] = np.nan
    with pytest.raises(ValueError, match="cand_emb: question 1, candidate 7"):
        _emulated(q, bad, 2, 2)
    masked = np.ones((2, 40), np.uint8)
    masked[1, 7] = 0  # a masked NaN candidate is never looked at
    ids, _ = _emulated(q, bad, 2, 2, mask=masked)
    assert 7 not in ids[1]
    with pytest.raises(ValueError, match="tau: scores / tau overflow"):
        _emulated(q, c * np.float32(1e18), 2, 3, tau=1e-20)


# ------------------------------------------------------------------ on a GPU


def _gpu(q, c, N, K, **kw):
    import torch

    from rcn_fast.sampling.relevance import run_cuda_kernel

    B = c.shape[0]
    keys = np.arange(B, dtype=np.int64)
    mask = kw.pop("mask", None)
    return run_cuda_kernel(torch.from_numpy(q).cuda(), c, N, K, kw.pop("tau", 1.0), kw.pop("seed", 0), keys, mask,
                           kw.pop("first", "relevance") == "relevance", "sample_subsets_gram")


@requires_gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("first", ["uniform", "relevance"])
def test_gpu_gram_sampler_matches_native(dtype, first):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(20)
    for B, n, d, N, K in [(3, 7, 3, 5, 4), (5, 100, 64, 9, 5), (2, 128, 130, 4, 12), (40, 100, 768, 9, 5)]:
        q, c = _data(rng, B, n, d, scale=0.5)
        tc = torch.from_numpy(c).to(getattr(torch, dtype)).cuda()
        mask = np.ones((B, n), np.uint8)
        mask[0, n // 2:] = 0 if n > 1 else 1
        g_ids, g_lp = _gpu(q, tc, N, K, seed=6, first=first, tau=0.8, mask=mask)
        h_ids, h_lp = sample_subsets(q, tc.cpu(), N, K, seed=6, first=first, tau=0.8, valid=mask.astype(bool),
                                     backend="native", return_logprobs=True)
        _compare(g_ids.cpu().numpy(), g_lp.cpu().numpy(), h_ids.numpy(), h_lp.numpy(), atol=2e-5)


@requires_gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_gpu_gram_draws_equal_the_emulation_of_their_arithmetic(dtype):
    """Issue 55, Y2: compiled with --fmad=false, the Gram kernel rounds as
    its host emulation does (the Gram matrix through the mma model, the
    steps without contraction): the same ids; log-probabilities within
    logf's last bits."""
    pytest.importorskip("torch")
    for q, c, tc, N, K in gpu_draw_cases(dtype, 23):
        g_ids, g_lp = _gpu(q, tc, N, K, seed=6, first="relevance", tau=0.8)
        e_ids, e_lp = _emulated(q, c, N, K, tau=0.8, seed=6)
        np.testing.assert_array_equal(g_ids.cpu().numpy(), e_ids)
        np.testing.assert_allclose(g_lp.cpu().numpy(), e_lp, rtol=1e-6, atol=1e-6)


@requires_gpu
def test_gpu_gram_sampler_distribution_unaligned_rows_and_errors():
    torch = pytest.importorskip("torch")
    q, e = check_distribution(lambda q, e, draws, k: _gpu(q.cpu().numpy(), e, draws, k, seed=2024)[0][0].cpu().numpy())
    rng = np.random.default_rng(12)
    # rows off 16-byte alignment: element loads, the same draws
    q2, c2 = _data(rng, 6, 77, 136, scale=0.4)
    tc = torch.from_numpy(c2).half().cuda()
    for cand, query in ((tc[:, :, :130], q2[:, :130]), (tc[:, :, 1:131], q2[:, 1:131])):
        g = _gpu(np.ascontiguousarray(query), cand, 9, 5, seed=3)
        h = sample_subsets(np.ascontiguousarray(query), cand.cpu(), 9, 5, seed=3, first="relevance",
                           backend="native", return_logprobs=True)
        _compare(g[0].cpu().numpy(), g[1].cpu().numpy(), h[0].numpy(), h[1].numpy(), atol=2e-5)
    bad = torch.from_numpy(e).cuda()
    bad[0, 2, 1] = float("nan")
    with pytest.raises(ValueError, match="cand_emb: question 0, candidate 2"):
        _gpu(q, bad, 2, 2)
    with pytest.raises(ValueError, match="128"):
        _gpu(q2[:, :16], torch.zeros((6, 129, 16), device="cuda"), 2, 2)
