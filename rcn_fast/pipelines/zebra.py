"""ZEBRA: retrieve solved examples, generate knowledge few-shot, answer.

Stages, each for the whole batch at once:

1. ``example_retrieval``: top ``k`` examples with explanations from the
   example KB (one batched encode + search; queries and entries written
   ``"question [SEP] A. c1 [SEP] B. c2 ..."`` as ZEBRA's released
   retriever scripts do; the paper's eq. 1 writes the choices without
   their letters).
2. ``example_generation`` (generation, 1 per question): the examples as
   alternating user/assistant turns, then the question with the assistant
   turn pre-filled with the explanations header.
3. ``answer`` (one scoring pass) with the generated explanations.

The explanations are read with :func:`rcn_fast.prompts.parse_bullets`:
the first paragraph, one per line, list markers removed. ZEBRA's code
removes every ``*`` of a line instead (also inside it) and keeps numbered
markers; on bullet lists the two agree (see ``docs/FIDELITY.md``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from rcn_fast._validate import check_bool as _bool
from rcn_fast._validate import check_int as _int
from rcn_fast.pipelines.base import Answer, QuestionState, StagedPipeline, StageRunner
from rcn_fast.pipelines.spec import PipelineSpec, Stage
from rcn_fast.pipelines.config import PipelineConfig
from rcn_fast.prompts import parse_bullets


@dataclass
class ZebraConfig(PipelineConfig):
    """ZEBRA (example retrieval + few-shot knowledge generation).

    Attributes
    ----------
    top_k : int
        Examples retrieved from the example knowledge base (paper: 5).
    exclude_same_id : bool
        Never use a KB example whose id equals the question's id (a KB
        built from the evaluated split would otherwise leak the answer).
    max_explanations : int or None
        Explanations of each example shown in the prompt (None = all).
    """

    name: ClassVar[str] = "zebra"
    top_k: int = 5
    exclude_same_id: bool = True
    max_explanations: int | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        _int(self.top_k, "top_k")
        _bool(self.exclude_same_id, "exclude_same_id")
        _int(self.max_explanations, "max_explanations", 1, allow_none=True)


@dataclass
class ZebraState(QuestionState):
    """One question in ZEBRA: ``examples``, the retrieved (Example, score) pairs."""

    examples: list[tuple[Any, float]] = field(default_factory=list)


class ExampleRetrieval(Stage):
    """Top ``top_k`` examples from the example KB for the batch (one call;
    the question's own id excluded with ``exclude_same_id``)."""

    name = "example_retrieval"
    reads = ("question",)
    writes = ("examples", "trace")

    def run(self, states: list[ZebraState], runner: StageRunner) -> None:  # type: ignore[override]
        pipe = runner.pipeline
        c = pipe.config
        exclude = [st.id for st in states] if c.exclude_same_id else None
        found = pipe.retriever.retrieve([st.question for st in states], c.top_k, exclude_ids=exclude)
        for st, exs in zip(states, found):
            st.examples = list(exs)
            st.trace.append({"stage": "example_retrieval", "type": "retrieve",
                             "examples": [ex.id for ex, _ in exs], "scores": [float(s) for _, s in exs],
                             "passages": [{"id": ex.id, "score": float(s), "text": ex.question,
                                           "explanations": list(ex.explanations)} for ex, s in exs]})


class ExampleGeneration(Stage):
    """One generation per question: the examples as few-shot turns, then
    the question; its explanations are the knowledge."""

    name = "example_generation"
    reads = ("question", "examples")
    writes = ("knowledge", "trace")

    def llm_calls_per_question(self, config: Any) -> int:
        return 1

    def run(self, states: list[ZebraState], runner: StageRunner) -> None:  # type: ignore[override]
        pipe = runner.pipeline
        c = pipe.config
        chats = []
        for st in states:
            shots = [{"question": ex.question, "choices": ex.choices, "labels": ex.labels,
                      "knowledge": ex.explanations[: c.max_explanations] if c.max_explanations else ex.explanations}
                     for ex, _ in st.examples]
            chats.append([pipe.prompts.chat("example_generation", st.question, examples=shots)])
        outs = runner.generate("example_generation", states, chats)
        for st, o in zip(states, outs):
            st.knowledge = parse_bullets(o[0])
            st.trace[-1]["parsed"] = st.knowledge


class Zebra(StagedPipeline):
    """ZEBRA over an example knowledge base.

    Parameters
    ----------
    llm : LLM
    config : ZebraConfig, optional
    retriever : ExampleRetriever
        Built from an :class:`~rcn_fast.kb.ExampleKB` and an encoder
        (``rcn_fast.kb.ExampleRetriever(kb, encoder)``); anything with
        ``retrieve(questions, k, exclude_ids=...)`` returning
        (Example, score) lists works.
    prompts : path, mapping or PromptSet, optional
    """

    name = "zebra"
    config_class = ZebraConfig
    spec = PipelineSpec(retrieves="example_kb", stages=(ExampleRetrieval(), ExampleGeneration(), Answer()))
    state_class = ZebraState

    def __init__(self, llm: Any, config: Any = None, *, retriever: Any = None, prompts: Any = None) -> None:
        super().__init__(llm, config, retriever=retriever, prompts=prompts)
        if not callable(getattr(retriever, "retrieve", None)):
            raise TypeError(f"retriever: expected an ExampleRetriever, got {type(retriever).__name__}")


__all__ = ["Zebra", "ZebraConfig"]
