"""Retriever = Encoder + index + corpus store, batch first."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any, Protocol, Sequence, runtime_checkable

import numpy as np

from rcn_fast import _arrays as A
from rcn_fast._arrays import require
from rcn_fast.retrieval.store import CorpusStore
from rcn_fast.retrieval.types import Passage

logger = logging.getLogger("rcn_fast.retrieval")
_BACKENDS = ("native", "faiss")
# settings an encoder must share with the store's manifest to search it
_MATCH_KEYS = ("fingerprint", "pooling", "normalize", "query_prefix", "passage_prefix", "dim")


@runtime_checkable
class RetrieverLike(Protocol):
    """Anything that maps a batch of queries to ranked passages."""

    def retrieve(self, queries: Sequence[str], k: int = 5) -> list[list[Passage]]: ...


class Retriever:
    """Dense retrieval over a corpus store.

    Parameters
    ----------
    encoder : EncoderLike or None
        Encodes queries; None allows only :meth:`retrieve_embeddings`.
    store : CorpusStore
    backend : {"native", "faiss"}
        ``"native"``: the exact :class:`rcn_fast.FlatIndex` over the
        memory-mapped embeddings. ``"faiss"``: a faiss index built from
        ``faiss_factory`` (``"Flat"`` exact; ``"IVF1024,PQ32"`` etc. for
        corpora past memory; trained on the stored embeddings).
    dedup : bool
        Default of ``retrieve(..., dedup=)``: drop passages whose text
        equals a higher-ranked one.
    faiss_factory : str
        faiss ``index_factory`` string (backend ``"faiss"`` only).
    nprobe : int
        IVF lists visited per query (faiss IVF indexes only).

    Examples
    --------
    >>> r = Retriever.load("corpus_dir")                     # doctest: +SKIP
    >>> r.retrieve(["what makes plants grow?"], k=3)[0][0]    # doctest: +SKIP
    Passage(id='f12', text='plants need sunlight to grow', score=0.83, meta={'row': 11})
    """

    def __init__(self, encoder: Any, store: CorpusStore, *, backend: str = "native", dedup: bool = False,
                 faiss_factory: str = "Flat", nprobe: int = 16) -> None:
        if backend not in _BACKENDS:
            raise ValueError(f"backend: expected one of {list(_BACKENDS)}, got {backend!r}")
        if not isinstance(store, CorpusStore):
            raise TypeError(f"store: expected a CorpusStore, got {type(store).__name__}")
        self.encoder, self.store, self.backend, self.dedup = encoder, store, backend, dedup
        if encoder is not None and int(encoder.dim) != store.dim:
            raise ValueError(f"encoder: produces dim {encoder.dim} but the store holds dim {store.dim}")
        if backend == "native":
            self.index = store.index(mmap=True)
        else:
            faiss = require("faiss", "pip install 'rcn_fast[faiss]'  (faiss-cpu)")
            data = np.ascontiguousarray(store.embeddings, dtype=np.float32)
            index = faiss.index_factory(store.dim, faiss_factory, faiss.METRIC_INNER_PRODUCT)
            if not index.is_trained:
                index.train(data)
            index.add(data)
            if hasattr(index, "nprobe"):
                index.nprobe = nprobe
            self.index = index
        logger.info("retriever over %s (%d passages) with the %s backend", store.path, len(store), backend)

    @classmethod
    def load(cls, path: str | os.PathLike[str], encoder: Any = None, backend: str | None = None, *,
             encoder_backend: str | None = None, device: str | None = None, check: bool = True,
             **kwargs: Any) -> "Retriever":
        """Open a store directory and the encoder its manifest names.

        Parameters
        ----------
        path : store directory
        encoder : EncoderLike, optional
            Default: ``Encoder.from_config`` of the manifest's encoder
            (model files must still match the recorded fingerprint).
        backend : {"native", "faiss"}, optional
            Search backend (default ``"native"``).
        encoder_backend : {"torch", "onnx"}, optional
            Run the manifest's encoder with this backend instead.
        device : str, optional
            Encoder device.
        check : bool
            Refuse an encoder whose model fingerprint, pooling,
            normalisation, prefixes or dim differ from the manifest.
        **kwargs : passed to :class:`Retriever`.
        """
        store = CorpusStore.open(path)
        m = store.manifest["encoder"]
        if encoder is None:
            from rcn_fast.retrieval.encoder import Encoder, EncoderConfig

            model = m.get("model_dir") or m["model"]
            if not Path(model).is_dir():
                model = m["model"]
            cfg = EncoderConfig(model=model, backend=encoder_backend or m["backend"], pooling=m["pooling"],
                                normalize=m["normalize"], query_prefix=m["query_prefix"],
                                passage_prefix=m["passage_prefix"], max_length=m["max_length"],
                                quantize=m.get("quantize") if (encoder_backend or m["backend"]) == "onnx" else None,
                                device=device)
            encoder = Encoder.from_config(cfg)
        if check and hasattr(encoder, "describe"):
            have = encoder.describe()
            diff = [f"{k}: store {m.get(k)!r} vs encoder {have.get(k)!r}" for k in _MATCH_KEYS
                    if m.get(k) != have.get(k)]
            if diff:
                raise ValueError(f"encoder: does not match the encoder the store {path} was built with ("
                                 + "; ".join(diff) + "); rebuild the store or pass check=False")
        return cls(encoder, store, backend=backend or "native", **kwargs)

    # ------------------------------------------------------------------ search
    def search(self, query_emb: Any, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Raw top-k: scores float32 [Q, k], rows int64 [Q, k] (-1 padded)."""
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
            raise ValueError(f"k: expected a positive int, got {k!r}")
        q = A.to_float32_numpy(A.as_array(query_emb, "query_emb"))
        if q.ndim == 1:
            q = q[None, :]
        A.check_rank(q, 2, "query_emb", f"[Q, {self.store.dim}]")
        if q.shape[1] != self.store.dim:
            raise ValueError(f"query_emb: expected {self.store.dim} columns, got shape {q.shape}")
        if self.backend == "native":
            return self.index.search(q, int(k))
        kk = min(int(k), len(self.store))
        scores, ids = self.index.search(np.ascontiguousarray(q), kk)
        if kk < k:
            pad = int(k) - kk
            scores = np.concatenate([scores, np.full((len(q), pad), -np.inf, np.float32)], 1)
            ids = np.concatenate([ids, np.full((len(q), pad), -1, np.int64)], 1)
        return scores.astype(np.float32), ids.astype(np.int64)

    def retrieve_embeddings(self, query_emb: Any, k: int = 5, *, dedup: bool | None = None) -> list[list[Passage]]:
        """Passages for already-embedded queries.

        Parameters
        ----------
        query_emb : float array [Q, dim] (or [dim])
        k : int
            Passages per query (fewer when the corpus is smaller).
        dedup : bool, optional
            Drop passages whose exact text already appeared higher in the
            same list (more candidates are fetched to still return k).

        Returns
        -------
        list (length Q) of lists of :class:`Passage`, best first.
        """
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
            raise ValueError(f"k: expected a positive int, got {k!r}")
        dedup = self.dedup if dedup is None else dedup
        q = A.to_float32_numpy(A.as_array(query_emb, "query_emb"))
        if q.ndim == 1:
            q = q[None, :]
        n = len(self.store)
        fetch = min(k * 2, n) if dedup else k
        fetch = max(fetch, 1)
        while True:
            scores, rows = self.search(q, fetch)
            out, short = [], False
            for s_row, r_row in zip(scores, rows):
                seen: set[str] = set()
                lst: list[Passage] = []
                for s, r in zip(s_row, r_row):
                    if r < 0:
                        break
                    text = self.store.text(int(r))
                    if dedup:
                        if text in seen:
                            continue
                        seen.add(text)
                    lst.append(Passage(id=self.store.id(int(r)), text=text, score=float(s), meta={"row": int(r)}))
                    if len(lst) == k:
                        break
                if dedup and len(lst) < k and fetch < n:
                    short = True
                out.append(lst)
            if not short:
                return out
            fetch = min(fetch * 2, n)

    def retrieve(self, queries: Sequence[str], k: int = 5, *, dedup: bool | None = None,
                 batch_size: int | None = None) -> list[list[Passage]]:
        """Top-``k`` passages for each query (queries encoded with the
        encoder's query prefix).

        Parameters
        ----------
        queries : sequence of str, length Q
        k : int
        dedup : bool, optional
        batch_size : int, optional
            Encoder batch size.

        Returns
        -------
        list (length Q) of lists (length <= k) of :class:`Passage`.
        """
        if self.encoder is None:
            raise ValueError("encoder: this retriever has none; use retrieve_embeddings or pass an encoder")
        if isinstance(queries, str):
            raise TypeError("queries: expected a sequence of str (batch first), got a single str; wrap it in a list")
        queries = list(queries)
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
            raise ValueError(f"k: expected a positive int, got {k!r}")
        if not queries:
            return []
        emb = self.encoder.encode_queries(queries, batch_size=batch_size)
        return self.retrieve_embeddings(emb, k, dedup=dedup)

    def __repr__(self) -> str:
        return f"Retriever(store={self.store!r}, backend={self.backend!r}, encoder={self.encoder!r})"


__all__ = ["Retriever", "RetrieverLike"]
