"""Logits processors of the local backend's generation (run before
:class:`rcn_fast.llm.seeded.SeededSampler` or the greedy argmax):

* :class:`FiniteLogitsCheck` -- a NaN or ``+inf`` next-token logit, or a
  row whose logits are all ``-inf``, stops the generation with
  :class:`NonFiniteLogitsError`: broken numbers (NaN weights, an overflow
  in half precision) are an error, never text (the argmax of a NaN row is
  an arbitrary token);
* :class:`LogitBias` -- OpenAI's ``logit_bias``: a number added to the
  logits of chosen token ids before sampling or the greedy argmax
  (``-100`` bans a token in practice, ``+100`` forces it);
* :func:`log_softmax_rows`, :func:`top_logprobs` -- next-token
  log-probabilities and their top ``k`` from numpy logits (the llama.cpp
  backend's ``top_logprobs_ids`` and served prompt log-probs).
"""

from __future__ import annotations

import math
from typing import Any, Mapping

from rcn_fast._validate import is_number

#: OpenAI's range of a ``logit_bias`` value.
BIAS_RANGE = (-100.0, 100.0)


class NonFiniteLogitsError(ValueError):
    """The model's next-token logits are NaN or ``+inf`` (or all ``-inf``):
    the generation has no answer."""


class FiniteLogitsCheck:
    """A transformers logits processor that raises
    :class:`NonFiniteLogitsError` on a NaN or ``+inf`` logit, or a row of
    ``-inf`` only (one device reduction per step).

    Parameters
    ----------
    backend : str
        Names the model in the message.
    prompt_width : int
        Width of the (left-padded) prompt tensor (the step is counted from it).
    """

    def __init__(self, backend: str, prompt_width: int) -> None:
        self.backend = backend
        self.prompt_width = int(prompt_width)

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        import torch

        bad = (torch.isnan(scores) | torch.isposinf(scores)).any(dim=-1) | torch.isneginf(scores).all(dim=-1)
        if bool(bad.any()):
            rows = torch.nonzero(bad).flatten().tolist()
            step = int(input_ids.shape[1]) - self.prompt_width
            raise NonFiniteLogitsError(
                f"{self.backend}: the next-token logits of batch row(s) {rows[:8]} at generated token {step} are "
                f"NaN, +inf or all -inf: the model's numbers are broken (NaN weights, an overflow in "
                f"{scores.dtype}), so the generation has no answer and nothing is cached")
        return scores


def check_logit_bias(bias: Any, vocab_size: int, name: str = "logit_bias") -> dict[int, float]:
    """OpenAI's ``logit_bias`` (``{token id (int or digit string): bias}``)
    as ``{int: float}``.

    Raises
    ------
    ValueError
        Not a mapping, a key that is not a token id below ``vocab_size``,
        or a value that is not a finite number in :data:`BIAS_RANGE`; the
        message names ``name`` and the entry.
    """
    if not isinstance(bias, Mapping):
        raise ValueError(f"{name}: expected a mapping of token ids to numbers, got {type(bias).__name__}")
    out: dict[int, float] = {}
    lo, hi = BIAS_RANGE
    for k, v in bias.items():
        key = k if isinstance(k, int) and not isinstance(k, bool) else (
            int(k) if isinstance(k, str) and k.strip().isascii() and k.strip().isdigit() else None)
        if key is None or not 0 <= key < vocab_size:
            raise ValueError(f"{name}: key {k!r} is not a token id in [0, {vocab_size})")
        if not is_number(v) or not math.isfinite(v) or not lo <= v <= hi:
            raise ValueError(f"{name}[{k!r}]: expected a number in [{lo:g}, {hi:g}], got {v!r}")
        out[key] = float(v)
    return out


class LogitBias:
    """A transformers logits processor adding ``bias[token]`` to every row's
    logit of ``token`` (``bias`` checked by :func:`check_logit_bias`). The
    index and value tensors are built once per device and dtype of the
    logits, not once per generated token."""

    def __init__(self, bias: Mapping[int, float]) -> None:
        self.ids = [int(k) for k in bias]
        self.values = [float(bias[k]) for k in bias]
        self._tensors: dict[tuple[Any, Any], tuple[Any, Any]] = {}  # (device, dtype) -> (ids, values)

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        import torch

        if not self.ids:
            return scores
        where = (scores.device, scores.dtype)
        if where not in self._tensors:
            self._tensors[where] = (torch.tensor(self.ids, dtype=torch.long, device=scores.device),
                                    torch.tensor(self.values, dtype=scores.dtype, device=scores.device))
        idx, add = self._tensors[where]
        out = scores.clone()
        out[:, idx] += add
        return out


def log_softmax_rows(logits: Any) -> Any:
    """float64 log-softmax of logit rows (numpy, float32 ``[n, V]`` or ``[V]``)."""
    import numpy as np

    x = np.asarray(logits, dtype=np.float64)
    m = x.max(axis=-1, keepdims=True)
    return x - (m + np.log(np.exp(x - m).sum(axis=-1, keepdims=True)))


def top_logprobs(lp: Any, k: int) -> list[tuple[int, float]]:
    """The ``k`` largest entries of one log-prob row (numpy ``[V]``) as
    ``(id, log-prob)``, largest first (ties: the lower id first)."""
    import numpy as np

    k = min(int(k), len(lp))
    if k <= 0:
        return []
    idx = np.argpartition(-lp, k - 1)[:k] if k < len(lp) else np.arange(len(lp))
    idx = idx[np.lexsort((idx, -lp[idx]))]
    return [(int(t), float(lp[t])) for t in idx]


__all__ = ["NonFiniteLogitsError", "FiniteLogitsCheck", "LogitBias", "check_logit_bias", "BIAS_RANGE",
           "log_softmax_rows", "top_logprobs"]
