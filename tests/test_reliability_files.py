"""Issue 17, corpus files: a broken store manifest, an id table with no
empty slot, non-UTF-8 bytes in a corpus file, and starting a failed build
over with ``--overwrite``."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from rcn_fast.corpus.__main__ import main as corpus_main
from rcn_fast.retrieval.build import BuildConfig, build_corpus
from rcn_fast.retrieval.corpus_input import iter_records
from rcn_fast.retrieval.store import CorpusStore


class HashEncoder:
    """A deterministic stand-in encoder: 8-d vectors from the text's bytes."""

    dim = 8

    def describe(self) -> dict:
        return {"model": "hash-encoder", "dim": self.dim, "model_dir": None}

    def encode_passages(self, texts, batch_size: int = 64) -> np.ndarray:
        out = np.zeros((len(texts), self.dim), np.float32)
        for i, t in enumerate(texts):
            for j, b in enumerate(t.encode("utf-8")):
                out[i, j % self.dim] += b / 255.0
        return out


def write_records(path: Path, n: int = 20) -> Path:
    path.write_text("".join(json.dumps({"id": f"p{i}", "text": f"passage number {i}"}) + "\n" for i in range(n)),
                    encoding="utf-8")
    return path


@pytest.fixture()
def store(tmp_path) -> CorpusStore:
    inp = write_records(tmp_path / "corpus.jsonl")
    return build_corpus(BuildConfig(input=str(inp), out=str(tmp_path / "store"), chunk_size=8, dtype="float32"),
                        HashEncoder(), show_progress=False)


# ------------------------------------------------------------------ the manifest
def test_bad_manifest_json_names_the_file(store):
    mf = store.path / "manifest.json"
    mf.write_text(mf.read_text()[:-40])
    with pytest.raises(ValueError, match=r"manifest.json is not valid JSON"):
        CorpusStore.open(store.path)
    mf.write_bytes(b"\xff\xfe{}")
    with pytest.raises(ValueError, match=r"manifest.json is not valid JSON"):
        CorpusStore.open(store.path)


@pytest.mark.parametrize("key", ["count", "dim", "files"])
def test_a_missing_manifest_key_is_named(store, key):
    mf = store.path / "manifest.json"
    m = json.loads(mf.read_text())
    del m[key]
    mf.write_text(json.dumps(m))
    with pytest.raises(ValueError, match=rf"manifest.json needs '{key}' of type \w+ \(no such key\)"):
        CorpusStore.open(store.path)


def test_a_file_record_without_a_size_is_named(store):
    mf = store.path / "manifest.json"
    m = json.loads(mf.read_text())
    del m["files"]["texts.bin"]["bytes"]
    mf.write_text(json.dumps(m))
    with pytest.raises(ValueError, match=r"texts.bin \(the manifest's record .* has no byte count\)"):
        CorpusStore.open(store.path)


def test_a_damaged_npy_header_names_the_file(store):
    """A same-size change to a header made numpy raise tokenize.TokenError."""
    f = store.path / "id_offsets.npy"
    data = bytearray(f.read_bytes())
    data[data.index(b"{")] = ord("(")
    f.write_bytes(bytes(data))
    with pytest.raises(ValueError, match=r"id_offsets.npy cannot be read .*rcn_fast.corpus verify"):
        CorpusStore.open(store.path)


def test_flat_index_load_of_a_store_verifies_against_the_manifest(store):
    from rcn_fast import FlatIndex

    assert len(FlatIndex.load(store.path, verify=True)) == len(store)
    emb = store.path / "embeddings.npy"
    data = bytearray(emb.read_bytes())
    data[-1] ^= 0x01
    emb.write_bytes(bytes(data))
    with pytest.raises(ValueError, match="does not match its recorded sha256"):
        FlatIndex.load(store.path, verify=True)


# ------------------------------------------------------------------ the id table
def test_row_of_on_an_id_table_without_an_empty_slot_stops(store):
    """A corrupted table (no -1 slot) made row_of loop for ever."""
    table = np.load(store.path / "id_table.npy")
    assert store.row_of("p3") == 3
    full = np.where(table < 0, 0, table)  # every slot taken
    store._id_table = full
    assert store.row_of("p3") == 3  # a present id is still found
    with pytest.raises(ValueError, match=r"id_table.npy is corrupt .*python -m rcn_fast.corpus verify"):
        store.row_of("absent")
    store._id_table = np.full(len(table), 10**9, np.int64)  # rows out of range
    with pytest.raises(ValueError, match="id_table.npy is corrupt"):
        store.row_of("p3")
    assert "absent" not in CorpusStore.open(store.path)


# ------------------------------------------------------------------ non-UTF-8 input
@pytest.mark.parametrize("fmt", ["jsonl", "tsv"])
def test_non_utf8_bytes_name_the_file_and_line(tmp_path, fmt):
    if fmt == "jsonl":
        lines = [b'{"id": "a", "text": "fine"}', b'{"id": "b", "text": "caf\xe9"}']
    else:
        lines = [b"id\ttext", b"a\tfine", b"b\tcaf\xe9"]
    path = tmp_path / f"corpus.{fmt}"
    path.write_bytes(b"\n".join(lines) + b"\n")
    with pytest.raises(ValueError, match=rf"input: {path} line {len(lines)} is not valid UTF-8 \(byte 0xe9 at "
                                         r"column \d+\)"):
        list(iter_records(str(path), fmt))


