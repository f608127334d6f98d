"""A table of the ReConnect paper filled with measured numbers, the paper's beside each.

Rows are the paper's methods, columns its tasks (or averages, or costs), in
the paper's order. Each cell holds the measured value, the paper's value and
their difference, or the reason it has no measured value (a method rcn_fast
does not implement, a missing corpus or KB, a task that did not load, every
question failed). Written as Markdown, JSON and one figure (measured against
the paper per cell).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rcn_fast.paper.presets import Preset, column_tasks

REPORT_FORMAT = "rcn_fast.paper.report/1"


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
    """The filled table of one preset."""

    preset: Preset
    cells: dict[str, dict[str, Cell]]
    model: str
    seeds: list[int]
    notes: list[str] = field(default_factory=list)

    # -------------------------------------------------------------- outputs
    def to_dict(self) -> dict[str, Any]:
        p = self.preset
        return {"format": REPORT_FORMAT, "table": p.name, "title": p.title, "paper_model": p.model,
                "model": self.model, "seeds": self.seeds, "kind": p.kind, "columns": list(p.columns),
                "rows": [{"method": r, "cells": {c: self.cells[r][c].to_dict() for c in p.columns}} for r in p.rows],
                "notes": self.notes}

    def markdown(self) -> str:
        p = self.preset
        unit = "" if p.kind == "cost" else " (accuracy, %)"
        lines = [f"## {p.name.capitalize()}: {p.title}{unit}", "",
                 f"Measured with `{self.model}` (the paper: {p.model}), seeds {self.seeds}; each cell is "
                 "measured / paper (difference).", ""]
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
            lines.append(f"| {row} | " + " | ".join(out) + " |")
        if reasons:
            lines += ["", "Cells without a measured value:"]
            lines += [f"[{i}] {why}" for why, i in reasons.items()]
        if p.note or self.notes:
            lines += [""] + [f"Note: {n}" for n in ([p.note] if p.note else []) + self.notes]
        return "\n".join(lines) + "\n"

    def figure(self, path: str | Path) -> Path | None:
        """Measured against the paper, one point per cell with both values; None without matplotlib."""
        try:
            import matplotlib

            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except ImportError:
            return None
        pts = [(self.cells[r][c].paper, self.cells[r][c].measured, r) for r in self.preset.rows
               for c in self.preset.columns if self.cells[r][c].measured is not None and self.cells[r][c].paper is not None]
        fig, ax = plt.subplots(figsize=(6, 6))
        if pts:
            lo = min(min(a, b) for a, b, _ in pts)
            hi = max(max(a, b) for a, b, _ in pts)
            pad = max(1.0, 0.05 * (hi - lo))
            ax.plot([lo - pad, hi + pad], [lo - pad, hi + pad], "--", color="grey", label="measured = paper")
            for row in dict.fromkeys(r for _, _, r in pts):
                xs = [a for a, _, r in pts if r == row]
                ys = [b for _, b, r in pts if r == row]
                ax.scatter(xs, ys, label=row, s=30)
            ax.legend(fontsize=7, loc="best")
        else:
            ax.text(0.5, 0.5, "no cell has a measured value", ha="center", va="center", transform=ax.transAxes)
        what = "cost" if self.preset.kind == "cost" else "accuracy (%)"
        ax.set_xlabel(f"paper ({self.preset.model}) {what}")
        ax.set_ylabel(f"measured ({self.model}) {what}")
        ax.set_title(f"{self.preset.name}: measured vs paper (seeds {self.seeds})", fontsize=10)
        path = Path(path)
        fig.tight_layout()
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
        js.write_text(json.dumps(self.to_dict(), indent=1), encoding="utf-8")
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
