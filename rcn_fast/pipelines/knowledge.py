"""How a pipeline takes any retriever: the adapter that fits it and one
batched retrieval.

ReConnect's sampler works on embeddings: the question's and those of the
pooled passages.
:class:`~rcn_fast.retrieval.protocols.EmbeddingRetriever` is the small
protocol the pipelines use; :func:`as_embedding_retriever` adapts (with
the adapters of :mod:`rcn_fast.retrieval.adapters`)

* an object that already implements it,
* :class:`rcn_fast.retrieval.Retriever` (encoder + corpus store: passage
  embeddings are read from the store by row, never re-encoded),
* any ``retrieve(queries, k)`` object with an ``encoder`` attribute
  (passages are encoded again for the sampler),
* a bare ``retrieve(queries, k)`` object (no embeddings: only what needs
  none, e.g. single retrieval or ``sampling="random"``).
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from rcn_fast.retrieval.adapters import EncoderRetrieverAdapter, StoreRetrieverAdapter, TextOnlyAdapter
from rcn_fast.retrieval.protocols import EmbeddingRetriever
from rcn_fast.retrieval.types import Passage


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


def passage_refs(passages: Sequence[Passage], scores: Sequence[float | None] | None = None, *,
                 text: bool = False) -> list[dict[str, Any]]:
    """The ``passages`` field of a ``retrieve`` trace entry:
    ``[{"id", "score"[, "text"]}]`` per passage, the score the passage's
    own (the retriever's) unless ``scores`` gives another (None: unknown);
    ``text`` only when the prediction's ``passages`` will not hold the
    passage (docs/evaluation.md, "Trace entries")."""
    out = []
    for i, p in enumerate(passages):
        s = p.score if scores is None else scores[i]
        ref: dict[str, Any] = {"id": p.id, "score": None if s is None else float(s)}
        if text:
            ref["text"] = p.text
        out.append(ref)
    return out


__all__ = ["as_embedding_retriever", "has_embeddings", "retrieve_batch", "passage_refs"]
