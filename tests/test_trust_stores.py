"""Issue 34 item 5: damaged stores never give silent results. Every
``Retriever.load`` / store open runs cheap checks -- offsets that start at
0, never decrease and end at their file's size, an id table holding each
row once, embeddings of the manifest's dtype -- and refuses NaN or infinite
embedding rows, naming them (a scan remembered per version of the file,
so an unchanged store is not read again). A build refuses non-finite
embeddings (a float16 overflow too), naming the passages. Tiny
random-weight encoder built in code."""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from rcn_fast.retrieval import BuildConfig, CorpusStore, Encoder, Retriever, build_corpus  # noqa: E402
from tests.retrieval.fixtures import corpus_records, one_torch_thread, tiny_model, write_jsonl  # noqa: E402,F401


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    """The scan memo in this test's own cache folder."""
    monkeypatch.setenv("RCN_FAST_CACHE", str(tmp_path / "cache"))
    import rcn_fast._hashing as h

    monkeypatch.setattr(h, "_PASSED", set())


@pytest.fixture(scope="module")
def encoder(tiny_model):
    return Encoder.from_pretrained(tiny_model)


@pytest.fixture(scope="module")
def store_dir(tmp_path_factory, corpus_records, encoder):
    src = write_jsonl(tmp_path_factory.mktemp("in") / "c.jsonl", corpus_records)
    out = tmp_path_factory.mktemp("store") / "s"
    build_corpus(BuildConfig(input=str(src), out=str(out), chunk_size=64), encoder, show_progress=False)
    return out


def _copy(store_dir, tmp_path, name="damaged"):
    return shutil.copytree(store_dir, tmp_path / name)


def _edit_npy(path, fn):
    arr = np.load(path, mmap_mode="r+")
    fn(arr)
    arr.flush()
    del arr


# ------------------------------------------------------------------ embeddings
@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf])
def test_non_finite_embedding_rows_are_refused_naming_them(store_dir, encoder, tmp_path, value):
    d = _copy(store_dir, tmp_path)
    _edit_npy(d / "embeddings.npy", lambda a: a.__setitem__((np.array([3, 17]), 0), value))
    for load in (lambda: Retriever.load(d, encoder=encoder), lambda: CorpusStore.open(d),
                 lambda: Retriever.load(d, encoder=encoder, backend="faiss")):
        with pytest.raises(ValueError, match=rf"{d / 'embeddings.npy'} holds NaN or infinite values in rows "
                                             rf"\[3, 17\] \(2 of \d+\)"):
            load()


def test_the_flat_index_of_a_directory_is_checked_too(store_dir, tmp_path):
    from rcn_fast import FlatIndex

    d = _copy(store_dir, tmp_path)
    _edit_npy(d / "embeddings.npy", lambda a: a.__setitem__((5, 2), np.nan))
    with pytest.raises(ValueError, match=r"in rows \[5\]"):
        FlatIndex.load(d)


def test_an_unchanged_store_is_scanned_once(store_dir, encoder, tmp_path, monkeypatch):
    import rcn_fast._arrays as A
    import rcn_fast._hashing as h

    monkeypatch.setattr(h, "RACY_SECONDS", 0.0)
    d = _copy(store_dir, tmp_path)
    scans = []
    real = A.nonfinite_rows
    monkeypatch.setattr(A, "nonfinite_rows", lambda x, *a, **k: scans.append(x.shape) or real(x, *a, **k))
    Retriever.load(d, encoder=encoder)
    assert len(scans) == 1  # the store's open; the index over the same file is not scanned again
    monkeypatch.setattr(h, "_PASSED", set())  # a new process: the memo answers
    Retriever.load(d, encoder=encoder)
    assert len(scans) == 1
    _edit_npy(d / "embeddings.npy", lambda a: a.__setitem__((0, 0), a[0, 0]))  # rewritten in place: scanned again
    Retriever.load(d, encoder=encoder)
    assert len(scans) == 2


