"""The results page without a browser (issue 54 item 1): the packed data
decodes back to the records (lines, passages by id, rounded floats), the
page is one self-contained file (nothing it could fetch), whatever a
dataset or a model wrote is escaped, and its size per question stays
bounded (the 10,000-question number is in docs/evaluation.md)."""

from __future__ import annotations

import math
import re

import pytest

from rcn_fast.eval.report.page_data import FLOAT_DECIMALS, TraceStore, pack, probabilities, unpack


def _decode(v, lines, passages):
    """What page.js's decode() does, in Python (the browser test checks page.js itself)."""
    def line(e):
        return e[0] + passages[e[1]] + e[2] if isinstance(e, list) else e

    if isinstance(v, list):
        return [_decode(x, lines, passages) for x in v]
    if isinstance(v, dict):
        if list(v) == ["~"]:
            return "\n".join(line(lines[i]) for i in v["~"])
        out = {k: _decode(x, lines, passages) for k, x in v.items() if k != "~p"}
        if v.get("~p"):
            out["text"] = passages[out["id"]]
        return out
    return v


def _rounded(v):
    if isinstance(v, float):
        return round(v, FLOAT_DECIMALS)
    if isinstance(v, list):
        return [_rounded(x) for x in v]
    if isinstance(v, dict):
        return {k: _rounded(x) for k, x in v.items()}
    return v


def test_the_packed_traces_decode_to_the_records():
    from tests.eval_page_synthetic import synthetic_tasks

    tasks = synthetic_tasks(25, corpus=60)
    rec = tasks["syn"].records["reconnect"][0]["q00003"]
    rec["prediction"]["trace"].append({"stage": "odd", "type": "x", "text": "a\\nb\n" * 30, "id": 5,
                                       "passages": [{"id": "p1", "text": "not the corpus's p1 text, kept in place"}]})
    store = TraceStore(chunk_records=7)  # several chunks
    refs = {(p, q): store.add(r) for p, by in tasks["syn"].records.items() for q, r in by[0].items()}
    passages, chunks = store.blobs()
    passages = unpack(passages)
    chunks = [unpack(c) for c in chunks]
    assert len(chunks) == math.ceil(75 / 7)
    for (p, q), (c, i) in refs.items():
        pred = tasks["syn"].records[p][0][q]["prediction"]
        got = _decode(chunks[c]["records"][i], chunks[c]["lines"], passages)
        want = {k: pred[k] for k in ("trace", "knowledge", "passages", "cost") if pred.get(k)}
        assert {k: got[k] for k in want} == _rounded(want)
    assert any(isinstance(e, list) for c in chunks for e in c["lines"])  # lines quoting a passage refer to it by id
    assert sum(len(t) for t in passages.values()) < 60 * 200  # each passage text once


def test_probabilities():
    assert probabilities([math.log(0.2), math.log(0.3), math.log(0.5)]) == [0.2, 0.3, 0.5]
    assert probabilities([0.0, float("-inf")]) == [1.0, 0.0]
    assert probabilities([]) is None and probabilities(None) is None and probabilities([float("nan")]) is None
    assert unpack(pack({"a": [1, "é"]})) == {"a": [1, "é"]} and pack([1]) == pack([1])  # deterministic


@pytest.fixture(scope="module")
def page():
    from rcn_fast.eval.report.page import render_page
    from tests.eval_page_synthetic import synthetic_doc, synthetic_tasks

    tasks = synthetic_tasks(300, seed=1)
    q = tasks["syn"].questions[0]
    q.question = "</script><script>alert(1)</script><img src=x onerror=alert(2)>?"
    doc = synthetic_doc(tasks)
    doc["failures"] = [{"task": "syn", "pipeline": "vanilla", "seed": 0, "question_id": "<b>q</b>",
                        "error": "ValueError: <script>bad()</script>"}]
    return render_page(doc, tasks), tasks


