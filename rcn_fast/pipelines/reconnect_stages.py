"""ReConnect's stages as declared stage objects, its typed per-question
state, and the ablations of the paper's Tables 3 and 7 as edits of the
stage list (:func:`reconnect_stages`).

ReConnect is ``[QueryExpansion, ExplanationRetrieval, RelevanceSampling,
KnowledgeExtraction, KnowledgeAggregation, AnswerScoring]``. Each stage
reads the pipeline (``runner.pipeline``: its config, prompts, retriever
adapter ``source`` and the helpers ``stage_chat``, ``question_query``,
``num_choices``, ``embedding_width``) and the fields of
:class:`ReConnectState` it names in ``reads`` / ``writes``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from rcn_fast.pipelines.base import Answer, QuestionState, StageRunner, question_key
from rcn_fast.pipelines.knowledge import has_embeddings, passage_refs, retrieve_batch
from rcn_fast.pipelines.spec import Stage, remove_stages, replace_stage
from rcn_fast.prompts import parse_bullets
from rcn_fast.retrieval.types import Passage


@dataclass
class ReConnectState(QuestionState):
    """One question moving through ReConnect's stages.

    Attributes
    ----------
    explanations : list of str
        The parsed query-expansion output (the retrieval queries besides the question).
    query_embedding : float32 [d] or None
        The question query's embedding (from retrieval), for the sampler.
    subsets : list of list of Passage
        The N sampled document subsets.
    extractions : list of list of str
        The parsed explanations of each extraction, one list per subset.
    """

    explanations: list[str] = field(default_factory=list)
    query_embedding: np.ndarray | None = None
    subsets: list[list[Passage]] = field(default_factory=list)
    extractions: list[list[str]] = field(default_factory=list)


def _normalize(x: np.ndarray) -> np.ndarray:
    n = np.linalg.norm(x, axis=-1, keepdims=True)
    return x / np.where(n > 0, n, 1.0)


def pool_passages(results: Sequence[Sequence[Passage]]) -> list[Passage]:
    """The results of a question's queries pooled in order, exact duplicate
    texts removed (first occurrence kept)."""
    seen: set[str] = set()
    pool: list[Passage] = []
    for res in results:
        for p in res:
            if p.text not in seen:
                seen.add(p.text)
                pool.append(p)
    return pool


# ------------------------------------------------------------------ 1. query expansion
class QueryExpansion(Stage):
    """One generation per question: explanations, parsed as the reference
    code does (``query_parsing``), at most k kept."""

    name = "query_expansion"
    reads = ("question",)
    writes = ("explanations", "trace")

    def llm_calls_per_question(self, config: Any) -> int:
        return 1

    def run(self, states: list[ReConnectState], runner: StageRunner) -> None:  # type: ignore[override]
        from rcn_fast.pipelines.reconnect_parsing import parse_queries

        pipe, c = runner.pipeline, runner.pipeline.config
        chats = [[pipe.stage_chat("query_expansion", st)] for st in states]
        outs = runner.generate("query_expansion", states, chats)
        for st, o in zip(states, outs):
            k = c.num_queries(pipe.num_choices(st.question))
            exps = parse_queries(o[0], k, c.query_parsing)
            st.explanations = exps
            st.trace[-1]["parsed"] = exps


# ------------------------------------------------------------------ 2. retrieval
class ExplanationRetrieval(Stage):
    """One batched retrieval: ``top_n`` passages for every explanation and
    for the question, pooled per question (exact duplicates removed)."""

    name = "retrieval"
    reads = ("question", "explanations")
    writes = ("passages", "query_embedding", "trace")

    def count(self, pipe: Any, st: ReConnectState) -> int:
        """Passages retrieved per query of this question."""
        return pipe.config.top_n

    def run(self, states: list[ReConnectState], runner: StageRunner) -> None:  # type: ignore[override]
        """Questions that ask for the same count share one retrieval call, so
        a question's passages never depend on the rest of its batch."""
        pipe = runner.pipeline
        flat: list[str] = []
        spans = []
        for st in states:
            qs = [*st.explanations, pipe.question_query(st.question)]
            spans.append((len(flat), len(flat) + len(qs)))
            flat.extend(qs)
        counts = [self.count(pipe, st) for st in states]
        results: list[list[Passage]] = [[] for _ in flat]
        emb_rows: list[np.ndarray | None] = [None] * len(flat)
        for k in sorted(set(counts)):
            rows = [i for (s, e), kb in zip(spans, counts) if kb == k for i in range(s, e)]
            res_k, emb_k = retrieve_batch(pipe.source, [flat[i] for i in rows], k)
            for j, i in enumerate(rows):
                results[i] = res_k[j]
                emb_rows[i] = None if emb_k is None else emb_k[j]
        have_all = bool(spans) and all(emb_rows[e - 1] is not None for _, e in spans)
        for st, (s, e), k in zip(states, spans, counts):
            res_q = [list(r) for r in results[s:e]]
            st.passages = pool_passages(res_q)
            st.query_embedding = emb_rows[e - 1] if have_all else None
            st.trace.append({
                "stage": "retrieval", "type": "retrieve", "queries": flat[s:e], "top_n": k,
                "results": [[p.id for p in res] for res in res_q],
                "scores": [[float(p.score) for p in res] for res in res_q], "pool": [p.id for p in st.passages],
                "passages": passage_refs(st.passages),
            })


