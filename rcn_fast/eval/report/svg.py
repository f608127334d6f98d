"""The results page's charts as inline SVG, drawn here (no library, no
network): the results chart (the PNG's grouped bars, error bars, chance
lines and values; :mod:`rcn_fast.eval.report.plot` gives the numbers and
the title lines) and each task's predicted-label histogram beside gold's.

Every mark carries what it shows in ``data-`` attributes (task, pipeline,
value; label, series, count), so a test reads the numbers back from the DOM.
"""

from __future__ import annotations

import math
from html import escape
from typing import Any

from rcn_fast.eval.report.plot import PALETTE, bar_data, plot_labels

GOLD_COLOUR = "#444444"
_FONT = 'font-family="system-ui, sans-serif"'


def _a(v: Any) -> str:
    return escape(str(v), quote=True)


def _text(x: float, y: float, s: str, *, size: int = 11, anchor: str = "middle", cls: str = "",
          extra: str = "") -> str:
    c = f' class="{cls}"' if cls else ""
    return (f'<text x="{x:.1f}" y="{y:.1f}" font-size="{size}" text-anchor="{anchor}"{c} {extra}>'
            f"{escape(s)}</text>")


def results_chart(results: dict[str, Any]) -> str:
    """The results chart as one ``<svg id="chart">`` element.

    Bars: ``rect.bar`` with ``data-task``, ``data-pipeline``, ``data-value``;
    value labels ``text.value``; chance lines ``line.chance`` with
    ``data-task`` and ``data-value``; a pipeline without a value ``text.failed``.
    """
    tasks, pipelines, heights, errors = bar_data(results)
    n_p = max(len(pipelines), 1)
    group = max(70.0, 34.0 * n_p + 20)
    left, right, plot_h = 48.0, 16.0, 240.0
    width = max(640.0, left + right + group * max(len(tasks), 1))
    lab = plot_labels(results, width=int(width / 6.6))
    head = 18.0 * (2 + len(lab["model"]))
    top = head + 12
    legend_y = top + plot_h + 46
    names = [*pipelines, "chance (1 / choices)", lab["errors"]]
    height = legend_y + 22 * len(_legend_rows(names, left, width - right)) + 8
    y = (lambda v: top + plot_h * (1.0 - min(max(v, 0.0), 1.05) / 1.05))
    out = [f'<svg id="chart" xmlns="http://www.w3.org/2000/svg" width="{width:.0f}" height="{height:.0f}" '
           f'viewBox="0 0 {width:.0f} {height:.0f}" role="img" {_FONT}>']
    out.append(f"<title>{escape(lab['title'])}</title>")
    for i, line in enumerate([lab["title"], *lab["model"], lab["subtitle"]]):
        out.append(_text(width / 2, 18 + 18 * i, line, size=13 if i == 0 else 11, cls="chart-title"))
    for t in (0.0, 0.25, 0.5, 0.75, 1.0):
        out.append(f'<line x1="{left}" x2="{width - right}" y1="{y(t):.1f}" y2="{y(t):.1f}" stroke="#ddd"/>')
        out.append(_text(left - 6, y(t) + 4, f"{t:.2f}", size=10, anchor="end"))
    bw = (group - 20) / n_p
    for i, t in enumerate(tasks):
        x0 = left + group * i + 10
        for j, p in enumerate(pipelines):
            h, e = heights[p][i], errors[p][i]
            x = x0 + bw * j
            colour = PALETTE[j % len(PALETTE)]
            if math.isnan(h):
                out.append(_text(x + bw / 2, top + plot_h - 6, "failed", size=10, cls="failed",
                                 extra=f'fill="#b00020" data-task="{_a(t)}" data-pipeline="{_a(p)}"'))
                continue
            out.append(f'<rect class="bar" x="{x + 1:.1f}" y="{y(h):.1f}" width="{bw - 2:.1f}" '
                       f'height="{max(top + plot_h - y(h), 0.0):.1f}" fill="{colour}" data-task="{_a(t)}" '
                       f'data-pipeline="{_a(p)}" data-value="{h!r}"><title>{escape(f"{t} / {p}: {h:.4f}")}'
                       f"</title></rect>")
            if e and e == e:
                cx = x + bw / 2
                out.append(f'<line class="err" x1="{cx:.1f}" x2="{cx:.1f}" y1="{y(h + e):.1f}" y2="{y(h - e):.1f}" '
                           'stroke="#333"/>')
            out.append(_text(x + bw / 2, y(h + (e if e == e else 0.0)) - 4, f"{h:.2f}", size=10, cls="value",
                             extra=f'data-task="{_a(t)}" data-pipeline="{_a(p)}"'))
        c = lab["chance"].get(t)
        if c is not None:
            out.append(f'<line class="chance" x1="{x0 - 4:.1f}" x2="{x0 + group - 16:.1f}" y1="{y(c):.1f}" '
                       f'y2="{y(c):.1f}" stroke="#555" stroke-dasharray="5 4" data-task="{_a(t)}" '
                       f'data-value="{c!r}"/>')
        for k, part in enumerate(lab["ticks"][i].split("\n")):
            out.append(_text(x0 + (group - 20) / 2, top + plot_h + 16 + 13 * k, part, size=11))
    out.append(f'<line x1="{left}" x2="{width - right}" y1="{top + plot_h}" y2="{top + plot_h}" stroke="#333"/>')
    if lab["all_failed"]:
        out.append(_text(width / 2, top + plot_h / 2, "failed: no question could be scored", size=14,
                         cls="all-failed", extra='fill="#b00020"'))
    items = [(p, PALETTE[j % len(PALETTE)], "rect") for j, p in enumerate(pipelines)]
    if any(c is not None for c in lab["chance"].values()):
        items.append(("chance (1 / choices)", "#555", "dash"))
    items.append((lab["errors"], "#333", "bar"))
    where = {name: (lx, legend_y + 22 * r) for r, row in enumerate(_legend_rows([i[0] for i in items], left,
                                                                                 width - right)) for name, lx in row}
    for name, colour, kind in items:
        lx, ly = where[name]
        mark = (f'<rect x="{lx:.1f}" y="{ly - 9:.1f}" width="12" height="12" fill="{colour}"/>' if kind == "rect" else
                f'<line x1="{lx:.1f}" x2="{lx + 14:.1f}" y1="{ly - 3:.1f}" y2="{ly - 3:.1f}" stroke="{colour}" '
                f'stroke-dasharray="5 3"/>' if kind == "dash" else
                f'<line x1="{lx + 6:.1f}" x2="{lx + 6:.1f}" y1="{ly - 10:.1f}" y2="{ly + 2:.1f}" stroke="{colour}"/>')
        out.append(mark + _text(lx + 18, ly + 1, name, size=11, anchor="start", cls="legend"))
    out.append("</svg>")
    return "".join(out)


