"""Issue 34 item 2: no damaged record read back becomes a number. Every
checkpoint record and every call-cache row is held to the rule of a fresh
result (one validator, two callers): a metric out of [0, 1] or NaN,
log-probs that are NaN, all ``-inf`` or fewer than the question's labels, a
prediction out of range, a gold answer that is no longer the task's -- the
record is left out with a warning naming the file and line (the cache row:
the file and key) and its question is answered again; it is never counted.
Tiny random-weight models built in code."""

from __future__ import annotations

import json
import logging
import math
import os
import re
import sqlite3
import warnings
from pathlib import Path

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from rcn_fast.eval import EvalConfig, evaluate  # noqa: E402
from rcn_fast.eval.run.checkpoint import Checkpoint, DamagedRecordWarning  # noqa: E402
from rcn_fast.eval.metrics import ChoiceTask, OpenTask, RecordError  # noqa: E402
from rcn_fast.llm.cache import CachedLLM, CallCache  # noqa: E402
from tests.test_eval import CountingLLM, one_torch_thread, tiny_hf, tiny_llama_dir, write_questions  # noqa: E402,F401

QUIET = dict(pipelines=["vanilla"], progress=False, plot=False, device="cpu", batch_size=4)


def _cfg(tmp_path: Path, q: Path) -> EvalConfig:
    return EvalConfig(**QUIET, tasks=[str(q)], model="tiny", output_path=str(tmp_path / "out"))


def _checkpoint(tmp_path: Path) -> Path:
    [f] = list((tmp_path / "out" / "checkpoints").rglob("seed0-*.jsonl"))
    return f


def _edit(f: Path, edits: dict[int, callable]) -> None:
    lines = f.read_text().splitlines()
    for i, fn in edits.items():
        rec = json.loads(lines[i])
        fn(rec)
        lines[i] = json.dumps(rec)  # writes NaN / -Infinity literals, as a damaged file may hold
    f.write_text("".join(ln + "\n" for ln in lines))


def _set(path: str, value):
    def fn(rec):
        d = rec
        keys = path.split(".")
        for k in keys[:-1]:
            d = d[k]
        d[keys[-1]] = value
    return fn


DAMAGE = {
    0: _set("metrics.acc", 5.0),
    1: _set("metrics.acc", float("nan")),
    2: _set("prediction.choice_logprobs", [-math.inf] * 4),
    3: _set("prediction.choice_logprobs", [-0.1, -2.0]),
    4: _set("prediction.pred", 7),
    5: _set("prediction.choice_logprobs", [0.5, -1.0, -2.0, -3.0]),
    6: _set("elapsed_s", -1.0),
    7: lambda rec: _set("prediction.gold", (rec["prediction"]["gold"] + 1) % 4)(rec),  # another gold than the
    # task's (its data changed under the same key)
}


def test_damaged_checkpoint_records_are_answered_again_never_counted(tmp_path, tiny_hf, capsys):
    q = write_questions(tmp_path / "mini.jsonl", n=9)
    first = evaluate(_cfg(tmp_path, q), llm=tiny_hf, print_table=False)["results"]["mini"]["vanilla"]
    f = _checkpoint(tmp_path)
    _edit(f, DAMAGE)
    llm = CountingLLM(tiny_hf)
    with pytest.warns(DamagedRecordWarning) as got:
        again = evaluate(_cfg(tmp_path, q), llm=llm, print_table=False)["results"]["mini"]["vanilla"]
    assert again["acc"] == first["acc"] and again["n"] == 9 and again["n_failed"] == 0
    [w] = [str(x.message) for x in got if issubclass(x.category, DamagedRecordWarning)]
    assert f"checkpoint {f}: 8 record(s)" in w and "line 1 (question 'q0'): metrics.acc 5.0" in w
    assert "line 2 (question 'q1'): metrics.acc nan" in w and "line 3 (question 'q2')" in w and "and 5 more" in w
    assert llm.rows == 0  # answered again from the call cache, which holds the fresh rows
    with warnings.catch_warnings():  # the recomputed records supersede the damaged ones: no warning again
        warnings.simplefilter("error", DamagedRecordWarning)
        assert evaluate(_cfg(tmp_path, q), llm=llm, print_table=False)["results"]["mini"]["vanilla"]["acc"] == \
            first["acc"]


