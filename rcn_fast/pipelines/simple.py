"""The two baselines without knowledge generation: vanilla and single retrieval."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from rcn_fast._validate import check_choice
from rcn_fast._validate import check_int as _int
from rcn_fast.pipelines.base import Answer, QuestionState, StagedPipeline, StageRunner
from rcn_fast.pipelines.config import PipelineConfig
from rcn_fast.pipelines.knowledge import as_embedding_retriever, passage_refs, retrieve_batch
from rcn_fast.pipelines.spec import PipelineSpec, Stage

#: Retrieval queries of a multiple-choice question: its text, or text + options.
QUERY_MODES = ("question", "question_choices")


@dataclass
class VanillaConfig(PipelineConfig):
    """The LLM answers with no knowledge (one scoring pass per question)."""

    name: ClassVar[str] = "vanilla"


@dataclass
class SingleRetrievalConfig(PipelineConfig):
    """Retrieve ``top_n`` passages for the question and answer with them.

    Attributes
    ----------
    top_n : int
        Passages retrieved for the question.
    query : {"question", "question_choices"}
        The query text: the question alone, or the question followed by
        its options.
    """

    name: ClassVar[str] = "single_retrieval"
    top_n: int = 5
    query: str = "question"

    def __post_init__(self) -> None:
        super().__post_init__()
        _int(self.top_n, "top_n")
        check_choice(self.query, "query", QUERY_MODES)


def question_query(question: Any, mode: str) -> str:
    """The retrieval query of a question: its text, or text + options."""
    if mode == "question":
        return question.question
    opts = " ".join(f"{lab}. {txt}" for lab, txt in zip(question.labels, question.choices))
    return f"{question.question} {opts}"


class Vanilla(StagedPipeline):
    """The LLM answers from the question alone: one scoring pass per question.

    Examples
    --------
    >>> p = rcn_fast.pipelines.build("vanilla", llm=llm)          # doctest: +SKIP
    >>> p.run(question).pred_label                                # doctest: +SKIP
    'B'
    """

    name = "vanilla"
    config_class = VanillaConfig
    spec = PipelineSpec(stages=(Answer(),))

    def answer_stage(self, states: list[QuestionState], runner: StageRunner) -> list[list[float]]:
        """Score the labels after the answering prompt, without knowledge."""
        return runner.score("answer", states, [self.prompts.chat("answer", st.question) for st in states])


class QuestionPassages(Stage):
    """One batched retrieval: the top ``top_n`` passages for each question
    query are its passages and its knowledge."""

    name = "retrieval"
    reads = ("question",)
    writes = ("passages", "knowledge", "trace")

    def run(self, states: list[QuestionState], runner: StageRunner) -> None:
        pipe = runner.pipeline
        queries = [question_query(st.question, pipe.config.query) for st in states]
        results, _ = retrieve_batch(pipe.source, queries, pipe.config.top_n)
        for st, q, res in zip(states, queries, results):
            st.passages = list(res)
            st.knowledge = [p.text for p in res]
            st.trace.append({"stage": "retrieval", "type": "retrieve", "queries": [q],
                             "results": [[p.id for p in res]], "scores": [[float(p.score) for p in res]],
                             "passages": passage_refs(res)})


class SingleRetrieval(StagedPipeline):
    """Retrieve the top ``n`` passages for the question (one batched
    retrieval) and answer with them as the explanations."""

    name = "single_retrieval"
    config_class = SingleRetrievalConfig
    spec = PipelineSpec(retrieves="corpus", stages=(QuestionPassages(), Answer()))

    def __init__(self, llm: Any, config: Any = None, *, retriever: Any = None, prompts: Any = None) -> None:
        super().__init__(llm, config, retriever=retriever, prompts=prompts)
        self.source = as_embedding_retriever(retriever)


__all__ = ["Vanilla", "SingleRetrieval", "QuestionPassages", "VanillaConfig", "SingleRetrievalConfig", "QUERY_MODES",
           "question_query"]
