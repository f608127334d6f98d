"""Retrieval as a package of leaves (issue 28, item 4): every retrieval
Protocol defined in one module, the retriever searching the index it is
handed (FlatIndex and FaissIndex give the same rows and scores), and the
store layout pinned byte for byte."""

from __future__ import annotations

import ast
import hashlib
import json
import re
from pathlib import Path

import numpy as np
import pytest

from rcn_fast.retrieval import BuildConfig, CorpusStore, Retriever, build_corpus

ROOT = Path(__file__).resolve().parents[1]


class RngEncoder:
    """A deterministic stand-in encoder: a Gaussian vector seeded by the
    text's blake2b hash (13-d, not normalised: odd sizes, no ties)."""

    dim = 13

    def describe(self) -> dict:
        return {"model": "rng-encoder", "fingerprint": "0" * 16, "pooling": "mean", "normalize": False,
                "query_prefix": "", "passage_prefix": "", "dim": self.dim, "model_dir": None}

    def _enc(self, texts) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dim), np.float32)
        seeds = [int.from_bytes(hashlib.blake2b(t.encode(), digest_size=8).digest(), "little") for t in texts]
        return np.stack([np.random.default_rng(s).standard_normal(self.dim) for s in seeds]).astype(np.float32)

    def encode_passages(self, texts, batch_size=None) -> np.ndarray:
        return self._enc(texts)

    def encode_queries(self, texts, batch_size=None) -> np.ndarray:
        return self._enc(texts)


RECORDS = [{"id": f"p{i}", "text": f"passage {i % 31} about topic {i * 7 % 11}"} for i in range(37)]


def build(tmp: Path, dtype: str = "float16") -> Path:
    (tmp / "c.jsonl").write_text("".join(json.dumps(r) + "\n" for r in RECORDS))
    build_corpus(BuildConfig(input=str(tmp / "c.jsonl"), out=str(tmp / "s"), chunk_size=8, dtype=dtype),
                 RngEncoder(), show_progress=False)
    return tmp / "s"


