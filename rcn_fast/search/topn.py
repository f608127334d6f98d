"""Exact top-n maximum inner product search: the public op and its backends.

Backends in priority order: ``cuda`` (rcn_fast._cuda, CUDA tensors: the
tensor-core scan, or GEMM tiles with a block select,
:mod:`rcn_fast.search.cuda_tiled`), ``native`` (rcn_fast._C, CPU arrays),
``torch`` (one float32-output GEMM and ``topk`` per chunk, any device:
:mod:`rcn_fast.search.torch_backend`), ``numpy`` (the reference, CPU). Pick
one with ``backend=`` or the ``RCN_FAST_BACKEND`` environment variable. For
CUDA tensors a CUDA kernel is picked only where it was measured at least as
fast as torch (:mod:`rcn_fast._crossovers`); elsewhere torch serves.
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from rcn_fast import _arrays as A
from rcn_fast import _crossovers, _dispatch, _native
from rcn_fast.search.int8_bounded import Int8Corpus, topn_int8
from rcn_fast.search.reference import select_topn, topn_reference
from rcn_fast._validate import is_int


def topn(queries: Any, corpus: Any, k: int, *, backend: str | None = None) -> tuple[Any, Any]:
    """The ``k`` corpus rows with the largest inner product, for every query.

    Parameters
    ----------
    queries : array [Q, d]
        float32, or the corpus dtype. numpy array or torch tensor.
    corpus : array [N, d] or Int8Corpus
        float32, float16 or bfloat16 (numpy bfloat16 via ``ml_dtypes``).
        Same library and device as ``queries``. An
        :class:`~rcn_fast.search.int8_bounded.Int8Corpus` (rows and their
        int8 copy) is searched by the int8 bounded scan: the same exact
        result, reading the int8 copy and the candidates' rows (rows may
        live on the host while queries and copy are on a GPU); a
        ``backend`` searches its rows instead.
    k : int
        Results per query, ``k >= 1``. When ``k > N`` the tail is padded:
        the kernels search for ``min(k, N)`` results (their work buffers
        never grow with ``k`` beyond the corpus) and the padding is one
        fill of the ``[Q, k]`` results. Results on the host that exceed the
        memory the process can allocate raise MemoryError naming ``k``
        before anything is allocated (see :func:`check_result_memory`).
    backend : str, optional
        Force ``"cuda"``, ``"native"``, ``"torch"`` or ``"numpy"``.

    Returns
    -------
    scores : float32 [Q, k]
        Descending; accumulated in float32.
    ids : int64 [Q, k]
        Row indices into ``corpus``. Slots without a result hold
        ``(-inf, -1)``.

    Notes
    -----
    Ties: equal scores are returned lower id first. Non-finite values are
    not checked (a pass over the corpus would cost as much as the search):
    a NaN or -inf score is never returned, +inf ranks first. Inputs whose
    last axis is not contiguous are copied once; row strides are used as
    they are. Results are in the library and on the device of the inputs.

    Examples
    --------
    >>> import numpy as np, rcn_fast
    >>> corpus = np.eye(4, dtype=np.float32)
    >>> scores, ids = rcn_fast.topn(corpus[[2]], corpus, k=2)
    >>> ids.tolist()
    [[2, 0]]
    """
    if isinstance(corpus, Int8Corpus):
        return _topn_int8_corpus(queries, corpus, k, backend)
    queries = A.as_array(queries, "queries")
    corpus = A.as_array(corpus, "corpus")
    A.check_rank(queries, 2, "queries", "[Q, d]")
    A.check_rank(corpus, 2, "corpus", "[N, d]")
    if not is_int(k, numpy=True):
        raise TypeError(f"k: expected an int, got {type(k).__name__}")
    k = int(k)
    if k < 1:
        raise ValueError(f"k: expected k >= 1, got {k}")
    ct = A.check_float_dtype(corpus, "corpus")
    qt = A.check_float_dtype(queries, "queries")
    if qt not in ("float32", ct):
        raise TypeError(f"queries: expected float32 or the corpus dtype ({ct}), got {qt}")
    if queries.shape[1] != corpus.shape[1]:
        raise ValueError(
            f"corpus: expected {queries.shape[1]} columns to match queries [Q, d], "
            f"got shape {tuple(corpus.shape)}"
        )
    if queries.shape[1] < 1:
        raise ValueError("queries: expected d >= 1 columns, got 0")
    A.check_same_place(corpus, queries, "corpus", "queries")
    n_rows = int(corpus.shape[0])
    if A.device_of(corpus) == "cpu":
        check_result_memory(int(queries.shape[0]), n_rows, k)
    kk = min(k, n_rows)  # a result slot beyond the corpus can only be padding
    if kk == 0:
        return _padded(corpus, int(queries.shape[0]), k)
    ctx = {
        "library": A.library(corpus),
        "device": A.device_of(corpus),
        "dtype": ct,
        "query_dtype": qt,
        "Q": int(queries.shape[0]),
        "N": n_rows,
        "d": int(corpus.shape[1]),
        "k": kk,
    }
    if ctx["device"] == "cuda":
        ctx.update(_gpu_ctx(corpus))
    scores, ids = TOPN(ctx, backend, queries=queries, corpus=corpus, k=kk)
    if kk == k:
        return scores, ids
    return _padded(corpus, int(queries.shape[0]), k, scores, ids)


def _topn_int8_corpus(queries: Any, corpus: Int8Corpus, k: Any, backend: str | None) -> tuple[Any, Any]:
    """topn over an Int8Corpus: the bounded scan where it can serve (no
    ``backend``, finite queries), else the rows searched exactly where they
    live, the results moved to the queries' place."""
    queries = A.as_array(queries, "queries")
    rows = A.as_array(corpus.rows, "corpus")
    if backend is None and is_int(k, numpy=True) and 1 <= int(k):
        A.check_rank(queries, 2, "queries", "[Q, d]")
        ct, qt = A.check_float_dtype(rows, "corpus"), A.check_float_dtype(queries, "queries")
        if qt not in ("float32", ct):
            raise TypeError(f"queries: expected float32 or the corpus dtype ({ct}), got {qt}")
        if queries.shape[1] != rows.shape[1]:
            raise ValueError(f"corpus: expected {queries.shape[1]} columns to match queries [Q, d], "
                             f"got shape {tuple(rows.shape)}")
        kk = min(int(k), int(rows.shape[0]))
        got = topn_int8(queries, corpus, kk) if kk > 0 and queries.shape[0] > 0 else None
        if got is not None:
            return got if kk == int(k) else _padded(got[0], int(queries.shape[0]), int(k), *got)
    if A.library(rows) == A.library(queries) and A.device_of(rows) == A.device_of(queries):
        return topn(queries, rows, k, backend=backend)
    s, i = topn(A.from_numpy_like(rows, A.to_float32_numpy(queries)), rows, k, backend=backend)
    return A.from_numpy_like(queries, A.to_numpy(s)), A.from_numpy_like(queries, A.to_numpy(i))


