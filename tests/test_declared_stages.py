"""Pipelines as declared stages (issue 28, item 1): each pipeline class
carries one frozen PipelineSpec; ReConnect is a list of stage objects with
a typed state, its ablations and connect() are edits of that list, and its
cost follows from the list. A researcher adds a stage by writing one class
and a pipeline by listing stages: both run through the eval command with
no edit under rcn_fast/eval."""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass
from typing import Any, ClassVar

import pytest

from rcn_fast.connection import connect
from rcn_fast.data import MCQuestion
from rcn_fast.pipelines import (
    CONFIGS,
    PIPELINES,
    InMemoryRetriever,
    PipelineSpec,
    ReConnect,
    ReConnectConfig,
    Stage,
    StagedPipeline,
    build,
    insert_stage,
    register,
)
from rcn_fast.pipelines.base import Answer, QuestionState
from rcn_fast.pipelines.config import PipelineConfig
from rcn_fast.pipelines.knowledge import as_embedding_retriever, retrieve_batch
from rcn_fast.pipelines.reconnect_stages import ReConnectState
from tests.pipelines.doubles import FACTS, HashEncoder, ScriptedLLM


# ------------------------------------------------------------ the toy stage: one class
class SecondOpinion(Stage):
    """One generation per question asking the LLM to check the connected
    explanation; its output joins the knowledge the answer sees."""

    name = "second_opinion"
    reads = ("question", "knowledge")
    writes = ("knowledge", "trace")

    def llm_calls_per_question(self, config: Any) -> int:
        return 1

    def run(self, states: list[QuestionState], runner: Any) -> None:
        chats = [[[{"role": "user", "content": f"Check: {st.question.question}\n" + "\n".join(st.knowledge)}]]
                 for st in states]
        for st, out in zip(states, runner.generate("second_opinion", states, chats)):
            st.knowledge = [*st.knowledge, f"second opinion: {out[0].strip()}"]


@dataclass
class CheckedConfig(ReConnectConfig):
    name: ClassVar[str] = "checked_reconnect"


class CheckedReConnect(ReConnect):
    """ReConnect with a toy stage before the answer: the whole definition."""

    name = "checked_reconnect"
    config_class = CheckedConfig
    spec = ReConnect.spec.with_stages(insert_stage(ReConnect.spec.stages, SecondOpinion(), before="answer"))


# ------------------------------------------------------------ the toy pipeline: a state, a stage, a list
@dataclass
class FirstPassageState(QuestionState):
    query: str = ""


class QuestionSearch(Stage):
    """Retrieve ``top_n`` passages for the question text; they are the knowledge."""

    name = "question_search"
    reads = ("question",)
    writes = ("query", "passages", "knowledge", "trace")

    def run(self, states: list[FirstPassageState], runner: Any) -> None:  # type: ignore[override]
        pipe = runner.pipeline
        for st in states:
            st.query = st.question.question
        results, _ = retrieve_batch(as_embedding_retriever(pipe.retriever), [st.query for st in states],
                                    pipe.config.top_n)
        for st, res in zip(states, results):
            st.passages, st.knowledge = list(res), [p.text for p in res]
            st.trace.append({"stage": self.name, "type": "retrieve", "queries": [st.query],
                             "results": [[p.id for p in res]]})


@dataclass
class SearchAnswerConfig(PipelineConfig):
    name: ClassVar[str] = "search_answer"
    top_n: int = 1


class SearchAnswer(StagedPipeline):
    name = "search_answer"
    config_class = SearchAnswerConfig
    state_class = FirstPassageState
    spec = PipelineSpec(retrieves="corpus", stages=(QuestionSearch(), Answer()))


@pytest.fixture
def registered():
    for cls in (CheckedReConnect, SearchAnswer):
        register(cls)
    yield
    for name in ("checked_reconnect", "search_answer"):
        PIPELINES.pop(name, None)
        CONFIGS.pop(name, None)


