"""Stage flow of the pipelines with a deterministic scripted LLM double:
prompts, parsing, call counts, ablation switches, batching invariance,
configs and errors."""

from __future__ import annotations

import json

import numpy as np
import pytest

from rcn_fast import MCQuestion
from rcn_fast.eval.metrics import score  # correctness is the task's scoring
from rcn_fast.pipelines import (
    ABLATIONS,
    InMemoryRetriever,
    Prediction,
    ReConnectConfig,
    build,
    config_from_dict,
    load_config,
    question_key,
)
from tests.pipelines.compare import assert_same_prediction
from tests.pipelines.doubles import FACTS, HashEncoder, ScriptedLLM, stage_of


def _questions() -> list[MCQuestion]:
    return [
        MCQuestion("q1", "What do plants need to grow?", ["sunlight", "darkness", "salt"], answer=0),
        MCQuestion("q2", "What does a magnet attract?", ["iron", "wood", "water", "glass"], answer=0),
        MCQuestion("q3", "What happens to ice when it is heated?", ["it melts", "it grows"], answer=0),
        MCQuestion("q4", "Which organ pumps blood?", ["lungs", "heart", "gills", "skin", "bones"], answer=1),
        MCQuestion("q5", "What measures temperature?", ["ruler", "thermometer", "mirror"],
                   labels=["1", "2", "3"], answer=1),
    ]


@pytest.fixture
def retriever() -> InMemoryRetriever:
    return InMemoryRetriever(HashEncoder(), FACTS, ids=[f"f{i:02d}" for i in range(len(FACTS))])


def _stages(pred: Prediction) -> list[str]:
    return [t["stage"] for t in pred.trace]


def _gen_entries(pred: Prediction, stage: str) -> list[dict]:
    return [t for t in pred.trace if t["stage"] == stage and t["type"] == "generate"]


# ---------------------------------------------------------------- vanilla
def test_vanilla_scores_once_and_takes_the_argmax():
    llm = ScriptedLLM()
    qs = _questions()
    preds = build("vanilla", llm=llm).run_batch(qs)
    assert llm.calls == [("score", len(qs))]
    for q, p in zip(qs, preds):
        assert p.question_id == q.id and p.answer == q.answer
        assert len(p.choice_logprobs) == len(q.choices)
        assert p.pred == int(np.argmax(p.choice_logprobs)) and p.label == q.labels[p.pred]
        assert np.isclose(np.logaddexp.reduce(p.choice_logprobs), 0.0, atol=1e-5)
        assert p.knowledge == [] and p.passages == []
        assert _stages(p) == ["answer"]
        chat = p.trace[0]["prompt"]
        assert [t["role"] for t in chat] == ["system", "assistant", "user", "assistant"]
        assert chat[-1]["content"] == "Answer:"  # issue 54: the answer turn of every pipeline (answer_render)
        assert f"labelled {', '.join(q.labels[:-1])} and {q.labels[-1]}" in chat[0]["content"]
        for lab, c in zip(q.labels, q.choices):
            assert f"\n{lab}. {c}" in chat[2]["content"]
        assert p.cost.llm_calls == 1 and p.cost.scoring_passes == 1 and p.cost.generations == 0
        assert p.cost.prompt_tokens > 0 and p.cost.generated_tokens == 0


def test_answer_follows_the_knowledge():
    """The answering step really reads the knowledge (the double picks the
    label named by PICK=<label> in the prompt)."""
    q = MCQuestion("x", "Pick one", ["a", "b", "c"])
    facts = ["PICK=C is the rule here", "unrelated words"]
    r = InMemoryRetriever(HashEncoder(), facts)
    p = build("single_retrieval", llm=ScriptedLLM(), retriever=r, top_n=2).run(q)
    assert p.label == "C" and p.pred == 2


# ---------------------------------------------------------------- single retrieval
def test_single_retrieval_answers_with_the_top_n_passages(retriever):
    llm = ScriptedLLM()
    qs = _questions()
    preds = build("single_retrieval", llm=llm, retriever=retriever, top_n=4).run_batch(qs)
    assert llm.calls == [("score", len(qs))]
    expect = retriever.retrieve([q.question for q in qs], 4)
    for q, p, exp in zip(qs, preds, expect):
        assert [x.id for x in p.passages] == [x.id for x in exp]
        assert p.knowledge == [x.text for x in exp]
        assert _stages(p) == ["retrieval", "answer"]
        ans = p.trace[-1]["prompt"]
        assert "Explanations:\n" + "\n".join(f"* {t}" for t in p.knowledge) in ans[2]["content"]


