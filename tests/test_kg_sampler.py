"""BFS subgraph sampler: properties on hand-made graphs, numba == reference."""

from __future__ import annotations

from collections import deque

import numpy as np
import pytest

from rcn_fast.kg import KnowledgeGraph, bfs_subgraphs, numba_available, random_graph
from rcn_fast.kg.sampler import Subgraphs, centre_key, uniform

FIELDS = ("centres", "node_ptr", "nodes", "depth", "edge_ptr", "edges")
HAS_NUMBA = numba_available()[0]


def grid(w: int, h: int) -> KnowledgeGraph:
    """A w x h grid; node (x, y) = y * w + x; edges right and down."""
    tr = []
    for y in range(h):
        for x in range(w):
            if x + 1 < w:
                tr.append((f"{x},{y}", "right_of", f"{x + 1},{y}"))
            if y + 1 < h:
                tr.append((f"{x},{y}", "below", f"{x},{y + 1}"))
    return KnowledgeGraph.from_triples(tr)


def distances(g: KnowledgeGraph, src: int) -> dict[int, int]:
    d = {src: 0}
    q = deque([src])
    while q:
        u = q.popleft()
        for v in g.neighbors(u):
            if int(v) not in d:
                d[int(v)] = d[u] + 1
                q.append(int(v))
    return d


def check_properties(g: KnowledgeGraph, sg: Subgraphs, p_max_depth: int, max_nodes: int, max_edges: int) -> None:
    for i in range(len(sg)):
        nodes = sg.node_ids(i).tolist()
        depth = sg.depth[sg.node_ptr[i]:sg.node_ptr[i + 1]].tolist()
        edges = sg.edge_ids(i).tolist()
        c = int(sg.centres[i])
        assert nodes[0] == c and depth[0] == 0
        assert 1 <= len(nodes) <= max_nodes and len(set(nodes)) == len(nodes)
        assert len(edges) <= max_edges and len(set(edges)) == len(edges)
        assert max(depth) <= p_max_depth and depth == sorted(depth)
        dist = distances(g, c)
        assert all(dist[v] <= dd for v, dd in zip(nodes, depth))  # a BFS layer is never closer than the truth
        inside = set(nodes)
        for e in edges:  # induced edges only
            assert int(g.heads[e]) in inside and int(g.tails[e]) in inside
        # connected: the first len(nodes) - 1 edges are a spanning tree
        tree = edges[: len(nodes) - 1]
        assert len(tree) == len(nodes) - 1
        reach, frontier = {c}, [c]
        adj: dict[int, set[int]] = {}
        for e in tree:
            a, b = int(g.heads[e]), int(g.tails[e])
            adj.setdefault(a, set()).add(b)
            adj.setdefault(b, set()).add(a)
        while frontier:
            u = frontier.pop()
            for v in adj.get(u, ()):
                if v not in reach:
                    reach.add(v)
                    frontier.append(v)
        assert reach == inside


BACKENDS = ["reference"] + (["numba"] if HAS_NUMBA else [])


@pytest.mark.parametrize("backend", BACKENDS)
def test_full_probability_is_the_bfs_ball(backend):
    g = grid(7, 7)
    centre = 24  # the middle
    sg = bfs_subgraphs(g, [centre], p=1.0, max_depth=2, max_nodes=100, max_edges=200, backend=backend)
    dist = distances(g, centre)
    ball = {v for v, d in dist.items() if d <= 2}
    assert set(sg.node_ids(0).tolist()) == ball and len(ball) == 13
    assert sg.depth.tolist() == [dist[v] for v in sg.node_ids(0).tolist()]
    # every grid edge inside the ball: the 12 tree edges + the 4 closing the inner squares
    assert len(sg.edge_ids(0)) == 16
    check_properties(g, sg, 2, 100, 200)


@pytest.mark.parametrize("backend", BACKENDS)
def test_size_depth_and_edge_caps(backend):
    g = grid(9, 9)
    sg = bfs_subgraphs(g, np.arange(81), p=0.7, max_depth=3, max_nodes=6, max_edges=7, seed=5, backend=backend)
    assert np.diff(sg.node_ptr).max() == 6
    check_properties(g, sg, 3, 6, 7)
    one = bfs_subgraphs(g, [40], p=1.0, max_depth=4, max_nodes=1, backend=backend)
    assert one.nodes.tolist() == [40] and len(one.edges) == 0
    zero = bfs_subgraphs(g, [40], p=0.0, max_depth=4, max_nodes=10, backend=backend)
    assert zero.nodes.tolist() == [40]
    shallow = bfs_subgraphs(g, [40], p=1.0, max_depth=0, max_nodes=10, backend=backend)
    assert shallow.nodes.tolist() == [40]


