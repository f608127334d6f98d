"""LangChain adapters (``pip install 'rcn_fast[langchain]'``: langchain-core).

* :class:`RcnRetriever` -- an rcn_fast corpus store as a LangChain
  ``BaseRetriever``: ``invoke(query)`` / ``batch(queries)`` return
  ``Document`` lists; ``batch`` makes one encoder call for all queries.
* :class:`RcnConnect` -- knowledge connection as a LangChain ``Runnable``:
  ``{"question", "choices", "documents"}`` in, the same dict plus
  ``"explanation"`` (str) and ``"connection"``
  (:class:`rcn_fast.connection.Connection`) out; ``batch`` is one
  :func:`rcn_fast.connect` call.
* :class:`LangChainSource` -- a LangChain retriever (and ``Embeddings``)
  as an rcn_fast passage source.

Examples
--------
>>> from rcn_fast.integrations.langchain import RcnRetriever, RcnConnect   # doctest: +SKIP
>>> retriever = RcnRetriever(retriever=Retriever.load("store/"), k=4)
>>> chain = {"question": lambda x: x["question"], "choices": lambda x: x["choices"],
...          "documents": lambda x: retriever.invoke(x["question"])} | RcnConnect(llm=llm, encoder=encoder)
>>> chain.invoke({"question": "What do plants need?", "choices": ["light", "salt"]})["explanation"]
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from rcn_fast.integrations import CallableEncoder, FrameworkSource, RcnRetrieverBase
from rcn_fast.integrations import check_k, check_queries, require_framework
from rcn_fast.retrieval.types import Passage

require_framework("langchain_core")

from langchain_core.callbacks import (  # noqa: E402
    AsyncCallbackManagerForRetrieverRun,
    CallbackManager,
    CallbackManagerForRetrieverRun,
)
from langchain_core.documents import Document  # noqa: E402
from langchain_core.retrievers import BaseRetriever  # noqa: E402
from langchain_core.runnables import Runnable, RunnableConfig  # noqa: E402
from langchain_core.runnables.config import ensure_config, get_config_list, run_in_executor  # noqa: E402
from pydantic import ConfigDict, Field  # noqa: E402

#: The search keywords RcnRetriever takes (in ``search_kwargs`` or per call).
_SEARCH_KEYS = frozenset({"k"})


def to_document(p: Passage) -> Document:
    """:class:`Passage` -> ``Document`` (id, and ``score``/``id``/the
    passage meta in ``metadata``)."""
    return Document(page_content=p.text, metadata={**p.meta, "id": p.id, "score": p.score}, id=p.id)


def to_passage(doc: Any, rank: int) -> Passage:
    """``Document`` (or str) -> :class:`Passage`: id from ``doc.id`` or
    ``metadata["id"]`` (else the rank), score from ``metadata["score"]``."""
    if isinstance(doc, str):
        return Passage(id=str(rank), text=doc, score=0.0, meta={})
    if not hasattr(doc, "page_content"):
        raise TypeError(f"documents[{rank}]: expected a LangChain Document or str, got {type(doc).__name__}")
    meta = dict(doc.metadata or {})
    pid = doc.id if getattr(doc, "id", None) else meta.get("id", rank)
    score = meta.get("score", 0.0)
    return Passage(id=str(pid), text=doc.page_content, score=float(score) if score is not None else 0.0, meta=meta)


# ------------------------------------------------------- rcn_fast -> LangChain
class RcnRetriever(BaseRetriever, RcnRetrieverBase):
    """An rcn_fast retriever as a LangChain retriever: ``retriever`` and
    ``k`` (documents per query) as in
    :class:`~rcn_fast.integrations.RcnRetrieverBase`.

    Parameters
    ----------
    retriever : rcn_fast Retriever
    k : int
        Documents per query (default 5).
    search_kwargs : dict, optional
        LangChain's spelling (``as_retriever(search_kwargs={"k": 1})``):
        ``{"k": n}`` sets ``k``; any other key is a ValueError (nothing is
        dropped silently).

    Notes
    -----
    ``invoke(query, k=n)`` and ``batch(queries, k=n)`` override ``k`` for
    that call, as LangChain's vector-store retrievers take their search
    keywords. ``batch(queries)`` runs one ``retriever.retrieve(queries, k)``
    (one encoder call, one index search), with LangChain's retriever
    callbacks for every query; ``abatch`` runs that in an executor.
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)

    retriever: Any
    k: int = 5
    search_kwargs: dict[str, Any] = Field(default_factory=dict)

    def model_post_init(self, __context: Any) -> None:
        unknown = sorted(set(self.search_kwargs) - _SEARCH_KEYS)
        if unknown:
            raise ValueError(f"search_kwargs: unknown key(s) {unknown}; RcnRetriever takes {sorted(_SEARCH_KEYS)}")
        k = self.k
        if "k" in self.search_kwargs:
            sk = check_k(self.search_kwargs["k"], "search_kwargs['k']")
            if "k" in self.model_fields_set and self.k != sk:
                raise ValueError(f"k, search_kwargs: k={self.k} and search_kwargs['k']={sk} disagree; give one")
            k = sk
        self._bind(self.retriever, k)

    def _call_k(self, kwargs: dict[str, Any]) -> int | None:
        """The ``k`` of one call (None: the bound one); other keywords are a TypeError."""
        unknown = sorted(set(kwargs) - _SEARCH_KEYS - {"verbose"})
        if unknown:
            raise TypeError(f"unexpected keyword argument(s) {unknown}; RcnRetriever takes {sorted(_SEARCH_KEYS)}")
        return None if kwargs.get("k") is None else check_k(kwargs["k"])

    def _get_relevant_documents(self, query: str, *, run_manager: CallbackManagerForRetrieverRun,
                                **kwargs: Any) -> list[Document]:
        return [to_document(p) for p in self._retrieve_batch([query], self._call_k(kwargs))[0]]

    async def _aget_relevant_documents(self, query: str, *, run_manager: AsyncCallbackManagerForRetrieverRun,
                                       **kwargs: Any) -> list[Document]:
        """:meth:`_get_relevant_documents` in an executor (``ainvoke(q, k=n)``)."""
        return await run_in_executor(None, self._get_relevant_documents, query,
                                     run_manager=run_manager.get_sync(), **kwargs)

    def batch(self, inputs: list[str], config: RunnableConfig | list[RunnableConfig] | None = None, *,
              return_exceptions: bool = False, **kwargs: Any) -> list[list[Document]]:
        """Documents for every query, from one batched retrieval (``k=``
        overrides ``k`` for the call)."""
        queries = check_queries(inputs)
        k = self._call_k(kwargs)
        if not queries:
            return []
        configs = get_config_list(config, len(queries))
        managers = []
        for q, cfg in zip(queries, configs):
            cfg = ensure_config(cfg)
            cm = CallbackManager.configure(cfg.get("callbacks"), None, verbose=kwargs.get("verbose", False),
                                           inheritable_tags=cfg.get("tags"), local_tags=self.tags,
                                           inheritable_metadata=cfg.get("metadata") or {},
                                           local_metadata=self.metadata)
            managers.append(cm.on_retriever_start(None, q, name=cfg.get("run_name") or self.get_name()))
        try:
            results = self._retrieve_batch(queries, k)
        except Exception as exc:
            for rm in managers:
                rm.on_retriever_error(exc)
            if return_exceptions:
                return [exc for _ in queries]  # type: ignore[misc]
            raise
        out = [[to_document(p) for p in res] for res in results]
        for rm, docs in zip(managers, out):
            rm.on_retriever_end(docs)
        return out

    async def abatch(self, inputs: list[str], config: RunnableConfig | list[RunnableConfig] | None = None, *,
                     return_exceptions: bool = False, **kwargs: Any) -> list[list[Document]]:
        """:meth:`batch` in an executor (still one encoder call)."""
        return await run_in_executor(None, self.batch, inputs, config, return_exceptions=return_exceptions,
                                     **kwargs)


