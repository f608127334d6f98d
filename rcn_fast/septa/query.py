"""Query enhancement (SEPTA sec. 4.2): link the question and a choice to
graph nodes by n-gram matching of node names, gather the triples touching
those nodes, keep the ones most similar to "question + choice" by the text
encoder, and append them to the query text."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from rcn_fast.kg.graph import KnowledgeGraph
from rcn_fast.kg.templates import join_sentences, triple_text
from rcn_fast._validate import is_int

STOPWORDS = frozenset(
    "a an the of to in on at by for with from and or but not no is are was were be been being am do does did "
    "have has had what which who whom whose where when why how that this these those it its they them their "
    "he she his her him you your we our i me my as if than then so such can could would should will shall may "
    "might must there here into onto about above below up down out over under again very too just also only "
    "some any all each every both either neither one s t".split()
)
_TOKEN = re.compile(r"[a-z0-9]+(?:'[a-z]+)?")


def tokenize(text: str) -> list[str]:
    """Lower-cased word tokens."""
    return _TOKEN.findall(text.lower())


def _singulars(word: str) -> list[str]:
    out = []
    if len(word) > 3 and word.endswith("ies"):
        out.append(word[:-3] + "y")
    if len(word) > 3 and word.endswith("es"):
        out.append(word[:-2])
    if len(word) > 2 and word.endswith("s") and not word.endswith("ss"):
        out.append(word[:-1])
    return out


@dataclass
class EntityLinker:
    """n-gram matching of node names.

    Parameters
    ----------
    graph : KnowledgeGraph
    max_ngram : int
        Longest name (in words) tried.
    max_nodes_per_name : int
        Nodes kept per matched name (names can repeat: WordNet senses);
        lowest node ids first.
    """

    graph: KnowledgeGraph
    max_ngram: int = 3
    max_nodes_per_name: int = 4
    _index: dict[str, list[int]] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if not isinstance(self.graph, KnowledgeGraph):
            raise TypeError(f"graph: expected a KnowledgeGraph, got {type(self.graph).__name__}")
        self._index = self.graph.name_index()

    def link(self, text: str) -> list[int]:
        """Node ids whose name occurs in ``text`` as an n-gram (a unigram
        that is a stop word is skipped; a plural falls back to a singular),
        in order of first occurrence, without repeats."""
        toks = tokenize(text)
        out: list[int] = []
        seen: set[int] = set()
        for i in range(len(toks)):
            for n in range(min(self.max_ngram, len(toks) - i), 0, -1):
                gram = toks[i:i + n]
                if n == 1 and gram[0] in STOPWORDS:
                    continue
                cands = [" ".join(gram)]
                cands += [" ".join(gram[:-1] + [s]) for s in _singulars(gram[-1])]
                for c in cands:
                    ids = self._index.get(c)
                    if ids:
                        for v in ids[: self.max_nodes_per_name]:
                            if v not in seen:
                                seen.add(v)
                                out.append(v)
                        break
        return out


@dataclass
class EnhancedQuery:
    """One (question, choice) after enhancement."""

    text: str
    base: str
    nodes: list[int]
    triples: list[str]


class QueryEnhancer:
    """Builds ``s_i = q ⊕ c_i ⊕ text_1 ⊕ ... ⊕ text_K``.

    Candidate triples of a (question, choice) pair, before the encoder ranks
    them (see :meth:`candidates`):

    1. the choice's own triples, always: for each node linked in the choice,
       every edge to a node linked in the question, then its other edges
       (lowest edge id first) up to ``max_per_node``;
    2. the question's triples: for each node linked in the question (in
       order of appearance), up to ``max_per_node`` edges, lowest edge id
       first, while the total stays within ``max_candidates``.

    A question word linked to a busy node (thousands of edges) therefore
    cannot push the choice's triples out of the candidates.

    Parameters
    ----------
    graph : KnowledgeGraph
    encoder : text encoder
        ``encode_queries`` / ``encode_passages`` -> float [n, d] (rows
        L2-normalised or not: cosine is used).
    num_triples : int
        K, triples appended (paper: 10).
    max_candidates : int
        Cap on the candidates per pair; the choice's own triples are kept
        even beyond it.
    max_per_node : int
        Edges taken from one linked node (edges between a choice node and a
        question node do not count against it).
    linker : EntityLinker, optional
    """

    def __init__(self, graph: KnowledgeGraph, encoder: Any, num_triples: int = 10, max_candidates: int = 256,
                 linker: EntityLinker | None = None, max_per_node: int = 32) -> None:
        for name, v in (("num_triples", num_triples), ("max_candidates", max_candidates),
                        ("max_per_node", max_per_node)):
            if not is_int(v) or v < 0:
                raise ValueError(f"{name}: expected an int >= 0, got {v!r}")
        self.graph, self.encoder = graph, encoder
        self.num_triples, self.max_candidates, self.max_per_node = num_triples, max_candidates, max_per_node
        self.linker = linker or EntityLinker(graph)
        self._edge_cache: dict[int, np.ndarray] = {}

    def describe(self) -> dict[str, Any]:
        """Settings that determine the enhanced queries."""
        return {"num_triples": self.num_triples, "max_candidates": self.max_candidates,
                "max_per_node": self.max_per_node, "max_ngram": self.linker.max_ngram,
                "max_nodes_per_name": self.linker.max_nodes_per_name, "candidates": "choice-first/2"}

    def candidates(self, question: str, choice: str) -> tuple[list[int], list[int]]:
        """Linked nodes (question's, then the choice's new ones) and the
        candidate edge ids of one pair (see the class docstring)."""
        g = self.graph
        qn = list(dict.fromkeys(self.linker.link(question)))
        cn = list(dict.fromkeys(self.linker.link(choice)))
        nodes = list(dict.fromkeys(qn + cn))
        qset = np.asarray(sorted(set(qn)), dtype=np.int64)
        chosen: dict[int, None] = {}
        for v in cn:
            lo, hi = g.indptr[v], g.indptr[v + 1]
            es, nb = g.slot_edges[lo:hi], g.indices[lo:hi]
            bridge = np.isin(nb, qset) if qset.size else np.zeros(len(es), bool)
            chosen.update((int(e), None) for e in es[bridge])
            chosen.update((int(e), None) for e in es[~bridge][: self.max_per_node])
        for v in qn:
            room = self.max_candidates - len(chosen)
            if room <= 0:
                break
            take = min(self.max_per_node, room)
            es = g.slot_edges[g.indptr[v]:g.indptr[v] + take + len(chosen)]  # at most len(chosen) are taken
            new = [int(e) for e in es if int(e) not in chosen][:take]
            chosen.update((e, None) for e in new)
        return nodes, list(chosen)

    @staticmethod
    def base_text(question: str, choice: str) -> str:
        """The plain question-choice text ``q ⊕ c``."""
        q = question.strip()
        return f"{q} {choice.strip()}".strip()

    def _edge_vectors(self, edges: list[int]) -> dict[int, np.ndarray]:
        missing = [e for e in dict.fromkeys(edges) if e not in self._edge_cache]
        if missing:
            vecs = np.asarray(self.encoder.encode_passages([triple_text(*self.graph.triple(e)) for e in missing]),
                              dtype=np.float32)
            for e, v in zip(missing, vecs):
                self._edge_cache[e] = v / max(float(np.linalg.norm(v)), 1e-12)
        return {e: self._edge_cache[e] for e in edges}

    def enhance(self, pairs: Sequence[tuple[str, str]]) -> list[EnhancedQuery]:
        """Enhance a batch of (question, choice) pairs (one encoder call for
        the bases and one for the new triples of the batch)."""
        pairs = list(pairs)
        if not pairs:
            return []
        bases = [self.base_text(q, c) for q, c in pairs]
        cand: list[list[int]] = []
        nodes_all = []
        for (q, c) in pairs:
            nodes, edges = self.candidates(q, c)
            nodes_all.append(nodes)
            cand.append(edges)
        out = []
        if self.num_triples == 0 or not any(cand):
            return [EnhancedQuery(b, b, n, []) for b, n in zip(bases, nodes_all)]
        qv = np.asarray(self.encoder.encode_queries(bases), dtype=np.float32)
        qv = qv / np.maximum(np.linalg.norm(qv, axis=1, keepdims=True), 1e-12)
        ev = self._edge_vectors([e for es in cand for e in es])
        for b, nodes, es, q in zip(bases, nodes_all, cand, qv):
            if not es:
                out.append(EnhancedQuery(b, b, nodes, []))
                continue
            sims = np.stack([ev[e] for e in es]) @ q
            top = np.argsort(-sims, kind="stable")[: self.num_triples]
            triples = [triple_text(*self.graph.triple(es[j])) for j in top]
            out.append(EnhancedQuery(join_sentences([b] + triples), b, nodes, triples))
        return out
