"""BFS subgraph sampling (SEPTA eq. 1): one connected subgraph per centre node.

From the centre, layer by layer (depth at most ``max_depth``), every
adjacency slot that leads to a node not yet in the subgraph is kept with
probability ``p``; sampling stops when the subgraph holds ``max_nodes``
nodes. The subgraph's edges are the BFS tree edges (one per non-centre node,
in discovery order; they keep it connected) followed by the other edges of
the graph between its nodes, truncated at ``max_edges``.

Random draws are counter-based: draw ``k`` of centre ``c`` is a hash of
``(seed, c, k)``, so a centre's subgraph never depends on the batch it is
sampled in, the thread count or the backend. Two backends give identical
results: ``"reference"`` (plain Python, the specification) and ``"numba"``
(compiled, parallel over centres; ``pip install "rcn_fast[septa]"``).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from rcn_fast.kg.graph import KnowledgeGraph
from rcn_fast._validate import is_int, is_number

logger = logging.getLogger("rcn_fast.kg")

NUMBA_HINT = 'pip install "rcn_fast[septa]"  (numba)'
_M64 = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15
_C1 = 0xBF58476D1CE4E5B9
_C2 = 0x94D049BB133111EB
_C3 = 0x632BE59BD9B4E019
_CHUNK = 1 << 16  # centres per compiled call (bounds the [C, max_nodes] buffers)


# ---------------------------------------------------------------- random draws
def _mix(z: int) -> int:
    z = ((z ^ (z >> 30)) * _C1) & _M64
    z = ((z ^ (z >> 27)) * _C2) & _M64
    return z ^ (z >> 31)


def centre_key(seed: int, centre: int) -> int:
    """64-bit stream key of ``centre`` under ``seed``."""
    return _mix(((seed * _GOLDEN) & _M64) ^ _mix((centre + _C3) & _M64))


def uniform(key: int, k: int) -> float:
    """Draw ``k`` (0-based) of stream ``key``: a double in [0, 1) with 53 random bits."""
    return (_mix((key + (k + 1) * _GOLDEN) & _M64) >> 11) * (1.0 / 9007199254740992.0)


# ---------------------------------------------------------------- result type
@dataclass
class Subgraphs:
    """A batch of sampled subgraphs in flat (CSR-like) arrays.

    Attributes
    ----------
    centres : int64 [C]
    node_ptr : int64 [C + 1]
        Subgraph ``i`` holds ``nodes[node_ptr[i]:node_ptr[i+1]]``.
    nodes : int64 [sum of sizes]
        Graph node ids, BFS order, the centre first.
    depth : int32 [sum of sizes]
        BFS layer of each node (0 for the centre).
    edge_ptr : int64 [C + 1]
    edges : int64 [sum of edge counts]
        Graph edge ids: tree edges first, then the other induced edges.
    """

    centres: np.ndarray
    node_ptr: np.ndarray
    nodes: np.ndarray
    depth: np.ndarray
    edge_ptr: np.ndarray
    edges: np.ndarray

    def __len__(self) -> int:
        return int(self.centres.shape[0])

    def node_ids(self, i: int) -> np.ndarray:
        """Graph node ids of subgraph ``i`` (int64)."""
        return self.nodes[self.node_ptr[i]:self.node_ptr[i + 1]]

    def edge_ids(self, i: int) -> np.ndarray:
        """Graph edge ids of subgraph ``i`` (int64)."""
        return self.edges[self.edge_ptr[i]:self.edge_ptr[i + 1]]

    def local_edges(self, i: int, graph: KnowledgeGraph) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Edges of subgraph ``i`` in local node numbering.

        Returns
        -------
        src, dst, rel : int64 [e_i]  (direction as stored in the graph)
        """
        nodes, edges = self.node_ids(i), self.edge_ids(i)
        pos = {int(v): j for j, v in enumerate(nodes)}
        src = np.array([pos[int(graph.heads[e])] for e in edges], dtype=np.int64)
        dst = np.array([pos[int(graph.tails[e])] for e in edges], dtype=np.int64)
        return src, dst, graph.relations[edges].astype(np.int64)

    def select(self, idx: Sequence[int] | np.ndarray) -> "Subgraphs":
        """The subgraphs at positions ``idx``, as a new batch."""
        idx = np.asarray(idx, dtype=np.int64)
        ns = [self.node_ids(int(i)) for i in idx]
        ds = [self.depth[self.node_ptr[i]:self.node_ptr[i + 1]] for i in idx]
        es = [self.edge_ids(int(i)) for i in idx]
        return Subgraphs(self.centres[idx].copy(), _ptr([len(x) for x in ns]), _cat(ns, np.int64),
                         _cat(ds, np.int32), _ptr([len(x) for x in es]), _cat(es, np.int64))

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the arrays to an ``.npz`` file."""
        np.savez(path, centres=self.centres, node_ptr=self.node_ptr, nodes=self.nodes, depth=self.depth,
                 edge_ptr=self.edge_ptr, edges=self.edges)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> "Subgraphs":
        z = np.load(path)
        return cls(*(z[k] for k in ("centres", "node_ptr", "nodes", "depth", "edge_ptr", "edges")))

    @staticmethod
    def concat(parts: Sequence["Subgraphs"]) -> "Subgraphs":
        """Join batches in order."""
        if not parts:
            raise ValueError("parts: expected at least one Subgraphs batch")
        sizes = np.concatenate([np.diff(p.node_ptr) for p in parts])
        esizes = np.concatenate([np.diff(p.edge_ptr) for p in parts])
        return Subgraphs(np.concatenate([p.centres for p in parts]), _ptr(sizes),
                         np.concatenate([p.nodes for p in parts]), np.concatenate([p.depth for p in parts]),
                         _ptr(esizes), np.concatenate([p.edges for p in parts]))


def _ptr(sizes: Any) -> np.ndarray:
    out = np.zeros(len(sizes) + 1, dtype=np.int64)
    np.cumsum(np.asarray(sizes, dtype=np.int64), out=out[1:])
    return out


def _cat(parts: list, dtype: Any) -> np.ndarray:
    return np.concatenate(parts).astype(dtype) if parts else np.zeros(0, dtype=dtype)


# ---------------------------------------------------------------- reference
def bfs_one_reference(graph: KnowledgeGraph, centre: int, p: float, max_depth: int, max_nodes: int,
                      max_edges: int, seed: int) -> tuple[list[int], list[int], list[int]]:
    """The specification: ``(nodes, depths, edges)`` of one centre's subgraph."""
    indptr, indices, slot_edges, heads = graph.indptr, graph.indices, graph.slot_edges, graph.heads
    key = centre_key(seed, centre)
    nodes, depth, tree = [centre], [0], []
    inside = {centre}
    k = 0
    start, layer, full = 0, 0, max_nodes <= 1
    while layer < max_depth and not full:
        end = len(nodes)
        if start == end:
            break
        for i in range(start, end):
            u = nodes[i]
            for s in range(indptr[u], indptr[u + 1]):
                v = int(indices[s])
                if v in inside:
                    continue
                x = uniform(key, k)
                k += 1
                if x >= p:
                    continue
                inside.add(v)
                nodes.append(v)
                depth.append(layer + 1)
                tree.append(int(slot_edges[s]))
                if len(nodes) >= max_nodes:
                    full = True
                    break
            if full:
                break
        start, layer = end, layer + 1
    edges = tree[:max_edges]
    tree_set = set(tree)
    for u in nodes:
        if len(edges) >= max_edges:
            break
        for s in range(indptr[u], indptr[u + 1]):
            e = int(slot_edges[s])
            if int(indices[s]) in inside and heads[e] == u and e not in tree_set:
                edges.append(e)
                if len(edges) >= max_edges:
                    break
    return nodes, depth, edges


