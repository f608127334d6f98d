"""DSPy adapters (``pip install 'rcn_fast[dspy]'``: dspy).

* :class:`RcnRetriever` -- an rcn_fast corpus store as a DSPy retriever
  module: ``retriever(query)`` returns ``dspy.Prediction(passages=[...],
  ids=[...], scores=[...], indices=[...])`` like
  ``dspy.retrievers.Embeddings``; a list of queries gives one Prediction per
  query from one encoder call.
* :class:`RcnConnect` -- knowledge connection as a DSPy module:
  ``forward(question, choices=..., passages=...)`` returns
  ``dspy.Prediction(explanation=str, knowledge=[...], connection=...,
  passages=[...], ids=[...], scores=[...])``; ``passages`` may be a
  retriever's Prediction (``retrieve(q)``), whose ids and scores the
  connection keeps;
  :meth:`RcnConnect.forward_batch` runs many questions in one
  :func:`rcn_fast.connect` call.
* :class:`DSPySource` -- a DSPy retriever (``dspy.retrievers.Embeddings`` or
  any ``query -> passages`` callable) and its embedder as an rcn_fast
  passage source.

The LLM of the connection stages is an rcn_fast LLM
(:func:`rcn_fast.llm.load_llm`), not a ``dspy.LM``. DSPy copies modules
while it optimises (``module.deepcopy()``): the copies share the LLM, the
retriever and the encoder (models and indexes, not parameters), and copy the
rest.

Examples
--------
>>> import dspy                                                                 # doctest: +SKIP
>>> from rcn_fast.integrations.dspy import RcnRetriever, RcnConnect
>>> retrieve = RcnRetriever(retriever=Retriever.load("store/"), k=4)
>>> connect = RcnConnect(llm=llm, encoder=encoder)
>>> q = "What do plants need?"
>>> connect(question=q, choices=["light", "salt"], passages=retrieve(q)).explanation
"""

from __future__ import annotations

from typing import Any, Sequence

import copy

import numpy as np

from rcn_fast.integrations import CallableEncoder, FrameworkSource, RcnRetrieverBase
from rcn_fast.integrations import check_k, check_queries, mc_or_open, require_framework
from rcn_fast.retrieval.types import Passage

dspy = require_framework("dspy")


def _prediction(res: list[Passage]) -> Any:
    return dspy.Prediction(passages=[p.text for p in res], ids=[p.id for p in res], scores=[p.score for p in res],
                           indices=[p.meta.get("row") for p in res])


def passages_of_prediction(pred: Any, where: str = "passages") -> list[Passage]:
    """A DSPy retriever's Prediction -> :class:`Passage` list, keeping what it
    carries: ``passages`` (texts), ids from ``ids`` (:class:`RcnRetriever`)
    or ``indices`` (``dspy.retrievers.Embeddings``; also kept as
    ``meta["row"]``), ``scores`` (0.0 where absent)."""
    raw = getattr(pred, "passages", None)
    texts = [] if raw is None else [str(t) for t in raw]
    n = len(texts)
    ids, indices, scores = (getattr(pred, key, None) for key in ("ids", "indices", "scores"))
    for key, col in (("ids", ids), ("indices", indices), ("scores", scores)):
        if col is not None and len(col) != n:
            raise ValueError(f"{where}: the Prediction holds {n} passages but {len(col)} {key}")
    out = []
    for r, text in enumerate(texts):
        row = None if indices is None else indices[r]
        pid = ids[r] if ids is not None else (row if row is not None else r)
        score = 0.0 if scores is None or scores[r] is None else float(scores[r])
        out.append(Passage(id=str(pid), text=text, score=score, meta={} if row is None else {"row": int(row)}))
    return out


def _given(items: Any, where: str) -> Any:
    """One question's passages: a retriever Prediction (ids and scores
    kept) or a list of str / Passage / ``{"text", ...}``."""
    if isinstance(items, dspy.Prediction):
        return passages_of_prediction(items, where)
    if isinstance(items, (str, dict)):
        raise TypeError(f"{where}: expected a list of passages or a retriever's dspy.Prediction, got a single "
                        f"{type(items).__name__}")
    return list(items)


class _SharesResources:
    """``copy.deepcopy`` (what ``dspy.Module.deepcopy`` tries first) shares
    the attributes named in ``_shared`` (the LLM, retriever, encoder: models
    and indexes, which cannot or should not be copied) and deep-copies the
    rest, so DSPy's optimisers copy these modules without a warning."""

    _shared: tuple[str, ...] = ()

    def __deepcopy__(self, memo: dict[int, Any]) -> Any:
        new = self.__class__.__new__(self.__class__)
        memo[id(self)] = new
        for key, value in self.__dict__.items():
            object.__setattr__(new, key, value if key in self._shared else copy.deepcopy(value, memo))
        return new


# ------------------------------------------------------------ rcn_fast -> DSPy
class RcnRetriever(_SharesResources, dspy.Module, RcnRetrieverBase):
    """An rcn_fast retriever as a DSPy retriever module: ``retriever`` and
    ``k`` (passages per query) as in
    :class:`~rcn_fast.integrations.RcnRetrieverBase`. Copies share the
    retriever."""

    _shared = ("retriever",)

    def __init__(self, retriever: Any, k: int = 5) -> None:
        super().__init__()
        self._bind(retriever, k)

    def forward(self, query: str | Sequence[str], k: int | None = None) -> Any:
        """One query -> ``dspy.Prediction(passages, ids, scores,
        indices)``; a list of queries -> a list of them, from one batched
        retrieval (one encoder call)."""
        kk = self.k if k is None else check_k(k)
        if isinstance(query, str):
            return _prediction(self._retrieve_batch([query], kk)[0])
        return [_prediction(res) for res in self._retrieve_batch(query, kk)]


