"""Issue 26 (eval parts): task names cannot write outside the output folder
(2), checkpoints follow the model's weights, not its name (4), a merge over
an incomplete shard is refused unless asked, and config values of the wrong
type are one message (12). Tiny random-weight models built in code."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest  # noqa: E402

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from rcn_fast.eval import EvalConfig, EvalError, evaluate  # noqa: E402
from rcn_fast.eval.cli import main  # noqa: E402
from tests.test_eval import CountingLLM, one_torch_thread, tiny_hf, tiny_llama_dir, write_questions  # noqa: E402,F401

QUIET = dict(pipelines=["vanilla"], progress=False, plot=False, device="cpu", batch_size=4)


def _files_under(root: Path) -> set[Path]:
    return {p for p in root.rglob("*") if p.is_file()}


# ------------------------------------------------------------- 26.2 paths
def test_safe_component_and_child_path_stay_inside(tmp_path):
    from rcn_fast._paths import check_name, child_path, safe_component

    for text in ("../../../x", "/abs/x", "..", ".", "a/../../b", "a\\..\\b", "x\x00y", "", "~root"):
        part = safe_component(text)
        assert part and "/" not in part and "\\" not in part and not part.startswith(".")
        p = child_path(tmp_path, "checkpoints", text, "vanilla", "seed0.jsonl")
        assert tmp_path.resolve() in Path(os.path.normpath(p.resolve())).parents
    assert safe_component("arc-easy") == "arc-easy" and safe_component("seed0-ab12.jsonl") == "seed0-ab12.jsonl"
    for bad in ("../x", "/abs", ".hidden", "a/b", "a\\b", "t\nx"):
        with pytest.raises(ValueError, match="not a valid name"):
            check_name(bad, "name")


@pytest.mark.parametrize("name", ["../../../escaped", "ABSOLUTE"])
def test_yaml_task_name_cannot_write_outside_the_output(tmp_path, tiny_llama_dir, capsys, name):
    if name == "ABSOLUTE":
        name = str(tmp_path / "abs-target")
    root = tmp_path / "a" / "b"
    inc = root / "tasks"
    inc.mkdir(parents=True)
    write_questions(inc / "q.jsonl", n=2)
    (inc / "t.yaml").write_text(json.dumps({"name": name, "local": "q.jsonl"}))
    out = root / "out"
    before = _files_under(tmp_path)
    rc = main(["--include_path", str(inc), "--tasks", name, "--pipelines", "vanilla", "--model", str(tiny_llama_dir),
               "--output-path", str(out), "--no-progress", "--no-plot", "--device", "cpu"])
    err = capsys.readouterr().err
    assert rc == 2 and "not a valid name" in err and "Traceback" not in err
    assert len([ln for ln in err.splitlines() if "error:" in ln]) == 1
    created = {p for p in _files_under(tmp_path) - before if out not in p.parents}
    assert not created, f"written outside --output-path: {created}"


def test_file_derived_and_spaced_names_are_one_folder_inside_the_output(tmp_path, tiny_hf):
    inc = tmp_path / "tasks"
    inc.mkdir()
    write_questions(inc / "q.jsonl", n=2)
    (inc / "t.yaml").write_text(json.dumps({"name": "my task x", "local": "q.jsonl"}))
    out = tmp_path / "out"
    evaluate(EvalConfig(**QUIET, tasks=["my task x"], include_path=[str(inc)], output_path=str(out), log_samples=True,
                        model="tiny"), llm=tiny_hf, print_table=False)
    ck = list((out / "checkpoints").rglob("*.jsonl"))
    assert ck and all(p.relative_to(out).parts[1] == "my_task_x" for p in ck)
    assert len(list(out.glob("samples_my_task_x_vanilla_*.jsonl"))) == 1  # timestamped as the results file


# ------------------------------------------------------------- 26.4 weights
def test_checkpoints_follow_the_weights_not_the_model_name(tmp_path, tiny_llama_dir):
    from tests.pipelines.tiny import make_tiny_llama

    model = tmp_path / "model"
    shutil.copytree(tiny_llama_dir, model)
    q = write_questions(tmp_path / "mini.jsonl", n=3)
    cfg = EvalConfig(**QUIET, tasks=[str(q)], model=str(model), output_path=str(tmp_path / "out"))
    first = evaluate(cfg, print_table=False)
    assert first["llm_usage"]["loaded"]
    again = evaluate(cfg, print_table=False)  # same weights: nothing to do, no model loaded
    assert not again["llm_usage"]["loaded"]
    other = make_tiny_llama(tmp_path / "other", seed=7)
    shutil.copy(other / "model.safetensors", model / "model.safetensors")  # new weights, same folder and name
    third = evaluate(cfg, print_table=False)
    assert third["llm_usage"]["loaded"] and third["llm_usage"]["model_calls"] > 0
    assert len(list((tmp_path / "out" / "checkpoints").rglob("seed0-*.jsonl"))) == 2


def test_checkpoints_keyed_by_the_model_name_alone_are_not_reused(tmp_path, tiny_llama_dir):
    """A checkpoint written under the old key (the --model string) is stale: not reused."""
    from rcn_fast.eval.run.checkpoint import run_key
    from rcn_fast.eval.tasks.catalog import resolve_task, spec_key
    from rcn_fast.pipelines.config import config_to_dict
    from rcn_fast.eval.pipeline_needs import pipeline_config_class

    q = write_questions(tmp_path / "mini.jsonl", n=3)
    spec = resolve_task(str(q))
    cdict = config_to_dict(pipeline_config_class("vanilla").from_dict({"seed": 0}))
    old = run_key({"task": spec_key(spec), "pipeline": "vanilla", "config": cdict, "model": str(tiny_llama_dir),
                   "model_args": {}, "corpus": None, "encoder": None, "kb": None})
    folder = tmp_path / "out" / "checkpoints" / spec.name / "vanilla"
    folder.mkdir(parents=True)
    fake = {"seed": 0, "status": "ok", "metrics": {"acc": 1.0}, "elapsed_s": 0.0,
            "prediction": {"label": "A", "pred": 0, "choice_logprobs": [0.0, -9.0, -9.0, -9.0]}}
    (folder / f"seed0-{old}.jsonl").write_text("".join(json.dumps({**fake, "id": f"q{i}"}) + "\n" for i in range(3)))
    doc = evaluate(EvalConfig(**QUIET, tasks=[str(q)], model=str(tiny_llama_dir), output_path=str(tmp_path / "out")),
                   print_table=False)
    assert doc["llm_usage"]["loaded"] and doc["llm_usage"]["calls"] > 0


def test_model_key_of_an_openai_spec_is_the_clients_identity(monkeypatch):
    """The key takes the client's ``identity`` (what the call cache keys by), whatever it holds."""
    import rcn_fast.llm
    from rcn_fast.eval.run.loading import model_key

    made = []

    class Client:
        def __init__(self, spec, **opts):
            self.spec, self.opts, self.closed = spec, opts, False
            made.append(self)

        @property
        def identity(self):
            return f"served:{self.spec}:{sorted(self.opts.items())}:root=/models/v2"

        def close(self):
            self.closed = True

    monkeypatch.setattr(rcn_fast.llm, "load_llm", Client)
    spec = "openai:http://127.0.0.1:9/v1#served-model"
    key = model_key(spec, {"mode": "chat"})
    assert key == {"spec": spec, "identity": f"served:{spec}:[('mode', 'chat')]:root=/models/v2"}
    assert made[-1].closed

    def broken(spec, **opts):
        raise ConnectionRefusedError("refused")

    monkeypatch.setattr(rcn_fast.llm, "load_llm", broken)
    with pytest.raises(EvalError, match="cannot identify .*ConnectionRefusedError"):
        model_key(spec, {})


