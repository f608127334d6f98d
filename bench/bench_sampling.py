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

On a GPU (``-k gpu``): B = 1,000 and 10,000 (RCN_FAST_BENCH_GPU_BS), float32,
float16 and bfloat16, the CUDA kernel against rcn_fast's torch backend on
the GPU; the figures are recorded in bench/gpu_results.
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


def _extra(benchmark, b: int = B) -> float | None:
    """subsets/s and textbook GFLOP/s of ``b`` questions into extra_info; the
    mean seconds a call (None, nothing recorded, when no timing was taken)."""
    t = benchmark.stats.stats.mean if getattr(benchmark, "stats", None) else None
    if not t:
        return None
    flops = 2 * b * (n * D + N * (K - 1) * n * D)
    benchmark.extra_info["subsets/s"] = round(b * N / t, 1)
    benchmark.extra_info["GFLOP/s (textbook)"] = round(flops / t / 1e9, 2)
    return t


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
# Group "sample_subsets GPU B=<B> n=100 d=768 K=5 N=9 <dtype>" for B in
# GPU_BS (RCN_FAST_BENCH_GPU_BS, comma-separated), three dtypes: "cuda" (the
# warp sampler, kernel "sample_subsets"), "cuda_gram" (the Gram sampler,
# kernel "sample_subsets_gram") and "torch_cuda" (rcn_fast's torch backend
# on the GPU).
GPU_BS = tuple(int(x) for x in os.environ.get("RCN_FAST_BENCH_GPU_BS", "1000,10000").split(","))
GPU_DTYPES = ("float32", "float16", "bfloat16")


@pytest.fixture(scope="module")
def gpu_data():
    """L2-normalised random inputs made on the GPU (seeded), per B and dtype."""
    torch = pytest.importorskip("torch")
    from rcn_fast import _native

    if _native.cuda_module()[0] is None or not torch.cuda.is_available():
        pytest.skip(f"no usable GPU: {_native.cuda_module()[1]}")
    gen = torch.Generator(device="cuda").manual_seed(0)
    out = {}
    for b in GPU_BS:
        q = torch.randn((b, D), device="cuda", generator=gen)
        q /= q.norm(dim=1, keepdim=True)
        c = torch.randn((b, n, D), device="cuda", generator=gen)
        c /= c.norm(dim=2, keepdim=True)
        out[b] = (q, {dt: c.to(getattr(torch, dt)) for dt in GPU_DTYPES})
        del c
    return out


CUDA_KERNEL_IMPLS = {"cuda": "sample_subsets", "cuda_gram": "sample_subsets_gram"}


def _run_cuda(benchmark, backend, q, c):
    """``backend``: "torch" (the torch backend) or a CUDA kernel's column
    ("cuda", "cuda_gram"): that kernel, on the arguments sample_subsets
    gives it (keys 0..B-1, no mask, the first document uniform)."""
    import torch

    from rcn_fast.sampling.relevance import run_cuda_kernel

    keys = np.arange(c.shape[0], dtype=np.int64)

    def call():
        if backend == "torch":
            ids = sample_subsets(q, c, N, K, tau=TAU, seed=1, backend="torch")
        else:
            ids = run_cuda_kernel(q, c, N, K, TAU, 1, keys, None, False, CUDA_KERNEL_IMPLS[backend])[0]
        torch.cuda.synchronize()
        return ids

    return benchmark(call)


@pytest.mark.parametrize("dtype", GPU_DTYPES)
@pytest.mark.parametrize("b", GPU_BS)
@pytest.mark.parametrize("impl", ["cuda", "cuda_gram", "torch_cuda"])
def test_gpu_sampler(benchmark, record, gpu_data, b, dtype, impl):
    q, cs = gpu_data[b]
    benchmark.group = f"sample_subsets GPU B={b} n={n} d={D} K={K} N={N} {dtype}"
    ids = _run_cuda(benchmark, "torch" if impl == "torch_cuda" else impl, q, cs[dtype])
    assert ids.shape == (b, N, K) and int(ids.min()) >= 0
    t = _extra(benchmark, b)
    if t:
        benchmark.extra_info["GB/s of one input read"] = round(cs[dtype].nbytes / t / 1e9, 2)
    record(benchmark.group, impl, benchmark)
