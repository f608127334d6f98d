"""Relevance-based subset sampling in plain numpy: the specification.

ReConnect (sec. 3.2, eqs. 4-6) turns the pooled candidates of a question
into ``num_subsets`` subsets of ``subset_size`` documents. For question
``b`` and subset ``s``, step ``t`` draws one document among the candidates
still *eligible* (valid and not yet in the subset):

* ``t = 0``, ``first="uniform"``: uniformly;
* ``t = 0``, ``first="relevance"``: ``p_j ∝ exp(dot(e_q, e_j) / tau)``;
* ``t >= 1``: ``p_j ∝ exp((dot(mean_chosen, e_j) + dot(e_q, e_j)) / tau)``.

Each draw uses one uniform ``u = sampler_uniform(seed, key_b, s, t)``
(:mod:`rcn_fast.sampling.philox`):

* uniform draw: the candidate of rank ``floor(u * m)`` among the ``m``
  eligible ones, in index order;
* softmax draw: inverse CDF, the first candidate ``j`` (index order, positive
  weight) whose cumulative weight exceeds ``u * total``.

A subset stops growing when no candidate is eligible: its remaining slots
hold ``-1`` (log-probability 0). Scores are computed in float32 (inputs are
upcast to float32), the softmax and CDF in float64. The native kernels
follow the same procedure in float32, so they return the same ids except
when ``u * total`` falls within rounding error of a CDF boundary (rare: on
the order of 1e-6 per draw).
"""

from __future__ import annotations

import numpy as np

from rcn_fast.sampling.philox import sampler_uniform

_F32_MAX = float(np.finfo(np.float32).max)


