"""The results table's rows and the notes under it, shared by the markdown
report (:func:`rcn_fast.eval.report.results.markdown_table`) and the
results page (:mod:`rcn_fast.eval.report.page`)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

#: The table's columns.
TABLE_HEAD = ("Tasks", "Pipeline", "Metric", "Value", "Stderr", "Calls/q", "Tokens/q", "Q/s")


def fmt(v: Any, nd: int = 4) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    return f"{v:.{nd}f}"


def table_rows(results: dict[str, Any]) -> list[list[str]]:
    """One row of :data:`TABLE_HEAD` cells per task x pipeline x metric;
    with several seeds the Value cell reads ``mean ± std (k seeds)``."""
    rows = []
    for task, by_pipe in results["results"].items():
        for pipe, r in by_pipe.items():
            for m in results["configs"][task]["metrics"]:
                val = fmt(r.get(m))
                if len(r["seeds"]) > 1 and r.get(m) is not None:
                    val = f"{val} ± {fmt(r.get(f'{m}_std'))} ({len(r['seeds'])} seeds)"
                rows.append([task, pipe, m, val, f"± {fmt(r.get(f'{m}_stderr'))}", fmt(r['llm_calls_per_q'], 2),
                             fmt(r['tokens_per_q'], 1), fmt(r.get('questions_per_s'), 2)])
    return rows


def table_notes(results: dict[str, Any]) -> list[str]:
    """The notes under the table: :func:`settings_notes`, failed and unscored questions."""
    notes = settings_notes(results)
    for task, by_pipe in results["results"].items():
        for pipe, r in by_pipe.items():
            if r["n_failed"]:
                notes.append(f"{task} / {pipe}: {r['n_failed']} question(s) failed (see \"failures\" in the JSON; "
                             f"rerun the same command to retry them)")
            if r["n_unlabeled"]:
                notes.append(f"{task} / {pipe}: {r['n_unlabeled']} question(s) have no gold answer (not scored)")
    return notes


def settings_notes(results: dict[str, Any]) -> list[str]:
    """What a reader of the table must know about how it was made: the
    model's own name and quantisation, and each setting a task file gives a
    pipeline in place of its default (the demo's reduced ReConnect), with the
    value the run used and the default it replaced."""
    from rcn_fast.eval.pipeline_needs import pipeline_config_class

    notes = []
    model = results.get("model", {})
    if model.get("name") and model.get("name") != model.get("spec"):
        quant = f", {model['quantisation']}" if model.get("quantisation") else ""
        notes.append(f"model: {model['name']}{quant} ({model['spec']})")
    for task, conf in results["configs"].items():
        for pipe, args in (conf.get("pipeline_args") or {}).items():
            used = results.get("pipelines", {}).get(task, {}).get(pipe, {}).get("config")
            if pipe not in results["results"].get(task, {}) or not isinstance(used, dict):
                continue
            try:
                defaults = pipeline_config_class(pipe)()
            except Exception:  # noqa: BLE001 - a pipeline whose config needs arguments: values only
                defaults = None
            shown = []
            for key in args:
                value = used.get(key, args[key])
                value = Path(value).name if key == "prompts" and isinstance(value, str) else value
                default = getattr(defaults, key, None) if defaults is not None else None
                shown.append(f"{key}={value}" + (f" (default {default})" if default is not None else ""))
            notes.append(f"{task} / {pipe}: the task file's settings in place of the defaults: "
                         f"{', '.join(shown)} (--pipeline-args overrides them)")
    return notes


__all__ = ["TABLE_HEAD", "fmt", "table_rows", "table_notes", "settings_notes"]
