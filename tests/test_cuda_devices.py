"""The device check (issue 55 item 2): a walk of the package (its source,
read with :mod:`ast`; nothing imported, as tests/test_trust_doors.py walks
it) that fails when a CUDA launch site can run under another device than
its inputs'.

The CUDA runtime launches a kernel on the current device, and a stream of
another device is an invalid handle there; Triton launches on the current
device with its current stream; ``Event.record()`` and
``torch.cuda.current_stream()`` without an argument mean the current
device's stream. So, over rcn_fast/ and kernels/:

* every call of a launcher of rcn_fast._cuda (the functions its bindings
  declare with a ``stream`` argument, read from csrc/bindings/) sits inside
  ``with torch.cuda.device(...)`` or ``with A.on_device(...)`` (a receiver
  bound from ``_native.cpu_module()`` in the same function is the CPU
  module: exempt);
* every Triton launch (``kernel[grid](...)``) sits inside one too;
* every event is recorded on a named stream, and the torch.cuda calls that
  default to the current device (current_stream, Stream, synchronize,
  mem_get_info, get_device_properties ...) name their device.

On fca19ce's code this fails on W3 (the encoder's ``done.record()``), C2
(the GEMM tiles' merge and the int8 launches) and C4 (the Triton launches);
the stand-in of tests/test_cuda_streams.py checks the same at run time.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SOURCES = {p.relative_to(ROOT).as_posix(): ast.parse(p.read_text(encoding="utf-8"))
           for base in (ROOT / "rcn_fast", ROOT / "kernels") for p in sorted(base.rglob("*.py"))}
#: torch.cuda functions whose device argument defaults to the current device.
IMPLICIT_DEVICE = {"current_stream", "default_stream", "Stream", "synchronize", "mem_get_info", "get_device_properties",
                   "memory_reserved", "memory_allocated", "get_device_name", "get_device_capability"}


def cuda_launchers() -> set[str]:
    """The functions rcn_fast._cuda's bindings declare with a stream argument."""
    names = set()
    for cpp in sorted((ROOT / "csrc" / "bindings").glob("*.cpp")):
        text = cpp.read_text()
        for m in re.finditer(r'm\.def\(\s*"(\w+)"(.*?)\);', text, re.S):
            if 'nb::arg("stream")' in m.group(2):
                names.add(m.group(1))
    return names


def _parents(tree: ast.AST) -> dict[ast.AST, ast.AST]:
    return {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}


def _ancestors(node: ast.AST, parents: dict) -> list[ast.AST]:
    out = []
    while node in parents:
        node = parents[node]
        out.append(node)
    return out


def _is_device_guard(expr: ast.AST) -> bool:
    if not isinstance(expr, ast.Call):
        return False
    text = ast.unparse(expr.func)
    return text.endswith("cuda.device") or text.split(".")[-1] == "on_device"


def _guarded(node: ast.AST, parents: dict) -> bool:
    return any(isinstance(a, (ast.With, ast.AsyncWith)) and any(_is_device_guard(i.context_expr) for i in a.items)
               for a in _ancestors(node, parents))


def _cpu_module_names(func: ast.AST | None) -> set[str]:
    """Names bound from ``..._native.cpu_module()`` in a function."""
    names: set[str] = set()
    if func is None:
        return names
    for n in ast.walk(func):
        if isinstance(n, ast.Assign) and isinstance(n.value, ast.Call) and \
                ast.unparse(n.value.func).endswith("cpu_module"):
            for t in n.targets:
                elts = t.elts if isinstance(t, ast.Tuple) else [t]
                if elts and isinstance(elts[0], ast.Name):
                    names.add(elts[0].id)
    return names


def _imported_names(tree: ast.AST) -> set[str]:
    """Names an import binds (modules, functions): ``rcn_fast.topn(...)`` is no launch."""
    out = set()
    for n in ast.walk(tree):
        if isinstance(n, (ast.Import, ast.ImportFrom)):
            out.update((a.asname or a.name).split(".")[0] for a in n.names)
    return out


