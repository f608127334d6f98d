"""ZEBRA, the example KB and the silver-KB builder (scripted LLM double)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from rcn_fast import MCQuestion
from rcn_fast.kb import SEP, Example, ExampleKB, ExampleRetriever, build_silver, entry_text
from rcn_fast.kb.silver import parse_silver
from rcn_fast.pipelines import build
from tests.pipelines.doubles import HashEncoder, ScriptedLLM

KB_ROWS = [
    ("k1", "What do plants need to make food?", ["sunlight", "rocks"], ["plants use sunlight", "rocks are not food"]),
    ("k2", "What attracts iron?", ["a magnet", "a cloud"], ["magnets pull iron"]),
    ("k3", "What melts ice?", ["heat", "cold"], []),  # no explanations: never retrieved
    ("k4", "What do fish breathe with?", ["gills", "lungs"], ["fish have gills", "gills take oxygen from water"]),
    ("k5", "Which organ pumps blood?", ["heart", "liver"], ["the heart is a pump"]),
    ("k6", "What do plants need to grow?", ["water", "sand"], ["plants need water"]),
]


@pytest.fixture
def kb() -> ExampleKB:
    return ExampleKB(Example(i, q, c, explanations=e, answer=0) for i, q, c, e in KB_ROWS)


def test_entry_text():
    assert entry_text("Q?", ["x", "y"], ["A", "B"]) == "Q? [SEP] A. x [SEP] B. y"
    assert SEP == " [SEP] "


def test_kb_round_trip_and_corpus_records(tmp_path, kb):
    f = tmp_path / "kb.jsonl"
    kb.save(f)
    again = ExampleKB.load(f)
    assert [e.to_dict() for e in again] == [e.to_dict() for e in kb]
    rec = json.loads(f.read_text().splitlines()[0])
    assert rec["text"] == "plants use sunlight rocks are not food" and rec["labels"] == ["A", "B"]
    per = kb.corpus_records()
    assert per[:2] == [{"id": "k1#0", "text": "plants use sunlight"}, {"id": "k1#1", "text": "rocks are not food"}]
    assert len(per) == sum(len(e) for *_, e in KB_ROWS)
    assert [r["id"] for r in kb.corpus_records(per_explanation=False)] == ["k1", "k2", "k4", "k5", "k6"]


def test_kb_load_errors_name_the_line(tmp_path):
    f = tmp_path / "bad.jsonl"
    f.write_text('{"id": "a", "question": "q?", "choices": ["x"], "explanations": []}\n{oops\n')
    with pytest.raises(ValueError, match="line 2"):
        ExampleKB.load(f)
    f.write_text('{"id": "a", "question": "", "choices": ["x"]}\n')
    with pytest.raises(ValueError, match="line 1: question"):
        ExampleKB.load(f)
    with pytest.raises(FileNotFoundError, match="path"):
        ExampleKB.load(tmp_path / "none.jsonl")


def test_example_retriever_encodes_question_and_choices(kb):
    enc = HashEncoder()
    r = ExampleRetriever(kb, enc)
    q = MCQuestion("t", "What do plants need to grow?", ["water", "sand"])
    got = r.retrieve([q], k=10)[0]
    ids = [ex.id for ex, _ in got]
    assert "k3" not in ids and len(ids) == 5
    # scores are the dot products of the [SEP] encodings
    qv = enc.encode_queries([entry_text(q.question, q.choices, q.labels)])[0]
    for ex, s in got:
        ev = enc.encode_passages([entry_text(ex.question, ex.choices, ex.labels)])[0]
        assert np.isclose(s, float(qv @ ev), atol=1e-5)
    assert ids[0] == "k6"
    # excluding the question's own id
    got = r.retrieve([q], k=2, exclude_ids=["k6"])[0]
    assert [ex.id for ex, _ in got][0] != "k6" and len(got) == 2
    with pytest.raises(ValueError, match="k"):
        r.retrieve([q], k=0)
    with pytest.raises(ValueError, match="exclude_ids"):
        r.retrieve([q], k=1, exclude_ids=[])


def test_zebra_stage_flow(kb):
    llm = ScriptedLLM()
    r = ExampleRetriever(kb, HashEncoder())
    qs = [MCQuestion("k6", "What do plants need to grow?", ["water", "sand", "salt"]),
          MCQuestion("z2", "What attracts iron filings?", ["a magnet", "wood"])]
    p = build("zebra", llm=llm, retriever=r, top_k=2)
    preds = p.run_batch(qs)
    assert llm.calls == [("generate", 2), ("score", 2)]
    for q, pr in zip(qs, preds):
        assert [t["stage"] for t in pr.trace] == ["example_retrieval", "example_generation", "answer"]
        ex_ids = pr.trace[0]["examples"]
        assert len(ex_ids) == 2 and q.id not in ex_ids and "k3" not in ex_ids
        chat = pr.trace[1]["prompt"]
        assert [t["role"] for t in chat] == ["system", "assistant"] + ["user", "assistant"] * 3
        by_id = {e.id: e for e in kb}
        for j, eid in enumerate(ex_ids):
            ex = by_id[eid]
            assert chat[2 + 2 * j]["content"].startswith(f"Question: {ex.question}\nOptions:\nA. {ex.choices[0]}")
            assert chat[3 + 2 * j]["content"] == "Explanations:\n" + "\n".join(f"* {e}" for e in ex.explanations)
        assert chat[-1]["content"] == "Explanations:\n* "
        assert pr.knowledge == [f"like Question: {by_id[ex_ids[0]].question}", "2 examples seen"]
        assert "Explanations:\n* like Question" in pr.trace[-1]["prompt"][2]["content"]
        assert (pr.cost.generations, pr.cost.scoring_passes, pr.cost.llm_calls) == (1, 1, 2)
    # batching invariance
    single = [build("zebra", llm=ScriptedLLM(), retriever=r, top_k=2).run(q) for q in qs]
    for a, b in zip(preds, single):
        da, db = a.to_dict(), b.to_dict()
        np.testing.assert_allclose(da["trace"][0].pop("scores"), db["trace"][0].pop("scores"), rtol=1e-6)
        assert da == db


def test_zebra_settings(kb):
    r = ExampleRetriever(kb, HashEncoder())
    q = MCQuestion("k6", "What do plants need to grow?", ["water", "sand"])
    p = build("zebra", llm=ScriptedLLM(), retriever=r, top_k=1, exclude_same_id=False, max_explanations=1).run(q)
    assert p.trace[0]["examples"] == ["k6"]
    with pytest.raises(TypeError, match="retriever"):
        build("zebra", llm=ScriptedLLM())
    with pytest.raises(TypeError, match="retriever"):
        build("zebra", llm=ScriptedLLM(), retriever=object())


def test_zebra_with_an_empty_kb():
    r = ExampleRetriever(ExampleKB(), HashEncoder())
    p = build("zebra", llm=ScriptedLLM(), retriever=r).run(MCQuestion("a", "Q?", ["x", "y"]))
    assert p.trace[0]["examples"] == [] and p.knowledge == ["like no examples", "0 examples seen"]


# ---------------------------------------------------------------- silver KB
def _train() -> list[MCQuestion]:
    return [MCQuestion(f"t{i}", f"Question number {i}?", ["alpha", "beta", "gamma"], answer=i % 3) for i in range(7)] + [
        MCQuestion("nolabel", "Unanswered?", ["x", "y"])]


def test_parse_silver():
    assert parse_silver("A. yes\nB. no", ["A", "B"]) == ["yes", "no"]
    assert parse_silver("* first\n* second", ["A", "B"]) == ["first", "second"]


def test_build_silver_writes_one_explanation_per_choice(tmp_path):
    llm = ScriptedLLM()
    out = tmp_path / "kb.jsonl"
    res = build_silver(_train(), llm, out, batch_size=3, show_progress=False)
    assert (res.written, res.resumed, res.no_answer, res.total) == (7, 0, 1, 7)
    assert llm.calls == [("generate", 3), ("generate", 3), ("generate", 1)]
    kb = ExampleKB.load(out)
    assert [e.id for e in kb] == [f"t{i}" for i in range(7)]
    for i, ex in enumerate(kb):
        correct = "ABC"[i % 3]
        assert ex.explanations == [f"{'supports' if lab == correct else 'rules out'} {lab} for Question number {i}?"
                                   for lab in "ABC"]
        assert ex.answer == i % 3 and ex.meta["llm"] == "scripted" and ex.meta["source"] == "silver"
    chat = [c for k, c in llm.chats][0]
    assert "Correct option: A" in chat[-1]["content"] and "A. ...\nB. ...\nC. ..." in chat[0]["content"]


def test_build_silver_resumes(tmp_path):
    out = tmp_path / "kb.jsonl"
    first = build_silver(_train()[:3], ScriptedLLM(), out, batch_size=2, show_progress=False)
    assert first.written == 3
    # a crash mid-write leaves a torn last line: it is dropped and redone
    with open(out, "a") as f:
        f.write('{"id": "t3", "quest')
    llm = ScriptedLLM()
    res = build_silver(_train(), llm, out, batch_size=2, show_progress=False)
    assert (res.written, res.resumed, res.total) == (4, 3, 7)
    assert sum(n for _, n in llm.calls) == 4
    assert [e.id for e in ExampleKB.load(out)] == [f"t{i}" for i in range(7)]
    again = build_silver(_train(), ScriptedLLM(), out, show_progress=False)
    assert again.written == 0 and again.total == 7
    with pytest.raises(ValueError, match="another model"):
        build_silver(_train(), ScriptedLLM(name="other"), out, show_progress=False)
    with pytest.raises(ValueError, match="batch_size"):
        build_silver(_train(), ScriptedLLM(), out, batch_size=0)


def test_silver_kb_loads_as_zebra_kb_and_as_a_corpus(tmp_path):
    from rcn_fast.retrieval import BuildConfig, Retriever, build_corpus

    out = tmp_path / "kb.jsonl"
    build_silver(_train(), ScriptedLLM(), out, show_progress=False)
    kb = ExampleKB.load(out)
    zebra = build("zebra", llm=ScriptedLLM(), retriever=ExampleRetriever(kb, HashEncoder()), top_k=3)
    pred = zebra.run(MCQuestion("new", "Question number 2?", ["alpha", "beta", "gamma"]))
    assert pred.trace[0]["examples"][0] == "t2"
    enc = HashEncoder()
    build_corpus(BuildConfig(input=str(out), out=str(tmp_path / "store")), enc, show_progress=False)
    r = Retriever.load(tmp_path / "store", encoder=enc, check=False)
    assert len(r.store) == 7
    p = build("reconnect", llm=ScriptedLLM(), retriever=r, top_n=2).run(MCQuestion("n", "Question number 4?", ["a", "b"]))
    assert p.passages and all(x.id.startswith("t") for x in p.passages)


# ------------------------------------------------- explanation parsing vs the reference
def _reference_parse(text: str) -> list[str]:
    """ZEBRA's released rule (get_model_knowledge), restated for comparison:
    first paragraph, one explanation per line, every '*' removed."""
    return [k for k in (line.replace("*", "").strip() for line in text.split("\n\n")[0].split("\n")) if k]


@pytest.mark.parametrize("text", [
    "plants need water.\n* sand holds no food for plants.\n\nAnswer: A",
    "magnets pull iron\n*  wood is not magnetic \n* air cannot attract metal",
    "\nonly one line",
    "",
])
def test_explanation_parsing_matches_the_reference_on_bullet_lists(text):
    """The generation continues the pre-filled "Explanations:\\n* ": on bullet
    lists rcn_fast's parse_bullets and the reference's rule agree."""
    from rcn_fast.prompts import parse_bullets

    assert parse_bullets(text) == _reference_parse(text)


def test_explanation_parsing_differences_from_the_reference():
    """Documented differences (docs/FIDELITY.md, ZEBRA): rcn_fast also strips
    numbered / dash markers, and keeps asterisks inside a line."""
    from rcn_fast.prompts import parse_bullets

    assert parse_bullets("1. heat melts ice\n2) cold does not") == ["heat melts ice", "cold does not"]
    assert _reference_parse("1. heat melts ice\n2) cold does not") == ["1. heat melts ice", "2) cold does not"]
    assert parse_bullets("heat **melts** ice") == ["heat **melts** ice"]
    assert _reference_parse("heat **melts** ice") == ["heat melts ice"]
