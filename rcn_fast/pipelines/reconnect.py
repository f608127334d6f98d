"""ReConnect: explanation-guided retrieval and retrieval knowledge connection.

Stages, each run for the whole batch at once:

1. ``query_expansion`` (generation, 1 per question): a bullet list of
   explanations; at most ``max_queries`` (default: number of choices) kept.
2. ``retrieval`` (one batched retrieval): top ``n`` passages for every
   explanation and for the question, pooled per question, exact duplicate
   texts removed (first occurrence kept).
3. ``sampling`` (one sampler call): ``N`` subsets of ``K`` pooled passages
   per question (relevance sampler or another strategy).
4. ``knowledge_extraction`` (generation, ``N`` per question).
5. ``knowledge_aggregation`` (generation, 1 per question).
6. ``answer`` (one scoring pass per question) with the final explanation.

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

("w/o KE, KA" is "w/o KC".) When a question's N subsets are not all
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
from rcn_fast.pipelines.base import QuestionState, StageRunner, question_key
from rcn_fast.pipelines.config import PipelineConfig
from rcn_fast.pipelines.knowledge import as_embedding_retriever, has_embeddings, retrieve_batch
from rcn_fast.pipelines.rag import ANSWER_EXTRACTIONS, OpenAnswering, _OpenView, extract_answer
from rcn_fast.pipelines.simple import QUERY_MODES, question_query
from rcn_fast.prompts import parse_bullets
from rcn_fast.retrieval.types import Passage


#: Subset sampling strategies: the paper's relevance sampling and Table 3's ablations.
SAMPLING_STRATEGIES = ("relevance", "random", "topk", "mmr", "cluster")


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
    subset_size : int
        K, documents per subset (paper: 5).
    tau : float
        Softmax temperature of the relevance sampler, as in the paper's
        grid {1.0, 1.5, 2.0} (default 1.0). The sampler draws from
        ``softmax(score_scale * s / tau)``.
    score_scale : float
        Factor on the sampler's scores s = e.e_j + e_q.e_j (and on the
        relevance of the first draw with ``first="relevance"``), i.e. the
        native sampler runs with ``tau / score_scale``. The paper's
        reference code sampled on the retriever's raw pooled vectors (a
        LayerNorm output, squared norms of the order of the width, 768),
        so at tau = 1 each step after the uniform first document was close
        to an argmax. With ``sampler_input="normalized"`` (default) the
        scores are cosines, which span well under one nat: ``score_scale =
        32`` restores a concentrated draw while the paper's tau grid still
        changes it (all-MiniLM-L6-v2, 600 OpenBookQA facts, 30 questions,
        pool of 12: the second document lands among the 3 best-scoring
        candidates 99%, 94% and 92% of the time at tau = 1, 1.5, 2;
        uniform drawing: 27%; stored unit vectors with score_scale = 1:
        28%). ``score_scale = 768`` (the width of an
        E5-base retriever) mimics the reference exactly (an argmax at
        every tau of the grid). The old, nearly uniform behaviour is
        ``sampler_input="stored", score_scale=1.0`` over a store of
        normalised vectors. Strategies other than ``"relevance"`` do not
        depend on the scale.
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
    subset_size: int = 5
    tau: float = 1.0
    score_scale: float = 32.0
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
    answer_extraction: str = "full"

    def __post_init__(self) -> None:
        super().__post_init__()
        _int(self.top_n, "top_n")
        _int(self.num_subsets, "num_subsets")
        _int(self.subset_size, "subset_size")
        if self.max_queries == 0 and not isinstance(self.max_queries, bool):
            raise ValueError("max_queries: expected an int >= 1 or None, got 0; to retrieve with the question "
                             "only, set explanation_retrieval=False (the 'w/o ER' ablation)")
        _int(self.max_queries, "max_queries", 1, allow_none=True)
        for f in ("tau", "score_scale", "repeat_temperature"):
            v = getattr(self, f)
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

    @property
    def sampler_tau(self) -> float:
        """The temperature the sampler runs with: ``tau / score_scale``."""
        return self.tau / self.score_scale

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
        """LLM generations one question costs under these settings (1 for
        query expansion, N extractions, 1 aggregation, each when on)."""
        n = int(self.explanation_retrieval)
        if self.samples_subsets:
            n += self.num_subsets
        return n + int(self.knowledge_connection and self.knowledge_aggregation)

    @property
    def llm_calls_per_question(self) -> int:
        """Generations plus the one answer-scoring pass (the paper's
        Table 9 counts 6 for N = 3)."""
        return self.generations_per_question + 1

    @property
    def open_generations_per_question(self) -> int:
        """Generations of one open question: the same stages, and the
        answer is a generation instead of the scoring pass (so as many LLM
        calls as :attr:`llm_calls_per_question`, none of them scoring)."""
        return self.generations_per_question + 1


# Named ablations of ReConnect's Tables 3 and 7 -> the settings they switch
# off. "w/o KC" and "w/o KE, KA" are one setting (the tables report
# identical numbers for them). Sampling rows of Table 3 ("w/ Random", ...)
# are ``sampling=`` values, not ablations.
ABLATIONS: dict[str, dict[str, Any]] = {
    "w/o ER": {"explanation_retrieval": False},
    "w/o KC": {"knowledge_connection": False, "knowledge_extraction": False, "knowledge_aggregation": False},
    "w/o ER, KC": {"explanation_retrieval": False, "knowledge_connection": False, "knowledge_extraction": False,
                   "knowledge_aggregation": False},
    "w/o KE": {"knowledge_extraction": False},
    "w/o KA": {"knowledge_aggregation": False},
    "w/o KE, KA": {"knowledge_connection": False, "knowledge_extraction": False, "knowledge_aggregation": False},
}


def ablation_settings(names: str | list[str] | None) -> dict[str, Any]:
    """``"w/o KC"`` (or ``"wo_kc"``, a list of them) -> ReConnect settings."""
    if names is None:
        return {}
    if isinstance(names, str):
        names = [names]
    out: dict[str, Any] = {}
    norm = {k.lower().replace("/", "").replace(" ", "").replace("_", ""): k for k in ABLATIONS}
    for n in names:
        key = norm.get(str(n).lower().replace("/", "").replace(" ", "").replace("_", "").replace("-", ""))
        if key is None:
            raise ValueError(f"ablation: expected one of {list(ABLATIONS)}, got {n!r}")
        out.update(ABLATIONS[key])
    return out


def _normalize(x: np.ndarray) -> np.ndarray:
    n = np.linalg.norm(x, axis=-1, keepdims=True)
    return x / np.where(n > 0, n, 1.0)


class ReConnect(OpenAnswering):
    """ReConnect with all its ablations.

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
    retriever_kind = "corpus"
    answers_open = True  # answers OpenQuestion too (rcn_fast's extension, see the module docstring)

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

    @property
    def generations_per_question(self) -> int:
        return self.config.generations_per_question

    @property
    def open_generations_per_question(self) -> int:
        return self.config.open_generations_per_question

    @property
    def scoring_passes_per_question(self) -> int:
        return 1

    def open_answer_stage(self, states: list[QuestionState], runner: StageRunner) -> list[tuple[str, str, dict]]:
        """Open questions: one answer generation per question (one LLM call
        for the batch) with the connected explanation -> per question
        (answer text by ``answer_extraction``, the whole generation, {})."""
        chats = [[self._chat("answer_with_knowledge", st, knowledge=self.prompts.format_list(st.knowledge))]
                 for st in states]
        outs = runner.generate("answer", states, chats)
        res = []
        for st, o in zip(states, outs):
            ans = extract_answer(o[0], self.config.answer_extraction)
            st.trace[-1]["answer"] = ans
            res.append((ans, o[0], {}))
        return res

    # ------------------------------------------------------------ open questions
    def _chat(self, stage: str, st: QuestionState, **extra: Any) -> list[dict[str, str]]:
        """The chat of ``stage`` for one question: the stage's prompt for a
        multiple-choice question, ``open_<stage>`` (no options) for an open one."""
        if isinstance(st.question, OpenQuestion):
            return self.prompts.chat(f"open_{stage}", _OpenView(st.question), **extra)
        return self.prompts.chat(stage, st.question, **extra)

    def _question_query(self, question: Any) -> str:
        """The question query Q (an open question's text: it has no options)."""
        if isinstance(question, OpenQuestion):
            return question.question
        return question_query(question, self.config.query)

    @staticmethod
    def _num_choices(question: Any) -> int:
        return len(question.choices) if isinstance(question, MCQuestion) else 0

    # ------------------------------------------------------------------ stages
    def knowledge_stages(self, states: list[QuestionState], runner: StageRunner) -> None:
        c = self.config
        self._query_expansion(states, runner)
        qemb = self._retrieve(states)
        if not c.knowledge_connection:
            # w/o KC (= w/o KE, KA): answer with every pooled passage
            for st in states:
                st.knowledge = [p.text for p in st.passages]
            return
        if c.knowledge_extraction:
            for st, subs in zip(states, self._sample(states, qemb)):
                st.data["subsets"] = subs
            self._extract(states, runner)
        if c.knowledge_aggregation:
            self._aggregate(states, runner)
        else:  # w/o KA: one list item per extraction output
            for st in states:
                st.knowledge = self._extraction_items(st)

    def _query_expansion(self, states: list[QuestionState], runner: StageRunner) -> None:
        c = self.config
        if not c.explanation_retrieval:
            for st in states:
                st.data["explanations"] = []
            return
        chats = [[self._chat("query_expansion", st)] for st in states]
        outs = runner.generate("query_expansion", states, chats)
        for st, o in zip(states, outs):
            k = c.num_queries(self._num_choices(st.question))
            exps = parse_bullets(o[0], max_items=k)
            st.data["explanations"] = exps
            st.trace[-1]["parsed"] = exps

    def _retrieve(self, states: list[QuestionState]) -> np.ndarray | None:
        """One batched retrieval for every query of every question; returns
        the question-query embeddings [B, d] (None without embeddings).

        With explanation retrieval each query gets ``top_n`` passages; without
        it the question query gets ``top_n * (k + 1)`` (k the explanation
        cap), so the pool is as large as with ER. Questions that ask for the
        same count share one retrieval call (with ER: the whole batch), so a
        question's passages never depend on the rest of its batch."""
        c = self.config
        flat: list[str] = []
        spans = []
        for st in states:
            qs = [*st.data["explanations"], self._question_query(st.question)]
            spans.append((len(flat), len(flat) + len(qs)))
            flat.extend(qs)
        if c.explanation_retrieval:
            counts = [c.top_n] * len(states)
        else:
            counts = [c.top_n * c.pool_queries(self._num_choices(st.question)) for st in states]
        results: list[list[Passage]] = [[] for _ in flat]
        emb_rows: list[np.ndarray | None] = [None] * len(flat)
        for k in sorted(set(counts)):
            rows = [i for (s, e), kb in zip(spans, counts) if kb == k for i in range(s, e)]
            res_k, emb_k = retrieve_batch(self.source, [flat[i] for i in rows], k)
            for j, i in enumerate(rows):
                results[i] = res_k[j]
                emb_rows[i] = None if emb_k is None else emb_k[j]
        qemb = None
        if spans and all(emb_rows[e - 1] is not None for _, e in spans):
            qemb = np.stack([emb_rows[e - 1] for _, e in spans])
        for st, (s, e), k in zip(states, spans, counts):
            res_q = [list(r) for r in results[s:e]]
            seen: set[str] = set()
            pool: list[Passage] = []
            for res in res_q:
                for p in res:
                    if p.text not in seen:
                        seen.add(p.text)
                        pool.append(p)
            st.passages = pool
            st.trace.append({
                "stage": "retrieval", "type": "retrieve", "queries": flat[s:e], "top_n": k,
                "results": [[p.id for p in res] for res in res_q], "pool": [p.id for p in pool],
            })
        return qemb

    def _sample(self, states: list[QuestionState], qemb: np.ndarray | None) -> list[list[list[Passage]]]:
        """One sampler call for the batch -> per question, N subsets."""
        from rcn_fast.sampling import sample

        c = self.config
        B = len(states)
        counts = np.array([len(st.passages) for st in states], dtype=np.int64)
        nmax = int(counts.max()) if B else 0
        if nmax == 0:
            subsets = [[[] for _ in range(c.num_subsets)] for _ in states]
        else:
            if qemb is not None and has_embeddings(self.source):
                flat = [p for st in states for p in st.passages]
                pemb = np.asarray(self.source.passage_embeddings(flat), dtype=np.float32)
                d = pemb.shape[1]
                cand = np.zeros((B, nmax, d), np.float32)
                off = 0
                for b, n in enumerate(counts):
                    cand[b, :n] = pemb[off : off + n]
                    off += n
                q = np.asarray(qemb, dtype=np.float32)
                if c.sampler_input == "normalized":
                    q, cand = _normalize(q), _normalize(cand)
            else:  # "random" needs no embeddings
                q, cand = np.zeros((B, 1), np.float32), np.zeros((B, nmax, 1), np.float32)
            keys = np.array([question_key(st.id) for st in states], dtype=np.int64)
            ids = sample(c.sampling, q, cand, c.num_subsets, c.subset_size, seed=c.seed, keys=keys,
                         valid=counts, tau=c.sampler_tau, first=c.first, mmr_lambda=c.mmr_lambda)
            ids = np.asarray(ids)
            subsets = [[[st.passages[j] for j in row if j >= 0] for row in ids[b]] for b, st in enumerate(states)]
        for st, subs in zip(states, subsets):
            entry = {"stage": "sampling", "type": "sample", "strategy": c.sampling,
                     "subsets": [[p.id for p in s] for s in subs]}
            if c.sampling == "relevance":
                entry.update(tau=c.tau, score_scale=c.score_scale, sampler_tau=c.sampler_tau)
            st.trace.append(entry)
        return subsets

    @staticmethod
    def _subsets_repeat(subsets: list[list[Passage]]) -> bool:
        """Whether two of a question's subsets hold the same documents."""
        keys = [frozenset(p.text for p in s) for s in subsets]
        return len(set(keys)) < len(keys)

    def repeat_decoding(self, subset: int) -> dict[str, Any]:
        """Decoding of extraction ``subset`` of a question whose subsets
        repeat: nucleus sampling with its own seed (``seed`` for subset 0, a
        hash of ``(seed, subset)`` otherwise; the draw also depends on the
        prompt, i.e. on the question and the subset)."""
        from rcn_fast.llm.seeded import sample_seed

        c = self.config
        return {"temperature": c.repeat_temperature, "top_p": c.repeat_top_p,
                "seed": sample_seed(c.seed, subset)}

    def _extract(self, states: list[QuestionState], runner: StageRunner) -> None:
        """N extractions per question. Questions whose subsets are all
        distinct share one call with the run's decoding; with
        ``repeat_decoding="nucleus"`` the others are decoded with nucleus
        sampling, one call per subset index (its seed), so a question's
        extractions differ and do not depend on the batch."""
        c = self.config
        P = self.prompts
        chats = [[self._chat("knowledge_extraction", st, documents=P.format_list([p.text for p in sub]))
                  for sub in st.data["subsets"]] for st in states]
        sampled = [c.repeat_decoding == "nucleus" and self._subsets_repeat(st.data["subsets"]) for st in states]
        outs: list[list[str]] = [[] for _ in states]
        plain = runner.generate("knowledge_extraction", states,
                                [[] if smp else cs for smp, cs in zip(sampled, chats)])
        for b, o in enumerate(plain):
            outs[b].extend(o)
        if any(sampled):
            for i in range(c.num_subsets):
                rows = [[cs[i]] if smp and i < len(cs) else [] for smp, cs in zip(sampled, chats)]
                if not any(rows):
                    continue
                got = runner.generate("knowledge_extraction", states, rows, decoding=self.repeat_decoding(i))
                for b, o in enumerate(got):
                    outs[b].extend(o)
        for st, texts in zip(states, outs):
            exts = [parse_bullets(t) for t in texts]
            st.data["extractions"] = exts
            entries = [t for t in st.trace if t["stage"] == "knowledge_extraction" and t["type"] == "generate"]
            for entry, parsed in zip(entries, exts):
                entry["parsed"] = parsed

    @staticmethod
    def _extraction_items(st: QuestionState) -> list[str]:
        """The N extraction outputs as N items (each one's explanations
        joined by spaces; empty outputs left out)."""
        return [x for x in (" ".join(exps) for exps in st.data["extractions"]) if x]

    def _aggregate(self, states: list[QuestionState], runner: StageRunner) -> None:
        """One aggregation per question: over the N extraction outputs, or
        without extraction ("w/o KE") over every pooled passage."""
        P = self.prompts
        chats = []
        for st in states:
            if self.config.knowledge_extraction:
                items = self._extraction_items(st)
            else:
                items = [p.text for p in st.passages]
            chats.append([self._chat("knowledge_aggregation", st, explanations=P.format_list(items))])
        outs = runner.generate("knowledge_aggregation", states, chats)
        for st, o in zip(states, outs):
            st.knowledge = parse_bullets(o[0])
            st.trace[-1]["parsed"] = st.knowledge


__all__ = ["ReConnect", "ReConnectConfig", "ABLATIONS", "ablation_settings", "SAMPLING_STRATEGIES"]
