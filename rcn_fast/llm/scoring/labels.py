"""Answer labels as tokens and their scores: which token ids spell a label
(:func:`label_token_ids`, :func:`pack_label_ids`) and the check that refuses
unusable label log-probabilities (:func:`check_label_scores`,
:class:`LabelScoreError`), used by every backend, and its form for stored
rows (:func:`logprob_row_problem`: the call cache, evaluation checkpoints).
The scoring ops themselves are in :mod:`rcn_fast.llm.scoring.choice`."""

from __future__ import annotations

import math
from typing import Any, Sequence

from rcn_fast import _arrays as A
from rcn_fast._validate import is_number

TORCH_HINT = "pip install 'rcn_fast[llm]' (torch>=2.11; on a CPU-only machine install the CPU build first: docs/gpu.md)"

#: A log-probability above this is "positive" (room for float rounding of 0).
LOGPROB_TOLERANCE = 1e-3


class LabelScoreError(ValueError):
    """A label's log-probability is NaN, ``+inf`` or positive (or every
    label of a row is ``-inf``): the model or server gave no usable score,
    so the question has no answer (the eval counts it as failed)."""


def _bad_logprob(v: float) -> str | None:
    if math.isnan(v):
        return "NaN"
    if v == math.inf:
        return "+inf"
    if v > LOGPROB_TOLERANCE:
        return "positive (a log-probability is <= 0)"
    return None


def check_label_scores(rows: Sequence[Sequence[float]], labels: Sequence[Sequence[str]], backend: str,
                       tags: Sequence[str] | None = None) -> None:
    """Refuse unusable label log-probabilities.

    Parameters
    ----------
    rows : list (length B) of list of float
        Per row, one score per label: a label's log-probability (before or
        after the log-softmax over the labels).
    labels : list (length B) of list of str
        The labels of each row (aligned with ``rows``).
    backend : str
        Names the model or server in the message (e.g. its identity).
    tags : list of str, optional
        Question ids of the rows, named in the message.

    Raises
    ------
    LabelScoreError
        A score is NaN, ``+inf`` or above :data:`LOGPROB_TOLERANCE`, or
        every label of a row is ``-inf``. ``-inf`` alone is a score
        (probability 0).
    """
    for i, (row, labs) in enumerate(zip(rows, labels)):
        problem = label_score_problem(row, labs)
        if problem is not None:
            kind, why = problem
            where = f"question {tags[i]!r} (chats[{i}])" if tags is not None else f"chats[{i}]"
            broken = "" if kind == "all-inf" else \
                ": the model's or server's numbers are broken (NaN logits, an overflow)"
            raise LabelScoreError(f"{backend}: {where}: {why}{broken}, so this question has no answer and nothing "
                                  "is cached")


def label_score_problem(row: Sequence[float], labels: Sequence[str]) -> tuple[str, str] | None:
    """Why one row of label log-probabilities is unusable, as ``(kind,
    why)`` (None: it is usable): kind ``"broken"``, a NaN, ``+inf`` or
    positive score; ``"all-inf"``, every label ``-inf``. The one rule of
    :func:`check_label_scores` (fresh scores) and of every reader of stored
    ones (:func:`logprob_row_problem`)."""
    for v, lab in zip(row, labels):
        why = _bad_logprob(float(v))
        if why is not None:
            return "broken", f"label {lab!r} has log-probability {float(v)!r}, which is {why}"
    if len(row) and all(float(v) == -math.inf for v in row):
        return "all-inf", f"every label ({', '.join(map(repr, labels))}) has log-probability -inf"
    return None


def logprob_row_problem(row: Any, labels: Sequence[str], *, empty_ok: bool = False) -> tuple[str, str] | None:
    """Why a stored row of label log-probabilities (read back from a file)
    is unusable, as ``(kind, why)``; None when it is usable.

    Kind ``"shape"``: not a list of numbers, one per label (``why``: ``"a
    value that is not a number: [...]"`` or ``"2 values for 4 labels"``;
    ``empty_ok``: an empty list, a row of no scores, is usable); else the
    kinds of :func:`label_score_problem`, the rule of fresh scores.
    """
    if not isinstance(row, list) or not all(is_number(v) for v in row):
        return "shape", f"a value that is not a number: {str(row)[:80]}"
    if empty_ok and not row:
        return None
    if len(row) != len(labels):
        return "shape", f"{len(row)} values for {len(labels)} labels"
    return label_score_problem(row, labels)


_SPACE_MARKERS = ("\u0120", "\u2581")  # byte-level BPE "Ġ", SentencePiece "▁"


def label_token_ids(
    tokenizer: Any,
    labels: Sequence[str],
    spellings: Sequence[str] = ("{}", " {}"),
    vocab_pieces: bool = True,
) -> list[list[int]]:
    """Token ids of every spelling of every label.

    Parameters
    ----------
    tokenizer : transformers tokenizer
    labels : list of str
        E.g. ``["A", "B", "C"]``.
    spellings : list of str
        Format strings encoded on their own; by default the label itself
        and with a leading space.
    vocab_pieces : bool
        Also take the vocabulary entries that spell each spelling as one
        piece, a leading space written as a space marker (``"A"``,
        ``"ĠA"``, ``"▁A"``). Encoding alone misses
        some: a SentencePiece tokenizer encodes both ``"A"`` and ``" A"`` as
        ``"▁A"`` and never yields the bare ``"A"`` a model may put after
        ``"Answer: "``.

    Returns
    -------
    list of list of int
        Per label, the distinct ids that spell it as one token (spellings
        that need several tokens are skipped).

    Raises
    ------
    ValueError
        When no spelling of a label is a single token (multi-token labels
        are not scored: rename them, e.g. to letters).
    """
    vocab = tokenizer.get_vocab() if vocab_pieces else {}
    out: list[list[int]] = []
    for label in labels:
        if not isinstance(label, str) or not label:
            raise ValueError(f"labels: expected non-empty strings, got {label!r}")
        ids: list[int] = []
        tried = []
        for fmt in spellings:
            text = fmt.format(label)
            toks = tokenizer.encode(text, add_special_tokens=False)
            tried.append(f"{text!r} -> {toks}")
            if len(toks) == 1 and toks[0] not in ids:
                ids.append(int(toks[0]))
            pieces = [m + text[1:] for m in _SPACE_MARKERS] if text.startswith(" ") else [text]
            for piece in pieces if vocab else ():
                tid = vocab.get(piece)
                if tid is not None and int(tid) not in ids:
                    ids.append(int(tid))
        if not ids:
            raise ValueError(
                f"labels: {label!r} is not a single token in any spelling ({'; '.join(tried)}); "
                f"label scoring needs single-token labels such as letters"
            )
        out.append(ids)
    return out


def pack_label_ids(per_row: Sequence[Sequence[Sequence[int]]]) -> Any:
    """Rows of labels of spellings (ragged) -> int64 tensor [B, C, S], -1 padded."""
    torch = A.require("torch", TORCH_HINT)
    B = len(per_row)
    C = max((len(r) for r in per_row), default=0)
    S = max((len(sp) for r in per_row for sp in r), default=0)
    out = torch.full((B, max(C, 1), max(S, 1)), -1, dtype=torch.int64)
    for b, row in enumerate(per_row):
        for c, sp in enumerate(row):
            if sp:
                out[b, c, : len(sp)] = torch.tensor(list(sp), dtype=torch.int64)
    return out


__all__ = ["LabelScoreError", "check_label_scores", "label_score_problem", "logprob_row_problem", "LOGPROB_TOLERANCE",
           "label_token_ids", "pack_label_ids", "TORCH_HINT"]
