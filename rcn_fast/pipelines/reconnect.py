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
pass. The ablations switch stages off (see :class:`ReConnectConfig`);
without aggregation ("w/o KA") the answering step gets the N extraction
outputs as an N-item list.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rcn_fast.pipelines.base import QuestionState, StagedPipeline, StageRunner, question_key
from rcn_fast.pipelines.config import ReConnectConfig
from rcn_fast.pipelines.knowledge import as_embedding_retriever, has_embeddings, retrieve_batch
from rcn_fast.pipelines.simple import question_query
from rcn_fast.prompts import parse_bullets
from rcn_fast.retrieval.types import Passage


def _dedup(items: list[str]) -> list[str]:
    seen: set[str] = set()
    out = []
    for x in items:
        if x and x not in seen:
            seen.add(x)
            out.append(x)
    return out


def _normalize(x: np.ndarray) -> np.ndarray:
    n = np.linalg.norm(x, axis=-1, keepdims=True)
    return x / np.where(n > 0, n, 1.0)


class ReConnect(StagedPipeline):
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
    needs_retriever = True

    def __init__(self, llm: Any, config: Any = None, *, retriever: Any = None, prompts: Any = None) -> None:
        super().__init__(llm, config, retriever=retriever, prompts=prompts)
        self.source = as_embedding_retriever(retriever)
        c = self.config
        if c.knowledge_connection and c.sampling != "random" and not has_embeddings(self.source):
            raise TypeError(
                f"retriever: sampling={c.sampling!r} needs embeddings, but {type(retriever).__name__} offers "
                "neither an encoder nor the EmbeddingRetriever methods; use sampling='random' or an "
                "rcn_fast Retriever"
            )

    # ------------------------------------------------------------------ stages
    def knowledge_stages(self, states: list[QuestionState], runner: StageRunner) -> None:
        c = self.config
        self._query_expansion(states, runner)
        qemb = self._retrieve(states)
        if c.knowledge_connection:
            subsets = self._sample(states, qemb)
        else:
            subsets = [[st.passages] for st in states]
        for st, subs in zip(states, subsets):
            st.data["subsets"] = subs
        if c.knowledge_extraction:
            self._extract(states, runner)
        if c.knowledge_aggregation:
            self._aggregate(states, runner)
        else:
            for st in states:
                # w/o KA: one list item per extraction output (w/o KE too: the sampled passages)
                st.knowledge = self._extraction_items(st) if c.knowledge_extraction else self._union_texts(st)

    def _query_expansion(self, states: list[QuestionState], runner: StageRunner) -> None:
        c = self.config
        if not c.explanation_retrieval:
            for st in states:
                st.data["explanations"] = []
            return
        chats = [[self.prompts.chat("query_expansion", st.question)] for st in states]
        outs = runner.generate("query_expansion", states, chats)
        for st, o in zip(states, outs):
            k = c.max_queries if c.max_queries is not None else len(st.question.choices)
            exps = parse_bullets(o[0], max_items=k)
            st.data["explanations"] = exps
            st.trace[-1]["parsed"] = exps

    def _retrieve(self, states: list[QuestionState]) -> np.ndarray | None:
        """One batched retrieval for every query of every question; returns
        the question-query embeddings [B, d] (None without embeddings)."""
        c = self.config
        flat: list[str] = []
        spans = []
        for st in states:
            qs = [*st.data["explanations"], question_query(st.question, c.query)]
            spans.append((len(flat), len(flat) + len(qs)))
            flat.extend(qs)
        results, emb = retrieve_batch(self.source, flat, c.top_n)
        qemb = None if emb is None else np.stack([emb[e - 1] for _, e in spans])
        for st, (s, e) in zip(states, spans):
            seen: set[str] = set()
            pool: list[Passage] = []
            for res in results[s:e]:
                for p in res:
                    if p.text not in seen:
                        seen.add(p.text)
                        pool.append(p)
            st.passages = pool
            st.trace.append({
                "stage": "retrieval", "type": "retrieve", "queries": flat[s:e],
                "results": [[p.id for p in res] for res in results[s:e]], "pool": [p.id for p in pool],
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
                         valid=counts, tau=c.tau, first=c.first, mmr_lambda=c.mmr_lambda)
            ids = np.asarray(ids)
            subsets = [[[st.passages[j] for j in row if j >= 0] for row in ids[b]] for b, st in enumerate(states)]
        for st, subs in zip(states, subsets):
            st.trace.append({"stage": "sampling", "type": "sample", "strategy": c.sampling,
                             "subsets": [[p.id for p in s] for s in subs]})
        return subsets

    def _extract(self, states: list[QuestionState], runner: StageRunner) -> None:
        P = self.prompts
        chats = [[P.chat("knowledge_extraction", st.question, documents=P.format_list([p.text for p in sub]))
                  for sub in st.data["subsets"]] for st in states]
        outs = runner.generate("knowledge_extraction", states, chats)
        for st, texts in zip(states, outs):
            exts = [parse_bullets(t) for t in texts]
            st.data["extractions"] = exts
            n = len(exts)
            for entry, parsed in zip(st.trace[-n:], exts):
                entry["parsed"] = parsed

    @staticmethod
    def _extraction_items(st: QuestionState) -> list[str]:
        """The N extraction outputs as N items (each one's explanations
        joined by spaces; empty outputs left out)."""
        return [x for x in (" ".join(exps) for exps in st.data["extractions"]) if x]

    def _union_texts(self, st: QuestionState) -> list[str]:
        return _dedup([p.text for sub in st.data["subsets"] for p in sub])

    def _aggregate(self, states: list[QuestionState], runner: StageRunner) -> None:
        P = self.prompts
        chats = []
        for st in states:
            if self.config.knowledge_extraction:
                items = self._extraction_items(st)
            else:
                items = self._union_texts(st)
            chats.append([P.chat("knowledge_aggregation", st.question, explanations=P.format_list(items))])
        outs = runner.generate("knowledge_aggregation", states, chats)
        for st, o in zip(states, outs):
            st.knowledge = parse_bullets(o[0])
            st.trace[-1]["parsed"] = st.knowledge