def _triton_launch(call: ast.Call) -> bool:
    """``<...>_kernel[grid](...)``: the Triton kernels of kernels/ are named ``*_kernel``."""
    if not isinstance(call.func, ast.Subscript):
        return False
    v = call.func.value
    name = v.attr if isinstance(v, ast.Attribute) else v.id if isinstance(v, ast.Name) else ""
    return name.endswith("kernel")


def launch_sites(launchers: set[str]) -> list[tuple[str, ast.Call, dict]]:
    out = []
    for rel, tree in SOURCES.items():
        parents, imported = _parents(tree), _imported_names(tree)
        for n in ast.walk(tree):
            if not isinstance(n, ast.Call):
                continue
            if _triton_launch(n):
                out.append((rel, n, parents))
            elif isinstance(n.func, ast.Attribute) and n.func.attr in launchers:
                func = next((a for a in _ancestors(n, parents) if isinstance(a, (ast.FunctionDef,
                                                                                ast.AsyncFunctionDef))), None)
                recv = n.func.value
                if isinstance(recv, ast.Name) and (recv.id in _cpu_module_names(func) or recv.id in imported):
                    continue
                out.append((rel, n, parents))
    return out


def test_the_walk_sees_the_launchers_and_the_package():
    launchers = cuda_launchers()
    assert {"topn", "topn_block_select", "topn_merge_lists", "topn_split_queries", "topn_int8_scan",
            "topn_finish_rows", "sample_subsets"} <= launchers
    assert "rcn_fast/search/cuda_tiled.py" in SOURCES and "kernels/choice_scoring.py" in SOURCES
    sites = launch_sites(launchers)
    where = {rel for rel, _, _ in sites}
    assert {"rcn_fast/search/cuda_tiled.py", "rcn_fast/search/int8_cuda.py", "rcn_fast/search/torch_backend.py",
            "rcn_fast/search/topn.py", "rcn_fast/sampling/relevance.py",
            "rcn_fast/llm/scoring/triton_launch.py"} <= where, where
    assert len(sites) >= 9  # the int8 search is one launch since issue 55, S2 (three before)


def test_every_launch_runs_under_its_inputs_device():
    bad = [f"{rel}:{n.lineno}: {ast.unparse(n.func)}(...) outside `with torch.cuda.device(...)` / "
           "`with A.on_device(...)`" for rel, n, parents in launch_sites(cuda_launchers()) if not _guarded(n, parents)]
    assert not bad, "CUDA launches that run under whatever device is current:\n" + "\n".join(bad)


def test_events_and_streams_name_their_device():
    bad = []
    for rel, tree in SOURCES.items():
        uses_events = "cuda.Event" in ast.unparse(tree)
        for n in ast.walk(tree):
            if not isinstance(n, ast.Call) or not isinstance(n.func, ast.Attribute):
                continue
            text = ast.unparse(n.func)
            if uses_events and n.func.attr == "record" and not n.args and not n.keywords:
                bad.append(f"{rel}:{n.lineno}: {text}() records on the current device's stream")
            if ".cuda." in f".{text}" and n.func.attr in IMPLICIT_DEVICE and not n.args and not n.keywords:
                bad.append(f"{rel}:{n.lineno}: {text}() means the current device")
    assert not bad, "calls that default to the current device:\n" + "\n".join(bad)


@pytest.mark.parametrize("source", [
    "def f(mod, s):\n    mod.topn_merge_lists(a, b, c, d, s)\n",
    "def f(K, x):\n    K.choice_kernel[(3,)](x_ptr=x)\n",
])
def test_the_walk_fails_on_an_unguarded_launch(source):
    tree = ast.parse(source)
    parents = _parents(tree)
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and
             (_triton_launch(n) or getattr(n.func, "attr", "") in cuda_launchers())]
    assert calls and not any(_guarded(n, parents) for n in calls)
    guarded = ast.parse("def f(mod, s, x):\n    with torch.cuda.device(x.device):\n" +
                        "".join("    " + line + "\n" for line in source.splitlines()[1:]))
    parents = _parents(guarded)
    calls = [n for n in ast.walk(guarded) if isinstance(n, ast.Call) and
             (_triton_launch(n) or getattr(n.func, "attr", "") in cuda_launchers())]
    assert calls and all(_guarded(n, parents) for n in calls)