# ------------------------------------------------------------- 26.12 merge
def _shard_settings(tmp_path: Path, model: Path) -> dict:
    q = write_questions(tmp_path / "mini.jsonl", n=8)
    return dict(**QUIET, tasks=[str(q)], model=str(model), output_path=str(tmp_path / "out"))


def test_merge_refuses_a_shard_that_never_ran(tmp_path, tiny_llama_dir, tiny_hf):
    settings = _shard_settings(tmp_path, tiny_llama_dir)
    evaluate(EvalConfig(**settings, num_shards=2, shard_id=0), llm=tiny_hf, print_table=False)
    llm = CountingLLM(tiny_hf)
    with pytest.raises(EvalError, match=r"shard 1 of 2 .*never ran; it was given \d+ question") as exc:
        evaluate(EvalConfig(**settings), llm=llm, print_table=False)
    assert "--merge-fill-missing" in str(exc.value) and llm.rows == 0


def test_merge_refuses_an_incomplete_shard_unless_asked(tmp_path, tiny_llama_dir, tiny_hf, capsys):
    settings = _shard_settings(tmp_path, tiny_llama_dir)
    for shard in range(2):
        evaluate(EvalConfig(**settings, num_shards=2, shard_id=shard), llm=tiny_hf, print_table=False)
    f = next((tmp_path / "out" / "checkpoints").rglob("*.shard-0001-of-0002.jsonl"))
    lines = f.read_text().splitlines(keepends=True)
    assert len(lines) >= 2
    f.write_text("".join(lines[:-2]))  # shard 1 stopped short by two questions
    llm = CountingLLM(tiny_hf)
    with pytest.raises(EvalError, match=rf"shard 1 of 2 \({f.name}\) did not finish 2 question"):
        evaluate(EvalConfig(**settings), llm=llm, print_table=False)
    assert llm.rows == 0
    capsys.readouterr()
    doc = evaluate(EvalConfig(**settings, merge_fill_missing=True), llm=llm, print_table=False)
    assert doc["results"]["mini"]["vanilla"]["n"] == 8 and doc["llm_usage"]["calls"] == 2  # (from the call cache)
    assert "shard 1 of 2" in capsys.readouterr().err
    # the CLI flag
    from rcn_fast.eval.cli import build_parser, config_from_args

    assert config_from_args(build_parser().parse_args(["--merge-fill-missing"])).merge_fill_missing is True


