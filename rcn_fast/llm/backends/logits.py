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
* :class:`TokenReport` -- reports every generated token as it is chosen,
  with its log-probability under the model's own (unbiased) logits, for
  the server's streams and log-probs (:data:`rcn_fast.llm.server.protocol.OnToken`).

:func:`row_ended` is the rule both local backends end a row by.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Mapping, Sequence

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


def row_ended(tokenizer: Any, toks: Sequence[int], stop: Sequence[str] | None, stop_ids: set[int]) -> bool:
    """Whether a row that generated ``toks`` has ended: its last token ends
    generation (``stop_ids``: end of sequence, end of turn, padding) or its
    text (special tokens skipped) holds one of the ``stop`` strings."""
    if toks[-1] in stop_ids:
        return True
    return bool(stop) and any(s in tokenizer.decode(list(toks), skip_special_tokens=True) for s in stop)


class TokenReport:
    """Reports each token a transformers ``generate`` call chooses, through
    two logits processors: :meth:`raw` (right after
    :class:`FiniteLogitsCheck`: it keeps the log-softmax of the model's own
    logits) and :meth:`chosen` (the last one: the greedy argmax of the
    final scores is the token generate takes, a :class:`SeededSampler`
    draw included). A row is reported up to the token that ends it
    (:func:`row_ended`), never after.

    Parameters
    ----------
    rows : list of (int, int)
        (prompt index, sample index) of each batch row.
    k : int or None
        Top log-probs per token (None: no log-probs, ``logprob`` None).
    on_token : callable
        ``on_token(prompt, sample, token, logprob, top)``; it may raise to stop.
    tokenizer, stop, stop_ids
        As :func:`row_ended`.
    """

    def __init__(self, rows: Sequence[tuple[int, int]], k: int | None, on_token: Callable[..., None], tokenizer: Any,
                 stop: Sequence[str] | None, stop_ids: set[int]) -> None:
        self.rows = list(rows)
        self.k = k
        self.on_token = on_token
        self.tokenizer = tokenizer
        self.stop = stop
        self.stop_ids = stop_ids
        self.toks: list[list[int]] = [[] for _ in self.rows]
        self.ended = [False] * len(self.rows)
        self._lp: Any = None

    def raw(self, input_ids: Any, scores: Any) -> Any:
        import torch

        self._lp = torch.log_softmax(scores.float(), dim=-1) if self.k is not None else None
        return scores

    def chosen(self, input_ids: Any, scores: Any) -> Any:
        import torch

        picked = torch.argmax(scores, dim=-1).tolist()
        lp = self._lp
        tops = None
        if lp is not None and self.k:
            tv, ti = torch.topk(lp, min(self.k, lp.shape[1]), dim=-1)
            tops = (ti.tolist(), tv.tolist())
        for b, tok in enumerate(picked):
            if self.ended[b]:
                continue
            self.toks[b].append(int(tok))
            self.ended[b] = row_ended(self.tokenizer, self.toks[b], self.stop, self.stop_ids)
            top = list(zip(tops[0][b], tops[1][b])) if tops is not None else []
            self.on_token(*self.rows[b], int(tok), None if lp is None else float(lp[b, tok]), top)
        return scores


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


__all__ = ["NonFiniteLogitsError", "FiniteLogitsCheck", "LogitBias", "TokenReport", "check_logit_bias", "row_ended",
           "BIAS_RANGE", "log_softmax_rows", "top_logprobs"]
