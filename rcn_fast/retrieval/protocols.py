"""Every retrieval protocol in one place: what the rest of rcn_fast needs
from an encoder (:class:`EncoderLike`), a vector index
(:class:`VectorIndex`), a passage store (:class:`PassageStore`), a
retriever (:class:`RetrieverLike`) and a retriever with its embeddings
(:class:`EmbeddingRetriever`, what ReConnect's sampler uses).

All are ``runtime_checkable``: ``isinstance(x, EncoderLike)`` checks that
the methods exist (not their signatures).
"""

from __future__ import annotations

from typing import Any, Protocol, Sequence, runtime_checkable

import numpy as np

from rcn_fast.retrieval.types import Passage


@runtime_checkable
class EncoderLike(Protocol):
    """What the corpus build and the retriever need from an encoder.

    ``describe()`` returns a JSON-able dict with at least ``dim`` and the
    settings that decide the vectors (``fingerprint``, ``pooling``,
    ``normalize``, ``query_prefix``, ``passage_prefix``); it is stored in
    corpus manifests and compared on resume and load.
    """

    @property
    def dim(self) -> int: ...

    def encode_queries(self, texts: Sequence[str], batch_size: int | None = None) -> Any: ...

    def encode_passages(self, texts: Sequence[str], batch_size: int | None = None) -> Any: ...

    def describe(self) -> dict[str, Any]: ...


@runtime_checkable
class VectorIndex(Protocol):
    """An inner-product index over the rows of a store.

    ``search(q, k)`` takes float32 [Q, d] and returns scores float32 [Q, k]
    and rows int64 [Q, k], best first; columns beyond the rows the index
    holds are ``(-inf, -1)`` padding. :class:`rcn_fast.FlatIndex` and
    :class:`rcn_fast.retrieval.index.FaissIndex` are the two in rcn_fast.
    """

    def __len__(self) -> int: ...

    def search(self, q: Any, k: int) -> tuple[np.ndarray, np.ndarray]: ...


@runtime_checkable
class PassageStore(Protocol):
    """What a retriever needs from a corpus."""

    def __len__(self) -> int: ...

    def text(self, row: int) -> str: ...

    def id(self, row: int) -> str: ...

    def row_of(self, id: str) -> int: ...


@runtime_checkable
class RetrieverLike(Protocol):
    """Anything that maps a batch of queries to ranked passages."""

    def retrieve(self, queries: Sequence[str], k: int = 5) -> list[list[Passage]]: ...


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


__all__ = ["EmbeddingRetriever", "EncoderLike", "PassageStore", "RetrieverLike", "VectorIndex"]
