"""ReConnect: explanation-guided retrieval and retrieval knowledge connection.

Stages, each run for the whole batch at once:

1. ``query_expansion`` (generation, 1 per question): a bullet list of
   explanations, read as the reference code reads it (``query_parsing``,
   :mod:`~rcn_fast.pipelines.reconnect_parsing`); at most ``max_queries``
   (default: number of choices) kept.
2. ``retrieval`` (one batched retrieval): top ``n`` passages for every
   explanation and for the question, pooled per question, exact duplicate
   texts removed (first occurrence kept).
3. ``sampling`` (one sampler call): ``N`` subsets of ``K`` pooled passages
   per question (relevance sampler or another strategy; K = ``subset_size``,
   or ``top_n + 1`` with the reference code's ``subset_size="top_n+1"``).
4. ``knowledge_extraction`` (generation, ``N`` per question).
5. ``knowledge_aggregation`` (generation, 1 per question).
6. ``answer`` (one scoring pass per question) with the final explanation,
   prompt ``reconnect_answer`` (pre-fill ``Answer:``; ``answer_turn``;
   the turn's end is ``answer_render``, shared by every pipeline;
   ``"closed_turn"``, set by ``preset="reference"``, is the reference
   code's end of the answer turn on any chat template).

With the defaults (N = 3) a question costs 5 generations and 1 scoring
pass (6 LLM calls, the paper's Table 9). The ablations of the paper's
Tables 3 and 7 (see :data:`ABLATIONS`), per
question with N = 3:

=============  ==========================================================  =====
setting        what runs                                                   calls
=============  ==========================================================  =====
full           expansion, retrieval, sampling, N extractions, aggregation  6
w/o ER         question-only retrieval of ``top_n * (k + 1)``, the rest    5
w/o KC         answer with the pooled passages of explanation retrieval    2
w/o KE         aggregate directly from the pooled passages                 3
w/o KA         answer with the N extractions as a list                     5
w/o ER, KC     question-only retrieval, answer with those passages         1
=============  ==========================================================  =====

("w/o KE, KA" is "w/o KC". The reference code's subsets of ``top_n + 1``
documents, ``subset_size="top_n+1"`` or ``preset="reference"``, cost the
same 6 calls.) When a question's N subsets are not all
distinct (top-K and MMR always; the other strategies when two draws
coincide, e.g. a pool of at most K passages, or two relevance subsets with
the same first document) its extractions are decoded with nucleus
sampling, one seed per subset (``repeat_decoding``), so they differ.

Open questions (:class:`~rcn_fast.data.OpenQuestion`; rcn_fast's extension,
the paper names open-ended QA as future work) go through the same stages
with prompts of their own (``open_query_expansion``: explanations of how to
answer; ``open_knowledge_extraction``, ``open_knowledge_aggregation``;
``open_answer_with_knowledge``); query expansion keeps ``max_queries``
explanations, or :attr:`ReConnectConfig.open_queries`
(4) when it is None. The answer is *generated* with the connected
explanation (an open question has no labels to score), so every setting
above costs the same number of LLM calls, one of them the answer
generation instead of the scoring pass. The result is an
:class:`~rcn_fast.pipelines.OpenPrediction` with StringEM and exact match
computed as the open-domain RAG pipelines do (``answer_extraction``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from rcn_fast._validate import check_bool as _bool
from rcn_fast._validate import check_choice
from rcn_fast._validate import check_int as _int
from rcn_fast._validate import is_number
from rcn_fast.data import MCQuestion
from rcn_fast.data.open_domain import OpenQuestion
from rcn_fast.pipelines.base import QuestionState, StageRunner
from rcn_fast.pipelines.spec import PipelineSpec, Stage
from rcn_fast.pipelines.config import PipelineConfig
from rcn_fast.pipelines.knowledge import as_embedding_retriever, has_embeddings
from rcn_fast.pipelines.rag import ANSWER_EXTRACTIONS, OpenAnswering, OpenView, extract_answer
from rcn_fast.pipelines.reconnect_parsing import QUERY_PARSINGS
from rcn_fast.pipelines.reconnect_settings import (  # noqa: F401  (re-exported)
    ABLATIONS, PRESETS, SAMPLING_STRATEGIES, SCALE_WIDTH, SUBSET_TOP_N_PLUS_ONE, ablation_settings, fill_preset,
    preset_settings,
)
from rcn_fast.pipelines.reconnect_stages import RECONNECT_STAGES, ReConnectState, reconnect_stages
from rcn_fast.pipelines.simple import QUERY_MODES, question_query


@dataclass
class ReConnectConfig(PipelineConfig):
    """ReConnect (explanation-guided retrieval + knowledge connection).

    Every default follows the paper (or, where the paper is silent, its
    reference code); docs/FIDELITY.md lists each step with its setting.

    Attributes
    ----------
    top_n : int
        Passages retrieved per query (paper: n = 5). Without explanation
        retrieval ("w/o ER") the question query retrieves
        ``top_n * (k + 1)`` passages, k the explanation cap
        (``max_queries``, default the number of choices), so the pool is as
        large as with ER (the reference code does the same).
    num_subsets : int
        N, document subsets per question (paper: 3); one extraction each.
    subset_size : int or "top_n+1"
        K, documents per subset (paper: 5). ``"top_n+1"`` is the reference
        code's rule: ``top_n + 1`` documents per subset (6 with n = 5; the
        whole pool when it holds at most ``top_n`` documents); the
        ``reference`` preset sets it. See :attr:`subset_k`.
    tau : float
        Softmax temperature of the relevance sampler, as in the paper's
        grid {1.0, 1.5, 2.0} (default 1.0). The sampler draws from
        ``softmax(score_scale * s / tau)``.
    score_scale : float or "width"
        Factor on the sampler's scores s = e.e_j + e_q.e_j (and on the
        relevance of the first draw with ``first="relevance"``): the native
        sampler runs with ``tau / score_scale``. ``"width"`` (default)
        resolves to the width d of the embeddings the sampler sees (the
        encoder's dimension: 384 for all-MiniLM-L6-v2, 768 for E5-base),
        recorded in the trace (``score_scale``) and in
        :meth:`ReConnect.describe`. Why: the reference code sampled on the
        retriever's raw pooled vectors, a LayerNorm output whose squared
        norm is about d, so its scores were d times the cosines this
        pipeline sees by default (``sampler_input="normalized"``); d on
        unit vectors restores the reference's concentration for any
        encoder (issue 31: against the reference's sampler on its own
        vectors, total-variation distance 0.064 at d against 0.335 with
        the former default 32). The paper's tau grid {1.0, 1.5, 2.0} acts
        on top of it (docs/FIDELITY.md shows the subset distribution at
        each tau). A number fixes the factor (32 was the former default;
        ``sampler_input="stored", score_scale=1`` samples on a store's own
        vectors). Strategies other than ``"relevance"`` do not depend on it.
    sampling : {"relevance", "random", "topk", "mmr", "cluster"}
        Subset strategy (ReConnect's Table 3).
    first : {"uniform", "relevance"}
        How the relevance sampler draws the first document of a subset
        (paper and reference code: uniformly).
    sampler_input : {"normalized", "stored"}
        Embeddings the sampler sees: L2-normalised (default, so
        ``score_scale`` has the same meaning for every encoder and store),
        or as the retriever stores them.
    mmr_lambda : float
        Relevance weight of the ``"mmr"`` strategy.
    max_queries : int or None
        Explanation lines kept as queries (>= 1); None = the number of
        choices (open questions, which have none: :attr:`open_queries`,
        4; see :meth:`num_queries`). To retrieve with the question alone
        (no query-expansion generation at all) set
        ``explanation_retrieval=False`` ("w/o ER");
        0 is refused rather than paying for a generation whose output
        would be thrown away.
    query : {"question", "question_choices"}
        The text of the question query Q.
    repeat_decoding : {"nucleus", "greedy"}
        Decoding of the extractions of a question whose N subsets are not
        all distinct (always with ``sampling="topk"`` or ``"mmr"``; with
        the other strategies when two draws coincide, e.g. a pool of at
        most K documents, or two concentrated relevance draws from the
        same first document). ``"nucleus"``
        (default, as the reference code does for top-K): every extraction
        of that question is sampled with ``repeat_temperature`` and
        ``repeat_top_p``, extraction i with its own seed (``seed`` for
        i = 0, a hash of ``(seed, i)`` otherwise; the draw also depends on
        the prompt, so on the question and the subset): the N
        extractions differ and do not depend on batching. ``"greedy"``:
        the run's decoding for every extraction (identical subsets then
        give N identical extractions). Questions whose subsets are all
        distinct always use the run's decoding.
    repeat_top_p : float
        Nucleus mass of those extractions (reference code: 0.7).
    repeat_temperature : float
        Their sampling temperature (> 0; reference code: 1.0, the
        transformers default).
    explanation_retrieval : bool
        False = ablation "w/o ER": retrieve with the question only, no
        query-expansion generation, ``top_n * (k + 1)`` passages.
    knowledge_connection : bool
        False = "w/o KC": no sampling, extraction or aggregation; the
        answering step gets every pooled passage (the paper's Tables 3 and
        7 give identical numbers for "w/o KC" and "w/o KE, KA": it is the
        same setting). Setting it False also sets ``knowledge_extraction``
        and ``knowledge_aggregation`` False, so the recorded config says
        what ran.
    knowledge_extraction : bool
        False = "w/o KE": no sampling and no extraction; aggregate
        directly from every pooled passage.
    knowledge_aggregation : bool
        False = "w/o KA": no aggregation; answer with the N extraction
        outputs as an N-item list (one item per extraction, its
        explanations joined; empty extractions left out).
        ``knowledge_extraction`` and ``knowledge_aggregation`` both False
        is "w/o KE, KA" = "w/o KC".
    query_parsing : {"reference", "markers"}
        How the query-expansion output becomes queries
        (:func:`~rcn_fast.pipelines.reconnect_parsing.parse_queries`).
        ``"reference"`` (default; the reference code's rule, the paper is
        silent): the first paragraph's lines with every ``*`` deleted,
        stripped, empty ones dropped, the first k kept (numbers and
        ``D:`` prefixes stay). ``"markers"``: rcn_fast's former parser
        (:func:`~rcn_fast.prompts.parse_bullets`, list markers stripped).
    answer_turn : {"reference", "shared"}
        The answering prompt. ``"reference"`` (default): ReConnect's own
        ``reconnect_answer`` prompt (paper Table 18). ``"shared"``: the
        ``answer_with_knowledge`` prompt the other pipelines score with
        (rcn_fast's former ReConnect answer). Either way the pre-filled
        turn ``Answer:`` ends by ``answer_render``, as every pipeline's.
    answer_render : {"prefill", "closed_turn", "trailing_space"}
        How the answer turn ends the prompt: a setting every pipeline
        shares (:class:`~rcn_fast.pipelines.config.PipelineConfig`), so one
        ``--pipeline-args answer_render=...`` sets the answer turn of every
        pipeline of a comparison. ``"prefill"`` (default): ``Answer:``
        continued as written. ``"closed_turn"`` (set by
        ``preset="reference"``): the reference code's own rule on any chat
        template -- the turn ``Answer: `` rendered as a complete assistant
        message, cut where the template's end-of-turn token begins
        (:func:`rcn_fast.llm.chat.render_closed_turn`). The same ids as the
        default with Llama 3's template (it trims the space); ``Answer: ``
        with ChatML templates (SmolLM2), whose turns keep it.
    preset : {"reference"} or None
        A named set of settings (:data:`PRESETS`): ``"reference"`` = the
        authors' released code where it differs from the paper
        (``subset_size="top_n+1"``, ``max_new_tokens=196``,
        ``repeat_decoding="greedy"`` unless ``sampling="topk"``,
        ``answer_render="closed_turn"``). Settings
        given beside the preset win (``from_dict`` / ``build``); on direct
        construction the preset fills the fields left at their defaults.
    answer_extraction : {"full", "final"}
        Open questions only (rcn_fast's extension; the answer is generated):
        what StringEM and exact match are computed on, as in the
        open-domain RAG pipelines (:class:`RAGConfig`): ``"full"``
        (default) the whole answer generation, ``"final"`` its
        ``Answer:`` line (first non-empty line without a marker).
    """

    name: ClassVar[str] = "reconnect"
    #: Explanations kept for an open question when ``max_queries`` is None.
    open_queries: ClassVar[int] = 4
    top_n: int = 5
    num_subsets: int = 3
    subset_size: int | str = 5
    tau: float = 1.0
    score_scale: float | str = "width"
    sampling: str = "relevance"
    first: str = "uniform"
    sampler_input: str = "normalized"
    mmr_lambda: float = 0.5
    max_queries: int | None = None
    query: str = "question"
    repeat_decoding: str = "nucleus"
    repeat_top_p: float = 0.7
    repeat_temperature: float = 1.0
    explanation_retrieval: bool = True
    knowledge_connection: bool = True
    knowledge_extraction: bool = True
    knowledge_aggregation: bool = True
    query_parsing: str = "reference"
    answer_turn: str = "reference"
    preset: str | None = None
    answer_extraction: str = "full"

    def __post_init__(self) -> None:
        if self.preset is not None:
            check_choice(self.preset, "preset", tuple(PRESETS))
            fill_preset(self)
        super().__post_init__()
        _int(self.top_n, "top_n")
        _int(self.num_subsets, "num_subsets")
        if self.subset_size != SUBSET_TOP_N_PLUS_ONE:
            if isinstance(self.subset_size, str):
                raise ValueError(f"subset_size: expected an int >= 1 or {SUBSET_TOP_N_PLUS_ONE!r}, "
                                 f"got {self.subset_size!r}")
            _int(self.subset_size, "subset_size")
        if self.max_queries == 0 and not isinstance(self.max_queries, bool):
            raise ValueError("max_queries: expected an int >= 1 or None, got 0; to retrieve with the question "
                             "only, set explanation_retrieval=False (the 'w/o ER' ablation)")
        _int(self.max_queries, "max_queries", 1, allow_none=True)
        for f in ("tau", "score_scale", "repeat_temperature"):
            v = getattr(self, f)
            if f == "score_scale" and v == SCALE_WIDTH:
                continue
            if not is_number(v) or not 0 < v < float("inf"):
                raise ValueError(f"{f}: expected a finite number > 0, got {v!r}")
            setattr(self, f, float(v))
        if not is_number(self.repeat_top_p) or not 0 < self.repeat_top_p <= 1:
            raise ValueError(f"repeat_top_p: expected a number in (0, 1], got {self.repeat_top_p!r}")
        self.repeat_top_p = float(self.repeat_top_p)
        check_choice(self.repeat_decoding, "repeat_decoding", ("nucleus", "greedy"))
        check_choice(self.sampling, "sampling", SAMPLING_STRATEGIES)
        check_choice(self.first, "first", ("uniform", "relevance"))
        check_choice(self.sampler_input, "sampler_input", ("normalized", "stored"))
        if not isinstance(self.mmr_lambda, (int, float)) or not 0 <= self.mmr_lambda <= 1:
            raise ValueError(f"mmr_lambda: expected a number in [0, 1], got {self.mmr_lambda!r}")
        check_choice(self.query, "query", QUERY_MODES)
        for f in ("explanation_retrieval", "knowledge_connection", "knowledge_extraction", "knowledge_aggregation"):
            _bool(getattr(self, f), f)
        if not self.knowledge_connection:  # "w/o KC" is "w/o KE, KA" (Tables 3 and 7)
            self.knowledge_extraction = self.knowledge_aggregation = False
        elif not (self.knowledge_extraction or self.knowledge_aggregation):
            self.knowledge_connection = False
        check_choice(self.answer_extraction, "answer_extraction", ANSWER_EXTRACTIONS)
        check_choice(self.query_parsing, "query_parsing", QUERY_PARSINGS)
        check_choice(self.answer_turn, "answer_turn", ("reference", "shared"))

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "ReConnectConfig":
        """Settings -> config; a ``preset`` key starts from that preset's
        settings and the other keys override them."""
        d = dict(d)
        name = d.pop("preset", None)
        if name is None:
            return super().from_dict(d)  # type: ignore[return-value]
        check_choice(name, "preset", tuple(PRESETS))
        cfg = super().from_dict({**preset_settings(name, d.get("sampling", "relevance")), **d})
        cfg.preset = name
        return cfg  # type: ignore[return-value]

    @property
    def subset_k(self) -> int:
        """K, the documents per subset: ``subset_size``, or ``top_n + 1``
        with ``subset_size="top_n+1"`` (the sampler caps it at the pool)."""
        if self.subset_size == SUBSET_TOP_N_PLUS_ONE:
            return self.top_n + 1
        return int(self.subset_size)

    def resolved_score_scale(self, width: int) -> float:
        """The factor on the sampler's scores for embeddings of ``width``
        dimensions (``score_scale``, or ``width`` with ``"width"``)."""
        if self.score_scale == SCALE_WIDTH:
            _int(width, "width")
            return float(width)
        return float(self.score_scale)

    def sampler_tau(self, width: int) -> float:
        """The temperature the sampler runs with on embeddings of ``width``
        dimensions: ``tau / score_scale`` (see :meth:`resolved_score_scale`)."""
        return self.tau / self.resolved_score_scale(width)

    @property
    def samples_subsets(self) -> bool:
        """Whether subsets are drawn (knowledge connection with extraction)."""
        return self.knowledge_connection and self.knowledge_extraction

    def num_queries(self, num_choices: int) -> int:
        """k: the explanations kept as queries for a question with
        ``num_choices`` options (``max_queries``, else ``num_choices``; an
        open question, 0 options, gets :attr:`open_queries`)."""
        if self.max_queries is not None:
            return self.max_queries
        return num_choices if num_choices > 0 else self.open_queries

    def pool_queries(self, num_choices: int) -> int:
        """k + 1: the queries of explanation retrieval for a question with
        ``num_choices`` options (k explanations + the question, see
        :meth:`num_queries`). Without ER the question query retrieves
        ``top_n`` times this many passages."""
        return self.num_queries(num_choices) + 1

    @property
    def generations_per_question(self) -> int:
        """LLM generations one question costs under these settings: the
        calls of ReConnect's stage list under them (:func:`reconnect_stages`;
        1 for query expansion, N extractions, 1 aggregation, each when on)
        without the answer."""
        return sum(s.llm_calls_per_question(self) for s in reconnect_stages(RECONNECT_STAGES, self)
                   if s.name != "answer")

    @property
    def llm_calls_per_question(self) -> int:
        """Generations plus the one answer-scoring pass (the paper's
        Table 9 counts 6 for N = 3)."""
        return sum(s.llm_calls_per_question(self) for s in reconnect_stages(RECONNECT_STAGES, self))

    @property
    def open_generations_per_question(self) -> int:
        """Generations of one open question: the same stages, and the
        answer is a generation instead of the scoring pass (so as many LLM
        calls as :attr:`llm_calls_per_question`, none of them scoring)."""
        return self.llm_calls_per_question


class ReConnect(OpenAnswering):
    """ReConnect with all its ablations: the stage list
    ``[QueryExpansion, ExplanationRetrieval, RelevanceSampling,
    KnowledgeExtraction, KnowledgeAggregation, AnswerScoring]``
    (:mod:`~rcn_fast.pipelines.reconnect_stages`), edited per ablation
    (:func:`~rcn_fast.pipelines.reconnect_stages.reconnect_stages`).

    Parameters
    ----------
    llm : LLM
    config : ReConnectConfig, optional
    retriever : retriever
        An rcn_fast ``Retriever``, an :class:`~rcn_fast.pipelines.InMemoryRetriever`,
        or anything :func:`~rcn_fast.pipelines.knowledge.as_embedding_retriever`
        accepts (strategies other than ``"random"`` need embeddings).
    prompts : path, mapping or PromptSet, optional
        Overrides ``config.prompts``.

    Examples
    --------
    >>> p = rcn_fast.pipelines.build("reconnect", llm=llm, retriever=retriever, num_subsets=3)  # doctest: +SKIP
    >>> [t["stage"] for t in p.run(question).trace]                                          # doctest: +SKIP
    ['query_expansion', 'retrieval', 'sampling', 'knowledge_extraction', 'knowledge_extraction',
     'knowledge_extraction', 'knowledge_aggregation', 'answer']
    """

    name = "reconnect"
    config_class = ReConnectConfig
    # answers OpenQuestion too (rcn_fast's extension, see the module docstring)
    spec = PipelineSpec(retrieves="corpus", answers_open=True, stages=RECONNECT_STAGES)
    state_class = ReConnectState

    def __init__(self, llm: Any, config: Any = None, *, retriever: Any = None, prompts: Any = None) -> None:
        super().__init__(llm, config, retriever=retriever, prompts=prompts)
        self.source = as_embedding_retriever(retriever)
        c = self.config
        if c.samples_subsets and c.sampling != "random" and not has_embeddings(self.source):
            raise TypeError(
                f"retriever: sampling={c.sampling!r} needs embeddings, but {type(retriever).__name__} offers "
                "neither an encoder nor the EmbeddingRetriever methods; use sampling='random' or an "
                "rcn_fast Retriever"
            )

    def declared_stages(self) -> tuple[Stage, ...]:
        """The class's stage list under this config's ablations."""
        return reconnect_stages(self.spec.stages, self.config)

    # ------------------------------------------------------------ cost, from the stage list
    @property
    def generations_per_question(self) -> int:
        return sum(s.llm_calls_per_question(self.config) for s in self.stages if s.name != "answer")

    @property
    def open_generations_per_question(self) -> int:
        return sum(s.llm_calls_per_question(self.config) for s in self.stages)

    @property
    def scoring_passes_per_question(self) -> int:
        return sum(s.llm_calls_per_question(self.config) for s in self.stages if s.name == "answer")

    # ------------------------------------------------------------ the answer
    def answer_stage(self, states: list[QuestionState], runner: StageRunner) -> list[list[float]]:
        """Score the labels after ReConnect's answering prompt (one pass per
        question): ``reconnect_answer`` or, with ``answer_turn="shared"``,
        the ``answer_with_knowledge`` prompt of the other pipelines; its
        answer turn ends as every pipeline's (``answer_render``, applied by
        the runner)."""
        stage = "reconnect_answer" if self.config.answer_turn == "reference" else "answer_with_knowledge"
        chats = [self.prompts.chat(stage, st.question, knowledge=self.prompts.format_list(st.knowledge))
                 for st in states]
        return runner.score("answer", states, chats)

    def open_answer_stage(self, states: list[QuestionState], runner: StageRunner) -> list[tuple[str, str, dict]]:
        """Open questions: one answer generation per question (one LLM call
        for the batch) with the connected explanation -> per question
        (answer text by ``answer_extraction``, the whole generation, {})."""
        chats = [[self.stage_chat("answer_with_knowledge", st, knowledge=self.prompts.format_list(st.knowledge))]
                 for st in states]
        outs = runner.generate("answer", states, chats)
        res = []
        for st, o in zip(states, outs):
            ans = extract_answer(o[0], self.config.answer_extraction)
            st.trace[-1]["answer"] = ans
            res.append((ans, o[0], {}))
        return res

    def embedding_width(self) -> int | None:
        """The encoder's embedding dimension when the retriever tells it
        (``dim`` of the retriever or its encoder), else None."""
        src = self.source
        for obj in (src, getattr(src, "encoder", None), getattr(src, "retriever", None)):
            d = getattr(obj, "dim", None)
            if isinstance(d, (int, np.integer)) and not isinstance(d, bool) and d > 0:
                return int(d)
        return None

    def describe(self) -> dict[str, Any]:
        """As every pipeline, plus ``resolved``: the subset size K and the
        sampler's score scale these settings come to with this retriever
        (``score_scale="width"`` -> the encoder's dimension; None when the
        retriever does not tell it)."""
        d = super().describe()
        c, width = self.config, self.embedding_width()
        scale = c.resolved_score_scale(width) if width or c.score_scale != "width" else None
        d["resolved"] = {"subset_size": c.subset_k, "score_scale": scale, "embedding_width": width}
        return d

    # ------------------------------------------------------------ helpers of the stages
    def stage_chat(self, stage: str, st: QuestionState, **extra: Any) -> list[dict[str, str]]:
        """The chat of ``stage`` for one question: the stage's prompt for a
        multiple-choice question, ``open_<stage>`` (no options) for an open one."""
        if isinstance(st.question, OpenQuestion):
            return self.prompts.chat(f"open_{stage}", OpenView(st.question), **extra)
        return self.prompts.chat(stage, st.question, **extra)

    def question_query(self, question: Any) -> str:
        """The question query Q (an open question's text: it has no options)."""
        if isinstance(question, OpenQuestion):
            return question.question
        return question_query(question, self.config.query)

    @staticmethod
    def num_choices(question: Any) -> int:
        return len(question.choices) if isinstance(question, MCQuestion) else 0


__all__ = ["ReConnect", "ReConnectConfig", "ABLATIONS", "ablation_settings", "SAMPLING_STRATEGIES"]
