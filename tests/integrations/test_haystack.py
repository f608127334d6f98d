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


@pytest.fixture(scope="module")
def model_store(tmp_path_factory):
    """A store on disk built with a real (tiny random-weight BERT) rcn_fast
    Encoder, so its manifest can restore the encoder."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    import json

    from rcn_fast.retrieval import BuildConfig, Encoder, build_corpus
    from tests.retrieval.tiny import make_tiny_bert

    tmp = tmp_path_factory.mktemp("hs-store")
    enc = Encoder.from_pretrained(str(make_tiny_bert(tmp / "bert")))
    src = tmp / "facts.jsonl"
    src.write_text("".join(json.dumps({"id": f"f{i:02d}", "text": t}) + "\n" for i, t in enumerate(FACTS)))
    build_corpus(BuildConfig(input=str(src), out=str(tmp / "store"), batch_size=8), enc, show_progress=False)
    return tmp / "store", enc


def test_rcn_retriever_pipeline_round_trips_through_dumps_and_loads(model_store):
    """Pipeline.dumps/loads (and to_dict/from_dict) with an RcnRetriever:
    the store is serialised by path and settings, reopened with
    Retriever.load, and the reloaded pipeline returns the same documents
    (dumps raised SerializationError before)."""
    from rcn_fast.retrieval import Retriever

    store, enc = model_store
    p = Pipeline()
    p.add_component("retriever", RcnRetriever(retriever=Retriever.load(store, encoder=enc), k=3,
                                              filters={"field": "meta.row", "operator": "<", "value": 20}))
    text = p.dumps()
    assert str(store) in text and "SerializationError" not in text
    q = QUERIES[0]
    before = p.run({"retriever": {"query": q}})["retriever"]["documents"]
    with pytest.raises(Exception, match="not on the trusted-module allowlist"):  # Haystack's own guard, kept
        Pipeline.loads(text)
    p2 = Pipeline.loads(text, allowed_modules=["rcn_fast.integrations.haystack"])
    after = p2.run({"retriever": {"query": q}})["retriever"]["documents"]
    assert len(before) == 3 and [(d.id, d.content, d.score) for d in after] == [(d.id, d.content, d.score)
                                                                                for d in before]
    d = p.to_dict()["components"]["retriever"]
    assert d["init_parameters"] == {"path": str(store), "settings": {"dedup": False}, "k": 3,
                                    "filters": {"field": "meta.row", "operator": "<", "value": 20},
                                    "filter_policy": "replace"}
    by_path = RcnRetriever(path=str(store), settings={"dedup": True}, k=2)
    again = RcnRetriever.from_dict(by_path.to_dict())
    assert again.to_dict() == by_path.to_dict() and again.retriever.dedup is True
    assert [x.id for x in again.run(query=q)["documents"]] == [x.id for x in by_path.run(query=q)["documents"]]


def test_rcn_retriever_that_cannot_be_reopened_says_why(store_retriever, model_store):
    from haystack.core.errors import SerializationError

    from rcn_fast.pipelines import InMemoryRetriever

    with pytest.raises(SerializationError, match="InMemoryRetriever cannot be serialised"):
        RcnRetriever(retriever=InMemoryRetriever(HashEncoder(), FACTS)).to_dict()
    with pytest.raises(SerializationError, match="encoder CountingEncoder is not an rcn_fast Encoder"):
        RcnRetriever(retriever=store_retriever).to_dict()
    with pytest.raises(ValueError, match=r"settings: unknown key\(s\) \['dedupe'\]"):
        RcnRetriever(path=str(model_store[0]), settings={"dedupe": True})
    with pytest.raises(ValueError, match="retriever, path: give exactly one"):
        RcnRetriever()


def test_rcn_retriever_filters_on_meta(store_retriever):
    """Filters (Haystack's syntax) select among the store's documents: the
    result is the top k of the matching ones, as if the store held only
    them (the search widens past the first k)."""
    r = RcnRetriever(retriever=store_retriever, k=3)
    q = QUERIES[0]
    ranked = store_retriever.retrieve([q], len(FACTS))[0]
    rows = [p.meta["row"] for p in ranked]
    wanted = set(rows[-5:])  # the five worst-ranked rows: found only by searching the whole store
    flt = {"field": "meta.row", "operator": "in", "value": sorted(wanted)}
    got = r.run(query=q, filters=flt)["documents"]
    assert [d.meta["row"] for d in got] == [x for x in rows if x in wanted][:3]
    assert [d.id for d in got] == [p.id for p in ranked if p.meta["row"] in wanted][:3]
    both = {"operator": "AND", "conditions": [flt, {"field": "id", "operator": "!=", "value": got[0].id}]}
    assert [d.id for d in r.run(query=q, filters=both, top_k=2)["documents"]] == [d.id for d in got[1:3]]
    none = r.run(query=q, filters={"field": "meta.row", "operator": ">", "value": 10_000})["documents"]
    assert none == []
    # init filters: a run's filters replace them (the default policy) or narrow them ("merge": Haystack ANDs
    # filters on different fields)
    init = {"field": "id", "operator": "in", "value": [p.id for p in ranked if p.meta["row"] < 10]}
    rep = RcnRetriever(retriever=store_retriever, k=30, filters=init)
    assert {d.meta["row"] for d in rep.run(query=q)["documents"]} == set(range(10))
    assert {d.meta["row"] for d in rep.run(query=q, filters=flt)["documents"]} == wanted
    merge = RcnRetriever(retriever=store_retriever, k=30, filters=init, filter_policy="merge")
    assert {d.meta["row"] for d in merge.run(query=q, filters=flt)["documents"]} == {x for x in wanted if x < 10}
    batch = r.run_batch(QUERIES[:2], filters=flt)["documents"]
    assert all({d.meta["row"] for d in docs} <= wanted and len(docs) == 3 for docs in batch)


def test_rcn_retriever_run_async(store_retriever):
    """run_async (Haystack's async components, Pipeline.run_async) gives what run gives."""
    import asyncio

    r = RcnRetriever(retriever=store_retriever, k=2)
    flt = {"field": "meta.row", "operator": ">=", "value": 5}
    got = asyncio.run(r.run_async(query=QUERIES[1], filters=flt))["documents"]
    assert [d.id for d in got] == [d.id for d in r.run(query=QUERIES[1], filters=flt)["documents"]]
    calls = []
    r2 = RcnRetriever(retriever=store_retriever, k=2)
    orig = r2.run_async

    async def spy(*a, **kw):
        calls.append(kw)
        return await orig(*a, **kw)

    r2.run_async = spy
    ap = Pipeline()
    ap.add_component("retriever", r2)
    res = asyncio.run(ap.run_async({"retriever": {"query": QUERIES[1]}}))
    assert calls  # the pipeline awaited the component's run_async
    assert [d.id for d in res["retriever"]["documents"]] == [d.id for d in r.run(query=QUERIES[1])["documents"]]


def test_to_passage():
    p = to_passage(Document(id="d", content="x", score=0.5, meta={"a": 1}), 0)
    assert (p.id, p.text, p.score, p.meta) == ("d", "x", 0.5, {"a": 1})
    with pytest.raises(TypeError, match=r"documents\[1\]: expected a Haystack Document"):
        to_passage(1.5, 1)
