"""What a corpus store's open-time checks cost (issue 34 item 5), against
its peers in the same run (pytest-benchmark):

    python -m pytest bench/bench_store_checks.py --benchmark-only --benchmark-columns=mean,min,rounds

One group, one store-shaped matrix (N rows x 384 float16, memory-mapped
from a file, with its offsets and id table):

* ``rcn_fast`` -- every open-time check of :meth:`CorpusStore.check_arrays`
  on a first open (the finite scan of every row, both offset arrays, the
  id table; the scan's memo cleared each round);
* ``sha256`` -- hashing ``embeddings.npy``, what ``verify=True`` (a
  recorded checksum) costs for that one file;
* ``flat_search`` -- one flat search of one query over the same rows (each
  search reads every row anyway).

A reopened, unchanged store costs one ``stat`` per file on top of the
offset and table checks (the scan is remembered per version of the file).
N is 200,000 (RCN_FAST_BENCH_QUICK=1: 20,000).
"""

from __future__ import annotations

import os

import numpy as np
import pytest

from rcn_fast.search import FlatIndex

N = 20_000 if os.environ.get("RCN_FAST_BENCH_QUICK") == "1" else 200_000
DIM = 384
GROUP = f"store open checks N={N} d={DIM} fp16"


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    from rcn_fast.retrieval.store import build_id_table, id_hash

    d = tmp_path_factory.mktemp("store")
    rng = np.random.default_rng(0)
    emb = np.lib.format.open_memmap(d / "embeddings.npy", mode="w+", dtype=np.float16, shape=(N, DIM))
    for s in range(0, N, 50_000):
        emb[s : s + 50_000] = rng.standard_normal((min(50_000, N - s), DIM)).astype(np.float16)
    emb.flush()
    lengths = rng.integers(50, 500, N)
    np.save(d / "text_offsets.npy", np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64))
    np.save(d / "id_table.npy", build_id_table(np.array([id_hash(f"d{i}") for i in range(N)], dtype=np.int64)))
    return d


def test_open_checks(benchmark, record, store, monkeypatch, tmp_path):
    import rcn_fast._hashing as h
    from rcn_fast.retrieval.store import _decreasing
    from rcn_fast.search.flat_index import check_finite_rows

    monkeypatch.setenv("RCN_FAST_CACHE", str(tmp_path))
    emb = np.load(store / "embeddings.npy", mmap_mode="r")
    off = np.load(store / "text_offsets.npy", mmap_mode="r")
    table = np.load(store / "id_table.npy", mmap_mode="r")

    def checks():
        h._PASSED.clear()
        for f in tmp_path.rglob("*.json"):
            f.unlink()
        check_finite_rows(store / "embeddings.npy", emb, "")
        assert not _decreasing(off).size and not _decreasing(off).size  # both offset arrays
        seen = np.zeros(N, dtype=bool)
        rows = np.asarray(table)
        seen[rows[rows >= 0]] = True
        assert seen.all()

    benchmark.group = GROUP
    benchmark(checks)
    record(GROUP, "rcn_fast", benchmark)


def test_sha256_verify(benchmark, record, store):
    from rcn_fast._hashing import sha256_file

    benchmark.group = GROUP
    benchmark(sha256_file, store / "embeddings.npy")
    record(GROUP, "sha256", benchmark)


def test_one_flat_search(benchmark, record, store):
    index = FlatIndex(DIM, "ip", "float16")
    index.add(np.load(store / "embeddings.npy"))
    index.embeddings  # noqa: B018 - joined once, outside the timing
    q = np.random.default_rng(1).standard_normal((1, DIM)).astype(np.float32)
    benchmark.group = GROUP
    benchmark(index.search, q, 10)
    record(GROUP, "flat_search", benchmark)
