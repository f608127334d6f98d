"""``--permute-choices K`` end to end (issue 54 item 2): each question is
asked again with its choices rotated, through the same pipeline machinery
(a permuted question is a question), checkpointed apart from the plain
records, resumed as any unit, and reported as accuracy over the orders
beside the plain figure, which it leaves unchanged."""

from __future__ import annotations

import json
import re

import pytest

from rcn_fast.eval import EvalConfig, evaluate
from rcn_fast.eval.cli import build_parser, config_from_args
from tests.pipelines.doubles import ScriptedLLM

CHOICES = ["red", "green", "blue"]


def _task(path, n=5):
    lines = [json.dumps({"id": f"q{i}", "question": {"stem": f"which colour {i}?", "choices": [
        {"label": lab, "text": c} for lab, c in zip("ABC", CHOICES)]}, "answerKey": "ABC"[i % 3]}) for i in range(n)]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _run(tmp_path, out, k, llm=None, on_batch=None):
    cfg = EvalConfig(tasks=[str(_task(tmp_path / "mini.jsonl"))], pipelines=["vanilla"], model="scripted",
                     output_path=str(out), progress=False, plot=False, permute_choices=k)
    return evaluate(cfg, llm=llm or ScriptedLLM(), print_table=False, on_batch=on_batch)


def _options(chat):
    user = [t for t in chat if t["role"] == "user"][-1]["content"]
    return re.findall(r"^[A-C]\. (.*)$", user, re.M)


def test_each_order_is_asked_apart_and_reported_beside_the_plain_figure(tmp_path):
    llm = ScriptedLLM()
    doc = _run(tmp_path, tmp_path / "out", 3, llm)
    plain = _run(tmp_path, tmp_path / "plain", 0)
    extra = ("questions_per_s", "time_s", "acc_over_permutations", "permutations")
    assert doc["results"] == {t: {p: {**r, **{k: doc["results"][t][p][k] for k in extra}} for p, r in by.items()}
                              for t, by in plain["results"].items()}  # the plain figure is unchanged
    orders = {tuple(_options(c)) for kind, c in llm.chats if kind == "score"}
    assert orders == {("red", "green", "blue"), ("green", "blue", "red"), ("blue", "red", "green")}
    files = sorted(p.name for p in (tmp_path / "out" / "checkpoints" / "mini" / "vanilla").glob("*.jsonl"))
    assert len(files) == 3 and [f.split("-")[1] for f in files if "perm" in f] == ["perm1", "perm2"]
    s = doc["diagnostics"]["tasks"]["mini"]["pipelines"]["vanilla"]["permutations"]
    assert s["k"] == 3 and s["n"] == 5 and s["n_incomplete"] == 0
    assert doc["results"]["mini"]["vanilla"]["acc_over_permutations"] == s["acc"]
    assert doc["results"]["mini"]["vanilla"]["permutations"] == 3 and "permutations" not in plain["results"]["mini"]["vanilla"]
    assert s["plain_acc"] == pytest.approx(doc["results"]["mini"]["vanilla"]["acc"])
    # the summary from the records: per question the mean over its 3 orders, the pick read back by its text
    ck = tmp_path / "out" / "checkpoints" / "mini" / "vanilla"
    picks = {}
    for f in ck.glob("*.jsonl"):
        shift = int(f.name.split("-")[1][4:]) if "-perm" in f.name else 0
        for line in f.read_text().splitlines():
            r = json.loads(line)
            picks.setdefault(r["id"], {})[shift] = CHOICES[(r["prediction"]["pred"] + shift) % 3]
    gold = {f"q{i}": CHOICES[i % 3] for i in range(5)}
    acc = sum(sum(p == gold[q] for p in by.values()) / 3 for q, by in picks.items()) / 5
    same = sum(len(set(by.values())) == 1 for by in picks.values()) / 5
    assert s["acc"] == pytest.approx(acc) and s["consistency"] == pytest.approx(same)
    md = (tmp_path / "out" / doc["files"]["table"]).read_text()
    assert "### Accuracy over 3 cyclic permutations of the choices: mini" in md
    assert f"| vanilla | {s['plain_acc']:.4f} | {s['acc']:.4f} | {s['consistency']:.4f} | 5 |" in md
    assert "| --permute-choices | 3 |" in md


def test_a_permuted_run_resumes_each_order_as_a_unit(tmp_path):
    out = tmp_path / "out"
    _run(tmp_path, out, 2)
    ck = next((out / "checkpoints" / "mini" / "vanilla").glob("seed0-perm1-*.jsonl"))
    lines = ck.read_text().splitlines()
    ck.write_text("\n".join(lines[:3]) + "\n")  # a kill after 3 of the 5 permuted answers
    answered = []
    doc = _run(tmp_path, out, 2, on_batch=lambda u, n: answered.append((u.permutation, n)))
    assert answered == [(1, 2)]  # only the 2 missing permuted questions; the plain order was complete
    assert doc["diagnostics"]["tasks"]["mini"]["pipelines"]["vanilla"]["permutations"]["n"] == 5
    answered.clear()
    _run(tmp_path, out, 0, on_batch=lambda u, n: answered.append((u.permutation, n)))
    assert answered == []  # the plain run's checkpoint is the permuted run's plain order


def test_the_flag_and_the_default():
    ns = build_parser().parse_args(["--permute-choices", "4"])
    assert config_from_args(ns).permute_choices == 4
    assert config_from_args(build_parser().parse_args([])).permute_choices == 0


def test_a_ray_run_lists_each_sub_run_once_and_each_plans_every_order(tmp_path):
    from rcn_fast.eval.run.plan import plan
    from rcn_fast.eval.run.ray_executor import local_config, slices_of

    cfg = EvalConfig(tasks=[str(_task(tmp_path / "mini.jsonl", n=8))], pipelines=["vanilla"], model="scripted",
                     output_path=str(tmp_path / "out"), progress=False, plot=False, permute_choices=3,
                     executor="ray", num_shards=2)
    units = plan(local_config(cfg), tmp_path / "out").units
    assert sorted(u.permutation for u in units) == [0, 1, 2]
    slices = slices_of(cfg, units)
    assert sorted(d["shard_id"] for d in slices) == [0, 1]  # one sub-run per shard, not one per order
    for d in slices:
        sub = plan(EvalConfig.from_dict(d), tmp_path / "out").units
        assert sorted(u.permutation for u in sub) == [0, 1, 2]
