"""The bar chart of a results document (matplotlib, Agg backend: no display)."""

from __future__ import annotations

import io
import math
import os
from pathlib import Path
from typing import Any

#: Drawing order: the chance lines above the bars, the value labels (on a white box) above the lines.
CHANCE_ZORDER, VALUE_ZORDER = 2.5, 4.0
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


#: The most lines the model spec may take in a chart title; a longer spec gives way to the model's name.
MAX_SPEC_LINES = 3


def wrap_spec(text: str, width: int) -> list[str]:
    """``text`` (a model spec: a URL, a path, a hub id) in lines of at most
    ``width`` characters, broken after ``/``, ``#``, ``:``, ``,``, ``=``, ``-``
    or ``_`` where it can be (else anywhere): nothing is left out."""
    width = max(int(width), 8)
    parts, cur = [], ""
    for ch in text:
        cur += ch
        if ch in "/#:,=-_ ":
            parts.append(cur)
            cur = ""
    if cur:
        parts.append(cur)
    lines, line = [], ""
    for part in parts:
        while len(part) > width:  # a piece longer than a line: broken anywhere
            if line:
                lines.append(line)
                line = ""
            lines.append(part[:width])
            part = part[width:]
        if line and len(line) + len(part) > width:
            lines.append(line)
            line = ""
        line += part
    if line:
        lines.append(line)
    return lines