def _questions() -> list[MCQuestion]:
    return [MCQuestion("q1", "What do plants need to grow?", ["sunlight", "darkness", "salt"], answer=0),
            MCQuestion("q2", "What does a magnet attract?", ["iron", "wood", "water"], answer=0)]


def _retriever() -> InMemoryRetriever:
    return InMemoryRetriever(HashEncoder(), FACTS, ids=[f"f{i:02d}" for i in range(len(FACTS))])


# ------------------------------------------------------------ the spec and the stage list
def test_every_builtin_pipeline_carries_one_frozen_spec():
    for name, cls in PIPELINES.items():
        assert isinstance(cls.spec, PipelineSpec), name
        with pytest.raises(dataclasses.FrozenInstanceError):
            cls.spec.retrieves = "none"  # type: ignore[misc]
        for loose in ("retriever_kind", "needs_retriever", "answers_open", "needs_llm", "usage_note",
                      "component_args", "uses_retrieval", "uses_knowledge", "on_stage"):
            assert not hasattr(cls, loose), (name, loose)


def test_reconnect_is_its_stage_list_with_a_typed_state():
    assert [type(s).__name__ for s in ReConnect.spec.stages] == [
        "QueryExpansion", "ExplanationRetrieval", "RelevanceSampling", "KnowledgeExtraction",
        "KnowledgeAggregation", "AnswerScoring"]
    fields = {f.name for f in dataclasses.fields(ReConnectState)}
    from rcn_fast.pipelines import reconnect_stages as mod

    stage_classes = [c for c in vars(mod).values() if isinstance(c, type) and issubclass(c, Stage) and c is not Stage]
    assert len(stage_classes) >= 10
    for cls in stage_classes:
        assert set(cls.reads) | set(cls.writes) <= fields, cls.__name__
    st = ReConnectState(_questions()[0])
    assert st.explanations == [] and st.subsets == [] and st.extractions == [] and st.query_embedding is None


ABLATION_LISTS = [
    (None, ["query_expansion", "retrieval", "sampling", "knowledge_extraction", "knowledge_aggregation", "answer"]),
    ("w/o ER", ["retrieval", "sampling", "knowledge_extraction", "knowledge_aggregation", "answer"]),
    ("w/o KC", ["query_expansion", "retrieval", "passages_as_knowledge", "answer"]),
    ("w/o KE", ["query_expansion", "retrieval", "knowledge_aggregation", "answer"]),
    ("w/o KA", ["query_expansion", "retrieval", "sampling", "knowledge_extraction", "extractions_as_knowledge",
                "answer"]),
    ("w/o ER, KC", ["retrieval", "passages_as_knowledge", "answer"]),
]


@pytest.mark.parametrize("ablation,names", ABLATION_LISTS, ids=[str(a) for a, _ in ABLATION_LISTS])
def test_each_ablation_is_a_list_edit_and_its_cost_follows_from_the_list(ablation, names):
    p = build("reconnect", llm=ScriptedLLM(), retriever=_retriever(), ablation=ablation, num_subsets=4)
    assert [s.name for s in p.stages] == names
    calls = sum(s.llm_calls_per_question(p.config) for s in p.stages)
    assert calls == p.config.llm_calls_per_question
    assert p.calls_per_question()["multiple_choice"] == {"generations": calls - 1, "scoring_passes": 1}
    preds = p.run_batch(_questions())
    assert all(pr.cost.llm_calls == calls for pr in preds)


def test_connect_is_the_list_with_a_given_pool_stage():
    from rcn_fast.connection import GivenPool, _Connector

    pipe = _Connector(ScriptedLLM(), ReConnectConfig(), retriever=_retriever(), prompts=None, answer=True,
                      given={"q1": []})
    assert [type(s).__name__ for s in pipe.stages] == [
        "GivenPool", "RelevanceSampling", "KnowledgeExtraction", "KnowledgeAggregation", "KeepConnection",
        "AnswerScoring"]
    assert isinstance(pipe.stages[0], GivenPool) and pipe.stages[0].name == "retrieval"
    out = connect(_questions(), llm=ScriptedLLM(), passages=[FACTS[:6], FACTS[6:12]], encoder=HashEncoder())
    assert all(c.trace[0]["type"] == "retrieve" and c.trace[0]["source"] == "given" and len(c.extractions) == 3
               for c in out)


