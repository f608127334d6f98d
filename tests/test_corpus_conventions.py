"""Corpus conventions (issue 27.9): exact duplicate passages are dropped by
default (counted in the log and the manifest; ``--keep-duplicates`` keeps
them), in one-pass, sharded and resumed builds alike; a FlashRAG
``{"id", "contents"}`` file is read without naming its field, by
``corpus build`` and by the eval's ``--corpus`` (which takes
``--text-field`` too)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from rcn_fast.retrieval import BuildConfig, build_corpus  # noqa: E402
from rcn_fast.retrieval.build import merge_shards  # noqa: E402
from rcn_fast.retrieval.store import CorpusStore  # noqa: E402
from tests.conftest import SHARED  # noqa: E402
from tests.retrieval.fixtures import one_torch_thread, tiny_model, write_jsonl  # noqa: E402,F401

TEXTS = ["Plants need sunlight.", "A magnet attracts iron.", "Plants need sunlight.", "Fish breathe with gills.",
         "A magnet attracts iron.", "Plants need sunlight.", "Owls hunt at night.", "plants need sunlight."]
# first of each distinct text, in file order (the last one differs in case: not an exact duplicate)
KEPT = [0, 1, 3, 6, 7]


@pytest.fixture(scope="module")
def encoder(tiny_model):
    from rcn_fast.retrieval import Encoder

    return Encoder.from_pretrained(tiny_model, device="cpu")


@pytest.fixture
def dup_file(tmp_path) -> Path:
    return write_jsonl(tmp_path / "facts.jsonl", [{"id": f"r{i}", "text": t} for i, t in enumerate(TEXTS)])


def _same_store(a: CorpusStore, b: CorpusStore) -> None:
    assert len(a) == len(b)
    assert _ids_texts(a) == _ids_texts(b)
    np.testing.assert_array_equal(np.asarray(a.embeddings), np.asarray(b.embeddings))


def _ids_texts(store: CorpusStore) -> list[tuple[str, str]]:
    rows = range(len(store))
    return list(zip(store.ids(rows), store.texts(rows)))


@pytest.mark.parametrize("chunk_size", [2, 3, 100])
def test_duplicates_dropped_by_default_first_kept(dup_file, tmp_path, encoder, chunk_size, caplog):
    with caplog.at_level(logging.INFO, logger="rcn_fast.retrieval"):
        store = build_corpus(BuildConfig(input=str(dup_file), out=str(tmp_path / "s"), chunk_size=chunk_size),
                             encoder, show_progress=False)
    assert _ids_texts(store) == [(f"r{i}", TEXTS[i]) for i in KEPT]
    assert store.manifest["duplicates_dropped"] == len(TEXTS) - len(KEPT)
    assert f"dropped {len(TEXTS) - len(KEPT)} exact duplicate passage(s) of {len(TEXTS)}" in caplog.text
    kept = build_corpus(BuildConfig(input=str(dup_file), out=str(tmp_path / "k"), chunk_size=chunk_size,
                                    keep_duplicates=True), encoder, show_progress=False)
    assert _ids_texts(kept) == [(f"r{i}", t) for i, t in enumerate(TEXTS)]
    np.testing.assert_array_equal(np.asarray(store.embeddings), np.asarray(kept.embeddings)[KEPT])


def test_sharded_and_resumed_builds_drop_the_same_duplicates(dup_file, tmp_path, encoder):
    one = build_corpus(BuildConfig(input=str(dup_file), out=str(tmp_path / "one"), chunk_size=2), encoder,
                       show_progress=False)
    shards = []
    for sid in range(2):
        out = tmp_path / f"shard{sid}"
        assert build_corpus(BuildConfig(input=str(dup_file), out=str(out), chunk_size=2, num_shards=2, shard_id=sid),
                            encoder, show_progress=False) is None
        shards.append(str(out))
    merged = merge_shards(shards, tmp_path / "merged")
    _same_store(merged, one)
    assert merged.manifest["duplicates_dropped"] == len(TEXTS) - len(KEPT)

    class Crash(RuntimeError):
        pass

    class DiesAfterOneChunk:
        def __init__(self, enc):
            self.enc, self.calls = enc, 0

        def describe(self):
            return self.enc.describe()

        def encode_passages(self, texts, **kw):
            self.calls += 1
            if self.calls > 1:
                raise Crash("killed")
            return self.enc.encode_passages(texts, **kw)

    cfg = dict(input=str(dup_file), out=str(tmp_path / "resumed"), chunk_size=2)
    with pytest.raises(Crash):
        build_corpus(BuildConfig(**cfg), DiesAfterOneChunk(encoder), show_progress=False)
    resumed = build_corpus(BuildConfig(**cfg), encoder, show_progress=False)
    _same_store(resumed, one)
    assert resumed.manifest["duplicates_dropped"] == len(TEXTS) - len(KEPT)


def test_keep_duplicates_is_a_build_setting(dup_file, tmp_path, encoder):
    out = tmp_path / "s"
    build_corpus(BuildConfig(input=str(dup_file), out=str(out), keep_duplicates=True), encoder, show_progress=False)
    with pytest.raises(ValueError, match="dedup"):
        build_corpus(BuildConfig(input=str(dup_file), out=str(out)), encoder, show_progress=False)


def test_flashrag_contents_field_and_errors(tmp_path, encoder):
    flash = write_jsonl(tmp_path / "flash.jsonl", [{"id": str(i), "contents": t} for i, t in enumerate(TEXTS[:4])])
    store = build_corpus(BuildConfig(input=str(flash), out=str(tmp_path / "f")), encoder, show_progress=False)
    assert [t for _, t in _ids_texts(store)] == [TEXTS[0], TEXTS[1], TEXTS[3]]
    assert store.manifest["input"]["text_field"] == "contents"
    both = write_jsonl(tmp_path / "both.jsonl", [{"id": "a", "text": "the text", "contents": "the contents"}])
    store = build_corpus(BuildConfig(input=str(both), out=str(tmp_path / "b")), encoder, show_progress=False)
    assert _ids_texts(store) == [("a", "the text")]
    other = write_jsonl(tmp_path / "other.jsonl", [{"id": "a", "body": "x"}])
    with pytest.raises(ValueError, match="no 'text' or 'contents' field.*--text-field"):
        build_corpus(BuildConfig(input=str(other), out=str(tmp_path / "o")), encoder, show_progress=False)
    store = build_corpus(BuildConfig(input=str(other), out=str(tmp_path / "o2"), text_field="body"), encoder,
                         show_progress=False)
    assert _ids_texts(store) == [("a", "x")]


def test_cli_on_the_real_openbookqa_facts(tmp_path, tiny_model, capsys, caplog):
    f = SHARED / "data" / "commonsense" / "obqa" / "obqa-train.jsonl"
    if not f.is_file():
        pytest.skip(f"OpenBookQA train file not found at {f} (set RCN_FAST_SHARED to the shared/ folder)")
    from rcn_fast.corpus.__main__ import main

    facts = [json.loads(line)["fact1"] for line in f.open(encoding="utf-8") if line.strip()]
    distinct = list(dict.fromkeys(facts))
    assert len(distinct) < len(facts)
    with caplog.at_level(logging.INFO, logger="rcn_fast.retrieval"):  # the CLI logs at INFO to stderr
        code = main(["build", "--input", str(f), "--text-field", "fact1", "--encoder", str(tiny_model),
                     "--out", str(tmp_path / "obqa"), "--no-progress", "--chunk-size", "2048"])
    err = capsys.readouterr().err
    assert code == 0, err
    store = CorpusStore.open(tmp_path / "obqa")
    assert len(store) == len(distinct)
    assert [t for _, t in _ids_texts(store)] == distinct
    assert f"dropped {len(facts) - len(distinct)} exact duplicate passage(s) of {len(facts)}" in caplog.text
    code = main(["build", "--input", str(f), "--text-field", "fact1", "--encoder", str(tiny_model),
                 "--out", str(tmp_path / "all"), "--no-progress", "--keep-duplicates", "--chunk-size", "2048"])
    assert code == 0 and len(CorpusStore.open(tmp_path / "all")) == len(facts)


def test_eval_corpus_takes_flashrag_files_and_text_field(tmp_path, tiny_model, capsys):
    from tests.pipelines.tiny import make_tiny_llama
    from tests.test_eval import _run_cli, write_questions

    llama = make_tiny_llama(tmp_path / "llama")
    q = write_questions(tmp_path / "mini.jsonl", n=2)
    for name, field, flag in (("flash", "contents", []), ("custom", "body", ["--text-field", "body"])):
        corpus = write_jsonl(tmp_path / f"{name}.jsonl",
                             [{"id": f"{name}-{i}", field: t} for i, t in enumerate(TEXTS)])
        out = tmp_path / f"out-{name}"
        code, err = _run_cli(["--tasks", str(q), "--pipelines", "single_retrieval", "--corpus", str(corpus),
                              *flag, "--model", str(llama), "--encoder", str(tiny_model), "--output-path", str(out),
                              "--no-progress", "--no-plot", "--log-samples",
                              "--pipeline-args", "top_n=5", "max_new_tokens=2"], capsys)
        assert code == 0, err
        samples = [json.loads(x) for p in out.glob("samples_*single_retrieval*.jsonl")
                   for x in p.read_text().splitlines()]
        assert samples
        for s in samples:
            texts = [p["text"] for p in s["passages"]]
            assert len(texts) == len(set(texts)) == len(KEPT)  # every distinct fact once, no copies
    code, err = _run_cli(["--tasks", str(q), "--pipelines", "single_retrieval", "--corpus", str(corpus),
                          "--model", str(llama), "--encoder", str(tiny_model), "--output-path", str(tmp_path / "o3"),
                          "--no-progress", "--no-plot"], capsys)
    assert code == 2 and "no 'text' or 'contents' field" in err and "--text-field" in err


def test_text_field_detected_in_tsv_and_parquet_headers(tmp_path):
    from rcn_fast.retrieval.conventions import detect_text_field

    tsv = tmp_path / "c.tsv"
    tsv.write_bytes(b"\xef\xbb\xbfid\tcontents\r\n1\tA magnet attracts iron.\r\n")
    assert detect_text_field(str(tsv), "tsv") == "contents"
    tsv.write_text("id\ttext\tcontents\n1\ta\tb\n")
    assert detect_text_field(str(tsv), "tsv") == "text"
    tsv.write_text("id\tbody\n1\ta\n")
    with pytest.raises(ValueError, match="no 'text' or 'contents' field"):
        detect_text_field(str(tsv), "tsv")
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"id": ["1"], "contents": ["x"]}), tmp_path / "c.parquet")
    assert detect_text_field(str(tmp_path / "c.parquet"), "parquet") == "contents"
