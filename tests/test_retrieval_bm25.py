"""BM25 (bm25s) over a hand-checked corpus, against a plain reference, saved
and reloaded, kept inside a corpus store; BM25 + cosine reranking."""

from __future__ import annotations

import json
import math
import re
from collections import Counter

import numpy as np
import pytest

pytest.importorskip("bm25s")

from rcn_fast.retrieval.bm25 import STORE_SUBDIR, BM25Index, BM25Reranker, main  # noqa: E402
from tests.pipelines.doubles import FACTS, HashEncoder  # noqa: E402


def reference_bm25(corpus: list[list[str]], query: list[str], k1: float = 1.5, b: float = 0.75) -> np.ndarray:
    """Lucene BM25 of every document, written out plainly."""
    N = len(corpus)
    avgdl = sum(len(d) for d in corpus) / N
    df = Counter(t for d in corpus for t in set(d))
    out = np.zeros(N)
    for i, d in enumerate(corpus):
        tf = Counter(d)
        for t in query:
            if tf[t]:
                idf = math.log(1 + (N - df[t] + 0.5) / (df[t] + 0.5))
                out[i] += idf * tf[t] / (tf[t] + k1 * (1 - b + b * len(d) / avgdl))
    return out


def toks(text: str) -> list[str]:
    import bm25s

    stop = set(bm25s.stopwords.STOPWORDS_EN)
    return [w for w in re.findall(r"(?u)\b\w\w+\b", text.lower()) if w not in stop]


SMALL = ["cat mat", "dog cat", "sun star"]


def test_hand_computed_score():
    # "sun": N=3, df=1 -> idf = ln(1 + 2.5/1.5) = 0.980829; |d| = avgdl = 2 -> tf = 1/(1 + 1.5) = 0.4
    idx = BM25Index(SMALL)
    scores, rows = idx.search(["sun"], k=3)
    assert rows[0].tolist() == [2, -1, -1]
    assert scores[0, 0] == pytest.approx(math.log(1 + 2.5 / 1.5) * 0.4, rel=1e-6)
    assert np.isneginf(scores[0, 1:]).all()
    # "cat": df=2 -> idf = ln(1 + 1.5/2.5); d0 and d1 tie -> lower row first
    scores, rows = idx.search(["cat"], k=2)
    assert rows[0].tolist() == [0, 1]
    assert scores[0, 0] == scores[0, 1] == pytest.approx(math.log(1.6) * 0.4, rel=1e-6)


def test_against_reference_on_real_sentences():
    from tests.retrieval.tiny import real_sentences

    texts = real_sentences(80)
    idx = BM25Index(texts)
    corpus = [toks(t) for t in texts]
    queries = ["plants need sunlight to grow", "what attracts iron", "water freezes into ice when cold",
               "the heart pumps blood through the body", "zzzz qqqq"]
    scores, rows = idx.search(queries, k=10)
    assert scores.dtype == np.float32 and rows.dtype == np.int64 and rows.shape == (5, 10)
    for qi, q in enumerate(queries):
        ref = reference_bm25(corpus, toks(q))
        got = rows[qi][rows[qi] >= 0]
        n_pos = int((ref > 0).sum())
        assert len(got) == min(10, n_pos)
        if not len(got):
            continue
        np.testing.assert_allclose(scores[qi, : len(got)], ref[got], rtol=1e-5)
        # the returned set is the reference top set (ties at the threshold allowed)
        thresh = np.sort(ref)[::-1][len(got) - 1]
        assert (ref[got] >= thresh - 1e-6).all() and (np.diff(scores[qi, : len(got)]) <= 1e-7).all()


def test_passages_and_errors():
    idx = BM25Index(FACTS, ids=[f"f{i}" for i in range(len(FACTS))])
    res = idx.retrieve(["a magnet attracts iron"], k=3)
    assert res[0][0].text in ("a magnet attracts iron objects", "iron is attracted by a magnet")
    assert {p.id for p in res[0][:2]} == {"f1", "f22"}
    assert all(p.meta["bm25"] == p.score for p in res[0])
    assert idx.retrieve([], k=3) == [] and idx.search([], 3)[0].shape == (0, 3)
    with pytest.raises(ValueError, match="k:"):
        idx.search(["x"], 0)
    with pytest.raises(TypeError, match="queries:"):
        idx.search("a magnet", 3)
    with pytest.raises(ValueError, match="ids:"):
        BM25Index(["a", "b"], ids=["1"])
    with pytest.raises(ValueError, match="method:"):
        BM25Index(["a"], method="tfidf")
    empty = BM25Index([])
    assert empty.search(["magnet"], 2)[1].tolist() == [[-1, -1]]