def test_single_retrieval_query_with_choices(retriever):
    q = _questions()[0]
    p = build("single_retrieval", llm=ScriptedLLM(), retriever=retriever, query="question_choices").run(q)
    assert p.trace[0]["queries"] == ["What do plants need to grow? A. sunlight B. darkness C. salt"]


# ---------------------------------------------------------------- ReConnect
def _repeats(pred: Prediction) -> bool:
    """Whether two of a question's subsets hold the same passages (its
    extractions are then decoded with nucleus sampling, one call per subset)."""
    subs = [frozenset(s) for s in next(t for t in pred.trace if t["stage"] == "sampling")["subsets"]]
    return len(set(subs)) < len(subs)


def _expected_calls(preds: list[Prediction], n: int = 3) -> list[tuple[str, int]]:
    """The batched LLM calls of one chunk with default settings: one per
    stage, except that the extractions of questions whose subsets repeat
    go in one sampled call per subset index."""
    B, R = len(preds), sum(_repeats(p) for p in preds)
    ext = ([("generate", n * (B - R))] if R < B else []) + [("generate", R)] * (n if R else 0)
    return [("generate", B), *ext, ("generate", B), ("score", B)]


def test_reconnect_default_costs_five_generations_and_one_scoring_pass(retriever):
    llm = ScriptedLLM()
    qs = _questions()
    preds = build("reconnect", llm=llm, retriever=retriever).run_batch(qs)
    # one batched LLM call per stage (+ the sampled calls of repeating subsets)
    assert llm.calls == _expected_calls(preds)
    for q, p in zip(qs, preds):
        assert _stages(p) == ["query_expansion", "retrieval", "sampling"] + ["knowledge_extraction"] * 3 + [
            "knowledge_aggregation", "answer"]
        assert (p.cost.generations, p.cost.scoring_passes, p.cost.llm_calls) == (5, 1, 6)
        gen_tokens = sum(t["generated_tokens"] for t in p.trace if t["type"] == "generate")
        assert p.cost.generated_tokens == gen_tokens
        assert ReConnectConfig().generations_per_question == 5


def test_reconnect_stage_prompts_and_parsing(retriever):
    llm = ScriptedLLM(n_explanations=7)
    q = _questions()[1]  # 4 choices -> at most 4 explanation queries
    p = build("reconnect", llm=llm, retriever=retriever, top_n=3, subset_size=2, num_subsets=3).run(q)
    qe = _gen_entries(p, "query_expansion")[0]
    assert qe["prompt"][-1] == {"role": "assistant", "content": "Explanations:\n*"}
    assert "a question and 4 options" in qe["prompt"][0]["content"]
    # first paragraph only, bullets stripped, k = number of choices
    assert qe["parsed"] == [f"reason {i} about {c}" for i, c in enumerate(q.choices, 1)]
    ret = p.trace[1]
    assert ret["queries"] == qe["parsed"] + [q.question]
    assert len(ret["results"]) == 5 and all(len(r) == 3 for r in ret["results"])
    # pooled in query order, duplicates removed, first occurrence kept
    pool = []
    for r in ret["results"]:
        pool += [i for i in r if i not in pool]
    assert ret["pool"] == pool == [x.id for x in p.passages]
    assert len({x.text for x in p.passages}) == len(p.passages)
    subsets = p.trace[2]["subsets"]
    assert len(subsets) == 3
    for s in subsets:
        assert len(s) == min(2, len(pool)) and len(set(s)) == len(s) and set(s) <= set(pool)
    by_id = {x.id: x.text for x in p.passages}
    exts = _gen_entries(p, "knowledge_extraction")
    for s, e in zip(subsets, exts):
        system = e["prompt"][0]["content"]
        assert system.startswith("External knowledge references:\n" +
                                 "\n".join(f"* {by_id[i]}" for i in s) + "\n\n")
        assert e["parsed"] == [f"from: {by_id[i]}" for i in s]
    agg = _gen_entries(p, "knowledge_aggregation")[0]
    items = [" ".join(e["parsed"]) for e in exts]
    assert agg["prompt"][0]["content"].startswith("A list of explanations:\n" + "\n".join(f"* {x}" for x in items))
    assert agg["prompt"][-1]["content"] == "Aggregated Explanation:\n*"
    assert agg["parsed"] == [f"merged 3 items: {items[0]}", "second line of the merge"]
    assert p.knowledge == agg["parsed"]
    ans = p.trace[-1]
    assert ans["type"] == "score" and ans["labels"] == q.labels
    assert "Explanations:\n* merged 3 items" in ans["prompt"][2]["content"]


