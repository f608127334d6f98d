"""Haystack adapters (``pip install 'rcn_fast[haystack]'``: haystack-ai).

* :class:`RcnRetriever` -- an rcn_fast corpus store as a Haystack
  component: ``run(query=..., top_k=None)`` returns ``{"documents":
  [...]}``; :meth:`RcnRetriever.run_batch` answers many queries with one
  encoder call (Haystack components run one input at a time).
* :class:`RcnConnector` -- knowledge connection as a Haystack component:
  ``run(query=..., documents=[...], choices=[...])`` returns
  ``{"explanation": str, "documents": [the explanation as one Document],
  "connection": Connection}``.
* :class:`HaystackSource` -- a Haystack retriever (with its text and
  document embedders) as an rcn_fast passage source.

Set ``HAYSTACK_TELEMETRY_ENABLED=False`` to keep Haystack from sending
usage telemetry.

Examples
--------
>>> from haystack import Pipeline                                             # doctest: +SKIP
>>> from rcn_fast.integrations.haystack import RcnRetriever, RcnConnector
>>> p = Pipeline()
>>> p.add_component("retriever", RcnRetriever(retriever=Retriever.load("store/"), k=4))
>>> p.add_component("connect", RcnConnector(llm=llm, encoder=encoder))
>>> p.connect("retriever.documents", "connect.documents")
>>> q = "What do plants need?"
>>> p.run({"retriever": {"query": q}, "connect": {"query": q, "choices": ["light", "salt"]}})
"""

from __future__ import annotations

import inspect
from typing import Any, Sequence

from rcn_fast.integrations import CallableEncoder, FrameworkSource, RcnRetrieverBase
from rcn_fast.integrations import check_k, check_queries, mc_or_open, require_framework
from rcn_fast.retrieval.types import Passage

require_framework("haystack")

from haystack import Document, component  # noqa: E402


def to_document(p: Passage) -> Document:
    """:class:`Passage` -> Haystack ``Document`` (same id, text, score and meta)."""
    return Document(id=p.id, content=p.text, score=p.score, meta=dict(p.meta))


def to_passage(d: Any, rank: int) -> Passage:
    """Haystack ``Document`` (or str) -> :class:`Passage`."""
    if isinstance(d, str):
        return Passage(id=str(rank), text=d, score=0.0, meta={})
    if not isinstance(d, Document):
        raise TypeError(f"documents[{rank}]: expected a Haystack Document or str, got {type(d).__name__}")
    return Passage(id=str(d.id), text=d.content or "", score=float(d.score) if d.score is not None else 0.0,
                   meta=dict(d.meta or {}))


# -------------------------------------------------------- rcn_fast -> Haystack
@component
class RcnRetriever(RcnRetrieverBase):
    """An rcn_fast retriever as a Haystack retriever component: ``retriever``
    and ``k`` (documents per query; ``top_k`` of a run overrides it) as in
    :class:`~rcn_fast.integrations.RcnRetrieverBase`."""

    def __init__(self, retriever: Any, k: int = 5) -> None:
        self._bind(retriever, k)

    @component.output_types(documents=list[Document])
    def run(self, query: str, top_k: int | None = None) -> dict[str, list[Document]]:
        """``{"documents": [...]}``: the top ``top_k`` (default ``k``) documents."""
        return {"documents": self.run_batch([query], top_k)["documents"][0]}

    def run_batch(self, queries: Sequence[str], top_k: int | None = None) -> dict[str, list[list[Document]]]:
        """``{"documents": [[...] per query]}`` from one batched retrieval
        (one encoder call for all queries)."""
        k = None if top_k is None else check_k(top_k, "top_k")
        return {"documents": [[to_document(p) for p in res] for res in self._retrieve_batch(queries, k)]}


