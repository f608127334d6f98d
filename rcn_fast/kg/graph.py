"""A multi-relational knowledge graph held in numpy arrays.

Nodes and relations are integer ids with string vocabularies. Edges are
directed triples ``(head, relation, tail)``; for traversal the graph keeps a
CSR adjacency over *both* directions (a neighbour reached against an edge's
direction is still a neighbour), each slot remembering the edge id it came
from, so a sampled subgraph can be turned back into directed triples.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np

from rcn_fast._stamped_json import read_stamped_json

_FORMAT = "rcn_fast.KnowledgeGraph/1"


class KnowledgeGraph:
    """Triples over node and relation vocabularies, with CSR adjacency.

    Parameters
    ----------
    node_names : sequence of str, length N
        Display name of every node (used in sentences and for entity
        linking; names may repeat, e.g. WordNet senses of one word).
    relation_names : sequence of str, length R
        Normalised relation names (keys of :data:`rcn_fast.kg.RELATION_TEMPLATES`).
    heads, relations, tails : int arrays [E]
        The directed triples. Self-loops are dropped; exact duplicate
        triples are kept once.
    node_keys : sequence of str, optional
        Unique ids of the nodes (``/c/en/dog``, ``n:02084071``); default:
        the names when they are unique, else ``"<i>"``.
    source : str
        Where the graph came from (recorded in manifests).

    Attributes
    ----------
    indptr : int64 [N + 1]
        CSR row pointers of the undirected adjacency.
    indices : int32 [2E]
        Neighbour node of each slot (row order: by edge id).
    slot_edges : int64 [2E]
        Edge id of each slot.
    """

    def __init__(self, node_names: Sequence[str], relation_names: Sequence[str], heads, relations, tails, *,
                 node_keys: Sequence[str] | None = None, source: str = "") -> None:
        self.node_names = [str(n) for n in node_names]
        self.relation_names = [str(r) for r in relation_names]
        n, r = len(self.node_names), len(self.relation_names)
        h = np.asarray(heads, dtype=np.int64).ravel()
        rel = np.asarray(relations, dtype=np.int64).ravel()
        t = np.asarray(tails, dtype=np.int64).ravel()
        if not (h.shape == rel.shape == t.shape):
            raise ValueError(f"heads, relations, tails: expected equal lengths, got {h.shape[0]}, "
                             f"{rel.shape[0]}, {t.shape[0]}")
        for name, arr, hi in (("heads", h, n), ("tails", t, n), ("relations", rel, r)):
            if arr.size and (arr.min() < 0 or arr.max() >= hi):
                raise ValueError(f"{name}: ids must lie in [0, {hi}), got range [{arr.min()}, {arr.max()}]")
        keep = h != t
        h, rel, t = h[keep], rel[keep], t[keep]
        if h.size:
            if n * n * max(r, 1) < (1 << 62):
                key = (h * max(r, 1) + rel) * n + t  # one int64 per triple: a fast 1-D unique
                _, first = np.unique(key, return_index=True)
            else:
                _, first = np.unique(np.stack([h, rel, t], axis=1), axis=0, return_index=True)
            first.sort()
            h, rel, t = h[first], rel[first], t[first]
        self.heads = h.astype(np.int32)
        self.relations = rel.astype(np.int32)
        self.tails = t.astype(np.int32)
        if node_keys is None:
            node_keys = self.node_names if len(set(self.node_names)) == n else [str(i) for i in range(n)]
        if len(node_keys) != n:
            raise ValueError(f"node_keys: expected {n} keys, got {len(node_keys)}")
        self.node_keys = [str(k) for k in node_keys]
        self.source = source
        self._build_csr()
        self._name_index: dict[str, list[int]] | None = None

    # ------------------------------------------------------------ building
    @classmethod
    def from_triples(cls, triples: Iterable[tuple[str, str, str]], *, source: str = "") -> "KnowledgeGraph":
        """Build from ``(head name, relation name, tail name)`` string triples
        (nodes are identified by name)."""
        nodes: dict[str, int] = {}
        rels: dict[str, int] = {}
        h, r, t = [], [], []
        for i, tr in enumerate(triples):
            if len(tr) != 3:
                raise ValueError(f"triples[{i}]: expected (head, relation, tail), got {tr!r}")
            a, b, c = (str(x).strip() for x in tr)
            if not a or not b or not c:
                raise ValueError(f"triples[{i}]: empty field in {tr!r}")
            h.append(nodes.setdefault(a, len(nodes)))
            r.append(rels.setdefault(b, len(rels)))
            t.append(nodes.setdefault(c, len(nodes)))
        return cls(list(nodes), list(rels), h, r, t, source=source)

    def _build_csr(self) -> None:
        n, e = self.num_nodes, self.num_edges
        src = np.concatenate([self.heads, self.tails]).astype(np.int64)
        dst = np.concatenate([self.tails, self.heads]).astype(np.int32)
        eid = np.concatenate([np.arange(e), np.arange(e)]).astype(np.int64)
        order = np.lexsort((eid, src))  # by row, then edge id (stable, reproducible)
        self.indices = np.ascontiguousarray(dst[order])
        self.slot_edges = np.ascontiguousarray(eid[order])
        counts = np.bincount(src, minlength=n)
        self.indptr = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(counts, out=self.indptr[1:])

    # ------------------------------------------------------------ queries
    @property
    def num_nodes(self) -> int:
        return len(self.node_names)

    @property
    def num_edges(self) -> int:
        return int(self.heads.shape[0])

    @property
    def num_relations(self) -> int:
        return len(self.relation_names)

    def degree(self) -> np.ndarray:
        """Undirected degree of every node, int64 [N]."""
        return np.diff(self.indptr)

    def neighbors(self, node: int) -> np.ndarray:
        """Neighbour ids of ``node`` (both directions, with repeats), int32."""
        return self.indices[self.indptr[node]:self.indptr[node + 1]]

    def incident_edges(self, nodes: Iterable[int]) -> np.ndarray:
        """Sorted distinct ids of the edges touching any of ``nodes``, int64."""
        parts = [self.slot_edges[self.indptr[v]:self.indptr[v + 1]] for v in nodes]
        if not parts:
            return np.zeros(0, dtype=np.int64)
        return np.unique(np.concatenate(parts))

    def triple(self, edge: int) -> tuple[str, str, str]:
        """``(head name, relation name, tail name)`` of edge ``edge``."""
        return (self.node_names[self.heads[edge]], self.relation_names[self.relations[edge]],
                self.node_names[self.tails[edge]])

    def name_index(self) -> dict[str, list[int]]:
        """Lower-cased node name -> node ids carrying it (built once)."""
        if self._name_index is None:
            idx: dict[str, list[int]] = {}
            for i, name in enumerate(self.node_names):
                idx.setdefault(name.lower(), []).append(i)
            self._name_index = idx
        return self._name_index

    # ------------------------------------------------------------ storage
    def save(self, path: str | os.PathLike[str]) -> None:
        """Write ``graph.json`` (vocabularies) and ``edges.npz`` to directory ``path``."""
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        np.savez(path / "edges.npz", heads=self.heads, relations=self.relations, tails=self.tails)
        meta = {"format": _FORMAT, "source": self.source, "num_nodes": self.num_nodes,
                "num_edges": self.num_edges, "relation_names": self.relation_names,
                "node_names": self.node_names,
                "node_keys": None if self.node_keys == self.node_names else self.node_keys}
        tmp = path / "graph.json.tmp"
        tmp.write_text(json.dumps(meta))
        os.replace(tmp, path / "graph.json")

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> "KnowledgeGraph":
        """Read a graph written by :meth:`save`."""
        path = Path(path)
        meta = read_stamped_json(path / "graph.json", _FORMAT, what="a saved KnowledgeGraph")
        z = np.load(path / "edges.npz")
        return cls(meta["node_names"], meta["relation_names"], z["heads"], z["relations"], z["tails"],
                   node_keys=meta.get("node_keys"), source=meta.get("source", ""))

    def __repr__(self) -> str:
        return (f"KnowledgeGraph(nodes={self.num_nodes}, edges={self.num_edges}, "
                f"relations={self.num_relations}, source={self.source!r})")


def random_graph(num_nodes: int, num_edges: int, num_relations: int = 8, seed: int = 0) -> KnowledgeGraph:
    """A synthetic graph with a heavy-tailed degree distribution (for
    benchmarks and tests): tails drawn from a Zipf-like law so a few hubs
    have large degree, like ConceptNet.

    Parameters
    ----------
    num_nodes, num_edges, num_relations : int
    seed : int

    Returns
    -------
    KnowledgeGraph with names ``"node <i>"`` and relations ``"related_to"``
    plus ``"rel<j>"``.
    """
    if num_nodes < 2:
        raise ValueError(f"num_nodes: expected >= 2, got {num_nodes}")
    rng = np.random.default_rng(seed)
    h = rng.integers(0, num_nodes, num_edges)
    w = 1.0 / np.arange(1, num_nodes + 1) ** 0.8
    w /= w.sum()
    t = rng.permutation(num_nodes)[rng.choice(num_nodes, size=num_edges, p=w)]
    r = rng.integers(0, num_relations, num_edges)
    rel_names = ["related_to"] + [f"rel{j}" for j in range(1, num_relations)]
    return KnowledgeGraph([f"node {i}" for i in range(num_nodes)], rel_names, h, r, t, source="random")
