"""The results page: ``results_<timestamp>.html``, one self-contained file
written beside every report (no network, no CDN: inline CSS, inline SVG
and inline JavaScript; it opens from disk).

What is drawn here, as HTML (it shows without JavaScript): the run's
warnings, the results table and chart (:mod:`rcn_fast.eval.report.svg`),
the settings that tell two runs apart, and per task the predicted-label
histogram of each pipeline beside gold's, the majority-label baseline, the
share of generations stopped by the token limit per stage, accuracy over
permuted choices, and the failures.

What the script draws (``page.js``, from the blobs of
:mod:`rcn_fast.eval.report.page_data`): the questions, paged, with filters
(pipelines disagree; one pipeline right where another is wrong; any
pipeline wrong; all wrong; text search), each question's answers, gold and
per-choice probabilities side by side, and on demand each pipeline's whole
trace as its stages (known entry types drawn as such, any other entry or
field as key/value).
"""

from __future__ import annotations

import json
from html import escape
from importlib import resources
from typing import Any

from rcn_fast.eval.report.diagnostics import TaskRecords
from rcn_fast.eval.report.page_data import page_blobs
from rcn_fast.eval.report.table import TABLE_HEAD, table_notes, table_rows
from rcn_fast.eval.report.svg import histogram_chart, results_chart


def _asset(name: str) -> str:
    return resources.files("rcn_fast.eval.report").joinpath(name).read_text(encoding="utf-8")


def _e(v: Any) -> str:
    return escape("-" if v is None else str(v), quote=True)


def _num(v: Any, nd: int = 4) -> str:
    return "-" if v is None else f"{v:.{nd}f}"


def _table(head: list[str], rows: list[list[Any]], *, cls: str = "", tid: str = "") -> str:
    a = (f' class="{cls}"' if cls else "") + (f' id="{_e(tid)}"' if tid else "")
    h = "".join(f"<th>{_e(x)}</th>" for x in head)
    body = "".join("<tr>" + "".join(c if isinstance(c, _Raw) else f"<td>{_e(c)}</td>" for c in r) + "</tr>"
                   for r in rows)
    return f"<table{a}><thead><tr>{h}</tr></thead><tbody>{body}</tbody></table>"


class _Raw(str):
    """A cell already rendered as ``<td>...</td>``."""


def _td(shown: Any, **data: Any) -> _Raw:
    """A cell showing ``shown``, with ``data-<key>`` attributes (what a test reads back)."""
    attrs = "".join(f' data-{k.replace("_", "-")}="{_e(v)}"' for k, v in data.items())
    return _Raw(f"<td{attrs}>{_e(shown)}</td>")


def results_section(doc: dict[str, Any]) -> str:
    """The table (the markdown table's rows and notes) and the chart."""
    rows = []
    for cells in table_rows(doc):
        task, pipe, metric = cells[:3]
        value = doc["results"].get(task, {}).get(pipe, {}).get(metric)
        rows.append([_td(task), _td(pipe), _td(metric), _td(cells[3], value=repr(value) if value is not None else ""),
                     *[_td(c) for c in cells[4:]]])
    chance = doc.get("chance") or {}
    notes = [f"{t}: chance {c:.3f} (1 / choices)" for t, c in chance.items() if c is not None] + table_notes(doc)
    return (f'<section id="results"><h2>Results</h2>{_table(list(TABLE_HEAD), rows, tid="results-table")}'
            f'<ul class="notes">{"".join(f"<li>{_e(n)}</li>" for n in notes)}</ul>'
            f'<div class="chart">{results_chart(doc)}</div></section>')


def warnings_section(doc: dict[str, Any]) -> str:
    warns = (doc.get("diagnostics") or {}).get("warnings") or []
    items = "".join(f'<li class="warning">{_e(w)}</li>' for w in warns)
    body = f"<ul>{items}</ul>" if warns else '<p class="ok">No warning (thresholds in docs/evaluation.md).</p>'
    return f'<section id="warnings"><h2>What may distort these numbers</h2>{body}</section>'


