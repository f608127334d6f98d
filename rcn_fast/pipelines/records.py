"""The records a pipeline returns: :class:`Prediction` (multiple choice)
with its :class:`QuestionCost`, and :func:`upgrade_prediction`, the one
place the former field names of older records (``label``, ``answer``) are
mapped to today's (``pred_label``, ``gold``). The fields are documented
field by field in docs/evaluation.md ("Per-question records and their
trace").
"""

from __future__ import annotations

import copy
from dataclasses import asdict, dataclass, field
from typing import Any

from rcn_fast.retrieval.types import Passage


@dataclass
class QuestionCost:
    """LLM usage of one question.

    ``llm_calls``, ``prompt_tokens`` and ``generated_tokens`` come from the
    LLM's cost tracker (tagged with the question id); ``generations`` and
    ``scoring_passes`` are the rows the pipeline sent (so
    ``llm_calls == generations + scoring_passes`` for backends that count
    one call per row).
    """

    llm_calls: int = 0
    generations: int = 0
    scoring_passes: int = 0
    prompt_tokens: int = 0
    generated_tokens: int = 0
    cached_calls: int = 0

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.generated_tokens

    def to_dict(self) -> dict[str, int]:
        return asdict(self)


@dataclass
class Prediction:
    """The answer of a pipeline to one question.

    Attributes
    ----------
    question_id : str
    pred : int
        Index of the predicted choice (argmax of ``choice_logprobs``, first
        on ties).
    pred_label : str
        Label of the predicted choice.
    choice_logprobs : list of float
        Log-softmax over the choice labels at the answer position.
    knowledge : list of str
        The items given to the answering step (empty for vanilla).
    passages : list of Passage
        Every passage retrieved for the question (pooled, deduplicated).
    trace : list of dict
        One entry per stage and row: ``stage``, ``type`` (``generate``,
        ``score``, ``retrieve``, ``sample``) and its inputs/outputs.
    cost : QuestionCost
    gold : int or None
        The gold answer index of the question given (None in an evaluation:
        pipelines get questions without gold; the task writes it into the
        records, :meth:`rcn_fast.eval.metrics.Task.record_prediction`).
        Whether the prediction is correct is the task's scoring:
        ``rcn_fast.eval.metrics.score(question, prediction)["acc"]``.
    gold_label : str or None
        The label of ``gold``.

    Records written before these names call ``pred_label`` ``label`` and
    ``gold`` ``answer``: :meth:`from_dict` reads them (through
    :func:`upgrade_prediction`); ``label`` and ``answer`` remain read-only
    aliases of the attributes.
    """

    question_id: str
    pred: int
    pred_label: str
    choice_logprobs: list[float]
    knowledge: list[str] = field(default_factory=list)
    passages: list[Passage] = field(default_factory=list)
    trace: list[dict[str, Any]] = field(default_factory=list)
    cost: QuestionCost = field(default_factory=QuestionCost)
    gold: int | None = None
    gold_label: str | None = None

    @property
    def label(self) -> str:
        """The former name of :attr:`pred_label`."""
        return self.pred_label

    @property
    def answer(self) -> int | None:
        """The former name of :attr:`gold`."""
        return self.gold

    def to_dict(self) -> dict[str, Any]:
        return {
            "question_id": self.question_id,
            "pred": self.pred,
            "pred_label": self.pred_label,
            "choice_logprobs": list(self.choice_logprobs),
            "gold": self.gold,
            "gold_label": self.gold_label,
            "knowledge": list(self.knowledge),
            "passages": [p.to_dict() for p in self.passages],
            "trace": copy.deepcopy(self.trace),
            "cost": self.cost.to_dict(),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Prediction":
        d = upgrade_prediction(d)
        return cls(
            question_id=d["question_id"], pred=int(d["pred"]), pred_label=d["pred_label"],
            choice_logprobs=[float(x) for x in d["choice_logprobs"]], knowledge=list(d.get("knowledge", [])),
            passages=[Passage.from_dict(p) for p in d.get("passages", [])], trace=list(d.get("trace", [])),
            cost=QuestionCost(**d.get("cost", {})), gold=d.get("gold"), gold_label=d.get("gold_label"),
        )


#: Former names of prediction fields -> their names now (records written before issue 54).
RENAMED_FIELDS = {"label": "pred_label", "answer": "gold"}


def upgrade_prediction(d: Any) -> Any:
    """A prediction dict (a record's ``prediction``, a samples line's) with
    the former field names mapped to today's: ``label`` -> ``pred_label``,
    ``answer`` -> ``gold`` (a multiple-choice prediction: one with
    ``pred``), and each ActiveRAG agent's ``label`` in a ``combine`` trace
    entry -> ``pred_label``. The one place every reader of records maps
    old files (checkpoint resume, the record checks, samples, ``show``,
    :meth:`Prediction.from_dict`). ``gold_label`` stays absent when the
    record has none (the readers that know the question fill it in).
    Anything else is returned as it is; a dict is never changed in place.
    """
    if not isinstance(d, dict) or "pred" not in d or not any(k in d for k in RENAMED_FIELDS):
        if isinstance(d, dict) and _old_combine(d.get("trace")):
            return {**d, "trace": _upgrade_trace(d["trace"])}
        return d
    out = {}
    for k, v in d.items():
        new = RENAMED_FIELDS.get(k)
        if new is None:
            out[k] = v
        elif new not in d:
            out[new] = v
    if _old_combine(out.get("trace")):
        out["trace"] = _upgrade_trace(out["trace"])
    return out


def _old_combine(trace: Any) -> bool:
    return isinstance(trace, list) and any(
        isinstance(e, dict) and e.get("type") == "combine" and isinstance(e.get("agents"), list)
        and any(isinstance(a, dict) and "label" in a and "pred_label" not in a for a in e["agents"])
        for e in trace)


def _upgrade_trace(trace: list[Any]) -> list[Any]:
    out = []
    for e in trace:
        if isinstance(e, dict) and e.get("type") == "combine" and isinstance(e.get("agents"), list):
            e = {**e, "agents": [{("pred_label" if k == "label" else k): v for k, v in a.items()}
                                 if isinstance(a, dict) and "pred_label" not in a else a for a in e["agents"]]}
        out.append(e)
    return out


__all__ = ["Prediction", "QuestionCost", "upgrade_prediction", "RENAMED_FIELDS"]
