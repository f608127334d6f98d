"""Issue 34 item 3: no model folder runs its own Python code.

Every transformers loader in the package is called with
``trust_remote_code=False`` (checked on the source: every
``from_pretrained(`` / ``from_config(`` call), and a folder whose
``config.json`` or ``tokenizer_config.json`` holds an ``auto_map`` is
refused up front with a message naming the file -- for the LLM, the
encoder, the NLI model and a tokenizer-only folder -- before anything in
it could be imported. Tiny random-weight models built in code."""

from __future__ import annotations

import ast
import json
import shutil
from pathlib import Path

import pytest

import rcn_fast

PACKAGE = Path(rcn_fast.__file__).resolve().parent
#: receivers of ``from_pretrained`` / ``from_config`` that are rcn_fast's own classes (no transformers call)
OWN = {"Encoder": "rcn_fast.retrieval.Encoder", "NLIModel": "rcn_fast.nli.NLIModel"}
LOADERS = ("from_pretrained", "from_config")


def _receiver(call: ast.Call) -> str:
    f = call.func
    assert isinstance(f, ast.Attribute)
    v = f.value
    return v.id if isinstance(v, ast.Name) else ast.unparse(v)


def _loader_calls() -> list[tuple[Path, ast.Call]]:
    calls = []
    for py in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(py.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in LOADERS:
                calls.append((py, node))
    return calls


def test_every_transformers_loader_call_passes_trust_remote_code_false():
    calls = _loader_calls()
    text_hits = sum(py.read_text(encoding="utf-8").count(".from_pretrained(") for py in PACKAGE.rglob("*.py"))
    assert len(calls) >= 15 and text_hits >= len([c for c in calls if c[1].func.attr == "from_pretrained"])
    missing = []
    for py, call in calls:
        who = _receiver(call)
        if who in OWN or who in ("cls", "Encoder"):
            continue
        kw = {k.arg: k.value for k in call.keywords}
        v = kw.get("trust_remote_code")
        if not (isinstance(v, ast.Constant) and v.value is False):
            missing.append(f"{py.relative_to(PACKAGE.parent)}:{call.lineno}: {who}.{call.func.attr}")
    assert not missing, "loader calls without trust_remote_code=False:\n" + "\n".join(missing)


def test_the_exempt_receivers_are_rcn_fasts_own_classes():
    import importlib

    for name, path in OWN.items():
        mod, _, attr = path.rpartition(".")
        cls = getattr(importlib.import_module(mod), attr)
        assert cls.__module__.startswith("rcn_fast.") and cls.__name__ == name


def test_vllm_engine_passes_trust_remote_code_false():
    src = (PACKAGE / "llm" / "backends" / "vllm_engine.py").read_text(encoding="utf-8")
    assert '"trust_remote_code": False' in src and "vllm.LLM(model=model, **{**engine_kwargs" in src


# ------------------------------------------------------------------ auto_map folders
MARKER = "IMPORTED_REMOTE_CODE"


def _with_auto_map(src: Path, dst: Path, file: str, key: str) -> Path:
    shutil.copytree(src, dst)
    (dst / "modeling_evil.py").write_text(f"open({str(dst / MARKER)!r}, 'w').write('ran')\n")
    (dst / "tokenization_evil.py").write_text(f"open({str(dst / MARKER)!r}, 'w').write('ran')\n")
    cfg = json.loads((dst / file).read_text())
    cfg["auto_map"] = {key: "modeling_evil.EvilModel" if file == "config.json" else
                       ["tokenization_evil.EvilTokenizer", None]}
    (dst / file).write_text(json.dumps(cfg))
    return dst


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    pytest.importorskip("transformers")
    from rcn_fast.testing.tiny_llm import make_tiny_llama

    return make_tiny_llama(tmp_path_factory.mktemp("llama") / "m")


@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory):
    pytest.importorskip("transformers")
    from rcn_fast.testing.tiny_retrieval import make_tiny_bert

    return make_tiny_bert(tmp_path_factory.mktemp("bert") / "b")


@pytest.mark.parametrize("file, key", [("config.json", "AutoModelForCausalLM"),
                                       ("tokenizer_config.json", "AutoTokenizer")])
def test_an_llm_folder_with_an_auto_map_is_refused_naming_the_file(tiny_llama, tmp_path, file, key):
    from rcn_fast.llm import load_llm

    d = _with_auto_map(tiny_llama, tmp_path / "evil", file, key)
    with pytest.raises(ValueError, match=rf"{d / file} holds an 'auto_map' \(.*evil.*trust_remote_code=False"):
        load_llm(str(d), device="cpu")
    assert not (d / MARKER).exists()


def test_the_eval_refuses_such_a_model_with_one_message(tiny_llama, tmp_path, capsys):
    from rcn_fast.eval.cli import main
    from tests.test_eval import write_questions

    d = _with_auto_map(tiny_llama, tmp_path / "evil", "config.json", "AutoModelForCausalLM")
    q = write_questions(tmp_path / "q.jsonl", n=2)
    rc = main(["--tasks", str(q), "--pipelines", "vanilla", "--model", str(d), "--output-path", str(tmp_path / "o"),
               "--no-progress", "--no-plot", "--device", "cpu"])
    err = capsys.readouterr().err
    assert rc == 2 and "holds an 'auto_map'" in err and str(d / "config.json") in err and "Traceback" not in err
    assert not (d / MARKER).exists()


@pytest.mark.parametrize("file, key", [("config.json", "AutoModel"), ("tokenizer_config.json", "AutoTokenizer")])
def test_an_encoder_or_nli_folder_with_an_auto_map_is_refused(tiny_bert, tmp_path, file, key):
    from rcn_fast.nli import NLIModel
    from rcn_fast.retrieval import Encoder

    d = _with_auto_map(tiny_bert, tmp_path / "evil", file, key)
    with pytest.raises(ValueError, match=rf"{d / file} holds an 'auto_map'"):
        Encoder.from_pretrained(str(d), device="cpu")
    with pytest.raises(ValueError, match=rf"{d / file} holds an 'auto_map'"):
        NLIModel.from_pretrained(str(d), device="cpu")
    assert not (d / MARKER).exists()


def test_a_tokenizer_only_folder_with_an_auto_map_is_refused(tiny_llama, tmp_path):
    from rcn_fast.llm.tokenizer import load_tokenizer

    d = tmp_path / "tok"
    d.mkdir()
    for f in tiny_llama.iterdir():
        if f.name.startswith(("tokenizer", "special_tokens")):
            shutil.copy(f, d / f.name)
    assert load_tokenizer(str(d)) is not None  # a clean tokenizer folder loads
    cfg = json.loads((d / "tokenizer_config.json").read_text())
    cfg["auto_map"] = {"AutoTokenizer": ["tokenization_evil.EvilTokenizer", None]}
    (d / "tokenizer_config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=r"tokenizer_config.json holds an 'auto_map' \(tokenization_evil"):
        load_tokenizer(str(d))


def test_a_clean_folder_still_loads(tiny_llama):
    from rcn_fast.model_files import refuse_remote_code, resolve_model_path

    refuse_remote_code(tiny_llama)
    assert resolve_model_path(str(tiny_llama)) == tiny_llama.resolve()