def settings_section(doc: dict[str, Any]) -> str:
    run = doc.get("run") or {}
    rows: list[list[Any]] = [["model", run.get("model")], ["model name", run.get("model_name")],
                             ["model identity", run.get("model_identity")]]
    for t, s in (run.get("tasks") or {}).items():
        rows += [[f"task {t}", f"{s.get('source')} ({s.get('split') or '-'}), {s.get('n_questions')} questions"],
                 [f"task file {t}", s.get("file")]]
        if s.get("corpus"):
            rows += [[f"corpus {t}", s["corpus"] + (f" (store {s['corpus_store']})" if s.get("corpus_store") and
                                                    s["corpus_store"] != s["corpus"] else "")],
                     [f"encoder {t}", s.get("encoder")]]
    rows += [["--limit", run.get("limit")], ["seeds", " ".join(map(str, run.get("seeds", [])))],
             ["--pipeline-args", json.dumps(run.get("pipeline_args") or {})],
             ["task files' pipeline settings", json.dumps(run.get("task_pipeline_args") or {})],
             ["--model-args", json.dumps(run.get("model_args") or {})],
             ["--permute-choices", run.get("permute_choices") or "off"], ["--batch-size", run.get("batch_size")],
             ["date", doc.get("date")], ["rcn_fast", (doc.get("versions") or {}).get("rcn_fast")],
             ["total time (s)", _num(doc.get("total_time_s"), 1) if doc.get("total_time_s") is not None else None]]
    for t, by_p in (doc.get("pipelines") or {}).items():
        for p, c in by_p.items():
            rows.append([f"settings {t} / {p}", json.dumps(c.get("config"), default=str)])
    return (f'<section id="settings"><h2>Run settings</h2>'
            f'{_table(["Setting", "Value"], rows, tid="settings-table", cls="kv")}</section>')


def task_section(task: str, diag: dict[str, Any], failures: list[dict[str, Any]]) -> str:
    """One task's histograms, majority baseline, truncation, permutations and failures."""
    parts = [f'<section class="task" id="task-{_e(task)}" data-task="{_e(task)}"><h2>Task {_e(task)}</h2>']
    pipes = diag["pipelines"]
    labels = diag["labels"]
    if labels:
        rows = []
        if sum(diag["gold"].values()):
            mb = diag["majority_baseline"]
            rows.append([_td("gold", series="gold"), *[_td(diag["gold"][x], label=x, series="gold", count=diag["gold"][x])
                                                       for x in labels],
                         _td(f"{mb['label']} ({mb['acc']:.0%})"),
                         _td(f"{mb['acc']:.3f} (majority baseline)", majority=repr(mb["acc"]))])
        for p, d in pipes.items():
            h = d.get("histogram", {})
            top = f"{d['top_label']} ({d['top_share']:.0%})" if d.get("top_label") else "-"
            rows.append([_td(p, series=p), *[_td(h.get(x, 0), label=x, series=p, count=h.get(x, 0)) for x in labels],
                         _td(top), _td(_num(d.get("always_top_acc"), 3))])
        parts.append(f"<h3>Predicted labels beside gold ({diag['n_questions']} questions"
                     f"{', summed over seeds' if pipes else ''})</h3>")
        parts.append(_table(["", *labels, "Top label", "Always answering it"], rows, cls="hist",
                            tid=f"hist-{task}"))
        parts.append(histogram_chart(task, diag))
        mb = diag.get("majority_baseline")
        if mb:
            parts.append(f'<p class="baseline">Majority-label baseline: always answering {_e(mb["label"])} scores '
                         f'<b>{mb["acc"]:.3f}</b> on {mb["n"]} questions with gold.</p>')
    trunc = [[_td(p), _td(st), _td(s["truncated"], truncated=s["truncated"]), _td(s["generations"]),
              _td(f"{s['truncated'] / s['generations']:.0%}" if s["generations"] else "-")]
             for p, d in pipes.items() for st, s in d.get("truncation", {}).items()]
    if trunc:
        parts.append("<h3>Generations stopped by the token limit</h3>")
        parts.append(_table(["Pipeline", "Stage", "Stopped", "Generations", "Share"], trunc, cls="trunc",
                            tid=f"trunc-{task}"))
    rep = [[p, d["repeated_subsets"]["questions"], d["repeated_subsets"]["of"]] for p, d in pipes.items()
           if d.get("repeated_subsets")]
    if rep:
        parts.append("<h3>Sampled subsets that repeat</h3>" + _table(
            ["Pipeline", "Questions with two identical subsets", "Questions sampled"], rep, cls="repeat"))
    perm = [[_td(p), _td(_num(s["plain_acc"])), _td(_num(s["acc"]), acc=repr(s["acc"])),
             _td(_num(s["consistency"])), _td(s["n"]), _td(s["n_incomplete"])]
            for p, d in pipes.items() if (s := d.get("permutations"))]
    if perm:
        k = next(d["permutations"]["k"] for d in pipes.values() if d.get("permutations"))
        parts.append(f"<h3>Accuracy over {k} cyclic permutations of the choices (a diagnostic)</h3>")
        parts.append(_table(["Pipeline", "Plain acc", "Acc over the orders", "Same choice in every order",
                             "Questions", "Left out (not answered in every order)"], perm, cls="perm",
                            tid=f"perm-{task}"))
    fails = [f for f in failures if f.get("task") == task]
    parts.append(f"<h3>Failures ({len(fails)})</h3>")
    if fails:
        parts.append(_table(["Pipeline", "Seed", "Question", "Order", "Error"],
                            [[f.get("pipeline"), f.get("seed"), f.get("question_id"), f.get("permutation", 0),
                              f.get("error")] for f in fails[:500]], cls="failures", tid=f"failures-{task}"))
        if len(fails) > 500:
            parts.append(f"<p>... and {len(fails) - 500} more (see \"failures\" in the results JSON).</p>")
    else:
        parts.append("<p>None.</p>")
    parts.append("</section>")
    return "".join(parts)