def test_utf8_with_a_byte_order_mark_and_crlf_still_reads(tmp_path):
    path = tmp_path / "c.tsv"
    path.write_bytes(b"\xef\xbb\xbfid\ttext\r\na\tcaf\xc3\xa9\r\n")
    assert list(iter_records(str(path), "tsv")) == [("a", "café")]
    path = tmp_path / "c.jsonl"
    path.write_bytes(b'\xef\xbb\xbf{"id": 1, "text": "x"}\r\n')
    assert list(iter_records(str(path), "jsonl")) == [("1", "x")]


# ------------------------------------------------------------------ starting over
def test_overwrite_starts_a_failed_build_over(tmp_path):
    good = write_records(tmp_path / "corpus.jsonl")
    text = good.read_bytes()
    good.write_bytes(text + b'{"id": "bad", "text": "caf\xe9"}\n')
    out = tmp_path / "store"
    cfg = dict(input=str(good), out=str(out), chunk_size=8, dtype="float32")
    with pytest.raises(ValueError, match="not valid UTF-8"):
        build_corpus(BuildConfig(**cfg), HashEncoder(), show_progress=False)
    good.write_bytes(text)  # the user fixes the input: bad input kept nothing, the rerun builds
    store = build_corpus(BuildConfig(**cfg), HashEncoder(), show_progress=False)
    assert len(store) == 20 and store.row_of("p19") == 19 and not (out / "parts").exists()
    (out / "notes.txt").write_text("mine")  # a file the build did not write survives --overwrite
    # a finished store with other settings: the message offers --overwrite too
    with pytest.raises(ValueError, match=r"pass --overwrite"):
        build_corpus(BuildConfig(**{**cfg, "dtype": "float16"}), HashEncoder(), show_progress=False)
    again = build_corpus(BuildConfig(**{**cfg, "dtype": "float16"}, overwrite=True), HashEncoder(),
                         show_progress=False)
    assert again.manifest["dtype"] == "float16" and len(again) == 20
    assert (out / "notes.txt").read_text() == "mine"


def test_corpus_cli_reports_bad_input_and_offers_overwrite(tmp_path, capsys):
    pytest.importorskip("torch")
    from tests.retrieval.tiny import make_tiny_bert

    model = make_tiny_bert(tmp_path / "bert")
    inp = write_records(tmp_path / "corpus.jsonl", n=6)
    text = inp.read_bytes()
    inp.write_bytes(text + b"\xff\n")
    out = tmp_path / "out"
    args = ["build", "--input", str(inp), "--encoder", str(model), "--out", str(out), "--no-progress",
            "--chunk-size", "4"]
    assert corpus_main(args) == 2
    err = capsys.readouterr().err
    assert f"error: input: {inp} line 7 is not valid UTF-8" in err and "Traceback" not in err
    inp.write_bytes(text)  # bad input kept nothing: the rerun with the fixed file builds
    assert corpus_main(args) == 0
    assert len(CorpusStore.open(out)) == 6
    # a finished store asked for other settings: the message offers --overwrite
    assert corpus_main(args + ["--dtype", "float32"]) == 2
    assert "--overwrite" in capsys.readouterr().err
    assert corpus_main(args + ["--dtype", "float32", "--overwrite"]) == 0
    # a folder where --out should be a directory it can write: one message, exit 2
    blocked = tmp_path / "file-not-dir"
    blocked.write_text("x")
    assert corpus_main(["build", "--input", str(inp), "--encoder", str(model), "--out", str(blocked / "sub"),
                        "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert f"error: [Errno 20] Not a directory: '{blocked / 'sub'}'" in err and "Traceback" not in err


# ------------------------------------------------------ stamped directories
def _saved_graph(tmp_path: Path) -> Path:
    from rcn_fast.kg import KnowledgeGraph

    g = KnowledgeGraph.from_triples([("plant", "needs", "light"), ("plant", "needs", "water")])
    g.save(tmp_path / "kg")
    return tmp_path / "kg"


@pytest.mark.parametrize("content, message", [
    (b"", r"graph\.json is not valid JSON"),
    (b"\xff\xfe{}", r"graph\.json is not valid JSON"),
    (b"[1, 2]", r"graph\.json holds a JSON list, expected an object"),
    (b'{"format": "other/1"}', r"holds format 'other/1', expected"),
])
def test_a_damaged_stamp_file_is_one_message_naming_it(tmp_path, content, message):
    """KnowledgeGraph.load (like FlatIndex, the corpus store and the SEPTA
    subgraph DB) reads its stamp file through one reader: a damaged file is
    a ValueError naming it, never a bare JSONDecodeError or KeyError."""
    from rcn_fast.kg import KnowledgeGraph

    d = _saved_graph(tmp_path)
    assert KnowledgeGraph.load(d).num_edges == 2
    (d / "graph.json").write_bytes(content)
    with pytest.raises(ValueError, match=message):
        KnowledgeGraph.load(d)
    (d / "graph.json").unlink()
    (d / "graph.json").mkdir()
    with pytest.raises(ValueError, match=r"graph\.json is a directory, expected a JSON file"):
        KnowledgeGraph.load(d)
    with pytest.raises(FileNotFoundError, match=r"has no graph\.json \(not a saved KnowledgeGraph\)"):
        KnowledgeGraph.load(tmp_path / "nothing")
