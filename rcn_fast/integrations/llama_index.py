"""LlamaIndex adapters (``pip install 'rcn_fast[llama-index]'``:
llama-index-core).

* :class:`RcnRetriever` -- an rcn_fast corpus store as a LlamaIndex
  ``BaseRetriever``: ``retrieve(query)`` returns ``NodeWithScore``s;
  :meth:`RcnRetriever.retrieve_batch` answers many queries with one encoder
  call.
* :class:`RcnConnectPostprocessor` -- knowledge connection as a node
  postprocessor: the retrieved nodes in, one node holding the connected
  explanation out (optionally followed by the nodes it was built from).
  Multiple-choice questions carry their choices in an :class:`MCQueryBundle`.
* :class:`LlamaIndexSource` -- a LlamaIndex retriever (and embedding model)
  as an rcn_fast passage source.

Examples
--------
>>> from rcn_fast.integrations.llama_index import RcnRetriever, RcnConnectPostprocessor, MCQueryBundle  # doctest: +SKIP
>>> retriever = RcnRetriever(retriever=Retriever.load("store/"), k=4)
>>> q = MCQueryBundle("What do plants need?", choices=["light", "salt"])
>>> nodes = RcnConnectPostprocessor(llm=llm, encoder=encoder).postprocess_nodes(retriever.retrieve(q), q)
>>> nodes[0].node.get_content()
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

from rcn_fast.integrations import CallableEncoder, FrameworkSource, RcnRetrieverBase
from rcn_fast.integrations import check_k, check_queries, require_framework
from rcn_fast.retrieval.types import Passage

require_framework("llama_index.core")

from llama_index.core.bridge.pydantic import ConfigDict, Field, PrivateAttr  # noqa: E402
from llama_index.core.postprocessor.types import BaseNodePostprocessor  # noqa: E402
from llama_index.core.retrievers import BaseRetriever  # noqa: E402
from llama_index.core.schema import NodeWithScore, QueryBundle, TextNode  # noqa: E402


@dataclass
class MCQueryBundle(QueryBundle):
    """A ``QueryBundle`` with the choices of a multiple-choice question
    (``choices``; ``labels`` default A, B, ...; ``question_id``)."""

    choices: list[str] = field(default_factory=list)
    labels: list[str] | None = None
    question_id: str | None = None


def to_node(p: Passage) -> NodeWithScore:
    """:class:`Passage` -> ``NodeWithScore`` (node id = passage id, the
    passage meta in the node metadata)."""
    return NodeWithScore(node=TextNode(text=p.text, id_=p.id, metadata=dict(p.meta)), score=p.score)


def to_passage(n: Any, rank: int) -> Passage:
    """``NodeWithScore`` / node / str -> :class:`Passage`."""
    if isinstance(n, str):
        return Passage(id=str(rank), text=n, score=0.0, meta={})
    node = getattr(n, "node", n)
    if not hasattr(node, "get_content"):
        raise TypeError(f"nodes[{rank}]: expected a LlamaIndex NodeWithScore or node, got {type(n).__name__}")
    score = getattr(n, "score", None)
    return Passage(id=str(node.node_id), text=node.get_content(), score=float(score) if score is not None else 0.0,
                   meta=dict(getattr(node, "metadata", None) or {}))


def _query_str(q: str | QueryBundle) -> str:
    if isinstance(q, QueryBundle):
        return q.query_str
    if isinstance(q, str):
        return q
    raise TypeError(f"query: expected a str or QueryBundle, got {type(q).__name__}")


# ------------------------------------------------------ rcn_fast -> LlamaIndex
class RcnRetriever(BaseRetriever, RcnRetrieverBase):
    """An rcn_fast retriever as a LlamaIndex retriever: ``retriever`` and
    ``k`` (nodes per query) as in
    :class:`~rcn_fast.integrations.RcnRetrieverBase`; ``kwargs`` go to
    LlamaIndex's ``BaseRetriever``."""

    def __init__(self, retriever: Any, k: int = 5, **kwargs: Any) -> None:
        self._bind(retriever, k)
        super().__init__(**kwargs)

    def _retrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        return [to_node(p) for p in self._retrieve_batch([query_bundle.query_str])[0]]

    def retrieve_batch(self, queries: Sequence[str | QueryBundle]) -> list[list[NodeWithScore]]:
        """Nodes for many queries from one batched retrieval (one encoder
        call; LlamaIndex's ``retrieve`` takes one query at a time)."""
        if isinstance(queries, (str, QueryBundle)):
            raise TypeError("queries: expected a sequence of queries (batch first), got a single query")
        return [[to_node(p) for p in res] for res in self._retrieve_batch([_query_str(q) for q in queries])]


