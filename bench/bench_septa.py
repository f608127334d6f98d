"""SEPTA: BFS subgraph sampling (numba vs the Python reference), subgraph-vector
search (rcn_fast FlatIndex vs faiss), and alignment training steps/s on CPU.

Graphs: WordNet (``/usr/share/wordnet``, 117,659 synsets / 186,325 edges)
when installed, else a random graph of the same size; and a ConceptNet-sized
random graph (800,000 nodes / 2,500,000 edges; RCN_FAST_BENCH_QUICK=1 for
a tenth). extra_info has subgraphs/s and steps/s. Run:

    python -m pytest bench/bench_septa.py --benchmark-only --benchmark-columns=mean,min,rounds
"""

from __future__ import annotations

import os

import numpy as np
import pytest

from rcn_fast.kg import bfs_subgraphs, load_wordnet, numba_available, random_graph, wordnet_available

QUICK = bool(os.environ.get("RCN_FAST_BENCH_QUICK"))
SAMPLER = dict(p=0.5, max_depth=2, max_nodes=12, max_edges=24, seed=0)
REF_CENTRES = 1000  # the Python reference is slow: the shared workload is this many centres


@pytest.fixture(scope="module")
def wordnet_graph():
    if wordnet_available():
        return load_wordnet()
    return random_graph(117_659, 186_325, num_relations=18, seed=0)


@pytest.fixture(scope="module")
def big_graph():
    scale = 10 if QUICK else 1
    return random_graph(800_000 // scale, 2_500_000 // scale, num_relations=34, seed=0)


def _centres(g, n):
    return np.random.default_rng(0).choice(g.num_nodes, size=min(n, g.num_nodes), replace=False)


# ------------------------------------------------------------------ BFS sampling
@pytest.mark.parametrize("impl", ["rcn_fast", "reference"])
def test_bfs_wordnet_shared_workload(benchmark, pedantic, record, wordnet_graph, impl):
    if impl == "rcn_fast" and not numba_available()[0]:
        pytest.skip(numba_available()[1])
    c = _centres(wordnet_graph, REF_CENTRES)
    backend = "numba" if impl == "rcn_fast" else "reference"
    bfs_subgraphs(wordnet_graph, c[:10], backend=backend, **SAMPLER)  # compile / warm caches
    out = pedantic(bfs_subgraphs, wordnet_graph, c, backend=backend, **SAMPLER)
    benchmark.extra_info["subgraphs_per_s"] = len(c) / benchmark.stats.stats.mean
    benchmark.extra_info["mean_nodes"] = float(np.diff(out.node_ptr).mean())
    record(f"bfs wordnet {len(c)} centres", impl, benchmark)


@pytest.mark.parametrize("graph", ["wordnet", "conceptnet_size"])
def test_bfs_all_centres_numba(benchmark, pedantic, record, wordnet_graph, big_graph, graph):
    if not numba_available()[0]:
        pytest.skip(numba_available()[1])
    g = wordnet_graph if graph == "wordnet" else big_graph
    c = _centres(g, g.num_nodes if graph == "wordnet" else 200_000)
    bfs_subgraphs(g, c[:10], **SAMPLER)
    pedantic(bfs_subgraphs, g, c, **SAMPLER)
    benchmark.extra_info["subgraphs_per_s"] = len(c) / benchmark.stats.stats.mean
    benchmark.extra_info["graph"] = repr(g)
    record(f"bfs {graph} {len(c)} centres (numba only)", "rcn_fast", benchmark)


# ------------------------------------------------------------------ vector search
@pytest.fixture(scope="module")
def db_vectors():
    rng = np.random.default_rng(0)
    n = 117_659
    return rng.standard_normal((n, 256), dtype=np.float32), rng.standard_normal((320, 256), dtype=np.float32)


@pytest.mark.parametrize("impl", ["rcn_fast", "faiss"])
def test_subgraph_vector_search(benchmark, record, db_vectors, impl):
    """Top-10 subgraph vectors for 320 queries (64 questions x 5 choices) by cosine."""
    g, q = db_vectors
    if impl == "rcn_fast":
        from rcn_fast.septa import SubgraphDB

        db = SubgraphDB(g, np.arange(len(g)), [""] * len(g))
        fn = lambda: db.search(q, 10)  # noqa: E731
    else:
        faiss = pytest.importorskip("faiss")
        gn = g / np.linalg.norm(g, axis=1, keepdims=True)
        index = faiss.IndexFlatIP(g.shape[1])
        index.add(np.ascontiguousarray(gn, dtype=np.float32))

        def fn():
            qn = q / np.linalg.norm(q, axis=1, keepdims=True)
            return index.search(np.ascontiguousarray(qn, dtype=np.float32), 10)

    s, i = benchmark(fn)
    benchmark.extra_info["queries_per_s"] = len(q) / benchmark.stats.stats.mean
    record("subgraph vector search 117k x 256, 320 queries, k=10", impl, benchmark)


# ------------------------------------------------------------------ alignment
def test_alignment_steps_per_s(benchmark, pedantic, record, wordnet_graph):
    """Training steps/s: batch 64, GNN hidden 256, 2 layers, aligned dim 256,
    text dim 384 (MiniLM width; random stand-ins for the frozen embeddings)."""
    torch = pytest.importorskip("torch")
    from rcn_fast.septa import AlignConfig, AlignModel, GNNConfig, SubgraphTable, train_alignment

    g = wordnet_graph
    c = _centres(g, 64 * 20)
    sg = bfs_subgraphs(g, c, **SAMPLER)
    tab = SubgraphTable.from_subgraphs(sg, g)
    rng = np.random.default_rng(0)
    nf = rng.standard_normal((g.num_nodes, 384), dtype=np.float32).astype(np.float16)
    temb = rng.standard_normal((len(sg), 384), dtype=np.float32)
    steps = 20
    model = AlignModel(GNNConfig(hidden=256, heads=4), 384, 256, g.num_relations, g.num_nodes, nf)
    train_alignment(model, tab, temb, AlignConfig(dim=256, batch_size=64, max_steps=2))  # warm-up
    cfg = AlignConfig(dim=256, batch_size=64, max_steps=steps)
    pedantic(train_alignment, model, tab, temb, cfg)
    benchmark.extra_info["steps_per_s"] = steps / benchmark.stats.stats.mean
    benchmark.extra_info["torch_threads"] = torch.get_num_threads()
    record("alignment training 20 steps (batch 64, hidden 256)", "rcn_fast", benchmark)