def test_the_offsets_and_id_table_of_an_unchanged_store_are_scanned_once(store_dir, tmp_path, monkeypatch):
    """Like the embeddings: each whole-file scan runs once per version of its file."""
    import rcn_fast._hashing as h
    import rcn_fast.retrieval.store as store

    monkeypatch.setattr(h, "RACY_SECONDS", 0.0)
    d = _copy(store_dir, tmp_path)
    scans = []
    for name in ("_check_nondecreasing", "_check_id_table"):
        real = getattr(store, name)
        monkeypatch.setattr(store, name, lambda a, *rest, real=real, name=name: scans.append(name) or real(a, *rest))
    CorpusStore.open(d)
    assert sorted(scans) == ["_check_id_table", "_check_nondecreasing", "_check_nondecreasing"]
    CorpusStore.open(d)
    monkeypatch.setattr(h, "_PASSED", set())  # a new process: the memo answers
    CorpusStore.open(d)
    assert len(scans) == 3
    _edit_npy(d / "id_table.npy", lambda a: a.__setitem__(0, a[0]))  # rewritten in place: scanned again
    CorpusStore.open(d)
    assert scans[3:] == ["_check_id_table"]


def test_a_build_opens_its_store_without_scanning_what_it_checked(corpus_records, encoder, tmp_path, monkeypatch):
    """The join checks every stored row and builds the id table: the store it returns is not scanned
    again for those (a later open is)."""
    import rcn_fast.retrieval.store as store
    import rcn_fast.search.flat_index as fi

    scans = []
    real_rows, real_table = fi.check_finite_rows, store._check_id_table
    monkeypatch.setattr(fi, "check_finite_rows", lambda *a, **k: scans.append("rows") or real_rows(*a, **k))
    monkeypatch.setattr(store, "_check_id_table", lambda *a: scans.append("table") or real_table(*a))
    src = write_jsonl(tmp_path / "c.jsonl", corpus_records[:20])
    built = build_corpus(BuildConfig(input=str(src), out=str(tmp_path / "s")), encoder, show_progress=False)
    assert scans == [] and len(built) == 20
    CorpusStore.open(tmp_path / "s")
    assert scans == ["table", "rows"]


# ------------------------------------------------------------------ offsets and the id table
@pytest.mark.parametrize("name, edit, why", [
    ("text_offsets.npy", lambda a: a.__setitem__(5, 0), r"entries \[5\] are smaller than the entries before them"),
    ("text_offsets.npy", lambda a: a.__setitem__(-1, a[-1] + 100),
     r"it runs from 0 to \d+, not 0 to \d+ \(the size of texts.bin\)"),
    ("text_offsets.npy", lambda a: a.__setitem__(0, 3), r"it runs from 3 to"),
    ("id_offsets.npy", lambda a: a.__setitem__(7, 10 ** 9), r"entries \[8\] are smaller"),
])
def test_damaged_offsets_are_refused_naming_the_file(store_dir, encoder, tmp_path, name, edit, why):
    d = _copy(store_dir, tmp_path)
    before = Retriever.load(d, encoder=encoder).store.text(5)
    assert before
    _edit_npy(d / name, edit)
    with pytest.raises(ValueError, match=rf"{d / name} is damaged: {why}"):
        Retriever.load(d, encoder=encoder)


@pytest.mark.parametrize("edit, why", [
    (lambda a: a.__setitem__(np.flatnonzero(np.asarray(a) >= 0)[0], 10 ** 6), r"rows outside \[-1, \d+\)"),
    (lambda a: a.__setitem__(np.flatnonzero(np.asarray(a) >= 0)[0], -1), r"holds \d+ rows, not each of the"),
    (lambda a: a.__setitem__(np.flatnonzero(np.asarray(a) < 0)[0], a[np.flatnonzero(np.asarray(a) >= 0)[0]]),
     r"holds \d+ rows, not each of the"),
])
def test_a_damaged_id_table_is_refused(store_dir, encoder, tmp_path, edit, why):
    d = _copy(store_dir, tmp_path)
    _edit_npy(d / "id_table.npy", edit)
    with pytest.raises(ValueError, match=rf"id_table.npy .*{why}"):
        CorpusStore.open(d)


