"""Tasks own scoring: one :class:`Task` object per kind of task, as
lm-evaluation-harness's ``Task.process_results`` / ``aggregation``.

A task object

* loads its questions (:meth:`Task.load_questions`);
* hands the pipelines its questions *without their gold answers*
  (:meth:`Task.unlabeled`: an MCQuestion with ``answer=None``, an
  OpenQuestion with no ``answers``), so no pipeline sees or scores gold;
* scores a prediction against the gold (:meth:`Task.process_results`:
  ``{"acc": 1.0 | 0.0}`` for choice tasks, ``{"string_em", "exact_match"}``
  for open-domain ones; None without a gold answer) -- what
  ``prediction.correct`` used to say is ``process_results(q, p)[task.main_metric]``;
* writes the gold beside a prediction for the records
  (:meth:`Task.record_prediction`: the prediction's ``to_dict()`` with
  ``gold`` and ``gold_label`` -- or ``answers``, ``string_em``,
  ``exact_match`` and each ActiveRAG agent's metrics -- filled in) and :meth:`Task.scored` (the
  same as a prediction object);
* aggregates per-question values (:meth:`Task.aggregation`: mean and
  standard error) and gives the samples' fields and the chance level;
* checks a checkpoint record (:meth:`Task.check_record`): the one rule for
  a fresh record and for every record read back from a checkpoint -- types,
  ranges, finiteness, one log-prob per choice (none NaN, ``+inf`` or
  positive, not all ``-inf``), the prediction the argmax of those log-probs,
  the gold written beside it still the task's gold, and its metrics what
  its prediction scores against that gold.

A new kind of task is one subclass registered in :data:`TASK_TYPES`, with its
metric names in :data:`rcn_fast.eval.tasks.spec.METRICS` and its readers in
:data:`rcn_fast.eval.tasks.loading.READERS`.
"""

from __future__ import annotations

import copy
import dataclasses
import math
from typing import Any, Callable, ClassVar

from rcn_fast._validate import is_int, is_number
from rcn_fast.data.open_domain import OpenQuestion, exact_match, string_em
from rcn_fast.data.questions import MCQuestion
from rcn_fast.eval.tasks.loading import load_task_questions
from rcn_fast.eval.tasks.spec import METRICS, TaskSpec
from rcn_fast.pipelines.records import upgrade_prediction


def mean_stderr(values: list[float]) -> tuple[float, float]:
    """Mean and standard error (ddof=1, as lm-evaluation-harness) of 0/1 (or real) values."""
    n = len(values)
    if n == 0:
        return float("nan"), float("nan")
    m = sum(values) / n
    if n < 2:
        return m, 0.0
    var = sum((v - m) ** 2 for v in values) / (n - 1)
    return m, math.sqrt(var / n)


#: How far below the largest log-prob a predicted choice's may be: a tie (the
#: RR vote's tied totals are equal within 1e-9 of their size, and its
#: log-softmax keeps their gaps), far below any real gap between choices.
ARGMAX_TOLERANCE = 1e-4


class RecordError(ValueError):
    """A checkpoint record that is not a valid result of its question (the
    message says which field and why)."""


def _is_metric(v: Any) -> bool:
    return v is None or (is_number(v) and math.isfinite(v) and 0.0 <= v <= 1.0)


def upgrade_record(record: Any) -> Any:
    """A checkpoint record with its prediction's former field names mapped
    (:func:`rcn_fast.pipelines.base.upgrade_prediction`); anything that is
    not a record is returned as it is."""
    if isinstance(record, dict) and isinstance(record.get("prediction"), dict):
        pred = upgrade_prediction(record["prediction"])
        if pred is not record["prediction"]:
            return {**record, "prediction": pred}
    return record


def _as_dict(prediction: Any) -> dict[str, Any]:
    return prediction.to_dict() if hasattr(prediction, "to_dict") else copy.deepcopy(dict(prediction))