# ------------------------------------------------------------- 26.12 types
@pytest.mark.parametrize("key, value, expected", [
    ("output_path", 123, "a folder path"), ("cache_path", 5, "a folder or .sqlite file path"),
    ("include_path", [5], "a list of folder paths"), ("log_samples", "no", "true or false"),
    ("strict", "false", "true or false"), ("progress", 1, "true or false"), ("corpus", 3, "a corpus store"),
    ("kb", ["x"], "a knowledge base file"), ("ray_address", 1, "a Ray address"), ("merge_fill_missing", "yes",
                                                                                "true or false"),
])
def test_config_values_of_the_wrong_type_are_one_message(tmp_path, capsys, key, value, expected):
    with pytest.raises(EvalError, match=rf"^{key}: expected {expected}"):
        EvalConfig.from_dict({key: value})
    run = tmp_path / "run.yaml"
    run.write_text(json.dumps({key: value, "output_path": str(tmp_path / "o")} if key != "output_path"
                              else {key: value}))
    rc = main(["--config", str(run)])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("error:") == 1 and err.startswith(f"rcn_fast.eval: error: {key}: expected")
    assert "Traceback" not in err


def test_yaml_booleans_still_work():
    cfg = EvalConfig.from_dict({"log_samples": True, "strict": False})
    assert cfg.log_samples is True and cfg.strict is False


def test_long_names_keep_their_suffix_and_stay_distinct():
    from rcn_fast._paths import safe_component

    a, b = safe_component("samples_" + "x" * 300 + "_a.jsonl"), safe_component("samples_" + "x" * 300 + "_b.jsonl")
    assert a != b and len(a) <= 200 and a.endswith(".jsonl") and b.endswith(".jsonl")
