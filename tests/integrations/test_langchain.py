"""LangChain adapters against the real langchain-core: RcnRetriever (one
encoder call per batch, same results as Retriever.retrieve, callbacks per
query), RcnConnect as a Runnable, a LangChain vector-store retriever and
Embeddings as rcn_fast's passage source."""

from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("langchain_core", reason="langchain-core not installed (pip install 'rcn_fast[langchain]')")

from langchain_core.callbacks import BaseCallbackHandler  # noqa: E402
from langchain_core.documents import Document  # noqa: E402
from langchain_core.embeddings import Embeddings  # noqa: E402
from langchain_core.runnables import RunnableLambda, RunnableParallel  # noqa: E402
from langchain_core.vectorstores import InMemoryVectorStore  # noqa: E402

from rcn_fast.connection import Connection, connect  # noqa: E402
from rcn_fast.integrations.langchain import LangChainSource, RcnConnect, RcnRetriever, to_passage  # noqa: E402
from tests.integrations.helpers import (  # noqa: E402,F401
    FACTS,
    QUERIES,
    CountingEncoder,
    HashEncoder,
    ScriptedLLM,
    questions,
    store_retriever,
)
from tests.pipelines.doubles import stage_of  # noqa: E402


class HashEmbeddings(Embeddings):
    """A LangChain Embeddings over the hashed bag-of-words encoder."""

    def __init__(self) -> None:
        self.enc = HashEncoder()
        self.calls = []

    def embed_documents(self, texts):
        self.calls.append(("documents", len(texts)))
        return self.enc.encode_passages(texts).tolist()

    def embed_query(self, text):
        self.calls.append(("query", 1))
        return self.enc.encode_queries([text])[0].tolist()


class Recorder(BaseCallbackHandler):
    def __init__(self):
        self.events = []

    def on_retriever_start(self, serialized, query, **kw):
        self.events.append(("start", query))

    def on_retriever_end(self, documents, **kw):
        self.events.append(("end", len(documents)))


def test_rcn_retriever_invoke_and_batch_equal_retrieve(store_retriever):
    r = RcnRetriever(retriever=store_retriever, k=3)
    ref = store_retriever.retrieve(QUERIES, 3)
    store_retriever.encoder.calls.clear()
    got = r.batch(QUERIES)
    assert store_retriever.encoder.calls == [("queries", len(QUERIES))]  # one encoder call for the batch
    assert all(isinstance(d, Document) for docs in got for d in docs)
    assert [[(d.id, d.page_content, d.metadata["score"], d.metadata["row"]) for d in docs] for docs in got] == \
        [[(p.id, p.text, p.score, p.meta["row"]) for p in res] for res in ref]
    one = r.invoke(QUERIES[1])
    assert [d.id for d in one] == [p.id for p in ref[1]]
    assert r.batch([]) == []


def test_rcn_retriever_batch_runs_callbacks_per_query(store_retriever):
    rec = Recorder()
    RcnRetriever(retriever=store_retriever, k=2).batch(QUERIES[:3], config={"callbacks": [rec]})
    assert rec.events == [("start", q) for q in QUERIES[:3]] + [("end", 2)] * 3


def test_rcn_retriever_abatch(store_retriever):
    import asyncio

    store_retriever.encoder.calls.clear()
    got = asyncio.run(RcnRetriever(retriever=store_retriever, k=2).abatch(QUERIES))
    assert store_retriever.encoder.calls == [("queries", len(QUERIES))] and len(got) == len(QUERIES)


def test_rcn_retriever_checks_arguments(store_retriever):
    with pytest.raises(TypeError, match="retriever: expected an rcn_fast Retriever"):
        RcnRetriever(retriever="store/", k=2)
    with pytest.raises(ValueError, match="k: expected a positive int"):
        RcnRetriever(retriever=store_retriever, k=0)


