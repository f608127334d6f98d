"""The torch backend of :func:`rcn_fast.topn`: the exact recipe a user would
write on a GPU, with rcn_fast's ordering rules added only where they can
change the result, and no host synchronisation.

Per corpus chunk (as large as memory allows on a GPU):

1. one GEMM with float32 output: ``torch.mm(q, chunk.T, out_dtype=float32)``
   for a float16/bfloat16 corpus (products of the inputs are exact in
   float32 and accumulate in float32), a float32 GEMM for a float32 corpus.
   A float32 query on a half-precision corpus is split into two (float16) or
   three (bfloat16) terms of the corpus dtype, scaled by powers of two
   (:func:`split_query`), stacked as rows of one GEMM and summed in float32:
   the query is represented to float32 precision without upcasting the
   corpus (a non-finite query value is the first term as it is, so it
   scores as in a float32 GEMM). Where the installed torch has no
   ``out_dtype`` for the device (the CPU), both sides are upcast per chunk:
   the same products, the same float32 accumulation.
2. ``torch.topk`` of ``k + 1`` per row, then the chunk's finishing on the
   device (``topn_finish_rows`` of rcn_fast._cuda for CUDA tensors, of
   rcn_fast._C for CPU tensors; csrc/topn/topn_block_select.h): each row's
   list as it is, put in (score desc, id asc) order where equal scores sit
   in it, and the row selected again in one pass only where topk's answer
   can be wrong: a NaN among the k + 1 (topk ranks NaN above everything;
   with a split query a NaN score is first recomputed in float32, so a
   corpus +-inf times a zero term never turns a +-inf score into NaN) or a
   tie across the k-th place. -inf and NaN are never returned: those slots
   are ``(-inf, -1)``.
3. The chunk's top-k merged with the running top-k: ``[Q, 2k]`` entries put
   in (score desc, id asc) order by two stable sorts.

So a call is one GEMM, one ``topk`` and one small kernel per chunk (plus
the split of a float32 query: one kernel on CUDA), with no host
synchronisation: the host runs ahead of the GPU. Without the extension
(another device, or k above 1024) the finishing runs in torch ops with one
host synchronisation per chunk (:mod:`rcn_fast.search.torch_checked`).

float32 corpora on CUDA follow torch's float32 matmul precision: with TF32
enabled (``torch.backends.cuda.matmul.allow_tf32``, off by default) the
scores are not float32-exact.
"""

from __future__ import annotations

from typing import Any

from rcn_fast import _arrays as A
from rcn_fast import _native
from rcn_fast.search.torch_checked import order_by_score_then_id, topn_torch_checked

# (terms, bits of shift between terms) per corpus dtype name: float16 keeps
# 11 significant bits a term, bfloat16 8; the remainder after a term is at
# most half an ulp, so the next term is shifted by (significand bits + 1).
SPLIT_TERMS = {"float16": (2, 12), "bfloat16": (3, 9)}

# Scores of one chunk on a GPU: at most this many bytes and half of the free
# memory (torch's cached blocks count as free), at least 65,536 rows. The
# driver is asked for the free memory only when the whole search's scores
# would exceed ASK_FREE_BYTES (a call to cudaMemGetInfo per search costs
# microseconds to milliseconds, depending on the driver).
GPU_SCORE_BYTES_MAX = 4 << 30
ASK_FREE_BYTES = 256 << 20
CPU_CHUNK_ROWS = 1 << 16
MIN_CHUNK_ROWS = 1 << 16
#: Largest k of the device finishing (csrc/topn/topn_block_select.h).
FINISH_MAX_K = 1024

_OUT_DTYPE_OK: dict[tuple[str, str], bool] = {}


