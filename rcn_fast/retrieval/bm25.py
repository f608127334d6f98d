"""BM25 over a passage corpus (the ``bm25s`` library), and BM25 + encoder
reranking (RR's per-sentence evidence retrieval).

* :class:`BM25Index` -- a BM25 index of a list of passages or of a corpus
  store; ``search(queries, k)`` / ``retrieve(queries, k)``, batch first;
  ``save(dir)`` / ``load(dir)``.
* :meth:`BM25Index.for_store` -- the index of a corpus store, built once and
  saved inside the store directory (``<store>/bm25/``), loaded from there
  afterwards (rebuilt when the store's texts changed).
* :class:`BM25Reranker` -- BM25 top ``candidates`` per query, reranked by the
  cosine of encoder embeddings (query vs passage), best ``k`` kept.

Command line (build and save the index of a store ahead of time)::

    python -m rcn_fast.retrieval.bm25 STORE_DIR [--rebuild]

Scoring follows ``bm25s`` with ``method="lucene"`` (the default):
``idf(t) = ln(1 + (N - df + 0.5) / (df + 0.5))`` and
``tf(t, d) = f / (f + k1 * (1 - b + b * |d| / avgdl))`` (``f``: count of
``t`` in ``d``); score = sum of ``idf * tf`` over the query's tokens.
Tokens: lower-cased ``\\b\\w\\w+\\b`` words (one-letter words are dropped)
minus English stop words; no stemming by default (``stemmer="english"``
stems with PyStemmer's Snowball stemmer, ``pip install PyStemmer``).
Passages that share no token with a query are never returned (results are
padded with score ``-inf`` and row ``-1``).

Defaults k1 = 1.5, b = 0.75 are ``bm25s``'s. Pyserini / Anserini (the BM25
of RR's paper, via DPR) use k1 = 0.9, b = 0.4 with Porter stemming; pass
``k1=0.9, b=0.4`` (and ``stemmer="porter"`` or ``"english"`` with
PyStemmer) to come close. The settings (``k1``, ``b``, ``method``,
``stopwords``, ``stemmer``) are recorded in a saved index's manifest;
:meth:`BM25Index.for_store` rebuilds the store's index when they differ.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from rcn_fast._arrays import require
from rcn_fast._files import check_links, is_file, open_read
from rcn_fast._stamped_json import read_stamped_json
from rcn_fast.retrieval.types import Passage
from rcn_fast._validate import check_k, check_texts, is_number

logger = logging.getLogger("rcn_fast.retrieval")

HINT = 'pip install "rcn_fast[rr]"  (bm25s)'
STEMMER_HINT = "pip install PyStemmer"
FORMAT = "rcn_fast.BM25Index/1"
MANIFEST = "rcn_fast_bm25.json"
PASSAGES = "passages.jsonl"
STORE_SUBDIR = "bm25"
METHODS = ("lucene", "robertson", "atire", "bm25l", "bm25+")


def _bm25s() -> Any:
    return require("bm25s", HINT)


def texts_digest(texts: Sequence[str]) -> str:
    """blake2b (hex) of the texts in order (identifies a list of passages)."""
    h = hashlib.blake2b(digest_size=16)
    for t in texts:
        b = t.encode("utf-8")
        h.update(len(b).to_bytes(8, "little"))
        h.update(b)
    return h.hexdigest()


def _stemmer(name: str | None) -> Any:
    """PyStemmer's stemmer for a Snowball language name (None: no stemming)."""
    if name is None:
        return None
    if not isinstance(name, str) or not name.strip():
        raise TypeError(f"stemmer: expected a Snowball language name (e.g. 'english') or None, got {name!r}")
    mod = require("Stemmer", f"{STEMMER_HINT}  (BM25 stemming, stemmer={name!r})")
    try:
        return mod.Stemmer(name)
    except KeyError:
        raise ValueError(f"stemmer: PyStemmer has no {name!r} stemmer; known: "
                         f"{sorted(mod.algorithms()) if hasattr(mod, 'algorithms') else '?'}") from None


