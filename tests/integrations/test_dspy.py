"""DSPy adapters against the real dspy: RcnRetriever (same results as
Retriever.retrieve; a list of queries = one encoder call), RcnConnect as a
module, dspy.retrievers.Embeddings with a dspy.Embedder as rcn_fast's
passage source.

dspy is not in rcn_fast's [dev] extra: it pulls litellm, which pins
huggingface-hub<2 and filelock<4, so installing it downgrades an environment
on huggingface-hub 2.x; these tests skip where dspy is not installed (run
them where ``pip install 'rcn_fast[dspy]'`` is)."""

from __future__ import annotations

import pytest

pytest.importorskip("dspy", reason="dspy not installed (pip install 'rcn_fast[dspy]' in its own environment: "
                    "its dependency litellm pins huggingface-hub<2 and filelock<4)")

import dspy  # noqa: E402

from rcn_fast.connection import Connection, connect  # noqa: E402
from rcn_fast.integrations.dspy import DSPySource, RcnConnect, RcnRetriever  # noqa: E402
from tests.integrations.helpers import (  # noqa: E402,F401
    FACTS,
    QUERIES,
    CountingEncoder,
    HashEncoder,
    ScriptedLLM,
    questions,
    store_retriever,
)


def test_rcn_retriever_single_and_batch_equal_retrieve(store_retriever):
    r = RcnRetriever(retriever=store_retriever, k=3)
    ref = store_retriever.retrieve(QUERIES, 3)
    store_retriever.encoder.calls.clear()
    got = r(QUERIES)
    assert store_retriever.encoder.calls == [("queries", len(QUERIES))]
    assert [(g.passages, g.ids, g.scores, g.indices) for g in got] == \
        [([p.text for p in res], [p.id for p in res], [p.score for p in res], [p.meta["row"] for p in res])
         for res in ref]
    one = r(QUERIES[4])
    assert isinstance(one, dspy.Prediction) and one.passages == [p.text for p in ref[4]]
    assert len(r(QUERIES[4], k=1).passages) == 1


def test_rcn_connect_module(store_retriever):
    enc = CountingEncoder()
    retrieve = RcnRetriever(retriever=store_retriever, k=5)
    mod = RcnConnect(llm=ScriptedLLM(), encoder=enc, num_subsets=2, subset_size=2)
    q = questions()[0]
    out = mod(question=q.question, choices=q.choices, passages=retrieve(q.question).passages)
    assert isinstance(out.connection, Connection) and out.explanation == out.connection.text
    assert out.knowledge == out.connection.explanation and len(out.connection.subsets) == 2
    assert enc.calls == [("queries", 1), ("passages", 5)]
    batch = mod.forward_batch([x.question for x in questions()], [x.choices for x in questions()],
                              [FACTS[:5], FACTS[5:10]])
    assert len(batch) == 2 and all(b.explanation for b in batch)
    full = RcnConnect(llm=ScriptedLLM(), retriever=store_retriever)(question=q.question, choices=q.choices)
    assert full.connection.queries
    open_ = mod(question="What do plants need?", passages=FACTS[:3])  # no choices: ReConnect's open prompts
    assert open_.explanation and all("Options:" not in e["prompt"][-2]["content"]
                                     for e in open_.connection.trace if "prompt" in e)


def test_dspy_embeddings_retriever_as_the_passage_source():
    embedder = dspy.Embedder(lambda texts: HashEncoder().encode_passages(texts), caching=False)
    emb_retriever = dspy.retrievers.Embeddings(corpus=FACTS, embedder=embedder, k=6)
    src = DSPySource(emb_retriever)
    res = src.retrieve(["what does a magnet attract?"], k=3)
    ref = emb_retriever("what does a magnet attract?")
    assert [p.text for p in res[0]] == ref.passages[:3] and [p.id for p in res[0]] == [str(i) for i in
                                                                                       ref.indices[:3]]
    out = connect(questions(), llm=ScriptedLLM(), retriever=src, num_subsets=2, subset_size=2)
    assert all(c.subsets and c.explanation and c.queries for c in out)
    plain = DSPySource(lambda q: FACTS[:4])
    assert plain.encoder is None and [p.text for p in plain.retrieve(["x"], 2)[0]] == FACTS[:2]