def test_the_page_is_one_self_contained_file(page):
    html, _ = page
    tags = re.findall(r"<(script|link|img|iframe|object|embed|source|video|audio)\b([^>]*)>", html)
    assert {t for t, _ in tags} <= {"script", "link"}
    assert all("src=" not in a for t, a in tags if t == "script")
    assert [a for t, a in tags if t == "link"] == [' rel="icon" href="data:,"']  # no favicon request either
    assert "@import" not in html and "url(" not in html and "fetch(" not in html and "XMLHttpRequest" not in html
    assert "default-src 'none'" in html  # the page's own policy: it may fetch nothing
    blocks = re.findall(r'<script type="text/plain" id="([^"]+)">([A-Za-z0-9+/=]*)</script>', html)
    assert [b[0] for b in blocks][:2] == ["blob-summary", "blob-passages"] and len(blocks) > 3


def test_what_a_dataset_or_a_model_wrote_is_escaped(page):
    html, tasks = page
    assert "<img src=x" not in html and "<b>q</b>" not in html and "<script>bad()" not in html
    assert "&lt;b&gt;q&lt;/b&gt;" in html and "ValueError: &lt;script&gt;bad()&lt;/script&gt;" in html
    assert html.count("<script") == html.count("</script>")
    summary = re.search(r'id="blob-summary">([^<]*)<', html).group(1)
    assert unpack(summary)["tasks"][0]["questions"][0][1] == tasks["syn"].questions[0].question


def test_the_page_stays_small_per_question(page):
    html, tasks = page
    per_q = len(html.encode()) / len(tasks["syn"].questions)
    # three pipelines with ReConnect's default-size traces: 4.2 KB a question at 10,000 (docs/evaluation.md)
    assert per_q < 8000, per_q


def test_a_document_without_diagnostics_still_renders():
    from rcn_fast.eval.report.page import render_page

    doc = {"results": {"t": {"p": {"acc": None, "acc_std": None, "acc_stderr": None, "seeds": [0], "n_questions": 2,
                                   "n_failed": 2, "n_unlabeled": 0, "llm_calls_per_q": 0.0, "tokens_per_q": 0.0}}},
           "configs": {"t": {"metrics": ["acc"]}}}
    html = render_page(doc, {})
    assert "failed: no question could be scored" in html and html.endswith("</html>\n")


def test_a_run_writes_its_page_says_where_and_keeps_its_json_if_the_page_fails(tmp_path, capsys, monkeypatch):
    import json

    from rcn_fast.eval import EvalConfig, evaluate
    from rcn_fast.eval.report import page as page_mod
    from tests.pipelines.doubles import ScriptedLLM

    q = tmp_path / "mini.jsonl"
    q.write_text("\n".join(json.dumps({"id": f"q{i}", "question": {"stem": f"q {i}?", "choices": [
        {"label": "A", "text": "yes"}, {"label": "B", "text": "no"}]}, "answerKey": "A"}) for i in range(3)) + "\n")
    out = tmp_path / "out"
    cfg = EvalConfig(tasks=[str(q)], pipelines=["vanilla"], model="scripted", output_path=str(out), progress=False,
                     plot=False, log_samples=True)
    doc = evaluate(cfg, llm=ScriptedLLM())
    printed = capsys.readouterr().out
    page = out / doc["files"]["page"]
    assert page.is_file() and page.name == doc["files"]["results"].replace(".json", ".html")
    for key, name in [("results", doc["files"]["results"]), ("page", page.name), ("table", doc["files"]["table"]),
                      ("samples", doc["files"]["samples"][0])]:
        assert f"{key + ':':9}{out / name}" in printed

    def broken(*a, **k):
        raise RuntimeError("no page today")

    monkeypatch.setattr(page_mod, "render_page", broken)
    doc = evaluate(cfg, llm=ScriptedLLM(), print_table=False)
    err = capsys.readouterr().err
    assert doc["files"]["page_error"] == "RuntimeError: no page today" and "page" not in doc["files"]
    assert "the results page could not be written (RuntimeError: no page today)" in err
    assert json.loads((out / doc["files"]["results"]).read_text())["files"]["page_error"]