def test_embeddings_of_another_dtype_are_refused(store_dir, tmp_path):
    d = _copy(store_dir, tmp_path)
    m = json.loads((d / "manifest.json").read_text())
    emb = np.load(d / "embeddings.npy")
    np.save(d / "embeddings.npy", emb.view(np.int16))  # same bytes, another dtype
    m["files"]["embeddings.npy"]["bytes"] = (d / "embeddings.npy").stat().st_size
    (d / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(ValueError, match=r"embeddings.npy holds int16, the manifest says float16"):
        CorpusStore.open(d)


def test_a_sound_store_loads_and_retrieves_every_row(store_dir, encoder):
    r = Retriever.load(store_dir, encoder=encoder)
    n = len(r.store)
    assert len(r.retrieve(["plants"], k=n)[0]) == n


# ------------------------------------------------------------------ build time
class Broken:
    """The tiny encoder, with passages that contain ``marker`` embedded as ``value``."""

    def __init__(self, enc, marker: str, value: float) -> None:
        self.enc, self.marker, self.value = enc, marker, value

    def __getattr__(self, name):
        if name in ("prepare_passages", "run"):  # the build then calls encode_passages (its plain-encoder path)
            raise AttributeError(name)
        return getattr(self.enc, name)

    def encode_passages(self, texts, **kw):
        out = np.array(self.enc.encode_passages(texts, **kw), dtype=np.float32)
        for i, t in enumerate(texts):
            if self.marker in t:
                out[i, 0] = self.value
        return out


@pytest.mark.parametrize("value, dtype", [(np.nan, "float16"), (np.inf, "float32"), (1e6, "float16")])
def test_a_build_refuses_non_finite_embeddings_naming_the_passages(corpus_records, encoder, tmp_path, value, dtype):
    recs = [dict(r) for r in corpus_records[:20]]
    recs[7]["text"] += " BROKEN"
    src = write_jsonl(tmp_path / "c.jsonl", recs)
    out = tmp_path / "s"
    with pytest.raises(ValueError, match=rf"NaN or infinite embeddings \(in {dtype}\) in chunk 0, rows \[7\] .*"
                                         rf"passage ids \['{recs[7]['id']}'\]"):
        build_corpus(BuildConfig(input=str(src), out=str(out), dtype=dtype), Broken(encoder, "BROKEN", value),
                     show_progress=False)
    assert not (out / "manifest.json").exists()


def test_a_chunk_damaged_before_the_join_writes_no_store(corpus_records, encoder, tmp_path, monkeypatch):
    import rcn_fast.retrieval.store as store

    src = write_jsonl(tmp_path / "c.jsonl", corpus_records[:20])
    real = store.write_chunk

    def damaging(parts, c, ids, texts, emb, **kw):
        real(parts, c, ids, texts, emb, **kw)
        f = parts / store.chunk_name(c)
        with np.load(f) as z:
            data = {k: z[k] for k in z.files}
        data["emb"][2, 0] = np.nan
        np.savez(f, **data)

    import rcn_fast.retrieval.build as build

    monkeypatch.setattr(build, "write_chunk", damaging)
    with pytest.raises(ValueError, match=r"chunk-00000000.npz holds NaN or infinite embeddings in rows \[2\]"):
        build_corpus(BuildConfig(input=str(src), out=str(tmp_path / "s")), encoder, show_progress=False)
    assert not (tmp_path / "s" / "manifest.json").exists()


# ------------------------------------------------------------------ the scan against its reference
@pytest.mark.parametrize("dtype", ["float16", "float32", "float64", "bfloat16", "int32"])
@pytest.mark.parametrize("shape", [(1, 1), (7, 3), (3001, 33), (4, 0), (0, 5)])
def test_nonfinite_rows_matches_isfinite(dtype, shape):
    """The bit test of the scan against np.isfinite: odd sizes, every
    special value, blocks of a few rows, non-contiguous inputs."""
    from rcn_fast._arrays import nonfinite_rows

    if dtype == "bfloat16":
        ml = pytest.importorskip("ml_dtypes")
        dt = np.dtype(ml.bfloat16)
    else:
        dt = np.dtype(dtype)
    rng = np.random.default_rng(0)
    x = (rng.standard_normal(shape) * 100).astype(dt)
    if x.size and dt.kind == "f":
        specials = [np.nan, np.inf, -np.inf, float(np.finfo(dt).max), float(np.finfo(dt).tiny) / 4, -0.0]
        for v in specials:
            x[rng.integers(0, shape[0]), rng.integers(0, shape[1])] = v
    want = ~np.isfinite(x.astype(np.float64) if dtype == "bfloat16" else x).all(axis=1)
    for block in (1, 64, 1 << 20):
        assert (nonfinite_rows(x, block_bytes=block) == want).all()
    if shape[1] > 1:
        nc = x[:, ::2]
        want_nc = ~np.isfinite(nc.astype(np.float64) if dtype == "bfloat16" else nc).all(axis=1)
        assert (nonfinite_rows(nc) == want_nc).all()