def chunk_rows(n_queries: int, device_type: str, *, row_bytes: int = 0, free_bytes: int | None = None) -> int:
    """Corpus rows per chunk: 65,536 on the CPU; on a GPU as many as keep the
    chunk's float32 scores (``4 * n_queries`` bytes a row, plus ``row_bytes``
    of other per-row work) within :data:`GPU_SCORE_BYTES_MAX` and half of
    ``free_bytes``, and at least 65,536."""
    if device_type == "cpu":
        return CPU_CHUNK_ROWS
    budget = GPU_SCORE_BYTES_MAX if free_bytes is None else min(GPU_SCORE_BYTES_MAX, free_bytes // 2)
    per_row = 4 * max(1, n_queries) + max(0, row_bytes)
    return max(MIN_CHUNK_ROWS, budget // per_row)


def _free_bytes(torch: Any, device: Any) -> int | None:
    if device.type != "cuda":
        return None
    try:
        free, _ = torch.cuda.mem_get_info(device)
        return int(free) + int(torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device))
    except Exception:  # noqa: BLE001 - no driver answer: the fixed cap serves
        return None


def mm_out_dtype_supported(torch: Any, device: Any, dtype: Any) -> bool:
    """Whether ``torch.mm(a, b, out_dtype=torch.float32)`` runs for ``dtype``
    inputs on ``device``'s type (asked once per device type and dtype)."""
    key = (device.type, str(dtype))
    if key not in _OUT_DTYPE_OK:
        try:
            a = torch.ones((1, 8), dtype=dtype, device=device)
            ok = torch.mm(a, a.T, out_dtype=torch.float32).dtype == torch.float32
        except (TypeError, RuntimeError, NotImplementedError):
            ok = False
        _OUT_DTYPE_OK[key] = ok
    return _OUT_DTYPE_OK[key]


def mm_f32(torch: Any, a: Any, b: Any, out_dtype_ok: bool) -> Any:
    """float32 ``a @ b.T`` of half-precision ``a`` [m, d] and ``b`` [n, d]:
    exact products, float32 accumulation."""
    if out_dtype_ok:
        return torch.mm(a, b.T, out_dtype=torch.float32)
    return torch.mm(a.float(), b.float().T)


def split_query(torch: Any, q: Any, dtype_name: str) -> tuple[Any, Any]:
    """A float32 query [Q, d] as ``T`` terms of a half-precision dtype.

    Each row is scaled by the power of two that brings its largest finite
    magnitude below 1 (below 2 in float32's top binade); term ``t`` holds
    the remainder after terms ``0..t-1``, shifted by ``2**(shift * t)`` so it
    uses the dtype's full range. Returns the terms stacked ``[T * Q, d]``
    (term-major) and their scales ``[T * Q, 1]`` (powers of two):
    ``q == sum_t scales[t] * terms[t]`` to within ``2**-24`` of each row's
    largest magnitude (float16, two terms) or exactly up to float32
    underflow (bfloat16, three terms). A non-finite value is the first term
    as it is and zero in the others (csrc/topn/topn_select.h splits the
    same way: on CUDA with the extension built, its kernel does the split).
    """
    n_terms = SPLIT_TERMS[dtype_name][0]
    mod = _split_kernel(q)
    if mod is not None:
        terms = torch.empty((n_terms * q.shape[0], q.shape[1]), dtype=getattr(torch, dtype_name), device=q.device)
        scales = torch.empty((n_terms * q.shape[0], 1), dtype=torch.float32, device=q.device)
        with A.on_device(q):
            mod.topn_split_queries(q, terms, scales.view(-1), torch.cuda.current_stream(q.device).cuda_stream)
        return terms, scales
    return split_query_torch(torch, q, dtype_name)


def split_query_torch(torch: Any, q: Any, dtype_name: str) -> tuple[Any, Any]:
    """:func:`split_query` in torch ops (any device): the same terms and
    scales as the CUDA kernel."""
    n_terms, shift = SPLIT_TERMS[dtype_name]
    dtype = getattr(torch, dtype_name)
    q = q.float()
    finite = torch.isfinite(q)
    amax = torch.where(finite, q.abs(), 0.0).amax(1, keepdim=True)
    _, e = torch.frexp(amax)  # amax = m * 2**e, 0.5 <= m < 1 (0 -> e = 0)
    row = torch.ldexp(torch.ones_like(amax), e.clamp(max=127))  # 2**128 is not a float32
    r = q / row  # |r| < 1 where finite, exact
    terms, scales = [], []
    for t in range(n_terms):
        f = float(2.0 ** (shift * t))
        h = (r * f).to(dtype)
        terms.append(h)
        scales.append(row / f)
        r = torch.where(finite, r - h.float() / f, 0.0)  # exact remainder; after inf or NaN: zero
    return torch.cat(terms), torch.cat(scales)


def _split_kernel(q: Any) -> Any:
    """rcn_fast._cuda when it can split ``q`` (float32, CUDA, unit inner stride), else None."""
    if not A.is_cuda(q) or str(q.dtype) != "torch.float32" or (q.shape[1] > 1 and q.stride(1) != 1):
        return None
    mod, _ = _native.cuda_module()
    return mod if mod is not None and hasattr(mod, "topn_split_queries") else None


class _Scorer:
    """float32 scores [Q, rows] of a corpus chunk, the exact way for the
    inputs' dtypes and device (see the module docstring)."""

    def __init__(self, torch: Any, queries: Any, corpus: Any, split: bool | None):
        self.torch = torch
        self.n_queries = int(queries.shape[0])
        ct = str(corpus.dtype).removeprefix("torch.")
        self.out_dtype_ok = ct != "float32" and mm_out_dtype_supported(torch, corpus.device, corpus.dtype)
        self.queries = queries
        self.scales = None
        if ct == "float32":
            self.mode, self.lhs = "f32", queries.float()
        elif queries.dtype == corpus.dtype:
            self.mode, self.lhs = "half", queries
        elif self.out_dtype_ok if split is None else split:
            self.mode = "split"
            self.lhs, self.scales = split_query(torch, queries, ct)
        else:
            self.mode, self.lhs = "upcast", queries.float()
        self.terms = 1 if self.scales is None else self.lhs.shape[0] // max(1, self.n_queries)

    def row_bytes(self, d: int) -> int:
        """Bytes of work a corpus row costs beyond one float32 score a query."""
        extra = 4 * self.n_queries * (self.terms - 1)
        return extra + (4 * d if self.mode in ("upcast", "half") and not self.out_dtype_ok else 0)

    def __call__(self, block: Any) -> Any:
        torch = self.torch
        if self.mode in ("f32", "upcast"):
            return torch.mm(self.lhs, block.float().T)
        s = mm_f32(torch, self.lhs, block, self.out_dtype_ok)
        if self.mode == "half":
            return s
        s.mul_(self.scales)  # powers of two: exact
        parts = s.view(self.terms, self.n_queries, s.shape[1])
        for t in range(self.terms - 1, 0, -1):  # smallest terms first
            parts[t - 1].add_(parts[t])
        return parts[0]

    def exact(self, block: Any, rows: Any) -> Any:
        """Scores of the query rows ``rows`` with both sides upcast."""
        return self.torch.mm(self.queries[rows].float(), block.float().T)


def device_finisher(corpus: Any, k: int) -> tuple[Any, Any]:
    """``(module, stream)`` whose ``topn_finish_rows`` finishes chunks of
    ``corpus``'s device without a host synchronisation (rcn_fast._cuda on
    CUDA with the stream to enqueue on, rcn_fast._C on the CPU with stream
    None); ``(None, None)`` where neither serves (the host-checked path)."""
    if k > FINISH_MAX_K:
        return None, None
    if A.is_cuda(corpus):
        mod, _ = _native.cuda_module()
        if mod is not None and hasattr(mod, "topn_finish_rows"):
            import torch

            return mod, torch.cuda.current_stream(corpus.device).cuda_stream
    elif corpus.device.type == "cpu":
        mod, _ = _native.cpu_module()
        if mod is not None and hasattr(mod, "topn_finish_rows"):
            return mod, None
    return None, None


def _finish_on_device(torch: Any, finisher: tuple[Any, Any], scorer: _Scorer, s: Any, block: Any, k: int,
                      start: int) -> tuple[Any, Any]:
    """The exact top-k [Q, k] of one chunk's scores ``s`` (ids + ``start``):
    ``topk(k + 1)``, then the device finishing (no host synchronisation)."""
    mod, stream = finisher
    top = torch.topk(s, min(k + 1, int(s.shape[1])), dim=1)
    out_s = torch.empty((scorer.n_queries, k), dtype=torch.float32, device=s.device)
    out_i = torch.empty((scorer.n_queries, k), dtype=torch.int64, device=s.device)
    extra = {} if stream is None else {"stream": stream}
    if scorer.mode == "split":
        extra.update(queries=scorer.queries_f32, corpus=block)
    with A.on_device(s):  # the CUDA finishing launches on s's device, with its stream (issue 55)
        mod.topn_finish_rows(s, top.values, top.indices, k, start, out_s, out_i, **extra)
    return out_s, out_i


def topn_torch(queries: Any, corpus: Any, k: int, *, chunk: int | None = None,
               split: bool | None = None) -> tuple[Any, Any]:
    """Exact top-k on the inputs' device with torch ops (see the module docstring).

    Parameters
    ----------
    queries : tensor [Q, d]
        float32 or the corpus dtype.
    corpus : tensor [N, d]
        float32, float16 or bfloat16, on the queries' device.
    k : int
        ``1 <= k <= N``.
    chunk : int, optional
        Corpus rows per GEMM (default: :func:`chunk_rows`).
    split : bool, optional
        Split a float32 query into terms of a half-precision corpus dtype
        (default: where ``torch.mm`` has ``out_dtype`` on the device); False
        upcasts the corpus chunk instead. Tests force it on the CPU.

    Returns
    -------
    scores : float32 tensor [Q, k]
    ids : int64 tensor [Q, k], ``(-inf, -1)`` where no admissible score is left.
    """
    import torch

    dev = corpus.device
    n_q = int(queries.shape[0])
    n = int(corpus.shape[0]) if n_q else 0  # no queries: nothing to scan
    if not n:
        return (torch.full((n_q, k), float("-inf"), dtype=torch.float32, device=dev),
                torch.full((n_q, k), -1, dtype=torch.int64, device=dev))
    scorer = _Scorer(torch, queries, corpus, split)
    if chunk is None:
        row_bytes = scorer.row_bytes(int(corpus.shape[1]))
        ask = n * (4 * n_q + row_bytes) > ASK_FREE_BYTES
        chunk = chunk_rows(n_q, dev.type, row_bytes=row_bytes, free_bytes=_free_bytes(torch, dev) if ask else None)
    finisher = device_finisher(corpus, k)
    if scorer.mode == "split" and finisher[0] is not None:
        if corpus.shape[1] > 1 and corpus.stride(1) != 1:
            finisher = (None, None)  # the rescoring reads corpus rows with unit stride: the host-checked path
        else:
            scorer.queries_f32 = queries.float()
    if finisher[0] is None:
        return topn_torch_checked(torch, scorer, corpus, k, chunk)
    best_s = best_i = None
    for start in range(0, n, chunk):
        block = corpus[start : start + chunk]
        vals, ids = _finish_on_device(torch, finisher, scorer, scorer(block), block, k, start)
        if best_s is None:
            best_s, best_i = vals, ids
        else:
            best_s, best_i = order_by_score_then_id(torch, torch.cat([best_s, vals], 1), torch.cat([best_i, ids], 1))
            best_s, best_i = best_s[:, :k], best_i[:, :k]
    return best_s, best_i
