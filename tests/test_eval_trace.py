"""The per-question record and its trace (issue 54 item 3): the field names
(``pred_label``, ``gold``, ``gold_label``; files with the former ``label`` /
``answer`` still resume), the retriever's scores and the sampler's
relevance, probabilities and draws in the trace, ``python -m rcn_fast.eval
show``, and what the end of a run prints (truncation counts before the
table, every file written after it). Tiny random-weight models built in
code, as tests/test_eval.py."""

from __future__ import annotations

import json
import math
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from rcn_fast.eval import evaluate  # noqa: E402
from rcn_fast.eval.cli import main  # noqa: E402
from rcn_fast.pipelines import Prediction  # noqa: E402
from rcn_fast.pipelines.records import upgrade_prediction  # noqa: E402
from tests.test_eval import (  # noqa: E402,F401  (fixtures)
    CountingLLM, _cfg, files, one_torch_thread, tiny_bert_dir, tiny_encoder, tiny_hf, tiny_llama_dir,
)


def _records(out):
    """{(pipeline, question id): record} of every checkpoint of a run."""
    got = {}
    for f in sorted((out / "checkpoints").rglob("*.jsonl")):
        for line in f.read_text().splitlines():
            r = json.loads(line)
            got[(f.parent.name, r["id"])] = r
    return got


def _to_former_names(out) -> int:
    """Rewrite every checkpoint record as earlier versions wrote it (label, answer; no gold_label)."""
    n = 0
    for f in sorted((out / "checkpoints").rglob("*.jsonl")):
        lines = []
        for line in f.read_text().splitlines():
            r = json.loads(line)
            p = r["prediction"]
            p["label"], p["answer"] = p.pop("pred_label"), p.pop("gold")
            del p["gold_label"]
            lines.append(json.dumps(r))
            n += 1
        f.write_text("".join(x + "\n" for x in lines))
    return n


@pytest.fixture(scope="module")
def run(tmp_path_factory, tiny_hf, tiny_encoder):
    """One run of vanilla, single retrieval and ReConnect with samples (its folder and printed output)."""
    from tests.test_eval import write_corpus, write_questions

    tmp = tmp_path_factory.mktemp("trace")
    fs = {"questions": write_questions(tmp / "mini.jsonl"), "corpus": write_corpus(tmp / "facts.jsonl"),
          "out": tmp / "out"}
    import contextlib
    import io

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(buf):
        doc = evaluate(_cfg(fs, log_samples=True, pipeline_args={"max_new_tokens": 4, "reconnect.num_subsets": 2,
                                                                  "reconnect.subset_size": 2, "top_n": 2}),
                       llm=CountingLLM(tiny_hf), encoder=tiny_encoder)
    return fs, doc, buf.getvalue()


def test_records_carry_the_new_names_scores_and_the_samplers_draws(run):
    fs, doc, _ = run
    recs = _records(fs["out"])
    assert {p for p, _ in recs} == {"vanilla", "single_retrieval", "reconnect"}
    for (pipe, qid), r in recs.items():
        p = r["prediction"]
        assert {"pred", "pred_label", "gold", "gold_label"} <= set(p) and not {"label", "answer"} & set(p)
        assert p["gold_label"] == "ABCD"[p["gold"]] and p["pred_label"] == "ABCD"[p["pred"]]
        scores = {x["id"]: x["score"] for x in p["passages"]}
        for e in p["trace"]:
            if e["type"] == "retrieve":  # the retriever's real scores, per query and per kept passage
                assert [x["id"] for x in e["passages"]] == [x["id"] for x in p["passages"]]
                assert all(math.isclose(x["score"], scores[x["id"]], abs_tol=1e-6) for x in e["passages"])
                for ids, ss in zip(e["results"], e["scores"]):
                    assert len(ids) == len(ss) and ss == sorted(ss, reverse=True)
        if pipe != "reconnect":
            continue
        (s,) = [e for e in p["trace"] if e["type"] == "sample"]
        pool = s["pool"]
        assert pool == [x["id"] for x in p["passages"]] and len(s["relevance"]) == len(pool)
        # relevance is the question query's cosine with each pool passage: for the passages the question
        # query retrieved, the retriever's own score (a normalised store)
        (ret,) = [e for e in p["trace"] if e["type"] == "retrieve"]
        for pid, sc in zip(ret["results"][-1], ret["scores"][-1]):
            assert math.isclose(s["relevance"][pool.index(pid)], sc, abs_tol=2e-3)  # stored rows: float16
        z = np.asarray(s["relevance"]) / s["temperature"]
        want = np.exp(z - z.max()) / np.exp(z - z.max()).sum()
        np.testing.assert_allclose(s["probability"], want, rtol=1e-6, atol=1e-9)
        assert math.isclose(s["temperature"], s["tau"] / s["score_scale"])
        assert len(s["subsets"]) == 2 and [len(x) for x in s["draw_probability"]] == [len(x) for x in s["subsets"]]
        for sub, dp in zip(s["subsets"], s["draw_probability"]):
            assert set(sub) <= set(pool) and len(set(sub)) == len(sub)
            assert math.isclose(dp[0], 1 / len(pool), rel_tol=1e-5)  # the uniform first draw
            assert all(0 < x <= 1 for x in dp)
        assert s["seed"] == 0 and isinstance(s["key"], int)