# ------------------------------------------------------------------ protocols
def _protocol_classes() -> dict[str, list[str]]:
    """File -> classes deriving from ``Protocol``, over rcn_fast/retrieval/
    and the pipelines' retriever module."""
    files = sorted((ROOT / "rcn_fast" / "retrieval").rglob("*.py")) + [ROOT / "rcn_fast/pipelines/knowledge.py"]
    out: dict[str, list[str]] = {}
    for f in files:
        for node in ast.walk(ast.parse(f.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef) and any(
                    (isinstance(b, ast.Name) and b.id == "Protocol")
                    or (isinstance(b, ast.Attribute) and b.attr == "Protocol") for b in node.bases):
                out.setdefault(f.relative_to(ROOT).as_posix(), []).append(node.name)
    return out


def test_every_retrieval_protocol_is_defined_in_protocols_module():
    from rcn_fast import pipelines, retrieval
    from rcn_fast.retrieval import protocols

    found = _protocol_classes()
    assert list(found) == ["rcn_fast/retrieval/protocols.py"], found
    names = {"EmbeddingRetriever", "EncoderLike", "PassageStore", "RetrieverLike", "VectorIndex"}
    assert set(found["rcn_fast/retrieval/protocols.py"]) == names
    for n in names:  # the public paths name the same class
        assert getattr(retrieval, n) is getattr(protocols, n)
    assert pipelines.EmbeddingRetriever is protocols.EmbeddingRetriever
    assert isinstance(RngEncoder(), protocols.EncoderLike)


def test_protocols_match_the_leaves(tmp_path):
    from rcn_fast.retrieval.index import FaissIndex, FlatIndex
    from rcn_fast.retrieval.memory import InMemoryRetriever
    from rcn_fast.retrieval.protocols import EmbeddingRetriever, PassageStore, RetrieverLike, VectorIndex

    store = CorpusStore.open(build(tmp_path))
    assert isinstance(store, PassageStore) and isinstance(store.index(), VectorIndex)
    assert isinstance(FlatIndex(4), VectorIndex)
    assert issubclass(FaissIndex, VectorIndex)
    r = Retriever(RngEncoder(), store)
    assert isinstance(r, RetrieverLike)
    mem = InMemoryRetriever(RngEncoder(), [r["text"] for r in RECORDS])
    assert isinstance(mem, RetrieverLike) and isinstance(mem, EmbeddingRetriever)


# ---------------------------------------------------------------------- index
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_retriever_searches_the_index_it_is_handed(tmp_path, dtype):
    """FlatIndex and FaissIndex (exact Flat, and IVF visiting every list)
    passed in give the same rows and scores over the same store, for k
    below, at and above the 37 rows. Over a float16 store FlatIndex rounds
    the queries to float16 as the rows are (FlatIndex.search) and faiss
    does not: the scores then agree to float16's precision, the rows
    exactly."""
    pytest.importorskip("faiss")
    from rcn_fast.retrieval.index import FaissIndex, FlatIndex

    store = CorpusStore.open(build(tmp_path, dtype))
    flat = FlatIndex.load(store.path)
    fr = Retriever(RngEncoder(), store, flat)
    assert fr.index is flat and fr.backend == "native" and fr.index_path is None
    q = RngEncoder().encode_queries([f"query {i}" for i in range(5)])
    emb = np.asarray(store.embeddings, np.float64)
    tol = 1e-5 if dtype == "float32" else 1e-2  # float16 rounding of q: 2**-11 * |q| * |x| (|.| ~ 3.6)
    for index in (FaissIndex.build(store, "Flat"),
                  FaissIndex.build(store, "IVF3,Flat", nprobe=3, train_size=37, index_dir=tmp_path / "faiss")):
        xr = Retriever(RngEncoder(), store, index)
        assert xr.index is index and xr.backend == "faiss"
        for k in (1, 7, 37, 50):
            s_flat, r_flat = fr.search(q, k)
            s_x, r_x = xr.search(q, k)
            assert s_x.dtype == np.float32 and r_x.dtype == np.int64 and s_x.shape == r_x.shape == (5, k)
            np.testing.assert_array_equal(r_x, r_flat)
            np.testing.assert_allclose(s_x, s_flat, rtol=tol, atol=tol)
            valid = r_flat >= 0
            assert valid.sum(1).tolist() == [min(k, 37)] * 5 and np.isneginf(s_flat[~valid]).all()
            ref = np.take_along_axis(q.astype(np.float64) @ emb.T, np.where(valid, r_flat, 0), 1)
            np.testing.assert_allclose(s_x[valid], ref[valid], rtol=1e-5, atol=1e-5)
        a = fr.retrieve([f"query {i}" for i in range(3)], k=9)
        b = xr.retrieve([f"query {i}" for i in range(3)], k=9)
        assert [[(p.id, p.meta["row"]) for p in x] for x in a] == [[(p.id, p.meta["row"]) for p in x] for x in b]


def test_retriever_refuses_an_index_of_another_store(tmp_path):
    from rcn_fast.retrieval.index import FlatIndex

    store = CorpusStore.open(build(tmp_path))
    with pytest.raises(TypeError, match="index"):
        Retriever(RngEncoder(), store, np.zeros((37, 13), np.float32))
    other = FlatIndex(13)
    other.add(np.ones((5, 13), np.float32))
    with pytest.raises(ValueError, match="index: holds 5 rows"):
        Retriever(RngEncoder(), store, other)


# ---------------------------------------------------------------------- store
#: sha256 of manifest.json (``built_at`` set to "X") and of every store file, as
#: rcn_fast wrote them before the store writer moved beside its reader.
PINNED_MANIFEST = "f58e2c50b44911dc434376df718d2882e8c588f26175e1d4f1aac1d923520ab1"
PINNED_FILES = {
    "embeddings.npy": "cd3728ad65d0c268d1b572ea55287e4c66dbd69f5c2a734b6ef0c97f0172f0f7",
    "id_offsets.npy": "dbdb405d93a64a480fcae3bc3d3f33b14076319f9a222af1cbe8a468e5683c79",
    "id_table.npy": "0e3353277293543d1ce903d2669f3a7d69a9eab1af42198c6405dc9a9bc6c0e9",
    "ids.bin": "74ec84b41244f207742716c59e0842775060a5333920f48edc8889ef52679673",
    "index.json": "0a8dde9fa919279eca23108286748fe9be158d34288636526d92019ecdf463aa",
    "text_offsets.npy": "7e70a75e6772992698615a4be017004f27be4dee22a2dbd98a6d339b7ac8047d",
    "texts.bin": "96ee489b154207d61a1406b679bf06d9957f7402929c7d48df35955346ef4bfa",
}


def test_store_layout_is_pinned_byte_for_byte(tmp_path):
    out = build(tmp_path)
    manifest = re.sub(r'"built_at": "[^"]*"', '"built_at": "X"', (out / "manifest.json").read_text())
    assert hashlib.sha256(manifest.encode()).hexdigest() == PINNED_MANIFEST, manifest
    got = {f.name: hashlib.sha256(f.read_bytes()).hexdigest() for f in out.iterdir()
           if f.is_file() and f.name != "manifest.json"}
    assert got == PINNED_FILES
    store = CorpusStore.open(out, verify=True)
    assert [store.text(r) for r in range(len(store))] == [r["text"] for r in RECORDS]
    assert store.row_of("p36") == 36


def test_store_writer_and_reader_live_in_one_module():
    """Only rcn_fast/retrieval/store.py names the store's data files."""
    from rcn_fast.retrieval import store

    assert callable(store.write_store) and callable(store.write_chunk)
    writers = [f.relative_to(ROOT).as_posix() for f in sorted((ROOT / "rcn_fast").rglob("*.py"))
               if '"text_offsets.npy"' in f.read_text(encoding="utf-8")]
    assert writers == ["rcn_fast/retrieval/store.py"]


# -------------------------------------------------------------------- imports
def test_no_import_circle_under_retrieval_at_any_level():
    """No module under rcn_fast/retrieval/ reaches itself back through
    imports, function-level ones included (the ONNX encoder and the base
    encoder imported each other before)."""
    from tests.test_architecture import all_imports, module_name

    modules, found = all_imports()
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for imp in found:
        if imp.target in modules:
            graph[module_name(ROOT / imp.file)].add(imp.target)

    def reaches(a: str, b: str) -> bool:
        seen, todo = set(), [a]
        while todo:
            x = todo.pop()
            if x == b:
                return True
            if x not in seen:
                seen.add(x)
                todo += graph[x]
        return False

    circles = [(m, t) for m in sorted(modules) if m.startswith("rcn_fast.retrieval")
               for t in sorted(graph[m]) if t.startswith("rcn_fast.retrieval") and reaches(t, m)]
    assert not circles