def test_rcn_connect_runnable_in_a_chain(store_retriever):
    llm, enc = ScriptedLLM(), CountingEncoder()
    retriever = RcnRetriever(retriever=store_retriever, k=5)
    chain = RunnableParallel(
        question=RunnableLambda(lambda x: x["question"]), choices=RunnableLambda(lambda x: x["choices"]),
        documents=RunnableLambda(lambda x: x["question"]) | retriever,
    ) | RcnConnect(llm, encoder=enc, num_subsets=2, subset_size=2)
    inputs = [{"question": q.question, "choices": q.choices} for q in questions()]
    out = chain.batch(inputs)
    assert [o["question"] for o in out] == [q.question for q in questions()]
    c = out[0]["connection"]
    assert isinstance(c, Connection) and out[0]["explanation"] == c.text and c.explanation
    assert len(c.subsets) == 2 and {p.text for s in c.subsets for p in s} <= {d for d in FACTS}
    # RcnConnect.batch is one connect() call: the aggregation of both questions is one LLM call
    assert [n for kind, n in llm.calls][-1] == 2 and sum(stage_of(ch) == "knowledge_aggregation"
                                                        for _, ch in llm.chats) == 2
    assert enc.calls[0] == ("queries", 2)
    one = RcnConnect(ScriptedLLM(), encoder=HashEncoder()).invoke(
        {"question": "What do plants need?", "choices": ["light", "salt"],
         "documents": [Document(page_content=FACTS[0], id="a"), Document(page_content=FACTS[20], id="b")]})
    assert {p.id for p in one["connection"].passages} == {"a", "b"}


def test_rcn_connect_with_a_retriever_and_errors(store_retriever):
    out = RcnConnect(ScriptedLLM(), retriever=store_retriever).invoke(questions()[0])
    assert out["connection"].queries  # full ReConnect: query expansion ran
    with pytest.raises(ValueError, match="documents: inputs carry no 'documents' and RcnConnect has no retriever"):
        RcnConnect(ScriptedLLM()).invoke({"question": "q?", "choices": ["a", "b"]})
    # a question without choices: ReConnect's open prompts (no options)
    open_ = RcnConnect(ScriptedLLM(), encoder=HashEncoder()).invoke({"question": "q?", "documents": [FACTS[0]]})
    assert open_["connection"].explanation and all("Options:" not in e["prompt"][-2]["content"]
                                                   for e in open_["connection"].trace if "prompt" in e)


def test_langchain_retriever_and_embeddings_as_the_passage_source():
    emb = HashEmbeddings()
    store = InMemoryVectorStore(emb)
    store.add_documents([Document(page_content=t, id=f"f{i:02d}") for i, t in enumerate(FACTS)])
    src = LangChainSource(store.as_retriever(search_kwargs={"k": 6}), emb)
    res = src.retrieve(["what does a magnet attract?"], k=3)
    ref = store.similarity_search("what does a magnet attract?", k=3)
    assert [(p.id, p.text) for p in res[0]] == [(d.id, d.page_content) for d in ref]
    assert "magnet" in res[0][0].text
    out = connect(questions(), llm=ScriptedLLM(), retriever=src, num_subsets=2, subset_size=2)
    assert all(c.subsets and c.explanation and c.queries for c in out)
    assert any(kind == "documents" for kind, _ in emb.calls)  # the pool is embedded for the sampler
    with pytest.raises(TypeError, match="sampling='relevance' needs embeddings"):
        connect(questions(), llm=ScriptedLLM(), retriever=LangChainSource(store.as_retriever()))
    rnd = connect(questions(), llm=ScriptedLLM(), retriever=LangChainSource(store.as_retriever()), sampling="random")
    assert all(c.subsets for c in rnd)


class ChainRecorder(BaseCallbackHandler):
    """Records chain and retriever runs by name, as tracing sees them."""

    def __init__(self):
        self.events = []

    def on_chain_start(self, serialized, inputs, **kw):
        self.events.append(("chain_start", kw.get("name"), kw.get("tags") or []))

    def on_chain_end(self, outputs, **kw):
        self.events.append(("chain_end", sorted(outputs) if isinstance(outputs, dict) else type(outputs).__name__))

    def on_retriever_start(self, serialized, query, **kw):
        self.events.append(("retriever_start", kw.get("name"), query))