def _padded(like: Any, n_queries: int, k: int, scores: Any = None, ids: Any = None) -> tuple[Any, Any]:
    """``(-inf, -1)``-filled results [Q, k] in ``like``'s library and on its
    device, with ``scores`` / ``ids`` [Q, kk] (kk <= k), when given, in the
    first columns."""
    out_s = A.empty_like_lib(like, (n_queries, k), "float32")
    out_i = A.empty_like_lib(like, (n_queries, k), "int64")
    if A.is_torch(like):
        out_s.fill_(float("-inf"))
        out_i.fill_(-1)
    else:
        out_s.fill(-np.inf)
        out_i.fill(-1)
    if scores is not None:
        kk = int(scores.shape[1])
        out_s[:, :kk] = scores
        out_i[:, :kk] = ids
    return out_s, out_i


# ------------------------------------------------------ the memory contract

#: Results smaller than this are allocated without asking the system.
RESULT_CHECK_BYTES = 64 << 20


def host_bytes_available() -> int | None:
    """Bytes this process can still allocate in host memory, or None when unknown.

    The smaller of ``MemAvailable`` (``/proc/meminfo``) and the headroom under
    the address-space limit (``RLIMIT_AS`` minus ``VmSize``), where the
    platform reports them.
    """
    limits = []
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    limits.append(int(line.split()[1]) * 1024)
                    break
    except (OSError, ValueError, IndexError):
        pass
    try:
        import resource

        soft = resource.getrlimit(resource.RLIMIT_AS)[0]
        if soft != resource.RLIM_INFINITY:
            used = 0
            with open("/proc/self/status") as f:
                for line in f:
                    if line.startswith("VmSize:"):
                        used = int(line.split()[1]) * 1024
                        break
            limits.append(max(0, soft - used))
    except (ImportError, OSError, ValueError, IndexError):
        pass
    return min(limits) if limits else None