def _connect_inputs(items: Sequence[Any]) -> tuple[list[Any], list[Any] | None]:
    """Runnable inputs -> (questions for connect, documents per question or None)."""
    from rcn_fast.data import MCQuestion

    questions, docs = [], []
    for i, x in enumerate(items):
        if isinstance(x, (str, MCQuestion)):
            questions.append(x)
            docs.append(None)
            continue
        if not isinstance(x, Mapping) or "question" not in x:
            raise TypeError(f"input[{i}]: expected a mapping with 'question' (and 'choices', 'documents'), an "
                            f"MCQuestion or a str, got {type(x).__name__}")
        q = x["question"]
        if isinstance(q, MCQuestion):
            questions.append(q)
        else:
            questions.append({k: x[k] for k in ("question", "choices", "labels", "id", "answer") if k in x})
        docs.append(x.get("documents"))
    given = [d is not None for d in docs]
    if any(given) and not all(given):
        raise ValueError("documents: give 'documents' for every input of a batch or for none")
    return questions, ([[to_passage(d, r) for r, d in enumerate(ds)] for ds in docs] if all(given) else None)


class RcnConnect(Runnable):
    """ReConnect's knowledge connection as a LangChain Runnable.

    Parameters
    ----------
    llm : rcn_fast LLM
    retriever : optional
        A passage source for inputs without ``documents`` (an rcn_fast
        Retriever, :class:`LangChainSource`, ...): full ReConnect.
    encoder : optional
        Embeds questions and given documents for the relevance sampler (an
        rcn_fast encoder, or ``LangChainSource.embeddings_encoder(...)``).
    config : ReConnectConfig, optional
    **settings : ReConnectConfig fields.

    Input: a mapping ``{"question": str, "choices": [...], "documents":
    [Document, ...]}`` (``documents`` optional with a ``retriever``), or
    an :class:`~rcn_fast.data.MCQuestion`. Output: the input mapping plus
    ``"explanation"`` (the connected explanation, one item per line) and
    ``"connection"`` (:class:`rcn_fast.connection.Connection`).
    """

    def __init__(self, llm: Any, *, retriever: Any = None, encoder: Any = None, config: Any = None,
                 prompts: Any = None, **settings: Any) -> None:
        self.llm, self.retriever, self.encoder = llm, retriever, encoder
        self.config, self.prompts, self.settings = config, prompts, settings

    def _run(self, inputs: list[Any]) -> list[dict[str, Any]]:
        from rcn_fast.connection import connect

        questions, given = _connect_inputs(inputs)
        if given is None and self.retriever is None:
            raise ValueError("documents: inputs carry no 'documents' and RcnConnect has no retriever")
        conns = connect(questions, llm=self.llm, retriever=None if given is not None else self.retriever,
                        passages=given, encoder=self.encoder if given is not None else None, config=self.config,
                        prompts=self.prompts, **self.settings)
        out = []
        for x, c in zip(inputs, conns):
            base = dict(x) if isinstance(x, Mapping) else {"question": x}
            out.append({**base, "explanation": c.text, "connection": c})
        return out

    @staticmethod
    def _no_kwargs(kwargs: dict[str, Any]) -> None:
        if kwargs:
            raise TypeError(f"unexpected keyword argument(s) {sorted(kwargs)}; RcnConnect's settings are given "
                            "when it is built")

    def invoke(self, input: Any, config: RunnableConfig | None = None, **kwargs: Any) -> dict[str, Any]:
        """One input -> its connected explanation (see the class docstring),
        as one chain run: ``config``'s callbacks, tags, metadata and
        ``run_name`` see it (``on_chain_start`` / ``on_chain_end``)."""
        self._no_kwargs(kwargs)
        return self._call_with_config(lambda x: self._run([x])[0], input, config, run_type="chain")

    def batch(self, inputs: list[Any], config: RunnableConfig | list[RunnableConfig] | None = None, *,
              return_exceptions: bool = False, **kwargs: Any) -> list[dict[str, Any]]:
        """All inputs in one :func:`~rcn_fast.connect` call (one LLM
        call per stage for the whole batch), one chain run per input for
        the callbacks."""
        self._no_kwargs(kwargs)
        if not inputs:
            return []
        return self._batch_with_config(lambda xs: self._run(list(xs)), list(inputs), config,
                                       return_exceptions=return_exceptions, run_type="chain")

    async def abatch(self, inputs: list[Any], config: RunnableConfig | list[RunnableConfig] | None = None, *,
                     return_exceptions: bool = False, **kwargs: Any) -> list[dict[str, Any]]:
        """:meth:`batch` in an executor (still one ``connect`` call)."""
        return await run_in_executor(None, self.batch, inputs, config, return_exceptions=return_exceptions,
                                     **kwargs)