def test_a_line_that_is_not_json_is_named_until_its_question_is_answered_again(tmp_path):
    """A damaged line stays in the file; once its question has a valid record again, later loads (and
    reopen) no longer say it is answered again (before: the same warning on every load). A line whose
    question cannot be read is always named; neither is ever counted."""
    f = tmp_path / "ck.jsonl"
    recs = [{"id": f"q{i}", "seed": 0, "status": "ok"} for i in range(3)]
    cut = json.dumps(recs[1])[:15]  # '{"id": "q1", "s': a line cut short
    f.write_text(json.dumps(recs[0]) + "\n" + cut + "\n" + json.dumps(recs[2]) + "\n")
    with pytest.warns(DamagedRecordWarning, match=r"1 record\(s\) .*their questions are answered again: "
                                                  r"line 2 \(question 'q1'\): not JSON"):
        ck = Checkpoint(f, {})
    assert ck.done() == {"q0", "q2"}
    ck.append([recs[1]])
    with warnings.catch_warnings():
        warnings.simplefilter("error", DamagedRecordWarning)
        assert Checkpoint(f, {}).done() == {"q0", "q1", "q2"}
    with open(f, "a") as fh:
        fh.write("\x00\x00\x00\n")  # no question to read
    with pytest.warns(DamagedRecordWarning) as got:
        assert Checkpoint(f, {}).done() == {"q0", "q1", "q2"}
    [w] = [str(x.message) for x in got if issubclass(x.category, DamagedRecordWarning)]
    assert "1 record(s)" in w and "the questions among them with no other valid record are answered again" in w
    assert "line 5 (not JSON)" in w and "q1" not in w


@pytest.mark.parametrize("line, why", [
    (2, "every label ('A', 'B', 'C', 'D') has log-probability -inf"), (3, "expected 4 numbers"),
    (4, "prediction.pred 7"), (5, "which is positive"), (6, "elapsed_s -1.0"),
    (7, "the task's gold is now"),
])
def test_each_damage_is_named(tmp_path, tiny_hf, line, why):
    q = write_questions(tmp_path / "mini.jsonl", n=9)
    evaluate(_cfg(tmp_path, q), llm=tiny_hf, print_table=False)
    f = _checkpoint(tmp_path)
    _edit(f, {line: DAMAGE[line]})
    with pytest.warns(DamagedRecordWarning, match=rf"line {line + 1} \(question 'q{line}'\): .*{re.escape(why)}"):
        evaluate(_cfg(tmp_path, q), llm=tiny_hf, print_table=False)


def test_the_cli_names_the_damaged_file_in_one_warning_line(tmp_path, tiny_llama_dir, capsys):
    from rcn_fast.eval.cli import main

    q = write_questions(tmp_path / "mini.jsonl", n=4)
    args = ["--tasks", str(q), "--pipelines", "vanilla", "--model", str(tiny_llama_dir), "--output-path",
            str(tmp_path / "out"), "--no-progress", "--no-plot", "--device", "cpu"]
    assert main(args) == 0
    f = _checkpoint(tmp_path)
    _edit(f, {1: DAMAGE[1]})
    capsys.readouterr()
    assert main(args) == 0
    err = capsys.readouterr().err
    assert f"rcn_fast.eval: warning: checkpoint {f}: 1 record(s)" in err and "line 2 (question 'q1')" in err


def test_a_fresh_record_is_held_to_the_same_check(tmp_path):
    """One validator, two callers: make_record refuses what a read-back would."""
    from rcn_fast.data import MCQuestion
    from rcn_fast.eval.run.executors import make_record
    from rcn_fast.eval.run.plan import Unit
    from rcn_fast.eval.tasks.catalog import TaskSpec
    from rcn_fast.pipelines.base import Prediction

    qn = MCQuestion(id="q0", question="Which?", choices=["a", "b", "c"], answer=1)
    unit = Unit(task=TaskSpec(name="t"), pipeline="vanilla", seed=0, settings={}, config={},
                checkpoint=Checkpoint(tmp_path / "ck.jsonl", {}), questions=[qn], scorer=ChoiceTask())
    good = Prediction(question_id="q0", pred=1, pred_label="B", choice_logprobs=[-2.0, -0.2, -3.0])
    rec = make_record(good, qn, unit, 0.1)
    assert rec["metrics"] == {"acc": 1.0}
    ChoiceTask().check_record(qn, json.loads(json.dumps(rec)), 0)  # what is written reads back valid
    for bad in (Prediction(question_id="q0", pred=1, pred_label="B", choice_logprobs=[float("nan"), -0.2, -3.0]),
                Prediction(question_id="q0", pred=1, pred_label="B", choice_logprobs=[-math.inf] * 3),
                Prediction(question_id="q0", pred=1, pred_label="B", choice_logprobs=[-0.2, -3.0]),
                Prediction(question_id="q0", pred=3, pred_label="D", choice_logprobs=[-2.0, -0.2, -3.0])):
        with pytest.raises(RecordError):
            make_record(bad, qn, unit, 0.1)