class QuestionRetrieval(ExplanationRetrieval):
    """"w/o ER": the question alone retrieves ``top_n * (k + 1)`` passages
    (k the explanation cap), so the pool is as large as with ER."""

    reads = ("question",)

    def count(self, pipe: Any, st: ReConnectState) -> int:
        return pipe.config.top_n * pipe.config.pool_queries(pipe.num_choices(st.question))


# ------------------------------------------------------------------ 3. sampling
class RelevanceSampling(Stage):
    """One sampler call for the batch: N subsets of K pooled passages per
    question, by the configured strategy (``sampling``: relevance, random,
    topk, mmr, cluster). Each question's trace entry records what the
    sampler computed (:func:`sample_entry`)."""

    name = "sampling"
    reads = ("passages", "query_embedding")
    writes = ("subsets", "trace")

    def run(self, states: list[ReConnectState], runner: StageRunner) -> None:  # type: ignore[override]
        from rcn_fast.sampling import sample, sample_subsets

        pipe = runner.pipeline
        c, source = pipe.config, pipe.source
        B = len(states)
        embs = [st.query_embedding for st in states]
        qemb = np.stack(embs) if states and all(e is not None for e in embs) else None  # type: ignore[arg-type]
        counts = np.array([len(st.passages) for st in states], dtype=np.int64)
        nmax = int(counts.max()) if B else 0
        keys = np.array([question_key(st.id) for st in states], dtype=np.int64)
        logp = None
        with_emb = False
        if nmax == 0:
            ids = np.full((B, c.num_subsets, 0), -1, dtype=np.int64)
            width = pipe.embedding_width() or 1
            q, cand = np.zeros((B, 1), np.float32), np.zeros((B, 0, 1), np.float32)
        else:
            if qemb is not None and has_embeddings(source):
                flat = [p for st in states for p in st.passages]
                pemb = np.asarray(source.passage_embeddings(flat), dtype=np.float32)
                d = width = pemb.shape[1]
                cand = np.zeros((B, nmax, d), np.float32)
                off = 0
                for b, n in enumerate(counts):
                    cand[b, :n] = pemb[off : off + n]
                    off += n
                q = np.asarray(qemb, dtype=np.float32)
                if c.sampler_input == "normalized":
                    q, cand = _normalize(q), _normalize(cand)
                with_emb = True
            else:  # "random" needs no embeddings
                q, cand = np.zeros((B, 1), np.float32), np.zeros((B, nmax, 1), np.float32)
                width = pipe.embedding_width() or 1
            if c.sampling == "relevance":  # the sampler itself, with the log-probability of every draw
                ids, logp = sample_subsets(q, cand, c.num_subsets, c.subset_k, tau=c.sampler_tau(width),
                                           seed=c.seed, keys=keys, valid=counts, first=c.first,
                                           return_logprobs=True)
                ids, logp = np.asarray(ids), np.asarray(logp)
            else:
                ids = np.asarray(sample(c.sampling, q, cand, c.num_subsets, c.subset_k, seed=c.seed, keys=keys,
                                        valid=counts, tau=c.sampler_tau(width), first=c.first,
                                        mmr_lambda=c.mmr_lambda))
        for b, st in enumerate(states):
            n = int(counts[b])
            st.subsets = [[st.passages[j] for j in row if j >= 0] for row in ids[b]]
            rel = cand[b, :n] @ q[b] if with_emb else None  # dot(e_q, e_j), float32 as the sampler computes it
            st.trace.append(sample_entry(c, st, ids[b], None if logp is None else logp[b], rel, width,
                                         int(keys[b])))


