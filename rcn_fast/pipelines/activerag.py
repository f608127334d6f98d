"""ActiveRAG: knowledge construction by agents, then a cognitive nexus.

Stages, each run for the whole batch at once (one LLM call per stage):

1. ``retrieval`` (one batched retrieval): top ``top_k`` (5) passages.
2. ``rag_cot`` (1 generation per question): a chain of thought that ends in
   an answer -- the model's own first reasoning.
3. ``knowledge_construction`` (1 generation per agent): each chosen agent
   reads question + passages and writes its construction
   (``activerag_<agent>`` prompt): *associate* (familiar and advanced
   knowledge, consolidated), *anchoring* (unfamiliar background),
   *logician* (causal / logical support), *cognition* (facts that
   contradict and correct the model).
4. ``cognitive_nexus`` (1 generation per agent): the agent's construction
   and the chain of thought go back to the model, which checks and improves
   the reasoning and answers (``activerag_nexus_<agent>``). With
   ``nexus_context="conversation"`` (default, as the reference code) the
   nexus continues the agent's own chat: construction prompt, construction
   reply, then the nexus instruction as the next user turn
   (:func:`continue_chat`); ``"fresh"`` starts a new chat.
5. Multiple choice: ``answer`` -- one scoring pass per agent over its nexus
   output (``rag_answer_reasoning``, label log-probabilities at the
   ``Answer:`` pre-fill, ended by ``answer_render``), so ActiveRAG is
   scored like every other pipeline.
   Open domain: StringEM over the whole nexus output (the paper's metric;
   ``answer_extraction="final"`` reads the ``Answer:`` line instead).

The paper's Table 3 ablations are agents too: ``agent="note"`` ("CoT w.
Note": reading notes on the passages, ``activerag_note``, then the nexus,
``activerag_nexus_note``) and ``agent="passage"`` ("CoT w. Passage": the
raw passages go to the nexus, ``activerag_nexus_passage``; no construction
call, so 2 generations).

``agent="all"`` runs the four agents and combines them without looking at
the gold answer: multiple choice -- the log of the *mean of the four
agents' choice probabilities* (:func:`~rcn_fast.pipelines.rag.combine_choice_logprobs`;
the Prediction's ``choice_logprobs``); open domain -- a *majority vote* over
the four normalised answers, ties to the agent listed first (associate,
anchoring, logician, cognition; :func:`~rcn_fast.pipelines.rag.vote_answers`).
Each agent's own result is kept: the trace's ``combination`` entry, or
``OpenPrediction.meta["agents"]``; :func:`~rcn_fast.pipelines.rag.agent_results`
reads either.

Cost per question (``Prediction.cost``; the trace has one entry per call):

=============  ====================================  =========================
agent          multiple choice                       open domain
=============  ====================================  =========================
one agent      3 generations + 1 scoring = 4 calls   3 generations = 3 calls
``"note"``     3 generations + 1 scoring = 4 calls   3 generations = 3 calls
``"passage"``  2 generations + 1 scoring = 3 calls   2 generations = 2 calls
``"all"``      9 generations + 4 scoring = 13 calls  9 generations = 9 calls
=============  ====================================  =========================

The paper counts 9 calls per question: its implementation always runs the
chain of thought and all four agents' construction and nexus (1 + 4 + 4),
and reports one agent's result (associate) from them. rcn_fast runs only
the agents asked for, so one agent costs 3 generations; ``agent="all"`` is
the paper's 9. Multiple choice adds one scoring pass per reported agent
(a single forward pass, no generation), which the paper, generating free
answers, has no use for.

Decoding is greedy by default, as in every rcn_fast pipeline; the paper
sampled gpt-3.5-turbo at temperature 0.2 (``temperature=0.2`` follows it).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any, ClassVar

from rcn_fast._validate import check_choice
from rcn_fast.pipelines.base import Answer, QuestionState, StageRunner
from rcn_fast.pipelines.rag import RAGConfig, RAGPipeline, RAGState
from rcn_fast.pipelines.spec import PipelineSpec, Stage


#: The paper's four knowledge-construction agents.
ACTIVERAG_AGENTS = ("associate", "anchoring", "logician", "cognition")
# ActiveRAG Table 3 ablations: "CoT w. Note", "CoT w. Passage"
ACTIVERAG_ABLATIONS = ("note", "passage")


@dataclass
class ActiveRAGConfig(RAGConfig):
    """ActiveRAG: knowledge construction agents + cognitive nexus.

    Attributes
    ----------
    agent : {"associate", "anchoring", "logician", "cognition", "all", "note", "passage"}
        The knowledge construction agent(s) to run (paper's main result:
        associate). ``"all"`` runs the four and combines them (see
        :class:`rcn_fast.pipelines.activerag.ActiveRAG`). The ablations of
        the paper's Table 3: ``"note"`` ("CoT w. Note": the passages refined
        into reading notes, then the cognitive nexus with the chain of
        thought) and ``"passage"`` ("CoT w. Passage": the raw passages go to
        the cognitive nexus; no construction call).
    nexus_context : {"conversation", "fresh"}
        ``"conversation"`` (default, the reference code): the cognitive
        nexus continues the agent's own chat -- its construction prompt and
        reply stay in context and the nexus instruction (which also quotes
        the construction, as the paper's Table 7 prompts do) comes as the
        next user turn. ``"fresh"``: the nexus is a new chat with the chain
        of thought and the construction only (fewer prompt tokens). The
        ``"passage"`` ablation has no construction chat: always fresh.
    """

    name: ClassVar[str] = "activerag"
    agent: str = "associate"
    nexus_context: str = "conversation"

    def __post_init__(self) -> None:
        super().__post_init__()
        check_choice(self.agent, "agent", (*ACTIVERAG_AGENTS, "all", *ACTIVERAG_ABLATIONS))
        check_choice(self.nexus_context, "nexus_context", ("conversation", "fresh"))

    @property
    def agents(self) -> tuple[str, ...]:
        return ACTIVERAG_AGENTS if self.agent == "all" else (self.agent,)


def continue_chat(history: list[dict[str, str]], reply: str, nxt: list[dict[str, str]]) -> list[dict[str, str]]:
    """A chat that continues ``history`` (answered with ``reply``) with the
    turns of ``nxt``.

    The reply completes ``history``'s pre-filled assistant turn (or is
    appended as one). ``nxt``'s leading system turn(s) -- with any
    acknowledgement turn after them -- become the start of its first user
    turn (a system turn belongs at the top of a chat only); its other turns,
    the pre-fill included, follow.

    Parameters
    ----------
    history : list of {"role", "content"}
        The earlier call's chat, as sent.
    reply : str
        Its generation (without the pre-fill).
    nxt : list of {"role", "content"}
        The next stage's chat as rendered on its own.

    Returns
    -------
    list of {"role", "content"} (new dicts; the inputs are not changed)
    """
    turns = copy.deepcopy(list(history))
    if turns and turns[-1]["role"] == "assistant":
        turns[-1]["content"] = turns[-1]["content"] + reply
    else:
        turns.append({"role": "assistant", "content": reply})
    rest = copy.deepcopy(list(nxt))
    lead = []
    while rest and rest[0]["role"] == "system":
        lead.append(rest.pop(0)["content"])
    while lead and rest and rest[0]["role"] == "assistant":  # an acknowledgement of the system turn
        rest.pop(0)
    if not rest or rest[0]["role"] != "user":
        raise ValueError("nxt: expected a user turn after its system turn(s)")
    if lead:
        rest[0]["content"] = "\n\n".join([*lead, rest[0]["content"]])
    return turns + rest


@dataclass
class ActiveRAGState(RAGState):
    """One question in ActiveRAG: its chain of thought, its passages as
    shown, and each agent's knowledge construction."""

    cot: str = ""
    passages_text: str = ""
    construction: dict[str, str] = field(default_factory=dict)
    #: agent -> (its construction chat, its raw reply): the nexus continues that conversation
    construction_turns: dict[str, tuple[list[dict[str, str]], str]] = field(default_factory=dict)


