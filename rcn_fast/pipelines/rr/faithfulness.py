"""RR's evidence side: the sentence-similarity model
(:func:`load_similarity_model`), the per-sentence faithfulness functions of
RR App. A.2 (:func:`faithfulness_terms`) and the vote over a question's
paths (:func:`faithful_vote`, RR eq. 1, or a majority vote;
:func:`vote_logprobs`)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from rcn_fast.pipelines.rr.config import PAPER_SIMILARITY_MODEL

TIE_TOLERANCE = 1e-9
SIMILARITY_KEYS = ("model", "fingerprint", "pooling", "normalize", "query_prefix", "passage_prefix", "dim")


def load_similarity_model(spec: Any) -> Any:
    """RR's sentence-similarity model: an encoder object (anything with
    ``encode_queries`` / ``encode_passages``) is returned as is; a path,
    installed package or hub id is loaded with
    :meth:`rcn_fast.retrieval.Encoder.from_pretrained` -- mean pooling, L2
    normalisation, no prefixes (sentence-transformers models such as
    MPNet), unless the model directory has its own ``rcn_fast_encoder.json``.

    Raises
    ------
    ValueError naming ``similarity_model`` when the model cannot be found
    (e.g. the default hub id while downloads are off and it is not cached).
    """
    if hasattr(spec, "encode_queries") and hasattr(spec, "encode_passages"):
        return spec
    if not isinstance(spec, (str, os.PathLike)):
        raise TypeError(f"similarity: expected an encoder, a model path or id, or 'retriever', got "
                        f"{type(spec).__name__}")
    from rcn_fast.model_files import resolve_model_dir
    from rcn_fast.retrieval.encoders.base import Encoder, saved_settings

    try:
        model_dir = resolve_model_dir(os.fspath(spec))
    except ValueError as exc:
        raise ValueError(
            f"similarity_model: cannot load {os.fspath(spec)!r} ({exc}). RR's similarity model (the paper: "
            f"{PAPER_SIMILARITY_MODEL!r}) must be a local directory, an installed package or a cached hub id; "
            "pass similarity_model=<path> (or similarity=<encoder>), or similarity_model='retriever' to use the "
            "retriever's encoder (not the paper's setting)") from None
    kw = {} if saved_settings(model_dir) else {"pooling": "mean", "normalize": True, "query_prefix": "",
                                                 "passage_prefix": ""}
    return Encoder.from_pretrained(os.fspath(spec), **kw)


def faithfulness_terms(M: Any, E: Any, C: Any, fn: int = 1, *, tm: float = 0.5, te: float = 0.6,
                       tc: float = 0.99) -> np.ndarray:
    """Per-sentence faithfulness terms (RR App. A.2).

    Parameters
    ----------
    M, E, C : float arrays [n]
        Cosine similarity of sentence and paragraph, NLI entailment and
        contradiction probabilities.
    fn : {1, 2, 3}
        1: ``M*(M >= tm) + E*(M < tm) - C``
        2: ``M + E``
        3: ``E*(E >= te) - C*(C >= tc)``
    tm, te, tc : float
        Thresholds (RR: 0.5, 0.6, 0.99).

    Returns
    -------
    float64 [n]; a path's faithfulness is their sum.
    """
    M, E, C = (np.asarray(x, dtype=np.float64).reshape(-1) for x in (M, E, C))
    if not M.shape == E.shape == C.shape:
        raise ValueError(f"E, C: expected the shape of M {M.shape}, got {E.shape} and {C.shape}")
    if fn == 1:
        return np.where(M >= tm, M, 0.0) + np.where(M < tm, E, 0.0) - C
    if fn == 2:
        return M + E
    if fn == 3:
        return np.where(E >= te, E, 0.0) - np.where(C >= tc, C, 0.0)
    raise ValueError(f"fn: expected 1, 2 or 3, got {fn!r}")


@dataclass
class Vote:
    """Outcome of the inference over a question's paths.

    ``votes`` int [C] (paths per choice), ``totals`` float [C] (summed
    faithfulness; the votes for self-consistency), ``pred`` (None when no
    path answered) and ``rule``: what decided (``"faithfulness"`` /
    ``"majority"``, ``"votes"`` on a tie, ``"lowest_index"`` on a tie of
    both, ``"no_answer"``).
    """

    pred: int | None
    votes: list[int]
    totals: list[float]
    rule: str


def faithful_vote(answers: Sequence[int | None], scores: Sequence[float] | None, num_choices: int) -> Vote:
    """RR eq. 1 (``scores`` given) or a majority vote (``scores=None``).

    Parameters
    ----------
    answers : per path, the predicted choice index or None (not counted)
    scores : per path, its faithfulness; None = count votes
    num_choices : int

    Returns
    -------
    Vote
    """
    votes = np.zeros(num_choices, np.int64)
    totals = np.zeros(num_choices, np.float64)
    for j, a in enumerate(answers):
        if a is None:
            continue
        if not 0 <= a < num_choices:
            raise ValueError(f"answers: path {j} predicts choice {a}, out of range for {num_choices} choices")
        votes[a] += 1
        totals[a] += 1.0 if scores is None else float(scores[j])
    live = np.flatnonzero(votes > 0)
    if not len(live):
        return Vote(None, votes.tolist(), totals.tolist(), "no_answer")
    first = "majority" if scores is None else "faithfulness"
    best = totals[live].max()
    cand = [int(i) for i in live if abs(totals[i] - best) <= TIE_TOLERANCE * max(1.0, abs(best))]
    if len(cand) == 1:
        return Vote(cand[0], votes.tolist(), totals.tolist(), first)
    top = max(votes[i] for i in cand)
    cand2 = [i for i in cand if votes[i] == top]
    if len(cand2) == 1:
        return Vote(cand2[0], votes.tolist(), totals.tolist(), "votes")
    return Vote(min(cand2), votes.tolist(), totals.tolist(), "lowest_index")


def vote_logprobs(vote: Vote, softmax: bool) -> list[float]:
    """``choice_logprobs`` of a vote: log-softmax of the totals
    (``softmax=True``, RR) or ``log(votes / answered)``, over the choices
    with at least one path; ``-inf`` elsewhere."""
    votes = np.asarray(vote.votes)
    live = votes > 0
    out = np.full(len(votes), -np.inf)
    if not live.any():
        return out.tolist()
    if softmax:
        t = np.asarray(vote.totals, dtype=np.float64)[live]
        out[live] = t - (t.max() + np.log(np.exp(t - t.max()).sum()))
    else:
        out[live] = np.log(votes[live] / votes.sum())
    return [float(x) for x in out]


__all__ = ["load_similarity_model", "faithfulness_terms", "Vote", "faithful_vote", "vote_logprobs", "TIE_TOLERANCE",
           "SIMILARITY_KEYS"]
