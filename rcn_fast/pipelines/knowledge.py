"""What the pipelines need from a retriever, and adapters to it.

ReConnect's sampler works on embeddings: the question's and those of the
pooled passages. :class:`EmbeddingRetriever` is the small protocol the
pipelines use; :func:`as_embedding_retriever` adapts

* an object that already implements it,
* :class:`rcn_fast.retrieval.Retriever` (encoder + corpus store: passage
  embeddings are read from the store by row, never re-encoded),
* any ``retrieve(queries, k)`` object with an ``encoder`` attribute
  (passages are encoded again for the sampler),
* a bare ``retrieve(queries, k)`` object (no embeddings: only what needs
  none, e.g. single retrieval or ``sampling="random"``).

:class:`InMemoryRetriever` is a small dense retriever over a list of texts
(an encoder + :class:`rcn_fast.FlatIndex`), for small corpora and the ZEBRA
example knowledge base.
"""

from __future__ import annotations

from typing import Any, Protocol, Sequence, runtime_checkable

import numpy as np

from rcn_fast.retrieval.types import Passage
from rcn_fast._validate import check_k, check_texts


@runtime_checkable
class EmbeddingRetriever(Protocol):
    """Batch-first retrieval with access to the embeddings behind it."""

    def embed_queries(self, queries: Sequence[str]) -> np.ndarray:
        """float32 [Q, d]."""
        ...

    def retrieve_embeddings(self, query_emb: np.ndarray, k: int) -> list[list[Passage]]:
        """Top-``k`` passages per embedded query."""
        ...

    def passage_embeddings(self, passages: Sequence[Passage]) -> np.ndarray:
        """float32 [n, d], in the space of :meth:`embed_queries`."""
        ...


def _f32(x: Any) -> np.ndarray:
    if hasattr(x, "detach"):
        x = x.detach().cpu().numpy()
    return np.ascontiguousarray(np.asarray(x, dtype=np.float32))


class StoreRetrieverAdapter:
    """:class:`EmbeddingRetriever` over an rcn_fast ``Retriever`` (or anything
    with ``encoder``, ``store`` and ``retrieve_embeddings``)."""

    def __init__(self, retriever: Any) -> None:
        self.retriever = retriever
        self.encoder = retriever.encoder
        self.store = getattr(retriever, "store", None)

    def embed_queries(self, queries: Sequence[str]) -> np.ndarray:
        return _f32(self.encoder.encode_queries(list(queries)))

    def retrieve_embeddings(self, query_emb: np.ndarray, k: int) -> list[list[Passage]]:
        return self.retriever.retrieve_embeddings(query_emb, k)

    def passage_embeddings(self, passages: Sequence[Passage]) -> np.ndarray:
        passages = list(passages)
        rows = [p.meta.get("row") if isinstance(p.meta, dict) else None for p in passages]
        if self.store is not None and passages and all(isinstance(r, (int, np.integer)) for r in rows):
            return _f32(self.store.embeddings[np.asarray(rows, dtype=np.int64)])
        if not passages:
            return np.zeros((0, int(self.encoder.dim)), np.float32)
        return _f32(self.encoder.encode_passages([p.text for p in passages]))

    def retrieve(self, queries: Sequence[str], k: int = 5) -> list[list[Passage]]:
        return self.retrieve_embeddings(self.embed_queries(queries), k)


class EncoderRetrieverAdapter:
    """A ``retrieve(queries, k)`` object plus its ``encoder``: retrieval by
    text, embeddings by encoding (queries and passages again)."""

    def __init__(self, retriever: Any) -> None:
        self.retriever = retriever
        self.encoder = retriever.encoder

    def embed_queries(self, queries: Sequence[str]) -> np.ndarray:
        return _f32(self.encoder.encode_queries(list(queries)))

    def retrieve_texts(self, queries: Sequence[str], k: int) -> list[list[Passage]]:
        return self.retriever.retrieve(list(queries), k)

    def passage_embeddings(self, passages: Sequence[Passage]) -> np.ndarray:
        if not passages:
            return np.zeros((0, int(self.encoder.dim)), np.float32)
        return _f32(self.encoder.encode_passages([p.text for p in passages]))


class TextOnlyAdapter:
    """A bare ``retrieve(queries, k)`` object: no embeddings."""

    def __init__(self, retriever: Any) -> None:
        self.retriever = retriever

    def retrieve_texts(self, queries: Sequence[str], k: int) -> list[list[Passage]]:
        return self.retriever.retrieve(list(queries), k)


def as_embedding_retriever(retriever: Any) -> Any:
    """Wrap ``retriever`` in the adapter that fits what it offers (see the
    module docstring). Raises TypeError naming the argument when it offers
    neither ``retrieve`` nor the :class:`EmbeddingRetriever` methods."""
    if retriever is None:
        raise TypeError("retriever: this pipeline needs a retriever, got None")
    if isinstance(retriever, (StoreRetrieverAdapter, EncoderRetrieverAdapter, TextOnlyAdapter)):
        return retriever
    if isinstance(retriever, EmbeddingRetriever):
        return retriever
    if hasattr(retriever, "retrieve_embeddings") and getattr(retriever, "encoder", None) is not None:
        return StoreRetrieverAdapter(retriever)
    if hasattr(retriever, "retrieve") and getattr(retriever, "encoder", None) is not None:
        return EncoderRetrieverAdapter(retriever)
    if hasattr(retriever, "retrieve"):
        return TextOnlyAdapter(retriever)
    raise TypeError(
        f"retriever: expected an object with retrieve(queries, k) or the EmbeddingRetriever methods, "
        f"got {type(retriever).__name__}"
    )


