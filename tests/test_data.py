"""MCQuestion and the question loaders (local CommonsenseQA layout, HF datasets)."""

from __future__ import annotations

import json

import pytest

from rcn_fast.data import DataFormatError, FieldMap, MCQuestion, load_questions, read_jsonl

RECORD = {
    "id": "q1",
    "question": {"stem": "Where do fish live?", "question_concept": "fish",
                 "choices": [{"label": "A", "text": "tree"}, {"label": "B", "text": "water"}]},
    "answerKey": "B",
    "fact1": "fish live in water",
}


def write_jsonl(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_mcquestion_defaults_and_validation():
    q = MCQuestion("x", "Pick one", ["a", "b", "c"], answer=2)
    assert q.labels == ["A", "B", "C"] and q.answer_label == "C" and q.meta == {}
    assert MCQuestion.from_dict(q.to_dict()) == q
    with pytest.raises(ValueError, match="choices: expected 1 to 26"):
        MCQuestion("x", "q", [str(i) for i in range(27)])
    with pytest.raises(ValueError, match="answer: index 3 is out of range"):
        MCQuestion("x", "q", ["a", "b"], answer=3)
    with pytest.raises(ValueError, match="labels: expected 2 labels"):
        MCQuestion("x", "q", ["a", "b"], labels=["A"])
    with pytest.raises(ValueError, match="labels: expected distinct"):
        MCQuestion("x", "q", ["a", "b"], labels=["A", "A"])
    with pytest.raises(ValueError, match="question: expected non-empty"):
        MCQuestion("x", " ", ["a"])
    with pytest.raises(TypeError, match="choices: expected a list"):
        MCQuestion("x", "q", "ab")


def test_read_local_file_keeps_extra_fields(tmp_path):
    path = write_jsonl(tmp_path / "t.jsonl", [RECORD, {**RECORD, "id": "q2", "answerKey": "A"}])
    qs = load_questions(path)
    assert [q.id for q in qs] == ["q1", "q2"] and [q.answer for q in qs] == [1, 0]
    assert qs[0].choices == ["tree", "water"]
    assert qs[0].meta == {"fact1": "fish live in water", "question_concept": "fish"}
    assert len(load_questions(path, limit=1)) == 1
    (tmp_path / "arr.json").write_text(json.dumps([RECORD]))
    assert load_questions(tmp_path / "arr.json")[0].id == "q1"


@pytest.mark.parametrize(
    "line,match",
    [
        ("{not json", r"t.jsonl:2: not valid JSON"),
        (json.dumps({**RECORD, "answerKey": "Z"}), r"t.jsonl:2: answerKey 'Z' is not one of the labels"),
        (json.dumps({"id": "x", "question": {"choices": []}}), r"t.jsonl:2: missing question text"),
        (json.dumps({"id": "x", "question": {"stem": "s"}}), r"t.jsonl:2: missing choices"),
        ("[1, 2]", r"t.jsonl:2: expected a JSON object"),
    ],
)
def test_malformed_lines_name_file_and_line(tmp_path, line, match):
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps(RECORD) + "\n" + line + "\n")
    with pytest.raises(DataFormatError, match=match):
        read_jsonl(path)


def test_directory_with_split(tmp_path):
    write_jsonl(tmp_path / "set-train.jsonl", [RECORD])
    write_jsonl(tmp_path / "set-dev.jsonl", [RECORD, RECORD])
    assert len(load_questions(tmp_path)) == 2                      # dev by default
    assert len(load_questions(tmp_path, split="validation")) == 2
    assert len(load_questions(tmp_path, split="train")) == 1
    with pytest.raises(FileNotFoundError, match="no \\*test\\*.jsonl"):
        load_questions(tmp_path, split="test")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_questions(tmp_path / "missing.jsonl")
    with pytest.raises(ValueError, match="limit"):
        load_questions(tmp_path, limit=0)


def test_shared_benchmark_files(shared_data):
    expected = {"arc-easy": 5, "csqa": 5, "csqa2": 2, "obqa": 4, "piqa": 2, "qasc": 8, "wg": 2}
    for task, n_choices in expected.items():
        qs = load_questions(shared_data / task, split="dev", limit=50)
        assert len(qs) == 50
        assert all(q.answer is not None and len(q.choices) >= 2 for q in qs)
        assert max(len(q.choices) for q in qs) <= n_choices
    obqa = load_questions(shared_data / "obqa", split="train", limit=3)
    assert all("fact1" in q.meta for q in obqa)


