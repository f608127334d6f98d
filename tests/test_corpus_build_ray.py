"""Corpus build on Ray Data, and the chunk scan every executor shares.

The scan tests (no Ray): chunk spans read back exactly what iter_records
streams (blank lines, BOM, quoted TSV newlines, Parquet row groups), a shard
decodes only its own chunks, the hash+scan memo misses on a changed file.
The Ray tests run one local cluster (``ray.init(num_cpus=2)``) for the
module: a Ray-built store equals the local one (file checksums, ids, top-k),
a killed Ray build resumes, and ``--executor ray`` without Ray says how to
install it.
"""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from rcn_fast.retrieval import BuildConfig, CorpusStore, Encoder, Retriever, build_corpus  # noqa: E402
from rcn_fast.retrieval import build as build_mod  # noqa: E402
from rcn_fast.retrieval import corpus_input as input_mod  # noqa: E402
from rcn_fast.retrieval.build import THROTTLE_ENV  # noqa: E402
from rcn_fast.retrieval.conventions import InputError  # noqa: E402
from rcn_fast.retrieval.corpus_input import iter_records, read_chunk, scan_input  # noqa: E402
from tests.conftest import REPO  # noqa: E402
from tests.retrieval.fixtures import (  # noqa: E402,F401
    corpus_jsonl, corpus_records, one_torch_thread, run_cli, tiny_model, write_jsonl,
)

N_CHUNKS = 8  # 120 records, chunk_size 16


@pytest.fixture(autouse=True)
def scan_cache(tmp_path, monkeypatch):
    """Scan memos in the test's own folder (RCN_FAST_CACHE: the variable the
    cache root reads first, and the one the session sets)."""
    monkeypatch.setenv("RCN_FAST_CACHE", str(tmp_path / "cache"))


def chunks_by_scan(path: Path, fmt: str, size: int, **fields) -> list[tuple[list[str], list[str]]]:
    _, _, spans = scan_input(str(path), fmt, size, memo=False)
    assert [s.chunk for s in spans] == list(range(len(spans)))
    return [read_chunk(str(path), fmt, s, **fields) for s in spans]


def chunks_by_stream(path: Path, fmt: str, size: int, **fields) -> list[tuple[list[str], list[str]]]:
    recs = list(iter_records(str(path), fmt, **fields))
    return [([r[0] for r in recs[i:i + size]], [r[1] for r in recs[i:i + size]]) for i in range(0, len(recs), size)]


# ------------------------------------------------------------------- the scan
@pytest.mark.parametrize("size", [1, 3, 7, 100])
def test_jsonl_spans_equal_stream(tmp_path, size):
    lines = ['{"id": "a", "text": "first"}', "", "   ", '{"id": 2, "text": "two\\nlines"}', "\u00a0\u2003",
             "\x1c\x1f", '{"id": "c", "text": "c"}', '{"id": "d", "text": "caf\u00e9 \u2603"}', "\t",
             *[json.dumps({"id": f"x{i}", "text": f"t {i}"}) for i in range(9)], ""]
    p = tmp_path / "c.jsonl"
    p.write_bytes(b"\xef\xbb\xbf" + "\n".join(lines).encode("utf-8"))  # BOM, no final newline
    got = chunks_by_scan(p, "jsonl", size)
    assert got == chunks_by_stream(p, "jsonl", size)
    assert sum(len(c[0]) for c in got) == 13


@pytest.mark.parametrize("size", [1, 2, 5])
def test_tsv_spans_equal_stream(tmp_path, size):
    p = tmp_path / "c.tsv"
    with open(p, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f, delimiter="\t")
        w.writerow(["pid", "body"])
        for i in range(11):
            w.writerow([f"p{i}", f"line one\nline two {i}" if i % 3 == 0 else f"text {i}"])
            if i == 4:
                f.write("\n")  # an empty row (DictReader skips it)
    got = chunks_by_scan(p, "tsv", size, id_field="pid", text_field="body")
    assert got == chunks_by_stream(p, "tsv", size, id_field="pid", text_field="body")
    assert got[0][1][0] == "line one\nline two 0"


def test_parquet_spans_equal_stream(tmp_path):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    p = tmp_path / "c.parquet"
    pq.write_table(pa.table({"id": [f"r{i}" for i in range(50)], "text": [f"t{i}" for i in range(50)]}), p,
                   row_group_size=7)
    for size in (4, 7, 50):
        assert chunks_by_scan(p, "parquet", size) == chunks_by_stream(p, "parquet", size)


