"""Pins the whole LLM call sequence (every chat, label set and decoding, in
order) and the records of the other pipelines (vanilla, single_retrieval,
zebra, ActiveRAG and its RAG baselines, RR and self-consistency) on their
test doubles, multiple choice and (where they answer it) open domain: a
refactor into declared stages (issue 28) must leave them equal. The digests
were computed on main before that refactor."""

from __future__ import annotations

import hashlib
import json
import os

os.environ["HF_HUB_OFFLINE"] = "1"

import pytest  # noqa: E402

pytest.importorskip("pysbd")
pytest.importorskip("bm25s")

from rcn_fast import MCQuestion  # noqa: E402
from rcn_fast.kb import Example, ExampleKB, ExampleRetriever  # noqa: E402
from rcn_fast.pipelines import InMemoryRetriever, build  # noqa: E402
from tests.pipelines.doubles import FACTS, HashEncoder, ScriptedLLM  # noqa: E402
from tests.pipelines.legacy import legacy_record  # noqa: E402
from tests.pipelines.rr_doubles import KeywordNLI, PathsLLM  # noqa: E402
from tests.test_pipelines_activerag import OQS, QS as RAG_QS, RAGDouble  # noqa: E402
from tests.test_pipelines_rr import QS as RR_QS, SCRIPT  # noqa: E402
from tests.test_pipelines_zebra import KB_ROWS  # noqa: E402


class Logged:
    """An LLM proxy logging every call with its arguments, in order."""

    def __init__(self, inner) -> None:
        self.inner, self.log = inner, []
        self.identity, self.cost = inner.identity, inner.cost

    def generate(self, chats, **kw):
        self.log.append({"call": "generate", "chats": list(chats), **kw})
        return self.inner.generate(chats, **kw)

    def label_logprobs(self, chats, labels, **kw):
        self.log.append({"call": "score", "chats": list(chats), "labels": [list(x) for x in labels], **kw})
        return self.inner.label_logprobs(chats, labels, **kw)


def _digest(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _retriever() -> InMemoryRetriever:
    return InMemoryRetriever(HashEncoder(), FACTS, ids=[f"f{i:02d}" for i in range(len(FACTS))])


MC = [MCQuestion("q1", "What do plants need to grow?", ["sunlight", "darkness", "salt"]),
      MCQuestion("q2", "What does a magnet attract?", ["iron", "wood", "water", "glass"])]
RAG = ["activerag", "rag_vanilla", "chain_of_note", "self_refine", "self_rerank", "cot", "guideline"]
CASES = ["vanilla", "single_retrieval", "zebra", "rr", "self_consistency"] + RAG + [f"{n}:open" for n in RAG] + [
    "cot:passages", "activerag:agent"]

PINNED = {
    'vanilla': '27d72238b57aecfe',
    'single_retrieval': '976c6521e4bd1218',
    'zebra': 'f637195b9df84372',
    'rr': 'f75cc5c189688223',
    'self_consistency': '23d4334450c0c6ac',
    'activerag': '11fe2efac6af8c0e',
    'rag_vanilla': 'f3c81dc01691c56a',
    'chain_of_note': 'c89dd2c0bbbd5faf',
    'self_refine': '0cc181d7c2f5b1c1',
    'self_rerank': '63952702ddc12744',
    'cot': 'c4d2838bd6a20a79',
    'guideline': '7ea2459eb567f0d4',
    'activerag:open': 'a86bf32af7602a92',
    'rag_vanilla:open': '7e277df931b11a6d',
    'chain_of_note:open': '39dce6f7d63ce732',
    'self_refine:open': '3d56b1dece128b96',
    'self_rerank:open': '362fe30888811e41',
    'cot:open': '6adfb9d7f77c587c',
    'guideline:open': '059ca67a56ad99d6',
    'cot:passages': '919c50f93f1b5afb',
    'activerag:agent': '10609f211cb90766',
}


# Issue 54 item 5: every multiple-choice pipeline's answer turn ends by one setting, answer_render, whose
# default is the ReConnect authors' rendering ("Answer:", no trailing space); these pipelines ended "Answer: "
# before. Their digests under the default (the answer turn is the only change of their calls; records
# compared in their former shape, tests/pipelines/legacy.py); PINNED above holds with
# answer_render="trailing_space", the former turn. Open-domain cases score nothing: unchanged.
PINNED_DEFAULT = {
    'vanilla': '7b605d202965255c',
    'single_retrieval': 'e5269b28ba017b51',
    'zebra': '8b5a79c0b0e2d7a3',
    'rr': 'c6d418d25a4eb586',
    'self_consistency': '12bbd0705136daf1',
    'activerag': '45e638ff0903049a',
    'rag_vanilla': 'a210e01c725def5f',
    'chain_of_note': 'b1799fb88b439e5b',
    'self_refine': '2fc827ab43468bd4',
    'self_rerank': '4e13615fd454644f',
    'cot': '1e768d0456e3f13d',
    'guideline': '3df8883b35eb081b',
    'cot:passages': 'b475861957816941',
    'activerag:agent': 'deeadae3057a479c',
}


def _run(case: str, **settings) -> dict:
    name, _, variant = case.partition(":")
    if name in ("vanilla", "single_retrieval", "zebra"):
        llm = Logged(ScriptedLLM())
        if name == "zebra":
            kb = ExampleKB(Example(i, q, c, explanations=e, answer=0) for i, q, c, e in KB_ROWS)
            p = build("zebra", llm=llm, retriever=ExampleRetriever(kb, HashEncoder()), top_k=2, **settings)
        else:
            p = build(name, llm=llm, retriever=_retriever() if name != "vanilla" else None, top_n=3, **settings) \
                if name != "vanilla" else build(name, llm=llm, **settings)
        qs = MC
    elif name in ("rr", "self_consistency"):
        llm = Logged(PathsLLM(SCRIPT))
        kw = dict(llm=llm, num_paths=3, seed=0, **settings)
        if name == "rr":
            kw.update(similarity_model="retriever", nli=KeywordNLI(), retriever=_retriever())
        p, qs = build(name, **kw), RR_QS
    else:
        llm = Logged(RAGDouble())
        kw = {"use_passages": True} if variant == "passages" else {}
        if variant == "agent":
            kw = {"agent": "logician"}
        p, qs = build(name, llm=llm, retriever=_retriever(), **kw, **settings), OQS if variant == "open" else RAG_QS
    recs = [legacy_record(pr.to_dict()) for pr in p.run_batch(qs)]
    for r in recs:  # passage scores are informational (the search kernel may differ in the last bit)
        for ps in r.get("passages", []):
            ps.pop("score", None)
    return {"calls": llm.log, "records": recs}


@pytest.mark.parametrize("case", CASES)
def test_pipeline_calls_and_records_are_pinned(case):
    got = _digest(_run(case))
    assert got == PINNED_DEFAULT.get(case, PINNED[case]), f"{case}: {got}"


@pytest.mark.parametrize("case", CASES)
def test_former_answer_turn_gives_the_former_pins(case):
    """answer_render="trailing_space" ends every answer turn "Answer: ", as these pipelines did before issue
    54: their calls and records are then the ones pinned before it."""
    got = _digest(_run(case, answer_render="trailing_space"))
    assert got == PINNED[case], f"{case}: {got}"
