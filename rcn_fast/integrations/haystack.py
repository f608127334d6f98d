"""Haystack adapters (``pip install 'rcn_fast[haystack]'``: haystack-ai).

* :class:`RcnRetriever` -- an rcn_fast corpus store as a Haystack
  component: ``run(query=..., filters=None, top_k=None)`` (and
  ``run_async``) returns ``{"documents": [...]}``;
  :meth:`RcnRetriever.run_batch` answers many queries with one encoder call
  (Haystack components run one input at a time). It serialises (``to_dict``,
  ``Pipeline.dumps``) by the store's path and load settings.
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

import asyncio
import functools
import inspect
from typing import Any, Sequence

from rcn_fast.integrations import CallableEncoder, FrameworkSource, RcnRetrieverBase
from rcn_fast.integrations import check_k, check_queries, mc_or_open, require_framework
from rcn_fast.retrieval.types import Passage

require_framework("haystack")

from haystack import Document, component, default_from_dict, default_to_dict  # noqa: E402
from haystack.core.errors import SerializationError  # noqa: E402
from haystack.document_stores.types import FilterPolicy, apply_filter_policy  # noqa: E402
from haystack.utils.filters import document_matches_filter  # noqa: E402


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
#: The ``settings`` a serialised RcnRetriever reloads its store with
#: (:meth:`rcn_fast.retrieval.Retriever.load` keywords).
LOAD_SETTINGS = ("backend", "encoder_backend", "device", "check", "verify", "dedup", "faiss_factory", "nprobe",
                 "faiss_train_size", "faiss_index_dir")


def _load_spec(retriever: Any) -> tuple[str, dict[str, Any]]:
    """The store path and :data:`LOAD_SETTINGS` that reload ``retriever``
    (an rcn_fast Retriever whose encoder is the one its manifest names).

    Raises
    ------
    SerializationError
        A retriever that is not an rcn_fast store on disk, a faiss backend
        (its factory is not recorded: build with ``path=`` and
        ``settings=``), or an encoder the manifest cannot restore.
    """
    from rcn_fast.retrieval.retriever import Retriever

    name = type(retriever).__name__
    if not isinstance(retriever, Retriever):
        raise SerializationError(f"RcnRetriever: a {name} cannot be serialised (it is not a store on disk); "
                                 "serialise RcnRetriever(path=<store directory>) or Retriever.load(<store directory>)")
    if retriever.backend != "native":
        raise SerializationError("RcnRetriever: the faiss settings of this Retriever are not recorded; build it as "
                                 "RcnRetriever(path=..., settings={'backend': 'faiss', 'faiss_factory': ..., ...})")
    enc, m = retriever.encoder, retriever.store.manifest["encoder"]
    cfg = getattr(enc, "config", None)
    if not (type(enc).__module__.startswith("rcn_fast.retrieval") and cfg is not None and hasattr(enc, "describe")):
        raise SerializationError(f"RcnRetriever: the encoder {type(enc).__name__} is not an rcn_fast Encoder, so the "
                                 f"store manifest cannot restore it")
    have = enc.describe()
    diff = [k for k in ("fingerprint", "pooling", "normalize", "query_prefix", "passage_prefix", "dim")
            if have.get(k) != m.get(k)]
    if diff:
        raise SerializationError(f"RcnRetriever: the encoder differs from the one {retriever.store.path} was built "
                                 f"with ({', '.join(diff)}), so reloading the store would not restore it")
    settings: dict[str, Any] = {"dedup": bool(retriever.dedup)}
    if cfg.backend != m.get("backend"):
        settings["encoder_backend"] = cfg.backend
    if cfg.device is not None:
        settings["device"] = str(cfg.device)
    return str(retriever.store.path), settings


def _check_settings(settings: Any) -> dict[str, Any]:
    if settings is None:
        return {}
    if not isinstance(settings, dict):
        raise TypeError(f"settings: expected a dict of Retriever.load keywords, got {type(settings).__name__}")
    unknown = sorted(set(settings) - set(LOAD_SETTINGS))
    if unknown:
        raise ValueError(f"settings: unknown key(s) {unknown}; expected some of {list(LOAD_SETTINGS)}")
    bad = sorted(k for k, v in settings.items() if v is not None and not isinstance(v, (str, int, float, bool)))
    if bad:
        raise TypeError(f"settings: {bad} must be str, number, bool or None (they are serialised)")
    return dict(settings)


@component
class RcnRetriever(RcnRetrieverBase):
    """An rcn_fast retriever as a Haystack retriever component.

    Parameters
    ----------
    retriever : rcn_fast Retriever, optional
        The store to search (see
        :class:`~rcn_fast.integrations.RcnRetrieverBase`).
    k : int
        Documents per query (``top_k`` of a run overrides it).
    path : str, optional
        Instead of ``retriever``: a store directory, opened with
        :meth:`rcn_fast.retrieval.Retriever.load` and ``settings``.
    settings : dict, optional
        With ``path``: :data:`LOAD_SETTINGS` keywords of
        ``Retriever.load`` (``backend``, ``encoder_backend``, ``device``,
        ``dedup``, ``faiss_factory``, ``nprobe``, ...).
    filters : dict, optional
        Haystack filters (``{"field": "meta.row", "operator": "<", "value":
        10}``, ``{"operator": "AND", "conditions": [...]}``) on the
        documents' ``id``, ``content``, ``score`` and ``meta`` (an rcn_fast
        store gives ``meta.row``). A run returns the top ``k`` documents
        that match, as if the store held only those: the search is widened
        until ``k`` match or the store is exhausted.
    filter_policy : FilterPolicy or str
        How a run's ``filters`` combine with these (Haystack's ``replace``,
        the default, or ``merge``).

    Notes
    -----
    ``to_dict``/``from_dict`` (and so ``Pipeline.dumps``/``loads``)
    serialise the store by its path and load settings and reopen it with
    ``Retriever.load``: the encoder is the one the store's manifest names
    (an rcn_fast Encoder; a retriever over texts in memory, or with another
    encoder, raises ``SerializationError``). Haystack loads classes only
    from trusted modules: ``Pipeline.loads(text,
    allowed_modules=["rcn_fast.integrations.haystack"])`` (or Haystack's
    ``HAYSTACK_DESERIALIZATION_ALLOWLIST``); rcn_fast does not widen that
    allowlist itself. ``run_async`` runs ``run`` in an executor (Haystack's
    ``AsyncPipeline``).
    """

    def __init__(self, retriever: Any = None, k: int = 5, *, path: str | None = None,
                 settings: dict[str, Any] | None = None, filters: dict[str, Any] | None = None,
                 filter_policy: FilterPolicy | str = FilterPolicy.REPLACE) -> None:
        if (retriever is None) == (path is None):
            raise ValueError("retriever, path: give exactly one (an rcn_fast Retriever, or a store directory)")
        self.path, self.settings = (None if path is None else str(path)), _check_settings(settings)
        if path is not None:
            from rcn_fast.retrieval.retriever import Retriever

            retriever = Retriever.load(path, **self.settings)
        elif self.settings:
            raise ValueError("settings: only with path= (a Retriever given is used as it is)")
        self._bind(retriever, k)
        if filters is not None and not isinstance(filters, dict):
            raise TypeError(f"filters: expected a Haystack filter dict, got {type(filters).__name__}")
        self.filters = filters
        self.filter_policy = filter_policy if isinstance(filter_policy, FilterPolicy) else \
            FilterPolicy.from_str(str(filter_policy))

    def to_dict(self) -> dict[str, Any]:
        """Haystack serialisation: the store's path and load settings, ``k``,
        ``filters`` and ``filter_policy`` (SerializationError for a
        retriever that cannot be reopened from a path)."""
        path, settings = (self.path, self.settings) if self.path is not None else _load_spec(self.retriever)
        return default_to_dict(self, path=path, settings=settings, k=self.k, filters=self.filters,
                               filter_policy=self.filter_policy.value)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "RcnRetriever":
        """Reopen the store of :meth:`to_dict`'s ``path`` with its settings."""
        init = data.get("init_parameters", {})
        if "filter_policy" in init:
            init["filter_policy"] = FilterPolicy.from_str(init["filter_policy"])
        return default_from_dict(cls, data)

    @component.output_types(documents=list[Document])
    def run(self, query: str, filters: dict[str, Any] | None = None, top_k: int | None = None) -> dict[str, Any]:
        """``{"documents": [...]}``: the top ``top_k`` (default ``k``)
        documents matching the filters (see the class docstring)."""
        return {"documents": self.run_batch([query], filters, top_k)["documents"][0]}

    @component.output_types(documents=list[Document])
    async def run_async(self, query: str, filters: dict[str, Any] | None = None,
                        top_k: int | None = None) -> dict[str, Any]:
        """:meth:`run` in an executor (for ``AsyncPipeline``)."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(None, functools.partial(self.run, query, filters, top_k))

    def run_batch(self, queries: Sequence[str], filters: dict[str, Any] | None = None,
                  top_k: int | None = None) -> dict[str, list[list[Document]]]:
        """``{"documents": [[...] per query]}`` from one batched retrieval
        (one encoder call for all queries)."""
        k = None if top_k is None else check_k(top_k, "top_k")
        if filters is not None and not isinstance(filters, dict):
            raise TypeError(f"filters: expected a Haystack filter dict, got {type(filters).__name__}")
        active = apply_filter_policy(self.filter_policy, self.filters, filters)
        keep = None if not active else (lambda p: document_matches_filter(active, to_document(p)))
        return {"documents": [[to_document(p) for p in res] for res in self._retrieve_batch(queries, k, keep)]}


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


__all__ = ["RcnRetriever", "RcnConnector", "HaystackSource", "embedders_encoder", "to_document", "to_passage",
           "LOAD_SETTINGS"]