class Task:
    """One evaluation task: its spec, questions, scoring and aggregation.

    Parameters
    ----------
    spec : TaskSpec or None
        None for scoring alone (a library user's own questions).
    """

    #: the metric names, main one first
    metrics: ClassVar[tuple[str, ...]] = ()
    #: its questions are answered in free text (only pipelines with ``answers_open`` take them)
    open_domain: ClassVar[bool] = False

    def __init__(self, spec: TaskSpec | None = None) -> None:
        self.spec = spec

    @property
    def main_metric(self) -> str:
        return self.metrics[0]

    def load_questions(self, *, limit: int | float | None = None, split: str | None = None) -> list[Any]:
        """The task's questions, gold included (see :func:`rcn_fast.eval.tasks.catalog.load_task_questions`)."""
        if self.spec is None:
            raise ValueError("spec: a task without a TaskSpec has no questions to load")
        return load_task_questions(self.spec, limit=limit, split=split)

    def unlabeled(self, question: Any) -> Any:
        """The question as a pipeline receives it: without its gold answer."""
        raise NotImplementedError

    def process_results(self, question: Any, prediction: Any) -> dict[str, float | None]:
        """Per-question metric values (1.0 / 0.0; None without a gold answer)."""
        raise NotImplementedError

    def record_prediction(self, question: Any, prediction: Any) -> dict[str, Any]:
        """``prediction.to_dict()`` with the gold written beside it (the checkpoint record's ``prediction``)."""
        raise NotImplementedError

    def scored(self, question: Any, prediction: Any) -> Any:
        """A copy of ``prediction`` (same type) with the gold and its metrics filled in."""
        d = self.record_prediction(question, prediction)
        return type(prediction).from_dict(d) if hasattr(type(prediction), "from_dict") else d

    def check_record(self, question: Any, record: Any, seed: int | None = None, *, scores: bool = False) -> None:
        """Raise :class:`RecordError` unless ``record`` is a valid checkpoint
        record of ``question`` (of seed ``seed`` when given): ``status``
        ``"ok"``, a finite ``elapsed_s`` >= 0, token counts >= 0, a valid
        prediction (:meth:`check_prediction`: the gold beside it the
        question's gold; ``scores``: the pipeline scores its choices, so its
        log-probs may not be empty) and ``metrics`` -- one finite value in
        [0, 1] per metric -- equal to what the prediction scores against
        that gold. A record with the former field names (``label``,
        ``answer``) is read with today's (:func:`upgrade_record`)."""
        if not isinstance(record, dict):
            raise RecordError(f"expected a JSON object, got {type(record).__name__}")
        record = upgrade_record(record)
        if str(record.get("id")) != str(question.id):
            raise RecordError(f"id {record.get('id')!r} is not the question's ({question.id!r})")
        if record.get("status") != "ok":
            raise RecordError(f"status {record.get('status')!r}, expected 'ok'")
        if seed is not None and record.get("seed") != seed:
            raise RecordError(f"seed {record.get('seed')!r}, the file's is {seed}")
        el = record.get("elapsed_s", 0.0)
        if not (is_number(el) and math.isfinite(el) and el >= 0):
            raise RecordError(f"elapsed_s {el!r}: expected a finite number of seconds >= 0")
        pred = record.get("prediction")
        if not isinstance(pred, dict):
            raise RecordError(f"prediction: expected a JSON object, got {type(pred).__name__}")
        cost = pred.get("cost", {})
        if not isinstance(cost, dict) or not all(is_int(v) and v >= 0 for v in cost.values()):
            raise RecordError(f"prediction.cost {str(cost)[:80]}: expected counts (integers >= 0)")
        self.check_prediction(question, pred, scores=scores)
        metrics = record.get("metrics")
        if not isinstance(metrics, dict) or set(metrics) != set(self.metrics):
            raise RecordError(f"metrics {str(metrics)[:80]}: expected the values of {list(self.metrics)}")
        for m, v in metrics.items():
            if not _is_metric(v):
                raise RecordError(f"metrics.{m} {v!r}: expected a number in [0, 1]")
        want = self.process_results(question, pred)
        if metrics != want:
            raise RecordError(f"metrics {metrics} are not what the prediction scores against the gold ({want})")

    def check_prediction(self, question: Any, prediction: dict[str, Any], *, scores: bool = False) -> None:
        """Raise :class:`RecordError` unless ``prediction`` (a record's, as
        :meth:`record_prediction` writes it) is a valid answer to ``question``
        (``scores``: by a pipeline that scores its choices)."""
        raise NotImplementedError

    def aggregation(self) -> dict[str, Callable[[list[float]], tuple[float, float]]]:
        """Metric -> how per-question values aggregate: ``(mean, standard error)``."""
        return {m: mean_stderr for m in self.metrics}

    def sample_fields(self, question: Any, prediction: dict[str, Any]) -> dict[str, Any]:
        """The ``target`` / ``prediction`` fields of a ``samples_*.jsonl`` line."""
        raise NotImplementedError

    def chance(self, questions: list[Any]) -> float | None:
        """The metric of a uniform random guess (None when it has none)."""
        return None


