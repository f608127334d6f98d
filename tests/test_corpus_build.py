"""Corpus build and store: contents, formats, manifest checks, SIGKILL
resume, shards + merge, the CLI."""

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

import rcn_fast  # noqa: E402
from rcn_fast.retrieval import BuildConfig, CorpusStore, Encoder, build_corpus, merge_shards  # noqa: E402
from rcn_fast.retrieval.build import THROTTLE_ENV  # noqa: E402
from rcn_fast.retrieval.store import build_id_table, id_hash  # noqa: E402
from tests.conftest import REPO  # noqa: E402
from tests.retrieval.fixtures import (  # noqa: E402,F401
    corpus_jsonl, corpus_records, one_torch_thread, run_cli, tiny_model, write_jsonl,
)


@pytest.fixture(scope="module")
def encoder(tiny_model):
    return Encoder.from_pretrained(tiny_model)


@pytest.fixture(scope="module")
def built(tmp_path_factory, corpus_jsonl, encoder) -> CorpusStore:
    out = tmp_path_factory.mktemp("built") / "store"
    return build_corpus(BuildConfig(input=str(corpus_jsonl), out=str(out), chunk_size=16, dtype="float32"),
                        encoder, show_progress=False)


def store_arrays(store: CorpusStore) -> dict:
    return {"emb": np.array(store.embeddings), "texts": store.texts(range(len(store))),
            "ids": store.ids(range(len(store)))}


def assert_same_store(a: CorpusStore, b: CorpusStore) -> None:
    x, y = store_arrays(a), store_arrays(b)
    assert x["ids"] == y["ids"] and x["texts"] == y["texts"]
    np.testing.assert_array_equal(x["emb"], y["emb"])
    assert {k: v["sha256"] for k, v in a.manifest["files"].items()} == \
           {k: v["sha256"] for k, v in b.manifest["files"].items()}


# ------------------------------------------------------------------ contents
def test_store_contents(built, corpus_records, encoder):
    assert len(built) == len(corpus_records) == 120
    assert built.ids(range(len(built))) == [r["id"] for r in corpus_records]
    for row in (0, 17, 119):
        assert built.text(row) == corpus_records[row]["text"]
        assert built.row_of(corpus_records[row]["id"]) == row
    assert all(built.row_of(r["id"]) == i for i, r in enumerate(corpus_records))
    with pytest.raises(KeyError):
        built.row_of("no-such-id")
    with pytest.raises(IndexError, match="row"):
        built.text(120)
    assert "fact-0003" in built and "x" not in built
    ref = encoder.encode_passages([r["text"] for r in corpus_records])
    np.testing.assert_allclose(built.embeddings, ref, atol=1e-6)
    assert isinstance(built.embeddings, np.memmap)


def test_manifest_and_flat_index(built, tiny_model):
    m = built.manifest
    assert m["count"] == 120 and m["dim"] == 32 and m["dtype"] == "float32"
    enc = m["encoder"]
    assert enc["passage_prefix"] == "passage: " and enc["pooling"] == "mean" and enc["normalize"] is True
    assert len(enc["fingerprint"]) == 64 and m["input"]["format"] == "jsonl"
    assert set(m["files"]) >= {"embeddings.npy", "texts.bin", "ids.bin", "id_table.npy"}
    idx = rcn_fast.FlatIndex.load(built.path)  # the store is also a FlatIndex directory
    assert len(idx) == 120 and idx.dim == 32
    built.verify()
    assert not (built.path / "parts").exists() and not (built.path / "build.json").exists()


def test_verify_detects_corruption(built, tmp_path):
    import shutil

    d = tmp_path / "copy"
    shutil.copytree(built.path, d)
    with open(d / "texts.bin", "r+b") as f:
        f.seek(5)
        b = f.read(1)
        f.seek(5)
        f.write(bytes([b[0] ^ 0x20]))
    with pytest.raises(ValueError, match="texts.bin"):
        CorpusStore.open(d, verify=True)


