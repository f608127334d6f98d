"""Exact label scoring from next-token and prompt log-probs: the one
algorithm every backend that scores labels through a serving engine uses
(:class:`rcn_fast.llm.openai.client.OpenAILLM` over HTTP,
:class:`rcn_fast.llm.backends.vllm_engine.VLLMEngine` in this process).

Each spelling token ``t`` of a label (:func:`rcn_fast.llm.scoring.labels.label_token_ids`)
is scored ``log p(t | prefix)``: read from the next-token top log-probs
after the prefix where ``t`` is among them, else from the prompt log-prob
of ``prefix + [t]`` at its last position (asked for once per distinct
``(row, token)``, in first-seen order). A label's score is the logsumexp of
its spellings'; :func:`finish_label_scores` checks the scores
(:func:`rcn_fast.llm.scoring.labels.check_label_scores`) and takes the log-softmax
over each row's labels, as the local backend does.
"""

from __future__ import annotations

from typing import Callable, Mapping, Sequence

import numpy as np

from rcn_fast.llm.base import logsumexp, pad_rows
from rcn_fast.llm.scoring.labels import check_label_scores

#: ``(row, token)`` pairs -> ``log p(token | prefix of row)`` of each, in order.
PromptLogprobs = Callable[[list[tuple[int, int]]], Sequence[float]]


def exact_label_scores(spell: Sequence[Sequence[Sequence[int]]], tops: Sequence[Mapping[int, float]] | None,
                       prompt_logprobs: PromptLogprobs) -> list[list[float]]:
    """Label scores (before the log-softmax over the labels).

    Parameters
    ----------
    spell : list (length B) of list (length C_b) of list of int
        The spelling token ids of each label of each row.
    tops : list (length B) of {token id: log-prob}, or None
        Next-token log-probs after each row's prefix that are known (the
        top log-probs the engine returned); None: none are known.
    prompt_logprobs : callable
        Called once with the ``(row, token)`` pairs not in ``tops`` (each
        distinct pair once, in row, label, spelling order); returns
        ``log p(token | prefix of row)`` of each.

    Returns
    -------
    list (length B) of list (length C_b) of float
        The logsumexp of each label's spelling log-probs.
    """
    vals: dict[tuple[int, int], float] = {}
    if tops is not None:
        for b, row in enumerate(spell):
            for ts in row:
                for t in ts:
                    if t in tops[b]:
                        vals[(b, t)] = float(tops[b][t])
    missing = list(dict.fromkeys((b, t) for b, row in enumerate(spell) for ts in row for t in ts if (b, t) not in vals))
    if missing:
        got = list(prompt_logprobs(missing))
        if len(got) != len(missing):
            raise RuntimeError(f"prompt log-probs: asked for {len(missing)}, got {len(got)}")
        vals.update(zip(missing, got))
    return [[logsumexp([vals[(b, t)] for t in ts]) for ts in row] for b, row in enumerate(spell)]


def log_softmax_row(scores: Sequence[float]) -> list[float]:
    """``scores - logsumexp(scores)`` of one row of label scores."""
    z = logsumexp(scores)
    return [s - z for s in scores]


def finish_label_scores(raw: Sequence[Sequence[float]], rows: Sequence[Sequence[str]], backend: str,
                        tags: Sequence[str] | None) -> np.ndarray:
    """Checked, log-softmaxed and padded label scores.

    Parameters
    ----------
    raw : list (length B) of list (length C_b) of float
        Label scores before the log-softmax (:func:`exact_label_scores`).
    rows : list (length B) of list of str
        The labels of each row (named in errors).
    backend : str
        The model's identity (named in errors).
    tags : list of str, optional
        Question ids of the rows (named in errors).

    Returns
    -------
    float32 ndarray [B, max C_b]
        Log-softmax over each row's labels, ``-inf`` padded.

    Raises
    ------
    LabelScoreError
        A NaN, ``+inf`` or positive score, or a row of ``-inf``.
    """
    check_label_scores(raw, rows, backend, tags)  # NaN, +inf, positive: the question fails
    return pad_rows([log_softmax_row(r) for r in raw])


__all__ = ["PromptLogprobs", "exact_label_scores", "log_softmax_row", "finish_label_scores"]
