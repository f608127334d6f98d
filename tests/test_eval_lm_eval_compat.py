"""Issue 27.2: lm-evaluation-harness habits. Its flag spellings are aliases
of the hyphenated flags, ``--model_args`` is comma-separated key=value
mapped onto rcn_fast's options, ``--tasks list`` lists, and a task YAML in
lm-eval's own format (multiple-choice subset, Jinja templates) is read, or
skipped with a message naming the file and why."""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest  # noqa: E402

from rcn_fast.eval import EvalError  # noqa: E402
from rcn_fast.eval.cli import build_parser, config_from_args, main  # noqa: E402

ARC = [
    {"id": "Mercury_7175875", "question": "An astronomer observes that a planet rotates faster after a meteorite "
     "impact. Which is the most likely effect of this increase in rotation?",
     "choices": {"text": ["Planetary density will decrease.", "Planetary years will become longer.",
                          "Planetary days will become shorter.", "Planetary gravity will become stronger."],
                 "label": ["A", "B", "C", "D"]}, "answerKey": "C"},
    {"id": "Mercury_SC_409171", "question": "A group of engineers wanted to know how different building designs "
     "would respond during an earthquake. Which would help them most?",
     "choices": {"text": ["building models", "reading books", "visiting a lake"], "label": ["1", "2", "3"]},
     "answerKey": "1"},
]

ARC_YAML = """\
task: my_arc_easy
dataset_path: arc.jsonl
output_type: multiple_choice
test_split: test
doc_to_text: "Question: {{question}}\\nAnswer:"
doc_to_target: "{{choices.label.index(answerKey)}}"
doc_to_choice: "{{choices.text}}"
should_decontaminate: true
doc_to_decontamination_query: "Question: {{question}}\\nAnswer:"
metric_list:
  - metric: acc
    aggregation: mean
    higher_is_better: true
metadata:
  version: 1.0
"""


def _parse(argv):
    return config_from_args(build_parser().parse_args(argv))