def test_scan_hash_and_errors_as_stream(tmp_path):
    from rcn_fast._hashing import sha256_file

    p = write_jsonl(tmp_path / "c.jsonl", [{"id": str(i), "text": "x"} for i in range(5)])
    with open(p, "a") as f:
        f.write('{"id": "5", "body": "no text"}\n')
    sha, size, spans = scan_input(str(p), "jsonl", 4, memo=False)
    assert sha == sha256_file(p) and size == p.stat().st_size and [s.count for s in spans] == [4, 2]
    with pytest.raises(ValueError, match=r"line 6 has no string 'text'"):
        read_chunk(str(p), "jsonl", spans[1])


def test_shard_decodes_only_its_chunks(tmp_path, corpus_records, tiny_model):
    """An invalid record in chunk 1 fails shard 1 and not shard 0, and the
    shards still merge into the one-go store."""
    enc = Encoder.from_pretrained(tiny_model)
    recs = corpus_records[:40]
    good = write_jsonl(tmp_path / "good.jsonl", recs)
    bad = tmp_path / "bad.jsonl"
    lines = good.read_text().splitlines(keepends=True)
    lines[9] = "{not json\n"  # chunk 1 of chunk_size 8
    bad.write_text("".join(lines))
    kw = dict(input=str(bad), chunk_size=8, num_shards=2, dtype="float32")
    assert build_corpus(BuildConfig(out=str(tmp_path / "s0"), shard_id=0, **kw), enc, show_progress=False) is None
    with pytest.raises(ValueError, match="line 10 is not valid JSON"):
        build_corpus(BuildConfig(out=str(tmp_path / "s1"), shard_id=1, **kw), enc, show_progress=False)
    dirs = []
    for i in range(2):
        dirs.append(tmp_path / f"g{i}")
        build_corpus(BuildConfig(**{**kw, "input": str(good)}, out=str(dirs[-1]), shard_id=i), enc,
                     show_progress=False)
    merged = build_mod.merge_shards(dirs, tmp_path / "merged")
    one = build_corpus(BuildConfig(input=str(good), out=str(tmp_path / "one"), chunk_size=8, dtype="float32"), enc,
                       show_progress=False)
    assert file_sums(merged) == file_sums(one)


def test_scan_memo(tmp_path, monkeypatch):
    p = write_jsonl(tmp_path / "c.jsonl", [{"id": str(i), "text": "x"} for i in range(10)])
    first = scan_input(str(p), "jsonl", 3)
    assert not list((tmp_path / "cache").glob("corpus_scan/*.json")), "a small file must not be memoised"
    monkeypatch.setattr(input_mod, "_MEMO_MIN_BYTES", 0)
    assert scan_input(str(p), "jsonl", 3) == first
    assert not list((tmp_path / "cache").glob("corpus_scan/*.json")), "a just-written file must not be memoised"
    monkeypatch.setattr(input_mod, "_RACY_S", -1e9)  # treat the file as old
    assert scan_input(str(p), "jsonl", 3) == first
    assert len(list((tmp_path / "cache").glob("corpus_scan/*.json"))) == 1

    def no_scan(*a, **k):
        raise AssertionError("scanned again")

    monkeypatch.setattr(input_mod, "_scan_lines", no_scan)
    assert scan_input(str(p), "jsonl", 3) == first  # memo hit
    with open(p, "a") as f:  # a changed file misses
        f.write(json.dumps({"id": "10", "text": "y"}) + "\n")
    with pytest.raises(AssertionError, match="scanned again"):
        scan_input(str(p), "jsonl", 3)


# -------------------------------------------------------------------- on Ray
def file_sums(store: CorpusStore) -> dict[str, str]:
    return {k: v["sha256"] for k, v in store.manifest["files"].items()}


@pytest.fixture(scope="module")
def ray_cluster():
    ray = pytest.importorskip("ray")
    pytest.importorskip("ray.data")
    ray.init(num_cpus=2, include_dashboard=False)
    try:
        yield ray.get_runtime_context().gcs_address
    finally:
        ray.shutdown()


@pytest.fixture(scope="module")
def local_store(tmp_path_factory, corpus_jsonl, tiny_model) -> CorpusStore:
    out = tmp_path_factory.mktemp("local") / "store"
    return build_corpus(BuildConfig(input=str(corpus_jsonl), out=str(out), chunk_size=16, dtype="float32"),
                        Encoder.from_pretrained(tiny_model), show_progress=False)


