"""The OpenAI client and the vLLM engine as leaves (issue 28 item 3): each
object's state is declared in its ``__init__`` (no field appears later, and
no other module sets fields on it), and the client does not import
``load_llm``'s module back (the old ``load <-> openai`` circle)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

LLM_DIR = Path(__file__).resolve().parents[2] / "rcn_fast" / "llm"
LEAVES = sorted((LLM_DIR / "openai").glob("*.py")) + [LLM_DIR / n for n in (
    "backends/vllm_engine.py", "scoring/served.py", "registry.py")]


def _self_fields(fn: ast.AST) -> set[str]:
    """Fields assigned as ``self.<name> = ...`` (plain, tuple, augmented or annotated) in ``fn``."""
    out = set()
    for node in ast.walk(fn):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
            node, (ast.AugAssign, ast.AnnAssign)) else []
        for t in targets:
            for e in ast.walk(t):
                if isinstance(e, ast.Attribute) and isinstance(e.value, ast.Name) and e.value.id == "self":
                    out.add(e.attr)
    return out


@pytest.mark.parametrize("path", LEAVES, ids=lambda p: p.name)
def test_state_fields_are_created_in_init_only(path):
    tree = ast.parse(path.read_text())
    for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
        methods = [m for m in cls.body if isinstance(m, ast.FunctionDef)]
        props = {m.name for m in methods if any(isinstance(d, ast.Attribute) and d.attr == "setter"
                                                for d in m.decorator_list)}
        init = next((m for m in methods if m.name == "__init__"), None)
        fields = {n.target.id for n in cls.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}
        declared = (_self_fields(init) if init else set()) | props | fields  # a dataclass declares its fields
        for m in methods:
            if m.name != "__init__":
                late = _self_fields(m) - declared
                assert not late, f"{path.name}: {cls.name}.{m.name} creates {sorted(late)} outside __init__"
    # no function sets a field on another object (as served_digest once set llm._served_digest)
    for fn in (n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))):
        for node in ast.walk(fn):
            if isinstance(node, ast.Assign):
                for t in node.targets:
                    if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id != "self":
                        pytest.fail(f"{path.name}:{node.lineno}: {fn.name} sets {t.value.id}.{t.attr}")


@pytest.mark.parametrize("path", LEAVES, ids=lambda p: p.name)
def test_backends_do_not_import_load_llm_module(path):
    for node in ast.walk(ast.parse(path.read_text())):
        mods = [node.module] if isinstance(node, ast.ImportFrom) else [a.name for a in node.names] if isinstance(
            node, ast.Import) else []
        assert "rcn_fast.llm.load" not in mods, f"{path.name}:{node.lineno} imports rcn_fast.llm.load"


def test_swapping_the_config_reaches_the_transport_and_keeps_the_dialect():
    import dataclasses

    from rcn_fast.llm.openai.client import OpenAIConfig, OpenAILLM

    llm = OpenAILLM("http://127.0.0.1:9", "m", OpenAIConfig(max_retries=6))
    assert llm.base_url == "http://127.0.0.1:9/v1" and llm.transport.config is llm.config
    llm.config = dataclasses.replace(llm.config, max_retries=1)  # what the preflight does for a while
    assert llm.transport.config.max_retries == 1
    with pytest.raises(ValueError, match="prompt_logprobs_field is fixed"):
        llm.config = dataclasses.replace(llm.config, prompt_logprobs_field="vllm")
    with pytest.raises(TypeError, match="config: expected an OpenAIConfig"):
        llm.config = {"max_retries": 1}
    assert llm.capabilities.token_prompts is None and llm.served_info is None  # nothing asked yet
