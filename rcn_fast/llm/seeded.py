"""Seeded sampling whose draws do not depend on batching.

Contract (local backend, :class:`rcn_fast.llm.backends.hf.HFLLM`): a sampled
generation depends only on the model, the prompt's token ids, the decoding
parameters, ``seed`` and the sample index ``s`` -- never on which other rows
share its batch, the batch size, its position in the batch, or
``num_samples`` (the first ``k`` samples of ``num_samples=n`` are the
samples of ``num_samples=k``). The call cache relies on this to draw only
the samples it lacks.

How: every (prompt, sample) pair is its own row of the batch, decoded
greedily by transformers with :class:`SeededSampler` as the last logits
processor. At each step the processor turns the row's logits into the
sampling distribution (temperature, then top-p) and draws one token by
inverse-CDF sampling with a uniform number that is a hash of
``(seed, s, prompt ids)`` and the step (:func:`row_key`,
:func:`step_uniform`); it returns a score vector that is 0 at the drawn
token and ``-inf`` elsewhere, so the greedy argmax takes it. The uniforms
are computed on the host from SHA-256 (53 bits each), so they are the same
on every device and in every batch; only the logits themselves can differ
in the last bits between batch shapes, which changes a draw only when its
uniform falls within that rounding of a token boundary.

Server backends get a per-request seed from :func:`sample_seed` (one
request per sample).
"""

from __future__ import annotations

import hashlib
from typing import Any, Sequence

import numpy as np

_DOMAIN = b"rcn_fast.llm.seeded/v1"


def sample_seed(seed: int, sample: int) -> int:
    """The seed sent to a server for sample ``sample`` of a row: ``seed``
    itself for sample 0, else a 31-bit hash of ``(seed, sample)`` (so the
    samples of ``seed`` and ``seed + 1`` do not overlap, as ``seed + s``
    would make them).

    Parameters
    ----------
    seed : int
    sample : int
        Sample index, >= 0.

    Returns
    -------
    int
        In ``[0, 2**31)`` for ``sample > 0``.
    """
    if sample == 0:
        return int(seed)
    h = hashlib.sha256(_DOMAIN + f"|server-seed|{int(seed)}|{int(sample)}".encode()).digest()
    return int.from_bytes(h[:4], "little") & 0x7FFFFFFF


def row_key(seed: int, sample: int, prompt_ids: Sequence[int]) -> bytes:
    """32-byte key of one sampled row: SHA-256 of ``(seed, sample, prompt ids)``.

    Parameters
    ----------
    seed : int
    sample : int
        Sample index, >= 0.
    prompt_ids : sequence of int
        The prompt's token ids (unpadded).
    """
    h = hashlib.sha256(_DOMAIN + f"|row|{int(seed)}|{int(sample)}|".encode())
    h.update(np.asarray(prompt_ids, dtype="<i8").tobytes())
    return h.digest()


def step_uniform(key: bytes, step: int) -> float:
    """A uniform number in ``[0, 1)`` (53 bits) for decoding step ``step`` of
    the row with key ``key``."""
    h = hashlib.sha256(key + int(step).to_bytes(8, "little", signed=False)).digest()
    return (int.from_bytes(h[:8], "little") >> 11) / float(1 << 53)


def top_p_filter(x: Any, top_p: float) -> Any:
    """Set to ``-inf`` the logits outside the nucleus: the smallest set of
    most likely tokens whose probability reaches ``top_p`` (the most likely
    token is always kept; ties are ordered by token id).

    Parameters
    ----------
    x : float tensor [B, V]
        Logits (already divided by the temperature).
    top_p : float
        In ``(0, 1]``; 1 keeps every token.

    Returns
    -------
    float tensor [B, V], the dtype of ``x``
    """
    import torch

    if top_p >= 1.0:
        return x
    probs = torch.softmax(x.float(), dim=-1)
    sp, si = probs.sort(dim=-1, descending=True, stable=True)
    before = sp.cumsum(dim=-1) - sp  # mass of the more likely tokens
    drop = torch.zeros_like(before, dtype=torch.bool).scatter(1, si, before >= top_p)
    return x.masked_fill(drop, float("-inf"))


def draw(scores: Any, uniforms: Any, temperature: float, top_p: float) -> Any:
    """One token per row by inverse-CDF sampling.

    Parameters
    ----------
    scores : float tensor [B, V]
        Next-token logits.
    uniforms : float64 tensor [B]
        In ``[0, 1)``, on the device of ``scores``.
    temperature : float
        > 0.
    top_p : float
        In ``(0, 1]``.

    Returns
    -------
    int64 tensor [B]
        Token ids, each with probability ``softmax(top_p(scores / T))``.
    """
    import torch

    x = top_p_filter(scores.float() / float(temperature), top_p)
    p = torch.softmax(x, dim=-1).double()
    c = p.cumsum(dim=-1)
    target = (uniforms.double() * c[:, -1]).unsqueeze(1)
    idx = torch.searchsorted(c, target, right=True).squeeze(1)
    # rounding can put the target at the very top: take the last token with mass
    V = p.shape[1]
    last = (V - 1) - torch.argmax(torch.flip(p > 0, dims=[1]).to(torch.int8), dim=1)
    return torch.minimum(idx, last)


class SeededSampler:
    """A transformers logits processor that samples each row from its own
    counter-based random stream (see the module notes); use it with greedy
    decoding (``do_sample=False``) as the last processor.

    Parameters
    ----------
    keys : list of bytes, length B
        :func:`row_key` of each row of the batch, in batch order.
    prompt_width : int
        Width of the (left-padded) prompt tensor; the step is
        ``input_ids.shape[1] - prompt_width``.
    temperature : float
        > 0.
    top_p : float
        In ``(0, 1]``.
    """

    def __init__(self, keys: Sequence[bytes], prompt_width: int, temperature: float, top_p: float) -> None:
        if not temperature > 0:
            raise ValueError(f"temperature: expected > 0 for sampling, got {temperature!r}")
        if not 0 < top_p <= 1:
            raise ValueError(f"top_p: expected a number in (0, 1], got {top_p!r}")
        self.keys = list(keys)
        self.prompt_width = int(prompt_width)
        self.temperature = float(temperature)
        self.top_p = float(top_p)

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        import torch

        if scores.shape[0] != len(self.keys):
            raise ValueError(f"scores: expected {len(self.keys)} rows (one per key), got {scores.shape[0]}")
        step = int(input_ids.shape[1]) - self.prompt_width
        u = torch.tensor([step_uniform(k, step) for k in self.keys], dtype=torch.float64, device=scores.device)
        idx = draw(scores, u, self.temperature, self.top_p)
        out = torch.full_like(scores, float("-inf"))
        return out.scatter_(1, idx.unsqueeze(1), 0.0)


__all__ = ["sample_seed", "row_key", "step_uniform", "top_p_filter", "draw", "SeededSampler"]
