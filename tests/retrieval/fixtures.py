"""pytest fixtures shared by the retrieval/corpus test modules (imported
into each module's namespace)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.retrieval.tiny import make_tiny_bert, real_sentences
from tests.torch_state import pinned_torch_threads


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
    """The machine is shared: one intra-op thread is much faster than two
    contended ones for tiny models, and makes runs comparable with the
    subprocess builds (OMP_NUM_THREADS=1). Restored after the module."""
    pytest.importorskip("torch")
    with pinned_torch_threads(1):
        yield


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    return make_tiny_bert(tmp_path_factory.mktemp("tiny") / "bert")


@pytest.fixture(scope="module")
def corpus_records() -> list[dict]:
    texts = real_sentences(120)
    return [{"id": f"fact-{i:04d}", "text": t} for i, t in enumerate(texts)]


def write_jsonl(path: Path, records: list[dict]) -> Path:
    with open(path, "w", encoding="utf-8") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")
    return path


@pytest.fixture(scope="module")
def corpus_jsonl(tmp_path_factory, corpus_records) -> Path:
    return write_jsonl(tmp_path_factory.mktemp("input") / "corpus.jsonl", corpus_records)


def run_cli(*args: str, env_extra: dict | None = None, **kw) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO),
           **(env_extra or {})}
    return subprocess.run([sys.executable, "-m", "rcn_fast.corpus", *args], env=env, capture_output=True,
                          text=True, cwd=str(REPO), **kw)