class RcnConnect(_SharesResources, dspy.Module):
    """ReConnect's knowledge connection as a DSPy module (copies share the
    LLM, the retriever and the encoder).

    Parameters
    ----------
    llm : rcn_fast LLM
    retriever : optional
        Passage source for questions given without passages (full
        ReConnect): an rcn_fast Retriever or a :class:`DSPySource`.
    encoder : optional
        Embeds questions and given passages for the relevance sampler (an
        rcn_fast encoder or :func:`embedder_encoder` of a ``dspy.Embedder``).
    **settings : ReConnectConfig fields.
    """

    _shared = ("llm", "source", "encoder")

    def __init__(self, llm: Any, retriever: Any = None, encoder: Any = None, **settings: Any) -> None:
        super().__init__()
        self.llm, self.source, self.encoder, self.settings = llm, retriever, encoder, settings

    def forward(self, question: str, choices: Sequence[str] | None = None, passages: Any = None) -> Any:
        """``dspy.Prediction(explanation, knowledge, connection, passages,
        ids, scores)`` for one question (``choices`` make it multiple
        choice; without them it is an open question, connected with
        ReConnect's open-question prompts). ``passages``: a retriever's
        Prediction (``RcnRetriever(...)(q)``: its ids and scores are kept)
        or a list of str / :class:`Passage`; ``passages``/``ids``/``scores``
        of the result are the connection's pool."""
        return self.forward_batch([question], None if choices is None else [choices],
                                  None if passages is None else [passages])[0]

    def forward_batch(self, questions: Sequence[str], choices: Sequence[Sequence[str] | None] | None = None,
                      passages: Sequence[Any] | None = None) -> list[Any]:
        """Many questions in one :func:`~rcn_fast.connect` call (one
        LLM call per stage). ``passages``: per question, a retriever's
        Prediction (e.g. ``RcnRetriever(...)(q)``, ids and scores kept) or
        str / :class:`Passage` items."""
        from rcn_fast.connection import connect

        qs = mc_or_open(questions, choices)
        if passages is None:
            if self.source is None:
                raise ValueError("passages: none given and RcnConnect has no retriever")
            conns = connect(qs, llm=self.llm, retriever=self.source, **self.settings)
        else:
            if isinstance(passages, (str, dspy.Prediction)) or len(passages) != len(qs):
                raise ValueError(f"passages: expected one list (or retriever Prediction) per question ({len(qs)})")
            given = [_given(p, f"passages[{b}]") for b, p in enumerate(passages)]
            conns = connect(qs, llm=self.llm, passages=given, encoder=self.encoder, **self.settings)
        return [dspy.Prediction(explanation=c.text, knowledge=list(c.explanation), connection=c,
                                passages=[p.text for p in c.passages], ids=[p.id for p in c.passages],
                                scores=[p.score for p in c.passages]) for c in conns]


# ------------------------------------------------------------ DSPy -> rcn_fast
def embedder_encoder(embedder: Any) -> CallableEncoder:
    """A ``dspy.Embedder`` (or any ``list[str] -> [n, d]`` callable) as an
    rcn_fast encoder (the same function for queries and passages, one call
    per batch)."""
    if not callable(embedder):
        raise TypeError(f"embedder: expected a dspy.Embedder or a callable, got {type(embedder).__name__}")
    return CallableEncoder(lambda ts: np.asarray(embedder(list(ts)), np.float32), name=type(embedder).__name__)


class DSPySource(FrameworkSource):
    """A DSPy retriever as an rcn_fast passage source.

    Parameters
    ----------
    retrieve : callable
        ``query -> dspy.Prediction`` with ``passages`` (and optionally
        ``indices``), e.g. ``dspy.retrievers.Embeddings``; or ``query ->
        list[str]``. Called once per query; lists are cut to the ``k`` the
        pipeline asks for (set the retriever's own ``k`` to at least
        ReConnect's ``top_n``).
    embedder : dspy.Embedder or callable, optional
        For the relevance sampler. Default: the retriever's own
        ``embedder`` when it has one (``dspy.retrievers.Embeddings`` does).
    """

    def __init__(self, retrieve: Any, embedder: Any = None) -> None:
        if not callable(retrieve):
            raise TypeError(f"retrieve: expected a DSPy retriever (callable query -> passages), got "
                            f"{type(retrieve).__name__}")
        self.retrieve_fn = retrieve
        embedder = embedder if embedder is not None else getattr(retrieve, "embedder", None)
        self.encoder = embedder_encoder(embedder) if embedder is not None else None

    def retrieve(self, queries: Sequence[str], k: int = 5) -> list[list[Passage]]:
        queries, k = check_queries(queries), check_k(k)
        out = []
        for q in queries:
            res = self.retrieve_fn(q)
            if hasattr(res, "passages"):  # a Prediction: ids (indices) and scores kept where the retriever gives them
                out.append(passages_of_prediction(res, f"{type(self.retrieve_fn).__name__}({q!r})")[:k])
            else:
                out.append([Passage(id=str(r), text=str(t), score=0.0, meta={}) for r, t in enumerate(res)][:k])
        return out


__all__ = ["RcnRetriever", "RcnConnect", "DSPySource", "embedder_encoder", "passages_of_prediction"]