class ChoiceTask(Task):
    """Multiple-choice and yes/no tasks: accuracy of the predicted choice."""

    metrics = METRICS["multiple_choice"]

    def unlabeled(self, question: MCQuestion) -> MCQuestion:
        return question if question.answer is None else dataclasses.replace(question, answer=None)

    def process_results(self, question: MCQuestion, prediction: Any) -> dict[str, float | None]:
        if question.answer is None:
            return {"acc": None}
        pred = prediction["pred"] if isinstance(prediction, dict) else prediction.pred
        return {"acc": float(int(pred) == int(question.answer))}

    def record_prediction(self, question: MCQuestion, prediction: Any) -> dict[str, Any]:
        d = upgrade_prediction(_as_dict(prediction))
        d["gold"], d["gold_label"] = question.answer, question.answer_label
        return d

    def check_prediction(self, question: MCQuestion, prediction: dict[str, Any], *, scores: bool = False) -> None:
        """A choice index in range with its label, one log-prob per choice
        (an empty list only from a pipeline that gives no scores: with
        ``scores``, empty log-probs contradict the pipeline and are refused,
        issue 53 N13) under the rule of
        fresh label scores (:func:`rcn_fast.llm.scoring.labels.logprob_row_problem`),
        the prediction an argmax of them (a tie, within
        :data:`ARGMAX_TOLERANCE`, may go to any of the tied choices, as the
        RR vote's tie rules send it), and the question's gold beside it."""
        from rcn_fast.llm.scoring.labels import logprob_row_problem

        prediction = upgrade_prediction(prediction)
        n = len(question.choices)
        p = prediction.get("pred")
        if not is_int(p) or not 0 <= p < n:
            raise RecordError(f"prediction.pred {p!r}: expected a choice index in [0, {n})")
        labels = list(question.labels)
        if prediction.get("pred_label") != labels[p]:
            raise RecordError(f"prediction.pred_label {prediction.get('pred_label')!r} is not choice {p}'s label "
                              f"{labels[p]!r}")
        lp = prediction.get("choice_logprobs")
        if scores and isinstance(lp, list) and not lp:
            raise RecordError(f"prediction.choice_logprobs is empty, but the pipeline scores every choice: expected "
                              f"{n} numbers (one per choice)")
        problem = logprob_row_problem(lp, labels, empty_ok=True)
        if problem is not None and problem[0] == "shape":
            raise RecordError(f"prediction.choice_logprobs {str(lp)[:80]}: expected {n} numbers (one per choice)")
        if problem is not None:
            raise RecordError(f"prediction.choice_logprobs: {problem[1]}")
        if lp and float(lp[p]) < max(float(x) for x in lp) - ARGMAX_TOLERANCE:
            best = max(range(n), key=lambda i: float(lp[i]))
            raise RecordError(f"prediction.pred {p} ({labels[p]!r}, log-prob {float(lp[p]):.6g}) is not the argmax of "
                              f"its choice_logprobs (choice {best} {labels[best]!r}, {float(lp[best]):.6g})")
        if prediction.get("gold") != question.answer:
            raise RecordError(f"prediction.gold {prediction.get('gold')!r}: the task's gold is now "
                              f"{question.answer!r} (its data changed)")
        if "gold_label" in prediction and prediction["gold_label"] != question.answer_label:
            raise RecordError(f"prediction.gold_label {prediction['gold_label']!r}: the task's gold label is "
                              f"{question.answer_label!r}")

    def sample_fields(self, question: MCQuestion, prediction: dict[str, Any]) -> dict[str, Any]:
        prediction = upgrade_prediction(prediction)
        return {"target": question.answer_label, "prediction": prediction.get("pred_label"),
                "pred_index": prediction.get("pred"), "gold": question.answer,
                "logprobs": dict(zip(question.labels or [], prediction.get("choice_logprobs", [])))}

    def chance(self, questions: list[Any]) -> float | None:
        """The mean of 1 / choices over the questions (None with no questions)."""
        if not questions:
            return None
        return sum(1.0 / len(q.choices) for q in questions) / len(questions)