def _sample_reference(graph: KnowledgeGraph, centres: np.ndarray, p: float, d: int, n: int, me: int,
                      seed: int) -> Subgraphs:
    ns, ds, es = [], [], []
    for c in centres:
        a, b, e = bfs_one_reference(graph, int(c), p, d, n, me, seed)
        ns.append(np.asarray(a, dtype=np.int64))
        ds.append(np.asarray(b, dtype=np.int32))
        es.append(np.asarray(e, dtype=np.int64))
    return Subgraphs(centres.astype(np.int64), _ptr([len(x) for x in ns]), _cat(ns, np.int64), _cat(ds, np.int32),
                     _ptr([len(x) for x in es]), _cat(es, np.int64))


# ---------------------------------------------------------------- numba
_NUMBA_KERNEL: Any = None
_NUMBA_ERROR: str | None = None


def _numba_kernel() -> Any:
    """Compile (once, cached on disk by numba) and return the parallel kernel."""
    global _NUMBA_KERNEL, _NUMBA_ERROR
    if _NUMBA_KERNEL is not None or _NUMBA_ERROR is not None:
        return _NUMBA_KERNEL
    try:
        import numba  # noqa: F401
    except ImportError as exc:
        _NUMBA_ERROR = f"numba is not installed ({exc}); install it with: {NUMBA_HINT}"
        return None

    from rcn_fast.kg._bfs_numba import kernel

    _NUMBA_KERNEL = kernel
    return kernel


def numba_available() -> tuple[bool, str]:
    """``(usable, reason)`` of the numba backend."""
    k = _numba_kernel()
    return (k is not None, "" if k is not None else str(_NUMBA_ERROR))