def _legend_rows(names: list[str], left: float, right: float) -> list[list[tuple[str, float]]]:
    """Legend entries laid out in rows between ``left`` and ``right``: ``[[(name, x), ...], ...]``
    (about 6.5 pixels a character at 11 points, a swatch and a gap each)."""
    rows: list[list[tuple[str, float]]] = [[]]
    x = left
    for name in names:
        w = 15 + 6.5 * len(name) + 18
        if rows[-1] and x + w > right:
            rows.append([])
            x = left
        rows[-1].append((name, x))
        x += w
    return rows


def histogram_chart(task: str, diag: dict[str, Any]) -> str:
    """A task's predicted-label histogram beside gold's: per label, one bar
    of gold and one per pipeline, heights as shares of their predictions
    (``rect.hbar`` with ``data-label``, ``data-series``, ``data-count``)."""
    labels = diag["labels"]
    series = ([("gold", GOLD_COLOUR, diag["gold"])] if sum(diag["gold"].values()) else []) + [
        (p, PALETTE[j % len(PALETTE)], d.get("histogram", {})) for j, (p, d) in enumerate(diag["pipelines"].items())]
    if not labels or not series:
        return ""
    n_s = len(series)
    group = max(48.0, 16.0 * n_s + 16)
    left, top, plot_h = 40.0, 12.0, 150.0
    width = max(420.0, left + 16 + group * len(labels))
    legend = _legend_rows([name for name, _, _ in series], left, width - 8)
    height = top + plot_h + 34 + 20 * len(legend)
    y = (lambda share: top + plot_h * (1.0 - share))
    out = [f'<svg class="histogram" data-task="{_a(task)}" xmlns="http://www.w3.org/2000/svg" width="{width:.0f}" '
           f'height="{height:.0f}" viewBox="0 0 {width:.0f} {height:.0f}" role="img" {_FONT}>',
           f"<title>{escape(f'{task}: predicted labels beside gold (share of predictions)')}</title>"]
    for t in (0.0, 0.5, 1.0):
        out.append(f'<line x1="{left}" x2="{width - 8}" y1="{y(t):.1f}" y2="{y(t):.1f}" stroke="#ddd"/>')
        out.append(_text(left - 5, y(t) + 4, f"{t:.0%}", size=10, anchor="end"))
    bw = (group - 12) / n_s
    for i, lab in enumerate(labels):
        x0 = left + group * i + 6
        for j, (name, colour, hist) in enumerate(series):
            total = sum(hist.values())
            c = int(hist.get(lab, 0))
            share = c / total if total else 0.0
            out.append(f'<rect class="hbar" x="{x0 + bw * j:.1f}" y="{y(share):.1f}" width="{max(bw - 1, 1):.1f}" '
                       f'height="{plot_h * share:.1f}" fill="{colour}" data-label="{_a(lab)}" '
                       f'data-series="{_a(name)}" data-count="{c}"><title>{escape(f"{name}: {lab} {c} of {total}")}'
                       "</title></rect>")
        out.append(_text(x0 + (group - 12) / 2, top + plot_h + 15, lab, size=12))
    colours = {name: colour for name, colour, _ in series}
    for r, row in enumerate(legend):
        ly = top + plot_h + 38 + 20 * r
        for name, lx in row:
            out.append(f'<rect x="{lx:.1f}" y="{ly - 9:.1f}" width="11" height="11" fill="{colours[name]}"/>'
                       + _text(lx + 15, ly + 1, name, size=11, anchor="start"))
    out.append("</svg>")
    return "".join(out)


__all__ = ["results_chart", "histogram_chart", "GOLD_COLOUR"]
