"""Retriever training: the loss against a plain reference, data grouping
and batching, recall gain on a synthetic task, CLI stop + resume."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from rcn_fast.retrieval import Encoder  # noqa: E402
from rcn_fast.retrieval.train import (  # noqa: E402
    TrainConfig, batch_tensors, format_mc, load_groups, make_batches, multi_positive_nce, train,
)
from tests.conftest import REPO  # noqa: E402
from tests.retrieval.fixtures import one_torch_thread  # noqa: E402,F401
from tests.retrieval.synthetic import make_task, recall_at_k  # noqa: E402
from tests.retrieval.tiny import make_tiny_bert  # noqa: E402

STEPS = 100
LR = 5e-3  # a random 2-layer, 32-wide model; the paper's 1e-5 is for E5-base


# ------------------------------------------------------------------ reference
def reference_loss(q, p, pos, excl, t):
    """Per query: -log(sum_pos e^{s/t} / sum_{not excluded} e^{s/t}), mean."""
    q, p = np.asarray(q, np.float64), np.asarray(p, np.float64)
    out = []
    for i in range(len(q)):
        s = np.exp(q[i] @ p.T / t)
        out.append(-np.log(s[pos[i]].sum() / s[~excl[i]].sum()))
    return float(np.mean(out))


def test_loss_matches_reference(rng):
    q = rng.standard_normal((5, 8))
    p = rng.standard_normal((11, 8))
    pos = rng.random((5, 11)) < 0.3
    pos[np.arange(5), np.arange(5)] = True
    excl = np.zeros((5, 11), bool)
    excl[0, 7] = excl[3, 9] = True
    pos &= ~excl
    got = multi_positive_nce(torch.tensor(q), torch.tensor(p), torch.tensor(pos), torch.tensor(excl), 0.7)
    assert abs(float(got) - reference_loss(q, p, pos, excl, 0.7)) < 1e-9


# ----------------------------------------------------------------------- data
def test_explanation_groups_and_batches(tmp_path):
    f = tmp_path / "t.jsonl"
    rows = [{"question": {"stem": f"q{i}"}, "explanations": [f"e{i}a", f"e{i}b", f"e{i}c"]} for i in range(10)]
    rows.append({"question": "lonely", "explanations": ["only one"]})
    f.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    groups = load_groups(str(f), "explanation")
    g = groups[0]
    assert g.passages == ["e0a", "e0b", "e0c"]
    assert g.queries[0] == ("q0", [0, 1, 2], -1)
    assert g.queries[2] == ("e0b", [0, 2], 1)
    assert groups[-1].queries == [("lonely", [0], -1)]
    cfg = TrainConfig(train=str(f), base="x", out="y", passages_per_batch=7, max_positives=2)
    batches = make_batches(groups, 0, cfg)
    assert batches == make_batches(groups, 0, cfg) and batches != make_batches(groups, 1, cfg)
    assert sorted(g for b in batches for g, _, _ in b) == list(range(11))
    for b in batches:
        assert sum(len(kp) for _, kp, _ in b) <= 7
        qt, pt, pos, excl = batch_tensors(groups, b)
        assert pos.any(axis=1).all() and not (pos & excl).any()
        for i, text in enumerate(qt):  # an explanation query never counts itself
            assert [pt[j] for j in np.flatnonzero(excl[i])] in ([], [text])


def test_concept_groups(tmp_path):
    f = tmp_path / "c.jsonl"
    rows = [{"question": {"stem": "Where do you keep milk?", "question_concept": "milk",
                          "choices": [{"label": "A", "text": "fridge"}, {"label": "B", "text": "oven"},
                                      {"label": "C", "text": "car"}]}},
            {"question": "What colour is milk?", "choices": ["white", "blue"], "concept": "milk"},
            {"question": "What barks?", "choices": ["dog", "cat", "cow"], "concept": "dog"}]
    f.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    groups = load_groups(str(f), "concept", choice_permutations=2)
    assert len(groups) == 2
    milk = groups[0]
    assert milk.passages[0] == format_mc("Where do you keep milk?", ["fridge", "oven", "car"])
    assert milk.passages[0] == "Where do you keep milk? [SEP] A. fridge [SEP] B. oven [SEP] C. car"
    q_text, pos, self_idx = milk.queries[0]
    assert q_text == milk.passages[0] and self_idx == 0 and 0 not in pos and len(pos) >= 2
    with pytest.raises(ValueError, match="concept"):
        f.write_text(json.dumps({"question": "q", "choices": ["a"]}) + "\n")
        load_groups(str(f), "concept")


# ---------------------------------------------------------------- training
@pytest.fixture(scope="module")
def task(tmp_path_factory):
    d = tmp_path_factory.mktemp("task")
    words, corpus, held = make_task(d / "train.jsonl")
    base = make_tiny_bert(d / "base", extra_words=[" ".join(words)])
    return d, base, corpus, held


def cfg_for(task, out, **kw):
    d, base, _, _ = task
    return TrainConfig(train=str(d / "train.jsonl"), base=str(base), out=str(out), lr=LR, max_steps=STEPS,
                       epochs=1000, passages_per_batch=32, temperature=0.05, seed=0, **kw)


@pytest.fixture(scope="module")
def trained(task, tmp_path_factory):
    out = tmp_path_factory.mktemp("trained") / "model"
    res = train(cfg_for(task, out), show_progress=False)
    assert res["done"] and res["step"] == STEPS
    return out, res


def test_training_beats_untrained(task, trained):
    _, base, corpus, held = task
    out, res = trained
    before = recall_at_k(Encoder.from_pretrained(base), corpus, held)
    after = recall_at_k(Encoder.from_pretrained(out), corpus, held)
    assert np.mean(res["losses"][-10:]) < 0.5 * np.mean(res["losses"][:10])
    assert after >= before + 0.15, (before, after)


def test_trained_model_loads_with_its_settings(trained):
    out, _ = trained
    enc = Encoder.from_pretrained(out)
    assert enc.config.query_prefix == "query: " and enc.config.pooling == "mean" and enc.config.max_length == 256
    assert json.loads((out / "train_state.json").read_text())["done"] is True
    assert not (out / "checkpoint").exists()


def test_cli_stop_then_resume_equals_uninterrupted(task, trained, tmp_path):
    out = tmp_path / "resumed"
    cfg = cfg_for(task, out)
    cfg_file = tmp_path / "train.yaml"
    import yaml

    cfg_file.write_text(yaml.safe_dump(cfg.to_dict()))
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    res = subprocess.run([sys.executable, "-m", "rcn_fast.retrieval.train", "--config", str(cfg_file),
                          "--stop-after", "37", "--no-progress"], env=env, capture_output=True, text=True,
                         cwd=str(REPO))
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout.strip().splitlines()[-1])["step"] == 37
    state = json.loads((out / "checkpoint" / "trainer_state.json").read_text())
    assert state["step"] == 37
    with pytest.raises(ValueError, match="lr"):
        train(cfg_for(task, out).__class__.from_dict({**cfg.to_dict(), "lr": 1e-4}), show_progress=False)
    again = train(cfg, show_progress=False)
    assert again["done"] and again["step"] == STEPS and len(again["losses"]) == STEPS - 37
    np.testing.assert_allclose(again["losses"], trained[1]["losses"][37:], rtol=1e-4, atol=1e-5)
    from transformers import AutoModel

    a = AutoModel.from_pretrained(str(out)).state_dict()
    b = AutoModel.from_pretrained(str(trained[0])).state_dict()
    for k in a:
        np.testing.assert_allclose(a[k].numpy(), b[k].numpy(), atol=1e-5, err_msg=k)


def test_concept_mode_trains(tmp_path):
    rows = []
    for c, words in enumerate([["sun", "light"], ["water", "rain"], ["iron", "magnet"], ["bird", "egg"]]):
        for i in range(4):
            rows.append({"question": f"question {i} about {words[i % 2]}", "concept": words[0],
                         "choices": [words[1], "salt", "glass", f"{i}"]})
    f = tmp_path / "c.jsonl"
    f.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    base = make_tiny_bert(tmp_path / "base")
    res = train(TrainConfig(train=str(f), base=str(base), out=str(tmp_path / "o"), mode="concept", lr=3e-3,
                            epochs=15, passages_per_batch=24, gradient_checkpointing=True), show_progress=False)
    assert res["done"] and np.mean(res["losses"][-5:]) < np.mean(res["losses"][:5])
    assert Encoder.from_pretrained(tmp_path / "o").encode_queries(["sun"]).shape == (1, 32)


def test_bad_config():
    with pytest.raises(ValueError, match="mode"):
        TrainConfig(train="t", base="b", out="o", mode="graph")
    with pytest.raises(ValueError, match="passages_per_batch"):
        TrainConfig(train="t", base="b", out="o", passages_per_batch=0)
    with pytest.raises(ValueError, match="unknown training settings"):
        TrainConfig.from_dict({"train": "t", "base": "b", "out": "o", "learning_rate": 1})
