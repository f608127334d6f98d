"""``python -m rcn_fast.eval --paper TABLE``: the paper's tables as presets, filled beside the paper's numbers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rcn_fast.eval import EvalConfig
from rcn_fast.paper import available_presets, get_preset, paper_tables, run_preset
from rcn_fast.paper.presets import COST_TASKS, ID_TASKS, OOD_TASKS, RUN_OF_METHOD, TASK_OF_COLUMN


def test_paper_values_are_the_papers():
    tables = paper_tables()["tables"]
    assert available_presets() == ["table1", "table2", "table3", "table6", "table7", "table9", "table10"]
    for name, t in tables.items():
        for row in t["rows"]:
            assert len(row["values"]) == len(t["columns"]), (name, row["method"])
            if t["columns"][-1] == "Avg.":  # the paper's averages agree with its cells (rounding)
                vals = row["values"][:-1]
                assert abs(sum(vals) / len(vals) - row["values"][-1]) <= 0.1, (name, row["method"])
    assert get_preset("table1").paper["RECONNECT (Ours)"] == (94.2, 85.0, 84.6, 70.4, 82.4, 81.3, 83.0, 62.4, 80.4)
    assert get_preset("3").paper["RECONNECT w/ Random"] == (78.3, 78.8)
    assert get_preset("table9").paper["RECONNECT (N=3)"] == (562.5, 6)
    with pytest.raises(ValueError, match="--paper: unknown table 'table4'"):
        get_preset("table4")


def test_every_row_and_column_is_mapped():
    for name in available_presets():
        p = get_preset(name)
        for row in p.rows:
            assert row in RUN_OF_METHOD, (name, row)
        for col in p.columns:
            assert col in TASK_OF_COLUMN or col in ("Avg.", "ID.", "OOD.", "#Tokens", "#LLM calls"), (name, col)
    assert get_preset("table3").tasks() == ID_TASKS + OOD_TASKS
    assert get_preset("table9").tasks() == COST_TASKS
    assert get_preset("table7").run_of("RECONNECT w/o KA").pipeline_args == {"reconnect.ablation": "w/o KA"}


def _task_yaml(folder: Path, name: str, questions: Path | None) -> None:
    """A user's task YAML in ``folder`` (its question file lies beside it: a task file's data lies in its own
    folder, issue 53)."""
    local = str(questions) if questions is not None else str(folder / "missing.jsonl")
    (folder / f"{name}.yaml").write_text(f"name: {name}\ngroup: in-domain\nkind: multiple_choice\nlocal: {local}\n")


def _questions(path: Path, n: int = 2) -> Path:
    with open(path, "w") as f:
        for i in range(n):
            f.write(json.dumps({"id": f"{path.stem}-{i}", "question": {"stem": f"Which one is true, case {i}?",
                    "choices": [{"label": lab, "text": f"option {lab} {i}"} for lab in "ABCD"]},
                    "answerKey": "ABCD"[i % 4]}) + "\n")
    return path


def _corpus(path: Path) -> str:
    """A one-passage corpus file (the stand-in evaluations never read it; ``--paper`` checks it is there and
    that the store build can read it: a ``.jsonl`` name, issue 54)."""
    path = path.with_suffix(".jsonl")
    path.write_text('{"id": "p0", "text": "Plants need light."}\n')
    return str(path)


def test_layout_reasons_and_outputs(tmp_path):
    """Table 7 with a stand-in evaluation: measured/paper/diff per cell; a task that cannot load says why."""
    inc = tmp_path / "tasks"
    inc.mkdir()
    for t in ID_TASKS + OOD_TASKS:
        _task_yaml(inc, t, None if t == "wsc" else _questions(inc / f"{t}.jsonl"))
    calls = []

    def fake_evaluate(cfg, **kw):
        calls.append((cfg.pipelines, cfg.pipeline_args, tuple(cfg.tasks), cfg.seeds))
        acc = 0.5 if cfg.pipeline_args.get("reconnect.ablation") else 0.8
        return {"results": {t: {"reconnect": {"acc": acc, "n": 2}} for t in cfg.tasks}}

    cfg = EvalConfig(model="m", corpus=_corpus(tmp_path / "c.jsonl"), include_path=[str(inc)],
                     output_path=str(tmp_path / "out"))
    report, files = run_preset("table7", cfg, evaluate=fake_evaluate, llm=object())
    assert len(calls) == 4 and all(c[3] == [0, 1, 2] for c in calls)  # the paper's three seeds
    assert "wsc" not in calls[0][2] and len(calls[0][2]) == 15
    full = report.cells["RECONNECT (Ours)"]
    assert full["ID."].measured == pytest.approx(80.0) and full["ID."].diff == pytest.approx(-0.4)
    assert full["ID."].n == 16
    assert full["OOD."].measured is None and "wsc: FileNotFoundError" in full["OOD."].reason
    assert report.cells["RECONNECT w/o KE"]["ID."].measured == pytest.approx(50.0)
    md = Path(files["markdown"]).read_text()
    assert "| RECONNECT w/o KE, KA | 50.0 / 76.6 (-26.6) |" in md and "wsc: FileNotFoundError" in md
    doc = json.loads(Path(files["json"]).read_text())
    assert doc["rows"][0]["cells"]["ID."] == {"measured": 80.0, "paper": 80.4, "diff": pytest.approx(-0.4),
                                              "reason": None, "n": 16}
    assert Path(files["figure"]).stat().st_size > 0


def test_rows_that_cannot_run_say_why(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    inc = tmp_path / "tasks"
    inc.mkdir()
    for t in ID_TASKS + OOD_TASKS:
        _task_yaml(inc, t, _questions(inc / f"{t}.jsonl"))
    ran = []

    def fake_evaluate(cfg, **kw):
        ran.append(cfg.pipelines[0])
        return {"results": {t: {cfg.pipelines[0]: {"acc": 0.25, "n": 2}} for t in cfg.tasks}}

    cfg = EvalConfig(model="m", include_path=[str(inc)], output_path=str(tmp_path / "out"))  # no corpus, no kb
    report, _ = run_preset("table1", cfg, evaluate=fake_evaluate, llm=object(), seeds=[0])
    assert ran == ["vanilla"]
    assert report.cells["Llama 3.1-8B Instruct"]["Avg."].measured == pytest.approx(25.0)
    assert report.cells["ZEBRA (2024)"]["CSQA"].reason.startswith("needs --kb")
    assert report.cells["RECONNECT (Ours)"]["CSQA"].reason.startswith("needs --corpus")
    assert report.cells["FLARE (2023)"]["WG"].reason == "not implemented in rcn_fast"
    assert report.cells["FLARE (2023)"]["WG"].paper == 58.6
    t6, _ = run_preset("table6", EvalConfig(model="m", corpus=_corpus(tmp_path / "c"), include_path=[str(inc)],
                                            output_path=str(tmp_path / "o6")), evaluate=fake_evaluate, llm=object())
    assert t6.cells["RECONNECT w/ DPR"]["ID."].reason.startswith("needs --paper-corpus dpr=STORE")


def test_table9_runs_for_real_and_resumes(tmp_path, monkeypatch):
    """Table 9 on tiny random-weight models through the real evaluation: calls per question are the
    paper's (N + 3 for ReConnect, 1 for single retrieval); a rerun asks the model nothing."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from rcn_fast.llm import load_llm
    from rcn_fast.retrieval import Encoder
    from tests.pipelines.tiny import make_tiny_llama
    from tests.retrieval.tiny import make_tiny_bert, real_sentences

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    prev = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        llm = load_llm(make_tiny_llama(tmp_path / "llama"), batch_size=8, device="cpu")
        enc = Encoder.from_pretrained(make_tiny_bert(tmp_path / "bert"), device="cpu")
        inc = tmp_path / "tasks"
        inc.mkdir()
        for t in COST_TASKS:
            _task_yaml(inc, t, _questions(inc / f"{t}.jsonl", n=2))
        corpus = tmp_path / "facts.jsonl"
        corpus.write_text("".join(json.dumps({"id": f"f{i}", "text": s}) + "\n"
                                  for i, s in enumerate(real_sentences(30))))
        cfg = EvalConfig(model="tiny", corpus=str(corpus), include_path=[str(inc)], output_path=str(tmp_path / "out"),
                         pipeline_args={"max_new_tokens": 3, "top_n": 2, "reconnect.subset_size": 2},
                         batch_size=4, progress=False, plot=False)
        report, files = run_preset("table9", cfg, seeds=[0], llm=llm, encoder=enc)
        calls = {row: report.cells[row]["#LLM calls"].measured for row in report.preset.rows}
        assert calls["Single RAG"] == pytest.approx(1.0)
        for n in (1, 2, 3, 5, 7):
            assert calls[f"RECONNECT (N={n})"] == pytest.approx(n + 3)
        assert calls["ZEBRA"] is None and report.cells["ZEBRA"]["#Tokens"].reason.startswith("needs --kb")
        assert report.cells["RECONNECT (N=3)"]["#Tokens"].measured > 0
        assert "| [RECONNECT (N=7)](results_" in Path(files["markdown"]).read_text()

        before = llm.cost.total.calls  # rows that reached the model (the call cache wraps it per row)
        assert before > 0
        again, _ = run_preset("table9", cfg, seeds=[0], llm=llm, encoder=enc)  # resumed from checkpoints
        assert llm.cost.total.calls == before
        assert [r["cells"] for r in again.to_dict()["rows"]] == [r["cells"] for r in report.to_dict()["rows"]]
    finally:
        torch.set_num_threads(prev)


def test_id_and_ood_tasks_retrieve_from_their_own_stores(tmp_path, monkeypatch):
    """App. A.2: the ID tasks use the store without RACo's CBD part, the OOD tasks the full one."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    inc = tmp_path / "tasks"
    inc.mkdir()
    for t in ID_TASKS + OOD_TASKS:
        _task_yaml(inc, t, _questions(inc / f"{t}.jsonl"))
    seen = []

    def fake_evaluate(cfg, **kw):
        seen.append((cfg.corpus, tuple(cfg.tasks)))
        return {"results": {t: {"reconnect": {"acc": 0.5, "n": 2}} for t in cfg.tasks}}

    cfg = EvalConfig(model="m", include_path=[str(inc)], output_path=str(tmp_path / "out"))
    id_store, ood_store = _corpus(tmp_path / "ID_STORE"), _corpus(tmp_path / "OOD_STORE")
    report, _ = run_preset("table7", cfg, corpora={"id": id_store, "ood": ood_store}, evaluate=fake_evaluate,
                           llm=object())
    assert set(seen) == {(id_store, ID_TASKS), (ood_store, OOD_TASKS)}
    assert report.cells["RECONNECT (Ours)"]["OOD."].measured == pytest.approx(50.0)
