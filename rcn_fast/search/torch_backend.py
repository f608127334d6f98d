"""The torch backend of :func:`rcn_fast.topn`: the exact recipe a user would
write on a GPU, with rcn_fast's ordering rules added only where they can
change the result.

Per corpus chunk (as large as memory allows on a GPU):

1. one GEMM with float32 output: ``torch.mm(q, chunk.T, out_dtype=float32)``
   for a float16/bfloat16 corpus (products of the inputs are exact in
   float32 and accumulate in float32), a float32 GEMM for a float32 corpus.
   A float32 query on a half-precision corpus is split into two (float16) or
   three (bfloat16) terms of the corpus dtype, scaled by powers of two
   (:func:`split_query`), stacked as rows of one GEMM and summed in float32:
   the query is represented to float32 precision without upcasting the
   corpus. Where the installed torch has no ``out_dtype`` for the device (the
   CPU), both sides are upcast per chunk: the same products, the same
   float32 accumulation.
2. ``torch.topk`` of ``k + 1`` per row. The extra value shows a tie at the
   k-th place; a NaN in the selection shows a NaN score (``topk`` ranks NaN
   above everything). Only rows with either are fixed up (NaN -> -inf, then
   the k-th place's ties taken lowest id first; with a split query, rows
   with NaN are rescored with both sides upcast first, so a split never
   turns an infinite score into NaN). Nothing else is sorted per chunk.
3. The chunk's top-k merged with the running top-k: ``[Q, 2k]`` entries put
   in (score desc, id asc) order by two stable sorts. ``topk`` orders by
   score, so a single chunk is sorted again only when equal scores sit in
   its top-k.

At the end -inf scores become the ``(-inf, -1)`` padding (only when one was
seen). One host synchronisation per chunk (three flags: fix-up needed, equal
neighbours, -inf), and one more per call where a float32 query would be
split (whether every query value is finite: only finite queries are split);
in the common case (one chunk, none of the flags) the result is the
recipe's ``topk`` output as it is.

float32 corpora on CUDA follow torch's float32 matmul precision: with TF32
enabled (``torch.backends.cuda.matmul.allow_tf32``, off by default) the
scores are not float32-exact.
"""

from __future__ import annotations

from typing import Any

# (terms, bits of shift between terms) per corpus dtype name: float16 keeps
# 11 significant bits a term, bfloat16 8; the remainder after a term is at
# most half an ulp, so the next term is shifted by (significand bits + 1).
SPLIT_TERMS = {"float16": (2, 12), "bfloat16": (3, 9)}

