"""Haystack adapters against the real haystack-ai (telemetry off):
RcnRetriever (same results as Retriever.retrieve; run_batch = one encoder
call), RcnConnector in a Pipeline, Haystack's in-memory embedding and BM25
retrievers with embedders as rcn_fast's passage source."""

from __future__ import annotations

import os

import pytest

os.environ["HAYSTACK_TELEMETRY_ENABLED"] = "False"
pytest.importorskip("haystack", reason="haystack-ai not installed (pip install 'rcn_fast[haystack]')")

from haystack import Document, Pipeline, component  # noqa: E402
from haystack.components.retrievers.in_memory import InMemoryBM25Retriever, InMemoryEmbeddingRetriever  # noqa: E402
from haystack.document_stores.in_memory import InMemoryDocumentStore  # noqa: E402

from rcn_fast.connection import Connection, connect  # noqa: E402
from rcn_fast.integrations.haystack import HaystackSource, RcnConnector, RcnRetriever, to_passage  # noqa: E402
from tests.integrations.helpers import (  # noqa: E402,F401
    FACTS,
    QUERIES,
    CountingEncoder,
    HashEncoder,
    ScriptedLLM,
    questions,
    store_retriever,
)


@component
class HashTextEmbedder:
    @component.output_types(embedding=list[float])
    def run(self, text: str):
        return {"embedding": HashEncoder().encode_queries([text])[0].tolist()}


@component
class HashDocumentEmbedder:
    def __init__(self):
        self.runs = 0

    @component.output_types(documents=list[Document])
    def run(self, documents: list[Document]):
        self.runs += 1
        emb = HashEncoder().encode_passages([d.content for d in documents])
        return {"documents": [Document(id=d.id, content=d.content, meta=d.meta, embedding=e.tolist())
                              for d, e in zip(documents, emb)]}


def test_telemetry_is_off():
    assert os.environ["HAYSTACK_TELEMETRY_ENABLED"] == "False"
    from haystack.telemetry import _telemetry

    assert _telemetry.telemetry is None  # haystack read the variable: no telemetry client


def test_rcn_retriever_run_and_run_batch_equal_retrieve(store_retriever):
    r = RcnRetriever(retriever=store_retriever, k=3)
    ref = store_retriever.retrieve(QUERIES, 3)
    store_retriever.encoder.calls.clear()
    got = r.run_batch(QUERIES)["documents"]
    assert store_retriever.encoder.calls == [("queries", len(QUERIES))]
    assert [[(d.id, d.content, d.score, d.meta["row"]) for d in docs] for docs in got] == \
        [[(p.id, p.text, p.score, p.meta["row"]) for p in res] for res in ref]
    one = r.run(query=QUERIES[3])["documents"]
    assert [d.id for d in one] == [p.id for p in ref[3]]
    assert len(r.run(query=QUERIES[3], top_k=1)["documents"]) == 1
    with pytest.raises(ValueError, match="top_k: expected a positive int"):
        r.run(query=QUERIES[0], top_k=0)


def test_retriever_and_connector_in_a_pipeline(store_retriever):
    llm, enc = ScriptedLLM(), CountingEncoder()
    p = Pipeline()
    p.add_component("retriever", RcnRetriever(retriever=store_retriever, k=5))
    p.add_component("connect", RcnConnector(llm=llm, encoder=enc, num_subsets=2, subset_size=2))
    p.connect("retriever.documents", "connect.documents")
    q = questions()[1]
    res = p.run({"retriever": {"query": q.question}, "connect": {"query": q.question, "choices": q.choices}})
    c = res["connect"]["connection"]
    assert isinstance(c, Connection) and res["connect"]["explanation"] == c.text and c.explanation
    assert res["connect"]["documents"][0].content == c.text
    assert len(c.subsets) == 2 and enc.calls == [("queries", 1), ("passages", 5)]
    batch = RcnConnector(llm=ScriptedLLM(), encoder=HashEncoder()).run_batch(
        [x.question for x in questions()], [[Document(content=t) for t in FACTS[:4]]] * 2,
        [x.choices for x in questions()])
    assert len(batch["connection"]) == 2 and all(batch["explanation"])
    open_ = RcnConnector(llm=ScriptedLLM(), encoder=HashEncoder()).run(query="q?", documents=[Document(content="x")])
    assert open_["explanation"] and all("Options:" not in e["prompt"][-2]["content"]  # no choices: open prompts
                                        for e in open_["connection"].trace if "prompt" in e)


def test_haystack_retrievers_as_the_passage_source():
    store = InMemoryDocumentStore()
    demb = HashDocumentEmbedder()
    docs = demb.run(documents=[Document(id=f"f{i:02d}", content=t) for i, t in enumerate(FACTS)])["documents"]
    store.write_documents(docs)
    src = HaystackSource(InMemoryEmbeddingRetriever(store), HashTextEmbedder(), demb)
    res = src.retrieve(["what does a magnet attract?"], k=3)
    ref = InMemoryEmbeddingRetriever(store).run(
        query_embedding=HashEncoder().encode_queries(["what does a magnet attract?"])[0].tolist(), top_k=3)
    assert [(p.id, p.text) for p in res[0]] == [(d.id, d.content) for d in ref["documents"]]
    out = connect(questions(), llm=ScriptedLLM(), retriever=src, num_subsets=2, subset_size=2)
    assert all(c.subsets and c.explanation and c.queries for c in out) and demb.runs >= 2
    bm25 = HaystackSource(InMemoryBM25Retriever(store))
    assert bm25.retrieve(["magnet iron"], k=2)[0][0].text in (FACTS[1], "iron is attracted by a magnet")
    assert all(c.subsets for c in connect(questions(), llm=ScriptedLLM(), retriever=bm25, sampling="random"))
    with pytest.raises(ValueError, match="text_embedder: an embedding retriever needs"):
        HaystackSource(InMemoryEmbeddingRetriever(store))


def test_to_passage():
    p = to_passage(Document(id="d", content="x", score=0.5, meta={"a": 1}), 0)
    assert (p.id, p.text, p.score, p.meta) == ("d", "x", 0.5, {"a": 1})
    with pytest.raises(TypeError, match=r"documents\[1\]: expected a Haystack Document"):
        to_passage(1.5, 1)