def test_a_toy_stage_inserted_into_reconnect_runs_and_is_counted():
    llm = ScriptedLLM()
    p = CheckedReConnect(llm, CheckedConfig(num_subsets=2), retriever=_retriever())
    assert [s.name for s in p.stages][-2:] == ["second_opinion", "answer"]
    assert p.calls_per_question()["multiple_choice"] == {"generations": 5, "scoring_passes": 1}
    preds = p.run_batch(_questions())
    for pr in preds:
        stages = [t["stage"] for t in pr.trace]
        assert stages[-2:] == ["second_opinion", "answer"] and pr.cost.llm_calls == 6
        assert pr.knowledge[-1].startswith("second opinion: ")
        assert any("second opinion: " in t["content"] for t in pr.trace[-1]["prompt"])  # the answer saw it
    # its ablations are the same list edits
    q = CheckedReConnect(llm, CheckedConfig(knowledge_connection=False), retriever=_retriever())
    assert [s.name for s in q.stages] == ["query_expansion", "retrieval", "passages_as_knowledge", "second_opinion",
                                          "answer"]


def test_progress_bars_come_from_the_stage_list():
    from types import SimpleNamespace

    from rcn_fast.eval.report.progress import StageBars

    p = build("reconnect", llm=ScriptedLLM(), retriever=_retriever(), ablation="w/o KA")
    qs = _questions()
    unit = SimpleNamespace(pending=qs, questions=qs, pipeline=p.name, display=p.name, seed=0,
                           task=SimpleNamespace(name="mini"))
    bars = StageBars(unit, p)
    llm_stages = ["query_expansion", "knowledge_extraction", "answer"]  # w/o KA: no aggregation call
    try:
        assert list(bars.bars) == llm_stages  # drawn up front, in order
        p.run_batch(qs)
    finally:
        bars.close()
    assert {name: bar.n for name, bar in bars.bars.items()} == {s: 2 for s in llm_stages}


# ------------------------------------------------------------ both toys through the eval command
@pytest.fixture(scope="module")
def tiny_dirs(tmp_path_factory):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    os.environ["HF_HUB_OFFLINE"] = "1"
    from tests.pipelines.tiny import make_tiny_llama
    from tests.retrieval.tiny import make_tiny_bert

    root = tmp_path_factory.mktemp("declared")
    return make_tiny_llama(root / "m"), make_tiny_bert(root / "bert")


def test_both_toys_run_through_the_eval_command(tmp_path, registered, tiny_dirs, capsys):
    from rcn_fast.eval.cli import main
    from tests.test_eval import write_corpus, write_questions

    model, bert = tiny_dirs
    q = write_questions(tmp_path / "mini.jsonl", n=2)
    corpus = write_corpus(tmp_path / "facts.jsonl", n=12)
    out = tmp_path / "out"
    rc = main(["--model", str(model), "--model-args", "dtype=float32", "--device", "cpu",
               "--tasks", str(q), "--corpus", str(corpus), "--encoder", str(bert),
               "--pipelines", "checked_reconnect", "search_answer", "--pipeline-args", "max_new_tokens=4",
               "checked_reconnect.num_subsets=2", "search_answer.top_n=2", "--output-path", str(out),
               "--log-samples", "--no-plot", "--no-progress"])
    assert rc == 0, capsys.readouterr().err
    doc = json.loads(sorted(out.glob("results_*.json"))[-1].read_text())
    res = doc["results"]["mini"]
    assert res["checked_reconnect"]["n"] == 2 and res["checked_reconnect"]["llm_calls_per_q"] == 6
    assert res["search_answer"]["n"] == 2 and res["search_answer"]["llm_calls_per_q"] == 1
    checked = [json.loads(x) for x in next(out.glob("samples_mini_checked_reconnect_*.jsonl")).read_text().splitlines()]
    assert all([t["stage"] for t in s["trace"]][-2:] == ["second_opinion", "answer"] for s in checked)
    searched = [json.loads(x) for x in next(out.glob("samples_mini_search_answer_*.jsonl")).read_text().splitlines()]
    assert all(len(s["passages"]) == 2 and s["trace"][0]["stage"] == "question_search" for s in searched)