def test_former_field_names_resume_without_asking_the_model(run, tiny_hf, tiny_encoder):
    fs, doc, _ = run
    n = _to_former_names(fs["out"])
    assert n == 18
    llm = CountingLLM(tiny_hf)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no DamagedRecordWarning: nothing is answered again
        again = evaluate(_cfg(fs, log_samples=True), llm=llm, encoder=tiny_encoder, print_table=False)
    assert llm.rows == 0
    for task, by_pipe in doc["results"].items():
        for pipe, r in by_pipe.items():
            assert again["results"][task][pipe]["acc"] == r["acc"] and again["results"][task][pipe]["n_failed"] == 0
    sample = json.loads((fs["out"] / again["files"]["samples"][0]).read_text().splitlines()[0])
    assert sample["prediction"] in "ABCD" and sample["target"] == "ABCD"[sample["gold"]]
    # show reads them too
    old = next(iter(_records(fs["out"]).values()))
    assert "label" in old["prediction"]


def test_upgrade_prediction_maps_the_former_names_once():
    old = {"question_id": "q", "pred": 1, "label": "B", "choice_logprobs": [-1.0, -0.5], "answer": 0,
           "trace": [{"stage": "combination", "type": "combine",
                      "agents": [{"agent": "associate", "pred": 1, "label": "B", "choice_logprobs": [-1, -0.5]}]}]}
    new = upgrade_prediction(old)
    assert new["pred_label"] == "B" and new["gold"] == 0 and "label" not in new and "answer" not in new
    assert new["trace"][0]["agents"][0]["pred_label"] == "B" and "label" not in new["trace"][0]["agents"][0]
    assert old["label"] == "B" and "pred_label" not in old  # the dict given is not changed
    assert upgrade_prediction(new) == new
    both = {**new, "label": "Z"}  # a record with both names keeps the new one
    assert upgrade_prediction(both)["pred_label"] == "B"
    p = Prediction.from_dict(old)
    assert (p.pred_label, p.gold, p.gold_label, p.label, p.answer) == ("B", 0, None, "B", 0)
    open_pred = {"question_id": "o", "answer_text": "Paris", "answers": ["Paris"]}
    assert upgrade_prediction(open_pred) is open_pred


def test_end_of_run_prints_truncation_before_the_table_and_every_file_after(run):
    fs, doc, printed = run
    table = printed.index("| Tasks | Pipeline |")
    line = [x for x in printed.splitlines() if x.startswith("[mini] reconnect: ") and "stopped at the token limit" in x]
    assert len(line) == 1 and printed.index(line[0]) < table
    assert "(max_new_tokens=4): query_expansion " in line[0] and "knowledge_extraction " in line[0]
    cut, total = (int(x) for x in line[0].split(": ", 1)[1].split(" generations")[0].split(" of "))
    assert total == 6 * (1 + 2 + 1) and 0 <= cut <= total
    tail = printed[table:]
    for key in ("results", "table", "samples"):
        names = doc["files"][key] if isinstance(doc["files"][key], list) else [doc["files"][key]]
        for name in names:
            assert f"{key + ':':8s} {fs['out'] / name}" in tail
            assert (fs["out"] / name).is_file()


def test_show_prints_one_questions_answers_and_traces(run, capsys):
    fs, doc, _ = run
    assert main(["show", str(fs["out"]), "--id", "q1"]) == 0
    out = capsys.readouterr().out
    assert "question q1 -- task mini" in out and "Which statement is true, case 1?" in out
    assert "<- gold" in out and "P(A)" in out and "P(D)" in out
    for pipe in ("vanilla", "single_retrieval", "reconnect"):
        assert f"== {pipe} (task mini, seed 0)" in out
    for stage in ("query_expansion (generate)", "retrieval (retrieve)", "sampling (sample: relevance",
                  "knowledge_extraction (generate)", "knowledge_aggregation (generate)", "answer (score)"):
        assert stage in out, stage
    assert "relevance  probability" in out and "subset 1:" in out and "'Answer:'" in out
    assert main(["show", str(fs["out"]), "--id", "q1", "--pipelines", "vanilla", "--full"]) == 0
    one = capsys.readouterr().out
    assert "== vanilla" in one and "== reconnect" not in one and "system:" in one


def test_show_errors_name_what_is_missing(run, tmp_path, capsys):
    fs, _, _ = run
    assert main(["show", str(fs["out"]), "--id", "nope"]) == 2
    err = capsys.readouterr().err
    assert "question 'nope': no record" in err and "ids there look like q" in err
    assert main(["show", str(tmp_path / "none"), "--id", "q1"]) == 2
    assert "no such file or folder" in capsys.readouterr().err
    assert main(["show", str(tmp_path), "--id", "q1"]) == 2
    assert "no results_<timestamp>.json" in capsys.readouterr().err
