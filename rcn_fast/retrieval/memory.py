"""A small dense retriever over texts held in memory (an encoder +
:class:`rcn_fast.FlatIndex`), for small corpora and the ZEBRA example
knowledge base."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from rcn_fast._validate import check_k, check_texts
from rcn_fast.retrieval.adapters import as_float32
from rcn_fast.retrieval.types import Passage


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
            emb = as_float32(encoder.encode_passages(self.texts)) if self.texts else np.zeros((0, int(encoder.dim)), np.float32)
        else:
            emb = as_float32(embeddings)
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
        return as_float32(self.encoder.encode_queries(list(queries)))

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
        q = as_float32(query_emb)
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
        return as_float32(self.encoder.encode_passages([p.text for p in passages]))


__all__ = ["InMemoryRetriever"]