def test_ray_build_retrieves_as_local(ray_cluster, tmp_path, corpus_jsonl, corpus_records, tiny_model, local_store):
    from rcn_fast.retrieval.build_ray import build_corpus_ray, describe_encoder

    enc = Encoder.from_pretrained(tiny_model)
    assert describe_encoder(enc.config) == enc.describe()  # the driver loads no weights
    store = build_corpus_ray(BuildConfig(input=str(corpus_jsonl), out=str(tmp_path / "ray"), chunk_size=16,
                                         dtype="float32"), enc.config, num_workers=2, show_progress=False)
    assert store.manifest["executor"] == "ray" and local_store.manifest["executor"] == "local"
    assert file_sums(store) == file_sums(local_store)
    assert store.manifest["build"] == local_store.manifest["build"]
    assert store.ids(range(len(store))) == [r["id"] for r in corpus_records]
    np.testing.assert_array_equal(np.asarray(store.embeddings), np.asarray(local_store.embeddings))
    queries = ["why do plants need sunlight?", "what does a magnet attract?", "how do bees help flowers?"]
    a = Retriever(enc, store).retrieve(queries, k=5)
    b = Retriever(enc, local_store).retrieve(queries, k=5)
    assert [[p.id for p in r] for r in a] == [[p.id for p in r] for r in b]
    assert [[p.score for p in r] for r in a] == [[p.score for p in r] for r in b]


