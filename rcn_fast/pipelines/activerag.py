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
   the reasoning and answers (``activerag_nexus_<agent>``).
5. Multiple choice: ``answer`` -- one scoring pass per agent over its nexus
   output (``rag_answer_reasoning``, label log-probabilities at
   ``"Answer: "``), so ActiveRAG is scored like every other pipeline.
   Open domain: the answer is read from the nexus output
   (:func:`~rcn_fast.pipelines.rag.extract_answer`).

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

from rcn_fast.pipelines.base import QuestionState, StageRunner
from rcn_fast.pipelines.config import ActiveRAGConfig
from rcn_fast.pipelines.rag import RAGPipeline


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

    def knowledge_stages(self, states: list[QuestionState], runner: StageRunner) -> None:
        agents = self.config.agents
        self.retrieve(states)
        cots = self.generate_rows("rag_cot", states, runner, [[(None, self.chat("rag_cot", st))] for st in states])
        for st, o in zip(states, cots):
            st.data["cot"] = o[0].strip()
        rows = []
        for st in states:
            passages = self.passages_text([p.text for p in st.passages])
            rows.append([(a, self.chat(f"activerag_{a}", st, passages=passages)) for a in agents])
        built = self.generate_rows("knowledge_construction", states, runner, rows)
        rows = []
        for st, outs in zip(states, built):
            st.data["construction"] = dict(zip(agents, (o.strip() for o in outs)))
            rows.append([(a, self.chat(f"activerag_nexus_{a}", st, reasoning=st.data["cot"],
                                       knowledge=st.data["construction"][a])) for a in agents])
        nexus = self.generate_rows("cognitive_nexus", states, runner, rows)
        for st, outs in zip(states, nexus):
            st.data["final"] = ("reasoning", list(zip(agents, outs)))


__all__ = ["ActiveRAG"]