def has_embeddings(adapter: Any) -> bool:
    """Whether an adapter can embed queries and passages (for the sampler)."""
    return hasattr(adapter, "passage_embeddings") and hasattr(adapter, "embed_queries")


def retrieve_batch(adapter: Any, queries: Sequence[str], k: int) -> tuple[list[list[Passage]], np.ndarray | None]:
    """One batched retrieval; also the query embeddings when available."""
    queries = list(queries)
    if not queries:
        return [], None
    if isinstance(adapter, EncoderRetrieverAdapter):
        return adapter.retrieve_texts(queries, k), adapter.embed_queries(queries)
    if isinstance(adapter, TextOnlyAdapter):
        return adapter.retrieve_texts(queries, k), None
    emb = adapter.embed_queries(queries)
    return adapter.retrieve_embeddings(emb, k), emb


class InMemoryRetriever:
    """Dense retrieval over texts held in memory.

    Parameters
    ----------
    encoder : EncoderLike
        ``encode_queries`` / ``encode_passages`` -> float arrays [n, d].
    texts : sequence of str
        Passages (encoded once, here, with ``encode_passages``).
    ids : sequence of str, optional
        Passage ids (default ``"0"``, ``"1"``, ...).
    metas : sequence of dict, optional
        Extra metadata per passage (``row`` is always added).
    embeddings : array [n, d], optional
        Precomputed passage embeddings (skips encoding).

    Examples
    --------
    >>> r = InMemoryRetriever(encoder, ["plants need light", "ice is cold"])  # doctest: +SKIP
    >>> r.retrieve(["what do plants need?"], k=1)[0][0].text                 # doctest: +SKIP
    'plants need light'
    """

    def __init__(self, encoder: Any, texts: Sequence[str], ids: Sequence[str] | None = None, *,
                 metas: Sequence[dict] | None = None, embeddings: Any = None) -> None:
        from rcn_fast.search import FlatIndex

        if isinstance(texts, str):
            raise TypeError("texts: expected a sequence of str, got a single str")
        self.encoder = encoder
        self.texts = [str(t) for t in texts]
        if ids is None:
            ids = [str(i) for i in range(len(self.texts))]
        self.ids = [str(i) for i in ids]
        if len(self.ids) != len(self.texts):
            raise ValueError(f"ids: expected {len(self.texts)} ids (one per text), got {len(self.ids)}")
        self.metas = [dict(m) for m in metas] if metas is not None else [{} for _ in self.texts]
        if len(self.metas) != len(self.texts):
            raise ValueError(f"metas: expected {len(self.texts)} dicts (one per text), got {len(self.metas)}")
        if embeddings is None:
            emb = _f32(encoder.encode_passages(self.texts)) if self.texts else np.zeros((0, int(encoder.dim)), np.float32)
        else:
            emb = _f32(embeddings)
            if emb.shape[0] != len(self.texts):
                raise ValueError(f"embeddings: expected {len(self.texts)} rows, got shape {emb.shape}")
        self.embeddings = emb
        self.dim = int(emb.shape[1]) if emb.ndim == 2 and emb.shape[0] else int(encoder.dim)
        self.index = FlatIndex(self.dim)
        if len(emb):
            self.index.add(emb)

    def __len__(self) -> int:
        return len(self.texts)

    def embed_queries(self, queries: Sequence[str]) -> np.ndarray:
        return _f32(self.encoder.encode_queries(list(queries)))

    def search(self, query_emb: Any, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Raw top-``k`` of :class:`rcn_fast.FlatIndex`.

        Parameters
        ----------
        query_emb : float array [Q, d] (or [d])
        k : int >= 1

        Returns
        -------
        scores : float32 [Q, k]; rows : int64 [Q, k] (``(-inf, -1)`` padded
            beyond the corpus; the search itself never looks for more rows
            than there are texts).
        """
        k = check_k(k)
        q = _f32(query_emb)
        if q.ndim == 1:
            q = q[None]
        return self.index.search(q, k)

    def retrieve_embeddings(self, query_emb: Any, k: int) -> list[list[Passage]]:
        """Top-``k`` passages per embedded query (fewer when the corpus is
        smaller: at most ``len(self)``, so a huge ``k`` allocates nothing
        beyond the corpus)."""
        k = check_k(k)
        scores, rows = self.search(query_emb, max(1, min(k, len(self.texts))))
        out = []
        for s_row, r_row in zip(scores, rows):
            out.append([
                Passage(id=self.ids[r], text=self.texts[r], score=float(s), meta={**self.metas[r], "row": int(r)})
                for s, r in zip(s_row.tolist(), r_row.tolist()) if r >= 0
            ])
        return out

    def retrieve(self, queries: Sequence[str], k: int = 5) -> list[list[Passage]]:
        queries = check_texts(queries, "queries")
        if not queries:
            return []
        return self.retrieve_embeddings(self.embed_queries(queries), k)

    def passage_embeddings(self, passages: Sequence[Passage]) -> np.ndarray:
        rows = [p.meta.get("row") for p in passages]
        if all(isinstance(r, int) and 0 <= r < len(self.texts) and self.texts[r] == p.text
               for r, p in zip(rows, passages)):
            return self.embeddings[np.asarray(rows, dtype=np.int64)] if rows else np.zeros((0, self.dim), np.float32)
        return _f32(self.encoder.encode_passages([p.text for p in passages]))


__all__ = [
    "EmbeddingRetriever", "InMemoryRetriever", "StoreRetrieverAdapter", "EncoderRetrieverAdapter",
    "TextOnlyAdapter", "as_embedding_retriever", "retrieve_batch", "has_embeddings",
]