def sample_entry(config: Any, st: ReConnectState, ids: np.ndarray, logp: np.ndarray | None,
                 relevance: np.ndarray | None, width: int, key: int) -> dict[str, Any]:
    """The ``sample`` trace entry of one question (docs/evaluation.md,
    "Trace entries"): its pool, each pool passage's relevance
    ``dot(e_q, e_j)`` on the sampler's vectors and ``softmax(relevance /
    temperature)`` (the sampler's softmax before any document is chosen),
    the subsets in draw order and the probability of every draw (the
    sampler's own log-probabilities; uniform draws ``1 / m``).

    Parameters
    ----------
    ids : int [N, K], -1 padded (indices into ``st.passages``)
    logp : float [N, K] or None, the sampler's log-probability of each draw
    relevance : float32 [n] or None (no embeddings)
    """
    c = config
    n = len(st.passages)
    entry: dict[str, Any] = {
        "stage": "sampling", "type": "sample", "strategy": c.sampling, "subset_size": c.subset_k,
        "pool": [p.id for p in st.passages],
        "relevance": None if relevance is None else [float(x) for x in relevance],
        "probability": None, "temperature": None,
        "subsets": [[st.passages[j].id for j in row if j >= 0] for row in ids],
        "draw_probability": None, "seed": c.seed, "key": key,
    }
    if c.sampling == "relevance":
        scale = c.resolved_score_scale(width)
        temp = c.tau / scale
        entry.update(tau=c.tau, score_scale=scale, sampler_tau=temp, temperature=temp, first=c.first)
        if relevance is not None and n:
            z = np.asarray(relevance, np.float64) / temp
            w = np.exp(z - z.max())
            entry["probability"] = [float(x) for x in w / w.sum()]
        if logp is not None:
            entry["draw_probability"] = [[float(np.exp(lp)) for j, lp in zip(row, lrow) if j >= 0]
                                         for row, lrow in zip(ids, logp)]
    elif c.sampling == "random":  # uniform draws without replacement: the t-th among n - t
        entry["draw_probability"] = [[1.0 / (n - t) for t, j in enumerate(row) if j >= 0] for row in ids]
    return entry


# ------------------------------------------------------------------ 4. extraction
def subsets_repeat(subsets: list[list[Passage]]) -> bool:
    """Whether two of a question's subsets hold the same documents."""
    keys = [frozenset(p.text for p in s) for s in subsets]
    return len(set(keys)) < len(keys)


def repeat_decoding(config: Any, subset: int) -> dict[str, Any]:
    """Decoding of extraction ``subset`` of a question whose subsets repeat:
    nucleus sampling with its own seed (``seed`` for subset 0, a hash of
    ``(seed, subset)`` otherwise; the draw also depends on the prompt, i.e.
    on the question and the subset)."""
    from rcn_fast.llm.seeded import sample_seed

    return {"temperature": config.repeat_temperature, "top_p": config.repeat_top_p,
            "seed": sample_seed(config.seed, subset)}


class KnowledgeExtraction(Stage):
    """N extractions per question, one per subset. Questions whose subsets
    are all distinct share one call with the run's decoding; with
    ``repeat_decoding="nucleus"`` the others are decoded with nucleus
    sampling, one call per subset index (its seed)."""

    name = "knowledge_extraction"
    reads = ("subsets",)
    writes = ("extractions", "trace")

    def llm_calls_per_question(self, config: Any) -> int:
        return config.num_subsets

    def run(self, states: list[ReConnectState], runner: StageRunner) -> None:  # type: ignore[override]
        pipe = runner.pipeline
        c, P = pipe.config, pipe.prompts
        chats = [[pipe.stage_chat("knowledge_extraction", st, documents=P.format_list([p.text for p in sub]))
                  for sub in st.subsets] for st in states]
        sampled = [c.repeat_decoding == "nucleus" and subsets_repeat(st.subsets) for st in states]
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
                got = runner.generate("knowledge_extraction", states, rows, decoding=repeat_decoding(c, i))
                for b, o in enumerate(got):
                    outs[b].extend(o)
        for st, texts in zip(states, outs):
            exts = [parse_bullets(t) for t in texts]
            st.extractions = exts
            entries = [t for t in st.trace if t["stage"] == "knowledge_extraction" and t["type"] == "generate"]
            for entry, parsed in zip(entries, exts):
                entry["parsed"] = parsed


def extraction_items(st: ReConnectState) -> list[str]:
    """The N extraction outputs as N items (each one's explanations joined
    by spaces; empty outputs left out)."""
    return [x for x in (" ".join(exps) for exps in st.extractions) if x]


