"""The torch backend's chunk finishing in torch ops alone, with one host
synchronisation per chunk: what :func:`rcn_fast.search.torch_backend.topn_torch`
runs where neither rcn_fast._cuda nor rcn_fast._C can finish a chunk on the
inputs' device (another device, an extension not built, ``k`` above
:data:`~rcn_fast.search.torch_backend.FINISH_MAX_K`).

Per chunk: ``torch.topk`` of ``k + 1`` per row; three flags read on the host
(a NaN or a tie across the k-th place in some row, equal neighbours, -inf);
only the flagged rows are fixed up (NaN -> -inf, then the k-th place's ties
taken lowest id first; with a split query, rows with NaN are rescored with
both sides upcast first, so a split never turns an infinite score into
NaN). The rules are the device finishing's (csrc/topn/topn_block_select.h).
"""

from __future__ import annotations

from typing import Any


def order_by_score_then_id(torch: Any, scores: Any, ids: Any) -> tuple[Any, Any]:
    """``(scores, ids)`` [Q, m] rearranged per row by (score desc, id asc)."""
    by_id = torch.sort(ids, dim=1, stable=True).indices
    scores, ids = scores.gather(1, by_id), ids.gather(1, by_id)
    by_score = torch.sort(scores, dim=1, descending=True, stable=True).indices
    return scores.gather(1, by_score), ids.gather(1, by_score)


def ties_lowest_id(torch: Any, s: Any, k: int) -> Any:
    """Column indices [R, k] of the exact top-k of each row of ``s`` [R, m]
    (no NaN, k <= m): every score above the k-th, then the k-th score's ties
    lowest column first (in column order, not score order)."""
    kth = torch.topk(s, k, dim=1).values[:, -1:]
    above = s > kth
    tie = s == kth
    take = above | (tie & (tie.cumsum(1) <= k - above.sum(1, keepdim=True)))
    return take.nonzero()[:, 1].view(s.shape[0], k)


def chunk_topk(torch: Any, scorer: Any, block: Any, k: int) -> tuple[Any, Any, bool, bool]:
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
        cols = ties_lowest_id(torch, sub, kk)
        vals, idx = vals.clone(), idx.clone()
        vals[sel], idx[sel] = sub.gather(1, cols), cols
        any_ninf = True  # a NaN made -inf may be among them (the final mask costs two kernels)
    # topk sorts by score; only equal scores can be out of id order
    return vals, idx, not (any_fix or any_tie), any_ninf


def topn_torch_checked(torch: Any, scorer: Any, corpus: Any, k: int, chunk: int) -> tuple[Any, Any]:
    """:func:`~rcn_fast.search.torch_backend.topn_torch`'s loop with the
    host-checked finishing (``scorer``: the torch backend's scorer of the
    queries: ``scorer(block)`` float32 scores, ``.exact(block, rows)``,
    ``.mode``, ``.n_queries``)."""
    dev, n_q, n = corpus.device, scorer.n_queries, int(corpus.shape[0])
    best_s = best_i = None
    ordered, any_ninf = True, False
    for start in range(0, n, chunk):
        vals, ids, chunk_ordered, ninf = chunk_topk(torch, scorer, corpus[start : start + chunk], k)
        if start:
            ids = ids + start
        any_ninf |= ninf
        if best_s is None:
            best_s, best_i, ordered = vals, ids, chunk_ordered
        else:
            best_s, best_i = order_by_score_then_id(torch, torch.cat([best_s, vals], 1), torch.cat([best_i, ids], 1))
            best_s, best_i, ordered = best_s[:, :k], best_i[:, :k], True
    if not ordered:
        best_s, best_i = order_by_score_then_id(torch, best_s, best_i)
    if any_ninf:  # -inf is never returned: those slots are padding
        best_i = torch.where(torch.isneginf(best_s), -1, best_i)
    if best_s.shape[1] < k:  # fewer rows than k: pad
        pad = k - best_s.shape[1]
        best_s = torch.cat([best_s, torch.full((n_q, pad), float("-inf"), device=dev)], 1)
        best_i = torch.cat([best_i, torch.full((n_q, pad), -1, dtype=torch.int64, device=dev)], 1)
    return best_s, best_i