def test_rcn_connect_keeps_the_retrievers_ids_and_scores(store_retriever):
    """Passages given as the retriever's Prediction keep their ids, scores
    and store rows in the connection and in the result (they came back as
    Passage(id='0', score=0.0, meta={}))."""
    retrieve = RcnRetriever(retriever=store_retriever, k=4)
    mod = RcnConnect(llm=ScriptedLLM(), encoder=HashEncoder(), num_subsets=2, subset_size=2)
    q = questions()[0]
    hits = retrieve(q.question)
    ref = store_retriever.retrieve([q.question], 4)[0]
    out = mod(question=q.question, choices=q.choices, passages=hits)
    assert [(p.id, p.text, p.score, p.meta) for p in out.connection.passages] == \
        [(p.id, p.text, p.score, p.meta) for p in ref]
    assert out.ids == [p.id for p in ref] and out.scores == [p.score for p in ref] and out.passages == hits.passages
    assert {p.id for s in out.connection.subsets for p in s} <= set(hits.ids)
    batch = mod.forward_batch([x.question for x in questions()], [x.choices for x in questions()],
                              [retrieve(x.question) for x in questions()])
    assert [b.ids for b in batch] == [[p.id for p in r] for r in store_retriever.retrieve(
        [x.question for x in questions()], 4)]
    with pytest.raises(ValueError, match=r"passages\[0\]: the Prediction holds 2 passages but 1 scores"):
        mod(question="q?", passages=dspy.Prediction(passages=["a", "b"], scores=[0.5]))
    # dspy.retrievers.Embeddings' own Prediction: indices become the ids (and rows)
    embedder = dspy.Embedder(lambda texts: HashEncoder().encode_passages(texts), caching=False)
    emb = dspy.retrievers.Embeddings(corpus=FACTS, embedder=embedder, k=3)
    res = emb("what does a magnet attract?")
    src = DSPySource(emb).retrieve(["what does a magnet attract?"], 3)[0]
    assert [p.id for p in src] == [str(i) for i in res.indices] and [p.meta["row"] for p in src] == list(res.indices)


def test_deepcopy_shares_the_llm_retriever_and_encoder_without_a_warning(store_retriever, caplog):
    """DSPy copies modules while it optimises (``module.deepcopy()``): an
    LLM that cannot be deep-copied (a lock, a server connection, model
    weights) is shared, not warned about and copied shallowly."""
    import copy
    import logging
    import threading

    class LockedLLM(ScriptedLLM):
        def __init__(self):
            super().__init__()
            self.lock = threading.Lock()

    enc = HashEncoder()
    mod = RcnConnect(llm=LockedLLM(), retriever=store_retriever, encoder=enc, num_subsets=2)
    ret = RcnRetriever(retriever=store_retriever, k=2)
    with caplog.at_level(logging.WARNING):
        c = mod.deepcopy()
        r = ret.deepcopy()
        c2 = copy.deepcopy(mod)
    assert not [rec for rec in caplog.records if "deep copy" in rec.getMessage()], caplog.text
    assert c is not mod and c.llm is mod.llm and c.source is store_retriever and c.encoder is enc
    assert c.settings == mod.settings and c.settings is not mod.settings and c2.llm is mod.llm
    assert r.retriever is store_retriever and r.k == 2
    q = questions()[0]
    assert c(question=q.question, choices=q.choices, passages=FACTS[:4]).explanation  # the copy runs
    assert r(q.question).ids == ret(q.question).ids and len(r(q.question).ids) == 2