def check_result_memory(Q: int, N: int, k: int) -> None:
    """Refuse, before any allocation, results the host cannot hold.

    The results are ``Q * k`` slots of a float32 score and an int64 id (12
    bytes), padded when ``k > N``. When they exceed
    :func:`host_bytes_available` this raises MemoryError naming ``k``, so a
    huge ``k`` fails at once instead of being killed by the out-of-memory
    killer part-way through writing the padding.

    Raises
    ------
    MemoryError
        The ``[Q, k]`` results do not fit.
    """
    need = 12 * Q * k
    if need < RESULT_CHECK_BYTES:
        return
    have = host_bytes_available()
    if have is None or need <= have:
        return
    hint = (f"the corpus has {N} rows, so k={max(N, 1)} already returns every one of them" if k > N
            else "search fewer queries at a time")
    raise MemoryError(
        f"k: {Q} x {k} results (float32 scores + int64 ids) need {need / 2**30:.1f} GiB, more than the "
        f"{have / 2**30:.1f} GiB this process can allocate; {hint}"
    )


# ---------------------------------------------------------------- backends


def _check_cuda(ctx: Mapping[str, Any]) -> str | None:
    mod, why = _dispatch.check_cuda(ctx, "topn", "rcn_fast._cuda was built without top-n")
    if why is not None:
        return why
    if ctx["k"] > mod.TOPN_MAX_K:
        return f"k={ctx['k']} exceeds the CUDA kernel's limit {mod.TOPN_MAX_K}"
    return None


#: ``algorithm`` of rcn_fast._cuda.topn: the tensor-core scan where it can
#: serve the call, else the tiled kernel; 1: the tiled kernel; 2: the scan.
CUDA_AUTO, CUDA_TILED, CUDA_MMA = 0, 1, 2


def _gpu_ctx(corpus: Any) -> dict[str, Any]:
    """What the measured crossovers key on beyond dtypes and sizes, for a
    CUDA corpus: its GPU (name, compute capability) and whether its rows are
    16-byte aligned (the tensor-core scan needs it)."""
    aligned = corpus.data_ptr() % 16 == 0 and (corpus.shape[0] < 2
                                               or corpus.stride(0) * corpus.element_size() % 16 == 0)
    return {**_crossovers.gpu_identity(corpus.device), "aligned": bool(aligned)}


def cuda_kernel_for(queries: Any, corpus: Any, k: int) -> str:
    """The CUDA kernel (a key of ``rcn_fast._crossovers.KERNELS["topn"]``)
    for a call: the fastest one a recorded run on this GPU measured at least
    as fast as torch for the call's dtypes, algorithm, k and size; else,
    where nothing is measured (``backend="cuda"``), the tensor-core scan for
    fewer than ``cuda_tiled.MIN_QUERIES`` queries where it can serve, the
    GEMM tiles otherwise."""
    from rcn_fast.search.cuda_tiled import MIN_QUERIES

    ct, qt, n_q = A.dtype_name(corpus), A.dtype_name(queries), int(queries.shape[0])
    ctx = {"dtype": ct, "query_dtype": qt, "Q": n_q, "k": int(k), "d": int(corpus.shape[1]), **_gpu_ctx(corpus)}
    kernel, _ = _crossovers.kernel_choice("topn", ctx)
    mod, _ = _native.cuda_module()
    tiled = mod is not None and hasattr(mod, "topn_block_select")
    if kernel is not None and (kernel != "topn_tiled" or tiled):
        return kernel
    scan = _crossovers.topn_algorithm("topn", ctx) == "scan" and k <= getattr(mod, "TOPN_MMA_MAX_K", 0)
    return "topn" if not tiled or (scan and n_q < MIN_QUERIES) else "topn_tiled"