class ActiveRAGStage(Stage):
    """An ActiveRAG stage: the pipeline's method ``method`` for the batch."""

    method: ClassVar[str] = ""

    def run(self, states: list[QuestionState], runner: StageRunner) -> None:
        getattr(runner.pipeline, self.method)(states, runner)


class Retrieval(Stage):
    """One batched retrieval: top ``top_k`` passages per question."""

    name, reads, writes = "retrieval", ("question",), ("passages", "trace")

    def run(self, states: list[QuestionState], runner: StageRunner) -> None:
        runner.pipeline.retrieve(states)


class ReasoningCoT(ActiveRAGStage):
    name, method, reads, writes = "rag_cot", "rag_cot", ("question",), ("cot", "trace")

    def llm_calls_per_question(self, config: Any) -> int:
        return 1


class KnowledgeConstruction(ActiveRAGStage):
    name, method = "knowledge_construction", "construct"
    reads, writes = ("question", "passages"), ("passages_text", "construction", "construction_turns", "trace")

    def llm_calls_per_question(self, config: Any) -> int:
        return sum(a != "passage" for a in config.agents)


class CognitiveNexus(ActiveRAGStage):
    name, method = "cognitive_nexus", "nexus"
    reads, writes = ("cot", "passages_text", "construction", "construction_turns"), ("final", "trace")

    def llm_calls_per_question(self, config: Any) -> int:
        return len(config.agents)