class BM25Index:
    """BM25 over a fixed list of passages.

    Parameters
    ----------
    texts : sequence of str, or a corpus store
        The passages (row ``i`` is ``texts[i]``); a
        :class:`rcn_fast.retrieval.CorpusStore` is read row by row once to
        build the index and afterwards only for the rows returned.
    ids : sequence of str, optional
        Passage ids (default: the store's ids, else ``"0"``, ``"1"``, ...).
    k1, b : float
        BM25 parameters (defaults 1.5 and 0.75).
    method : {"lucene", "robertson", "atire", "bm25l", "bm25+"}
        The ``bm25s`` variant (default ``"lucene"``, Pyserini's formula).
    stopwords : str or list of str or None
        Stop words dropped from passages and queries (default ``"english"``).
    stemmer : str or None
        Snowball language of PyStemmer's stemmer applied to passages and
        queries (e.g. ``"english"``, ``"porter"``); None (default): no
        stemming.

    Examples
    --------
    >>> idx = BM25Index(["plants need sunlight", "ice is cold"])       # doctest: +SKIP
    >>> idx.retrieve(["why do plants need light?"], k=1)[0][0].text    # doctest: +SKIP
    'plants need sunlight'
    """

    def __init__(self, texts: Any, ids: Sequence[str] | None = None, *, k1: float = 1.5, b: float = 0.75,
                 method: str = "lucene", stopwords: str | list[str] | None = "english", stemmer: str | None = None,
                 _model: Any = None, _digest: str | None = None) -> None:
        if isinstance(texts, str):
            raise TypeError("texts: expected a sequence of str or a corpus store, got a single str")
        if method not in METHODS:
            raise ValueError(f"method: expected one of {list(METHODS)}, got {method!r}")
        for name, v in (("k1", k1), ("b", b)):
            if not is_number(v) or v < 0:
                raise ValueError(f"{name}: expected a number >= 0, got {v!r}")
        self.k1, self.b, self.method, self.stopwords = float(k1), float(b), method, stopwords
        self.stemmer = stemmer
        self._stem = _stemmer(stemmer)
        self.store = texts if hasattr(texts, "text") and hasattr(texts, "manifest") else None
        if self.store is not None:
            self._texts: list[str] | None = None
            n = len(self.store)
            self.ids = None if ids is None else [str(i) for i in ids]
        else:
            self._texts = [str(t) for t in texts]
            n = len(self._texts)
            self.ids = [str(i) for i in range(n)] if ids is None else [str(i) for i in ids]
        if self.ids is not None and len(self.ids) != n:
            raise ValueError(f"ids: expected {n} ids (one per passage), got {len(self.ids)}")
        self.count = n
        if _model is not None:
            self.model, self.digest = _model, _digest
            return
        bm25s = _bm25s()
        all_texts = self._texts if self._texts is not None else [self.store.text(r) for r in range(n)]
        self.digest = texts_digest(all_texts)
        self.model = bm25s.BM25(k1=self.k1, b=self.b, method=method)
        if n:
            tokens = bm25s.tokenize(all_texts, stopwords=stopwords, stemmer=self._stem, show_progress=False)
            self.model.index(tokens, show_progress=False)

    # ---------------------------------------------------------------- access
    def __len__(self) -> int:
        return self.count

    def text(self, row: int) -> str:
        return self._texts[row] if self._texts is not None else self.store.text(row)

    def id(self, row: int) -> str:
        return self.ids[row] if self.ids is not None else self.store.id(row)

    def settings(self) -> dict[str, Any]:
        return {"k1": self.k1, "b": self.b, "method": self.method, "stopwords": self.stopwords,
                "stemmer": self.stemmer}

    # ---------------------------------------------------------------- search
    def tokenize_queries(self, queries: Sequence[str]) -> list[list[str]]:
        """The query tokens BM25 scores (same rules as the passages)."""
        bm25s = _bm25s()
        return bm25s.tokenize(list(queries), stopwords=self.stopwords, stemmer=self._stem, return_ids=False,
                              show_progress=False)

    def search(self, queries: Sequence[str], k: int) -> tuple[np.ndarray, np.ndarray]:
        """Top-``k`` BM25 scores of every query, in one ``bm25s`` call.

        Parameters
        ----------
        queries : sequence of str, length Q
        k : int

        Returns
        -------
        scores : float32 [Q, k], descending (equal scores among the
            returned: lower row first)
        rows : int64 [Q, k]
            Passage rows; ``-1`` (score ``-inf``) where fewer than ``k``
            passages share a token with the query. ``bm25s`` is asked for
            at most as many passages as the index holds; the columns beyond
            are padding (MemoryError naming ``k`` when the [Q, k] results
            cannot be allocated).
        """
        from rcn_fast.search.topn import check_result_memory

        queries = check_texts(queries, "queries")
        k = check_k(k)
        Q = len(queries)
        check_result_memory(Q, self.count, k)
        scores = np.full((Q, k), -np.inf, np.float32)
        rows = np.full((Q, k), -1, np.int64)
        if not Q or not self.count:
            return scores, rows
        toks = self.tokenize_queries(queries)
        vocab = self.model.vocab_dict
        live = [i for i, t in enumerate(toks) if any(w in vocab and w != "" for w in t)]
        if not live:
            return scores, rows
        kk = min(k, self.count)
        docs, sc = self.model.retrieve([toks[i] for i in live], k=kk, show_progress=False, n_threads=1)
        docs = np.asarray(docs, dtype=np.int64)
        sc = np.asarray(sc, dtype=np.float32)
        for j, i in enumerate(live):
            # stable order: score descending, then row ascending; drop zero-overlap passages
            keep = sc[j] > 0
            d, s = docs[j][keep], sc[j][keep]
            order = np.lexsort((d, -s))
            d, s = d[order], s[order]
            rows[i, : len(d)] = d
            scores[i, : len(d)] = s
        return scores, rows

    def retrieve(self, queries: Sequence[str], k: int = 10) -> list[list[Passage]]:
        """Top-``k`` passages per query (``Passage.score`` = BM25 score,
        ``meta = {"row": r, "bm25": score}``); at most ``len(self)`` per
        query, so a huge ``k`` allocates nothing beyond the corpus."""
        scores, rows = self.search(queries, max(1, min(check_k(k), self.count)))
        out = []
        for s_row, r_row in zip(scores, rows):
            out.append([Passage(id=self.id(int(r)), text=self.text(int(r)), score=float(s),
                                meta={"row": int(r), "bm25": float(s)})
                        for s, r in zip(s_row.tolist(), r_row.tolist()) if r >= 0])
        return out

    # ------------------------------------------------------------- save/load
    def save(self, path: str | os.PathLike[str], *, with_texts: bool | None = None) -> Path:
        """Write the index to a directory (atomically: a temporary
        directory renamed into place).

        Parameters
        ----------
        path : directory (created; replaced when it holds an older index)
        with_texts : bool, optional
            Also write the passages (``passages.jsonl``: id and text per
            line) so :meth:`load` needs nothing else. Default: True unless
            the index is over a corpus store (whose texts stay in the store).
        """
        path = Path(path)
        if with_texts is None:
            with_texts = self.store is None
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
        try:
            if self.count:
                self.model.save(str(tmp), show_progress=False)
            if with_texts:
                with open(tmp / PASSAGES, "w", encoding="utf-8") as f:
                    for r in range(self.count):
                        f.write(json.dumps({"id": self.id(r), "text": self.text(r)}, ensure_ascii=False) + "\n")
            manifest = {"format": FORMAT, "count": self.count, "digest": self.digest, "settings": self.settings(),
                        "texts": PASSAGES if with_texts else None,
                        "store_texts_sha256": _store_texts_sha(self.store) if self.store is not None else None}
            (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
            if path.exists():
                shutil.rmtree(path)
            os.replace(tmp, path)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        return path

    @classmethod
    def load(cls, path: str | os.PathLike[str], texts: Any = None, ids: Sequence[str] | None = None,
             *, mmap: bool = False) -> "BM25Index":
        """Read an index written by :meth:`save`.

        Parameters
        ----------
        path : directory
        texts : sequence of str or corpus store, optional
            The passages, when the index was saved without them (required
            then); checked against the recorded count and digest.
        ids : sequence of str, optional
        mmap : bool
            Memory-map the index arrays.
        """
        path = Path(path)
        if not is_file(path, MANIFEST):  # through the files door: a symbolic link out of the folder is refused
            raise FileNotFoundError(f"path: {path} has no {MANIFEST}, so it is not a saved BM25 index")
        m = read_stamped_json(path / MANIFEST, FORMAT, what="a saved BM25 index")
        check_links(path)  # bm25s reads the folder's arrays itself, by name
        if texts is None:
            if not m.get("texts"):
                raise ValueError(f"texts: the index at {path} was saved without its passages; "
                                 "pass texts= (or the store)")
            texts_l, ids_l = [], []
            with io.TextIOWrapper(open_read(path, str(m["texts"])), encoding="utf-8") as f:  # a name from the file
                for rec in map(json.loads, f):
                    texts_l.append(rec["text"])
                    ids_l.append(rec["id"])
            texts, ids = texts_l, (ids if ids is not None else ids_l)
        n = len(texts)
        if n != m["count"]:
            raise ValueError(f"texts: the index at {path} covers {m['count']} passages, got {n}")
        if hasattr(texts, "manifest"):
            if m.get("store_texts_sha256") and m["store_texts_sha256"] != _store_texts_sha(texts):
                raise ValueError(f"texts: the store's texts differ from those the index at {path} was built on")
        elif texts_digest([str(t) for t in texts]) != m["digest"]:
            raise ValueError(f"texts: the passages differ from those the index at {path} was built on")
        s = m["settings"]
        bm25s = _bm25s()
        if n:
            model = bm25s.BM25.load(str(path), mmap=mmap, show_progress=False)
        else:
            model = bm25s.BM25(k1=s["k1"], b=s["b"], method=s["method"])
        # indexes saved before the stemmer setting existed were not stemmed
        return cls(texts, ids, k1=s["k1"], b=s["b"], method=s["method"], stopwords=s["stopwords"],
                   stemmer=s.get("stemmer"), _model=model, _digest=m["digest"])

    @classmethod
    def for_store(cls, store: Any, *, rebuild: bool = False, save: bool = True, **settings: Any) -> "BM25Index":
        """The BM25 index of a corpus store, kept in ``<store>/bm25/``.

        Loads the saved index when it exists, matches the store's texts
        (count and the manifest's sha256 of ``texts.bin``) and has the
        requested settings; otherwise builds it and (``save=True``) writes
        it there. A store directory that cannot be written to keeps the
        index in memory only (a warning is logged).

        Parameters
        ----------
        store : CorpusStore or path of a store directory
        rebuild : bool
            Build again even when a saved index matches.
        **settings : ``k1``, ``b``, ``method``, ``stopwords``, ``stemmer``
            Recorded in the saved index's manifest: a saved index with
            other settings is rebuilt (and replaces the saved one).
        """
        from rcn_fast.retrieval.store import CorpusStore

        if isinstance(store, (str, os.PathLike)):
            store = CorpusStore.open(store)
        if not isinstance(store, CorpusStore):
            raise TypeError(f"store: expected a CorpusStore or a store directory, got {type(store).__name__}")
        where = store.path / STORE_SUBDIR
        unknown = set(settings) - {"k1", "b", "method", "stopwords", "stemmer"}
        if unknown:
            raise TypeError(f"settings: unknown BM25 setting(s) {sorted(unknown)}; known: k1, b, method, stopwords, "
                            "stemmer")
        want = {"k1": 1.5, "b": 0.75, "method": "lucene", "stopwords": "english", "stemmer": None, **settings}
        if not rebuild and (where / MANIFEST).is_file():
            try:
                idx = cls.load(where, store)
                if idx.settings() == {**want, "k1": float(want["k1"]), "b": float(want["b"])}:
                    return idx
                logger.info("BM25 index at %s has other settings; rebuilding", where)
            except ValueError as exc:
                logger.info("BM25 index at %s is stale (%s); rebuilding", where, exc)
        logger.info("building the BM25 index of %s (%d passages)", store.path, len(store))
        idx = cls(store, **want)
        if save:
            try:
                idx.save(where)
            except OSError as exc:
                logger.warning("could not save the BM25 index to %s (%s); it is kept in memory only", where, exc)
        return idx

    def __repr__(self) -> str:
        src = f"store={str(self.store.path)!r}" if self.store is not None else "in memory"
        return (f"BM25Index({self.count} passages, {src}, method={self.method!r}, k1={self.k1}, b={self.b}, "
                f"stemmer={self.stemmer!r})")


def _store_texts_sha(store: Any) -> str | None:
    rec = store.manifest.get("files", {}).get("texts.bin")
    return None if rec is None else rec.get("sha256")


def _f32(x: Any) -> np.ndarray:
    if hasattr(x, "detach"):
        x = x.detach().cpu().numpy()
    return np.ascontiguousarray(np.asarray(x, dtype=np.float32))


def _unit(x: np.ndarray) -> np.ndarray:
    n = np.linalg.norm(x, axis=-1, keepdims=True)
    return x / np.where(n > 0, n, 1.0)


class BM25Reranker:
    """BM25 candidates reranked by encoder cosine similarity.

    For every query: the BM25 top ``candidates`` passages, then the cosine
    between the query's embedding (``encode_queries``) and each
    candidate's passage embedding; the best ``k`` by cosine are kept. A
    whole batch costs one BM25 call, one ``encode_queries`` call (over the
    queries with at least one candidate) and, when
    passage embeddings are not stored, one ``encode_passages`` call over
    the distinct candidates.

    Parameters
    ----------
    bm25 : BM25Index
    encoder : EncoderLike
        ``encode_queries`` / ``encode_passages`` -> float [n, d].
    passage_embeddings : array [N, d], optional
        Embeddings of the index's passages by row (e.g. a corpus store's
        ``embeddings`` or :class:`InMemoryRetriever`'s); used instead of
        encoding candidates. Must come from ``encoder``.
    candidates : int
        BM25 passages reranked per query (RR: 10).

    Examples
    --------
    >>> r = BM25Reranker.from_retriever(Retriever.load("corpus/"))     # doctest: +SKIP
    >>> r.retrieve(["plants need light to grow"], k=1)[0][0].meta       # doctest: +SKIP
    {'row': 12, 'bm25': 7.1, 'cosine': 0.83, 'bm25_rank': 2}
    """

    def __init__(self, bm25: BM25Index, encoder: Any, *, passage_embeddings: Any = None, candidates: int = 10) -> None:
        if not isinstance(bm25, BM25Index):
            raise TypeError(f"bm25: expected a BM25Index, got {type(bm25).__name__}")
        if encoder is None or not hasattr(encoder, "encode_queries"):
            raise TypeError("encoder: expected an encoder with encode_queries / encode_passages, got "
                            f"{type(encoder).__name__}")
        self.candidates = check_k(candidates, "candidates")
        self.bm25, self.encoder = bm25, encoder
        self.passage_emb = None
        if passage_embeddings is not None:
            if getattr(passage_embeddings, "shape", (None,))[0] != len(bm25):
                raise ValueError(f"passage_embeddings: expected {len(bm25)} rows (one per passage), got shape "
                                 f"{getattr(passage_embeddings, 'shape', None)}")
            self.passage_emb = passage_embeddings
        self.encoder_calls = 0
        self.bm25_calls = 0

    @classmethod
    def from_retriever(cls, retriever: Any, *, candidates: int = 10, **bm25_settings: Any) -> "BM25Reranker":
        """BM25 + rerank over the corpus of a dense retriever.

        * an rcn_fast ``Retriever`` (corpus store): the store's BM25 index
          (:meth:`BM25Index.for_store`: built once, saved in the store) and
          the store's embeddings;
        * an :class:`rcn_fast.pipelines.InMemoryRetriever` (or anything with
          ``texts``, ``ids``, ``encoder`` and optionally ``embeddings``): a
          BM25 index of its texts, in memory;
        * a :class:`BM25Reranker`: returned as is.
        """
        if isinstance(retriever, BM25Reranker):
            return retriever
        enc = getattr(retriever, "encoder", None)
        if enc is None:
            raise TypeError(f"retriever: expected a BM25Reranker or a retriever with an encoder (rcn_fast Retriever, "
                            f"InMemoryRetriever), got {type(retriever).__name__}")
        store = getattr(retriever, "store", None)
        if store is not None and hasattr(store, "manifest"):
            return cls(BM25Index.for_store(store, **bm25_settings), enc, passage_embeddings=store.embeddings,
                       candidates=candidates)
        texts = getattr(retriever, "texts", None)
        if texts is None:
            raise TypeError(f"retriever: {type(retriever).__name__} exposes neither a corpus store nor texts")
        emb = getattr(retriever, "embeddings", None)
        return cls(BM25Index(list(texts), getattr(retriever, "ids", None), **bm25_settings), enc,
                   passage_embeddings=emb, candidates=candidates)

    def _passage_vectors(self, rows: np.ndarray) -> np.ndarray:
        if self.passage_emb is not None:
            return _f32(self.passage_emb[rows])
        self.encoder_calls += 1
        return _f32(self.encoder.encode_passages([self.bm25.text(int(r)) for r in rows]))

    def retrieve(self, queries: Sequence[str], k: int = 1) -> list[list[Passage]]:
        """Best ``k`` passages per query by cosine among the BM25 candidates.

        Returns
        -------
        list (length Q) of lists (length <= k) of :class:`Passage`;
        ``score`` = cosine, ``meta`` = ``{"row", "bm25", "bm25_rank", "cosine"}``.
        Queries sharing no token with the corpus get an empty list.
        """
        return self.retrieve_with_candidates(queries, k)[0]

    def retrieve_with_candidates(self, queries: Sequence[str],
                                 k: int = 1) -> tuple[list[list[Passage]], list[list[str]]]:
        """:meth:`retrieve`, plus each query's BM25 candidate ids in BM25 order."""
        queries = check_texts(queries, "queries")
        k = check_k(k)
        if not queries:
            return [], []
        bm25_scores, rows = self.bm25.search(queries, max(1, min(self.candidates, self.bm25.count)))
        self.bm25_calls += 1
        live = np.flatnonzero((rows >= 0).any(axis=1))  # queries with a candidate: the only ones encoded
        q_row = {int(q): i for i, q in enumerate(live.tolist())}
        uniq = np.unique(rows[rows >= 0])
        if len(live):
            q_emb = _unit(_f32(self.encoder.encode_queries([queries[i] for i in live])))
            self.encoder_calls += 1
            p_emb = _unit(self._passage_vectors(uniq))
        pos = {int(r): i for i, r in enumerate(uniq.tolist())}
        out: list[list[Passage]] = []
        cand_ids: list[list[str]] = []
        for qi in range(len(queries)):
            cand = [(rank, int(r)) for rank, r in enumerate(rows[qi].tolist()) if r >= 0]
            cand_ids.append([self.bm25.id(r) for _, r in cand])
            if not cand:
                out.append([])
                continue
            cos = p_emb[[pos[r] for _, r in cand]] @ q_emb[q_row[qi]]
            order = sorted(range(len(cand)), key=lambda j: (-float(cos[j]), cand[j][0]))[:k]
            out.append([
                Passage(id=self.bm25.id(cand[j][1]), text=self.bm25.text(cand[j][1]), score=float(cos[j]),
                        meta={"row": cand[j][1], "bm25": float(bm25_scores[qi, cand[j][0]]),
                              "bm25_rank": cand[j][0], "cosine": float(cos[j])})
                for j in order
            ])
        return out, cand_ids


def main(argv: list[str] | None = None) -> int:
    import argparse
    import sys

    p = argparse.ArgumentParser(prog="python -m rcn_fast.retrieval.bm25",
                                description="Build the BM25 index of a corpus store (saved in STORE/bm25/).")
    p.add_argument("store", help="corpus store directory (built by python -m rcn_fast.corpus build)")
    p.add_argument("--rebuild", action="store_true", help="build again even when a matching index is saved")
    p.add_argument("--k1", type=float, default=1.5)
    p.add_argument("--b", type=float, default=0.75)
    p.add_argument("--method", choices=list(METHODS), default="lucene")
    p.add_argument("--stemmer", default=None,
                   help="Snowball language for PyStemmer (e.g. english); default: no stemming")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    try:
        idx = BM25Index.for_store(args.store, rebuild=args.rebuild, k1=args.k1, b=args.b, method=args.method,
                                  stemmer=args.stemmer)
    except (ValueError, TypeError, FileNotFoundError, ImportError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps({"path": str(Path(args.store) / STORE_SUBDIR), "count": len(idx), **idx.settings()}))
    return 0


__all__ = ["BM25Index", "BM25Reranker", "texts_digest", "FORMAT", "STORE_SUBDIR"]

if __name__ == "__main__":
    raise SystemExit(main())