def test_hugging_face_dataset_by_field_map(tmp_path):
    datasets = pytest.importorskip("datasets")
    rows = {
        "goal": ["Open a jar", "Dry a towel"],
        "sol1": ["twist the lid", "put it in water"],
        "sol2": ["hit it with a hammer", "hang it in the sun"],
        "label": [0, 1],
    }
    datasets.DatasetDict({"validation": datasets.Dataset.from_dict(rows)}).save_to_disk(str(tmp_path / "piqa_local"))
    fmap = FieldMap(question="goal", choices=("sol1", "sol2"), answer="label", answer_type="index")
    qs = load_questions(str(tmp_path / "piqa_local"), split="validation", fields=fmap)
    assert [q.answer for q in qs] == [0, 1] and qs[1].choices[1] == "hang it in the sun"
    assert qs[0].labels == ["A", "B"]
    # a CSQA-like dataset with labels and text in a dict, answer by label
    csqa_rows = {"id": ["a"], "question": ["Where?"], "choices": [{"label": ["A", "B"], "text": ["here", "there"]}],
                 "answerKey": ["B"]}
    datasets.Dataset.from_dict(csqa_rows).save_to_disk(str(tmp_path / "csqa_local"))
    qs = load_questions(str(tmp_path / "csqa_local"),
                        fields=FieldMap(question="question", choices="choices", answer="answerKey", id="id"))
    assert qs[0].id == "a" and qs[0].answer == 1
    with pytest.raises(ValueError, match="no built-in field map"):
        load_questions(str(tmp_path / "csqa_local"))


def test_hub_loaders_pass_dataset_kwargs(monkeypatch):
    """Every loader's hub call gets the caller's ``dataset_kwargs`` (e.g. the
    parquet-conversion revision a script-only repository needs)."""
    datasets = pytest.importorskip("datasets")
    from rcn_fast.data import load_open_questions, load_yes_no_questions

    calls = []

    def fake(path, name=None, **kwargs):
        calls.append((path, name, kwargs))
        rows = {"tau/commonsense_qa": {"id": "a", "question": "Where?", "answerKey": "A",
                                       "choices": {"label": ["A", "B"], "text": ["here", "there"]}},
                "nq_open": {"question": "who?", "answer": ["me"]},
                "ChilleD/StrategyQA": {"qid": "s", "question": "Is it?", "answer": True}}[path]
        ds = datasets.Dataset.from_list([rows])
        return ds if "split" in kwargs else datasets.DatasetDict({"test": ds})

    monkeypatch.setattr(datasets, "load_dataset", fake)
    kw = {"revision": "refs/convert/parquet", "data_dir": "default"}
    assert load_questions("tau/commonsense_qa", dataset_kwargs=kw)[0].answer == 0
    assert load_open_questions("nq_open", dataset_kwargs=kw)[0].answers == ["me"]
    assert load_yes_no_questions("ChilleD/StrategyQA", dataset_kwargs=kw)[0].answer == 0
    assert [c[2]["revision"] for c in calls] == ["refs/convert/parquet"] * 3
    assert all(c[2]["data_dir"] == "default" for c in calls)


def test_non_utf8_local_files_name_file_and_line(tmp_path):
    from rcn_fast.data.loaders import read_text

    f = tmp_path / "q.jsonl"
    good = json.dumps(RECORD).encode()
    f.write_bytes(good + b"\n" + good + b"\n" + good.replace(b"tree", b"tr\xc3e") + b"\n")
    with pytest.raises(DataFormatError, match=rf"{f}:3: not UTF-8 text \(byte\(s\) c3 at column \d+\)"):
        read_jsonl(f)
    arr = tmp_path / "arr.json"
    arr.write_bytes(b"[\n" + good + b",\n" + good.replace(b"tree", b"\xfftree") + b"\n]\n")
    with pytest.raises(DataFormatError, match=rf"{arr}:3: not UTF-8"):
        read_jsonl(arr)
    bom = tmp_path / "bom.jsonl"
    bom.write_bytes(b"\xef\xbb\xbf" + good + b"\n")
    assert read_jsonl(bom)[0].id == "q1" and not read_text(bom).startswith("\ufeff")
