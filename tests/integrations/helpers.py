"""Shared fixtures of the framework adapter tests: an rcn_fast Retriever over
a real corpus store built with a hashed bag-of-words encoder that counts its
calls, the scripted LLM, a few multiple-choice questions."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from rcn_fast.data import MCQuestion
from rcn_fast.retrieval import BuildConfig, Retriever, build_corpus
from tests.pipelines.doubles import FACTS, HashEncoder, ScriptedLLM  # noqa: F401

os.environ["HAYSTACK_TELEMETRY_ENABLED"] = "False"  # no telemetry from Haystack in tests

QUERIES = ["what do plants need to grow?", "what does a magnet attract?", "what happens to ice when heated?",
           "how do fish breathe?", "what does a thermometer measure?"]


class CountingEncoder(HashEncoder):
    """HashEncoder recording each call as (kind, number of texts)."""

    def __init__(self, dim: int = 64) -> None:
        super().__init__(dim)
        self.calls: list[tuple[str, int]] = []

    def encode_queries(self, texts, batch_size=None):
        texts = list(texts)
        self.calls.append(("queries", len(texts)))
        return super().encode_queries(texts)

    def encode_passages(self, texts, batch_size=None):
        texts = list(texts)
        self.calls.append(("passages", len(texts)))
        return super().encode_passages(texts)


def build_store(tmp: Path) -> Retriever:
    src = tmp / "facts.jsonl"
    src.write_text("".join(json.dumps({"id": f"f{i:02d}", "text": t}) + "\n" for i, t in enumerate(FACTS)))
    build_corpus(BuildConfig(input=str(src), out=str(tmp / "store"), batch_size=8), HashEncoder(),
                 show_progress=False)
    return Retriever.load(tmp / "store", encoder=CountingEncoder())


@pytest.fixture(scope="module")
def store_retriever(tmp_path_factory) -> Retriever:
    r = build_store(tmp_path_factory.mktemp("store"))
    r.encoder.calls.clear()
    return r


def questions() -> list[MCQuestion]:
    return [
        MCQuestion(id="q1", question="What do plants need to grow?", choices=["sunlight", "darkness", "salt"]),
        MCQuestion(id="q2", question="What does a magnet attract?", choices=["wood", "iron", "glass"]),
    ]
