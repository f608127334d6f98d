"""What a person reads and what a run keeps: ``--limit`` reading only what
it keeps, the results plot, sample files that outlive the next run,
``--no-progress`` silencing model-loading bars, and an unreachable Ray
address."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest


# ------------------------------------------------------------------ --limit
def _mc_line(i: int) -> str:
    return json.dumps({"id": f"q{i}", "question": {"stem": f"question {i}?", "choices": [
        {"label": "A", "text": "yes"}, {"label": "B", "text": "no"}]}, "answerKey": "A"})


def _file_with_bad_line(path: Path, good: int, after: int, make=_mc_line) -> Path:
    """``good`` records, a malformed line, then ``after`` more records."""
    lines = [make(i) for i in range(good)] + ["{not json at all"] + [make(good + 1 + i) for i in range(after)]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


@pytest.mark.parametrize("kind, make", [
    ("multiple_choice", _mc_line),
    ("yes_no", lambda i: json.dumps({"qid": f"y{i}", "question": f"is {i} odd?", "answer": bool(i % 2)})),
    ("open", lambda i: json.dumps({"id": f"o{i}", "question": f"what is {i}?", "answers": [str(i)]})),
])
def test_limit_never_parses_the_lines_after_it(tmp_path, kind, make):
    from rcn_fast.data.loaders import DataFormatError
    from rcn_fast.eval.tasks import TaskCountWarning, load_task_questions, spec_from_dict

    f = _file_with_bad_line(tmp_path / "qs.jsonl", good=5, after=4, make=make)
    spec = spec_from_dict({"name": "big", "kind": kind, "local": str(f), "expected_count": 10}, "t.yaml")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the 10 records are counted: the expected count holds, no warning
        qs = load_task_questions(spec, limit=5)
    assert len(qs) == 5 and [q.id for q in qs][-1].endswith("4")
    assert len(load_task_questions(spec, limit=0.5)) == 5  # a fraction of the counted records
    with pytest.raises(DataFormatError, match=r"qs.jsonl:6: not valid JSON"):
        load_task_questions(spec, limit=6)
    with pytest.raises(DataFormatError, match=r"qs.jsonl:6: not valid JSON"):
        load_task_questions(spec)
    short = spec_from_dict({"name": "big", "kind": kind, "local": str(f), "expected_count": 200}, "t.yaml")
    with pytest.warns(TaskCountWarning, match="has 10 questions, the paper's set has 200"):
        load_task_questions(short, limit=3)


def test_limit_on_a_folder_of_split_files_and_a_json_array(tmp_path):
    from rcn_fast.data.loaders import count_records
    from rcn_fast.eval.tasks import load_task_questions, spec_from_dict

    folder = tmp_path / "obqa"
    folder.mkdir()
    _file_with_bad_line(folder / "obqa-test.jsonl", good=3, after=2)
    spec = spec_from_dict({"name": "obqa", "dataset": str(folder), "split": "test",
                           "fields": {"question": "q", "choices": "c", "answer": "a"}}, "t.yaml")
    assert [q.id for q in load_task_questions(spec, limit=3)] == ["q0", "q1", "q2"]
    arr = tmp_path / "arr.json"
    arr.write_text("[" + ",".join(_mc_line(i) for i in range(4)) + "]", encoding="utf-8")
    assert count_records(arr) is None  # a JSON array is parsed whole
    spec = spec_from_dict({"name": "arr", "local": str(arr)}, "t.yaml")
    assert [q.id for q in load_task_questions(spec, limit=2)] == ["q0", "q1"]
    blank = tmp_path / "blank.jsonl"
    blank.write_text("\ufeff" + _mc_line(0) + "\n\n  \n" + _mc_line(1) + "\n", encoding="utf-8")
    assert count_records(blank) == 2
