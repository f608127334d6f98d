"""Every LLM call of a pipeline goes through its stage runner: observers
(the eval's progress bars among them) see RR's sampled reasoning and the
RAG pipelines' answer scoring, and the cost of a batch is counted once."""

from __future__ import annotations

import os
from types import SimpleNamespace

os.environ["HF_HUB_OFFLINE"] = "1"

import pytest  # noqa: E402

pytest.importorskip("pysbd")
pytest.importorskip("bm25s")

from rcn_fast.eval.report.progress import StageBars  # noqa: E402
from rcn_fast.pipelines import InMemoryRetriever, build  # noqa: E402
from rcn_fast.pipelines.base import StageObserver  # noqa: E402
from tests.pipelines.doubles import FACTS, HashEncoder  # noqa: E402
from tests.pipelines.rr_doubles import KeywordNLI, PathsLLM  # noqa: E402
from tests.test_pipelines_activerag import OQS, QS as RAG_QS, RAGDouble  # noqa: E402
from tests.test_pipelines_rr import QS as RR_QS, SCRIPT  # noqa: E402


class Recorder:
    def __init__(self) -> None:
        self.events: list[tuple] = []

    def stage_start(self, stage):
        self.events.append(("start", stage))

    def stage_done(self, stage, question_ids):
        self.events.append(("done", stage, list(question_ids)))

    def done(self):
        return [(e[1], e[2]) for e in self.events if e[0] == "done"]


@pytest.fixture(scope="module")
def retriever():
    return InMemoryRetriever(HashEncoder(), FACTS, ids=[f"f{i}" for i in range(len(FACTS))])


def _rr(kind):
    kw = dict(llm=PathsLLM(SCRIPT), num_paths=3, seed=0)
    if kind == "rr":
        kw.update(similarity_model="retriever", nli=KeywordNLI(),
                  retriever=InMemoryRetriever(HashEncoder(), FACTS, ids=[f"f{i}" for i in range(len(FACTS))]))
    return build(kind, **kw)


@pytest.mark.parametrize("kind", ["rr", "self_consistency"])
def test_observers_see_rr_reasoning_and_its_fallback(kind):
    p = _rr(kind)
    rec = Recorder()
    assert isinstance(rec, StageObserver)
    p.observers.append(rec)
    preds = p.run_batch(RR_QS)
    ids = [q.id for q in RR_QS]
    # one event pair per LLM call: the sampled reasoning of the batch, the fallback scoring of q-cold
    assert rec.events == [("start", "rr_reasoning"), ("done", "rr_reasoning", ids),
                          ("start", "answer"), ("done", "answer", ["q-cold"])]
    assert p.llm.calls[0][0] == "generate" and [c[0] for c in p.llm.calls] == ["generate", "score"]
    by = {x.question_id: x for x in preds}
    # the cost of each question is counted once, by the runner
    assert by["q-cold"].cost.llm_calls == 2 and by["q3"].cost.llm_calls == 1
    # the trace keeps each question's own reasoning stage (the yes/no prompt for the moon)
    assert by["q-moon"].trace[0]["stage"] == "rr_reasoning_yes_no" and by["q3"].trace[0]["stage"] == "rr_reasoning"
    assert by["q3"].trace[0]["num_examples"] == len(p.examples["rr_reasoning"])


@pytest.mark.parametrize("name, agent, stages, open_stages", [
    ("rag_vanilla", None, ["answer"], ["answer"]),  # open domain: the answer is generated
    ("cot", None, ["rag_cot", "answer"], ["rag_cot"]),  # open domain: the reasoning holds the answer
    ("activerag", "all", ["rag_cot", "knowledge_construction", "cognitive_nexus", "answer"],
     ["rag_cot", "knowledge_construction", "cognitive_nexus"]),
])
def test_observers_see_rag_generation_and_answer_scoring(name, agent, stages, open_stages, retriever):
    kw = {"agent": agent} if agent else {}
    if name != "cot":
        kw["retriever"] = retriever
    llm = RAGDouble()
    p = build(name, llm=llm, **kw)
    rec = Recorder()
    p.observers.append(rec)
    preds = p.run_batch(RAG_QS)
    ids = [q.id for q in RAG_QS]
    assert rec.done() == [(s, ids) for s in stages]
    assert len(rec.done()) == len(llm.calls)  # every LLM call is seen
    if agent == "all":  # 4 agents: 4 scoring rows per question, one call, counted once per row
        assert all(pr.cost.scoring_passes == 4 for pr in preds)
    rec2 = Recorder()
    p.observers[:] = [rec2]
    p.run_batch(OQS)
    assert rec2.done() == [(s, [q.id for q in OQS]) for s in open_stages]


def _bars(p, questions):
    unit = SimpleNamespace(pending=list(questions), questions=list(questions), pipeline=p.name, display=p.name, seed=0,
                           task=SimpleNamespace(name="mini"))
    bars = StageBars(unit, p)
    try:
        p.run_batch(questions)
    finally:
        bars.close()
    return {stage: bar.n for stage, bar in bars.bars.items()}


def test_progress_bars_show_rr_and_rag_stages(retriever):
    assert _bars(_rr("rr"), RR_QS) == {"rr_reasoning": 4, "answer": 1}
    assert _bars(build("activerag", llm=RAGDouble(), retriever=retriever), RAG_QS) == {
        "rag_cot": 3, "knowledge_construction": 3, "cognitive_nexus": 3, "answer": 3}


# ------------------------------------------------------------ one registration
def test_a_new_pipeline_is_registered_once(monkeypatch, tmp_path):
    """A toy pipeline: its module (a config + a class) and one register()
    call make it buildable by name, loadable from a saved config and
    observable, with nothing else to edit."""
    from dataclasses import dataclass
    from typing import ClassVar

    from rcn_fast import pipelines
    from rcn_fast.pipelines import CONFIGS, PIPELINES, PipelineConfig, StagedPipeline, load_config

    @dataclass
    class EchoConfig(PipelineConfig):
        name: ClassVar[str] = "echo"
        repeat: int = 2

    class Echo(StagedPipeline):
        name = "echo"
        config_class = EchoConfig

        def knowledge_stages(self, states, runner):
            outs = runner.generate("echo", states, [[self.prompts.chat("answer", st.question)] * self.config.repeat
                                                    for st in states])
            for st, o in zip(states, outs):
                st.knowledge = o

    monkeypatch.setattr(pipelines, "PIPELINES", dict(PIPELINES))
    before = dict(CONFIGS)  # the config index is shared with rcn_fast.pipelines.config: restored below
    try:
        assert pipelines.register(Echo) is Echo
        assert pipelines.PIPELINES["echo"] is Echo and CONFIGS["echo"] is EchoConfig
        llm = RAGDouble()
        p = pipelines.build("echo", llm=llm, repeat=3)
        rec = Recorder()
        p.observers.append(rec)
        preds = p.run_batch(RAG_QS)
        assert [s for s, _ in rec.done()] == ["echo", "answer"]
        assert all(pr.cost.generations == 3 and pr.cost.scoring_passes == 1 for pr in preds)
        path = tmp_path / "echo.json"
        path.write_text(p.config.to_json())
        assert load_config(path) == EchoConfig(repeat=3)
        with pytest.raises(ValueError, match="non-empty str 'name'"):
            pipelines.register(type("Nameless", (StagedPipeline,), {"config_class": EchoConfig}))
    finally:
        CONFIGS.clear()
        CONFIGS.update(before)