QUESTIONS_SECTION = """<section id="questions"><h2>Questions</h2>
<noscript><p>The question browser needs JavaScript.</p></noscript>
<div class="controls">
<label>Task <select id="task"></select></label>
<label>Seed <select id="seed"></select></label>
<label>Show <select id="filter">
<option value="all">all questions</option>
<option value="disagree">pipelines disagree</option>
<option value="pair">one right, another wrong</option>
<option value="any-wrong">any pipeline wrong</option>
<option value="all-wrong">every pipeline wrong</option>
</select></label>
<span id="pair"><label>right: <select id="fa"></select></label>
<button id="swap" type="button" title="swap">&#8644;</button>
<label>wrong: <select id="fb"></select></label></span>
<label>Search <input id="search" type="search" placeholder="id or text"></label>
<span id="q-count" class="count"></span>
</div>
<div id="status" class="status"></div>
<table id="qtable"><thead id="qhead"></thead><tbody id="qbody"></tbody></table>
<div class="pager"><button id="prev" type="button">&larr; previous</button>
<span id="pageinfo"></span><button id="next" type="button">next &rarr;</button></div>
</section>"""


def render_page(doc: dict[str, Any], tasks: dict[str, TaskRecords]) -> str:
    """The whole page as one HTML string (see the module docstring).

    Parameters
    ----------
    doc : dict
        The results document (:func:`rcn_fast.eval.report.results.write_reports`),
        with its ``diagnostics`` and ``run``.
    tasks : dict
        ``{task: TaskRecords}`` (:func:`rcn_fast.eval.report.diagnostics.collect`).
    """
    blobs = page_blobs(tasks)
    diag = (doc.get("diagnostics") or {}).get("tasks") or {}
    model = (doc.get("run") or {}).get("model") or (doc.get("model") or {}).get("spec")
    title = f"rcn_fast evaluation: {', '.join(doc.get('results', {}))}"
    task_html = "".join(task_section(t, d, doc.get("failures") or []) for t, d in diag.items())
    scripts = [f'<script type="text/plain" id="blob-summary">{blobs["summary"]}</script>',
               f'<script type="text/plain" id="blob-passages">{blobs["passages"]}</script>']
    scripts += [f'<script type="text/plain" id="blob-chunk-{i}">{c}</script>' for i, c in enumerate(blobs["chunks"])]
    return "".join([
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">",
        "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\"><link rel=\"icon\" href=\"data:,\">",
        "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; style-src 'unsafe-inline'; "
        "script-src 'unsafe-inline'; img-src data:; connect-src data:\">",
        f"<title>{_e(title)}</title><style>{_asset('page.css')}</style></head><body>",
        f"<header><h1>{_e(title)}</h1><p class=\"model\">model <code id=\"model-spec\">{_e(model)}</code></p>"
        f"<p>{_e(doc.get('date'))} &middot; output {_e(doc.get('output_path'))}</p></header>",
        "<nav><a href=\"#warnings\">warnings</a> <a href=\"#results\">results</a> <a href=\"#settings\">settings</a> "
        + " ".join(f'<a href="#task-{_e(t)}">{_e(t)}</a>' for t in diag) + ' <a href="#questions">questions</a></nav>',
        "<main>", warnings_section(doc), results_section(doc), settings_section(doc),
        task_html,
        QUESTIONS_SECTION, "</main>", *scripts, f"<script>{_asset('page.js')}</script></body></html>\n",
    ])


__all__ = ["render_page", "results_section", "task_section", "warnings_section", "settings_section"]