# ------------------------------------------------------------------ 5. aggregation
class KnowledgeAggregation(Stage):
    """One aggregation per question over the N extraction outputs."""

    name = "knowledge_aggregation"
    reads = ("extractions",)
    writes = ("knowledge", "trace")

    def llm_calls_per_question(self, config: Any) -> int:
        return 1

    def items(self, st: ReConnectState) -> list[str]:
        return extraction_items(st)

    def run(self, states: list[ReConnectState], runner: StageRunner) -> None:  # type: ignore[override]
        pipe = runner.pipeline
        chats = [[pipe.stage_chat("knowledge_aggregation", st, explanations=pipe.prompts.format_list(self.items(st)))]
                 for st in states]
        outs = runner.generate("knowledge_aggregation", states, chats)
        for st, o in zip(states, outs):
            st.knowledge = parse_bullets(o[0])
            st.trace[-1]["parsed"] = st.knowledge


class PassageAggregation(KnowledgeAggregation):
    """"w/o KE": aggregate directly from every pooled passage."""

    reads = ("passages",)

    def items(self, st: ReConnectState) -> list[str]:
        return [p.text for p in st.passages]


class ExtractionsAsKnowledge(Stage):
    """"w/o KA": answer with the N extraction outputs as an N-item list."""

    name = "extractions_as_knowledge"
    reads = ("extractions",)
    writes = ("knowledge",)

    def run(self, states: list[ReConnectState], runner: StageRunner) -> None:  # type: ignore[override]
        for st in states:
            st.knowledge = extraction_items(st)


class PassagesAsKnowledge(Stage):
    """"w/o KC" (= "w/o KE, KA"): answer with every pooled passage."""

    name = "passages_as_knowledge"
    reads = ("passages",)
    writes = ("knowledge",)

    def run(self, states: list[ReConnectState], runner: StageRunner) -> None:  # type: ignore[override]
        for st in states:
            st.knowledge = [p.text for p in st.passages]


# ------------------------------------------------------------------ 6. answer
class AnswerScoring(Answer):
    """One scoring pass per multiple-choice question with the connected
    explanation (:meth:`ReConnect.answer_stage`: ``reconnect_answer``, or
    ``answer_with_knowledge`` with ``answer_turn="shared"``); an open
    question's answer is one generation instead
    (:meth:`ReConnect.open_answer_stage`)."""


#: ReConnect's stages with every setting on (the paper's full pipeline).
RECONNECT_STAGES: tuple[Stage, ...] = (QueryExpansion(), ExplanationRetrieval(), RelevanceSampling(),
                                       KnowledgeExtraction(), KnowledgeAggregation(), AnswerScoring())


def reconnect_stages(stages: Sequence[Stage], config: Any) -> tuple[Stage, ...]:
    """The stage list ``stages`` (ReConnect's, or one with stages added)
    under ``config``'s ablations (Tables 3 and 7), as list edits:

    * w/o ER: no query expansion, :class:`QuestionRetrieval` for retrieval;
    * w/o KC (= w/o KE, KA): no sampling, extraction or aggregation,
      :class:`PassagesAsKnowledge` before the answer;
    * w/o KE: no sampling or extraction, :class:`PassageAggregation`;
    * w/o KA: :class:`ExtractionsAsKnowledge` for the aggregation.
    """
    out = tuple(stages)
    if not config.explanation_retrieval:
        out = replace_stage(remove_stages(out, "query_expansion"), "retrieval", QuestionRetrieval())
    if not config.knowledge_connection:
        out = remove_stages(out, "sampling", "knowledge_extraction")
        return replace_stage(out, "knowledge_aggregation", PassagesAsKnowledge())
    if not config.knowledge_extraction:
        return replace_stage(remove_stages(out, "sampling", "knowledge_extraction"), "knowledge_aggregation",
                             PassageAggregation())
    if not config.knowledge_aggregation:
        out = replace_stage(out, "knowledge_aggregation", ExtractionsAsKnowledge())
    return out


__all__ = ["ReConnectState", "QueryExpansion", "ExplanationRetrieval", "QuestionRetrieval", "RelevanceSampling",
           "KnowledgeExtraction", "KnowledgeAggregation", "PassageAggregation", "ExtractionsAsKnowledge",
           "PassagesAsKnowledge", "AnswerScoring", "RECONNECT_STAGES", "reconnect_stages", "pool_passages",
           "sample_entry",
           "extraction_items", "subsets_repeat", "repeat_decoding"]
