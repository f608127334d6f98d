"""Prompt templates (package data, user files, validation) and output parsing."""

from __future__ import annotations

import json
from importlib import resources

import pytest
import yaml

from rcn_fast import MCQuestion
from rcn_fast.prompts import (
    STAGE_FIELDS,
    PromptError,
    default_data,
    label_list,
    load_prompts,
    parse_bullets,
    parse_labelled,
)

Q = MCQuestion("q", "Why do {braces} stay?", ["light", "dark", "salt"])


def test_default_prompts_ship_as_package_data():
    f = resources.files("rcn_fast.prompts").joinpath("default.yaml")
    assert f.is_file()
    data = yaml.safe_load(f.read_text(encoding="utf-8"))
    assert data == default_data()
    p = load_prompts()
    assert p.source == "default"
    assert set(STAGE_FIELDS) <= set(p.data)


#: ReConnect's stages lay the question out as its paper and reference code do
RECONNECT_STAGES = ("query_expansion", "knowledge_extraction", "knowledge_aggregation", "reconnect_answer")


@pytest.mark.parametrize("stage, extra, prefill", [
    ("query_expansion", {}, "Explanations:\n*"),
    ("knowledge_extraction", {"documents": "* d1"}, "Explanations:\n*"),
    ("knowledge_aggregation", {"explanations": "* e1"}, "Aggregated Explanation:\n*"),
    ("reconnect_answer", {"knowledge": "* k1"}, "Answer:"),
    ("answer", {}, "Answer:"),  # issue 54: every answer prompt's pre-fill (its end: answer_render)
    ("answer_with_knowledge", {"knowledge": "* k1"}, "Answer:"),
    ("example_generation", {}, "Explanations:\n* "),
])
def test_every_stage_has_the_understand_exchange_and_a_prefill(stage, extra, prefill):
    chat = load_prompts().chat(stage, Q, **extra)
    assert [t["role"] for t in chat] == ["system", "assistant", "user", "assistant"]
    assert chat[0]["content"].rstrip().endswith("Is the task clear?")
    assert chat[-1]["content"] == prefill
    # question text is inserted verbatim (braces in data are not templates)
    if stage in RECONNECT_STAGES:
        assert chat[2]["content"].startswith("Question:\nWhy do {braces} stay?\n\nChoices:\nA. light\nB. dark\nC. salt")
    else:
        assert "Question: Why do {braces} stay?\nOptions:\nA. light\nB. dark\nC. salt" in chat[2]["content"]
    for v in extra.values():
        assert v in chat[0]["content"] or v in chat[2]["content"]


def test_missing_stage_placeholder_is_an_error():
    with pytest.raises(ValueError, match="documents"):
        load_prompts().chat("knowledge_extraction", Q)
    with pytest.raises(KeyError, match="stage"):
        load_prompts().chat("nope", Q)


def test_few_shot_examples_alternate_turns():
    ex = {"question": "Where do fish live?", "choices": ["water", "trees"], "labels": ["A", "B"],
          "knowledge": ["fish need water", "trees have no water"]}
    chat = load_prompts().chat("example_generation", Q, examples=[ex, ex])
    assert [t["role"] for t in chat] == ["system", "assistant", "user", "assistant", "user", "assistant", "user",
                                         "assistant"]
    assert chat[2]["content"] == "Question: Where do fish live?\nOptions:\nA. water\nB. trees"
    assert chat[3]["content"] == "Explanations:\n* fish need water\n* trees have no water"
    assert chat[-2]["content"].startswith("Question: Why do")


def test_silver_prompt_has_no_acknowledgement_and_no_prefill():
    chat = load_prompts().chat("silver_explanations", Q, answer_label="A", answer_format="A. ...\nB. ...")
    assert [t["role"] for t in chat] == ["system", "user"]
    assert "Correct option: A" in chat[1]["content"] and "A. ...\nB. ..." in chat[0]["content"]


def test_user_file_overrides_part_of_a_stage(tmp_path):
    f = tmp_path / "p.yaml"
    f.write_text(yaml.safe_dump({"answer": {"system": "Pick from {label_list}."}, "choice_line": "({label}) {text}"}))
    p = load_prompts(f)
    chat = p.chat("answer", Q)
    assert chat[0]["content"] == "Pick from A, B and C."
    assert chat[-1]["content"] == "Answer:"  # not overridden
    assert "(A) light" in chat[2]["content"]
    g = tmp_path / "p.json"
    g.write_text(json.dumps({"list_item": "- {text}"}))
    assert load_prompts(g).format_list(["a", "b"]) == "- a\n- b"
    assert load_prompts({"list_item": "- {text}"}).format_list([]) == "(none)"


@pytest.mark.parametrize("override, match", [
    ({"answer": {"system": "{documents}"}}, r"answer\.system: unknown placeholder"),
    ({"answer": {"sistem": "x"}}, r"answer: unknown key"),
    ({"bogus": 1}, "unknown key"),
    ({"format_version": 2}, "format_version"),
    ({"list_item": "{txt}"}, "list_item"),
    ({"answer": {"user": "{question"}}, r"answer\.user: not a valid template"),
    ({"answer": {"acknowledge": "yes"}}, r"answer\.acknowledge"),
])
def test_bad_prompt_files_name_the_key(tmp_path, override, match):
    f = tmp_path / "bad.yaml"
    f.write_text(yaml.safe_dump(override))
    with pytest.raises(PromptError, match=match):
        load_prompts(f)


def test_prompt_loader_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="source"):
        load_prompts(tmp_path / "missing.yaml")
    (tmp_path / "list.yaml").write_text("- a\n- b\n")
    with pytest.raises(PromptError, match="mapping"):
        load_prompts(tmp_path / "list.yaml")
    with pytest.raises(TypeError, match="source"):
        load_prompts(3)


@pytest.mark.parametrize("text, expect", [
    ("plants need light\n* they also need water\n\nA second paragraph.", ["plants need light", "they also need water"]),
    ("\n\n  - one\n  2) two\n(3) three\n4. four\n• five\n+ six", ["one", "two", "three", "four", "five", "six"]),
    ("* * nested marker\n1. - mixed", ["nested marker", "mixed"]),
    ("3.5 kg is heavy\n-5 degrees is cold\n1990s music", ["3.5 kg is heavy", "-5 degrees is cold", "1990s music"]),
    ("", []),
    ("\n \n", []),
    ("a\r\nb", ["a", "b"]),
])
def test_parse_bullets(text, expect):
    assert parse_bullets(text) == expect


def test_parse_bullets_max_items():
    assert parse_bullets("a\nb\nc", max_items=2) == ["a", "b"]
    assert parse_bullets("a\nb", max_items=0) == []
    with pytest.raises(ValueError, match="max_items"):
        parse_bullets("a", max_items=-1)
    with pytest.raises(TypeError, match="text"):
        parse_bullets(None)


def test_parse_labelled():
    text = "A. light helps\nplants a lot\nB) dark does not\n* C: salt harms\nA. started over\nmore"
    assert parse_labelled(text, ["A", "B", "C", "D"]) == ["light helps plants a lot", "dark does not",
                                                          "salt harms", None]


def test_label_list():
    assert label_list(["A"]) == "A" and label_list(["A", "B"]) == "A and B"
    assert label_list(list("ABCD")) == "A, B, C and D"