def _write(folder: Path, name: str, text: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text(text)
    return folder / name


@pytest.fixture
def arc_folder(tmp_path):
    inc = tmp_path / "lm_eval_tasks"
    _write(inc, "arc.jsonl", "".join(json.dumps(r) + "\n" for r in ARC))
    _write(inc, "arc_easy.yaml", ARC_YAML)
    return inc


# ------------------------------------------------------------------ flags
def test_lm_eval_flag_spellings_are_aliases(tmp_path):
    cfg = _parse(["--output_path", str(tmp_path / "o"), "--log_samples", "--batch_size", "3",
                  "--model_args", "pretrained=/models/x,dtype=bfloat16,batch_size=8", "--include_path", str(tmp_path)])
    assert cfg.output_path == str(tmp_path / "o") and cfg.log_samples is True and cfg.batch_size == 3
    assert cfg.model == "/models/x" and cfg.model_args == {"dtype": "bfloat16", "batch_size": 8}
    assert cfg.include_path == [str(tmp_path)]
    # the hyphenated spellings give the same settings
    same = _parse(["--output-path", str(tmp_path / "o"), "--log-samples", "--batch-size", "3", "--model", "/models/x",
                   "--model-args", "dtype=bfloat16", "batch_size=8", "--include-path", str(tmp_path)])
    assert same.to_dict() == cfg.to_dict()


def test_model_args_backends_map_onto_specs():
    assert _parse(["--model", "hf", "--model_args", "pretrained=org/model"]).model == "org/model"
    assert _parse(["--model", "vllm", "--model_args", "pretrained=org/model,tensor_parallel_size=2"]).model \
        == "vllm:org/model"
    cfg = _parse(["--model", "local-completions", "--model_args",
                  "model=served,base_url=http://127.0.0.1:8000/v1/completions,num_concurrent=4,tokenizer=/tok"])
    assert cfg.model == "openai:http://127.0.0.1:8000/v1#served"
    assert cfg.model_args == {"concurrency": 4, "tokenizer": "/tok"}
    # a model spec of rcn_fast's own with backend options only
    assert _parse(["--model", "/m", "--model_args", "dtype=float32"]).model_args == {"dtype": "float32"}


def test_model_args_unknown_keys_and_backend_names_are_one_message(capsys):
    with pytest.raises(EvalError, match=r"unknown key\(s\) \['parallelize', 'trust_remote_code'\]"):
        _parse(["--model_args", "pretrained=x,trust_remote_code=True,parallelize=True"])
    with pytest.raises(EvalError, match=r"unknown key\(s\) \['dtype'\] for the server backend"):
        _parse(["--model_args", "base_url=http://h/v1,model=m,dtype=float16"])
    with pytest.raises(EvalError, match="needs both base_url"):
        _parse(["--model_args", "base_url=http://h/v1"])
    with pytest.raises(EvalError, match="--model hf: an lm-evaluation-harness backend name"):
        _parse(["--model", "hf"])
    assert main(["--model_args", "pretrained=x,bogus=1"]) == 2
    err = capsys.readouterr().err
    assert err.count("error:") == 1 and "['bogus']" in err and "Traceback" not in err


def test_tasks_list_lists_the_tasks(arc_folder, capsys):
    assert main(["--tasks", "list", "--include_path", str(arc_folder)]) == 0
    out = capsys.readouterr().out
    assert "arc-easy" in out and "my_arc_easy" in out and "lm-eval" in out


# ------------------------------------------------------------------ lm-eval task YAML
def test_lm_eval_yaml_over_a_local_jsonl_file(arc_folder):
    from rcn_fast.eval.tasks.catalog import load_task_questions, resolve_task

    spec = resolve_task("my_arc_easy", include_paths=[str(arc_folder)])
    assert spec.kind == "multiple_choice" and spec.split == "test" and spec.local == str(arc_folder / "arc.jsonl")
    qs = load_task_questions(spec)
    assert [q.id for q in qs] == ["Mercury_7175875", "Mercury_SC_409171"]
    assert qs[0].question == ARC[0]["question"] and qs[0].choices == ARC[0]["choices"]["text"] and qs[0].answer == 2
    assert qs[1].choices == ["building models", "reading books", "visiting a lake"] and qs[1].answer == 0
    assert qs[0].meta["prompt"] == f"Question: {ARC[0]['question']}\nAnswer:"
    assert len(load_task_questions(spec, limit=1)) == 1


def test_lm_eval_yaml_field_names_lists_string_targets_and_include(tmp_path):
    from rcn_fast.eval.tasks.catalog import load_task_questions, resolve_task

    inc = tmp_path / "t"
    _write(inc, "d.jsonl", json.dumps({"ctx": "Fire is", "endings": ["hot", "cold"], "label": "0", "gold": "hot"})
           + "\n" + json.dumps({"ctx": "Ice is", "endings": ["hot", "cold"], "label": "1", "gold": "cold"}) + "\n")
    _write(inc, "_template_yaml", "dataset_path: d.jsonl\noutput_type: multiple_choice\nvalidation_split: validation\n")
    _write(inc, "a.yaml", "include: _template_yaml\ntask: by_field\ndoc_to_text: ctx\ndoc_to_choice: endings\n"
                          "doc_to_target: label\n")
    _write(inc, "b.yaml", "include: _template_yaml\ntask: by_list\ndoc_to_text: '{{ctx}}'\n"
                          "doc_to_choice: ['hot', 'cold']\ndoc_to_target: '{{gold}}'\n")
    for task in ("by_field", "by_list"):
        qs = load_task_questions(resolve_task(task, include_paths=[str(inc)]))
        assert [(q.question, q.choices, q.answer) for q in qs] == [("Fire is", ["hot", "cold"], 0),
                                                                  ("Ice is", ["hot", "cold"], 1)], task
        assert [q.id for q in qs] == [f"{task}-validation-0", f"{task}-validation-1"]


def test_lm_eval_yaml_bad_records_name_the_line(tmp_path):
    from rcn_fast.data import DataFormatError
    from rcn_fast.eval.tasks.catalog import load_task_questions, resolve_task

    inc = tmp_path / "t"
    _write(inc, "d.jsonl", json.dumps({"q": "x", "c": ["a", "b"], "t": "z"}) + "\n")
    _write(inc, "a.yaml", "task: bad\ndataset_path: d.jsonl\noutput_type: multiple_choice\ntest_split: test\n"
                          "doc_to_text: '{{q}}'\ndoc_to_choice: c\ndoc_to_target: t\n")
    with pytest.raises(DataFormatError, match=r"d.jsonl:1: doc_to_target gave 'z', which is not one of the choices"):
        load_task_questions(resolve_task("bad", include_paths=[str(inc)]))
    _write(inc, "a.yaml", "task: bad\ndataset_path: d.jsonl\noutput_type: multiple_choice\ntest_split: test\n"
                          "doc_to_text: '{{missing}}'\ndoc_to_choice: c\ndoc_to_target: 0\n")
    with pytest.raises(DataFormatError, match=r"d.jsonl:1: template error: 'missing' is undefined"):
        load_task_questions(resolve_task("bad", include_paths=[str(inc)]))


def test_lm_eval_yaml_templates_run_sandboxed(tmp_path):
    from rcn_fast.data import DataFormatError
    from rcn_fast.eval.tasks.catalog import load_task_questions, resolve_task

    inc = tmp_path / "t"
    _write(inc, "d.jsonl", json.dumps({"q": "x", "c": ["a", "b"]}) + "\n")
    _write(inc, "a.yaml", "task: evil\ndataset_path: d.jsonl\noutput_type: multiple_choice\ntest_split: test\n"
                          "doc_to_text: \"{{ q.__class__.__mro__[1].__subclasses__() }}\"\ndoc_to_choice: c\n"
                          "doc_to_target: 0\n")
    with pytest.raises(DataFormatError, match="template error"):
        load_task_questions(resolve_task("evil", include_paths=[str(inc)]))


def test_lm_eval_files_it_cannot_read_are_skipped_by_name(tmp_path, capsys):
    from rcn_fast.eval.tasks.lm_eval import TaskSkippedWarning
    from rcn_fast.eval.tasks.catalog import available_tasks

    inc = tmp_path / "t"
    marker = tmp_path / "imported"
    _write(inc, "utils.py", f"open({str(marker)!r}, 'w').write('ran')\ndef process_docs(ds):\n    return ds\n")
    _write(inc, "fn.yaml", "task: with_fn\ndataset_path: x\noutput_type: multiple_choice\ntest_split: test\n"
                           "process_docs: !function utils.process_docs\ndoc_to_text: q\ndoc_to_choice: c\n"
                           "doc_to_target: 0\n")
    _write(inc, "gen.yaml", "task: gsm\ndataset_path: gsm8k\noutput_type: generate_until\ntest_split: test\n"
                            "doc_to_text: '{{question}}'\ndoc_to_target: '{{answer}}'\n")
    _write(inc, "group.yaml", "group: my_group\ntask:\n  - a\n  - b\n")
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        names = available_tasks([str(inc)])
    assert not {"with-fn", "gsm", "my-group"} & set(names)
    msgs = {str(w.message) for w in got if issubclass(w.category, TaskSkippedWarning)}
    assert any(str(inc / "fn.yaml") in m and "!function" in m for m in msgs), msgs
    assert any(str(inc / "gen.yaml") in m and "output_type 'generate_until'" in m for m in msgs), msgs
    assert any(str(inc / "group.yaml") in m and "group file" in m for m in msgs), msgs
    assert not marker.exists()  # no code from the folder ran
    # on the command line: one warning line per file
    assert main(["--list-tasks", "--include_path", str(inc)]) == 0
    err = capsys.readouterr().err
    assert f"rcn_fast.eval: warning: include_path: skipped {inc / 'gen.yaml'}: output_type" in err


def test_lm_eval_yaml_through_the_hub_loader(tmp_path):
    """``dataset_path: json`` with ``data_files`` (lm-eval's way to a local file) goes through datasets."""
    pytest.importorskip("datasets")
    from rcn_fast.eval.tasks.catalog import load_task_questions, resolve_task

    inc = tmp_path / "t"
    data = _write(inc, "arc.jsonl", "".join(json.dumps(r) + "\n" for r in ARC))
    _write(inc, "a.yaml", ARC_YAML.replace("dataset_path: arc.jsonl", f"dataset_path: json\ndataset_kwargs:\n"
                                                                      f"  data_files:\n    test: {data}"))
    qs = load_task_questions(resolve_task("my_arc_easy", include_paths=[str(inc)]))
    assert [(q.id, q.answer) for q in qs] == [("Mercury_7175875", 2), ("Mercury_SC_409171", 0)]


def test_lm_eval_task_end_to_end_with_lm_eval_flags(arc_folder, tmp_path, capsys):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from tests.pipelines.tiny import make_tiny_llama

    model = make_tiny_llama(tmp_path / "m")
    out = tmp_path / "out"
    rc = main(["--model", "hf", "--model_args", f"pretrained={model},dtype=float32", "--tasks", "my_arc_easy",
               "--include_path", str(arc_folder), "--output_path", str(out), "--log_samples", "--batch_size", "2",
               "--pipelines", "vanilla", "--no-plot", "--no-progress", "--device", "cpu"])
    assert rc == 0, capsys.readouterr().err
    doc = json.loads(sorted(out.glob("results_*.json"))[-1].read_text())
    assert doc["results"]["my_arc_easy"]["vanilla"]["n"] == 2
    samples = [json.loads(x) for x in next(out.glob("samples_my_arc_easy_vanilla_*.jsonl")).read_text().splitlines()]
    assert len(samples) == 2


def test_lm_eval_template_fragments_with_function_do_not_break_the_folder(arc_folder):
    """lm-eval's template files (no ``task``) often hold ``!function``: they are fragments, not errors."""
    from rcn_fast.eval.tasks.catalog import available_tasks

    _write(arc_folder, "_default_template_yaml", "dataset_path: x\nprocess_docs: !function utils.process_docs\n")
    _write(arc_folder, "_frag.yaml", "doc_to_text: '{{q}}'\nprocess_docs: !function utils.process_docs\n")
    assert "my-arc-easy" in available_tasks([str(arc_folder)])