@pytest.mark.parametrize("N", [1, 2, 3, 5])
def test_reconnect_cost_per_question_for_n_subsets(retriever, N):
    llm = ScriptedLLM()
    preds = build("reconnect", llm=llm, retriever=retriever, num_subsets=N).run_batch(_questions()[:3])
    for p in preds:
        assert p.cost.generations == N + 2 and p.cost.scoring_passes == 1 and p.cost.llm_calls == N + 3
        assert len(_gen_entries(p, "knowledge_extraction")) == N
    ext_rows = sum(rows for kind, rows in llm.calls[1:-2] if kind == "generate")
    assert ext_rows == 3 * N


def test_reconnect_without_explanation_retrieval(retriever):
    llm = ScriptedLLM()
    p = build("reconnect", llm=llm, retriever=retriever, ablation="w/o ER").run(_questions()[0])
    assert "query_expansion" not in _stages(p)
    assert p.trace[0]["queries"] == ["What do plants need to grow?"]
    # the question retrieves top_n * (choices + 1) = 5 * 4 passages: a pool as large as with ER
    assert p.trace[0]["top_n"] == 20 and len(p.trace[0]["results"][0]) == 20
    assert len(p.passages) == 20 and not _repeats(p)
    assert p.cost.generations == 4 and p.cost.llm_calls == 5 == ReConnectConfig(**ABLATIONS["w/o ER"]).llm_calls_per_question
    assert llm.calls == [("generate", 3), ("generate", 1), ("score", 1)]


def test_reconnect_max_queries(retriever):
    q = _questions()[1]
    p = build("reconnect", llm=ScriptedLLM(), retriever=retriever, max_queries=1).run(q)
    exps = _gen_entries(p, "query_expansion")[0]["parsed"]
    assert len(exps) == 1 and p.trace[1]["queries"] == [*exps, q.question]
    default = build("reconnect", llm=ScriptedLLM(), retriever=retriever).run(q)
    assert len(_gen_entries(default, "query_expansion")[0]["parsed"]) > 1  # the cap did cut


def test_reconnect_without_knowledge_connection(retriever):
    """w/o KC (= w/o KE, KA, Tables 3 and 7): no sampling, extraction or
    aggregation; the answer reads every pooled passage (2 LLM calls)."""
    llm = ScriptedLLM()
    p = build("reconnect", llm=llm, retriever=retriever, ablation="w/o KC").run(_questions()[1])
    assert _stages(p) == ["query_expansion", "retrieval", "answer"]
    assert len(p.passages) > 5 and p.knowledge == [x.text for x in p.passages]
    assert p.cost.generations == 1 and p.cost.llm_calls == 2 == ReConnectConfig(**ABLATIONS["w/o KC"]).llm_calls_per_question
    assert llm.calls == [("generate", 1), ("score", 1)]


def test_reconnect_without_extraction_aggregates_the_passages(retriever):
    """w/o KE: no sampling, no extraction; one aggregation over every pooled
    passage (3 LLM calls)."""
    p = build("reconnect", llm=ScriptedLLM(), retriever=retriever, ablation="wo_ke").run(_questions()[0])
    assert _stages(p) == ["query_expansion", "retrieval", "knowledge_aggregation", "answer"]
    pool = [x.text for x in p.passages]
    assert len(pool) > 5
    agg = _gen_entries(p, "knowledge_aggregation")[0]
    assert agg["prompt"][0]["content"].startswith("A list of explanations:\n" + "\n".join(f"* {t}" for t in pool)
                                                  + "\n\n")
    assert p.cost.generations == 2 and p.cost.llm_calls == 3 == ReConnectConfig(**ABLATIONS["w/o KE"]).llm_calls_per_question


