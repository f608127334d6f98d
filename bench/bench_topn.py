"""Exact top-n search: rcn_fast native vs numpy, torch and faiss-cpu.

Sizes: N x d corpus (default 1,000,000 x 768; RCN_FAST_BENCH_N to change,
RCN_FAST_BENCH_QUICK=1 for N = 100,000), k = 100, Q in {1, 32, 512},
float32 and float16 corpora (on a GPU also bfloat16, queries float32 or in
the corpus dtype, against the exact float32-output recipe and the
one-liner ``torch.topk(q @ c.T, k)``: ``-k gpu``). extra_info has GB/s of
corpus scanned and GFLOP/s. Run:

    python -m pytest bench/bench_topn.py --benchmark-only --benchmark-columns=mean,min,rounds

A GPU run records its figures in bench/gpu_results (bench/gpu_check.sh runs
every GPU benchmark in one command).
"""

from __future__ import annotations

import functools
import os

import numpy as np
import pytest

import rcn_fast
from rcn_fast.search import topn_reference

N = int(os.environ.get("RCN_FAST_BENCH_N", 100_000 if os.environ.get("RCN_FAST_BENCH_QUICK") else 1_000_000))
D, K = 768, 100
QS = (1, 32, 512)
DTYPES = ("float32", "float16")


@pytest.fixture(scope="module")
def corpora():
    rng = np.random.default_rng(0)
    c32 = rng.standard_normal((N, D), dtype=np.float32)
    return {"float32": c32, "float16": c32.astype(np.float16)}


@pytest.fixture(scope="module")
def queries():
    rng = np.random.default_rng(1)
    return {q: rng.standard_normal((q, D), dtype=np.float32) for q in QS}


# ---- peers: what a user would write with each library -------------------
def numpy_peer(q, c, k, chunk=1 << 17):
    """numpy matmul + argpartition (+ sort of the k), upcasting float16 chunks."""
    best_s = np.empty((q.shape[0], 0), np.float32)
    best_i = np.empty((q.shape[0], 0), np.int64)
    for s0 in range(0, c.shape[0], chunk):
        block = np.asarray(c[s0 : s0 + chunk], dtype=np.float32)
        s = np.concatenate([best_s, q @ block.T], axis=1)
        ids = np.concatenate([best_i, np.broadcast_to(np.arange(s0, s0 + len(block)), (q.shape[0], len(block)))], axis=1)
        top = np.argpartition(-s, k - 1, axis=1)[:, :k]
        best_s, best_i = np.take_along_axis(s, top, 1), np.take_along_axis(ids, top, 1)
    order = np.argsort(-best_s, axis=1)
    return np.take_along_axis(best_s, order, 1), np.take_along_axis(best_i, order, 1)


def torch_peer(q, c, k, chunk=1 << 17):
    """torch.mm + topk per chunk, merged with topk."""
    import torch

    best_s = torch.empty((q.shape[0], 0))
    best_i = torch.empty((q.shape[0], 0), dtype=torch.int64)
    for s0 in range(0, c.shape[0], chunk):
        block = c[s0 : s0 + chunk].float()
        s = torch.cat([best_s, q @ block.T], 1)
        ids = torch.cat([best_i, torch.arange(s0, s0 + block.shape[0]).expand(q.shape[0], -1)], 1)
        top = torch.topk(s, k, dim=1)
        best_s, best_i = top.values, ids.gather(1, top.indices)
    return best_s, best_i


def _extra(benchmark, Q, c):
    t = benchmark.stats.stats.mean
    benchmark.extra_info["GB/s scanned"] = round(c.nbytes / t / 1e9, 2)
    benchmark.extra_info["GFLOP/s"] = round(2 * Q * c.shape[0] * c.shape[1] / t / 1e9, 1)
    benchmark.extra_info["queries/s"] = round(Q / t, 1)


def _run(benchmark, fn, *args):
    return benchmark(fn, *args)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("Q", QS)
def test_native(benchmark, record, corpora, queries, Q, dtype):
    c, q = corpora[dtype], queries[Q]
    benchmark.group = f"topn N={N} Q={Q} {dtype}"
    s, i = _run(benchmark, rcn_fast.topn, q, c, K)
    _extra(benchmark, Q, c)
    record(benchmark.group, "native", benchmark)
    # same answer as the reference (spot check on the first query)
    rs, _ = topn_reference(q[:1], c, K)
    np.testing.assert_allclose(s[:1], rs, rtol=1e-4, atol=1e-3)