class OpenTask(Task):
    """Open-domain tasks: StringEM (ActiveRAG's accuracy, the main metric) and exact match."""

    metrics = METRICS["open"]
    open_domain = True

    def unlabeled(self, question: OpenQuestion) -> OpenQuestion:
        return question if not question.answers else dataclasses.replace(question, answers=[])

    @staticmethod
    def _match(text: str, gold: list[str]) -> dict[str, bool | None]:
        if not gold:
            return {"string_em": None, "exact_match": None}
        return {"string_em": string_em(text, gold), "exact_match": exact_match(text, gold)}

    def process_results(self, question: OpenQuestion, prediction: Any) -> dict[str, float | None]:
        text = prediction["answer_text"] if isinstance(prediction, dict) else prediction.answer_text
        return {k: None if v is None else float(v) for k, v in self._match(text, list(question.answers)).items()}

    def record_prediction(self, question: OpenQuestion, prediction: Any) -> dict[str, Any]:
        d = _as_dict(prediction)
        gold = list(question.answers)
        d.update({"answers": gold, **self._match(d["answer_text"], gold)})
        agents = (d.get("meta") or {}).get("agents")
        if isinstance(agents, dict):  # ActiveRAG agent="all": each agent's answer scored too
            for a in agents.values():
                a.update(self._match(a["answer_text"], gold))
        return d

    def check_prediction(self, question: OpenQuestion, prediction: dict[str, Any], *, scores: bool = False) -> None:
        """A text answer, the question's gold aliases beside it and their
        matches (each agent's too) what the text scores against them."""
        if not isinstance(prediction.get("answer_text"), str):
            raise RecordError(f"prediction.answer_text {str(prediction.get('answer_text'))[:80]}: expected a string")
        gold = list(question.answers)
        if prediction.get("answers") != gold:
            raise RecordError(f"prediction.answers {str(prediction.get('answers'))[:80]}: the task's gold is now "
                              f"{str(gold)[:80]} (its data changed)")
        agents = (prediction.get("meta") or {}).get("agents") if isinstance(prediction.get("meta"), dict) else None
        for who, d in [("", prediction)] + [(f"meta.agents.{k}.", v) for k, v in (
                agents.items() if isinstance(agents, dict) else ())]:
            if not isinstance(d, dict) or not isinstance(d.get("answer_text"), str):
                raise RecordError(f"prediction.{who}answer_text: expected a string")
            want = self._match(d["answer_text"], gold)
            got = {k: d.get(k) for k in want}
            if got != want:
                raise RecordError(f"prediction.{who}{got} are not what the answer scores against the gold ({want})")

    def sample_fields(self, question: OpenQuestion, prediction: dict[str, Any]) -> dict[str, Any]:
        return {"target": list(question.answers), "prediction": prediction.get("answer_text"),
                "output": prediction.get("output")}


#: Task kind (a TaskSpec's ``kind``) -> its task class.
TASK_TYPES: dict[str, type[Task]] = {"multiple_choice": ChoiceTask, "yes_no": ChoiceTask, "open": OpenTask}


def make_task(spec: TaskSpec) -> Task:
    """The task object of a spec (by its ``kind``)."""
    try:
        return TASK_TYPES[spec.kind](spec)
    except KeyError:
        raise ValueError(f"kind: expected one of {sorted(TASK_TYPES)}, got {spec.kind!r}") from None


def task_for_question(question: Any) -> Task:
    """The scoring of a question given without a task (an OpenQuestion is
    open-domain, anything else multiple choice)."""
    return OpenTask() if isinstance(question, OpenQuestion) else ChoiceTask()


def score(question: Any, prediction: Any) -> dict[str, float | None]:
    """:meth:`Task.process_results` of a pipeline's prediction for one of the
    user's own questions (gold included): ``{"acc": ...}`` or
    ``{"string_em": ..., "exact_match": ...}``."""
    return task_for_question(question).process_results(question, prediction)


def scored(question: Any, prediction: Any) -> Any:
    """:meth:`Task.scored` for one of the user's own questions: the
    prediction with the gold (``answer`` / ``answers``) and, open domain,
    ``string_em`` / ``exact_match`` filled in."""
    return task_for_question(question).scored(question, prediction)


__all__ = ["Task", "ChoiceTask", "upgrade_record", "OpenTask", "RecordError", "ARGMAX_TOLERANCE", "TASK_TYPES", "make_task",
           "task_for_question", "score", "scored", "mean_stderr"]