class RcnConnectPostprocessor(BaseNodePostprocessor):
    """ReConnect's knowledge connection as a LlamaIndex node postprocessor.

    ``postprocess_nodes(nodes, query_bundle)`` connects the nodes for the
    query and returns one ``TextNode`` holding the connected explanation
    (metadata: ``rcn_fast_connection``, the :meth:`Connection.to_dict`),
    followed by the input nodes when ``keep_nodes``. The question's choices
    come from an :class:`MCQueryBundle`; a plain query (no choices) is an
    open question (ReConnect's open-question prompts).

    Parameters
    ----------
    llm : rcn_fast LLM
    encoder : optional
        Embeds the question and the nodes for the relevance sampler (an
        rcn_fast encoder or :func:`embedding_encoder` of a LlamaIndex
        embedding model).
    keep_nodes : bool
    settings : dict
        ReConnectConfig fields (``num_subsets``, ``sampling``, ...).
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)
    llm: Any = Field(description="rcn_fast LLM")
    encoder: Any = Field(default=None, description="rcn_fast encoder for the relevance sampler")
    keep_nodes: bool = False
    settings: dict = Field(default_factory=dict)
    _last: list = PrivateAttr(default_factory=list)

    @classmethod
    def class_name(cls) -> str:
        return "RcnConnectPostprocessor"

    def _postprocess_nodes(self, nodes: list[NodeWithScore],
                           query_bundle: QueryBundle | None = None) -> list[NodeWithScore]:
        from rcn_fast.connection import connect

        if query_bundle is None:
            raise ValueError("query_bundle: knowledge connection needs the question (pass query_bundle or "
                             "query_str)")
        q: Any
        if getattr(query_bundle, "choices", None):
            q = {"question": query_bundle.query_str, "choices": list(query_bundle.choices),
                 "labels": getattr(query_bundle, "labels", None), "id": getattr(query_bundle, "question_id", None)
                 or "q0"}
            q = {k: v for k, v in q.items() if v is not None}
        else:
            q = query_bundle.query_str
        conn = connect([q], llm=self.llm, passages=[[to_passage(n, r) for r, n in enumerate(nodes)]],
                       encoder=self.encoder, **self.settings)[0]
        self._last = [conn]
        head = NodeWithScore(node=TextNode(text=conn.text, id_=f"rcn-connection-{conn.question_id}",
                                           metadata={"rcn_fast_connection": conn.to_dict()},
                                           excluded_llm_metadata_keys=["rcn_fast_connection"],
                                           excluded_embed_metadata_keys=["rcn_fast_connection"]), score=1.0)
        return [head, *nodes] if self.keep_nodes else [head]

    @property
    def last_connection(self) -> Any:
        """The :class:`rcn_fast.connection.Connection` of the last call."""
        return self._last[0] if self._last else None


# ------------------------------------------------------ LlamaIndex -> rcn_fast
def embedding_encoder(embed_model: Any) -> CallableEncoder:
    """A LlamaIndex embedding model as an rcn_fast encoder: queries through
    ``get_query_embedding`` (one at a time: LlamaIndex has no batch query
    call), passages through ``get_text_embedding_batch``."""
    if not (hasattr(embed_model, "get_query_embedding") and hasattr(embed_model, "get_text_embedding_batch")):
        raise TypeError(f"embed_model: expected a LlamaIndex embedding model, got {type(embed_model).__name__}")
    return CallableEncoder(lambda ts: [embed_model.get_query_embedding(t) for t in ts],
                           embed_model.get_text_embedding_batch, name=type(embed_model).__name__)


class LlamaIndexSource(FrameworkSource):
    """A LlamaIndex retriever as an rcn_fast passage source.

    Parameters
    ----------
    retriever : llama_index.core.retrievers.BaseRetriever
        Queried once per query (LlamaIndex retrievers take one query); each
        list is cut to the ``k`` the pipeline asks for (set the retriever's
        own ``similarity_top_k`` to at least ReConnect's ``top_n``).
    embed_model : llama_index.core BaseEmbedding, optional
        For the relevance sampler. None: only ``sampling="random"``.
    """

    def __init__(self, retriever: Any, embed_model: Any = None) -> None:
        if not callable(getattr(retriever, "retrieve", None)):
            raise TypeError(f"retriever: expected a LlamaIndex retriever, got {type(retriever).__name__}")
        self.retriever = retriever
        self.encoder = embedding_encoder(embed_model) if embed_model is not None else None

    def retrieve(self, queries: Sequence[str], k: int = 5) -> list[list[Passage]]:
        queries, k = check_queries(queries), check_k(k)
        return [[to_passage(n, r) for r, n in enumerate(self.retriever.retrieve(q)[:k])] for q in queries]


__all__ = ["RcnRetriever", "RcnConnectPostprocessor", "MCQueryBundle", "LlamaIndexSource", "embedding_encoder",
           "to_node", "to_passage"]