def test_open_checks_file_sizes(built, tmp_path):
    """Without verify=, open compares every file's size with the manifest:
    a truncated, swapped or missing file is a clear error naming it."""
    import shutil

    d = shutil.copytree(built.path, tmp_path / "truncated")
    with open(d / "texts.bin", "r+b") as f:
        f.truncate(f.seek(0, 2) - 1)
    with pytest.raises(ValueError, match=r"texts\.bin \(\d+ bytes, the manifest records \d+"):
        CorpusStore.open(d)
    d = shutil.copytree(built.path, tmp_path / "swapped")  # texts and ids of different sizes
    os.replace(d / "texts.bin", d / "tmp")
    os.replace(d / "ids.bin", d / "texts.bin")
    os.replace(d / "tmp", d / "ids.bin")
    with pytest.raises(ValueError, match="texts.bin.*ids.bin"):
        CorpusStore.open(d)
    d = shutil.copytree(built.path, tmp_path / "missing")
    (d / "id_table.npy").unlink()
    with pytest.raises(ValueError, match=r"id_table\.npy \(missing\)"):
        CorpusStore.open(d)
    assert len(CorpusStore.open(built.path)) == 120


def test_id_table_against_dict(rng):
    """The vectorised open-addressing table finds every key (reference: dict)."""
    ids = [f"k{i}" for i in rng.permutation(5000)]
    hashes = np.array([id_hash(s) for s in ids], dtype=np.int64)
    hashes[:50] = hashes[50:100]  # force collisions of different ids
    table = build_id_table(hashes)
    assert (table >= 0).sum() == len(ids) and len(table) >= 2 * len(ids)
    mask = len(table) - 1
    for row in range(0, 5000, 7):
        pos = int(hashes[row]) & mask
        while table[pos] != row:
            assert table[pos] >= 0, "probe chain broken"
            pos = (pos + 1) & mask


# -------------------------------------------------------------------- formats
def test_tsv_input_equals_jsonl(tmp_path, corpus_records, encoder, built):
    tsv = tmp_path / "corpus.tsv"
    with open(tsv, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f, delimiter="\t")
        w.writerow(["doc_id", "title", "body"])
        for r in corpus_records:
            w.writerow([r["id"], "t", r["text"]])
    s = build_corpus(BuildConfig(input=str(tsv), out=str(tmp_path / "s"), id_field="doc_id", text_field="body",
                                 chunk_size=16, dtype="float32"), encoder, show_progress=False)
    assert s.ids(range(len(s))) == built.ids(range(len(built)))
    np.testing.assert_array_equal(np.asarray(s.embeddings), np.asarray(built.embeddings))


def test_parquet_input(tmp_path, corpus_records, encoder, built):
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        pytest.skip("pyarrow is not installed (pip install pyarrow); Parquet input needs it")
    pq.write_table(pa.table({"pid": [r["id"] for r in corpus_records], "text": [r["text"] for r in corpus_records]}),
                   tmp_path / "c.parquet")
    s = build_corpus(BuildConfig(input=str(tmp_path / "c.parquet"), out=str(tmp_path / "s"), id_field="pid",
                                 dtype="float32", chunk_size=16), encoder, show_progress=False)
    np.testing.assert_array_equal(np.asarray(s.embeddings), np.asarray(built.embeddings))


def test_bad_inputs(tmp_path, encoder):
    bad = write_jsonl(tmp_path / "bad.jsonl", [{"id": "a", "text": "ok"}, {"id": "b", "body": "no text"}])
    with pytest.raises(ValueError, match=r"line 2 has no string 'text'"):
        build_corpus(BuildConfig(input=str(bad), out=str(tmp_path / "o1")), encoder, show_progress=False)
    dup = write_jsonl(tmp_path / "dup.jsonl", [{"id": "a", "text": "x"}, {"id": "b", "text": "y"},
                                               {"id": "a", "text": "z"}])
    with pytest.raises(ValueError, match="duplicate id 'a'"):
        build_corpus(BuildConfig(input=str(dup), out=str(tmp_path / "o2"), chunk_size=2), encoder,
                     show_progress=False)
    with pytest.raises(ValueError, match="format"):
        BuildConfig(input="corpus.csv", out="x")
    with pytest.raises(ValueError, match="shard_id"):
        BuildConfig(input="c.jsonl", out="x", num_shards=2, shard_id=2)
    with pytest.raises(ValueError, match="dtype"):
        BuildConfig(input="c.jsonl", out="x", dtype="int8")


