"""A new pipeline is one module and one ``register`` call (issue 18): the
eval command runs it from what the class declares (its ``spec``, a
PipelineSpec: ``retrieves``, ``answers_open``, ``needs_llm``; issue 28),
with no change to rcn_fast.eval."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any, ClassVar

os.environ["HF_HUB_OFFLINE"] = "1"

import pytest  # noqa: E402

pytest.importorskip("torch")
pytest.importorskip("transformers")

from rcn_fast.eval import EvalConfig, EvalError, evaluate  # noqa: E402
from rcn_fast.eval.cli import main  # noqa: E402
from rcn_fast.eval.pipeline_needs import (  # noqa: E402
    is_open_capable,
    may_use_retriever,
    needs_example_kb,
    needs_llm,
    retriever_kind,
)
from rcn_fast.pipelines import CONFIGS, PIPELINES, register  # noqa: E402
from rcn_fast.pipelines.base import QuestionState, StagedPipeline, StageRunner  # noqa: E402
from rcn_fast.pipelines.config import PipelineConfig  # noqa: E402
from rcn_fast.pipelines.knowledge import as_embedding_retriever, retrieve_batch  # noqa: E402
from rcn_fast.pipelines.spec import PipelineSpec  # noqa: E402
from tests.test_eval import (  # noqa: E402,F401
    one_torch_thread,
    tiny_bert_dir,
    tiny_encoder,
    tiny_hf,
    tiny_llama_dir,
    write_corpus,
    write_questions,
)


# ------------------------------------------------------------ the toy pipeline: its whole module
@dataclass
class FirstPassageConfig(PipelineConfig):
    """Answer with the single best passage."""

    name: ClassVar[str] = "first_passage"
    top_n: int = 1


class FirstPassage(StagedPipeline):
    """Retrieve one passage for the question and answer with it."""

    name = "first_passage"
    config_class = FirstPassageConfig
    spec = PipelineSpec(retrieves="corpus")

    def __init__(self, llm: Any, config: Any = None, *, retriever: Any = None, prompts: Any = None) -> None:
        super().__init__(llm, config, retriever=retriever, prompts=prompts)
        self.source = as_embedding_retriever(retriever)

    def knowledge_stages(self, states: list[QuestionState], runner: StageRunner) -> None:
        results, _ = retrieve_batch(self.source, [st.question.question for st in states], self.config.top_n)
        for st, res in zip(states, results):
            st.passages = list(res)
            st.knowledge = [p.text for p in res]


@pytest.fixture
def registered():
    register(FirstPassage)
    yield FirstPassage
    PIPELINES.pop("first_passage", None)
    CONFIGS.pop("first_passage", None)


def test_a_registered_pipeline_runs_through_the_eval(tmp_path, registered, tiny_hf, tiny_encoder):
    q = write_questions(tmp_path / "mini.jsonl", n=3)
    corpus = write_corpus(tmp_path / "facts.jsonl", n=10)
    doc = evaluate(EvalConfig(pipelines=["first_passage", "vanilla"], tasks=[str(q)], corpus=str(corpus),
                              output_path=str(tmp_path / "o"), progress=False, plot=False, log_samples=True,
                              pipeline_args={"first_passage.top_n": 2}),
                   llm=tiny_hf, encoder=tiny_encoder, print_table=False)
    r = doc["results"]["mini"]["first_passage"]
    assert r["n"] == 3 and r["llm_calls_per_q"] == 1
    samples = [json.loads(x) for x in sorted((tmp_path / "o").glob("samples_mini_first_passage_*.jsonl"))[-1].read_text().splitlines()]
    assert all(len(s["passages"]) == 2 for s in samples)  # its own setting reached it
    # what it declares is what the eval asks: a corpus is required
    with pytest.raises(EvalError, match="'first_passage' needs a knowledge corpus"):
        evaluate(EvalConfig(pipelines=["first_passage"], tasks=[str(q)], output_path=str(tmp_path / "o2")),
                 llm=tiny_hf, print_table=False)


def test_list_pipelines_reads_the_declarations(registered, capsys):
    assert main(["--list-pipelines"]) == 0
    out = capsys.readouterr().out
    assert "first_passage      multiple choice (needs --corpus)" in out
    assert "zebra              multiple choice (needs --kb)" in out
    assert "reconnect          multiple choice + open domain (needs --corpus)" in out


def test_the_builtin_pipelines_declare_their_needs():
    kinds = {name: retriever_kind(cls) for name, cls in PIPELINES.items()}
    assert kinds["vanilla"] == "none" and kinds["self_consistency"] == "none" and kinds["septa"] == "none"
    assert kinds["single_retrieval"] == kinds["reconnect"] == kinds["rr"] == "corpus"
    assert kinds["zebra"] == "example_kb" and needs_example_kb(PIPELINES["zebra"])
    assert not may_use_retriever(PIPELINES["zebra"])
    assert all(kinds[n] == "optional_corpus" for n in ("activerag", "rag_vanilla", "cot", "guideline"))
    assert {n for n, c in PIPELINES.items() if is_open_capable(c)} == {
        "reconnect", "activerag", "rag_vanilla", "chain_of_note", "self_refine", "self_rerank", "cot", "guideline"}
    assert [n for n, c in PIPELINES.items() if not needs_llm(c)] == ["septa"]


def test_an_unknown_retriever_kind_is_named():
    with pytest.raises(ValueError, match="retrieves: expected one of .* got 'web'"):
        PipelineSpec(retrieves="web")

    class Undeclared:
        name = "odd"
        retriever_kind = "corpus"  # a loose class attribute is not a declaration

    with pytest.raises(EvalError, match="'odd': expected a class attribute spec = "):
        retriever_kind(Undeclared)


def test_each_config_lives_beside_its_pipeline():
    """Each registered pipeline's config class is defined in the pipeline's
    own module (or, for a pipeline package such as rcn_fast.pipelines.rr,
    in that package); rcn_fast.pipelines.config holds no moved names any
    more (the pre-release compatibility names are gone: issue 28)."""
    from rcn_fast.pipelines import config as config_module

    builtin = ["vanilla", "single_retrieval", "reconnect", "zebra", "rr", "self_consistency", "activerag",
               "rag_vanilla", "chain_of_note", "self_refine", "self_rerank", "cot", "guideline", "septa"]
    for name in builtin:
        cls = PIPELINES[name]
        assert CONFIGS[name] is cls.config_class
        home, cfg_home = cls.__module__, cls.config_class.__module__
        assert cfg_home == home or cfg_home.rpartition(".")[0] == home.rpartition(".")[0] == "rcn_fast.pipelines.rr", \
            name
        assert cls.config_class.name == name
    for old_name in ("RRConfig", "ReConnectConfig", "ACTIVERAG_AGENTS", "CONCLUSION_WORDS", "SeptaConfig"):
        assert not hasattr(config_module, old_name), old_name
