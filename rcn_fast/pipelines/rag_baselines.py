"""ActiveRAG's baselines as pipelines: vanilla RAG, Chain-of-Note,
Self-Refine, Self-Rerank, chain of thought and Guideline.

All of them run for multiple-choice questions (final scoring pass, like
every rcn_fast pipeline) and for open-domain questions (the answer is
generated); see :mod:`rcn_fast.pipelines.rag`. Every stage is one LLM call
for the whole batch.

Generations (G) and scoring passes (S) per question:

==============  ==============================================  =========  =========
pipeline        stages                                          MC         open
==============  ==============================================  =========  =========
rag_vanilla     retrieval, answer                               0 G + 1 S  1 G
chain_of_note   retrieval, notes + answer                       1 G + 1 S  1 G
self_refine     retrieval, summary, answer from the summary     1 G + 1 S  2 G
self_rerank     retrieval, labels, answer from useful passages  1 G + 1 S  2 G
cot             chain of thought                                1 G + 1 S  1 G
guideline       chain of thought, guiding analysis, merge       3 G + 1 S  3 G
==============  ==============================================  =========  =========
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, ClassVar

from rcn_fast._validate import check_bool as _bool
from rcn_fast._validate import check_choice
from rcn_fast.pipelines.base import Answer, QuestionState, StageRunner
from rcn_fast.pipelines.rag import RAGConfig, RAGPipeline, RAGState
from rcn_fast.pipelines.spec import PipelineSpec, Stage


# ------------------------------------------------------------------ settings
# RAGVanilla, ChainOfNote, SelfRefine and Guideline take exactly RAGConfig's
# settings; each has a config class of its own only so that its ``name`` is
# written into saved configs (``to_yaml``) and read back by ``load_config``.
# What a question costs is declared on the pipeline classes below.
@dataclass
class RAGVanillaConfig(RAGConfig):
    """Settings of :class:`RAGVanilla` (:class:`RAGConfig`'s)."""

    name: ClassVar[str] = "rag_vanilla"


@dataclass
class ChainOfNoteConfig(RAGConfig):
    """Settings of :class:`ChainOfNote` (:class:`RAGConfig`'s)."""

    name: ClassVar[str] = "chain_of_note"


@dataclass
class SelfRefineConfig(RAGConfig):
    """Settings of :class:`SelfRefine` (:class:`RAGConfig`'s)."""

    name: ClassVar[str] = "self_refine"


@dataclass
class SelfRerankConfig(RAGConfig):
    """Settings of :class:`SelfRerank`: :class:`RAGConfig`'s, and

    Attributes
    ----------
    unparsed : {"all", "none"}
        Passages kept when the labelling output names no passage at all
        (the model ignored the format): all of them, or none. When some
        passages are labelled, exactly the ones labelled useful are kept
        (possibly none).
    """

    name: ClassVar[str] = "self_rerank"
    unparsed: str = "all"

    def __post_init__(self) -> None:
        super().__post_init__()
        check_choice(self.unparsed, "unparsed", ("all", "none"))


@dataclass
class CoTConfig(RAGConfig):
    """Settings of :class:`CoT`: :class:`RAGConfig`'s, and

    Attributes
    ----------
    use_passages : bool
        False (the paper's prompt-learning baseline): no retrieval. True:
        retrieve ``top_k`` passages and show them above the question in
        the one chain-of-thought call (rcn_fast's own variant; the paper's
        "CoT w. Passage" row of Table 3 passes the passages to a cognitive
        nexus after the chain of thought: ``activerag`` with
        ``agent="passage"``).
    """

    name: ClassVar[str] = "cot"
    use_passages: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        _bool(self.use_passages, "use_passages")


@dataclass
class GuidelineConfig(RAGConfig):
    """Settings of :class:`Guideline` (:class:`RAGConfig`'s; it retrieves nothing)."""

    name: ClassVar[str] = "guideline"


# ------------------------------------------------------------------ stages
class RAGStage(Stage):
    """A RAG stage: the pipeline's method ``method`` run for the batch
    (it sets ``state.final`` when it is the last one before the answer)."""

    reads = ("question",)
    writes = ("passages", "final", "trace")
    method: ClassVar[str] = ""
    calls: ClassVar[int] = 1

    def llm_calls_per_question(self, config: Any) -> int:
        return self.calls

    def run(self, states: list[QuestionState], runner: StageRunner) -> None:
        getattr(runner.pipeline, self.method)(states, runner)


class PassagesFinal(RAGStage):
    """Vanilla RAG: one batched retrieval; the passages go to the answer."""

    name, method, calls = "retrieval", "passages_final", 0


class ChainOfNoteStage(RAGStage):
    name, method = "rag_chain_of_note", "chain_of_note"


class SummaryStage(RAGStage):
    name, method = "rag_summarize", "summarize"


class RerankStage(RAGStage):
    name, method = "rag_rerank", "rerank"


class CoTStage(RAGStage):
    name, method = "rag_cot", "cot"


class GuidelineCoT(RAGStage):
    name, method, writes = "rag_cot", "guideline_cot", ("cot", "trace")


class GuidelineAnalysis(RAGStage):
    name, method, writes = "rag_guideline", "guideline_analysis", ("analysis", "trace")


class GuidelineMerge(RAGStage):
    reads = ("question", "cot", "analysis")
    name, method = "rag_guideline_merge", "guideline_merge"


@dataclass
class GuidelineState(RAGState):
    """One question in Guideline: its chain of thought and the teacher's analysis."""

    cot: str = ""
    analysis: str = ""


# ------------------------------------------------------------------ pipelines
class RAGVanilla(RAGPipeline):
    """Vanilla RAG: the top ``top_k`` passages, then the question
    (``rag_answer`` scoring pass; open domain: ``rag_answer_open`` generation)."""

    name = "rag_vanilla"
    config_class = RAGVanillaConfig
    open_generations = 1
    spec = PipelineSpec(retrieves="optional_corpus", answers_open=True, stages=(PassagesFinal(), Answer()))

    def passages_final(self, states: list[QuestionState], runner: StageRunner) -> None:
        self.retrieve(states)
        for st in states:
            st.final = ("passages", [p.text for p in st.passages])


class ChainOfNote(RAGPipeline):
    """Chain-of-Note: one generation writes reading notes on the passages,
    judges their relevance, and answers (``rag_chain_of_note``)."""

    name = "chain_of_note"
    config_class = ChainOfNoteConfig
    generations = 1
    spec = PipelineSpec(retrieves="optional_corpus", answers_open=True, stages=(ChainOfNoteStage(), Answer()))

    def chain_of_note(self, states: list[QuestionState], runner: StageRunner) -> None:
        outs = self.generate_with_passages("rag_chain_of_note", states, runner)
        for st, o in zip(states, outs):
            st.final = ("reasoning", [("chain_of_note", o)])


class SelfRefine(RAGPipeline):
    """Self-Refine: a query-focused summary of the passages
    (``rag_summarize``), then the vanilla-RAG answer with the summary in
    place of the passages."""

    name = "self_refine"
    config_class = SelfRefineConfig
    generations = 1
    open_generations = 2
    spec = PipelineSpec(retrieves="optional_corpus", answers_open=True, stages=(SummaryStage(), Answer()))

    def summarize(self, states: list[QuestionState], runner: StageRunner) -> None:
        outs = self.generate_with_passages("rag_summarize", states, runner)
        for st, o in zip(states, outs):
            summary = o.strip()
            st.final = ("passages", [summary] if summary else [])


_RERANK_INDEX = re.compile(r"passage\s*(?:no\.?|number|#)?\s*[:=]?\s*\[?(\d{1,3})\b", re.I)
_RERANK_LEAD = re.compile(r"^\s*(?:[*\-\u2022]\s*)?\(?\[?(\d{1,3})\s*[.):\]]")
_RERANK_TAG = re.compile(r"\b(useless|not\s+useful|unuseful|useful)\b", re.I)


def parse_rerank(text: str, n: int) -> dict[int, bool]:
    """Usefulness labels out of a Self-Rerank generation.

    Each line that names a passage (``passage: 3``, ``Passage 3``, or a
    leading ``3.`` / ``3)`` / ``[3]``) opens that passage; the first
    usefulness tag (``useful``, or ``useless`` / ``not useful``) on that
    line or the lines that follow it, before the next passage, labels it.
    Only the first label of a passage counts; numbers outside 1..n are
    ignored.

    Parameters
    ----------
    text : str
        The generation, with its pre-fill in front (``"1. passage: "``).
    n : int
        Number of passages shown.

    Returns
    -------
    dict : 1-based passage number -> True (useful) / False (useless), for
    the passages that got a label.
    """
    out: dict[int, bool] = {}
    current: int | None = None
    for line in text.splitlines():
        m = _RERANK_INDEX.search(line) or _RERANK_LEAD.match(line)
        rest = line
        if m:
            idx = int(m.group(1))
            current = idx if 1 <= idx <= n else None
            rest = line[m.end():]
        if current is None or current in out:
            continue
        t = _RERANK_TAG.search(rest)
        if t:
            out[current] = t.group(1).lower() == "useful"
    return out


class SelfRerank(RAGPipeline):
    """Self-Rerank: the model labels every passage useful/useless and
    relevant/irrelevant (``rag_rerank``, parsed by :func:`parse_rerank`);
    the useful ones go to the vanilla-RAG answer. When the output labels no
    passage at all, ``config.unparsed`` decides (all passages, or none)."""

    name = "self_rerank"
    config_class = SelfRerankConfig
    generations = 1
    open_generations = 2
    spec = PipelineSpec(retrieves="optional_corpus", answers_open=True, stages=(RerankStage(), Answer()))

    def rerank(self, states: list[QuestionState], runner: StageRunner) -> None:
        outs = self.generate_with_passages("rag_rerank", states, runner)
        prefill = self.prompts.stage("rag_rerank").get("prefill", "")
        for st, o in zip(states, outs):
            labels = parse_rerank(prefill + o, len(st.passages))
            if labels:
                keep = [i for i in range(len(st.passages)) if labels.get(i + 1)]
            else:
                keep = list(range(len(st.passages))) if self.config.unparsed == "all" else []
            st.trace[-1]["labels"] = {str(k): v for k, v in sorted(labels.items())}
            st.trace[-1]["kept"] = [st.passages[i].id for i in keep]
            st.final = ("passages", [st.passages[i].text for i in keep])


class CoT(RAGPipeline):
    """Chain of thought: one reasoning generation (``rag_cot``; with
    ``use_passages`` the passages come first, ``rag_cot_passages``)."""

    name = "cot"
    config_class = CoTConfig
    generations = 1
    spec = PipelineSpec(retrieves="optional_corpus", answers_open=True, stages=(CoTStage(), Answer()))

    @property
    def does_retrieve(self) -> bool:
        return self.config.use_passages

    def cot(self, states: list[QuestionState], runner: StageRunner) -> None:
        if self.config.use_passages:
            outs = self.generate_with_passages("rag_cot", states, runner, prompt="rag_cot_passages")
        else:
            outs = [o[0] for o in self.generate_rows("rag_cot", states, runner,
                                                     [[(None, self.chat("rag_cot", st))] for st in states])]
        for st, o in zip(states, outs):
            st.final = ("reasoning", [("cot", o)])


class Guideline(RAGPipeline):
    """Guideline: a chain of thought (``rag_cot``) and a teacher's
    step-by-step analysis without the answer (``rag_guideline``), then one
    generation that merges and checks both and answers
    (``rag_guideline_merge``). No retrieval."""

    name = "guideline"
    config_class = GuidelineConfig
    generations = 3
    spec = PipelineSpec(retrieves="optional_corpus", answers_open=True,
                        stages=(GuidelineCoT(), GuidelineAnalysis(), GuidelineMerge(), Answer()))
    state_class = GuidelineState

    @property
    def does_retrieve(self) -> bool:
        return False

    def guideline_cot(self, states: list[GuidelineState], runner: StageRunner) -> None:
        cots = self.generate_rows("rag_cot", states, runner, [[(None, self.chat("rag_cot", st))] for st in states])
        for st, c in zip(states, cots):
            st.cot = c[0]

    def guideline_analysis(self, states: list[GuidelineState], runner: StageRunner) -> None:
        guides = self.generate_rows("rag_guideline", states, runner,
                                    [[(None, self.chat("rag_guideline", st))] for st in states])
        for st, g in zip(states, guides):
            st.analysis = g[0]

    def guideline_merge(self, states: list[GuidelineState], runner: StageRunner) -> None:
        rows = [[(None, self.chat("rag_guideline_merge", st, analysis=st.analysis.strip(), reasoning=st.cot.strip()))]
                for st in states]
        outs = self.generate_rows("rag_guideline_merge", states, runner, rows)
        for st, o in zip(states, outs):
            st.final = ("reasoning", [("guideline", o[0])])


__all__ = [
    "RAGVanilla", "ChainOfNote", "SelfRefine", "SelfRerank", "CoT", "Guideline", "parse_rerank", "RAGVanillaConfig",
    "ChainOfNoteConfig", "SelfRefineConfig", "SelfRerankConfig", "CoTConfig", "GuidelineConfig",
]
