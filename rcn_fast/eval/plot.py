"""The bar chart of a results document (matplotlib, Agg backend: no display)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

#: Bar colours, one per pipeline in run order (matplotlib's tab10 palette).
PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22",
           "#17becf")


def bar_data(results: dict[str, Any]) -> tuple[list[str], list[str], dict[str, list[float]], dict[str, list[float]]]:
    """Tasks, pipelines, heights and error bars of the chart.

    Returns
    -------
    tasks : list of str
    pipelines : list of str
    heights : ``{pipeline: [main metric per task]}`` (NaN where missing)
    errors : ``{pipeline: [std over seeds, or stderr with one seed]}``
    """
    tasks = list(results["results"])
    pipelines: list[str] = []
    for t in tasks:
        for p in results["results"][t]:
            if p not in pipelines:
                pipelines.append(p)
    heights: dict[str, list[float]] = {p: [] for p in pipelines}
    errors: dict[str, list[float]] = {p: [] for p in pipelines}
    for t in tasks:
        m = results["configs"][t]["metrics"][0]
        for p in pipelines:
            r = results["results"][t].get(p, {})
            v = r.get(m)
            heights[p].append(float("nan") if v is None else float(v))
            e = r.get(f"{m}_std") if len(r.get("seeds", [])) > 1 else r.get(f"{m}_stderr")
            errors[p].append(0.0 if e is None else float(e))
    return tasks, pipelines, heights, errors


def plot_results(results: dict[str, Any], path: str | os.PathLike[str]) -> Path:
    """Write a PNG: grouped bars of the main metric (accuracy, or StringEM
    for open-domain tasks) per task, one colour per pipeline.

    Parameters
    ----------
    results : dict
        A results document (:func:`rcn_fast.eval.reports.write_reports`).
    path : str or path
        The ``.png`` to write.

    Returns
    -------
    Path
    """
    try:
        import matplotlib
    except ImportError as exc:
        raise ImportError('matplotlib is needed for the plot: pip install matplotlib (or "rcn_fast[eval]")') from exc
    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    tasks, pipelines, heights, errors = bar_data(results)
    n_p = max(len(pipelines), 1)
    width = 0.8 / n_p
    fig, ax = plt.subplots(figsize=(max(4.0, 1.2 + 0.9 * len(tasks) * max(1.0, n_p / 3)), 3.6), dpi=100)
    try:
        for j, p in enumerate(pipelines):
            xs = [i - 0.4 + width * (j + 0.5) for i in range(len(tasks))]
            ax.bar(xs, heights[p], width=width * 0.95, yerr=errors[p], capsize=2, label=p,
                   color=PALETTE[j % len(PALETTE)], error_kw={"elinewidth": 0.8, "ecolor": "#333333"})
        ax.set_xticks(range(len(tasks)))
        ax.set_xticklabels(tasks, rotation=20 if len(tasks) > 4 else 0, ha="right" if len(tasks) > 4 else "center")
        metric_names = sorted({results["configs"][t]["metrics"][0] for t in tasks})
        ax.set_ylabel(" / ".join(metric_names))
        ax.set_ylim(0, 1)
        ax.grid(axis="y", alpha=0.3)
        ax.legend(fontsize=8, ncol=min(n_p, 4), loc="upper center", bbox_to_anchor=(0.5, 1.18), frameon=False)
        fig.tight_layout()
        path = Path(path)
        tmp = path.with_name(f".{path.stem}.tmp.png")
        fig.savefig(tmp, format="png")
        os.replace(tmp, path)
    finally:
        plt.close(fig)
    return path


__all__ = ["plot_results", "bar_data", "PALETTE"]
