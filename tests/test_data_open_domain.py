"""Open-domain questions: the local loader (incl. malformed lines), the
Hugging Face field maps of NQ / TriviaQA / PopQA / WebQuestions, and the
StringEM / exact-match metrics on hand-made cases."""

from __future__ import annotations

import json

import pytest

from rcn_fast.data import (
    OPEN_FIELD_MAPS,
    DataFormatError,
    OpenFieldMap,
    OpenQuestion,
    exact_match,
    load_open_questions,
    normalize_answer,
    string_em,
)
from rcn_fast.data.open_domain import convert_open_record


# ------------------------------------------------------------------ metrics
@pytest.mark.parametrize("text, want", [
    ("The Eiffel Tower", "eiffel tower"),
    ("  an   apple a day ", "apple day"),
    ("Paris, France!", "paris france"),
    ("U.S.A.", "usa"),
    ("Rock-and-roll", "rockandroll"),
    ("Theatre of the Absurd", "theatre of absurd"),  # "the" only as a whole word
    ("\u201cQuoted\u201d \u2014 text", "quoted text"),
    ("A", ""),
    ("", ""),
])
def test_normalize_answer(text, want):
    assert normalize_answer(text) == want


def test_string_em_is_normalised_containment():
    assert string_em("I think it is the Eiffel Tower, in Paris.", ["eiffel tower"])
    assert string_em("EIFFEL TOWER", ["The Eiffel Tower"])  # articles and case on the gold side too
    assert string_em("It was William Shakespeare.", ["Shakespeare", "Bard of Avon"])  # any alias
    assert string_em("paris", "Paris")  # a single gold string
    assert not string_em("Lyon", ["Paris", "City of Light"])
    assert not string_em("anything at all", ["The", "a"])  # aliases that normalise to nothing never match
    assert not string_em("", ["Paris"])
    assert string_em("about 1,000 km", ["1000 km"])  # punctuation is deleted on both sides
    assert string_em("born in the U.S.", ["US"])
    assert not string_em("a category", ["cat dog"])


def test_exact_match_needs_the_whole_answer():
    assert exact_match("The Eiffel Tower.", ["eiffel tower"])
    assert exact_match("  paris ", ["Lyon", "PARIS"])
    assert not exact_match("Eiffel Tower in Paris", ["Eiffel Tower"])
    assert string_em("Eiffel Tower in Paris", ["Eiffel Tower"])
    assert not exact_match("Paris", [])


def test_metric_argument_errors():
    with pytest.raises(TypeError, match="prediction"):
        string_em(None, ["x"])
    with pytest.raises(TypeError, match="answers"):
        string_em("x", 3)
    with pytest.raises(TypeError, match=r"answers\[1\]"):
        exact_match("x", ["a", 2])
    with pytest.raises(TypeError, match="text"):
        normalize_answer(b"bytes")


# ------------------------------------------------------------------ records
def test_open_question_checks_its_fields():
    q = OpenQuestion(7, "Who?", ["me"])
    assert q.id == "7" and q.answers == ["me"] and q.meta == {}
    assert OpenQuestion.from_dict(q.to_dict()) == q
    assert OpenQuestion("u", "Unlabelled?").answers == []
    with pytest.raises(ValueError, match="question"):
        OpenQuestion("x", "  ", ["a"])
    with pytest.raises(TypeError, match="answers"):
        OpenQuestion("x", "Q?", "a single string")
    with pytest.raises(TypeError, match=r"answers\[0\]"):
        OpenQuestion("x", "Q?", [1])


# ------------------------------------------------------------------ local files
def _write(path, lines):
    path.write_text("".join(x + "\n" for x in lines), encoding="utf-8")
    return path


def test_load_local_jsonl(tmp_path):
    f = _write(tmp_path / "nq-dev.jsonl", [
        json.dumps({"id": "a", "question": "Who wrote Hamlet?", "answers": ["Shakespeare"], "source": "x"}),
        "",
        json.dumps({"id": "b", "question": "Capital of France?", "answers": ["Paris", "paris, france"]}),
        json.dumps({"question": "No id here?", "answers": []}),
    ])
    qs = load_open_questions(f)
    assert [q.id for q in qs] == ["a", "b", f"{f}:4"]
    assert qs[0].meta == {"source": "x"} and qs[1].answers == ["Paris", "paris, france"] and qs[2].answers == []
    assert [q.id for q in load_open_questions(str(f), limit=1)] == ["a"]
    assert [q.id for q in load_open_questions(tmp_path, split="validation")] == ["a", "b", f"{f}:4"]
    arr = tmp_path / "arr.json"
    arr.write_text(json.dumps([{"id": "z", "question": "Q?", "answers": ["A"]}]))
    assert load_open_questions(arr)[0].id == "z"