def test_rcn_connect_runs_with_the_config_callbacks(store_retriever):
    """RcnConnect.invoke/batch take ``config``: callbacks see a chain run per
    input (named, tagged), next to the retriever runs of the chain (before,
    invoke ignored config and RcnConnect never appeared)."""
    llm = ScriptedLLM()
    retriever = RcnRetriever(retriever=store_retriever, k=3)
    chain = RunnableParallel(
        question=RunnableLambda(lambda x: x["question"]), choices=RunnableLambda(lambda x: x["choices"]),
        documents=RunnableLambda(lambda x: x["question"]) | retriever,
    ) | RcnConnect(llm, encoder=HashEncoder(), num_subsets=2, subset_size=2)
    q = questions()[0]
    rec = ChainRecorder()
    out = chain.invoke({"question": q.question, "choices": q.choices}, config={"callbacks": [rec], "tags": ["t"]})
    names = [e[1] for e in rec.events if e[0] == "chain_start"]
    assert "RcnConnect" in names and ("retriever_start", "RcnRetriever", q.question) in rec.events
    start = [e for e in rec.events if e[:2] == ("chain_start", "RcnConnect")]
    assert len(start) == 1 and "t" in start[0][2]  # the chain's tags are inherited
    ends = rec.events[rec.events.index(start[0]) + 1:]
    assert ends[0][0] == "chain_end" and {"connection", "explanation"} <= set(ends[0][1])
    assert out["explanation"] == out["connection"].text

    rec = ChainRecorder()
    llm = ScriptedLLM()
    outs = RcnConnect(llm, encoder=HashEncoder()).batch(
        [{"question": x.question, "choices": x.choices, "documents": FACTS[:4]} for x in questions()],
        config={"callbacks": [rec], "run_name": "connect"})
    assert [e for e in rec.events if e[0] == "chain_start"] == [("chain_start", "connect", [])] * 2
    assert len([e for e in rec.events if e[0] == "chain_end"]) == 2 and len(outs) == 2
    assert [n for _, n in llm.calls][-1] == 2  # still one connect() call: the aggregation of both is one LLM call
    with pytest.raises(TypeError, match=r"unexpected keyword argument\(s\) \['num_subsets'\]"):
        RcnConnect(ScriptedLLM()).invoke({"question": "q?", "documents": [FACTS[0]]}, num_subsets=2)


def test_rcn_retriever_search_kwargs_and_k(store_retriever):
    """``search_kwargs={"k": 1}`` and ``invoke(q, k=1)`` are honoured (both
    were dropped: 3 documents came back); other keys are refused."""
    q = QUERIES[0]
    assert len(RcnRetriever(retriever=store_retriever, search_kwargs={"k": 1}).invoke(q)) == 1
    r = RcnRetriever(retriever=store_retriever, k=3)
    assert len(r.invoke(q)) == 3 and len(r.invoke(q, k=1)) == 1
    assert [len(d) for d in r.batch(QUERIES[:2], k=2)] == [2, 2]
    one = asyncio.run(r.ainvoke(q, k=1))
    assert [d.id for d in one] == [d.id for d in r.invoke(q)[:1]]
    with pytest.raises(ValueError, match=r"search_kwargs: unknown key\(s\) \['fetch_k'\]"):
        RcnRetriever(retriever=store_retriever, search_kwargs={"fetch_k": 10})
    with pytest.raises(ValueError, match="k, search_kwargs: k=3 and search_kwargs\\['k'\\]=1 disagree"):
        RcnRetriever(retriever=store_retriever, k=3, search_kwargs={"k": 1})
    with pytest.raises(TypeError, match=r"unexpected keyword argument\(s\) \['filter'\]"):
        r.invoke(q, filter={"a": 1})
    with pytest.raises(ValueError, match="k: expected a positive int"):
        r.invoke(q, k=0)


def test_to_passage_reads_ids_and_scores():
    p = to_passage(Document(page_content="x", metadata={"id": "m", "score": 0.5}), 3)
    assert (p.id, p.score) == ("m", 0.5)
    assert to_passage("plain", 4).id == "4"