# ------------------------------------------------------------ manifest checks
def test_finished_store_with_other_settings_is_an_error(built, corpus_jsonl, encoder, tiny_model):
    same = build_corpus(BuildConfig(input=str(corpus_jsonl), out=str(built.path), chunk_size=16, dtype="float32"),
                        encoder, show_progress=False)
    assert len(same) == 120  # complete: nothing recomputed
    with pytest.raises(ValueError, match="dtype"):
        build_corpus(BuildConfig(input=str(corpus_jsonl), out=str(built.path), chunk_size=16, dtype="float16"),
                     encoder, show_progress=False)
    other = Encoder.from_pretrained(tiny_model, passage_prefix="doc: ")
    with pytest.raises(ValueError, match="passage_prefix"):
        build_corpus(BuildConfig(input=str(corpus_jsonl), out=str(built.path), chunk_size=16, dtype="float32"),
                     other, show_progress=False)


def test_unfinished_build_with_other_input_is_an_error(tmp_path, corpus_records, encoder):
    a = write_jsonl(tmp_path / "a.jsonl", corpus_records[:40])
    b = write_jsonl(tmp_path / "a2.jsonl", corpus_records[:39] + [{"id": "fact-0039", "text": "changed"}])
    out = tmp_path / "o"
    # shard 0 of 2 leaves an unfinished directory (build.json + parts/)
    assert build_corpus(BuildConfig(input=str(a), out=str(out), chunk_size=8, num_shards=2, shard_id=0),
                        encoder, show_progress=False) is None
    with pytest.raises(ValueError, match=r"unfinished build with other settings: .*input\.sha256"):
        build_corpus(BuildConfig(input=str(b), out=str(out), chunk_size=8, num_shards=2, shard_id=0),
                     encoder, show_progress=False)
    with pytest.raises(FileNotFoundError, match="finished shard of a sharded build"):
        CorpusStore.open(out)


# -------------------------------------------------------------------- shards
def test_shards_merge_equal_single_build(tmp_path, corpus_jsonl, encoder, built):
    dirs = []
    for i in range(3):
        d = tmp_path / f"shard{i}"
        build_corpus(BuildConfig(input=str(corpus_jsonl), out=str(d), chunk_size=16, dtype="float32",
                                 num_shards=3, shard_id=i), encoder, show_progress=False)
        dirs.append(d)
    with pytest.raises(ValueError, match="shards 0..2"):
        merge_shards(dirs[:2], tmp_path / "partial")
    merged = merge_shards(dirs, tmp_path / "merged")
    assert_same_store(merged, built)
    assert merged.manifest["shards"] == 3


# -------------------------------------------------------- SIGKILL and resume
@pytest.fixture(scope="module")
def built_onnx(tmp_path_factory, corpus_jsonl, tiny_model) -> CorpusStore:
    """The store the CLI's default (ONNX Runtime on the CPU) builds, built
    in-process without interruption."""
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    out = tmp_path_factory.mktemp("built_onnx") / "store"
    enc = Encoder.from_pretrained(tiny_model, backend="onnx", cache_dir=str(out.parent / "onnx"))
    return build_corpus(BuildConfig(input=str(corpus_jsonl), out=str(out), chunk_size=16, dtype="float32"),
                        enc, show_progress=False)