def uniform_pick(eligible: np.ndarray, u: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Rank ``floor(u * m)`` among the eligible candidates of each row.

    Parameters
    ----------
    eligible : bool [..., n]
    u : float [...] in [0, 1)

    Returns
    -------
    idx : int64 [...], -1 where no candidate is eligible
    logp : float64 [...], ``-log(m)`` (0 where nothing is eligible)
    """
    m = eligible.sum(axis=-1)
    target = np.minimum(np.floor(u.astype(np.float64) * m), np.maximum(m - 1, 0)).astype(np.int64)
    rank = np.cumsum(eligible, axis=-1) - 1  # rank of each eligible candidate
    hit = eligible & (rank == target[..., None])
    idx = np.where(m > 0, hit.argmax(axis=-1), -1)
    logp = np.where(m > 0, -np.log(np.maximum(m, 1)), 0.0)
    return idx.astype(np.int64), logp


def softmax_pick(z: np.ndarray, eligible: np.ndarray, u: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Inverse-CDF draw from ``softmax(z)`` over the eligible candidates.

    Parameters
    ----------
    z : float [..., n] logits (score / tau)
    eligible : bool [..., n]
    u : float [...] in [0, 1)

    Returns
    -------
    idx : int64 [...], -1 where no candidate is eligible
    logp : float64 [...], log-probability of the draw (0 where none)
    """
    z = np.where(eligible, z.astype(np.float64), -np.inf)
    any_ok = eligible.any(axis=-1)
    m = np.where(any_ok, z.max(axis=-1, initial=-np.inf), 0.0)
    w = np.where(eligible, np.exp(z - m[..., None]), 0.0)
    total = w.sum(axis=-1)
    cdf = np.cumsum(w, axis=-1)
    target = u.astype(np.float64) * total
    passed = (w > 0) & (cdf > target[..., None])
    last_pos = w.shape[-1] - 1 - np.argmax((w > 0)[..., ::-1], axis=-1)
    idx = np.where(passed.any(axis=-1), passed.argmax(axis=-1), last_pos)
    z_idx = np.take_along_axis(z, idx[..., None], axis=-1)[..., 0]
    logp = np.where(any_ok, z_idx - m - np.log(np.where(any_ok, total, 1.0)), 0.0)
    return np.where(any_ok, idx, -1).astype(np.int64), logp


def sample_subsets_reference(
    query_emb: np.ndarray,
    cand_emb: np.ndarray,
    num_subsets: int,
    subset_size: int,
    *,
    tau: float = 1.0,
    seed: int = 0,
    keys: np.ndarray | None = None,
    mask: np.ndarray | None = None,
    first: str = "uniform",
) -> tuple[np.ndarray, np.ndarray]:
    """Relevance-based subset sampling, vectorised over questions and subsets.

    Parameters
    ----------
    query_emb : float [B, d]
    cand_emb : float [B, n, d] (float32, float16 or bfloat16; upcast to float32)
    num_subsets, subset_size : int >= 1
    tau : float > 0, softmax temperature
    seed : int in [0, 2**64)
    keys : int64 [B], stream id per question (default: the row index)
    mask : bool [B, n], valid candidates (default: all)
    first : "uniform" or "relevance"

    Returns
    -------
    ids : int64 [B, num_subsets, subset_size], -1 padded
    logp : float32 [B, num_subsets, subset_size], log-probability of each draw

    Raises
    ------
    ValueError
        When a valid candidate's relevance ``dot(e_q, e_j)`` or a step's
        ``score / tau`` is not finite in float32.
    """
    q = np.asarray(query_emb, dtype=np.float32)
    e = np.asarray(cand_emb, dtype=np.float32)
    B, n, _ = e.shape
    keys = np.arange(B, dtype=np.int64) if keys is None else np.asarray(keys, dtype=np.int64)
    valid = np.ones((B, n), dtype=bool) if mask is None else np.asarray(mask, dtype=bool)
    N, K = int(num_subsets), int(subset_size)
    if B == 0 or n == 0:
        return np.full((B, N, K), -1, dtype=np.int64), np.zeros((B, N, K), dtype=np.float32)

    rel = np.einsum("bd,bnd->bn", q, e)  # dot(e_q, e_j), float32
    bad = valid & ~np.isfinite(rel)
    if bad.any():
        b, j = np.argwhere(bad)[0]
        raise ValueError(
            f"cand_emb: question {b}, candidate {j}: its relevance dot(query_emb, cand_emb) "
            "is NaN or inf (the embeddings hold NaN/inf values or overflow float32)"
        )

    eligible = np.repeat(valid[:, None, :], N, axis=1)  # [B, N, n]
    chosen_sum = np.zeros((B, N, q.shape[1]), dtype=np.float32)
    ids = np.full((B, N, K), -1, dtype=np.int64)
    logp = np.zeros((B, N, K), dtype=np.float32)
    rows = np.arange(B)[:, None]
    subsets = np.arange(N)[None, :]
    for t in range(K):
        u = sampler_uniform(seed, keys[:, None], subsets, t)  # [B, N]
        if t == 0 and first == "uniform":
            idx, lp = uniform_pick(eligible, u)
        else:
            mean = chosen_sum / np.float32(max(t, 1))  # zeros at t = 0
            with np.errstate(invalid="ignore", over="ignore"):  # padding may hold NaN/inf
                scores = np.matmul(mean, e.transpose(0, 2, 1)) + rel[:, None, :]  # [B, N, n]
                z = scores.astype(np.float64) / tau
            if (eligible & ~(np.abs(z) <= _F32_MAX)).any():
                b = int(np.argwhere(eligible & ~(np.abs(z) <= _F32_MAX))[0, 0])
                raise ValueError(
                    f"tau: scores / tau overflow float32 for question {b} "
                    "(use a larger tau or smaller embeddings)"
                )
            idx, lp = softmax_pick(z, eligible, u)
        ids[:, :, t] = idx
        logp[:, :, t] = lp
        took = idx >= 0
        safe = np.where(took, idx, 0)
        eligible[rows, subsets, safe] &= ~took
        chosen_sum += np.where(took[..., None], e[rows, safe], np.float32(0))
    return ids, logp
