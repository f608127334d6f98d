"""The subset sampler in torch ops, on the inputs' device: the numpy
reference (:mod:`rcn_fast.sampling.reference`) translated line for line, for
torch tensors on devices the compiled backends do not serve (a CUDA tensor
when rcn_fast._cuda was not built, MPS, ...). The Philox uniforms are made
on the host and moved to the device (B x num_subsets numbers per step).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rcn_fast.sampling.philox import sampler_uniform

_F32_MAX = float(np.finfo(np.float32).max)


def _uniform_pick(torch: Any, eligible: Any, u: Any) -> tuple[Any, Any]:
    m = eligible.sum(-1)
    target = torch.minimum(torch.floor(u.double() * m), (m - 1).clamp(min=0).double()).long()
    rank = eligible.long().cumsum(-1) - 1
    hit = eligible & (rank == target[..., None])
    idx = torch.where(m > 0, hit.long().argmax(-1), torch.full_like(m, -1))
    logp = torch.where(m > 0, -torch.log(m.clamp(min=1).double()), torch.zeros_like(m, dtype=torch.float64))
    return idx, logp


def _softmax_pick(torch: Any, z: Any, eligible: Any, u: Any) -> tuple[Any, Any]:
    ninf = torch.tensor(float("-inf"), dtype=z.dtype, device=z.device)
    z = torch.where(eligible, z, ninf)
    any_ok = eligible.any(-1)
    m = torch.where(any_ok, z.max(-1).values, torch.zeros_like(z[..., 0]))
    w = torch.where(eligible, torch.exp(z - m[..., None]), torch.zeros_like(z))
    total = w.sum(-1)
    cdf = w.cumsum(-1)
    target = u.double() * total
    passed = (w > 0) & (cdf > target[..., None])
    n = w.shape[-1]
    last_pos = n - 1 - (w > 0).flip(-1).long().argmax(-1)
    idx = torch.where(passed.any(-1), passed.long().argmax(-1), last_pos)
    z_idx = z.gather(-1, idx[..., None])[..., 0]
    logp = torch.where(any_ok, z_idx - m - torch.log(torch.where(any_ok, total, torch.ones_like(total))),
                       torch.zeros_like(total))
    return torch.where(any_ok, idx, torch.full_like(idx, -1)), logp


def sample_subsets_torch(query: Any, cand: Any, num_subsets: int, subset_size: int, tau: float, seed: int,
                         keys: np.ndarray, mask: np.ndarray | None, first_relevance: bool) -> tuple[Any, Any]:
    """Same arguments and results as the reference, as torch tensors on
    ``cand``'s device (ids int64, logp float32)."""
    import torch

    dev = cand.device
    q = query.to(device=dev, dtype=torch.float32)
    e = cand.float()
    B, n, d = e.shape
    N, K = num_subsets, subset_size
    valid = (torch.ones((B, n), dtype=torch.bool, device=dev) if mask is None
             else torch.from_numpy(mask.astype(bool)).to(dev))
    rel = torch.einsum("bd,bnd->bn", q, e)
    bad = valid & ~torch.isfinite(rel)
    if bool(bad.any()):
        b, j = (int(x) for x in bad.nonzero()[0])
        raise ValueError(
            f"cand_emb: question {b}, candidate {j}: its relevance dot(query_emb, cand_emb) "
            "is NaN or inf (the embeddings hold NaN/inf values or overflow float32)"
        )
    eligible = valid[:, None, :].repeat(1, N, 1)
    chosen_sum = torch.zeros((B, N, d), dtype=torch.float32, device=dev)
    ids = torch.full((B, N, K), -1, dtype=torch.int64, device=dev)
    logp = torch.zeros((B, N, K), dtype=torch.float32, device=dev)
    rows = torch.arange(B, device=dev)[:, None].expand(B, N)
    subs = torch.arange(N, device=dev)[None, :].expand(B, N)
    for t in range(K):
        u = torch.from_numpy(sampler_uniform(seed, keys[:, None], np.arange(N)[None, :], t)).to(dev)
        if t == 0 and not first_relevance:
            idx, lp = _uniform_pick(torch, eligible, u)
        else:
            mean = chosen_sum / float(max(t, 1))
            scores = torch.bmm(mean, e.transpose(1, 2)) + rel[:, None, :]
            z = scores.double() / tau
            over = eligible & ~(z.abs() <= _F32_MAX)
            if bool(over.any()):
                b = int(over.nonzero()[0, 0])
                raise ValueError(
                    f"tau: scores / tau overflow float32 for question {b} "
                    "(use a larger tau or smaller embeddings)"
                )
            idx, lp = _softmax_pick(torch, z, eligible, u)
        ids[:, :, t] = idx
        logp[:, :, t] = lp.float()
        took = idx >= 0
        safe = torch.where(took, idx, torch.zeros_like(idx))
        eligible[rows, subs, safe] &= ~took
        chosen_sum += torch.where(took[..., None], e[rows, safe], torch.zeros((), device=dev))
    return ids, logp
