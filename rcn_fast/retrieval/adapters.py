"""Adapters from what a caller hands in as a retriever to the
:class:`~rcn_fast.retrieval.protocols.EmbeddingRetriever` methods that
ReConnect's sampler needs:

* :class:`StoreRetrieverAdapter`: an rcn_fast
  :class:`~rcn_fast.retrieval.Retriever` (encoder + corpus store: passage
  embeddings are read from the store by row, never re-encoded);
* :class:`EncoderRetrieverAdapter`: any ``retrieve(queries, k)`` object
  with an ``encoder`` attribute (passages are encoded again);
* :class:`TextOnlyAdapter`: a bare ``retrieve(queries, k)`` object (no
  embeddings: only what needs none).

Which one fits an object is chosen by
:func:`rcn_fast.pipelines.knowledge.as_embedding_retriever`.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from rcn_fast.retrieval.types import Passage


def as_float32(x: Any) -> np.ndarray:
    """A C-contiguous float32 numpy copy (or view) of an array or a torch
    tensor (detached, moved to the CPU)."""
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
        return as_float32(self.encoder.encode_queries(list(queries)))

    def retrieve_embeddings(self, query_emb: np.ndarray, k: int) -> list[list[Passage]]:
        return self.retriever.retrieve_embeddings(query_emb, k)

    def passage_embeddings(self, passages: Sequence[Passage]) -> np.ndarray:
        passages = list(passages)
        rows = [p.meta.get("row") if isinstance(p.meta, dict) else None for p in passages]
        if self.store is not None and passages and all(isinstance(r, (int, np.integer)) for r in rows):
            return as_float32(self.store.embeddings[np.asarray(rows, dtype=np.int64)])
        if not passages:
            return np.zeros((0, int(self.encoder.dim)), np.float32)
        return as_float32(self.encoder.encode_passages([p.text for p in passages]))

    def retrieve(self, queries: Sequence[str], k: int = 5) -> list[list[Passage]]:
        return self.retrieve_embeddings(self.embed_queries(queries), k)


class EncoderRetrieverAdapter:
    """A ``retrieve(queries, k)`` object plus its ``encoder``: retrieval by
    text, embeddings by encoding (queries and passages again)."""

    def __init__(self, retriever: Any) -> None:
        self.retriever = retriever
        self.encoder = retriever.encoder

    def embed_queries(self, queries: Sequence[str]) -> np.ndarray:
        return as_float32(self.encoder.encode_queries(list(queries)))

    def retrieve_texts(self, queries: Sequence[str], k: int) -> list[list[Passage]]:
        return self.retriever.retrieve(list(queries), k)

    def passage_embeddings(self, passages: Sequence[Passage]) -> np.ndarray:
        if not passages:
            return np.zeros((0, int(self.encoder.dim)), np.float32)
        return as_float32(self.encoder.encode_passages([p.text for p in passages]))


class TextOnlyAdapter:
    """A bare ``retrieve(queries, k)`` object: no embeddings."""

    def __init__(self, retriever: Any) -> None:
        self.retriever = retriever

    def retrieve_texts(self, queries: Sequence[str], k: int) -> list[list[Passage]]:
        return self.retriever.retrieve(list(queries), k)


__all__ = ["EncoderRetrieverAdapter", "StoreRetrieverAdapter", "TextOnlyAdapter", "as_float32"]
