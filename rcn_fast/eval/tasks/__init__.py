"""Evaluation tasks: what a task is, where its questions come from, and the
packaged task files.

* :mod:`~rcn_fast.eval.tasks.spec` -- :class:`TaskSpec` (a task's plain
  data, recorded in every results file) and the keys derived from it;
* :mod:`~rcn_fast.eval.tasks.catalog` -- the YAML task files (the packaged
  ``*.yaml`` beside this module, and ``--include_path`` folders) and the
  resolution of a command-line task argument;
* :mod:`~rcn_fast.eval.tasks.loading` -- reading a task's questions;
* :mod:`~rcn_fast.eval.tasks.sources` -- where the rows come from (a file,
  a folder, the hub) and whether the hub can be reached;
* :mod:`~rcn_fast.eval.tasks.lm_eval` -- task YAMLs in
  lm-evaluation-harness's own format;
* :mod:`~rcn_fast.eval.tasks.limits` -- what one task file may cost (YAML
  alias and Jinja budgets).

Scoring the predictions is :mod:`rcn_fast.eval.metrics`.
"""

from __future__ import annotations

from rcn_fast._lazy import lazy_exports

_EXPORTS = {
    **dict.fromkeys(("TaskSpec", "TaskError", "TaskCountWarning", "task_corpus", "spec_key", "normalize_name",
                     "PACKAGE_DIR", "TASKS_DIR", "PARQUET_REVISION", "KINDS"), "rcn_fast.eval.tasks.spec"),
    **dict.fromkeys(("hub_load_args", "check_limit"), "rcn_fast.eval.tasks.sources"),
    **dict.fromkeys(("load_task_questions", "split_inline_choices"), "rcn_fast.eval.tasks.loading"),
    **dict.fromkeys(("available_tasks", "registry", "get_task", "resolve_task", "spec_from_dict"),
                    "rcn_fast.eval.tasks.catalog"),
}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
__all__ = list(_EXPORTS)