def test_reconnect_without_aggregation_answers_with_the_n_extractions(retriever):
    """w/o KA: the N extraction outputs are the N items of the knowledge
    list (each output's explanations joined), as the answering step sees them."""
    for n in (3, 5):
        p = build("reconnect", llm=ScriptedLLM(), retriever=retriever, ablation=["w/o KA"],
                  num_subsets=n).run(_questions()[0])
        assert "knowledge_aggregation" not in _stages(p)
        ext = _gen_entries(p, "knowledge_extraction")
        assert len(ext) == n and all(len(e["parsed"]) >= 1 for e in ext)
        assert any(len(e["parsed"]) >= 2 for e in ext)  # items really are whole extractions, not bullets
        assert p.knowledge == [" ".join(e["parsed"]) for e in ext]
        ans = p.trace[-1]["prompt"][2]["content"]
        assert ans.endswith("Explanations:\n" + "\n".join(f"* {t}" for t in p.knowledge))
        assert p.cost.generations == 1 + n


def test_reconnect_without_extraction_and_aggregation_answers_with_passages(retriever):
    """w/o KE, KA is w/o KC: the answer reads every pooled passage."""
    for abl in (["w/o KE", "w/o KA"], "w/o KE, KA"):
        pipe = build("reconnect", llm=ScriptedLLM(), retriever=retriever, ablation=abl)
        kc_pipe = build("reconnect", llm=ScriptedLLM(), retriever=retriever, ablation="w/o KC")
        p, kc = pipe.run(_questions()[0]), kc_pipe.run(_questions()[0])
        assert _stages(p) == ["query_expansion", "retrieval", "answer"]
        assert p.knowledge == [x.text for x in p.passages] and p.cost.generations == 1
        assert pipe.config == kc_pipe.config and pipe.config.knowledge_connection is False
        assert p.to_dict() == kc.to_dict()


def test_ablation_names():
    assert set(ABLATIONS) == {"w/o ER", "w/o KC", "w/o ER, KC", "w/o KE", "w/o KA", "w/o KE, KA"}
    with pytest.raises(ValueError, match="ablation"):
        build("reconnect", llm=ScriptedLLM(), retriever=InMemoryRetriever(HashEncoder(), FACTS), ablation="w/o X")
    with pytest.raises(ValueError, match="ablation"):
        build("vanilla", llm=ScriptedLLM(), ablation="w/o KC")


def _subsets(pred: Prediction) -> list[list[str]]:
    return next(t for t in pred.trace if t["stage"] == "sampling")["subsets"]


@pytest.mark.parametrize("strategy", ["relevance", "random", "topk", "mmr", "cluster"])
def test_reconnect_sampling_strategies(retriever, strategy):
    qs = _questions()
    preds = build("reconnect", llm=ScriptedLLM(), retriever=retriever, sampling=strategy, subset_size=3,
                  num_subsets=4).run_batch(qs)
    for q, p in zip(qs, preds):
        subs = _subsets(p)
        pool = [x.id for x in p.passages]
        assert len(subs) == 4
        for s in subs:
            assert len(s) == min(3, len(pool)) and len(set(s)) == len(s) and set(s) <= set(pool)
        if strategy == "topk":
            emb = HashEncoder()
            qv = emb.encode_queries([q.question])[0]
            pv = emb.encode_passages([x.text for x in p.passages])
            best = [pool[j] for j in np.argsort(-(pv @ qv), kind="stable")[:3]]
            assert all(sorted(s) == sorted(best) for s in subs)


def test_relevance_subsets_follow_the_seed(retriever):
    qs = _questions()
    a = build("reconnect", llm=ScriptedLLM(), retriever=retriever, seed=1).run_batch(qs)
    b = build("reconnect", llm=ScriptedLLM(), retriever=retriever, seed=1).run_batch(qs)
    c = build("reconnect", llm=ScriptedLLM(), retriever=retriever, seed=2).run_batch(qs)
    assert [_subsets(p) for p in a] == [_subsets(p) for p in b]
    assert [_subsets(p) for p in a] != [_subsets(p) for p in c]