@pytest.mark.parametrize("backend", ["torch", "default"])
def test_sigkill_then_resume_equals_uninterrupted(tmp_path, corpus_jsonl, tiny_model, backend, request):
    """kill -9 while chunks are being prepared, embedded and written in
    their three threads; the resumed build equals an uninterrupted one byte
    for byte (the torch backend, and the default: ONNX Runtime on the CPU)."""
    built = request.getfixturevalue("built" if backend == "torch" else "built_onnx")
    out = tmp_path / "killed"
    args = ["build", "--input", str(corpus_jsonl), "--encoder", str(tiny_model), "--out", str(out),
            "--chunk-size", "16", "--dtype", "float32", "--keep-parts", "--no-progress"]
    args += ["--backend", "torch"] if backend == "torch" else ["--onnx-cache", str(built.path.parent / "onnx")]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO),
           THROTTLE_ENV: "0.4"}
    proc = subprocess.Popen([sys.executable, "-m", "rcn_fast.corpus", *args], env=env, cwd=str(REPO),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    parts = out / "parts"
    deadline = time.time() + 90
    try:
        while time.time() < deadline and len(list(parts.glob("chunk-*.npz"))) < 3 and proc.poll() is None:
            time.sleep(0.05)
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.wait()
    assert proc.returncode == -signal.SIGKILL, "the build ended before it could be killed"
    done = {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in parts.glob("chunk-*.npz")}
    assert 3 <= len(done) < 8, f"expected a mid-way kill, found {len(done)} of 8 chunks"
    assert not (out / "manifest.json").exists()
    with pytest.raises(FileNotFoundError, match="unfinished build"):
        CorpusStore.open(out)
    bad = run_cli(*[a if a != "float32" else "float16" for a in args])  # other settings: refused
    assert bad.returncode == 2 and "unfinished build with other settings" in bad.stderr and "dtype" in bad.stderr
    assert "Traceback" not in bad.stderr
    assert {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in parts.glob("chunk-*.npz")} == done

    res = run_cli(*args)
    assert res.returncode == 0, res.stderr
    assert f"{len(done)} chunk(s) already done" in res.stderr
    assert "encoded " + str(120 - 16 * len(done)) + " docs" in res.stderr
    after = {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in parts.glob("chunk-*.npz")}
    assert len(after) == 8
    for name, stamp in done.items():  # finished chunks were not recomputed
        assert after[name] == stamp
    resumed = CorpusStore.open(out, verify=True)
    assert resumed.manifest["encoder"]["backend"] == ("torch" if backend == "torch" else "onnx")
    assert_same_store(resumed, built)


# ----------------------------------------------------------------------- CLI
def test_cli_info_verify_and_errors(built, tmp_path, corpus_jsonl, tiny_model):
    res = run_cli("info", str(built.path))
    assert res.returncode == 0, res.stderr
    info = json.loads(res.stdout)
    assert info["count"] == 120 and info["dim"] == 32 and info["encoder"]["pooling"] == "mean"
    res = run_cli("verify", str(built.path))
    assert res.returncode == 0 and "match" in res.stdout
    res = run_cli("info", str(tmp_path / "nothing"))
    assert res.returncode == 2 and "manifest.json" in res.stderr


def test_no_progress_silences_the_encoders_loading_bar(tmp_path, corpus_jsonl, tiny_model):
    """``corpus build --no-progress`` draws no bar at all: not the build's,
    not transformers' weight loading (which it drew before). A BERT the
    native BERT runs draws none; one it does not (activation gelu_new)
    loads through transformers, which draws its bar unless silenced."""
    import shutil

    hf_model = tmp_path / "gelu-new"
    shutil.copytree(tiny_model, hf_model)
    cfg = json.loads((hf_model / "config.json").read_text())
    (hf_model / "config.json").write_text(json.dumps({**cfg, "hidden_act": "gelu_new"}))
    for model, bar in ((hf_model, True), (tiny_model, False)):
        base = ["build", "--input", str(corpus_jsonl), "--encoder", str(model), "--backend", "torch",
                "--dtype", "float32"]
        shown = run_cli(*base, "--out", str(tmp_path / f"a-{bar}"))
        assert shown.returncode == 0, shown.stderr
        assert ("Loading weights" in shown.stderr) == bar, shown.stderr  # the bar this test is about
        assert ("native BERT" in shown.stderr) != bar
        quiet = run_cli(*base, "--out", str(tmp_path / f"b-{bar}"), "--no-progress")
        assert quiet.returncode == 0, quiet.stderr
        assert "Loading weights" not in quiet.stderr and "%|" not in quiet.stderr, quiet.stderr
