"""Tasks own scoring (issue 28, item 2): the task scores a prediction
against the gold and aggregates; pipelines get the questions without gold;
``evaluate`` is plan -> executor -> reports, and the Ray executor runs the
planned units without calling ``evaluate`` again.

The toy pipeline here needs no LLM and no model file, so every test runs in
well under a second of pipeline work.
"""

from __future__ import annotations

import json
import math
import sys
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import pytest

from rcn_fast.data import MCQuestion, OpenQuestion
from rcn_fast.eval import EvalConfig, evaluate
from rcn_fast.eval.tasks.catalog import get_task
from rcn_fast.eval.metrics import upgrade_record
from rcn_fast.pipelines import CONFIGS, PIPELINES, OpenPrediction, Prediction, register
from rcn_fast.pipelines.config import PipelineConfig
from rcn_fast.pipelines.spec import PipelineSpec


# ------------------------------------------------------------ a toy pipeline that must never see gold
#: what an OpenPrediction from a pipeline holds of the gold: nothing (the task fills these in)
_NO_GOLD: dict[str, Any] = {"answers": [], "string_em": None, "exact_match": None}


@dataclass
class BlindConfig(PipelineConfig):
    """Always the first choice; open questions: always "iron"."""

    name: ClassVar[str] = "blind_first"


class BlindFirst:
    """Answers without an LLM; raises if a question handed to it carries a gold answer."""

    name = "blind_first"
    config_class = BlindConfig
    spec = PipelineSpec(needs_llm=False, answers_open=True)
    seen: ClassVar[list[Any]] = []
    check_gold: ClassVar[bool] = True

    def __init__(self, llm: Any, config: Any = None, *, retriever: Any = None, prompts: Any = None) -> None:
        self.config = config

    def describe(self) -> dict[str, Any]:
        return {"pipeline": self.name}

    def run_batch(self, questions: list[Any]) -> list[Any]:
        out = []
        for q in questions:
            BlindFirst.seen.append(q)
            if isinstance(q, OpenQuestion):
                if q.answers and self.check_gold:
                    raise AssertionError(f"gold answers {q.answers} reached the pipeline ({q.id})")
                out.append(OpenPrediction(question_id=q.id, answer_text="iron", **_NO_GOLD))
            else:
                if q.answer is not None and self.check_gold:
                    raise AssertionError(f"the gold answer {q.answer} reached the pipeline ({q.id})")
                lp = [0.0] + [-math.inf] * (len(q.choices) - 1)
                out.append(Prediction(question_id=q.id, pred=0, pred_label=q.labels[0], choice_logprobs=lp,
                                      gold=q.answer, gold_label=q.answer_label))  # as the built-in pipelines copy it
        return out

    def run(self, question: Any) -> Any:
        return self.run_batch([question])[0]


@pytest.fixture
def blind():
    register(BlindFirst)
    BlindFirst.seen.clear()
    yield BlindFirst
    PIPELINES.pop("blind_first", None)
    CONFIGS.pop("blind_first", None)


def _mc_file(path: Path) -> Path:
    """Four questions whose gold answers are A, B, C, D: always answering A scores 0.25."""
    with open(path, "w") as f:
        for i, key in enumerate("ABCD"):
            choices = [{"label": lab, "text": f"option {lab} of case {i}"} for lab in "ABCD"]
            f.write(json.dumps({"id": f"q{i}", "question": {"stem": f"Which option fits case {i}?",
                                                             "choices": choices}, "answerKey": key}) + "\n")
    return path