class ScaledHashEncoder(HashEncoder):
    """HashEncoder vectors times a per-text factor in [1, 9]: norms differ,
    so normalising changes the sampler's scores."""

    def _enc(self, texts):
        v = super()._enc(texts)
        return v * np.array([[1.0 + question_key(t) % 9] for t in texts], np.float32).reshape(-1, 1)


def test_sampler_input_setting_is_used():
    """The subsets equal a direct sampler call on the stored (un-normalised)
    vectors with sampler_input="stored" and on L2-normalised ones with
    "normalized"; the two differ, so ignoring the setting fails."""
    from rcn_fast.sampling import sample

    r = InMemoryRetriever(ScaledHashEncoder(), FACTS, ids=[f"f{i:02d}" for i in range(len(FACTS))])
    assert np.ptp(np.linalg.norm(r.embeddings, axis=1)) > 1.0
    qs = _questions()
    cfg = dict(subset_size=3, num_subsets=3, tau=1.0, score_scale=1.0, seed=5)
    got = {mode: build("reconnect", llm=ScriptedLLM(), retriever=r, sampler_input=mode, **cfg).run_batch(qs)
           for mode in ("stored", "normalized")}
    differ = 0
    for i, q in enumerate(qs):
        pool = got["stored"][i].passages
        assert [x.id for x in pool] == [x.id for x in got["normalized"][i].passages]
        qv = r.embed_queries([q.question])[None, 0]
        cand = r.passage_embeddings(pool)[None]
        want = {}
        for mode, (qq, cc) in {"stored": (qv, cand),
                               "normalized": (qv / np.linalg.norm(qv, axis=-1, keepdims=True),
                                              cand / np.linalg.norm(cand, axis=-1, keepdims=True))}.items():
            ids = np.asarray(sample("relevance", qq.astype(np.float32), cc.astype(np.float32), 3, 3, seed=5,
                                    keys=np.array([question_key(q.id)], np.int64), valid=np.array([len(pool)]),
                                    tau=1.0))
            want[mode] = [[pool[j].id for j in row if j >= 0] for row in ids[0]]
            assert _subsets(got[mode][i]) == want[mode], (q.id, mode)
        differ += want["stored"] != want["normalized"]
    assert differ >= 2  # the setting matters for these vectors


def test_question_key_is_stable():
    """Pinned values: a question's sampling key (and so its subsets and any
    checkpoint built on them) must not change between processes, Python
    versions or releases (blake2b-64 of the UTF-8 id, shifted to 63 bits);
    Python's salted hash() would fail this in another process."""
    assert question_key("q1") == 3765133564748579315
    assert question_key("q2") == 3824209352269958837
    assert question_key("anything") == 8791747368118169728
    assert question_key("\u00e9") == 1697006002183834981
    assert 0 <= question_key("anything") < 2**63


# ---------------------------------------------------------------- batching invariance
def _same(a: Prediction, b: Prediction) -> None:
    """Equal predictions; passage scores (informational) may differ in the
    last float bit, since the search kernel blocks queries by batch."""
    assert_same_prediction(a, b)


@pytest.mark.parametrize("name", ["vanilla", "single_retrieval", "reconnect"])
def test_predictions_do_not_depend_on_the_batch(retriever, name):
    qs = _questions()
    r = retriever if name != "vanilla" else None
    batched = build(name, llm=ScriptedLLM(), retriever=r).run_batch(qs)
    one_by_one = [build(name, llm=ScriptedLLM(), retriever=r).run(q) for q in qs]
    reordered = build(name, llm=ScriptedLLM(), retriever=r).run_batch(qs[::-1])[::-1]
    llm = ScriptedLLM()
    chunked = build(name, llm=llm, retriever=r, batch_size=2).run_batch(qs)
    for a, b, c, d in zip(batched, one_by_one, reordered, chunked):
        _same(a, b)
        _same(a, c)
        _same(a, d)
    if name == "reconnect":  # one call per stage and batch (+ sampled calls of repeating subsets)
        assert llm.calls == [c for s in (0, 2, 4) for c in _expected_calls(batched[s : s + 2])]
    else:
        assert len(llm.calls) == 3  # batches of 2, 2, 1


