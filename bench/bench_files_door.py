"""What the files door costs on the hot paths it guards (issue 53): a corpus
store's row reads, its open, and one small file's open and read, against
peers in the same run (pytest-benchmark):

    python -m pytest bench/bench_files_door.py --benchmark-only --benchmark-columns=mean,min,rounds

* ``store rows``: 10,000 random rows' texts through ``CorpusStore.text``
  (``rcn_fast``: the store's bytes mapped from the descriptor the door
  opened) against the layout read by name as before issue 53
  (``np_memmap_by_name``: ``np.memmap`` of ``texts.bin`` and offsets
  ``np.load(mmap_mode="r")``, sliced the same way);
* ``store open``: ``CorpusStore.open`` of an unchanged store (every file
  opened beneath the store's descriptor, sized, mapped; the scans
  remembered) against ``np_load_by_name`` (the six arrays loaded by name,
  no check at all: the floor);
* ``small file``: reading a 2 KB file under a folder through the door
  (``rcn_fast``: ``openat2``; ``walk``: the portable walk, two components)
  against the builtin ``open(path).read()`` (``builtin_open``).

N is 200,000 rows (RCN_FAST_BENCH_QUICK=1: 20,000).
"""

from __future__ import annotations

import hashlib
import json
import os

import numpy as np
import pytest

N = 20_000 if os.environ.get("RCN_FAST_BENCH_QUICK") == "1" else 200_000
DIM = 8
ROWS = np.random.default_rng(1).integers(0, N, 10_000)


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """A store written file by file (no encoder): random texts, their ids, an id table."""
    from rcn_fast.retrieval.store import FORMAT, build_id_table, id_hash, texts_to_blob

    d = tmp_path_factory.mktemp("store")
    rng = np.random.default_rng(0)
    texts = ["passage %d " % i + "w" * int(n) for i, n in enumerate(rng.integers(20, 300, N))]
    ids = [f"p{i}" for i in range(N)]
    tblob, tlen = texts_to_blob(texts)
    iblob, ilen = texts_to_blob(ids)
    np.save(d / "embeddings.npy", rng.standard_normal((N, DIM)).astype(np.float32))
    (d / "texts.bin").write_bytes(tblob.tobytes())
    (d / "ids.bin").write_bytes(iblob.tobytes())
    np.save(d / "text_offsets.npy", np.concatenate([[0], np.cumsum(tlen)]).astype(np.int64))
    np.save(d / "id_offsets.npy", np.concatenate([[0], np.cumsum(ilen)]).astype(np.int64))
    np.save(d / "id_table.npy", build_id_table(np.array([id_hash(i) for i in ids], dtype=np.int64)))
    files = {n: {"bytes": (d / n).stat().st_size, "sha256": hashlib.sha256((d / n).read_bytes()).hexdigest()}
             for n in ("embeddings.npy", "texts.bin", "text_offsets.npy", "ids.bin", "id_offsets.npy",
                       "id_table.npy")}
    (d / "manifest.json").write_text(json.dumps({"format": FORMAT, "count": N, "dim": DIM, "dtype": "float32",
                                                 "files": files}))
    return d


def test_store_rows_door(benchmark, record, store, monkeypatch, tmp_path):
    from rcn_fast.retrieval import CorpusStore

    monkeypatch.setenv("RCN_FAST_CACHE", str(tmp_path))
    s = CorpusStore.open(store)
    benchmark.group = group = f"store rows (10,000 of N={N})"
    out = benchmark(lambda: [s.text(r) for r in ROWS])
    assert out[0] == s.text(int(ROWS[0]))
    record(group, "rcn_fast", benchmark)


def test_store_rows_by_name(benchmark, record, store):
    texts = np.memmap(store / "texts.bin", dtype=np.uint8, mode="r")
    off = np.load(store / "text_offsets.npy", mmap_mode="r")

    def text(r: int) -> str:
        return bytes(texts[off[r]:off[r + 1]]).decode("utf-8")

    benchmark.group = group = f"store rows (10,000 of N={N})"
    benchmark(lambda: [text(int(r)) for r in ROWS])
    record(group, "np_memmap_by_name", benchmark)


def test_store_open_door(benchmark, record, store, monkeypatch, tmp_path):
    from rcn_fast.retrieval import CorpusStore

    monkeypatch.setenv("RCN_FAST_CACHE", str(tmp_path))
    CorpusStore.open(store)  # the scans remembered: what every later open costs
    benchmark.group = group = f"store open (N={N})"
    benchmark(lambda: CorpusStore.open(store))
    record(group, "rcn_fast", benchmark)


def test_store_open_by_name(benchmark, record, store):
    names = ("embeddings.npy", "text_offsets.npy", "id_offsets.npy", "id_table.npy")

    def load():
        arrays = [np.load(store / n, mmap_mode="r") for n in names]
        return arrays, np.memmap(store / "texts.bin", dtype=np.uint8, mode="r"), \
            np.memmap(store / "ids.bin", dtype=np.uint8, mode="r"), json.loads((store / "manifest.json").read_text())

    benchmark.group = group = f"store open (N={N})"
    benchmark(load)
    record(group, "np_load_by_name", benchmark)


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    d = tmp_path_factory.mktemp("small")
    (d / "sub").mkdir()
    (d / "sub" / "f.json").write_bytes(b"x" * 2048)
    return d


@pytest.mark.parametrize("impl", ["rcn_fast", "walk"])
def test_small_file_door(benchmark, record, small, monkeypatch, impl):
    from rcn_fast._files import Folder

    if impl == "walk":
        monkeypatch.setenv("RCN_FAST_NO_OPENAT2", "1")
    root = Folder(small)
    benchmark.group = group = "small file (2 KB, two components)"
    assert len(benchmark(lambda: root.read_bytes("sub/f.json"))) == 2048
    record(group, impl, benchmark)


def test_small_file_builtin(benchmark, record, small):
    def read():
        with open(small / "sub" / "f.json", "rb") as f:
            return f.read()

    benchmark.group = group = "small file (2 KB, two components)"
    assert len(benchmark(read)) == 2048
    record(group, "builtin_open", benchmark)
