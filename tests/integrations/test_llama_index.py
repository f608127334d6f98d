"""LlamaIndex adapters against the real llama-index-core: RcnRetriever
(NodeWithScore results equal to Retriever.retrieve, one encoder call per
batch), the knowledge-connection node postprocessor, a LlamaIndex vector
index retriever and embedding model as rcn_fast's passage source."""

from __future__ import annotations

import pytest

pytest.importorskip("llama_index.core", reason="llama-index-core not installed (pip install 'rcn_fast[llama-index]')")

from llama_index.core import VectorStoreIndex  # noqa: E402
from llama_index.core.embeddings import BaseEmbedding  # noqa: E402
from llama_index.core.schema import NodeWithScore, QueryBundle, TextNode  # noqa: E402

from rcn_fast.connection import connect  # noqa: E402
from rcn_fast.integrations.llama_index import (  # noqa: E402
    LlamaIndexSource,
    MCQueryBundle,
    RcnConnectPostprocessor,
    RcnRetriever,
    to_passage,
)
from tests.integrations.helpers import (  # noqa: E402,F401
    FACTS,
    QUERIES,
    CountingEncoder,
    HashEncoder,
    ScriptedLLM,
    questions,
    store_retriever,
)


class HashEmbedding(BaseEmbedding):
    """A LlamaIndex embedding model over the hashed bag-of-words encoder."""

    def _get_query_embedding(self, query):
        return HashEncoder().encode_queries([query])[0].tolist()

    async def _aget_query_embedding(self, query):
        return self._get_query_embedding(query)

    def _get_text_embedding(self, text):
        return HashEncoder().encode_passages([text])[0].tolist()

    def _get_text_embeddings(self, texts):
        return HashEncoder().encode_passages(texts).tolist()


def test_rcn_retriever_retrieve_and_batch_equal_retrieve(store_retriever):
    r = RcnRetriever(retriever=store_retriever, k=3)
    ref = store_retriever.retrieve(QUERIES, 3)
    store_retriever.encoder.calls.clear()
    got = r.retrieve_batch(QUERIES)
    assert store_retriever.encoder.calls == [("queries", len(QUERIES))]
    assert all(isinstance(n, NodeWithScore) for ns in got for n in ns)
    assert [[(n.node.node_id, n.node.get_content(), n.score, n.node.metadata["row"]) for n in ns] for ns in got] == \
        [[(p.id, p.text, p.score, p.meta["row"]) for p in res] for res in ref]
    one = r.retrieve(QUERIES[2])
    assert [n.node.node_id for n in one] == [p.id for p in ref[2]]
    assert [n.node.node_id for n in r.retrieve(QueryBundle(QUERIES[2]))] == [p.id for p in ref[2]]
    with pytest.raises(TypeError, match="queries: expected a sequence of queries"):
        r.retrieve_batch(QUERIES[0])
    with pytest.raises(ValueError, match="k: expected a positive int"):
        RcnRetriever(retriever=store_retriever, k=-1)


def test_connect_postprocessor(store_retriever):
    llm, enc = ScriptedLLM(), CountingEncoder()
    retriever = RcnRetriever(retriever=store_retriever, k=5)
    q = MCQueryBundle("What do plants need to grow?", choices=["sunlight", "darkness"], question_id="p1")
    nodes = retriever.retrieve(q)
    post = RcnConnectPostprocessor(llm=llm, encoder=enc, keep_nodes=True, settings={"num_subsets": 2})
    out = post.postprocess_nodes(nodes, q)
    conn = post.last_connection
    assert out[0].node.get_content() == conn.text and conn.question_id == "p1" and len(conn.subsets) == 2
    assert [n.node.node_id for n in out[1:]] == [n.node.node_id for n in nodes]
    assert out[0].node.metadata["rcn_fast_connection"]["explanation"] == conn.explanation
    assert {p.id for p in conn.passages} == {n.node.node_id for n in nodes}
    assert enc.calls == [("queries", 1), ("passages", len(nodes))]
    post.postprocess_nodes(nodes, QueryBundle("What do plants need?"))  # no choices: ReConnect's open prompts
    assert post.last_connection.explanation and all("Options:" not in e["prompt"][-2]["content"]
                                                    for e in post.last_connection.trace if "prompt" in e)
    with pytest.raises(ValueError, match="query_bundle: knowledge connection needs the question"):
        post.postprocess_nodes(nodes)


def test_llama_index_retriever_and_embedding_as_the_passage_source():
    emb = HashEmbedding()
    index = VectorStoreIndex([TextNode(text=t, id_=f"f{i:02d}") for i, t in enumerate(FACTS)], embed_model=emb)
    li = index.as_retriever(similarity_top_k=6)
    src = LlamaIndexSource(li, embed_model=emb)
    res = src.retrieve(["what does a magnet attract?"], k=3)
    ref = li.retrieve("what does a magnet attract?")[:3]
    assert [(p.id, p.text, p.score) for p in res[0]] == [(n.node.node_id, n.node.get_content(), n.score) for n in ref]
    out = connect(questions(), llm=ScriptedLLM(), retriever=src, num_subsets=2, subset_size=2)
    assert all(c.subsets and c.explanation and c.queries for c in out)
    with pytest.raises(TypeError, match="sampling='relevance' needs embeddings"):
        connect(questions(), llm=ScriptedLLM(), retriever=LlamaIndexSource(li))


def test_to_passage():
    p = to_passage(NodeWithScore(node=TextNode(text="x", id_="n1", metadata={"a": 1}), score=0.25), 0)
    assert (p.id, p.text, p.score, p.meta) == ("n1", "x", 0.25, {"a": 1})
    with pytest.raises(TypeError, match=r"nodes\[2\]: expected a LlamaIndex NodeWithScore"):
        to_passage(3, 2)
