"""A table of the ReConnect paper filled with measured numbers, the paper's beside each.

Rows are the paper's methods, columns its tasks (or averages, or costs), in
the paper's order. Each cell holds the measured value, the paper's value and
their difference, or the reason it has no measured value (a method rcn_fast
does not implement, a missing corpus or KB, a task that did not load, every
question failed). Written as Markdown, JSON and one figure (each column of
the table on its own axis, measured beside the paper), with the questions
per task, the settings that explain a difference from the paper (model,
``--limit``, seeds, ``max_new_tokens`` ...) and a link from each row to its
``results_*.json``.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rcn_fast.paper.presets import Preset, column_tasks
from rcn_fast.pipelines.config import PipelineConfig
from rcn_fast.pipelines.reconnect_settings import PRESETS

REPORT_FORMAT = "rcn_fast.paper.report/1"
#: Every pipeline's generation cap unless set (:class:`rcn_fast.pipelines.config.PipelineConfig`).
DEFAULT_MAX_NEW_TOKENS = PipelineConfig.max_new_tokens
#: The authors' released code's cap (ReConnect's ``"reference"`` preset).
REFERENCE_MAX_NEW_TOKENS = PRESETS["reference"]["max_new_tokens"]


@dataclass
class Cell:
    """One cell: measured (percent accuracy, or a cost), the paper's value, or why it is empty."""

    paper: float | None
    measured: float | None = None
    reason: str | None = None
    n: int | None = None  # questions behind the measured value (summed over the cell's tasks)

    @property
    def diff(self) -> float | None:
        if self.measured is None or self.paper is None:
            return None
        return self.measured - self.paper

    def to_dict(self) -> dict[str, Any]:
        return {"measured": self.measured, "paper": self.paper, "diff": self.diff, "reason": self.reason, "n": self.n}


