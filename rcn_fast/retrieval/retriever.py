"""Retriever = encoder + corpus store + the index it is handed (see
:mod:`rcn_fast.retrieval.index`), batch first."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from rcn_fast import _arrays as A
from rcn_fast._validate import check_k, check_texts
from rcn_fast.retrieval.index import FaissIndex
from rcn_fast.retrieval.protocols import VectorIndex
from rcn_fast.retrieval.store import CorpusStore
from rcn_fast.retrieval.types import Passage

logger = logging.getLogger("rcn_fast.retrieval")
_BACKENDS = ("native", "faiss")
# settings an encoder must share with the store's manifest to search it
_MATCH_KEYS = ("fingerprint", "pooling", "normalize", "query_prefix", "passage_prefix", "dim")


class Retriever:
    """Dense retrieval over a corpus store, with the index it is handed.

    Parameters
    ----------
    encoder : EncoderLike or None
        Encodes queries; None allows only :meth:`retrieve_embeddings`.
    store : CorpusStore
    index : VectorIndex, optional
        What :meth:`search` asks: a :class:`~rcn_fast.retrieval.index.FlatIndex`
        or a :class:`~rcn_fast.retrieval.index.FaissIndex` over ``store``
        (row ``i`` of the index is row ``i`` of the store). Default: the
        store's own exact index (``store.index()``, memory-mapped).
        :meth:`load` builds the one its ``backend`` names.
    dedup : bool
        Default of ``retrieve(..., dedup=)``: drop passages whose text
        equals a higher-ranked one.

    Attributes
    ----------
    index : VectorIndex
    backend : {"native", "faiss"}
        Which kind of index is searched.
    index_path : pathlib.Path or None
        The saved faiss index file in use (None for the native backend and
        for exact ``"Flat"`` faiss indexes, which are not saved).

    Examples
    --------
    >>> r = Retriever.load("corpus_dir")                     # doctest: +SKIP
    >>> r.retrieve(["what makes plants grow?"], k=3)[0][0]    # doctest: +SKIP
    Passage(id='f12', text='plants need sunlight to grow', score=0.83, meta={'row': 11})
    >>> big = Retriever.load("corpus_dir", backend="faiss", faiss_factory="IVF4096,PQ64", nprobe=32)  # doctest: +SKIP
    >>> store = CorpusStore.open("corpus_dir")                                        # doctest: +SKIP
    >>> same = Retriever(enc, store, FaissIndex.build(store, "IVF4096,PQ64", nprobe=32))  # doctest: +SKIP
    """

    def __init__(self, encoder: Any, store: CorpusStore, index: Any = None, *, dedup: bool = False) -> None:
        if not isinstance(store, CorpusStore):
            raise TypeError(f"store: expected a CorpusStore, got {type(store).__name__}")
        if encoder is not None and int(encoder.dim) != store.dim:
            raise ValueError(f"encoder: produces dim {encoder.dim} but the store holds dim {store.dim}")
        if index is None:
            index = store.index(mmap=True)
        if not isinstance(index, VectorIndex):
            raise TypeError(f"index: expected a FlatIndex, a FaissIndex or another object with search(q, k) and "
                            f"__len__, got {type(index).__name__}")
        if len(index) != len(store) or int(getattr(index, "dim", store.dim)) != store.dim:
            raise ValueError(f"index: holds {len(index)} rows of dim {getattr(index, 'dim', '?')}, the store "
                             f"{len(store)} of dim {store.dim}; build the index over this store")
        self.encoder, self.store, self.index, self.dedup = encoder, store, index, dedup
        self.backend = "faiss" if isinstance(index, FaissIndex) else "native"
        self.index_path: Path | None = index.path if isinstance(index, FaissIndex) else None
        logger.info("retriever over %s (%d passages) with the %s backend", store.path, len(store), self.backend)

    @classmethod
    def load(cls, path: str | os.PathLike[str], encoder: Any = None, backend: str | None = None, *,
             encoder_backend: str | None = None, device: str | None = None, check: bool = True,
             verify: bool = False, dedup: bool = False, faiss_factory: str = "Flat", nprobe: int = 16,
             faiss_train_size: int | None = None,
             faiss_index_dir: str | os.PathLike[str] | None = None) -> "Retriever":
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
        verify : bool
            Recompute every store file's sha256 against the manifest before
            searching (reads the whole store). Without it only file sizes
            are compared (see :meth:`CorpusStore.open`).
        dedup : bool
            See :class:`Retriever`.
        faiss_factory, nprobe, faiss_train_size, faiss_index_dir
            Backend ``"faiss"`` only: the index is
            ``FaissIndex.build(store, faiss_factory, nprobe=nprobe,
            train_size=faiss_train_size, index_dir=faiss_index_dir)``
            (faiss ``index_factory`` string, default ``"Flat"``; IVF lists
            visited per query, default 16; training rows, default
            ``max(256 * nlist, 65536)``; where trained indexes are saved,
            default ``<store>/faiss``). See :func:`~rcn_fast.retrieval.index.faiss_index`.

        Raises
        ------
        ValueError
            A store file that does not match the manifest (named), or an
            encoder that does not match the store (with ``check``).
        """
        store = CorpusStore.open(path, verify=verify)
        m = store.manifest["encoder"]
        if encoder is None:
            from rcn_fast.retrieval.encoders import EncoderConfig, load_encoder

            model = m.get("model_dir") or m["model"]
            if not Path(model).is_dir():
                model = m["model"]
            cfg = EncoderConfig(model=model, backend=encoder_backend or m["backend"], pooling=m["pooling"],
                                normalize=m["normalize"], query_prefix=m["query_prefix"],
                                passage_prefix=m["passage_prefix"], max_length=m["max_length"],
                                quantize=m.get("quantize") if (encoder_backend or m["backend"]) == "onnx" else None,
                                device=device)
            encoder = load_encoder(cfg)
        if check and hasattr(encoder, "describe"):
            have = encoder.describe()
            diff = [f"{k}: store {m.get(k)!r} vs encoder {have.get(k)!r}" for k in _MATCH_KEYS
                    if m.get(k) != have.get(k)]
            if diff:
                raise ValueError(f"encoder: does not match the encoder the store {path} was built with ("
                                 + "; ".join(diff) + "); rebuild the store or pass check=False")
        backend = backend or "native"
        if backend not in _BACKENDS:
            raise ValueError(f"backend: expected one of {list(_BACKENDS)}, got {backend!r}")
        if backend == "native":
            index = store.index(mmap=True)
        else:
            index = FaissIndex.build(store, faiss_factory, nprobe=nprobe, train_size=faiss_train_size,
                                     index_dir=faiss_index_dir)
        return cls(encoder, store, index, dedup=dedup)

    # ------------------------------------------------------------------ search
    def search(self, query_emb: Any, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Raw top-k: scores float32 [Q, k], rows int64 [Q, k] (-1 padded).

        The index is asked for at most as many rows as the store holds; the
        columns beyond it are padding (MemoryError naming ``k`` when the
        [Q, k] results cannot be allocated)."""
        k = check_k(k)
        q = A.to_float32_numpy(A.as_array(query_emb, "query_emb"))
        if q.ndim == 1:
            q = q[None, :]
        A.check_rank(q, 2, "query_emb", f"[Q, {self.store.dim}]")
        if q.shape[1] != self.store.dim:
            raise ValueError(f"query_emb: expected {self.store.dim} columns, got shape {q.shape}")
        return self.index.search(q, int(k))

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
        k = check_k(k)
        dedup = self.dedup if dedup is None else dedup
        q = A.to_float32_numpy(A.as_array(query_emb, "query_emb"))
        if q.ndim == 1:
            q = q[None, :]
        n = len(self.store)
        # never ask for more rows than the store holds: a huge k costs nothing
        fetch = max(min(k * 2 if dedup else k, n), 1)
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
        queries = check_texts(queries, "queries")
        check_k(k)
        if not queries:
            return []
        emb = self.encoder.encode_queries(queries, batch_size=batch_size)
        return self.retrieve_embeddings(emb, k, dedup=dedup)

    def __repr__(self) -> str:
        return f"Retriever(store={self.store!r}, backend={self.backend!r}, encoder={self.encoder!r})"


__all__ = ["Retriever"]
