"""Adapters between rcn_fast and RAG frameworks, both ways, one module per
framework (each imported only when used; one extra each):

=========================================  ==================  ==================
module                                     framework           install
=========================================  ==================  ==================
:mod:`rcn_fast.integrations.langchain`     LangChain           ``rcn_fast[langchain]``
:mod:`rcn_fast.integrations.llama_index`   LlamaIndex          ``rcn_fast[llama-index]``
:mod:`rcn_fast.integrations.haystack`      Haystack 2.x/3.x    ``rcn_fast[haystack]``
:mod:`rcn_fast.integrations.dspy`          DSPy                ``rcn_fast[dspy]``
=========================================  ==================  ==================

Each module offers

* ``RcnRetriever(retriever=<rcn_fast Retriever>, k=...)`` -- an rcn_fast
  corpus store as the framework's retriever. A batch of queries makes one
  encoder call and one index search; results equal
  :meth:`rcn_fast.retrieval.Retriever.retrieve` for the same queries
  (passage id, text and score carried over, the store row in the
  metadata).
* knowledge connection (:func:`rcn_fast.connect`) as the
  framework's component (a LangChain Runnable, a LlamaIndex node
  postprocessor, a Haystack component, a DSPy module);
* the framework's retrievers (and embedding models, which relevance
  sampling needs) as rcn_fast passage sources: objects with
  ``retrieve(queries, k)`` and an ``encoder`` that
  :func:`rcn_fast.connect` and the pipelines accept.

This package's own helpers (framework-free): :class:`CallableEncoder`, the
encoder protocol over any batch embedding function; :class:`RcnRetrieverBase`,
what the four ``RcnRetriever`` classes share.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from rcn_fast._arrays import require
from rcn_fast._validate import check_k, check_texts
from rcn_fast.retrieval.types import Passage

EXTRAS = {
    "langchain_core": "pip install 'rcn_fast[langchain]'  (langchain-core)",
    "llama_index.core": "pip install 'rcn_fast[llama-index]'  (llama-index-core)",
    "haystack": "pip install 'rcn_fast[haystack]'  (haystack-ai)",
    "dspy": "pip install 'rcn_fast[dspy]'  (dspy)",
}


def require_framework(module: str) -> Any:
    """Import ``module`` or raise ImportError with the extra to install."""
    return require(module, EXTRAS.get(module, f"pip install {module}"))


def as_rows(x: Any, what: str, n: int | None = None) -> np.ndarray:
    """A list of vectors (list of lists, array) -> float32 [n, d]."""
    arr = np.asarray(x, dtype=np.float32)
    if arr.ndim == 1 and n == 1:
        arr = arr[None]
    if arr.ndim != 2 or (n is not None and arr.shape[0] != n):
        raise ValueError(f"{what}: expected {n if n is not None else 'n'} embeddings of one width, got shape "
                         f"{arr.shape}")
    return np.ascontiguousarray(arr)


class CallableEncoder:
    """The rcn_fast encoder protocol (``encode_queries`` /
    ``encode_passages`` -> float32 [n, d], ``dim``) over embedding
    functions.

    Parameters
    ----------
    queries : callable
        ``list[str] -> [n, d]`` vectors of queries.
    passages : callable, optional
        ``list[str] -> [n, d]`` vectors of passages (default: ``queries``).
    name : str
        Shown in :meth:`describe`.
    """

    def __init__(self, queries: Callable[[list[str]], Any], passages: Callable[[list[str]], Any] | None = None,
                 *, name: str = "callable") -> None:
        if not callable(queries) or (passages is not None and not callable(passages)):
            raise TypeError("queries, passages: expected callables list[str] -> vectors")
        self._q = queries
        self._p = passages or queries
        self.name = name
        self._dim: int | None = None
        self.calls = 0

    def _run(self, fn: Callable[[list[str]], Any], texts: Sequence[str], what: str) -> np.ndarray:
        texts = check_texts(texts)
        if not texts:
            return np.zeros((0, self.dim if self._dim is not None else 0), np.float32)
        self.calls += 1
        out = as_rows(fn(texts), what, len(texts))
        self._dim = int(out.shape[1])
        return out

    def encode_queries(self, texts: Sequence[str], batch_size: int | None = None) -> np.ndarray:
        """float32 [n, d] query vectors (one call of the query function)."""
        return self._run(self._q, texts, f"{self.name} query embeddings")

    def encode_passages(self, texts: Sequence[str], batch_size: int | None = None) -> np.ndarray:
        """float32 [n, d] passage vectors (one call of the passage function)."""
        return self._run(self._p, texts, f"{self.name} passage embeddings")

    @property
    def dim(self) -> int:
        """Embedding width (found by embedding one text the first time)."""
        if self._dim is None:
            self._dim = int(as_rows(self._q(["dimension probe"]), f"{self.name} query embeddings", 1).shape[1])
        return self._dim

    def describe(self) -> dict[str, Any]:
        return {"model": self.name, "dim": self.dim}


class FrameworkSource:
    """Base of the framework retrievers as rcn_fast passage sources:
    ``retrieve(queries, k) -> list[list[Passage]]`` and ``encoder`` (None
    without an embedding model: then only ``sampling="random"`` or the
    ablations without sampling run)."""

    encoder: Any = None

    def retrieve(self, queries: Sequence[str], k: int = 5) -> list[list[Passage]]:  # pragma: no cover - abstract
        raise NotImplementedError


def check_queries(queries: Any) -> list[str]:
    """``queries`` as a list of str (batch first; TypeError otherwise)."""
    return check_texts(queries, "queries")


def mc_or_open(queries: Any, choices: Sequence[Sequence[str] | None] | None, per: str = "question") -> list[Any]:
    """Questions for :func:`rcn_fast.connect`: query ``i`` as a
    multiple-choice mapping ``{"question", "choices", "id": "q<i>"}`` when
    ``choices[i]`` is given, else as a str (an open question).

    ``choices`` (None, or one list or None per query) must match the
    queries in length: ValueError (``per`` names a query in the message).
    """
    queries = check_queries(queries)
    if choices is not None and len(choices) != len(queries):
        raise ValueError(f"choices: expected one list per {per} ({len(queries)}), got {len(choices)}")
    qs: list[Any] = []
    for i, q in enumerate(queries):
        ch = None if choices is None else choices[i]
        qs.append({"question": q, "choices": list(ch), "id": f"q{i}"} if ch else q)
    return qs


def check_rcn_retriever(retriever: Any) -> Any:
    """An rcn_fast retriever: ``retrieve(queries, k)`` over a batch."""
    if not callable(getattr(retriever, "retrieve", None)):
        raise TypeError(f"retriever: expected an rcn_fast Retriever (retrieve(queries, k)), got "
                        f"{type(retriever).__name__}")
    return retriever


class RcnRetrieverBase:
    """Mixin of the ``RcnRetriever`` adapters (an rcn_fast retriever as a
    framework's retriever): :meth:`_bind` checks and keeps the rcn_fast
    retriever and the default ``k``; :meth:`_retrieve_batch` runs one
    batched retrieval, whose passages each framework converts to its own
    result type.

    Parameters
    ----------
    retriever : rcn_fast Retriever
        Anything with ``retrieve(queries, k) -> list[list[Passage]]``.
    k : int
        Results per query.
    """

    def _bind(self, retriever: Any, k: Any) -> None:
        """Check and keep ``retriever`` and ``k``."""
        self.retriever = check_rcn_retriever(retriever)
        self.k = check_k(k)

    def _retrieve_batch(self, queries: Sequence[str], k: int | None = None,
                        keep: Callable[[Passage], bool] | None = None) -> list[list[Passage]]:
        """``retriever.retrieve(queries, k)`` (default ``k``: the bound one):
        one encoder call and one index search for the whole batch.

        With ``keep`` (a filter), each query gets the top ``k`` passages for
        which ``keep`` is true, as if the store held only those: the search
        is widened (4k, 8k, ... passages) for the queries with fewer than
        ``k`` matches until they have ``k`` or the store is exhausted. An
        rcn_fast :class:`~rcn_fast.retrieval.Retriever` encodes the queries
        once for all rounds."""
        queries = check_queries(queries)
        if not queries:
            return []
        k = self.k if k is None else k
        if keep is None:
            return self.retriever.retrieve(queries, k)
        r = self.retriever
        emb = None
        if callable(getattr(r, "retrieve_embeddings", None)) and getattr(r, "encoder", None) is not None:
            emb = r.encoder.encode_queries(queries)
        out: list[list[Passage]] = [[] for _ in queries]
        todo, fetch = list(range(len(queries))), 4 * k
        while todo:
            res = r.retrieve_embeddings(emb[todo], fetch) if emb is not None else r.retrieve(
                [queries[i] for i in todo], fetch)
            widen = []
            for i, got in zip(todo, res):
                kept = [p for p in got if keep(p)]
                if len(kept) >= k or len(got) < fetch:
                    out[i] = kept[:k]
                else:
                    widen.append(i)
            todo, fetch = widen, fetch * 2
        return out


__all__ = ["CallableEncoder", "FrameworkSource", "RcnRetrieverBase", "require_framework", "as_rows",
           "check_k", "check_queries", "check_rcn_retriever", "mc_or_open", "EXTRAS"]