@dataclass
class PaperReport:
    """The filled table of one preset, with what a reader needs to judge it.

    Attributes
    ----------
    cells : {row: {column: Cell}}
    model : str
        The ``--model`` spec.
    seeds : list of int
    notes : list of str
    settings : dict
        What the run was given (:func:`rcn_fast.paper.run.run_preset`):
        ``model`` / ``encoder`` (:func:`rcn_fast.model_files.describe_model`:
        the model's own name), ``corpus``, ``limit``, ``seeds``,
        ``pipeline_args``, ``batch_size``, ``device`` ...
    tasks : {task: {"questions", "paper_questions", "split", "source"}}
        Questions evaluated per task (after ``--limit``), the paper's set
        size, the split and where they were read from.
    runs : {row: {"run", "pipeline", "results", "config"}}
        Each run row's pipeline and settings, the ``results_*.json`` files
        it wrote (in the report's folder) and its pipeline config.
    """

    preset: Preset
    cells: dict[str, dict[str, Cell]]
    model: str
    seeds: list[int]
    notes: list[str] = field(default_factory=list)
    settings: dict[str, Any] = field(default_factory=dict)
    tasks: dict[str, dict[str, Any]] = field(default_factory=dict)
    runs: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def model_name(self) -> str:
        """The model's own name (``SmolLM2-135M-Instruct``), else its spec."""
        return str((self.settings.get("model") or {}).get("name") or self.model)

    @property
    def measured_any(self) -> bool:
        """Whether some cell has a measured value."""
        return any(c.measured is not None for row in self.cells.values() for c in row.values())

    # -------------------------------------------------------------- outputs
    def to_dict(self) -> dict[str, Any]:
        p = self.preset
        return {"format": REPORT_FORMAT, "table": p.name, "title": p.title, "paper_model": p.model,
                "model": self.model, "model_name": self.model_name, "seeds": self.seeds, "kind": p.kind,
                "columns": list(p.columns), "settings": self.settings, "tasks": self.tasks,
                "differences": self.differences(),
                "rows": [{"method": r, "cells": {c: self.cells[r][c].to_dict() for c in p.columns},
                          **({"run": self.runs[r]} if r in self.runs else {})} for r in p.rows],
                "notes": self.notes}

    def differences(self) -> list[str]:
        """The settings of this run that explain a difference from the paper, in words."""
        s, p = self.settings, self.preset
        out = []
        model = s.get("model") or {}
        out.append(f"model: {self.model_name} (`{model.get('spec', self.model)}`), the paper's {p.model}")
        enc = (s.get("encoder") or {}).get("name")
        if enc:
            out.append(f"retrieval encoder: {enc}" + (f"; corpus: {s['corpus']}" if s.get("corpus") else "")
                       + (f"; stores: {s['paper_corpus']}" if s.get("paper_corpus") else ""))
        counts = [i.get("questions") for i in self.tasks.values() if i.get("questions") is not None]
        if s.get("limit") is not None:
            lo, hi = min(counts, default=0), max(counts, default=0)
            out.append(f"--limit {s['limit']}: {lo if lo == hi else f'{lo}-{hi}'} questions per task "
                       "(the paper: each task's whole set; see Tasks)")
        if list(self.seeds) != [0, 1, 2]:
            out.append(f"seeds {self.seeds} (the paper averages three seeds, App. A.1)")
        tokens = sorted({int(r["config"]["max_new_tokens"]) for r in self.runs.values()
                         if isinstance(r.get("config"), dict) and r["config"].get("max_new_tokens") is not None})
        if tokens and (p.kind == "cost" or tokens != [DEFAULT_MAX_NEW_TOKENS]):
            cap = f"max_new_tokens {', '.join(map(str, tokens))}"
            why = f" (rcn_fast's default {DEFAULT_MAX_NEW_TOKENS}, the reference code's {REFERENCE_MAX_NEW_TOKENS})"
            if p.kind == "cost":
                why += ": every generation stops there, so #Tokens counts at most that many per generation"
            out.append(cap + why)
        given = s.get("pipeline_args") or {}
        if given:
            out.append("pipeline settings given: " + ", ".join(f"{k}={v}" for k, v in given.items()))
        if s.get("model_args"):
            out.append("model settings: " + ", ".join(f"{k}={v}" for k, v in s["model_args"].items()))
        return out

    def markdown(self) -> str:
        p = self.preset
        unit = "" if p.kind == "cost" else " (accuracy, %)"
        model = (self.settings.get("model") or {}).get("spec", self.model)
        lines = [f"## {p.name.capitalize()}: {p.title}{unit}", "",
                 f"Measured with {self.model_name} (`{model}`; the paper: {p.model}), seeds {self.seeds}"
                 + (f", --limit {self.settings['limit']}" if self.settings.get("limit") is not None else "")
                 + "; each cell is measured / paper (difference); a row links to its results file.", ""]
        lines.append("| Method | " + " | ".join(p.columns) + " |")
        lines.append("|---|" + "---|" * len(p.columns))
        reasons: dict[str, int] = {}
        for row in p.rows:
            out = []
            for col in p.columns:
                c = self.cells[row][col]
                if c.measured is None:
                    idx = reasons.setdefault(c.reason or "not run", len(reasons) + 1)
                    out.append(f"– / {_fmt(c.paper)} [{idx}]")
                else:
                    out.append(f"{_fmt(c.measured)} / {_fmt(c.paper)} ({_signed(c.diff)})")
            files = (self.runs.get(row) or {}).get("results") or []
            label = f"[{row}]({files[0]})" if files else row
            lines.append(f"| {label} | " + " | ".join(out) + " |")
        if reasons:
            lines += ["", "Cells without a measured value:"]
            lines += [f"[{i}] {why}" for why, i in reasons.items()]
        if self.tasks:
            lines += ["", "Tasks (questions evaluated per seed, of the paper's set):", "",
                      "| Task | Questions | Paper's set | Split | Source |", "|---|---:|---:|---|---|"]
            for t, i in self.tasks.items():
                n = "–" if i.get("questions") is None else str(i["questions"])
                total = "–" if i.get("paper_questions") is None else str(i["paper_questions"])
                lines.append(f"| {t} | {n} | {total} | {i.get('split') or '–'} | {i.get('source') or '–'} |")
        if self.runs:
            lines += ["", "Runs (each row's pipeline and settings, and its results files):", ""]
            for row, r in self.runs.items():
                cfg = r.get("config") or {}
                keys = ("max_new_tokens", "top_n", "num_subsets", "subset_size", "sampling", "ablation", "preset")
                shown = ", ".join(f"{k}={cfg[k]}" for k in keys if cfg.get(k) is not None)
                links = ", ".join(f"[{f}]({f})" for f in r.get("results") or []) or "–"
                lines.append(f"- {row}: `{r.get('run')}`" + (f" ({shown})" if shown else "") + f"; {links}")
        diffs = self.differences()
        if diffs:
            lines += ["", "Settings that explain a difference from the paper:", ""] + [f"- {d}" for d in diffs]
        if p.note or self.notes:
            lines += [""] + [f"Note: {n}" for n in ([p.note] if p.note else []) + self.notes]
        return "\n".join(lines) + "\n"

    def draw(self) -> Any:
        """The figure (matplotlib): one axis per column of the table, each
        row's measured value beside the paper's (horizontal bars; a row
        without a measured value says why in short). Close it with
        ``matplotlib.pyplot.close``."""
        import matplotlib.pyplot as plt

        p = self.preset
        cols = list(p.columns)
        ncol = min(len(cols), 3)
        nrow = -(-len(cols) // ncol)
        height = max(2.5, 0.32 * len(p.rows) + 1.2)
        fig, axes = plt.subplots(nrow, ncol, figsize=(4.6 * ncol, height * nrow), squeeze=False)
        ys = list(range(len(p.rows)))
        what = "" if p.kind == "cost" else " (accuracy, %)"
        for k, col in enumerate(cols):
            ax = axes[k // ncol][k % ncol]
            paper = [self.cells[r][col].paper for r in p.rows]
            got = [self.cells[r][col].measured for r in p.rows]
            ax.barh([y + 0.2 for y in ys], [v or 0.0 for v in paper], height=0.38, color="#bbbbbb",
                    label=f"paper ({p.model})", gid="paper")
            ax.barh([y - 0.2 for y in ys], [v if v is not None else 0.0 for v in got], height=0.38,
                    color="#1f77b4", label=f"measured ({self.model_name})", gid="measured")
            top = max([v for v in paper + got if v is not None] or [1.0])
            for y, v, pv in zip(ys, got, paper):
                if v is None:
                    ax.text(0, y - 0.2, " not measured", va="center", ha="left", fontsize=6, color="#b00020",
                            gid="missing")
                else:
                    ax.text(v + 0.01 * top, y - 0.2, _fmt(v), va="center", fontsize=6, gid="value")
                if pv is not None:
                    ax.text(pv + 0.01 * top, y + 0.2, _fmt(pv), va="center", fontsize=6, color="#555555",
                            gid="paper_value")
            ax.set_yticks(ys)
            ax.set_yticklabels(p.rows if k % ncol == 0 else [""] * len(ys), fontsize=7)
            ax.invert_yaxis()
            ax.set_xlim(0, top * 1.18)
            ax.set_title(f"{col}{what}", fontsize=9)
            ax.tick_params(axis="x", labelsize=7)
            ax.grid(axis="x", alpha=0.3)
        for k in range(len(cols), nrow * ncol):
            axes[k // ncol][k % ncol].set_visible(False)
        handles, names = axes[0][0].get_legend_handles_labels()
        fig.legend(handles, names, fontsize=8, loc="lower center", ncol=2, frameon=False)
        fig.suptitle(f"{p.name}: {p.title} -- measured vs paper (seeds {self.seeds})", fontsize=10)
        fig.tight_layout(rect=(0, 0.07 / nrow, 1, 1))
        return fig

    def figure(self, path: str | Path) -> Path | None:
        """Write :meth:`draw` as a PNG; None without matplotlib."""
        try:
            import matplotlib

            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except ImportError:
            return None
        fig = self.draw()
        path = Path(path)
        fig.savefig(path, dpi=110)
        plt.close(fig)
        return path

    def write(self, folder: str | Path) -> dict[str, str]:
        """``paper_<table>.md``, ``.json`` and ``.png`` in ``folder``; returns their paths."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        base = folder / f"paper_{self.preset.name}"
        md, js = base.with_suffix(".md"), base.with_suffix(".json")
        md.write_text(self.markdown(), encoding="utf-8")
        js.write_text(json.dumps(self.to_dict(), indent=1, default=str), encoding="utf-8")
        out = {"markdown": str(md), "json": str(js)}
        png = self.figure(base.with_suffix(".png"))
        if png is not None:
            out["figure"] = str(png)
        return out


def _fmt(v: float | None) -> str:
    return "–" if v is None else f"{v:.1f}"


def _signed(v: float | None) -> str:
    return "–" if v is None else f"{v:+.1f}"


def fill_cells(preset: Preset, measured: dict[str, dict[str, dict[str, Any]]],
               row_reasons: dict[str, str], task_reasons: dict[str, str]) -> dict[str, dict[str, Cell]]:
    """The cells of ``preset`` from per-row, per-task results.

    Parameters
    ----------
    measured : {row: {task: result}}
        ``result`` is the eval's results entry of that task and pipeline
        (``acc`` in [0, 1], ``n``, ``llm_calls_per_q``, ``generated_tokens_per_q``).
    row_reasons : {row: why the row was not run}
    task_reasons : {task: why the task could not be evaluated}
    """
    cells: dict[str, dict[str, Cell]] = {}
    for i, row in enumerate(preset.rows):
        cells[row] = {}
        for j, col in enumerate(preset.columns):
            paper = preset.paper[row][j]
            if row in row_reasons:
                cells[row][col] = Cell(paper, reason=row_reasons[row])
                continue
            tasks = column_tasks(preset, col)
            missing = [t for t in tasks if t in task_reasons]
            if missing:
                cells[row][col] = Cell(paper, reason="; ".join(f"{t}: {task_reasons[t]}" for t in missing))
                continue
            results = [measured.get(row, {}).get(t) for t in tasks]
            failed = [t for t, r in zip(tasks, results) if r is None or _value(preset, col, r) is None]
            if failed:
                cells[row][col] = Cell(paper, reason=f"no result (every question failed or none ran) on "
                                                     f"{', '.join(failed)}")
                continue
            vals = [_value(preset, col, r) for r in results]
            cells[row][col] = Cell(paper, measured=sum(vals) / len(vals), n=sum(int(r.get("n") or 0) for r in results))
    return cells


def _value(preset: Preset, column: str, result: dict[str, Any]) -> float | None:
    if preset.kind == "cost":
        key = "llm_calls_per_q" if "calls" in column.lower() else "generated_tokens_per_q"
        v = result.get(key)
    else:
        v = result.get("acc")
        v = None if v is None else 100.0 * v
    return None if v is None or (isinstance(v, float) and math.isnan(v)) else float(v)