@pytest.mark.parametrize("bad, match", [
    ("{not json", r"bad\.jsonl:2: not valid JSON"),
    (json.dumps(["a", "list"]), r"bad\.jsonl:2: expected a JSON object"),
    (json.dumps({"id": "x", "answers": ["a"]}), r"bad\.jsonl:2: missing question text"),
    (json.dumps({"id": "x", "question": "Q?"}), r"bad\.jsonl:2: missing 'answers'"),
    (json.dumps({"id": "x", "question": "Q?", "answers": "Paris"}), r"bad\.jsonl:2: 'answers' must be a list"),
    (json.dumps({"id": "x", "question": "Q?", "answers": ["a", 3]}), r"bad\.jsonl:2: 'answers' must be a list"),
])
def test_malformed_lines_name_file_and_line(tmp_path, bad, match):
    f = _write(tmp_path / "bad.jsonl", [json.dumps({"id": "ok", "question": "Fine?", "answers": ["yes"]}), bad])
    with pytest.raises(DataFormatError, match=match):
        load_open_questions(f)


def test_loader_argument_errors(tmp_path):
    with pytest.raises(ValueError, match="limit"):
        load_open_questions(tmp_path, limit=0)
    with pytest.raises(FileNotFoundError, match="path_or_name"):
        load_open_questions(tmp_path / "missing.jsonl")
    with pytest.raises(FileNotFoundError, match="no \\*dev\\*.jsonl"):
        load_open_questions(tmp_path)
    with pytest.raises(ValueError, match="no built-in field map"):
        load_open_questions("someone/unknown_open_dataset")
    with pytest.raises(TypeError, match="fields"):
        load_open_questions("nq_open", fields={"question": "q"})
    with pytest.raises(ValueError, match="answers_format"):
        OpenFieldMap(question="q", answers="a", answers_format="csv")


# ------------------------------------------------------------------ Hugging Face field maps
NQ_ROW = {"question": "who sang hey jude", "answer": ["The Beatles", "Beatles"]}
TQA_ROW = {"question": "Which planet is the Red Planet?", "question_id": "tc_1",
           "answer": {"value": "Mars", "aliases": ["Mars", "Planet Mars"], "normalized_aliases": ["mars"]}}
POPQA_ROW = {"id": 42, "question": "What is Paris the capital of?", "possible_answers": '["France", "French Republic"]',
             "subj": "Paris"}
WEBQ_ROW = {"url": "http://x", "question": "what language do people in brazil speak?", "answers": ["Portuguese"]}


@pytest.mark.parametrize("name, row, want_id, want_answers", [
    ("nq_open", NQ_ROW, "nq_open[validation]-3", ["The Beatles", "Beatles"]),
    ("google-research-datasets/nq_open", NQ_ROW, "google-research-datasets/nq_open[validation]-3",
     ["The Beatles", "Beatles"]),
    ("trivia_qa", TQA_ROW, "tc_1", ["Mars", "Planet Mars"]),
    ("mandarjoshi/trivia_qa", TQA_ROW, "tc_1", ["Mars", "Planet Mars"]),
    ("akariasai/PopQA", POPQA_ROW, "42", ["France", "French Republic"]),
    ("web_questions", WEBQ_ROW, "web_questions[test]-3", ["Portuguese"]),
])
def test_builtin_field_maps(name, row, want_id, want_answers):
    fmap = OPEN_FIELD_MAPS[name]
    q = convert_open_record(row, fmap, 3, f"{name}[{fmap.split}]")
    assert q.id == want_id and q.answers == want_answers and q.question == row["question"]
    assert OPEN_FIELD_MAPS["trivia_qa"].config == "rc.nocontext"


def test_field_map_errors_name_dataset_and_row():
    with pytest.raises(DataFormatError, match=r"PopQA\[test\]: row 5: field 'possible_answers' is not a JSON list"):
        convert_open_record({**POPQA_ROW, "possible_answers": "[France"}, OPEN_FIELD_MAPS["akariasai/PopQA"], 5,
                            "PopQA[test]")
    with pytest.raises(DataFormatError, match=r"row 1: missing field 'answer'"):
        convert_open_record({"question": "q"}, OPEN_FIELD_MAPS["nq_open"], 1, "nq")
    with pytest.raises(DataFormatError, match="expected a list of answers"):
        convert_open_record({"question": "q", "answers": 5}, OPEN_FIELD_MAPS["web_questions"], 1, "wq")


def test_saved_hf_dataset_by_directory(tmp_path):
    """A dataset saved with save_to_disk goes through load_open_questions
    and the PopQA map (possible_answers is a JSON string)."""
    datasets = pytest.importorskip("datasets")
    rows = [dict(POPQA_ROW, id=i, question=f"Question {i}?") for i in range(3)]
    ds = datasets.Dataset.from_list(rows)
    d = tmp_path / "popqa"
    datasets.DatasetDict({"test": ds}).save_to_disk(str(d))
    qs = load_open_questions(str(d), split="test", fields=OPEN_FIELD_MAPS["akariasai/PopQA"], limit=2)
    assert [q.id for q in qs] == ["0", "1"]
    assert qs[1].question == "Question 1?" and qs[1].answers == ["France", "French Republic"]