@pytest.fixture(scope="module")
def cpu_int8(corpora):
    """Each corpus with its int8 copy (rcn_fast.search.int8_bounded), built once."""
    from rcn_fast.search.int8_bounded import Int8Corpus, build_int8

    return {dt: Int8Corpus(c, build_int8(c)) for dt, c in corpora.items()}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("Q", (1, 32))
def test_native_int8(benchmark, record, cpu_int8, queries, Q, dtype):
    """The exact int8 bounded scan on the CPU (opt-in: it reads a quarter of
    a float32 corpus, which pays where the scan is bound by memory
    bandwidth); the same ids as the native scan."""
    c, q = cpu_int8[dtype], queries[Q]
    benchmark.group = f"topn N={N} Q={Q} {dtype}"
    s, i = _run(benchmark, rcn_fast.topn, q, c, K)
    _extra(benchmark, Q, c.rows)
    record(benchmark.group, "native_int8", benchmark)
    _, ri = rcn_fast.topn(q[:1], c.rows, K)
    np.testing.assert_array_equal(np.asarray(i[:1]), np.asarray(ri))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("Q", QS)
def test_numpy(benchmark, record, corpora, queries, Q, dtype):
    c, q = corpora[dtype], queries[Q]
    benchmark.group = f"topn N={N} Q={Q} {dtype}"
    _run(benchmark, numpy_peer, q, c, K)
    _extra(benchmark, Q, c)
    record(benchmark.group, "numpy", benchmark)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("Q", QS)
def test_torch(benchmark, record, corpora, queries, Q, dtype):
    torch = pytest.importorskip("torch")
    c, q = torch.from_numpy(corpora[dtype]), torch.from_numpy(queries[Q])
    benchmark.group = f"topn N={N} Q={Q} {dtype}"
    with torch.inference_mode():
        _run(benchmark, torch_peer, q, c, K)
    _extra(benchmark, Q, corpora[dtype])
    record(benchmark.group, "torch", benchmark)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("Q", QS)
def test_torch_backend(benchmark, record, corpora, queries, Q, dtype):
    """rcn_fast's torch backend on CPU tensors (what CUDA tensors get by default, here on the CPU)."""
    torch = pytest.importorskip("torch")
    c, q = torch.from_numpy(corpora[dtype]), torch.from_numpy(queries[Q])
    benchmark.group = f"topn N={N} Q={Q} {dtype}"
    with torch.inference_mode():
        _run(benchmark, functools.partial(rcn_fast.topn, backend="torch"), q, c, K)
    _extra(benchmark, Q, corpora[dtype])
    record(benchmark.group, "torch_backend", benchmark)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("Q", QS)
def test_faiss(benchmark, record, corpora, queries, Q, dtype):
    faiss = pytest.importorskip("faiss")
    c, q = corpora[dtype], queries[Q]
    if dtype == "float32":
        index = faiss.IndexFlatIP(D)
    else:  # exhaustive search over float16-coded vectors
        index = faiss.IndexScalarQuantizer(D, faiss.ScalarQuantizer.QT_fp16, faiss.METRIC_INNER_PRODUCT)
        index.train(c[:1000].astype(np.float32))
    for s0 in range(0, N, 1 << 17):
        index.add(np.asarray(c[s0 : s0 + (1 << 17)], dtype=np.float32))
    benchmark.group = f"topn N={N} Q={Q} {dtype}"
    _run(benchmark, index.search, q, K)
    _extra(benchmark, Q, c)
    record(benchmark.group, "faiss", benchmark)


# ---- GPU (skipped without a usable CUDA build and device) ----------------
# Group "topn GPU N=<N> Q=<Q> <corpus dtype> queries=<query dtype>", one
# benchmark per implementation (impl names as recorded in bench/gpu_results;
# each CUDA kernel has its column, rcn_fast._crossovers.KERNELS):
#   dispatched     rcn_fast.topn(q, c, k): what CUDA tensors get by default
#   torch_backend  rcn_fast.topn(..., backend="torch"): the default torch path
#   cuda           the tensor-core scan (kernel "topn": rcn_fast._cuda.topn's
#                  automatic choice, the tiled v1 kernel where the scan
#                  cannot serve)
#   cuda_v1        the tiled kernel (version 1) forced for every dtype: what
#                  kernel "topn" runs where the scan cannot serve (k > 256,
#                  d % 8 != 0, unaligned rows; always for float32)
#   cuda_tiled     GEMM tiles + block select (kernel "topn_tiled")
#   recipe         torch.topk(torch.mm(q, c.T, out_dtype=torch.float32), k):
#                  the exact recipe of issue 35 (half-precision corpora,
#                  queries in the corpus dtype)
#   oneliner       torch.topk(q @ c.T, k): fast, not exact in half precision
GPU_DTYPES = ("float32", "float16", "bfloat16")
GPU_IMPLS = ("dispatched", "torch_backend", "cuda", "cuda_v1", "cuda_tiled", "recipe", "oneliner")
CUDA_KERNEL_IMPLS = {"cuda": "topn", "cuda_tiled": "topn_tiled"}


