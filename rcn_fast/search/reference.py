"""Plain numpy top-n: the specification every fast path is tested against.

Ordering rules (shared with csrc/topn/topn_order.h):

* per query, the ``k`` best corpus rows by inner product, higher first;
* equal scores: lower corpus id first;
* NaN and -inf scores are never returned; empty slots are ``(-inf, -1)``.

Scores are accumulated in float32 (inputs are upcast to float32 first), and
the corpus is scanned in chunks so memory stays O(Q * (chunk + k)).
"""

from __future__ import annotations

import numpy as np


def select_topn(scores: np.ndarray, ids: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Best ``k`` of each row of candidate ``(scores, ids)`` by (score desc, id asc).

    Parameters
    ----------
    scores : float32 [Q, m]
    ids : int64 [Q, m]
    k : int, >= 1

    Returns
    -------
    (scores, ids) : float32 [Q, k], int64 [Q, k], padded with (-inf, -1).
    """
    q, m = scores.shape
    scores = np.where(np.isnan(scores), -np.inf, scores).astype(np.float32, copy=False)
    out_s = np.full((q, k), -np.inf, dtype=np.float32)
    out_i = np.full((q, k), -1, dtype=np.int64)
    if m == 0:
        return out_s, out_i
    order = np.lexsort((ids, -scores), axis=-1)[:, :k]
    s = np.take_along_axis(scores, order, axis=1)
    i = np.take_along_axis(ids, order, axis=1)
    keep = s > -np.inf
    out_s[:, : s.shape[1]] = np.where(keep, s, -np.inf)
    out_i[:, : s.shape[1]] = np.where(keep, i, -1)
    return out_s, out_i


def topn_reference(
    queries: np.ndarray, corpus: np.ndarray, k: int, *, chunk: int = 65536
) -> tuple[np.ndarray, np.ndarray]:
    """Exact top-``k`` inner product search, plain numpy.

    Parameters
    ----------
    queries : [Q, d] float array (any float dtype; upcast to float32)
    corpus : [N, d] float array
    k : int, >= 1
    chunk : corpus rows scored at a time

    Returns
    -------
    scores : float32 [Q, k], descending
    ids : int64 [Q, k], -1 where fewer than k admissible rows exist
    """
    q = np.asarray(queries, dtype=np.float32)
    n = corpus.shape[0]
    best_s = np.full((q.shape[0], 0), -np.inf, dtype=np.float32)
    best_i = np.full((q.shape[0], 0), -1, dtype=np.int64)
    for start in range(0, n, chunk):
        block = np.asarray(corpus[start : start + chunk], dtype=np.float32)
        s = q @ block.T
        ids = np.broadcast_to(np.arange(start, start + block.shape[0], dtype=np.int64), s.shape)
        s, ids = _prefilter(s, ids, k)
        best_s, best_i = select_topn(
            np.concatenate([best_s, s], axis=1), np.concatenate([best_i, ids], axis=1), k
        )
    if best_s.shape[1] < k:
        best_s, best_i = select_topn(best_s, best_i, k)
    return best_s, best_i


def _prefilter(s: np.ndarray, ids: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Shrink each row to a superset of its top-k, keeping every tie at the
    k-th score (so the exact tie rule can still be applied)."""
    m = s.shape[1]
    if m <= 2 * k or s.shape[0] == 0:
        return s, ids
    s = np.where(np.isnan(s), -np.inf, s)
    part = np.argpartition(-s, k - 1, axis=1)
    kth = np.take_along_axis(s, part[:, k - 1 : k], axis=1)
    n_ge = (s >= kth).sum(axis=1)
    if int(n_ge.max()) == k:  # no ties beyond the k-th score: the partition is exact
        top = part[:, :k]
        return np.take_along_axis(s, top, axis=1), np.take_along_axis(ids, top, axis=1)
    return s, ids  # ties at the boundary: let select_topn sort the whole chunk
