"""Pins ReConnect's whole LLM call sequence (every chat, label set and
decoding, in order) and its records on a scripted LLM, for the full
pipeline, each ablation of Tables 3 and 7, each sampling strategy, the
reference preset, open questions and ``connect()``: a refactor of the
stages (issue 28: pipelines as declared stages) must leave them equal.
The digests were computed on main before that refactor."""

from __future__ import annotations

import hashlib
import json

import pytest

from rcn_fast.connection import connect
from rcn_fast.data import MCQuestion, OpenQuestion
from rcn_fast.pipelines import InMemoryRetriever, build
from tests.pipelines.doubles import FACTS, HashEncoder, ScriptedLLM
from tests.pipelines.legacy import legacy_record


class Recording(ScriptedLLM):
    """The scripted double, logging every call with its arguments in order;
    a sampled generation (temperature > 0) gets a tail that depends on its
    decoding."""

    def __init__(self) -> None:
        super().__init__()
        self.log: list[dict] = []

    def generate(self, chats, **kw):
        out = super().generate(chats, **kw)
        self.log.append({"call": "generate", "chats": list(chats), **{k: v for k, v in kw.items()}})
        if kw.get("temperature", 0.0) > 0:
            for row in out:
                for g in row:
                    g.text += f"\n- sampled {kw.get('seed')} {kw.get('top_p')}"
        return out

    def label_logprobs(self, chats, labels, **kw):
        out = super().label_logprobs(chats, labels, **kw)
        self.log.append({"call": "score", "chats": list(chats), "labels": [list(x) for x in labels], **kw})
        return out


def _questions() -> list:
    return [
        MCQuestion("q1", "What do plants need to grow?", ["sunlight", "darkness", "salt"], answer=0),
        MCQuestion("q2", "What does a magnet attract?", ["iron", "wood", "water", "glass"], answer=0),
        MCQuestion("q3", "What happens to ice when it is heated?", ["it melts", "it grows"], answer=0),
    ]


def _digest(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _retriever() -> InMemoryRetriever:
    return InMemoryRetriever(HashEncoder(), FACTS, ids=[f"f{i:02d}" for i in range(len(FACTS))])


SETTINGS = {
    "full": {},
    "wo_er": {"ablation": "w/o ER"},
    "wo_kc": {"ablation": "w/o KC"},
    "wo_ke": {"ablation": "w/o KE"},
    "wo_ka": {"ablation": "w/o KA"},
    "wo_er_kc": {"ablation": "w/o ER, KC"},
    "random": {"sampling": "random"},
    "topk": {"sampling": "topk"},
    "mmr_greedy": {"sampling": "mmr", "repeat_decoding": "greedy"},
    "cluster": {"sampling": "cluster", "num_subsets": 2},
    "reference": {"preset": "reference"},
    "reference_prefill": {"preset": "reference", "answer_render": "prefill"},
    "shared_turn": {"answer_turn": "shared", "subset_size": 2},
    "shared_turn_former": {"answer_turn": "shared", "subset_size": 2, "answer_render": "trailing_space"},
}

PINNED = {
    'full': '4ecef559b7a6ef38',
    'wo_er': '8238c49ea8986b6a',
    'wo_kc': '66b1ce8d3bb83764',
    'wo_ke': '1f0f51bfe65fec8f',
    'wo_ka': '1b55d9debd050f90',
    'wo_er_kc': 'fd3efa96b51eae67',
    'random': 'd98d47bb2d4f6744',
    'topk': '59d4537481367e24',
    'mmr_greedy': '6a1736303ea1b444',
    'cluster': '8698f227775515a0',
    # issue 37: the preset's answer turn is "Answer: " cut at the end-of-turn token (answer_render="closed_turn");
    # with the former pre-fill rendering its calls are the ones pinned before
    'reference': '11e6305b0ce146a3',
    'reference_prefill': 'f362a59cfee3e328',
    # issue 54: the shared prompt's answer turn ends as every pipeline's (answer_render, default "Answer:");
    # with the former "Answer: " (answer_render="trailing_space") its calls are the ones pinned before
    'shared_turn': '6437b45753d15541',
    'shared_turn_former': '048867727b28de30',
    'open': 'b408e23576d272b0',
    # issue 54: passages given without a score take the encoder's relevance to the question (was 0.0)
    'connect_given': '6deeb98154660877',
    'connect_retriever': '1111771e45fe99c7',
}


def _run(name: str) -> dict:
    llm = Recording()
    if name == "open":
        p = build("reconnect", llm=llm, retriever=_retriever(), num_subsets=2)
        preds = p.run_batch([OpenQuestion("o1", "What do plants need to grow?", answers=["sunlight"]),
                             OpenQuestion("o2", "What melts ice?", answers=["heat"])])
        recs = [pr.to_dict() for pr in preds]
    elif name == "connect_given":
        out = connect(_questions(), llm=llm, passages=[FACTS[0:6], FACTS[1:8], FACTS[14:20]], encoder=HashEncoder(),
                      num_subsets=3, subset_size=2, answer=True)
        recs = [c.to_dict() for c in out]
    elif name == "connect_retriever":
        out = connect(_questions() + [{"question": "What melts ice?", "id": "o9"}], llm=llm, retriever=_retriever(),
                      answer=False)
        recs = [c.to_dict() for c in out]
    else:
        p = build("reconnect", llm=llm, retriever=_retriever(), **SETTINGS[name])
        recs = [pr.to_dict() for pr in p.run_batch(_questions())]
    recs = [legacy_record(r) for r in recs]  # compared in their former shape (tests/pipelines/legacy.py)
    for r in recs:  # passage scores are informational (the search kernel may differ in the last bit)
        for p in r.get("passages", []):
            p.pop("score", None)
    return {"calls": llm.log, "records": recs}


@pytest.mark.parametrize("name", list(PINNED))
def test_reconnect_calls_and_records_are_pinned(name):
    got = _digest(_run(name))
    assert got == PINNED[name], f"{name}: {got}"