def test_ray_build_killed_then_resumed_locally(ray_cluster, tmp_path, corpus_jsonl, tiny_model, local_store):
    """SIGKILL a Ray build's driver mid-way (it joined the test's cluster):
    other settings are refused, and the local executor resumes it (same
    build.json), keeping the finished chunks; the result equals the one-go
    local build."""
    from rcn_fast.retrieval.build_ray import build_corpus_ray

    out = tmp_path / "killed"
    args = ["build", "--input", str(corpus_jsonl), "--encoder", str(tiny_model), "--out", str(out),
            "--chunk-size", "16", "--dtype", "float32", "--keep-parts", "--no-progress", "--executor", "ray",
            "--ray-address", ray_cluster, "--num-workers", "2", "--backend", "torch"]  # local_store's backend
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO),
           THROTTLE_ENV: "1.0"}
    proc = subprocess.Popen([sys.executable, "-m", "rcn_fast.corpus", *args], env=env, cwd=str(REPO),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    parts = out / "parts"
    deadline = time.time() + 240
    try:
        while time.time() < deadline and len(list(parts.glob("chunk-*.npz"))) < 2 and proc.poll() is None:
            time.sleep(0.05)
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.wait()
    assert proc.returncode == -signal.SIGKILL, "the build ended before it could be killed"
    time.sleep(1.5)  # let a chunk the dead job's actors were writing land (a rename, or nothing)
    done = {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in parts.glob("chunk-*.npz")}
    assert 2 <= len(done) < N_CHUNKS, f"expected a mid-way kill, found {len(done)} of {N_CHUNKS} chunks"
    assert not (out / "manifest.json").exists()

    enc = Encoder.from_pretrained(tiny_model)
    with pytest.raises(ValueError, match=r"unfinished build with other settings: .*dtype"):
        build_corpus_ray(BuildConfig(input=str(corpus_jsonl), out=str(out), chunk_size=16, dtype="float16",
                                     keep_parts=True), enc.config, num_workers=2, show_progress=False)
    store = build_corpus(BuildConfig(input=str(corpus_jsonl), out=str(out), chunk_size=16, dtype="float32",
                                     keep_parts=True), enc, show_progress=False)
    after = {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in parts.glob("chunk-*.npz")}
    assert len(after) == N_CHUNKS
    for name, stamp in done.items():  # finished chunks were not recomputed
        assert after[name] == stamp
    assert file_sums(CorpusStore.open(out, verify=True)) == file_sums(local_store)
    assert store.ids(range(len(store))) == local_store.ids(range(len(local_store)))


def test_local_build_resumed_on_ray(ray_cluster, tmp_path, corpus_jsonl, tiny_model, local_store):
    """An unfinished local build (some chunks in parts/) finishes on Ray:
    only the missing chunks are embedded, the rest kept."""
    import shutil

    from rcn_fast.retrieval.build_ray import build_corpus_ray

    enc = Encoder.from_pretrained(tiny_model)
    cfg = BuildConfig(input=str(corpus_jsonl), out=str(tmp_path / "o"), chunk_size=16, dtype="float32",
                      keep_parts=True)
    build_corpus(cfg, enc, show_progress=False)
    out = Path(cfg.out)
    for f in out.iterdir():  # back to an unfinished build: build.json and chunks 0, 2, 4, 6
        if f.is_file() and f.name != "build.json":
            f.unlink()
    for c in (1, 3, 5, 7):
        (out / "parts" / f"chunk-{c:08d}.npz").unlink()
    kept = {p.name: p.stat().st_ino for p in (out / "parts").glob("chunk-*.npz")}
    shutil.copy(corpus_jsonl, tmp_path / "moved.jsonl")  # another file name is another input
    with pytest.raises(ValueError, match=r"input\.name"):
        build_corpus_ray(BuildConfig(**{**cfg.to_dict(), "input": str(tmp_path / "moved.jsonl")}), enc.config,
                         num_workers=2, show_progress=False)
    store = build_corpus_ray(cfg, enc.config, show_progress=False)  # workers: as many as the CPUs allow
    assert {p.name: p.stat().st_ino for p in (out / "parts").glob("chunk-*.npz") if p.name in kept} == kept
    assert len(list((out / "parts").glob("chunk-*.npz"))) == N_CHUNKS
    assert file_sums(store) == file_sums(local_store) and store.manifest["executor"] == "ray"


def test_ray_worker_errors_reach_the_caller(ray_cluster, tmp_path, corpus_records, tiny_model):
    """A bad record met by an actor is the InputError the local build raises
    (its message, not Ray's wrapper and traceback), and the build keeps
    nothing, as a local one: the rerun on the fixed file builds."""
    from rcn_fast.retrieval.build_ray import build_corpus_ray

    lines = [json.dumps(r) + "\n" for r in corpus_records[:24]]
    good = "".join(lines)
    lines[13] = '{"id": "x", "body": "no text"}\n'
    bad = tmp_path / "bad.jsonl"
    bad.write_text("".join(lines))
    out = tmp_path / "o"
    enc = Encoder.from_pretrained(tiny_model).config
    with pytest.raises(InputError, match=r"line 14 has no string 'text'.*kept nothing") as info:
        build_corpus_ray(BuildConfig(input=str(bad), out=str(out), chunk_size=8), enc, num_workers=1,
                         show_progress=False)
    assert type(info.value) is InputError and "ray::" not in str(info.value)
    assert not out.exists()  # this build made the folder: nothing of it is left
    bad.write_text(good)  # the user fixes the input
    store = build_corpus_ray(BuildConfig(input=str(bad), out=str(out), chunk_size=8), enc, num_workers=1,
                             show_progress=False)
    assert len(store) == 24


def test_cli_encoder_dtype(tmp_path, corpus_jsonl, tiny_model, local_store, capsys):
    """--encoder-dtype reaches the encoder and the manifest (bfloat16 on CPU)."""
    from rcn_fast.corpus.__main__ import main

    out = tmp_path / "bf16"
    assert main(["build", "--input", str(corpus_jsonl), "--encoder", str(tiny_model), "--out", str(out),
                 "--chunk-size", "16", "--dtype", "float32", "--encoder-dtype", "bfloat16", "--no-progress"]) == 0
    store = CorpusStore.open(out)
    assert store.manifest["encoder"]["dtype"] == "bfloat16" and local_store.manifest["encoder"]["dtype"] == "float32"
    a, b = np.asarray(store.embeddings), np.asarray(local_store.embeddings)
    cos = (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)
    assert cos.min() > 0.98 and not np.array_equal(a, b)


def test_executor_ray_without_ray(monkeypatch, capsys, tmp_path, corpus_jsonl, tiny_model):
    from rcn_fast.corpus.__main__ import main

    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError
    monkeypatch.setitem(sys.modules, "ray.data", None)
    rc = main(["build", "--input", str(corpus_jsonl), "--encoder", str(tiny_model), "--out", str(tmp_path / "o"),
               "--executor", "ray", "--no-progress"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2
    assert len(err) == 1 and 'pip install "rcn_fast[ray]"' in err[0] and "Traceback" not in err[0]
    assert not (tmp_path / "o").exists()  # refused before any work