def test_declared_stage_lists_read_and_write_their_state_fields():
    """vanilla, single_retrieval, zebra and ReConnect are stage lists; every
    stage names fields of its pipeline's typed state."""
    declared = {n: c for n, c in PIPELINES.items() if any(isinstance(s, Stage) for s in c.spec.stages)}
    assert set(declared) == set(PIPELINES) - {"septa"}  # SEPTA names its two steps (no LLM, its own runner)
    assert [s.name for s in PIPELINES["activerag"].spec.stages] == [
        "retrieval", "rag_cot", "knowledge_construction", "cognitive_nexus", "answer"]
    assert [s.name for s in PIPELINES["rr"].spec.stages] == ["rr_reasoning", "faithfulness", "answer"]
    assert [s.name for s in PIPELINES["zebra"].spec.stages] == ["example_retrieval", "example_generation", "answer"]
    for name, cls in declared.items():
        fields = {f.name for f in dataclasses.fields(cls.state_class)}
        for s in cls.spec.stages:
            assert set(s.reads) | set(s.writes) <= fields, (name, s.name)


def test_a_subclass_overriding_knowledge_stages_runs_it_instead_of_the_list():
    """The older way to write a pipeline keeps working: a class that
    overrides knowledge_stages runs it, then its answer stage."""
    from rcn_fast.pipelines import Vanilla

    class Noted(Vanilla):
        name = "noted"

        def knowledge_stages(self, states, runner):
            for st in states:
                st.knowledge = ["noted"]

        def answer_stage(self, states, runner):
            return StagedPipeline.answer_stage(self, states, runner)

    p = Noted(ScriptedLLM())
    assert p.stages == [] and build("vanilla", llm=ScriptedLLM()).stages
    pr = p.run(_questions()[0])
    assert [t["stage"] for t in pr.trace] == ["answer"] and pr.knowledge == ["noted"]


def test_states_are_typed_not_string_keyed():
    """No pipeline shares an untyped ``data`` dict: each has a state class."""
    assert "data" not in {f.name for f in dataclasses.fields(QuestionState)}
    want = {"reconnect": {"explanations", "subsets", "extractions", "query_embedding"}, "zebra": {"examples"},
            "rr": {"paths", "pred"}, "self_consistency": {"paths", "pred"}, "rag_vanilla": {"final"},
            "activerag": {"final", "cot", "passages_text", "construction"}}
    for name, fields in want.items():
        assert fields <= {f.name for f in dataclasses.fields(PIPELINES[name].state_class)}, name


@pytest.mark.parametrize("agent", ["associate", "note", "passage", "all"])
def test_activerag_cost_follows_from_its_stage_list(agent):
    """ActiveRAG's list declares what a question costs: one scoring pass per
    reported agent (four for ``"all"``), and a run costs exactly that."""
    p = build("activerag", llm=ScriptedLLM(), retriever=_retriever(), agent=agent)
    declared = sum(s.llm_calls_per_question(p.config) for s in p.stages)
    mc = p.calls_per_question()["multiple_choice"]
    assert declared == mc["generations"] + mc["scoring_passes"]
    assert all(pr.cost.llm_calls == declared for pr in p.run_batch(_questions()))


def test_rag_baselines_cost_follows_from_their_stage_lists():
    from rcn_fast.pipelines.rag import RAGPipeline

    for name, cls in PIPELINES.items():
        if not issubclass(cls, RAGPipeline) or name == "activerag":
            continue
        p = build(name, llm=ScriptedLLM(), retriever=_retriever())
        mc = p.calls_per_question()["multiple_choice"]
        declared = sum(s.llm_calls_per_question(p.config) for s in p.stages)
        assert declared == mc["generations"] + mc["scoring_passes"], name