def _open_file(path: Path) -> Path:
    """Two open questions: "iron" is right for one of them."""
    rows = [{"id": "o1", "question": "What does a magnet attract?", "answers": ["Iron"]},
            {"id": "o2", "question": "What do plants need to make food?", "answers": ["sunlight", "light"]}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _cfg(tmp_path: Path, tasks: list[str], out: str = "out", **kw: Any) -> EvalConfig:
    return EvalConfig(tasks=tasks, pipelines=["blind_first"], output_path=str(tmp_path / out), progress=False,
                      plot=False, strict=True, log_samples=True, **kw)


# ------------------------------------------------------------ the pipeline never receives gold answers
def test_pipelines_never_receive_gold_answers(tmp_path, blind):
    doc = evaluate(_cfg(tmp_path, [str(_mc_file(tmp_path / "mc.jsonl")), str(_open_file(tmp_path / "od.jsonl"))]),
                   print_table=False)
    mc = [q for q in blind.seen if isinstance(q, MCQuestion)]
    od = [q for q in blind.seen if isinstance(q, OpenQuestion)]
    assert [q.id for q in mc] == ["q0", "q1", "q2", "q3"] and all(q.answer is None for q in mc)
    assert [q.id for q in od] == ["o1", "o2"] and all(q.answers == [] for q in od)
    # the task scored them against the gold all the same
    assert doc["results"]["mc"]["blind_first"]["acc"] == 0.25
    r = doc["results"]["od"]["blind_first"]
    assert r["string_em"] == 0.5 and r["exact_match"] == 0.5
    # the records and samples carry the gold the task wrote beside each prediction
    out = tmp_path / "out"
    recs = {}
    for f in (out / "checkpoints").rglob("*.jsonl"):
        for line in f.read_text().splitlines():
            rec = json.loads(line)
            if "id" in rec:
                recs[rec["id"]] = rec
    assert [recs[f"q{i}"]["prediction"]["gold"] for i in range(4)] == [0, 1, 2, 3]
    assert [recs[f"q{i}"]["prediction"]["gold_label"] for i in range(4)] == ["A", "B", "C", "D"]
    assert [recs[f"q{i}"]["metrics"] for i in range(4)] == [{"acc": 1.0}] + [{"acc": 0.0}] * 3
    assert recs["o1"]["prediction"]["answers"] == ["Iron"] and recs["o1"]["prediction"]["string_em"] is True
    assert recs["o2"]["metrics"] == {"string_em": 0.0, "exact_match": 0.0}
    samples = [json.loads(x) for f in sorted(out.glob("samples_mc_*.jsonl")) for x in f.read_text().splitlines()]
    assert [s["target"] for s in samples] == ["A", "B", "C", "D"] and {s["prediction"] for s in samples} == {"A"}


# ------------------------------------------------------------ a task scores a prediction
def test_choice_task_scores_accuracy():
    from rcn_fast.eval.metrics import ChoiceTask, make_task, score, scored

    task = make_task(get_task("demo"))
    assert isinstance(task, ChoiceTask) and task.metrics == ("acc",) and task.main_metric == "acc"
    q = MCQuestion("x", "Which is a fruit?", ["stone", "apple", "cloud"], answer=1)
    right = Prediction("x", pred=1, pred_label="B", choice_logprobs=[-3.0, -0.1, -4.0])
    wrong = Prediction("x", pred=2, pred_label="C", choice_logprobs=[-3.0, -4.0, -0.1])
    assert task.process_results(q, right) == {"acc": 1.0} and task.process_results(q, wrong) == {"acc": 0.0}
    assert task.process_results(MCQuestion("x", "Which?", ["a", "b"]), right) == {"acc": None}  # no gold
    assert task.unlabeled(q).answer is None and q.answer == 1  # the pipeline's copy; the task keeps the gold
    assert task.record_prediction(q, wrong)["gold"] == 1 and scored(q, wrong).gold == 1
    assert task.record_prediction(q, wrong)["gold_label"] == "B" and scored(q, wrong).gold_label == "B"
    assert score(q, right) == {"acc": 1.0}
    mean, se = task.aggregation()["acc"]([1.0, 0.0, 0.0, 1.0])
    assert mean == 0.5 and se == pytest.approx(math.sqrt((4 * 0.25 / 3) / 4))
    assert task.chance([q, MCQuestion("y", "Which?", ["a", "b"])]) == pytest.approx((1 / 3 + 1 / 2) / 2)


def test_open_task_scores_string_em_and_exact_match():
    from rcn_fast.eval.metrics import OpenTask, make_task, score, scored

    task = make_task(get_task("nq"))
    assert isinstance(task, OpenTask) and task.metrics == ("string_em", "exact_match")
    q = OpenQuestion("o", "Where is the Eiffel Tower?", answers=["Paris", "City of Light"])
    inside = OpenPrediction("o", answer_text="It stands in Paris, France.")
    exact = OpenPrediction("o", answer_text="paris.")
    miss = OpenPrediction("o", answer_text="Lyon")
    assert task.process_results(q, inside) == {"string_em": 1.0, "exact_match": 0.0}
    assert task.process_results(q, exact) == {"string_em": 1.0, "exact_match": 1.0}
    assert task.process_results(q, miss) == {"string_em": 0.0, "exact_match": 0.0}
    assert task.process_results(OpenQuestion("o", "Where?"), exact) == {"string_em": None, "exact_match": None}
    assert task.unlabeled(q).answers == [] and q.answers == ["Paris", "City of Light"]
    # the record: the gold beside the prediction, each ActiveRAG agent scored too
    voted = OpenPrediction("o", answer_text="Paris", meta={"agents": {"a": {"answer_text": "Lyon"},
                                                                      "b": {"answer_text": "Paris"}}})
    d = task.record_prediction(q, voted)
    assert d["answers"] == ["Paris", "City of Light"] and d["string_em"] is True and d["exact_match"] is True
    assert d["meta"]["agents"] == {"a": {"answer_text": "Lyon", "string_em": False, "exact_match": False},
                                   "b": {"answer_text": "Paris", "string_em": True, "exact_match": True}}
    assert voted.answers == [] and voted.string_em is None  # the pipeline's prediction is left as it was
    assert scored(q, inside).string_em is True and score(q, miss) == {"string_em": 0.0, "exact_match": 0.0}


def test_no_pipeline_module_computes_a_metric():
    import rcn_fast.pipelines.base as base
    import rcn_fast.pipelines.rag as rag

    assert not hasattr(base.Prediction, "correct") and not hasattr(rag.OpenPrediction, "correct")
    src = Path(rag.__file__).read_text()
    assert "string_em(" not in src and "exact_match(" not in src


# ------------------------------------------------------------ the Ray executor: plan -> executor -> reports
class _InlineRay(types.ModuleType):
    """A stand-in ``ray`` module that runs each remote task at once, in this process."""

    def __init__(self) -> None:
        super().__init__("ray")
        self.submitted: list[dict[str, Any]] = []
        self.results: dict[int, Any] = {}

    def is_initialized(self) -> bool:
        return True  # "already joined": no address probe, no init, no shutdown

    def cluster_resources(self) -> dict[str, float]:
        return {"CPU": 1.0}

    def remote(self, fn: Any) -> Any:
        ray = self

        class _Task:
            def options(self, **kw: Any) -> "_Task":
                return self

            def remote(self, arg: dict[str, Any]) -> Any:
                ray.submitted.append(arg)
                ray.results[len(ray.submitted)] = fn(arg)
                return len(ray.submitted)

        return _Task()

    def wait(self, refs: list[Any], num_returns: int = 1) -> tuple[list[Any], list[Any]]:
        return refs[:num_returns], refs[num_returns:]

    def get(self, ref: Any) -> Any:
        return self.results[ref]


def test_ray_executor_does_not_call_evaluate_again(tmp_path, blind, monkeypatch):
    import rcn_fast.eval.run.runner as runner

    monkeypatch.setitem(sys.modules, "ray", _InlineRay())
    monkeypatch.setattr(blind, "check_gold", False)  # this test is about the executor alone
    real = runner.evaluate
    inner: list[Any] = []

    def counting(*a: Any, **k: Any) -> Any:
        inner.append(a)
        return real(*a, **k)

    monkeypatch.setattr(runner, "evaluate", counting)  # any call back into evaluate goes through here
    mc = str(_mc_file(tmp_path / "mc.jsonl"))
    doc = real(_cfg(tmp_path, [mc], out="ray", executor="ray", num_shards=2, seeds=[0, 1]), print_table=False)
    assert inner == []
    ray = sys.modules["ray"]
    assert len(ray.submitted) >= 2 and {s["shard_id"] for s in ray.submitted} <= {0, 1}
    assert all(s["executor"] == "local" for s in ray.submitted)
    assert doc["results"]["mc"]["blind_first"]["acc"] == 0.25
    assert doc["results"]["mc"]["blind_first"]["acc_per_seed"] == {"0": 0.25, "1": 0.25}
    # the workers answered every question (in shard files); the driver's reports loaded nothing new
    assert len(list((tmp_path / "ray" / "checkpoints").rglob("*.shard-*-of-0002.jsonl"))) >= 2
    local = real(_cfg(tmp_path, [mc], out="local", seeds=[0, 1]), print_table=False)
    assert {k: v for k, v in local["results"]["mc"]["blind_first"].items() if "time" not in k and "per_s" not in k
            } == {k: v for k, v in doc["results"]["mc"]["blind_first"].items() if "time" not in k and "per_s" not in k}


# ------------------------------------------------------------ checkpoints written before this change
#: The checkpoint the code before issue 28's item 2 wrote for ``--tasks demo --pipelines blind_first
#: --limit 3 --seeds 0`` (pipelines then got the gold and copied it into ``answer``); its key pins the
#: checkpoint key's recipe. Issue 54 gave every pipeline config ``answer_render`` (the one answer turn of
#: all pipelines), so every config's key changed (it was 3577ce3586836a16): a pipeline whose answer turn
#: changed must not reuse its former answers. The records keep the former field names (``label``,
#: ``answer``) and resume as they are.
OLD_KEY = "67f457c8ea53731a"


def _old_line(i: int, gold: int) -> str:
    cost = {"llm_calls": 0, "generations": 0, "scoring_passes": 0, "prompt_tokens": 0, "generated_tokens": 0,
            "cached_calls": 0}
    return json.dumps({"id": f"demo-0{i}", "seed": 0, "status": "ok", "metrics": {"acc": 0.0},
                       "elapsed_s": 1.0832666400043914e-05, "prediction": {
                           "question_id": f"demo-0{i}", "pred": 0, "label": "A",
                           "choice_logprobs": [0.0, -math.inf, -math.inf, -math.inf], "knowledge": [],
                           "passages": [], "trace": [], "cost": cost, "answer": gold}}) + "\n"


OLD_LINES = "".join(_old_line(i, gold) for i, gold in ((1, 2), (2, 1), (3, 3)))


def _records(path: Path) -> dict[str, dict[str, Any]]:
    recs = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    for r in recs:
        r.pop("elapsed_s", None)
    return {r["id"]: r for r in recs}


def test_a_checkpoint_written_before_resumes_and_records_are_unchanged(tmp_path, blind):
    from rcn_fast.eval.tasks.catalog import load_task_questions

    ck = tmp_path / "out" / "checkpoints" / "demo" / "blind_first" / f"seed0-{OLD_KEY}.jsonl"
    ck.parent.mkdir(parents=True)
    ck.write_text(OLD_LINES)
    cfg = dict(tasks=["demo"], pipelines=["blind_first"], progress=False, plot=False, strict=True, seeds=[0],
               threads=1)
    doc = evaluate(EvalConfig(**cfg, limit=5, output_path=str(tmp_path / "out")), print_table=False)
    assert [q.id for q in blind.seen] == ["demo-04", "demo-05"]  # the first three came from the old file
    assert ck.read_text().startswith(OLD_LINES)
    gold = [q.answer for q in load_task_questions(get_task("demo"), limit=5)]
    r = doc["results"]["demo"]["blind_first"]
    assert r["n"] == 5 and r["n_failed"] == 0 and r["acc"] == sum(g == 0 for g in gold) / 5
    # a fresh run writes what the code before wrote, field for field (the time aside)
    evaluate(EvalConfig(**cfg, limit=3, output_path=str(tmp_path / "fresh")), print_table=False)
    fresh = _records(tmp_path / "fresh" / ck.relative_to(tmp_path / "out"))
    old = _records(ck)
    # issue 54: the same records under today's names (label -> pred_label, answer -> gold, gold_label added)
    assert all("label" not in r["prediction"] and "gold_label" in r["prediction"] for r in fresh.values())
    upgraded = {k: upgrade_record(old[k]) for k in ("demo-01", "demo-02", "demo-03")}
    for r in upgraded.values():
        r["prediction"]["gold_label"] = "ABCD"[r["prediction"]["gold"]]
    assert fresh == upgraded
    assert [upgrade_record(old[f"demo-0{i}"])["prediction"]["gold"] for i in range(1, 6)] == gold
    assert all("gold" in old[f"demo-0{i}"]["prediction"] for i in (4, 5))  # appended with today's names


# ------------------------------------------------------------ no import circle under eval/ and data/
def test_no_import_circle_under_eval_and_data():
    """Every import counts here, those inside functions too (the ratchet of
    tests/test_architecture.py counts module-level ones): the evaluation and
    the data readers form no circle (runner <-> ray_executor, tasks <->
    lm_eval_tasks before)."""
    from tests.test_architecture import imports_of, source_files

    mods = source_files()
    graph: dict[str, set[str]] = {}
    for name, path in mods.items():
        if not name.startswith(("rcn_fast.eval", "rcn_fast.data")):
            continue
        for imp in imports_of(name, path, mods):
            t = imp.target
            while t not in mods and "." in t:
                t = t.rsplit(".", 1)[0]
            if t in mods and t != name and t.startswith(("rcn_fast.eval.", "rcn_fast.data.")):
                graph.setdefault(name, set()).add(t)

    def reaches(start: str) -> set[str]:
        seen: set[str] = set()
        todo = list(graph.get(start, ()))
        while todo:
            m = todo.pop()
            if m not in seen:
                seen.add(m)
                todo.extend(graph.get(m, ()))
        return seen

    circles = sorted(m for m in graph if m in reaches(m))
    assert circles == []