def model_caption(results: dict[str, Any], width: int = 70) -> list[str]:
    """The model line(s) of a chart title: ``model: <spec>`` wrapped at
    ``width`` (:func:`wrap_spec`, never cut), with its name when the spec
    does not hold it; a spec over :data:`MAX_SPEC_LINES` lines gives way to
    the name and "(full spec in the report)". No model: no line."""
    model = results.get("model") if isinstance(results.get("model"), dict) else {}
    spec, name = model.get("spec"), model.get("name")
    if not spec:
        return []
    spec = str(spec)
    named = f" ({name})" if name and str(name) not in spec else ""
    lines = wrap_spec(f"model: {spec}{named}", width)
    if len(lines) <= MAX_SPEC_LINES:
        return lines
    short = str(name) if name else spec[: width // 2] + " … " + spec[-(width // 2):]
    return wrap_spec(f"model: {short} (full spec in the report)", width)[:MAX_SPEC_LINES]


def plot_labels(results: dict[str, Any], width: int = 70) -> dict[str, Any]:
    """What the chart says besides its bars (``width``: the characters a title line may take).

    Returns
    -------
    dict
        ``title`` (the metric), ``model`` (the model's lines,
        :func:`model_caption`), ``subtitle`` (questions and seeds),
        ``ticks`` (task names with their question counts), ``chance``
        (``{task: chance level or None}``, from the results' ``chance``),
        ``errors`` (what the error bars are), ``failed`` (``{task:
        {pipeline: questions failed}}`` for pipelines with no value) and
        ``all_failed`` (no value to draw at all).
    """
    tasks, pipelines, heights, _ = bar_data(results)
    metrics = sorted({results["configs"][t]["metrics"][0] for t in tasks})
    seeds = sorted({len(r.get("seeds", [])) for t in tasks for r in results["results"][t].values()})
    n_q = [max((int(r.get("n_questions", 0)) for r in results["results"][t].values()), default=0) for t in tasks]
    n_word = f"n = {n_q[0]} questions" if len(set(n_q)) == 1 and n_q else "n = " + ", ".join(map(str, n_q))
    seed_word = f"{seeds[-1]} seeds" if seeds and seeds[-1] > 1 else "1 seed"
    failed = {t: {p: int(results["results"][t].get(p, {}).get("n_failed", 0)) for p in pipelines
                  if math.isnan(heights[p][i])} for i, t in enumerate(tasks)}
    return {
        "title": f"{' / '.join(metrics) or 'score'} by task and pipeline",
        "model": model_caption(results, width),
        "subtitle": f"{n_word} per task, {seed_word}",
        "ticks": [f"{t}\n(n={n})" for t, n in zip(tasks, n_q)],
        "chance": {t: (results.get("chance") or {}).get(t) for t in tasks},
        "errors": "error bars: std over seeds" if seeds and seeds[-1] > 1 else "error bars: standard error",
        "failed": failed,
        "all_failed": not tasks or all(math.isnan(h) for p in pipelines for h in heights[p]),
    }


def plot_results(results: dict[str, Any], path: str | os.PathLike[str]) -> Path:
    """Write a PNG: grouped bars of the main metric (accuracy, or StringEM
    for open-domain tasks) per task, one colour per pipeline.

    The title names the metric and the model (its whole spec, wrapped:
    :func:`model_caption`), the subtitle the questions
    per task and the seeds; a dashed line marks each task's chance level
    (1 / choices, when the results give it); every bar carries its value
    on a white label drawn over the chance line (a 0.0 bar is a marker on the axis), a pipeline with no value says
    "failed", and a run in which nothing could be scored says so across
    the plot. The legend explains the error bars.

    Parameters
    ----------
    results : dict
        A results document (:func:`rcn_fast.eval.report.results.write_reports`).
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

    from rcn_fast._files import write_atomic

    fig = draw_results(results)
    try:
        path = Path(path)
        buf = io.BytesIO()
        fig.savefig(buf, format="png")
        write_atomic(path.parent, path.name, buf.getvalue(), what="output-path")  # never through a planted link
    finally:
        plt.close(fig)
    return path


def draw_results(results: dict[str, Any]) -> Any:
    """The chart of :func:`plot_results` as a matplotlib Figure (not saved;
    close it with ``matplotlib.pyplot.close``)."""
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    tasks, pipelines, heights, errors = bar_data(results)
    n_p = max(len(pipelines), 1)
    width = 0.8 / n_p
    fig_w = max(5.0, 1.6 + 1.0 * len(tasks) * max(1.0, n_p / 3))
    lab = plot_labels(results, width=int(fig_w * 13))  # about 13 characters an inch at 9 points
    fig, ax = plt.subplots(figsize=(fig_w, 4.4 + 0.15 * len(lab["model"])), dpi=100)
    ax.set_title("\n".join([lab["title"], *lab["model"], lab["subtitle"]]), fontsize=9)
    handles: list[Any] = []
    value_size = 7 if len(tasks) * n_p <= 12 else 5
    for j, p in enumerate(pipelines):
        colour = PALETTE[j % len(PALETTE)]
        xs = [i - 0.4 + width * (j + 0.5) for i in range(len(tasks))]
        tops = [h + (e if e == e else 0.0) for h, e in zip(heights[p], errors[p])]  # value labels above the error bar
        handles.append(ax.bar(xs, heights[p], width=width * 0.95, yerr=errors[p], capsize=2, label=p, color=colour,
                              error_kw={"elinewidth": 0.8, "ecolor": "#333333"}))
        for x, h, top in zip(xs, heights[p], tops):
            if math.isnan(h):
                ax.text(x, 0.02, "failed", rotation=90, ha="center", va="bottom", fontsize=value_size,
                        color="#b00020", gid="failed")
                continue
            if h == 0.0:  # no bar to see: a marker on the axis in the pipeline's colour
                ax.plot([x], [0.0], marker="^", markersize=7, color=colour, markeredgecolor="#333333",
                        clip_on=False, zorder=5, gid="zero")
            # on an opaque label above the chance line: a value that sits on the line stays readable
            ax.text(x, top + 0.012, f"{h:.2f}", ha="center", va="bottom", fontsize=value_size, gid="value",
                    zorder=VALUE_ZORDER, bbox={"boxstyle": "square,pad=0.1", "facecolor": "white",
                                               "edgecolor": "none", "alpha": 0.9})
    for i, t in enumerate(tasks):
        c = lab["chance"].get(t)
        if c is not None:
            ax.hlines(c, i - 0.45, i + 0.45, colors="#555555", linestyles="dashed", linewidth=1.0, gid="chance",
                      zorder=CHANCE_ZORDER)
    if any(c is not None for c in lab["chance"].values()):
        handles.append(Line2D([], [], color="#555555", linestyle="dashed", linewidth=1.0,
                              label="chance (1 / choices)"))
    handles.append(Line2D([], [], color="#333333", marker="|", markersize=9, linestyle="None", label=lab["errors"]))
    if lab["all_failed"]:
        ax.text(0.5, 0.5, "failed: no question could be scored\n(see \"failures\" in the results JSON)",
                transform=ax.transAxes, ha="center", va="center", fontsize=11, color="#b00020", gid="all_failed")
    ax.set_xticks(range(len(tasks)))
    ax.set_xticklabels(lab["ticks"], rotation=20 if len(tasks) > 4 else 0, ha="right" if len(tasks) > 4 else "center",
                       fontsize=8)
    metric_names = sorted({results["configs"][t]["metrics"][0] for t in tasks})
    ax.set_ylabel(" / ".join(metric_names))
    ax.set_ylim(0, 1.08)
    ax.set_xlim(-0.6, max(len(tasks), 1) - 0.4)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(handles=handles, fontsize=7, ncol=min(len(handles), 3), loc="upper center",
              bbox_to_anchor=(0.5, -0.16 if len(tasks) <= 4 else -0.26), frameon=False)
    fig.tight_layout()
    return fig


__all__ = ["plot_results", "draw_results", "plot_labels", "bar_data", "model_caption", "wrap_spec", "PALETTE",
           "MAX_SPEC_LINES"]
