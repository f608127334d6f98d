"""Evaluation: tasks x pipelines -> accuracy, cost and speed reports.

* ``python -m rcn_fast.eval`` -- the command (:mod:`rcn_fast.eval.cli`); with
  no arguments, the embedded offline demo.
* :func:`evaluate` -- the same from Python; accepts already-built models.
* :class:`EvalConfig` -- every setting of a run (YAML/JSON).
* Tasks: :func:`available_tasks`, :func:`get_task`, :func:`resolve_task`,
  :func:`load_task_questions` (YAML files in ``rcn_fast/eval/tasks/``); a
  task scores the predictions (:mod:`rcn_fast.eval.metrics`), pipelines
  never see the gold answers.
* :func:`evaluate` is plan (:mod:`rcn_fast.eval.run.plan`) -> executor
  (:mod:`rcn_fast.eval.run.executors`, :mod:`rcn_fast.eval.run.ray_executor`) ->
  reports.
* Reports: ``results_<timestamp>.json`` / ``.md`` / ``.png`` and
  ``samples_<task>_<pipeline>_<timestamp>.jsonl`` (:mod:`rcn_fast.eval.report.results`).

Examples
--------
>>> from rcn_fast.eval import EvalConfig, evaluate                    # doctest: +SKIP
>>> doc = evaluate(EvalConfig(tasks=["csqa"], pipelines=["vanilla", "reconnect"],
...                           corpus="corpus/", limit=100, seeds=[0, 1, 2]))
>>> doc["results"]["csqa"]["reconnect"]["acc"]
0.61
"""

from rcn_fast.eval.config import EvalConfig, EvalError, MODEL_PACKAGES_HINT
from rcn_fast.eval.run.runner import evaluate
from rcn_fast.eval.tasks.catalog import (
    TaskError,
    TaskSpec,
    available_tasks,
    get_task,
    load_task_questions,
    resolve_task,
)

__all__ = ["evaluate", "EvalConfig", "EvalError", "TaskSpec", "TaskError", "available_tasks", "get_task",
           "resolve_task", "load_task_questions", "MODEL_PACKAGES_HINT"]