def _cuda_or_skip():
    torch = pytest.importorskip("torch")
    from rcn_fast import _native

    if _native.cuda_module()[0] is None or not torch.cuda.is_available():
        pytest.skip(f"no usable GPU: {_native.cuda_module()[1]}")
    return torch


@pytest.fixture(scope="module")
def gpu_corpora():
    """Unit-norm random corpora made on the GPU (seeded), one per dtype."""
    torch = _cuda_or_skip()
    gen = torch.Generator(device="cuda").manual_seed(0)
    c = torch.randn((N, D), device="cuda", generator=gen)
    c /= c.norm(dim=1, keepdim=True)
    return {dt: c.to(getattr(torch, dt)) for dt in GPU_DTYPES}


@pytest.fixture(scope="module")
def gpu_queries():
    torch = _cuda_or_skip()
    gen = torch.Generator(device="cuda").manual_seed(1)
    return {q: torch.randn((q, D), device="cuda", generator=gen) for q in QS}


def recipe(q, c, k):
    """The exact recipe: one GEMM with float32 output, then topk."""
    import torch

    if c.dtype == torch.float32:
        return torch.topk(torch.mm(q, c.T), k)
    return torch.topk(torch.mm(q, c.T, out_dtype=torch.float32), k)


def oneliner(q, c, k):
    import torch

    return torch.topk(q @ c.T, k)


def _gpu_impl(impl):
    if impl == "dispatched":
        return rcn_fast.topn
    if impl == "torch_backend":
        return functools.partial(rcn_fast.topn, backend="torch")
    if impl in CUDA_KERNEL_IMPLS:
        from rcn_fast.search.topn import run_cuda_kernel

        return functools.partial(run_cuda_kernel, kernel=CUDA_KERNEL_IMPLS[impl])
    if impl == "cuda_v1":
        from rcn_fast.search.topn import CUDA_TILED, run_cuda_kernel

        return functools.partial(run_cuda_kernel, kernel="topn", algorithm=CUDA_TILED)
    return {"recipe": recipe, "oneliner": oneliner}[impl]


def _gpu_cases():
    for dt in GPU_DTYPES:
        for qdt in dict.fromkeys(("float32", dt)):
            for impl in GPU_IMPLS:
                if impl in ("recipe", "oneliner") and qdt != dt:
                    continue  # the user recipes take queries in the corpus dtype
                if impl == "recipe" and dt == "float32":
                    continue  # float32: the one-liner is the recipe
                yield dt, qdt, impl


@pytest.mark.parametrize("Q", QS)
@pytest.mark.parametrize("dtype,qdtype,impl", list(_gpu_cases()))
def test_gpu_topn(benchmark, record, gpu_corpora, gpu_queries, Q, dtype, qdtype, impl):
    import torch

    c = gpu_corpora[dtype]
    q = gpu_queries[Q].to(getattr(torch, qdtype))
    fn = _gpu_impl(impl)
    benchmark.group = f"topn GPU N={N} Q={Q} {dtype} queries={qdtype}"
    with torch.inference_mode():
        out = _run_cuda(benchmark, fn, q, c, K)
    _extra(benchmark, Q, c)
    record(benchmark.group, impl, benchmark)
    if impl in ("dispatched", "cuda_v1", *CUDA_KERNEL_IMPLS):  # the default torch path's ids, near-ties aside
        _, ref = rcn_fast.topn(q[:4], c, K, backend="torch")
        ids = out[1] if isinstance(out, tuple) else out.indices
        assert (ids[:4] == ref).float().mean().item() >= 0.99


@pytest.fixture(scope="module")
def gpu_int8(gpu_corpora):
    """The float16 corpus's int8 copy, built on the GPU (rcn_fast.search.int8_bounded)."""
    from rcn_fast.search.int8_bounded import Int8Corpus, build_int8

    c = gpu_corpora["float16"]
    return Int8Corpus(c, build_int8(c))