def test_generation_settings_reach_the_llm(retriever):
    llm = ScriptedLLM()
    build("reconnect", llm=llm, retriever=retriever, max_new_tokens=7, seed=3,
          repeat_decoding="greedy").run(_questions()[0])
    assert all(k == dict(max_new_tokens=7, temperature=0.0, seed=3) for k in llm.gen_kwargs)


def test_prediction_round_trips_through_json(retriever):
    p = build("reconnect", llm=ScriptedLLM(), retriever=retriever).run(_questions()[0])
    d = json.loads(json.dumps(p.to_dict()))
    assert Prediction.from_dict(d).to_dict() == p.to_dict()
    assert score(_questions()[0], p) == {"acc": float(p.pred == 0)}  # correctness: the task's scoring


# ---------------------------------------------------------------- the real Retriever (corpus store)
def test_reconnect_over_a_corpus_store(tmp_path):
    """The rcn_fast Retriever path: passage embeddings come from the store."""
    from rcn_fast.retrieval import BuildConfig, Retriever, build_corpus

    src = tmp_path / "facts.jsonl"
    src.write_text("".join(json.dumps({"id": f"f{i:02d}", "text": t}) + "\n" for i, t in enumerate(FACTS)))
    enc = HashEncoder()
    build_corpus(BuildConfig(input=str(src), out=str(tmp_path / "store"), dtype="float32"), enc, show_progress=False)
    store_r = Retriever.load(tmp_path / "store", encoder=enc, check=False)
    mem_r = InMemoryRetriever(enc, FACTS, ids=[f"f{i:02d}" for i in range(len(FACTS))])
    qs = _questions()
    a = build("reconnect", llm=ScriptedLLM(), retriever=store_r).run_batch(qs)
    b = build("reconnect", llm=ScriptedLLM(), retriever=mem_r).run_batch(qs)
    for x, y in zip(a, b):
        assert [t for t in x.trace if t["type"] != "retrieve"] == [t for t in y.trace if t["type"] != "retrieve"]
        assert x.pred == y.pred and x.knowledge == y.knowledge


def test_text_only_retriever_allows_random_sampling_only():
    class TextOnly:
        def __init__(self):
            self.inner = InMemoryRetriever(HashEncoder(), FACTS)

        def retrieve(self, queries, k=5):
            return self.inner.retrieve(queries, k)

    with pytest.raises(TypeError, match="retriever: sampling='relevance' needs embeddings"):
        build("reconnect", llm=ScriptedLLM(), retriever=TextOnly())
    p = build("reconnect", llm=ScriptedLLM(), retriever=TextOnly(), sampling="random").run(_questions()[0])
    assert p.cost.generations == 5 and len(_subsets(p)) == 3
    p = build("single_retrieval", llm=ScriptedLLM(), retriever=TextOnly()).run(_questions()[0])
    assert len(p.knowledge) == 5


def test_empty_corpus_still_answers():
    r = InMemoryRetriever(HashEncoder(), [])
    p = build("reconnect", llm=ScriptedLLM(), retriever=r).run(_questions()[0])
    assert p.passages == [] and _subsets(p) == [[], [], []]
    assert p.cost.generations == 5 and 0 <= p.pred < 3


# ---------------------------------------------------------------- configs and errors
def test_configs_round_trip_through_json_and_yaml(tmp_path, retriever):
    p = build("reconnect", llm=ScriptedLLM(), retriever=retriever, num_subsets=5, tau=0.05,
              sampling="mmr", ablation="w/o KA")
    cfg = p.config
    assert (cfg.num_subsets, cfg.tau, cfg.sampling, cfg.knowledge_aggregation) == (5, 0.05, "mmr", False)
    (tmp_path / "c.json").write_text(cfg.to_json())
    (tmp_path / "c.yaml").write_text(cfg.to_yaml())
    assert load_config(tmp_path / "c.json") == cfg == load_config(tmp_path / "c.yaml")
    assert config_from_dict(json.loads(cfg.to_json())) == cfg
    assert p.describe()["config"]["pipeline"] == "reconnect"
    again = build("reconnect", llm=ScriptedLLM(), retriever=retriever, config=json.loads(cfg.to_json()))
    assert again.config == cfg


