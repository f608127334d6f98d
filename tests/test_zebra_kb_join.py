"""ZEBRA-KB explanations joined with their questions by id (ReConnect App. A.3 training data).

Fixtures follow the public releases' fields: ``sapienzanlp/zebra-kb-explanations``
records (``id``, ``positives``, ``negatives``; ``explanation`` in the ECQA
configs) and the ZEBRA-KB document index ``documents.jsonl`` records
(``{"text": "Q [SEP] A. c1 [SEP] B. c2", "id", "metadata": {"answerKey"}}``).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import rcn_fast.train_retriever as tr
from rcn_fast.retrieval.train_data import load_groups, read_records
from rcn_fast.retrieval.zebra_kb import parse_kb_document, prepare_explanation_training


def _jsonl(path: Path, recs: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in recs), encoding="utf-8")
    return path


@pytest.fixture
def kb(tmp_path: Path) -> Path:
    folder = tmp_path / "zebra-kb-csqa-train"
    folder.mkdir()
    _jsonl(folder / "documents.jsonl", [
        {"text": "Where do fish live? [SEP] A. desert [SEP] B. water [SEP] C. sky", "id": "q1",
         "metadata": {"answerKey": "B"}},
        {"text": "What melts ice? [SEP] A. heat [SEP] B. cold", "id": "q2", "metadata": {"answerKey": "A"}},
        {"text": "Unexplained question? [SEP] A. x [SEP] B. y", "id": "q3", "metadata": {"answerKey": "A"}},
    ])
    return folder


@pytest.fixture
def explanations(tmp_path: Path) -> Path:
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    path = tmp_path / "all.parquet"
    pq.write_table(pa.table({
        "id": ["q1", "q2", "zz-missing"],
        "positives": [["Fish live in water.", "Fish need water to breathe."], ["Heat melts ice."], ["orphan"]],
        "negatives": [None, None, None],
    }), path)
    return path


def test_parse_kb_document_layouts():
    assert parse_kb_document({"id": 7, "text": "Q? [SEP] A. one [SEP] B. two words"}, "w") == ("7", "Q?", ["one", "two words"])
    csqa = {"id": "c", "question": {"stem": "S?", "choices": [{"label": "A", "text": "a"}]}, "answerKey": "A"}
    assert parse_kb_document(csqa, "w") == ("c", "S?", ["a"])
    with pytest.raises(ValueError, match="w: the record has no 'id'"):
        parse_kb_document({"text": "Q"}, "w")
    with pytest.raises(ValueError, match="no question text"):
        parse_kb_document({"id": "x", "foo": 1}, "w")


def test_join_by_id_counts_unmatched(tmp_path, kb, explanations):
    ecqa = _jsonl(tmp_path / "csqa-train-ecqa.jsonl", [
        {"id": "q1", "positives": ["Fish live in water."], "negatives": ["Fish fly."],
         "explanation": "Water is the home of fish."}])
    out = tmp_path / "train.jsonl"
    stats = prepare_explanation_training([str(explanations), str(ecqa)], [str(kb)], out)
    recs = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["id"] for r in recs] == ["q1", "q2"]
    assert recs[0] == {"id": "q1", "question": "Where do fish live?", "choices": ["desert", "water", "sky"],
                       "explanations": ["Fish live in water.", "Fish need water to breathe.",
                                        "Water is the home of fish."]}  # merged across sources, no repeats
    assert stats.unmatched_explanation_ids == 1 and stats.unmatched_examples == ["zz-missing"]
    assert stats.questions_without_explanations == 1  # q3
    assert stats.records == 2 and stats.explanations == 4
    # the trainer reads it in explanation mode: the question and each explanation are queries
    groups = load_groups(str(out), "explanation", records=read_records(str(out)))
    assert len(groups) == 2 and groups[0].passages[0] == "Fish live in water."
    assert groups[0].queries[0][0] == "Where do fish live?"


def test_prepare_cli_and_train_with_questions(tmp_path, kb, explanations, monkeypatch):
    out = tmp_path / "joined.jsonl"
    proc = subprocess.run([sys.executable, "-m", "rcn_fast.train_retriever", "prepare", "--train", str(explanations),
                           "--questions", str(kb / "documents.jsonl"), "--out", str(out)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["unmatched_explanation_ids"] == 1
    assert "1 explanation record(s) have no question" in proc.stderr

    seen = {}
    monkeypatch.setattr(tr, "train_main", lambda argv: seen.setdefault("argv", argv) and 0)
    rc = tr.main(["--train", str(explanations), "--questions", str(kb), "--base", "B", "--out", str(tmp_path / "m"),
                  "--max-steps", "3"])
    assert rc == 0
    joined = tmp_path / "m" / tr.JOINED_FILE
    assert seen["argv"] == ["--base", "B", "--max-steps", "3", "--train", str(joined), "--out", str(tmp_path / "m"),
                            "--mode", "explanation"]
    assert len(joined.read_text().splitlines()) == 2


def test_no_match_is_an_error(tmp_path, explanations):
    kb = _jsonl(tmp_path / "documents.jsonl", [{"text": "Other? [SEP] A. a", "id": "other"}])
    proc = subprocess.run([sys.executable, "-m", "rcn_fast.train_retriever", "prepare", "--train", str(explanations),
                           "--questions", str(kb), "--out", str(tmp_path / "o.jsonl")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "no explanation matched a question by id" in proc.stderr