class AgentAnswer(Answer):
    """The multiple-choice answer: one scoring pass per reported agent's
    nexus output (four for ``agent="all"``)."""

    def llm_calls_per_question(self, config: Any) -> int:
        return len(config.agents)


class ActiveRAG(RAGPipeline):
    """ActiveRAG (see the module docstring for stages, costs and ``"all"``).

    Parameters
    ----------
    llm : LLM
    config : ActiveRAGConfig, optional
    retriever : retriever
        Anything :func:`~rcn_fast.pipelines.knowledge.as_embedding_retriever`
        accepts (a ``retrieve(queries, k)`` object is enough).
    prompts : path, mapping or PromptSet, optional

    Examples
    --------
    >>> p = rcn_fast.pipelines.build("activerag", llm=llm, retriever=retriever, agent="associate")  # doctest: +SKIP
    >>> [t["stage"] for t in p.run(question).trace]                                                # doctest: +SKIP
    ['retrieval', 'rag_cot', 'knowledge_construction', 'cognitive_nexus', 'answer']
    >>> p.run(OpenQuestion("q1", "Who wrote Hamlet?", ["Shakespeare"])).string_em                 # doctest: +SKIP
    True
    """

    name = "activerag"
    config_class = ActiveRAGConfig
    state_class = ActiveRAGState
    spec = PipelineSpec(retrieves="optional_corpus", answers_open=True,
                        stages=(Retrieval(), ReasoningCoT(), KnowledgeConstruction(), CognitiveNexus(), AgentAnswer()))

    @property
    def generations_per_question(self) -> int:
        """1 chain of thought + per agent 1 construction (none for
        ``"passage"``) and 1 nexus."""
        return 1 + sum(1 if a == "passage" else 2 for a in self.config.agents)

    @property
    def scoring_passes_per_question(self) -> int:
        """One answer-scoring pass per agent's nexus output."""
        return len(self.config.agents)

    # ------------------------------------------------------------ stages
    def rag_cot(self, states: list[ActiveRAGState], runner: StageRunner) -> None:
        cots = self.generate_rows("rag_cot", states, runner, [[(None, self.chat("rag_cot", st))] for st in states])
        for st, o in zip(states, cots):
            st.cot = o[0].strip()

    def builders(self) -> list[str]:
        """The agents that write a construction ("CoT w. Passage" has none)."""
        return [a for a in self.config.agents if a != "passage"]

    def construct(self, states: list[ActiveRAGState], runner: StageRunner) -> None:
        builders = self.builders()
        rows = []
        for st in states:
            passages = self.passages_text([p.text for p in st.passages])
            st.passages_text = passages
            rows.append([(a, self.chat(f"activerag_{a}", st, passages=passages)) for a in builders])
        built = self.generate_rows("knowledge_construction", states, runner, rows) if builders else \
            [[] for _ in states]
        for st, r, outs in zip(states, rows, built):
            st.construction = dict(zip(builders, (o.strip() for o in outs)))
            st.construction_turns = {a: (chat, o) for (a, chat), o in zip(r, outs)}

    def nexus(self, states: list[ActiveRAGState], runner: StageRunner) -> None:
        c = self.config
        nexus_rows = []
        for st in states:
            row = []
            for a in c.agents:
                knowledge = st.passages_text if a == "passage" else st.construction[a]
                chat = self.chat(f"activerag_nexus_{a}", st, reasoning=st.cot, knowledge=knowledge)
                if c.nexus_context == "conversation" and a != "passage":
                    chat = continue_chat(*st.construction_turns[a], chat)
                row.append((a, chat))
            nexus_rows.append(row)
        nexus = self.generate_rows("cognitive_nexus", states, runner, nexus_rows)
        for st, outs in zip(states, nexus):
            st.final = ("reasoning", list(zip(c.agents, outs)))


__all__ = ["ActiveRAG", "ActiveRAGConfig", "ACTIVERAG_AGENTS", "ACTIVERAG_ABLATIONS", "continue_chat"]