@pytest.mark.parametrize("Q", QS)
@pytest.mark.parametrize("qdtype", ["float16", "float32"])
def test_gpu_topn_int8(benchmark, record, gpu_int8, gpu_queries, Q, qdtype):
    """The exact int8 bounded scan (column cuda_int8) of the float16 corpus."""
    import torch

    q = gpu_queries[Q].to(getattr(torch, qdtype))
    benchmark.group = f"topn GPU N={N} Q={Q} float16 queries={qdtype}"
    with torch.inference_mode():
        out = _run_cuda(benchmark, rcn_fast.topn, q, gpu_int8, K)
    _extra(benchmark, Q, gpu_int8.rows)
    record(benchmark.group, "cuda_int8", benchmark)
    _, ref = rcn_fast.topn(q[:4], gpu_int8.rows, K, backend="torch")
    assert (out[1][:4] == ref).float().mean().item() >= 0.99


def _run_cuda(benchmark, fn, *args):
    import torch

    def call():
        out = fn(*args)
        torch.cuda.synchronize()
        return out

    return benchmark(call)


# ---- the paper's store size (opt-in: bench/gpu_check.sh --paper-scale) ----
# 23.5M x 768 float16 resident (36 GB), queries in float16; group "topn GPU
# N=23500000 Q=<Q> float16 queries=float16". The recipe is chunked (its
# [Q, N] scores would not fit at Q = 512) and merged with a second topk.
PAPER_N = int(os.environ.get("RCN_FAST_BENCH_PAPER_N", 23_500_000))
PAPER_ENV = "RCN_FAST_BENCH_PAPER_SCALE"
_PAPER: dict = {}  # the paper-scale int8 copy, built once
PAPER_IMPLS = ("dispatched", "torch_backend", "cuda", "cuda_tiled", "cuda_int8", "recipe")


@pytest.fixture(scope="module")
def paper_corpus():
    if not os.environ.get(PAPER_ENV):
        pytest.skip(f"the paper-scale store is opt-in ({PAPER_ENV}=1; bench/gpu_check.sh --paper-scale)")
    torch = _cuda_or_skip()
    need = PAPER_N * D * 2
    free, _ = torch.cuda.mem_get_info()
    if free < need * 1.5:
        pytest.skip(f"{PAPER_N} x {D} float16 needs {need / 2**30:.0f} GiB resident plus work space; "
                    f"{free / 2**30:.0f} GiB free on this GPU")
    gen = torch.Generator(device="cuda").manual_seed(0)
    c = torch.empty((PAPER_N, D), dtype=torch.float16, device="cuda")
    for s0 in range(0, PAPER_N, 1 << 20):
        block = torch.randn((min(1 << 20, PAPER_N - s0), D), device="cuda", generator=gen)
        c[s0 : s0 + block.shape[0]] = (block / block.norm(dim=1, keepdim=True)).half()
    return c


def recipe_chunked(q, c, k, chunk=1 << 22):
    """The recipe over chunks of 4M rows, merged with a second topk."""
    import torch

    best_s = best_i = None
    for s0 in range(0, c.shape[0], chunk):
        top = torch.topk(torch.mm(q, c[s0 : s0 + chunk].T, out_dtype=torch.float32), k)
        vals, ids = top.values, top.indices + s0
        if best_s is not None:
            merged = torch.topk(torch.cat([best_s, vals], 1), k)
            vals, ids = merged.values, torch.cat([best_i, ids], 1).gather(1, merged.indices)
        best_s, best_i = vals, ids
    return best_s, best_i


@pytest.mark.parametrize("Q", QS)
@pytest.mark.parametrize("impl", PAPER_IMPLS)
def test_paper_scale_topn(pedantic, benchmark, record, paper_corpus, Q, impl):
    import torch

    c = paper_corpus
    gen = torch.Generator(device="cuda").manual_seed(2)
    q = torch.randn((Q, D), device="cuda", generator=gen).half()
    if impl == "cuda_int8":
        from rcn_fast.search.int8_bounded import Int8Corpus, build_int8

        if "int8" not in _PAPER:
            _PAPER["int8"] = Int8Corpus(c, build_int8(c))
        c, fn = _PAPER["int8"], rcn_fast.topn
    else:
        fn = recipe_chunked if impl == "recipe" else _gpu_impl(impl)
    benchmark.group = f"topn GPU N={PAPER_N} Q={Q} float16 queries=float16"

    def call():
        out = fn(q, c, K)
        torch.cuda.synchronize()
        return out

    with torch.inference_mode():
        out = pedantic(call)
    _extra(benchmark, Q, paper_corpus)
    record(benchmark.group, impl, benchmark)
    if impl != "recipe":
        ref = recipe_chunked(q[:2], paper_corpus, K)[1]
        ids = out[1]
        assert (ids[:2] == ref).float().mean().item() >= 0.99
