"""The plain baselines the benchmarks time, in one place so the tests check
exactly what the benchmarks compare against (tests/llm/test_llm_scoring.py,
tests/test_sampling_peers.py): label scoring by a full-vocabulary
log-softmax, and subset sampling one question and one subset at a time
with ``torch.distributions.Categorical`` (how the published ReConnect code
samples). torch is imported when they are called."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


def full_vocab_then_gather(logits: "torch.Tensor", ids: "torch.Tensor") -> "torch.Tensor":
    """The plain baseline (also the benchmarks' baseline): log-softmax over
    the whole vocabulary, gather the spellings, combine, renormalise.

    Parameters
    ----------
    logits : torch.Tensor [B, V], any float dtype
    ids : torch.Tensor [B, C, S], int64; -1 marks an absent spelling

    Returns
    -------
    torch.Tensor [B, C], float32: log-probabilities of the C labels
    """
    import torch

    B, C, S = ids.shape
    logp = torch.log_softmax(logits.float(), dim=-1)
    g = logp.gather(1, ids.clamp(min=0).reshape(B, C * S)).reshape(B, C, S)
    lab = torch.logsumexp(g.masked_fill(ids < 0, float("-inf")), dim=2)
    return lab - torch.logsumexp(lab, dim=1, keepdim=True)


def make_ids(B: int, C: int, S: int, V: int, gen: "torch.Generator", holes: bool = True) -> "torch.Tensor":
    """Random label-spelling ids ``[B, C, S]`` (int64) below ``V``; with
    ``holes`` about a quarter of them are -1 (absent spellings), never a
    label's first."""
    import torch

    ids = torch.randint(0, V, (B, C, S), generator=gen)
    if holes:
        drop = torch.rand((B, C, S), generator=gen) < 0.25
        ids[drop] = -1
        ids[..., 0] = torch.where(ids[..., 0] < 0, torch.randint(0, V, (B, C), generator=gen), ids[..., 0])
    return ids


def torch_loop_sample(query_emb, cand_emb, num_subsets, subset_size, *, tau=1.0, seed=0, first="uniform"):
    """Per-question, per-subset loop with torch.distributions.Categorical.

    Parameters
    ----------
    query_emb : torch tensor [B, d]; cand_emb : torch tensor [B, n, d] (any float dtype)

    Returns
    -------
    ids : int64 tensor [B, num_subsets, subset_size]
    """
    import torch

    torch.manual_seed(seed)  # Categorical draws from torch's global generator
    B, n, _ = cand_emb.shape
    k = min(subset_size, n)
    out = torch.full((B, num_subsets, subset_size), -1, dtype=torch.int64)
    for b in range(B):
        e = cand_emb[b].float()
        rel = e @ query_emb[b].float()
        for s in range(num_subsets):
            if first == "uniform":
                j = int(torch.randint(n, (1,)))
            else:
                j = int(torch.distributions.Categorical(logits=rel / tau).sample())
            chosen = [j]
            for _ in range(1, k):
                mean = e[chosen].mean(0)
                scores = (e @ mean + rel) / tau
                scores[chosen] = float("-inf")
                j = int(torch.distributions.Categorical(logits=scores).sample())
                chosen.append(j)
            out[b, s, :k] = torch.tensor(chosen)
    return out


__all__ = ["full_vocab_then_gather", "make_ids", "torch_loop_sample"]