def run_cuda_kernel(queries: Any, corpus: Any, k: int, kernel: str, algorithm: int = 0) -> tuple[Any, Any]:
    """Top-k of CUDA tensors (checked by :func:`topn`) with one CUDA kernel:
    ``"topn"`` (the tensor-core scan where it can serve the call, else the
    tiled kernel of rcn_fast._cuda.topn; ``algorithm``: :data:`CUDA_TILED`
    forces the tiled kernel, :data:`CUDA_MMA` the scan) or ``"topn_tiled"``
    (GEMM tiles and block selects, :func:`rcn_fast.search.cuda_tiled.topn_tiled`)."""
    if kernel == "topn_tiled":
        from rcn_fast.search.cuda_tiled import topn_tiled

        return topn_tiled(queries, corpus, k)
    if kernel != "topn":
        raise ValueError(f"kernel: expected 'topn' or 'topn_tiled', got {kernel!r}")
    mod, _ = _native.cuda_module()
    torch = A.require("torch", "pip install torch")
    queries, corpus = A.inner_contiguous(queries), A.inner_contiguous(corpus)
    scores = torch.empty((queries.shape[0], k), dtype=torch.float32, device=corpus.device)
    ids = torch.empty((queries.shape[0], k), dtype=torch.int64, device=corpus.device)
    stream = torch.cuda.current_stream(corpus.device).cuda_stream
    with torch.cuda.device(corpus.device):
        mod.topn(queries, corpus, k, scores, ids, stream, int(algorithm))
    return scores, ids


def _run_cuda(queries: Any, corpus: Any, k: int) -> tuple[Any, Any]:
    return run_cuda_kernel(queries, corpus, k, cuda_kernel_for(queries, corpus, k))


def _run_native(queries: Any, corpus: Any, k: int) -> tuple[Any, Any]:
    mod, _ = _native.cpu_module()
    queries, corpus = A.inner_contiguous(queries), A.inner_contiguous(corpus)
    bf16_view = False
    if not A.is_torch(corpus) and A.dtype_name(corpus) == "bfloat16":
        corpus, bf16_view = corpus.view(np.uint16), True
        if A.dtype_name(queries) == "bfloat16":
            queries = queries.view(np.uint16)
    scores = A.empty_like_lib(corpus, (queries.shape[0], k), "float32")
    ids = A.empty_like_lib(corpus, (queries.shape[0], k), "int64")
    mod.topn(queries, corpus, k, scores, ids, 0, bf16_view)
    return scores, ids


def _run_torch(queries: Any, corpus: Any, k: int, chunk: int | None = None) -> tuple[Any, Any]:
    from rcn_fast.search.torch_backend import topn_torch

    return topn_torch(queries, corpus, k, chunk=chunk)


def _run_numpy(queries: Any, corpus: Any, k: int) -> tuple[Any, Any]:
    s, i = topn_reference(A.to_numpy(queries), A.to_numpy(corpus), k)
    return A.from_numpy_like(corpus, s), A.from_numpy_like(corpus, i)


def _check_native(ctx: Mapping[str, Any]) -> str | None:
    return _dispatch.check_native(ctx, "topn",
                                  "rcn_fast._C was built without top-n; reinstall with `pip install .`")


TOPN = _dispatch.register_kernel_op(
    "topn",
    cuda=(_check_cuda, _run_cuda, "CUDA (rcn_fast._cuda): the tensor-core scan with fused selection, or float32 "
                                  "GEMM tiles with one-pass block selects"),
    native=(_check_native, _run_native, "blocked SIMD scan (rcn_fast._C)"),
    torch=(_run_torch, "float32-output torch.mm + topk per chunk, ties fixed where they occur"),
    numpy=(_run_numpy, "plain numpy reference"),
)

__all__ = ["topn", "select_topn", "topn_reference", "TOPN", "run_cuda_kernel", "cuda_kernel_for"]
