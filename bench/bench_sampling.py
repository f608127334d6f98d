"""Relevance-based subset sampling: rcn_fast native vs the vectorised numpy
reference and a per-question torch.distributions.Categorical loop (how the
published ReConnect code samples).

Sizes (issue 3): B = 1000 questions, n = 100 candidates, d = 768, K = 5,
N = 9 subsets, float32 and float16 candidates; RCN_FAST_BENCH_QUICK=1 for
B = 100; RCN_FAST_BENCH_B overrides B. Embeddings are L2-normalised random
vectors and tau = 0.05 (METHODS.md: normalised embeddings need tau near
0.05): draws are diverse, so few similarity rows are shared between subsets
(close to the native kernel's worst case). The peers come from the package
(rcn_fast.sampling, rcn_fast/testing/peers.py), which the tests check
against the exact distribution, so they cannot drift. extra_info: subsets/s
and GFLOP/s of the textbook algorithm (2 * B * (n*d + N*(K-1)*n*d) flops). Run:

    python -m pytest bench/bench_sampling.py --benchmark-only --benchmark-columns=mean,min,rounds
"""

from __future__ import annotations

import os

import numpy as np
import pytest

from rcn_fast.sampling import sample_subsets, sample_subsets_reference

QUICK = bool(os.environ.get("RCN_FAST_BENCH_QUICK"))
B = int(os.environ.get("RCN_FAST_BENCH_B", 100 if QUICK else 1000))
n, D, K, N, TAU = 100, 768, 5, 9, 0.05
DTYPES = ("float32", "float16")


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(0)
    q = rng.standard_normal((B, D), dtype=np.float32)
    q /= np.linalg.norm(q, axis=1, keepdims=True)
    c = rng.standard_normal((B, n, D), dtype=np.float32)
    c /= np.linalg.norm(c, axis=2, keepdims=True)
    return q, {"float32": c, "float16": c.astype(np.float16)}


def _extra(benchmark):
    t = benchmark.stats.stats.mean
    flops = 2 * B * (n * D + N * (K - 1) * n * D)
    benchmark.extra_info["subsets/s"] = round(B * N / t, 1)
    benchmark.extra_info["GFLOP/s (textbook)"] = round(flops / t / 1e9, 2)


@pytest.mark.parametrize("dtype", DTYPES)
def test_native(benchmark, record, data, dtype):
    q, cs = data
    benchmark.group = f"sample_subsets B={B} n={n} d={D} K={K} N={N} {dtype}"
    ids = benchmark(sample_subsets, q, cs[dtype], N, K, tau=TAU, seed=1, backend="native")
    assert ids.shape == (B, N, K) and ids.min() >= 0
    _extra(benchmark)
    record(benchmark.group, "native", benchmark)


@pytest.mark.parametrize("dtype", DTYPES)
def test_numpy_vectorised_reference(benchmark, record, data, dtype):
    q, cs = data
    benchmark.group = f"sample_subsets B={B} n={n} d={D} K={K} N={N} {dtype}"
    ids, _ = benchmark(sample_subsets_reference, q, cs[dtype], N, K, tau=TAU, seed=1)
    assert ids.shape == (B, N, K)
    _extra(benchmark)
    record(benchmark.group, "numpy", benchmark)


@pytest.mark.parametrize("dtype", DTYPES)
def test_torch_categorical_loop(benchmark, pedantic, record, data, dtype):
    torch = pytest.importorskip("torch")
    from rcn_fast.testing.peers import torch_loop_sample

    q, cs = data
    benchmark.group = f"sample_subsets B={B} n={n} d={D} K={K} N={N} {dtype}"
    tq, tc = torch.from_numpy(q), torch.from_numpy(cs[dtype])
    # one intra-op thread: the loop's ops are tiny, and more threads only add
    # synchronisation (on a shared 2-core machine, a lot of it)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        ids = pedantic(torch_loop_sample, tq, tc, N, K, tau=TAU, seed=1)
    finally:
        torch.set_num_threads(threads)
    assert ids.shape == (B, N, K)
    _extra(benchmark)
    record(benchmark.group, "torch_loop", benchmark)


# ---- GPU (skipped without a usable CUDA build and device) ----------------
@pytest.fixture(scope="module")
def gpu_data(data):
    torch = pytest.importorskip("torch")
    from rcn_fast import _native

    if _native.cuda_module()[0] is None or not torch.cuda.is_available():
        pytest.skip(f"no usable GPU: {_native.cuda_module()[1]}")
    q, cs = data
    return torch.from_numpy(q).cuda(), {dt: torch.from_numpy(c).cuda() for dt, c in cs.items()}


def _run_cuda(benchmark, backend, q, c):
    import torch

    def call():
        ids = sample_subsets(q, c, N, K, tau=TAU, seed=1, backend=backend)
        torch.cuda.synchronize()
        return ids

    return benchmark(call)


@pytest.mark.parametrize("dtype", DTYPES)
def test_cuda(benchmark, record, gpu_data, dtype):
    q, cs = gpu_data
    benchmark.group = f"sample_subsets GPU B={B} n={n} d={D} K={K} N={N} {dtype}"
    ids = _run_cuda(benchmark, "cuda", q, cs[dtype])
    assert ids.shape == (B, N, K) and int(ids.min()) >= 0
    _extra(benchmark)
    record(benchmark.group, "cuda", benchmark)


@pytest.mark.parametrize("dtype", DTYPES)
def test_torch_cuda_vectorised(benchmark, record, gpu_data, dtype):
    """The vectorised algorithm in torch ops on the GPU (rcn_fast's torch backend)."""
    q, cs = gpu_data
    benchmark.group = f"sample_subsets GPU B={B} n={n} d={D} K={K} N={N} {dtype}"
    ids = _run_cuda(benchmark, "torch", q, cs[dtype])
    assert ids.shape == (B, N, K)
    _extra(benchmark)
    record(benchmark.group, "torch_cuda", benchmark)