@pytest.mark.parametrize("backend", BACKENDS)
def test_reproducible_per_centre_whatever_the_batch(backend):
    g = random_graph(400, 1500, seed=3)
    kw = dict(p=0.4, max_depth=3, max_nodes=12, seed=11, backend=backend)
    full = bfs_subgraphs(g, np.arange(400), **kw)
    perm = np.random.default_rng(0).permutation(400)[:50]
    part = bfs_subgraphs(g, perm, **kw)
    for j, c in enumerate(perm):
        assert np.array_equal(part.node_ids(j), full.node_ids(int(c)))
        assert np.array_equal(part.edge_ids(j), full.edge_ids(int(c)))
    again = bfs_subgraphs(g, np.arange(400), **kw)
    assert all(np.array_equal(getattr(full, f), getattr(again, f)) for f in FIELDS)
    other = bfs_subgraphs(g, np.arange(400), **{**kw, "seed": 12})
    assert not np.array_equal(other.nodes, full.nodes)
    check_properties(g, full, 3, 12, 24)


def test_keep_probability_matches_p():
    """A star: the centre's 2000 leaves are each kept with probability p."""
    g = KnowledgeGraph.from_triples([("hub", "r", f"leaf{i}") for i in range(2000)])
    p = 0.3
    kept = [len(bfs_subgraphs(g, [0], p=p, max_depth=1, max_nodes=3000, max_edges=3000, seed=s,
                              backend="reference").nodes) - 1 for s in range(5)]
    # binomial(2000, 0.3): mean 600, sd 20.5; a 5-sd band per draw
    assert all(abs(k - 600) < 103 for k in kept), kept
    u = np.array([uniform(centre_key(1, 7), k) for k in range(20000)])
    assert 0 <= u.min() and u.max() < 1 and abs(u.mean() - 0.5) < 0.01


@pytest.mark.skipif(not HAS_NUMBA, reason="numba not installed (pip install 'rcn_fast[septa]')")
@pytest.mark.parametrize("p,d,n,me", [(1.0, 2, 16, 32), (0.5, 3, 9, 8), (0.2, 5, 40, 80), (0.9, 1, 2, 1)])
def test_numba_equals_reference(p, d, n, me):
    g = random_graph(3000, 9000, seed=2)
    centres = np.random.default_rng(1).integers(0, 3000, 300)
    a = bfs_subgraphs(g, centres, p=p, max_depth=d, max_nodes=n, max_edges=me, seed=9, backend="reference")
    b = bfs_subgraphs(g, centres, p=p, max_depth=d, max_nodes=n, max_edges=me, seed=9, backend="numba")
    for f in FIELDS:
        assert np.array_equal(getattr(a, f), getattr(b, f)), f
        assert getattr(a, f).dtype == getattr(b, f).dtype, f


def test_bad_arguments_and_roundtrip(tmp_path):
    g = grid(3, 3)
    for kw, name in [({"p": 1.5}, "p"), ({"max_depth": -1}, "max_depth"), ({"max_nodes": 0}, "max_nodes"),
                     ({"max_nodes": 5, "max_edges": 3}, "max_edges"), ({"backend": "gpu"}, "backend")]:
        with pytest.raises(ValueError, match=name):
            bfs_subgraphs(g, [0], **kw)
    with pytest.raises(ValueError, match="centres"):
        bfs_subgraphs(g, [9])
    with pytest.raises(TypeError, match="centres"):
        bfs_subgraphs(g, [0.5])
    with pytest.raises(TypeError, match="graph"):
        bfs_subgraphs("g", [0])
    for backend in BACKENDS:
        empty = bfs_subgraphs(g, np.zeros(0, dtype=np.int64), backend=backend)
        assert len(empty) == 0 and empty.node_ptr.tolist() == [0] and empty.nodes.dtype == np.int64
    sg = bfs_subgraphs(g, [0, 4, 8], p=1.0, max_depth=1, backend="reference")
    sg.save(tmp_path / "s.npz")
    back = Subgraphs.load(tmp_path / "s.npz")
    assert all(np.array_equal(getattr(sg, f), getattr(back, f)) for f in FIELDS)
    sel = sg.select([2, 0])
    assert np.array_equal(sel.node_ids(0), sg.node_ids(2)) and np.array_equal(sel.edge_ids(1), sg.edge_ids(0))
    src, dst, rel = sg.local_edges(1, g)
    assert len(src) == len(sg.edge_ids(1)) and src.max() < len(sg.node_ids(1))


def test_auto_falls_back_to_reference_with_a_reason(monkeypatch, caplog):
    import rcn_fast.kg.sampler as S

    g = grid(4, 4)
    want = bfs_subgraphs(g, [5, 6], p=0.5, seed=2, backend="reference")
    monkeypatch.setattr(S, "_numba_kernel", lambda: None)
    monkeypatch.setattr(S, "_NUMBA_ERROR", "numba is not installed (test); install it with: x")
    with caplog.at_level("WARNING", logger="rcn_fast.kg"):
        got = bfs_subgraphs(g, [5, 6], p=0.5, seed=2)
    assert "reference sampler" in caplog.text and "numba is not installed" in caplog.text
    assert all(np.array_equal(getattr(want, f), getattr(got, f)) for f in FIELDS)
    with pytest.raises(ImportError, match="rcn_fast"):
        monkeypatch.setattr(S, "_NUMBA_ERROR", 'numba is not installed; pip install "rcn_fast[septa]"')
        bfs_subgraphs(g, [5], backend="numba")
