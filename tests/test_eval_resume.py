"""SIGKILL in the middle of ``python -m rcn_fast.eval``: the same command
resumes, loses no finished question, asks the model nothing twice, and ends
with the results of an uninterrupted run."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

os.environ["HF_HUB_OFFLINE"] = "1"

import pytest  # noqa: E402

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from rcn_fast.eval import EvalConfig, evaluate  # noqa: E402
from tests.test_eval import CountingLLM, write_corpus, write_questions  # noqa: E402
from tests.torch_state import pinned_torch_threads  # noqa: E402


def _rows(db: Path) -> int:
    if not db.is_file():
        return 0
    con = sqlite3.connect(db)
    try:
        return int(con.execute("SELECT COUNT(*) FROM calls").fetchone()[0])
    finally:
        con.close()


def _lines(out: Path) -> int:
    return sum(len(p.read_text().splitlines()) for p in (out / "checkpoints").rglob("*.jsonl")) \
        if (out / "checkpoints").is_dir() else 0


@pytest.fixture
def one_torch_thread():
    with pinned_torch_threads(1):
        yield


def test_sigkill_mid_run_then_resume(tmp_path, one_torch_thread):
    from rcn_fast.llm import load_llm
    from rcn_fast.retrieval import Encoder
    from tests.pipelines.tiny import make_tiny_llama
    from tests.retrieval.tiny import make_tiny_bert

    llama = make_tiny_llama(tmp_path / "llama")
    bert = make_tiny_bert(tmp_path / "bert")
    q = write_questions(tmp_path / "mini.jsonl", n=8)
    corpus = write_corpus(tmp_path / "facts.jsonl", n=30)
    settings = dict(pipelines=["vanilla", "reconnect"], tasks=[str(q)], model=str(llama), encoder=str(bert),
                    corpus=str(corpus), batch_size=2, progress=False, plot=False, device="cpu",
                    pipeline_args={"max_new_tokens": 3, "top_n": 2, "reconnect.num_subsets": 1,
                                   "reconnect.subset_size": 2})
    # one subset per question: no two rows of a call are the same chat, so
    # distinct calls == rows in the cache
    out = tmp_path / "killed"
    cmd = [sys.executable, "-m", "rcn_fast.eval", "--pipelines", "vanilla", "reconnect", "--tasks", str(q),
           "--model", str(llama), "--encoder", str(bert), "--corpus", str(corpus), "--batch-size", "2",
           "--no-progress", "--no-plot", "--device", "cpu", "--output-path", str(out), "--pipeline-args",
           "max_new_tokens=3", "top_n=2", "reconnect.num_subsets=1", "reconnect.subset_size=2"]
    env = {**os.environ, "RCN_FAST_EVAL_THROTTLE": "1.0", "OMP_NUM_THREADS": "1", "RCN_FAST_NUM_THREADS": "1"}
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    total = 16  # 8 questions x 2 pipelines
    deadline = time.time() + 240
    try:
        while time.time() < deadline and proc.poll() is None:
            if 10 <= _lines(out) < total:  # vanilla done, reconnect part-way
                break
            time.sleep(0.1)
        assert proc.poll() is None, f"the run ended before it could be killed: {proc.communicate()[1][-2000:]!r}"
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
    done_at_kill = _lines(out)
    rows_at_kill = _rows(out / "llm_cache.sqlite")
    assert 10 <= done_at_kill < total and rows_at_kill > 0

    # the same run resumes: only the questions not finished are run, and only
    # calls not in the cache reach the model
    hf = load_llm(llama, device="cpu")
    enc = Encoder.from_pretrained(bert, device="cpu")
    resumed_llm = CountingLLM(hf)
    resumed = evaluate(EvalConfig(**settings, output_path=str(out)), llm=resumed_llm, encoder=enc,
                       print_table=False)
    rows_after = _rows(out / "llm_cache.sqlite")
    assert resumed_llm.rows == rows_after - rows_at_kill  # every model call was new: none repeated
    assert _lines(out) == total

    # an uninterrupted run gives the same results and makes exactly as many distinct calls
    fresh_llm = CountingLLM(hf)
    fresh = evaluate(EvalConfig(**settings, output_path=str(tmp_path / "fresh")), llm=fresh_llm, encoder=enc,
                     print_table=False)
    assert fresh_llm.rows == rows_after == _rows(tmp_path / "fresh" / "llm_cache.sqlite")
    for p in ("vanilla", "reconnect"):
        a, b = resumed["results"]["mini"][p], fresh["results"]["mini"][p]
        for k in ("acc", "acc_stderr", "n", "llm_calls_per_q", "prompt_tokens_per_q", "generated_tokens_per_q"):
            assert a[k] == b[k], (p, k)

    def preds(root: Path) -> dict:
        got = {}
        for f in (root / "checkpoints").rglob("*.jsonl"):
            for line in f.read_text().splitlines():
                r = json.loads(line)
                got[(f.parent.name, r["id"])] = (r["prediction"]["pred_label"], r["prediction"]["knowledge"])
        return got

    assert preds(out) == preds(tmp_path / "fresh")

    # and a third run of the same command asks nothing (the model is not loaded)
    again = evaluate(EvalConfig(**settings, output_path=str(out)), print_table=False)
    assert again["llm_usage"]["loaded"] is False and again["results"] == resumed["results"]