@component
class RcnConnector:
    """ReConnect's knowledge connection as a Haystack component.

    Parameters
    ----------
    llm : rcn_fast LLM
    encoder : optional
        Embeds the question and the documents for the relevance sampler
        (an rcn_fast encoder or :func:`embedders_encoder` of Haystack
        embedders).
    **settings : ReConnectConfig fields (``num_subsets``, ...).

    ``run(query, documents, choices=None)``: ``choices`` make it a
    multiple-choice question; without them it is an open question
    (ReConnect's open-question prompts).
    """

    def __init__(self, llm: Any, encoder: Any = None, **settings: Any) -> None:
        self.llm, self.encoder, self.settings = llm, encoder, settings

    @component.output_types(explanation=str, documents=list[Document], connection=Any)
    def run(self, query: str, documents: list[Document], choices: list[str] | None = None) -> dict[str, Any]:
        """Connect ``documents`` for ``query``: ``{"explanation": str,
        "documents": [Document(explanation)], "connection": Connection}``."""
        return {k: v[0] for k, v in self.run_batch([query], [documents], None if choices is None else [choices])
                .items()}

    def run_batch(self, queries: Sequence[str], documents: Sequence[Sequence[Document]],
                  choices: Sequence[Sequence[str] | None] | None = None) -> dict[str, list[Any]]:
        """Many questions in one :func:`~rcn_fast.connect` call
        (one LLM call per stage for the batch); lists per question."""
        from rcn_fast.connection import connect

        qs = mc_or_open(queries, choices, per="query")
        if len(documents) != len(qs):
            raise ValueError(f"documents: expected one list per query ({len(qs)}), got {len(documents)}")
        conns = connect(qs, llm=self.llm, passages=[[to_passage(d, r) for r, d in enumerate(ds)] for ds in documents],
                        encoder=self.encoder, **self.settings)
        return {"explanation": [c.text for c in conns],
                "documents": [[Document(id=f"rcn-connection-{c.question_id}", content=c.text,
                                        meta={"rcn_fast": "connected explanation"})] for c in conns],
                "connection": conns}


# -------------------------------------------------------- Haystack -> rcn_fast
def embedders_encoder(text_embedder: Any, document_embedder: Any = None) -> CallableEncoder:
    """Haystack embedders as an rcn_fast encoder: queries through the text
    embedder (``run(text=...)["embedding"]``, one text per run: Haystack
    text embedders take one), passages through the document embedder
    (``run(documents=[...])``, one run for all; default: the text
    embedder per passage)."""
    if not callable(getattr(text_embedder, "run", None)):
        raise TypeError(f"text_embedder: expected a Haystack text embedder, got {type(text_embedder).__name__}")

    def queries(ts: list[str]) -> list[Any]:
        return [text_embedder.run(text=t)["embedding"] for t in ts]

    def passages(ts: list[str]) -> list[Any]:
        docs = document_embedder.run(documents=[Document(content=t) for t in ts])["documents"]
        return [d.embedding for d in docs]

    return CallableEncoder(queries, passages if document_embedder is not None else None,
                           name=type(text_embedder).__name__)


class HaystackSource(FrameworkSource):
    """A Haystack retriever component as an rcn_fast passage source.

    Parameters
    ----------
    retriever : Haystack retriever
        Run once per query with ``top_k=k``: with ``query_embedding=`` (an
        embedding retriever; then ``text_embedder`` is required) or with
        ``query=`` (BM25 and other text retrievers).
    text_embedder, document_embedder : Haystack embedders, optional
        Query / passage embeddings for the embedding retriever and the
        relevance sampler. Without them only ``sampling="random"``.
    """

    def __init__(self, retriever: Any, text_embedder: Any = None, document_embedder: Any = None) -> None:
        run = getattr(retriever, "run", None)
        if not callable(run):
            raise TypeError(f"retriever: expected a Haystack retriever component, got {type(retriever).__name__}")
        params = inspect.signature(run).parameters
        self.by_embedding = "query_embedding" in params
        if not self.by_embedding and "query" not in params:
            raise TypeError(f"retriever: {type(retriever).__name__}.run takes neither query nor query_embedding")
        if self.by_embedding and text_embedder is None:
            raise ValueError("text_embedder: an embedding retriever needs the text embedder of its queries")
        self.retriever = retriever
        self.encoder = embedders_encoder(text_embedder, document_embedder) if text_embedder is not None else None

    def retrieve(self, queries: Sequence[str], k: int = 5) -> list[list[Passage]]:
        queries, k = check_queries(queries), check_k(k)
        if not queries:
            return []
        out = []
        if self.by_embedding:
            emb = self.encoder.encode_queries(queries)
            for e in emb:
                docs = self.retriever.run(query_embedding=[float(x) for x in e], top_k=k)["documents"]
                out.append([to_passage(d, r) for r, d in enumerate(docs[:k])])
            return out
        for q in queries:
            docs = self.retriever.run(query=q, top_k=k)["documents"]
            out.append([to_passage(d, r) for r, d in enumerate(docs[:k])])
        return out


__all__ = ["RcnRetriever", "RcnConnector", "HaystackSource", "embedders_encoder", "to_document", "to_passage"]
