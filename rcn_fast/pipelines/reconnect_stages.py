"""The knowledge-connection stages of ReConnect (retrieval pooling, subset
sampling, extraction, aggregation) as a mixin of
:class:`~rcn_fast.pipelines.reconnect.ReConnect`, which holds the settings
(``self.config``), the prompts and the retriever adapter (``self.source``).
Split out of :mod:`rcn_fast.pipelines.reconnect` to keep it small.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rcn_fast.pipelines.base import QuestionState, StageRunner, question_key
from rcn_fast.pipelines.knowledge import has_embeddings, retrieve_batch
from rcn_fast.prompts import parse_bullets
from rcn_fast.retrieval.types import Passage


def _normalize(x: np.ndarray) -> np.ndarray:
    n = np.linalg.norm(x, axis=-1, keepdims=True)
    return x / np.where(n > 0, n, 1.0)


class ConnectionStages:
    """Stages 2-5 of ReConnect (see :mod:`rcn_fast.pipelines.reconnect`); they
    use ReConnect's ``_chat``, ``_question_query``, ``_num_choices`` and
    ``embedding_width``."""

    config: Any
    prompts: Any
    source: Any

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


__all__ = ["ConnectionStages"]