def _threads() -> int:
    env = os.environ.get("RCN_FAST_NUM_THREADS")
    if env:
        try:
            return max(1, int(env))
        except ValueError:
            raise ValueError(f"RCN_FAST_NUM_THREADS: expected a positive int, got {env!r}") from None
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def _sample_numba(kernel: Any, graph: KnowledgeGraph, centres: np.ndarray, p: float, d: int, n: int, me: int,
                  seed: int) -> Subgraphs:
    import numba

    threads = min(_threads(), numba.config.NUMBA_NUM_THREADS)
    prev = numba.get_num_threads()
    numba.set_num_threads(threads)
    parts = []
    heads = graph.heads.astype(np.int64)
    try:
        for s in range(0, len(centres), _CHUNK):
            c = np.ascontiguousarray(centres[s:s + _CHUNK], dtype=np.int64)
            C = len(c)
            on = np.empty((C, n), dtype=np.int64)
            od = np.empty((C, n), dtype=np.int32)
            oe = np.empty((C, max(me, 1)), dtype=np.int64)
            cn = np.empty(C, dtype=np.int64)
            ce = np.empty(C, dtype=np.int64)
            nchunks = max(1, min(C, threads * 8))
            kernel(graph.indptr, graph.indices, graph.slot_edges, heads, graph.num_nodes, c, float(p), d, n, me,
                   seed, nchunks, on, od, cn, oe, ce)
            mask_n = np.arange(n)[None, :] < cn[:, None]
            mask_e = np.arange(oe.shape[1])[None, :] < ce[:, None]
            parts.append(Subgraphs(c, _ptr(cn), on[mask_n], od[mask_n], _ptr(ce), oe[mask_e]))
    finally:
        numba.set_num_threads(prev)
    return Subgraphs.concat(parts)


# ---------------------------------------------------------------- public API
def bfs_subgraphs(graph: KnowledgeGraph, centres: Sequence[int] | np.ndarray | None = None, *, p: float = 0.5,
                  max_depth: int = 2, max_nodes: int = 16, max_edges: int | None = None, seed: int = 0,
                  backend: str = "auto") -> Subgraphs:
    """Sample one BFS subgraph per centre node (SEPTA eq. 1).

    Parameters
    ----------
    graph : KnowledgeGraph
    centres : int array [C], optional
        Centre node ids (default: every node).
    p : float in [0, 1]
        Probability of keeping each adjacency slot that leads to a new node.
    max_depth : int >= 0
        ``d``: layers explored from the centre.
    max_nodes : int >= 1
        ``n``: sampling stops when the subgraph holds this many nodes.
    max_edges : int, optional
        Edge cap, at least ``max_nodes - 1`` (so the tree edges, which keep
        the subgraph connected, always fit); default ``2 * max_nodes``.
    seed : int >= 0
    backend : {"auto", "numba", "reference"}
        ``"auto"`` uses numba when it imports, else the reference (logging why).

    Returns
    -------
    Subgraphs
    """
    if not isinstance(graph, KnowledgeGraph):
        raise TypeError(f"graph: expected a KnowledgeGraph, got {type(graph).__name__}")
    if not is_number(p) or not 0.0 <= p <= 1.0:
        raise ValueError(f"p: expected a probability in [0, 1], got {p!r}")
    for name, v, lo in (("max_depth", max_depth, 0), ("max_nodes", max_nodes, 1), ("seed", seed, 0)):
        if not is_int(v, numpy=True) or v < lo:
            raise ValueError(f"{name}: expected an int >= {lo}, got {v!r}")
    if max_edges is None:
        max_edges = 2 * max_nodes
    if not is_int(max_edges, numpy=True) or max_edges < max_nodes - 1:
        raise ValueError(f"max_edges: expected an int >= max_nodes - 1 = {max_nodes - 1}, got {max_edges!r}")
    if seed >= 1 << 63:
        raise ValueError(f"seed: expected < 2**63, got {seed}")
    if centres is None:
        c = np.arange(graph.num_nodes, dtype=np.int64)
    else:
        c = np.asarray(centres)
        if c.ndim != 1 or (c.size and not np.issubdtype(c.dtype, np.integer)):
            raise TypeError(f"centres: expected a 1-D integer array, got {c.dtype}{list(c.shape)}")
        c = c.astype(np.int64)
        if c.size and (c.min() < 0 or c.max() >= graph.num_nodes):
            raise ValueError(f"centres: node ids must lie in [0, {graph.num_nodes}), got [{c.min()}, {c.max()}]")
    if backend not in ("auto", "numba", "reference"):
        raise ValueError(f"backend: expected 'auto', 'numba' or 'reference', got {backend!r}")
    args = (graph, c, float(p), int(max_depth), int(max_nodes), int(max_edges), int(seed))
    if backend == "reference" or len(c) == 0:
        return _sample_reference(*args)
    kernel = _numba_kernel()
    if kernel is None:
        if backend == "numba":
            raise ImportError(f"backend='numba': {_NUMBA_ERROR}")
        logger.warning("bfs_subgraphs: using the Python reference sampler (slow): %s", _NUMBA_ERROR)
        return _sample_reference(*args)
    return _sample_numba(kernel, *args)