def test_save_load_roundtrip(tmp_path):
    idx = BM25Index(FACTS, k1=1.2, b=0.7)
    queries = ["plants need light", "metal conducts heat", "nothing matches zzz"]
    before = idx.search(queries, 5)
    idx.save(tmp_path / "bm25")
    again = BM25Index.load(tmp_path / "bm25")
    after = again.search(queries, 5)
    np.testing.assert_array_equal(before[1], after[1])
    np.testing.assert_array_equal(before[0], after[0])
    assert again.settings() == idx.settings() and again.text(3) == FACTS[3]
    # saved without texts: they must be passed, and must match
    idx.save(tmp_path / "bare", with_texts=False)
    with pytest.raises(ValueError, match="texts:"):
        BM25Index.load(tmp_path / "bare")
    with pytest.raises(ValueError, match="differ"):
        BM25Index.load(tmp_path / "bare", [t.upper() for t in FACTS])
    np.testing.assert_array_equal(BM25Index.load(tmp_path / "bare", FACTS).search(queries, 5)[1], before[1])
    with pytest.raises(FileNotFoundError):
        BM25Index.load(tmp_path / "nothing")


class _FakeStemmer:
    """Stands in for PyStemmer (not installed here): strips a final "s"."""

    def __init__(self, lang):
        if lang != "english":
            raise KeyError(lang)

    def stemWord(self, w):
        return w[:-1] if len(w) > 3 and w.endswith("s") else w

    def stemWords(self, words):
        return [self.stemWord(w) for w in words]


@pytest.fixture
def fake_pystemmer(monkeypatch):
    import sys
    import types

    mod = types.ModuleType("Stemmer")
    mod.Stemmer = _FakeStemmer
    mod.algorithms = lambda: ["english"]
    monkeypatch.setitem(sys.modules, "Stemmer", mod)
    return mod


def test_stemmer_setting(fake_pystemmer, tmp_path):
    texts = ["magnets attract iron", "plants need light", "dogs bark loudly"]
    plain, stemmed = BM25Index(texts), BM25Index(texts, stemmer="english")
    # "magnet" matches "magnets" only when both are stemmed
    assert plain.search(["magnet"], 1)[1].tolist() == [[-1]]
    assert stemmed.search(["magnet"], 1)[1].tolist() == [[0]] and stemmed.search(["plant"], 1)[1].tolist() == [[1]]
    assert stemmed.settings()["stemmer"] == "english" and plain.settings()["stemmer"] is None
    assert "stemmer='english'" in repr(stemmed)
    stemmed.save(tmp_path / "s")  # the stemmer is part of the saved settings; queries are stemmed after load
    again = BM25Index.load(tmp_path / "s")
    assert again.settings() == stemmed.settings() and again.search(["magnet"], 1)[1].tolist() == [[0]]
    with pytest.raises(ValueError, match="stemmer: PyStemmer has no 'klingon'"):
        BM25Index(texts, stemmer="klingon")
    with pytest.raises(TypeError, match="stemmer:"):
        BM25Index(texts, stemmer=3)


def test_real_porter_stemmer(tmp_path):
    """The paper's Pyserini-style setting with the real PyStemmer (in the
    [rr], [eval] and [dev] extras): inflections meet only when stemmed."""
    pytest.importorskip("Stemmer", reason="PyStemmer is not installed (pip install PyStemmer)")
    texts = ["a river flows into the ocean", "running water erodes rocks slowly", "birds migrate south"]
    plain = BM25Index(texts, k1=0.9, b=0.4)
    stemmed = BM25Index(texts, k1=0.9, b=0.4, stemmer="porter")
    assert plain.search(["runs erode"], 1)[1].tolist() == [[-1]]
    assert stemmed.search(["runs erode"], 1)[1].tolist() == [[1]]
    assert stemmed.search(["migrating bird"], 1)[1].tolist() == [[2]]
    stemmed.save(tmp_path / "porter")
    again = BM25Index.load(tmp_path / "porter")
    assert again.settings()["stemmer"] == "porter" and again.search(["runs erode"], 1)[1].tolist() == [[1]]


def test_stemmer_needs_pystemmer(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "Stemmer", None)  # import fails
    with pytest.raises(ImportError, match="pip install PyStemmer"):
        BM25Index(["cats sit"], stemmer="english")
    BM25Index(["cats sit"])  # no stemming needs nothing


@pytest.fixture
def store(tmp_path):
    from rcn_fast.retrieval import BuildConfig, CorpusStore, build_corpus

    src = tmp_path / "facts.jsonl"
    src.write_text("".join(json.dumps({"id": f"fact-{i}", "text": t}) + "\n" for i, t in enumerate(FACTS)))
    build_corpus(BuildConfig(input=str(src), out=str(tmp_path / "store"), dtype="float32"), HashEncoder(),
                 show_progress=False)
    return CorpusStore.open(tmp_path / "store")


