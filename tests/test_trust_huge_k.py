"""Issue 26 item 10: a huge ``k`` on a tiny corpus costs nothing beyond
the corpus.

``retrieve(["q"], 10**9)`` on a 4-passage corpus used to allocate [1, 10**9]
results (12 GB) and convert them to Python lists, and was OOM-killed. Every
place where ``k`` meets a corpus now searches for at most the corpus size:
list-returning ``retrieve`` methods return at most N passages; the raw
``search``/``topn`` calls keep their documented [Q, k] (-inf, -1)-padded
results, but the kernels are asked for ``min(k, N)`` only.

The retrieve checks run in a child process under an address-space limit
(``RLIMIT_AS``), so the code before the fix fails with MemoryError there
instead of eating the shared machine's memory.
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import rcn_fast
from rcn_fast.search import FlatIndex
from tests.conftest import REPO

topn_module = importlib.import_module("rcn_fast.search.topn")  # the module (the package exports the function)

HUGE = 10**9
TEXTS = ["plants need light", "ice is cold", "magnets attract iron", "the sky is blue"]
# headroom above the child's own footprint: far below the 12 GB of [1, 10**9]
# results, far above what a 4-passage search needs
HEADROOM = 768 << 20


def _run_limited(body: str, tmp_path) -> dict:
    """Run ``body`` (which sets ``result``) in a child limited to its start-up
    address space + HEADROOM; return ``result`` (JSON)."""
    head = textwrap.dedent("""
        import json, resource, sys
        import numpy as np
        def vm_size():
            with open("/proc/self/status") as f:
                for line in f:
                    if line.startswith("VmSize:"):
                        return int(line.split()[1]) * 1024
        EMB = np.eye(4, dtype=np.float32)
        def embed(texts):
            return np.stack([EMB[TEXTS.index(t)] if t in TEXTS else EMB[len(t) % 4] for t in texts])
    """)
    tail = textwrap.dedent("""
        limit = vm_size() + HEADROOM
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
        try:
            result = run()
        except MemoryError as e:
            result = {"error": "MemoryError: " + str(e)}
        print(json.dumps(result))
    """)
    script = (head + f"TEXTS = {TEXTS!r}\nHEADROOM = {HEADROOM}\n" + textwrap.dedent(body) + tail)
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1",
           "MKL_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    p = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, cwd=str(tmp_path),
                       timeout=120)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


def test_in_memory_retriever_huge_k(tmp_path):
    res = _run_limited("""
        from rcn_fast.integrations import CallableEncoder
        from rcn_fast.retrieval.memory import InMemoryRetriever
        def run():
            r = InMemoryRetriever(CallableEncoder(embed), TEXTS)
            out = r.retrieve(["ice is cold", "the sky is blue"], 10**9)
            empty = InMemoryRetriever(CallableEncoder(embed), [])
            return {"lists": [[p.text for p in lst] for lst in out],
                    "empty": [len(x) for x in empty.retrieve_embeddings(EMB[:1], 10**9)]}
    """, tmp_path)
    assert "error" not in res, res["error"]
    assert [len(x) for x in res["lists"]] == [4, 4]
    assert res["lists"][0][0] == "ice is cold" and res["lists"][1][0] == "the sky is blue"
    assert res["empty"] == [0]


def test_store_retriever_huge_k(tmp_path):
    res = _run_limited("""
        from rcn_fast.integrations import CallableEncoder
        from rcn_fast.retrieval import BuildConfig, Retriever, build_corpus
        def run():
            with open("c.jsonl", "w") as f:
                for i, t in enumerate(TEXTS):
                    f.write(json.dumps({"id": f"p{i}", "text": t}) + "\\n")
            enc = CallableEncoder(embed)
            build_corpus(BuildConfig(input="c.jsonl", out="store", dtype="float32"), enc, show_progress=False)
            r = Retriever.load("store", encoder=enc)
            out = r.retrieve(["magnets attract iron"], 10**9)
            dd = r.retrieve(["magnets attract iron"], 10**9, dedup=True)
            return {"ids": [p.id for p in out[0]], "dedup": len(dd[0])}
    """, tmp_path)
    assert "error" not in res, res["error"]
    assert res["ids"][0] == "p2" and sorted(res["ids"]) == ["p0", "p1", "p2", "p3"]
    assert res["dedup"] == 4


def test_bm25_huge_k(tmp_path):
    pytest.importorskip("bm25s")
    res = _run_limited("""
        from rcn_fast.retrieval.bm25 import BM25Index
        def run():
            idx = BM25Index(TEXTS)
            out = idx.retrieve(["cold ice", "blue sky"], 10**9)
            return {"lists": [[p.text for p in lst] for lst in out]}
    """, tmp_path)
    assert "error" not in res, res["error"]
    assert res["lists"] == [["ice is cold"], ["the sky is blue"]]


def _spy_kernel(monkeypatch) -> list[int]:
    """Record the ``k`` every top-n kernel call is asked for."""
    asked: list[int] = []
    real = topn_module.TOPN

    def spy(ctx, backend, **kw):
        asked.append(int(kw["k"]))
        assert ctx["k"] == kw["k"]
        return real(ctx, backend, **kw)

    monkeypatch.setattr(topn_module, "TOPN", spy)
    return asked


@pytest.mark.parametrize("backend", ["native", "numpy", "torch"])
def test_topn_kernel_never_searches_beyond_the_corpus(monkeypatch, backend):
    """topn keeps its documented [Q, k] (-inf, -1)-padded results, but the
    kernel is asked for min(k, N): no work buffer grows with k."""
    if backend == "native" and rcn_fast._native.cpu_module()[0] is None:
        pytest.skip("native extension not built")
    corpus = np.eye(4, dtype=np.float32)
    queries = corpus[[2, 1]]
    if backend == "torch":
        torch = pytest.importorskip("torch")
        queries, corpus = torch.from_numpy(queries), torch.from_numpy(corpus)
    asked = _spy_kernel(monkeypatch)
    k = 100_000
    s, i = rcn_fast.topn(queries, corpus, k, backend=backend)
    assert asked == [4]
    s, i = np.asarray(s), np.asarray(i)
    assert s.shape == (2, k) and i.shape == (2, k) and s.dtype == np.float32 and i.dtype == np.int64
    assert i[:, :4].tolist() == [[2, 0, 1, 3], [1, 0, 2, 3]]
    assert s[:, :4].tolist() == [[1, 0, 0, 0], [1, 0, 0, 0]]
    assert (i[:, 4:] == -1).all() and np.isneginf(s[:, 4:]).all()
    # k <= N: unchanged
    asked.clear()
    s3, i3 = rcn_fast.topn(queries, corpus, 3, backend=backend)
    assert asked == [3] and np.asarray(i3).tolist() == [[2, 0, 1], [1, 0, 2]]


def test_flat_index_search_pads_without_kernel_work(monkeypatch):
    asked = _spy_kernel(monkeypatch)
    idx = FlatIndex(4)
    idx.add(np.eye(4, dtype=np.float32)[:3])
    s, i = idx.search(np.eye(4, dtype=np.float32)[[1]], 50_000)
    assert asked == [3] and s.shape == i.shape == (1, 50_000)
    assert i[0, :3].tolist() == [1, 0, 2] and (i[0, 3:] == -1).all() and np.isneginf(s[0, 3:]).all()
    asked.clear()
    s, i = FlatIndex(4).search(np.ones((2, 4), np.float32), 7)  # empty index: padding, no kernel call
    assert asked == [] and (i == -1).all() and np.isneginf(s).all() and s.shape == (2, 7)


def test_topn_huge_k_is_refused_before_allocating(monkeypatch):
    """[1, 10**9] padded results (12 GB) that do not fit: MemoryError naming k."""
    monkeypatch.setattr(topn_module, "host_bytes_available", lambda: 1 << 30)
    corpus = np.eye(4, dtype=np.float32)
    with pytest.raises(MemoryError, match=r"k: .*the corpus has 4 rows"):
        rcn_fast.topn(corpus[:1], corpus, HUGE)


def test_septa_top_k_beyond_the_database(tmp_path):
    """SEPTA's retrieval slots (G [Q, C, k, d]) stop at the database size: a
    top_k far beyond it allocates nothing more and scores the same."""
    pytest.importorskip("torch")
    from rcn_fast.data import MCQuestion
    from rcn_fast.septa import (AlignConfig, GNNConfig, PredictorConfig, SamplerConfig, SeptaSystem,
                                build_database, prepare_alignment, run_alignment)
    from tests.septa.helpers import BagOfWordsEncoder, word_graph

    g, enc, d = word_graph(240, 700, seed=1), BagOfWordsEncoder(32), tmp_path / "septa"
    prepare_alignment(d, g, enc, num_pairs=48, eval_pairs=16, sampler=SamplerConfig(max_nodes=5, max_edges=8),
                      gnn=GNNConfig(hidden=16, heads=2))
    run_alignment(d, AlignConfig(dim=16, batch_size=16, max_steps=2))
    db = build_database(d, encoder=enc, limit=6)
    names = g.node_names
    qs = [MCQuestion(id="q", question=f"What goes with {names[0]}?", choices=[names[1], names[2]], answer=0)]
    out = {}
    for top_k in (len(db), 10**6):
        s = SeptaSystem(d, encoder=enc, predictor_config=PredictorConfig(top_k=top_k), load_predictor=False)
        feats, _ = s.features(qs)
        out[top_k] = (feats, s.score(feats))
    wide, narrow = out[10**6][0], out[len(db)][0]
    assert wide.G.shape == narrow.G.shape == (1, 2, len(db), 16) and (wide.G_ids >= 0).all()
    np.testing.assert_array_equal(wide.G_ids, narrow.G_ids)
    np.testing.assert_allclose(out[10**6][1], out[len(db)][1], rtol=1e-6)