# Scores of one chunk on a GPU: at most this many bytes and half of the free
# memory (torch's cached blocks count as free), at least 65,536 rows.
GPU_SCORE_BYTES_MAX = 4 << 30
CPU_CHUNK_ROWS = 1 << 16
MIN_CHUNK_ROWS = 1 << 16

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

    Each row is scaled by the power of two that brings its largest magnitude
    below 1 (below 2 in float32's top binade); term ``t`` holds the remainder after terms ``0..t-1``, shifted
    by ``2**(shift * t)`` so it uses the dtype's full range. Returns the
    terms stacked ``[T * Q, d]`` (term-major) and their scales ``[T * Q, 1]``
    (powers of two): ``q == sum_t scales[t] * terms[t]`` to within
    ``2**-24`` of each row's largest magnitude (float16, two terms) or
    exactly up to float32 underflow (bfloat16, three terms).
    """
    n_terms, shift = SPLIT_TERMS[dtype_name]
    dtype = getattr(torch, dtype_name)
    q = q.float()
    amax = q.abs().amax(1, keepdim=True)
    _, e = torch.frexp(amax)  # amax = m * 2**e, 0.5 <= m < 1 (0 -> e = 0)
    row = torch.ldexp(torch.ones_like(amax), e.clamp(max=127))  # 2**128 is not a float32
    r = q / row  # |r| < 1, exact
    terms, scales = [], []
    for t in range(n_terms):
        f = float(2.0 ** (shift * t))
        h = (r * f).to(dtype)
        terms.append(h)
        scales.append(row / f)
        r = r - h.float() / f  # exact remainder
    return torch.cat(terms), torch.cat(scales)


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
        else:
            if split is None:
                split = self.out_dtype_ok
            if split and bool(torch.isfinite(queries).all()):
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


def _ties_lowest_id(torch: Any, s: Any, k: int) -> Any:
    """Column indices [R, k] of the exact top-k of each row of ``s`` [R, m]
    (no NaN, k <= m): every score above the k-th, then the k-th score's ties
    lowest column first (in column order, not score order)."""
    kth = torch.topk(s, k, dim=1).values[:, -1:]
    above = s > kth
    tie = s == kth
    take = above | (tie & (tie.cumsum(1) <= k - above.sum(1, keepdim=True)))
    return take.nonzero()[:, 1].view(s.shape[0], k)


def order_by_score_then_id(torch: Any, scores: Any, ids: Any) -> tuple[Any, Any]:
    """``(scores, ids)`` [Q, m] rearranged per row by (score desc, id asc)."""
    by_id = torch.sort(ids, dim=1, stable=True).indices
    scores, ids = scores.gather(1, by_id), ids.gather(1, by_id)
    by_score = torch.sort(scores, dim=1, descending=True, stable=True).indices
    return scores.gather(1, by_score), ids.gather(1, by_score)


def _chunk_topk(torch: Any, scorer: _Scorer, block: Any, k: int) -> tuple[Any, Any, bool, bool]:
    """The exact top-k of one chunk: ``(scores, column indices)`` [Q, min(k,
    rows)], whether they are already in (score desc, id asc) order, and
    whether a -inf score is among them. One host synchronisation (the flags)."""
    s = scorer(block)
    rows = int(s.shape[1])
    kk = min(k + 1, rows)
    top = torch.topk(s, kk, dim=1)
    vals, idx = top.values, top.indices
    fix = torch.isnan(vals).any(1)
    if kk > k:
        kth = vals[:, k - 1]
        fix |= (kth == vals[:, k]) & (kth > float("-inf"))
    kk = min(k, rows)
    vals, idx = vals[:, :kk], idx[:, :kk]
    tied = (vals[:, 1:] == vals[:, :-1]).any() if kk > 1 else torch.zeros((), dtype=torch.bool, device=s.device)
    flags = torch.stack([fix.any(), tied, torch.isneginf(vals).any()]).tolist()
    any_fix, any_tie, any_ninf = (bool(f) for f in flags)
    if any_fix:  # rare: a NaN score or a tie across the k-th place
        sel = fix.nonzero()[:, 0]
        sub = s[sel]
        nan = torch.isnan(sub)
        if scorer.mode == "split":  # NaN may be inf * 0 of a split: rescore those rows upcast
            redo = nan.any(1)
            if bool(redo.any()):
                sub[redo] = scorer.exact(block, sel[redo])
                nan = torch.isnan(sub)
        sub = torch.where(nan, float("-inf"), sub)
        cols = _ties_lowest_id(torch, sub, kk)
        vals, idx = vals.clone(), idx.clone()
        vals[sel], idx[sel] = sub.gather(1, cols), cols
        any_ninf = True  # a NaN made -inf may be among them (the final mask costs two kernels)
    # topk sorts by score; only equal scores can be out of id order
    return vals, idx, not (any_fix or any_tie), any_ninf


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
    scorer = _Scorer(torch, queries, corpus, split)
    if chunk is None:
        chunk = chunk_rows(n_q, dev.type, row_bytes=scorer.row_bytes(int(corpus.shape[1])),
                           free_bytes=_free_bytes(torch, dev))
    best_s = best_i = None
    ordered, any_ninf = True, False
    for start in range(0, n, chunk):
        vals, ids, chunk_ordered, ninf = _chunk_topk(torch, scorer, corpus[start : start + chunk], k)
        if start:
            ids = ids + start
        any_ninf |= ninf
        if best_s is None:
            best_s, best_i, ordered = vals, ids, chunk_ordered
        else:
            best_s, best_i = order_by_score_then_id(torch, torch.cat([best_s, vals], 1), torch.cat([best_i, ids], 1))
            best_s, best_i, ordered = best_s[:, :k], best_i[:, :k], True
    if best_s is None:  # no queries, or an empty corpus
        return (torch.full((n_q, k), float("-inf"), dtype=torch.float32, device=dev),
                torch.full((n_q, k), -1, dtype=torch.int64, device=dev))
    if not ordered:
        best_s, best_i = order_by_score_then_id(torch, best_s, best_i)
    if any_ninf:  # -inf is never returned: those slots are padding
        best_i = torch.where(torch.isneginf(best_s), -1, best_i)
    if best_s.shape[1] < k:  # fewer rows than k: pad
        pad = k - best_s.shape[1]
        best_s = torch.cat([best_s, torch.full((n_q, pad), float("-inf"), device=dev)], 1)
        best_i = torch.cat([best_i, torch.full((n_q, pad), -1, dtype=torch.int64, device=dev)], 1)
    return best_s, best_i