def test_index_kept_inside_a_store(store, monkeypatch, capsys):
    idx = BM25Index.for_store(store)
    saved = store.path / STORE_SUBDIR
    assert (saved / "rcn_fast_bm25.json").is_file() and not (saved / "passages.jsonl").exists()
    ref = idx.search(["magnet iron", "plants sunlight"], 4)
    assert idx.id(int(ref[1][0, 0])) in ("fact-1", "fact-22")
    # the second time it is loaded, not built
    built = []
    monkeypatch.setattr("bm25s.BM25.index", lambda *a, **k: built.append(1))
    again = BM25Index.for_store(store.path)
    assert not built
    np.testing.assert_array_equal(again.search(["magnet iron", "plants sunlight"], 4)[1], ref[1])
    # other settings -> rebuilt (index() is called)
    BM25Index.for_store(store, k1=0.9, save=False)
    assert built
    monkeypatch.undo()
    # the saved settings are the index's key: each change rebuilds and is recorded
    manifest = saved / "rcn_fast_bm25.json"
    assert json.loads(manifest.read_text())["settings"] == {"k1": 1.5, "b": 0.75, "method": "lucene",
                                                            "stopwords": "english", "stemmer": None}
    paper = BM25Index.for_store(store, k1=0.9, b=0.4)
    assert json.loads(manifest.read_text())["settings"]["k1"] == 0.9 and paper.settings()["b"] == 0.4
    built.clear()
    monkeypatch.setattr("bm25s.BM25.index", lambda *a, **k: built.append(1))
    assert BM25Index.for_store(store, k1=0.9, b=0.4).settings() == paper.settings() and not built
    BM25Index.for_store(store, k1=0.9, b=0.4, method="bm25+", save=False)
    assert built
    monkeypatch.undo()
    with pytest.raises(TypeError, match="unknown BM25 setting"):
        BM25Index.for_store(store, k=3)
    store.verify()  # the extra folder does not disturb the store's checksums
    assert main([str(store.path)]) == 0
    assert json.loads(capsys.readouterr().out)["count"] == len(FACTS)


def test_reranker_picks_the_best_cosine_among_candidates(store):
    from rcn_fast.pipelines import InMemoryRetriever
    from rcn_fast.retrieval import Retriever

    enc = HashEncoder()
    for retr in (InMemoryRetriever(enc, FACTS, ids=[f"fact-{i}" for i in range(len(FACTS))]),
                 Retriever(enc, store)):
        rr = BM25Reranker.from_retriever(retr, candidates=10)
        assert rr.passage_emb is not None
        queries = ["plants need sunlight and water", "ice melts into water when heated", "qqq zzz"]
        found, cands = rr.retrieve_with_candidates(queries, k=2)
        assert rr.bm25_calls == 1 and found[2] == [] and cands[2] == []
        for q, res, cand in zip(queries[:2], found, cands):
            assert 1 <= len(cand) <= 10
            texts = [FACTS[int(c.split("-")[1])] for c in cand]
            cos = HashEncoder().encode_passages(texts) @ HashEncoder().encode_queries([q])[0]
            best = np.argsort(-cos, kind="stable")[:2]
            assert [p.id for p in res] == [cand[i] for i in best]
            assert res[0].score == pytest.approx(float(cos[best[0]]), abs=1e-5)
            assert res[0].meta["bm25_rank"] == int(best[0]) and res[0].meta["cosine"] == res[0].score
    # without stored embeddings the candidates are encoded: one extra encoder call
    rr = BM25Reranker(BM25Index(FACTS), enc, candidates=5)
    rr.retrieve(["plants need sunlight"], k=1)
    assert rr.encoder_calls == 2
    with pytest.raises(TypeError, match="retriever:"):
        BM25Reranker.from_retriever(object())
    with pytest.raises(ValueError, match="passage_embeddings:"):
        BM25Reranker(BM25Index(FACTS), enc, passage_embeddings=np.zeros((3, 64)))


@pytest.mark.parametrize("content, message", [
    (b"{not json", r"rcn_fast_bm25\.json is not valid JSON"),
    (b"[]", r"rcn_fast_bm25\.json holds a JSON list, expected an object"),
    (b'{"format": "other/1"}', r"holds format 'other/1', expected"),
])
def test_a_damaged_manifest_is_one_message_naming_it(tmp_path, content, message):
    BM25Index(FACTS).save(tmp_path / "bm25")
    (tmp_path / "bm25" / "rcn_fast_bm25.json").write_bytes(content)
    with pytest.raises(ValueError, match=message):
        BM25Index.load(tmp_path / "bm25")
    with pytest.raises(FileNotFoundError, match="so it is not a saved BM25 index"):
        BM25Index.load(tmp_path / "nothing")
