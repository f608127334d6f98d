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

from typing import Any

import numpy as np

from rcn_fast.data import MCQuestion
from rcn_fast.data.open_domain import OpenQuestion
from rcn_fast.pipelines.base import QuestionState, StageRunner, question_key
from rcn_fast.pipelines.knowledge import as_embedding_retriever, has_embeddings, retrieve_batch
from rcn_fast.pipelines.rag import OpenAnswering, _OpenView, extract_answer
from rcn_fast.pipelines.reconnect_config import (  # noqa: F401  (re-exported)
    ABLATIONS, PRESETS, SAMPLING_STRATEGIES, ReConnectConfig, ablation_settings, preset_settings,
)
from rcn_fast.pipelines.reconnect_parsing import parse_queries
from rcn_fast.pipelines.simple import question_query
from rcn_fast.prompts import parse_bullets
from rcn_fast.retrieval.types import Passage


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

    def answer_stage(self, states: list[QuestionState], runner: StageRunner) -> list[list[float]]:
        """Score the labels after ReConnect's answering prompt (one pass per
        question): ``reconnect_answer`` (pre-fill ``Answer:``, the reference
        code's rendering) or, with ``answer_turn="shared"``, the
        ``answer_with_knowledge`` prompt of the other pipelines."""
        stage = "reconnect_answer" if self.config.answer_turn == "reference" else "answer_with_knowledge"
        chats = [self.prompts.chat(stage, st.question, knowledge=self.prompts.format_list(st.knowledge))
                 for st in states]
        return runner.score("answer", states, chats)

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
            exps = parse_queries(o[0], k, c.query_parsing)
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
                d = width = pemb.shape[1]
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
                width = self.embedding_width() or 1
            keys = np.array([question_key(st.id) for st in states], dtype=np.int64)
            ids = sample(c.sampling, q, cand, c.num_subsets, c.subset_k, seed=c.seed, keys=keys,
                         valid=counts, tau=c.sampler_tau(width), first=c.first, mmr_lambda=c.mmr_lambda)
            ids = np.asarray(ids)
            subsets = [[[st.passages[j] for j in row if j >= 0] for row in ids[b]] for b, st in enumerate(states)]
        if nmax == 0:
            width = self.embedding_width() or 1
        for st, subs in zip(states, subsets):
            entry = {"stage": "sampling", "type": "sample", "strategy": c.sampling, "subset_size": c.subset_k,
                     "subsets": [[p.id for p in s] for s in subs]}
            if c.sampling == "relevance":
                scale = c.resolved_score_scale(width)
                entry.update(tau=c.tau, score_scale=scale, sampler_tau=c.tau / scale)
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