def test_a_prediction_that_is_not_the_argmax_of_its_log_probs_is_refused():
    """Issue 44: pred must be an argmax of its own choice_logprobs (a tie may go to any tied choice)."""
    from rcn_fast.data import MCQuestion

    qn = MCQuestion(id="q0", question="Which?", choices=["a", "b", "c"], answer=2)
    task = ChoiceTask()

    def rec(pred, lp, acc):
        return {"id": "q0", "seed": 0, "status": "ok", "elapsed_s": 0.1, "metrics": {"acc": acc},
                "prediction": {"pred": pred, "label": "ABC"[pred], "choice_logprobs": lp, "answer": 2, "cost": {}}}

    task.check_record(qn, rec(0, [-0.2, -2.0, -3.0], 0.0), 0)
    task.check_record(qn, rec(2, [-1.0986, -5.0, -1.0986], 1.0), 0)  # a tie: either tied choice
    task.check_record(qn, rec(2, [-0.69314718, -9.0, -0.69314720], 1.0), 0)  # tied within the tolerance
    task.check_record(qn, rec(1, [], 0.0), 0)  # a pipeline that gives no scores
    with pytest.raises(RecordError, match=r"prediction.pred 2 \('C', log-prob -3\) is not the argmax of its "
                                          r"choice_logprobs \(choice 0 'A', -0.2\)"):
        task.check_record(qn, rec(2, [-0.2, -2.0, -3.0], 1.0), 0)


def test_an_edited_pred_whose_log_probs_disagree_is_answered_again_not_counted(tmp_path, tiny_hf):
    """Issue 44: a line edited to pred = gold, acc 1.0 (its choice_logprobs' argmax left on another
    label) was counted on 7491bb5; it is now left out and answered again. A forgery consistent in
    every field (log-probs rewritten too) is out of scope: whoever can write the output folder can
    write any consistent record, and it is counted."""
    q = write_questions(tmp_path / "mini.jsonl", n=9)
    first = evaluate(_cfg(tmp_path, q), llm=tiny_hf, print_table=False)["results"]["mini"]["vanilla"]
    f = _checkpoint(tmp_path)
    recs = [json.loads(ln) for ln in f.read_text().splitlines()]
    wrong = [i for i, r in enumerate(recs) if r["metrics"]["acc"] == 0.0]
    assert len(wrong) >= 2 and first["acc"] < 1.0

    def forge(rec, logprobs_too=False):
        gold = rec["prediction"]["gold"]
        rec["prediction"].update(pred=gold, pred_label="ABCD"[gold])
        rec["metrics"]["acc"] = 1.0
        if logprobs_too:
            lp = rec["prediction"]["choice_logprobs"]
            top = int(np.argmax(lp))  # before the swap (a target list assigns left to right)
            lp[gold], lp[top] = lp[top], lp[gold]

    _edit(f, {wrong[0]: forge})
    with pytest.warns(DamagedRecordWarning, match=rf"line {wrong[0] + 1} .*prediction.pred \d .*is not the argmax"):
        again = evaluate(_cfg(tmp_path, q), llm=tiny_hf, print_table=False)["results"]["mini"]["vanilla"]
    assert again["acc"] == first["acc"] and again["n"] == 9
    _edit(f, {wrong[1]: lambda r: forge(r, logprobs_too=True)})  # the documented limit: consistent, so counted
    forged = evaluate(_cfg(tmp_path, q), llm=tiny_hf, print_table=False)["results"]["mini"]["vanilla"]
    assert forged["acc"] == pytest.approx(first["acc"] + 1 / 9)


def test_open_domain_records_are_checked_against_the_gold():
    from rcn_fast.data.open_domain import OpenQuestion

    q = OpenQuestion(id="o1", question="Capital of France?", answers=["Paris"])
    task = OpenTask()
    pred = {"answer_text": "Paris", "answers": ["Paris"], "string_em": True, "exact_match": True, "cost": {}}
    rec = {"id": "o1", "seed": 0, "status": "ok", "elapsed_s": 0.5, "prediction": pred,
           "metrics": {"string_em": 1.0, "exact_match": 1.0}}
    task.check_record(q, rec, 0)
    for path, value, why in [("metrics.string_em", 0.0, "not what the prediction scores"),
                             ("prediction.answers", ["Lyon"], "gold is now"),
                             ("prediction.string_em", False, "not what the answer scores"),
                             ("metrics.exact_match", float("inf"), "expected a number in"),
                             ("prediction.answer_text", 5, "expected a string"), ("status", "failed", "status")]:
        bad = json.loads(json.dumps(rec))
        _set(path, value)(bad)
        with pytest.raises(RecordError, match=why):
            task.check_record(q, bad, 0)