# ------------------------------------------------------- LangChain -> rcn_fast
def embeddings_encoder(embeddings: Any) -> CallableEncoder:
    """A LangChain ``Embeddings`` as an rcn_fast encoder: queries through
    ``embed_query`` (one at a time: LangChain has no batch query call),
    passages through ``embed_documents``."""
    if not (hasattr(embeddings, "embed_query") and hasattr(embeddings, "embed_documents")):
        raise TypeError(f"embeddings: expected a LangChain Embeddings (embed_query, embed_documents), got "
                        f"{type(embeddings).__name__}")
    return CallableEncoder(lambda ts: [embeddings.embed_query(t) for t in ts], embeddings.embed_documents,
                           name=type(embeddings).__name__)


class LangChainSource(FrameworkSource):
    """A LangChain retriever as an rcn_fast passage source.

    Parameters
    ----------
    retriever : langchain_core.retrievers.BaseRetriever
        Queried with ``batch(queries)``; each list is cut to the ``k`` the
        pipeline asks for (a LangChain retriever fixes its own count: set
        it to at least ReConnect's ``top_n``).
    embeddings : langchain_core.embeddings.Embeddings, optional
        For the relevance sampler (questions and passages are embedded
        with it). None: only ``sampling="random"``.
    """

    def __init__(self, retriever: Any, embeddings: Any = None) -> None:
        if not hasattr(retriever, "batch") or not hasattr(retriever, "invoke"):
            raise TypeError(f"retriever: expected a LangChain retriever, got {type(retriever).__name__}")
        self.retriever = retriever
        self.encoder = embeddings_encoder(embeddings) if embeddings is not None else None

    def retrieve(self, queries: Sequence[str], k: int = 5) -> list[list[Passage]]:
        queries, k = check_queries(queries), check_k(k)
        if not queries:
            return []
        return [[to_passage(d, r) for r, d in enumerate(list(docs)[:k])] for docs in self.retriever.batch(queries)]


__all__ = ["RcnRetriever", "RcnConnect", "LangChainSource", "embeddings_encoder", "to_document", "to_passage"]
