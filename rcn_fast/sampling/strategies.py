"""Every subset-selection strategy of ReConnect's Table 3, selected by name.

``sample(strategy, query_emb, cand_emb, num_subsets, subset_size, ...)``
returns int64 ids ``[B, num_subsets, subset_size]`` (-1 padded) for:

* ``"relevance"``: the fused relevance-based sampler
  (:func:`rcn_fast.sampling.sample_subsets`, native / CUDA);
* ``"random"``: uniform without replacement, independently per subset;
* ``"topk"``: the ``subset_size`` candidates with the largest
  ``dot(e_q, e_j)`` (ties: lower index first); every subset identical;
* ``"mmr"``: maximal marginal relevance, greedily
  ``argmax_j lambda * dot(e_q, e_j) - (1 - lambda) * max_{c chosen} dot(e_c, e_j)``
  starting from the most relevant candidate; every subset identical;
* ``"cluster"``: k-means (k = subset_size, k-means++ seeding, squared
  Euclidean distance) over the question's valid candidates; clusters are
  visited in decreasing ``dot(e_q, centroid)`` and each subset takes one
  member of every cluster, drawn uniformly, so subsets differ.

All randomness comes from the sampler's Philox streams
(:func:`rcn_fast.sampling.philox.sampler_uniform`) keyed by ``(seed,
key, subset, step)``, or for the k-means seeding from
``numpy.random.default_rng([seed, key])``: a question's subsets never depend
on the rest of the batch. These strategies are plain numpy (per question
where the algorithm is sequential); they run on CPU copies of the inputs
and return results in the inputs' library and device.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rcn_fast import _arrays as A
from rcn_fast.sampling.philox import sampler_uniform
from rcn_fast.sampling.reference import uniform_pick
from rcn_fast.sampling.relevance import (
    check_count,
    check_stream_keys,
    check_seed,
    check_valid_mask,
    sample_subsets,
)

STRATEGIES = ("relevance", "random", "topk", "mmr", "cluster")


def sample(
    strategy: str,
    query_emb: Any,
    cand_emb: Any,
    num_subsets: int,
    subset_size: int,
    *,
    seed: int = 0,
    keys: Any = None,
    valid: Any = None,
    tau: float = 1.0,
    first: str = "uniform",
    mmr_lambda: float = 0.5,
    kmeans_iters: int = 25,
    backend: str | None = None,
) -> Any:
    """Subsets of each question's candidates by the named strategy.

    Parameters
    ----------
    strategy : {"relevance", "random", "topk", "mmr", "cluster"}
    query_emb : array [B, d]
        float32, float16 or bfloat16; numpy array or torch tensor.
    cand_emb : array [B, n, d]
        Same library and device as ``query_emb``.
    num_subsets, subset_size : int >= 1
    seed : int in [0, 2**64)
    keys : int array [B], optional
        Per-question stream ids (default: the row index).
    valid : int [B] counts or bool [B, n] mask, optional
    tau, first, backend
        Passed to :func:`~rcn_fast.sampling.sample_subsets` (``"relevance"`` only).
    mmr_lambda : float in [0, 1]
        Relevance weight of ``"mmr"`` (1 = top-k).
    kmeans_iters : int >= 1
        Lloyd iterations of ``"cluster"``.

    Returns
    -------
    ids : int64 [B, num_subsets, subset_size]
        Candidate indices per subset, -1 padded when a question has fewer
        than ``subset_size`` valid candidates.

    Examples
    --------
    >>> import numpy as np
    >>> from rcn_fast.sampling import sample
    >>> q = np.array([[1.0, 0.0]], np.float32)
    >>> c = np.array([[[0.9, 0.1], [0.1, 0.9], [0.8, 0.0]]], np.float32)
    >>> sample("topk", q, c, num_subsets=2, subset_size=2).tolist()
    [[[0, 2], [0, 2]]]
    """
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy: expected one of {list(STRATEGIES)}, got {strategy!r}")
    if strategy == "relevance":
        return sample_subsets(query_emb, cand_emb, num_subsets, subset_size, tau=tau, seed=seed,
                              keys=keys, valid=valid, first=first, backend=backend)
    query_emb = A.as_array(query_emb, "query_emb")
    cand_emb = A.as_array(cand_emb, "cand_emb")
    A.check_rank(query_emb, 2, "query_emb", "[B, d]")
    A.check_rank(cand_emb, 3, "cand_emb", "[B, n, d]")
    A.check_float_dtype(query_emb, "query_emb")
    A.check_float_dtype(cand_emb, "cand_emb")
    B, n, d = (int(x) for x in cand_emb.shape)
    if tuple(query_emb.shape) != (B, d):
        raise ValueError(
            f"query_emb: expected shape [B, d] = [{B}, {d}] to match cand_emb {list(cand_emb.shape)}, "
            f"got {list(query_emb.shape)}"
        )
    N = check_count(num_subsets, "num_subsets", 1)
    K = check_count(subset_size, "subset_size", 1)
    seed = check_seed(seed)
    keys_np = check_stream_keys(keys, B)
    mask = check_valid_mask(valid, B, n)
    mask = np.ones((B, n), dtype=bool) if mask is None else mask.astype(bool)
    q = A.to_float32_numpy(query_emb)
    e = A.to_float32_numpy(cand_emb)
    if not np.isfinite(q).all():
        raise ValueError("query_emb: expected finite values, found NaN or inf")
    bad = mask & ~np.isfinite(e).all(axis=-1)
    if bad.any():
        b, j = np.argwhere(bad)[0]
        raise ValueError(f"cand_emb: question {b}, candidate {j}: expected finite values, found NaN or inf")
    if B == 0 or n == 0:
        ids = np.full((B, N, K), -1, dtype=np.int64)
    elif strategy == "random":
        ids = random_subsets(mask, N, K, seed, keys_np)
    elif strategy == "topk":
        ids = topk_subsets(q, e, mask, N, K)
    elif strategy == "mmr":
        lam = float(mmr_lambda)
        if not 0.0 <= lam <= 1.0:
            raise ValueError(f"mmr_lambda: expected a float in [0, 1], got {mmr_lambda}")
        ids = mmr_subsets(q, e, mask, N, K, lam)
    else:
        iters = check_count(kmeans_iters, "kmeans_iters", 1)
        ids = cluster_subsets(q, e, mask, N, K, seed, keys_np, iters)
    return A.from_numpy_like(cand_emb, ids)


def random_subsets(mask: np.ndarray, N: int, K: int, seed: int, keys: np.ndarray) -> np.ndarray:
    """Uniform without replacement: step t of subset s picks rank
    ``floor(u * m)`` among the ``m`` candidates left, u from Philox."""
    B, n = mask.shape
    eligible = np.repeat(mask[:, None, :], N, axis=1)
    ids = np.full((B, N, K), -1, dtype=np.int64)
    rows, subsets = np.arange(B)[:, None], np.arange(N)[None, :]
    for t in range(K):
        idx, _ = uniform_pick(eligible, sampler_uniform(seed, keys[:, None], subsets, t))
        ids[:, :, t] = idx
        took = idx >= 0
        eligible[rows, subsets, np.where(took, idx, 0)] &= ~took
    return ids


def _order_by_score(score: np.ndarray, cand: np.ndarray) -> np.ndarray:
    """``cand`` sorted by score descending, index ascending on ties."""
    return cand[np.lexsort((cand, -score[cand]))]


def topk_subsets(q: np.ndarray, e: np.ndarray, mask: np.ndarray, N: int, K: int) -> np.ndarray:
    """The K most query-similar valid candidates, the same for every subset."""
    B, n = mask.shape
    rel = np.einsum("bd,bnd->bn", q, e)
    ids = np.full((B, N, K), -1, dtype=np.int64)
    for b in range(B):
        best = _order_by_score(rel[b], np.flatnonzero(mask[b]))[:K]
        ids[b, :, : len(best)] = best
    return ids


def mmr_subsets(q: np.ndarray, e: np.ndarray, mask: np.ndarray, N: int, K: int, lam: float) -> np.ndarray:
    """Greedy maximal marginal relevance (dot products), the same for every subset."""
    B, n = mask.shape
    ids = np.full((B, N, K), -1, dtype=np.int64)
    for b in range(B):
        cand = np.flatnonzero(mask[b])
        if cand.size == 0:
            continue
        x = e[b, cand].astype(np.float64)
        rel = x @ q[b].astype(np.float64)
        sim = x @ x.T
        chosen: list[int] = []
        redundancy = np.full(cand.size, -np.inf)
        left = np.ones(cand.size, dtype=bool)
        for _ in range(min(K, cand.size)):
            score = lam * rel - (1.0 - lam) * (redundancy if chosen else 0.0)
            score = np.where(left, score, -np.inf)
            j = int(np.argmax(score))  # first maximum: lower index on ties
            chosen.append(j)
            left[j] = False
            redundancy = np.maximum(redundancy, sim[j])
        ids[b, :, : len(chosen)] = cand[chosen]
    return ids


def kmeans(x: np.ndarray, k: int, rng: np.random.Generator, iters: int) -> np.ndarray:
    """Cluster labels [m] of the rows of ``x`` (k-means++ seeding, Lloyd).
    Every cluster keeps at least one member (an emptied cluster takes the
    point farthest from its own centroid)."""
    m = x.shape[0]
    centers = [int(rng.integers(m))]
    d2 = ((x - x[centers[0]]) ** 2).sum(1)
    for _ in range(1, k):
        free = np.ones(m, dtype=bool)
        free[centers] = False
        w = np.where(free, d2, 0.0)
        nxt = int(rng.choice(m, p=w / w.sum())) if w.sum() > 0 else int(rng.choice(np.flatnonzero(free)))
        centers.append(nxt)
        d2 = np.minimum(d2, ((x - x[nxt]) ** 2).sum(1))
    c = x[centers].copy()
    labels = np.zeros(m, dtype=np.int64)
    for _ in range(iters):
        dist = ((x[:, None, :] - c[None, :, :]) ** 2).sum(-1)
        labels = dist.argmin(1)
        for j in range(k):
            if not (labels == j).any():
                own = dist[np.arange(m), labels]
                shared = np.bincount(labels, minlength=k)[labels] > 1  # never empty another
                far = int(np.argmax(np.where(shared, own, -1.0)))
                labels[far] = j
        new = np.stack([x[labels == j].mean(0) for j in range(k)])
        if np.allclose(new, c):
            break
        c = new
    return labels


def cluster_subsets(
    q: np.ndarray, e: np.ndarray, mask: np.ndarray, N: int, K: int, seed: int, keys: np.ndarray, iters: int
) -> np.ndarray:
    """One member of each k-means cluster per subset, clusters in decreasing
    relevance of their centroid; the member is drawn uniformly (Philox)."""
    B, n = mask.shape
    ids = np.full((B, N, K), -1, dtype=np.int64)
    subsets = np.arange(N)
    for b in range(B):
        cand = np.flatnonzero(mask[b])
        if cand.size == 0:
            continue
        k = min(K, cand.size)
        x = e[b, cand].astype(np.float64)
        key = int(np.int64(keys[b]).view(np.uint64))
        labels = kmeans(x, k, np.random.default_rng([seed, key]), iters)
        members = [np.flatnonzero(labels == j) for j in range(k)]
        rel = np.array([x[mem].mean(0) @ q[b] for mem in members])
        order = np.lexsort((np.arange(k), -rel))
        for t, j in enumerate(order):
            u = sampler_uniform(seed, np.full(N, keys[b]), subsets, t).astype(np.float64)
            pick = np.minimum((u * members[j].size).astype(np.int64), members[j].size - 1)
            ids[b, :, t] = cand[members[j][pick]]
    return ids