# ------------------------------------------------------------------ the call cache
class Stub:
    """A backend that scores label 'B' best and counts its rows."""

    identity = "stub-model"

    def __init__(self) -> None:
        from rcn_fast.llm.base import CostTracker

        self.rows = 0
        self.cost = CostTracker()

    def label_logprobs(self, chats, labels, *, tags=None):
        self.rows += len(chats)
        out = np.full((len(chats), 4), -math.inf)
        for i, labs in enumerate(labels):
            out[i, : len(labs)] = -3.0
            out[i, 1] = -0.1
        return out


CHAT = [{"role": "user", "content": "Pick one."}, {"role": "assistant", "content": "Answer: "}]


@pytest.mark.parametrize("stored, why", [
    ([-math.inf] * 4, "every label"), ([-0.1, -2.0], "2 values for 4 labels"), ([0.3, -1, -2, -3], "positive"),
    ([float("nan"), -1, -2, -3], "NaN"), (["x", -1, -2, -3], "not a number"),
])
def test_a_damaged_cache_row_is_quarantined_and_asked_again(tmp_path, caplog, stored, why):
    cache = CallCache(tmp_path)
    key = CallCache.key("stub-model", "label_logprobs", {"chat": CHAT, "labels": list("ABCD")})
    cache.put_many([(key, "stub-model", "label_logprobs", {}, {"logprobs": stored, "prompt_tokens": 5})])
    stub = Stub()
    with caplog.at_level(logging.WARNING, "rcn_fast.llm"):
        lp = CachedLLM(stub, cache).label_logprobs([CHAT], [list("ABCD")])
    assert stub.rows == 1 and list(lp[0]) == [-3.0, -0.1, -3.0, -3.0]
    assert f"llm cache {cache.path}" in caplog.text and f"row key {key[:16]}" in caplog.text and why in caplog.text
    con = sqlite3.connect(cache.path)
    assert con.execute("SELECT COUNT(*) FROM calls_quarantine").fetchone()[0] == 1
    stub.rows = 0  # the fresh row replaced it
    assert list(CachedLLM(stub, cache).label_logprobs([CHAT], [list("ABCD")])[0]) == [-3.0, -0.1, -3.0, -3.0]
    assert stub.rows == 0


def test_garbage_cache_rows_never_become_an_accuracy(tmp_path, tiny_hf):
    q = write_questions(tmp_path / "mini.jsonl", n=8)
    first = evaluate(_cfg(tmp_path, q), llm=tiny_hf, print_table=False)["results"]["mini"]["vanilla"]
    db = tmp_path / "out" / "llm_cache.sqlite"
    con = sqlite3.connect(db)
    rows = con.execute("SELECT key, response FROM calls WHERE kind = 'label_logprobs'").fetchall()
    assert len(rows) == 8
    for i, (k, resp) in enumerate(rows):  # half all -inf, half shorter than the labels
        r = json.loads(resp)
        r["logprobs"] = [-math.inf] * len(r["logprobs"]) if i % 2 else r["logprobs"][:2]
        con.execute("UPDATE calls SET response = ? WHERE key = ?", (json.dumps(r), k))
    con.commit()
    con.close()
    for f in (tmp_path / "out" / "checkpoints").rglob("*.jsonl"):
        f.unlink()
    llm = CountingLLM(tiny_hf)
    again = evaluate(_cfg(tmp_path, q), llm=llm, print_table=False)["results"]["mini"]["vanilla"]
    assert llm.rows == 8 and again["acc"] == first["acc"] and again["n_failed"] == 0


def test_a_damaged_cached_leak_summary_is_scanned_again(tmp_path):
    from rcn_fast.corpus.leakage import cached_corpus_leak_summary, leak_warning
    from rcn_fast.data import MCQuestion

    qs = [MCQuestion(id=f"q{i}", question=f"Which metal is liquid at room temperature, case {i}?",
                     choices=["mercury", "iron"], answer=0) for i in range(3)]
    corpus = tmp_path / "c.jsonl"
    corpus.write_text(json.dumps({"id": "d0", "text": qs[0].question + " Mercury is."}) + "\n"
                      + json.dumps({"id": "d1", "text": "Iron rusts in water."}) + "\n")
    first = cached_corpus_leak_summary(str(corpus), {"t": qs}, tmp_path / "leaks")
    assert first["documents"] == 1
    [cached] = list((tmp_path / "leaks").glob("leaks-*.json"))
    for garbage in ({"documents": -5, "tasks": {}}, {"documents": 0, "tasks": {"t": {"documents": "x"}}},
                    {"documents": 0, "tasks": {"other": {"documents": 0, "questions_leaked": 0, "by_source": {}}}},
                    [1, 2]):
        cached.write_text(json.dumps(garbage))
        again = cached_corpus_leak_summary(str(corpus), {"t": qs}, tmp_path / "leaks")
        assert again == first and leak_warning(str(corpus), again)