@pytest.mark.parametrize("bad, match", [
    (dict(num_subsets=0), "num_subsets"), (dict(tau=0), "tau"), (dict(sampling="greedy"), "sampling"),
    (dict(top_n=True), "top_n"), (dict(knowledge_extraction="no"), "knowledge_extraction"),
    (dict(sampler_input="raw"), "sampler_input"), (dict(not_a_setting=1), "not_a_setting"),
    (dict(max_new_tokens=0), "max_new_tokens"), (dict(max_queries=-1), "max_queries"),
    (dict(max_queries=0), r"max_queries: .*got 0; to retrieve with the question only, set explanation_retrieval=False"),
])
def test_bad_settings_name_the_argument(retriever, bad, match):
    with pytest.raises((ValueError, TypeError), match=match):
        build("reconnect", llm=ScriptedLLM(), retriever=retriever, **bad)


def test_build_errors(retriever):
    with pytest.raises(ValueError, match="name"):
        build("no_such_pipeline", llm=ScriptedLLM())
    with pytest.raises(TypeError, match="llm"):
        build("vanilla", llm="not a model")
    with pytest.raises(TypeError, match="retriever"):
        build("reconnect", llm=ScriptedLLM())
    with pytest.raises(TypeError, match="retriever"):
        build("single_retrieval", llm=ScriptedLLM(), retriever=object())
    p = build("vanilla", llm=ScriptedLLM())
    with pytest.raises(ValueError, match="duplicate question id"):
        p.run_batch([_questions()[0], _questions()[0]])
    with pytest.raises(TypeError, match="questions"):
        p.run_batch(_questions()[0])
    with pytest.raises(TypeError, match=r"questions\[1\]"):
        p.run_batch([_questions()[0], "text"])
    assert p.run_batch([]) == []


def test_user_prompt_file_changes_the_prompts(tmp_path, retriever):
    f = tmp_path / "prompts.yaml"
    f.write_text("answer:\n  prefill: 'The answer is '\nacknowledge: 'Ready.'\n")
    p = build("vanilla", llm=ScriptedLLM(), prompts=str(f))
    assert p.config.prompts == str(f)
    chat = p.run(_questions()[0]).trace[0]["prompt"]
    # the answer turn's trailing white space is answer_render's, the same for every pipeline (issue 54)
    assert chat[-1]["content"] == "The answer is" and chat[1]["content"] == "Ready."
    spaced = build("vanilla", llm=ScriptedLLM(), prompts=str(f), answer_render="trailing_space")
    assert spaced.run(_questions()[0]).trace[0]["prompt"][-1]["content"] == "The answer is "
    # the other stages keep the defaults
    assert stage_of(chat) == "answer"


def test_rerun_through_the_call_cache_gives_the_same_predictions_and_cost(tmp_path, retriever):
    from rcn_fast.llm import CachedLLM, CallCache

    qs = _questions()
    first = build("reconnect", llm=CachedLLM(ScriptedLLM(), CallCache(tmp_path / "c.sqlite")),
                  retriever=retriever).run_batch(qs)
    inner = ScriptedLLM()
    again = build("reconnect", llm=CachedLLM(inner, CallCache(tmp_path / "c.sqlite")),
                  retriever=retriever).run_batch(qs)
    assert inner.calls == []  # everything came from the cache
    for a, b in zip(first, again):
        assert a.pred == b.pred and a.knowledge == b.knowledge and a.choice_logprobs == b.choice_logprobs
        assert b.cost.cached_calls == b.cost.llm_calls == 6 and a.cost.cached_calls == 0
        assert (a.cost.prompt_tokens, a.cost.generated_tokens) == (b.cost.prompt_tokens, b.cost.generated_tokens)


def test_retriever_with_an_encoder_but_no_embedding_search(retriever):
    """retrieve(queries, k) + .encoder: passages are re-encoded for the sampler,
    which then draws the same subsets as with stored embeddings."""

    class ByText:
        def __init__(self, inner):
            self.inner, self.encoder = inner, inner.encoder

        def retrieve(self, queries, k=5):
            return self.inner.retrieve(queries, k)

    qs = _questions()
    a = build("reconnect", llm=ScriptedLLM(), retriever=ByText(retriever)).run_batch(qs)
    b = build("reconnect", llm=ScriptedLLM(), retriever=retriever).run_batch(qs)
    assert [_subsets(p) for p in a] == [_subsets(p) for p in b]
    assert [p.pred for p in a] == [p.pred for p in b]
