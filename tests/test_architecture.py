"""Architecture ratchets over rcn_fast/ (issue 28): no import cycle among
module-level imports, no file above 600 lines, no ``_private`` name
imported from another module (except from the ``_``-prefixed shared helper
modules).

Each check compares what it finds with an allow-list of the violations
known when it was written: a new one fails the test; an entry that is no
longer a violation is reported as a warning (delete its line). Issue 28
removes every allow-listed entry.

The walk reads the source with :mod:`ast` only (nothing is imported), so
it sees every ``from rcn_fast... import`` / ``import rcn_fast...`` at module
level (class bodies and ``try`` / ``if`` blocks included, except
``if TYPE_CHECKING:``) and inside functions.
"""

from __future__ import annotations

import ast
import os
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "rcn_fast"
MAX_LINES = 600

#: The ``_``-prefixed shared helper modules: importing their names (and the modules) is allowed.
SHARED_HELPERS = frozenset(f"rcn_fast.{m}" for m in ("_validate", "_arrays", "_dispatch", "_paths", "_stamped_json",
                                                     "_native", "_crossovers", "_cache_dirs", "_hashing", "_lazy"))

# ---------------------------------------------------------------- allow-lists
# Today's known violations, one file a line; issue 28 removes them all. A new
# violation fails the test; when one is fixed, delete its line.

#: Files in an import cycle of module-level imports (issue 28 removes these cycles).
CYCLE_FILES: frozenset[str] = frozenset()

#: Files above MAX_LINES lines (issue 28 splits them).
LONG_FILES: frozenset[str] = frozenset()

#: Importing file -> how many ``_private`` names it imports from other rcn_fast modules (issue 28 removes them).
PRIVATE_IMPORTS: dict[str, int] = {}


# ---------------------------------------------------------------- the walk
@dataclass(frozen=True)
class Import:
    """One ``rcn_fast`` import: the importing file, the module it loads, the
    names taken from it, and whether it runs at import time."""

    file: str
    target: str
    names: tuple[str, ...]
    module_level: bool


def module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def source_files() -> dict[str, Path]:
    """Module name -> file, for every ``.py`` under rcn_fast/ (the kernels
    link included)."""
    out: dict[str, Path] = {}
    for d, _, files in os.walk(PKG, followlinks=True):
        for f in files:
            if f.endswith(".py"):
                p = Path(d) / f
                out[module_name(p)] = p
    return out


def _resolve(module: str | None, level: int, here: str, is_pkg: bool) -> str | None:
    if level == 0:
        return module
    base = here.split(".") if is_pkg else here.split(".")[:-1]
    base = base[: len(base) - (level - 1)]
    return ".".join(base + ([module] if module else []))


def _is_type_checking(node: ast.If) -> bool:
    t = node.test
    return (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or \
        (isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING")


def imports_of(name: str, path: Path, modules: dict[str, Path]) -> list[Import]:
    """Every ``rcn_fast`` import of one file. ``from pkg import sub`` with
    ``pkg.sub`` a module counts as an import of ``pkg.sub``."""
    rel = path.relative_to(ROOT).as_posix()
    is_pkg = path.name == "__init__.py"
    out: list[Import] = []

    def visit(node: ast.AST, top: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                visit(child, False)
                continue
            if isinstance(child, ast.If) and _is_type_checking(child):
                continue
            if isinstance(child, ast.Import):
                for a in child.names:
                    if a.name == "rcn_fast" or a.name.startswith("rcn_fast."):
                        out.append(Import(rel, a.name, (), top))
            elif isinstance(child, ast.ImportFrom):
                mod = _resolve(child.module, child.level, name, is_pkg)
                if mod is None or not (mod == "rcn_fast" or mod.startswith("rcn_fast.")):
                    continue
                plain = []
                for a in child.names:
                    if f"{mod}.{a.name}" in modules:
                        out.append(Import(rel, f"{mod}.{a.name}", (), top))
                    else:
                        plain.append(a.name)
                if plain or not child.names:
                    out.append(Import(rel, mod, tuple(plain), top))
            visit(child, top)

    visit(ast.parse(path.read_text(encoding="utf-8"), filename=str(path)), True)
    return out


def all_imports() -> tuple[dict[str, Path], list[Import]]:
    modules = source_files()
    found = [imp for name, path in sorted(modules.items()) for imp in imports_of(name, path, modules)]
    return modules, found


def cycles(modules: dict[str, Path], found: list[Import], *, function_level: bool = False) -> list[list[str]]:
    """Strongly connected components (more than one module, or a module
    importing itself) of the module-level import graph, as sorted module
    names (Tarjan's algorithm, iterative).

    ``function_level``: count the imports inside functions too, between
    plain modules (a package's ``__init__`` re-exports its children, so a
    child's lazy ``from rcn_fast.pkg import name`` is left out)."""
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for imp in found:
        src = module_name(ROOT / imp.file)
        if not (imp.module_level or function_level) or imp.target not in modules:
            continue
        if function_level and not imp.module_level and (modules[src].name == "__init__.py"
                                                         or modules[imp.target].name == "__init__.py"):
            continue
        graph[src].add(imp.target)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    comps: list[list[str]] = []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on.add(start)
        while work:
            v, it = work[-1]
            for w in it:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                    break
                if w in on:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on.discard(w)
                        comp.append(w)
                        if w == v:
                            break
                    if len(comp) > 1 or v in graph[v]:
                        comps.append(sorted(comp))
    return sorted(comps)


def private_imports(found: list[Import]) -> dict[str, list[str]]:
    """Importing file -> the ``_private`` names it takes from another
    rcn_fast module (``module:name``), the shared helpers excepted."""
    out: dict[str, list[str]] = {}
    for imp in found:
        if imp.target in SHARED_HELPERS or module_name(ROOT / imp.file) == imp.target:
            continue
        for n in imp.names:
            if n.startswith("_") and not n.startswith("__") and f"rcn_fast.{n}" not in SHARED_HELPERS:
                out.setdefault(imp.file, []).append(f"{imp.target}:{n}")
    return out


def long_files(modules: dict[str, Path]) -> dict[str, int]:
    out = {}
    for p in modules.values():
        n = len(p.read_text(encoding="utf-8").splitlines())
        if n > MAX_LINES:
            out[p.relative_to(ROOT).as_posix()] = n
    return out


def _stale(kind: str, entries: set[str]) -> None:
    if entries:
        warnings.warn(f"{kind}: no longer violations, delete from the allow-list: {sorted(entries)}", stacklevel=2)


# ---------------------------------------------------------------- the walk itself
def test_walk_sees_known_imports():
    """The walk finds module- and function-level imports, resolves
    ``from pkg import submodule`` and relative imports, and skips
    ``if TYPE_CHECKING:``; the cycle finder sees a planted cycle."""
    modules, found = all_imports()
    assert len(modules) > 100 and "rcn_fast.pipelines.rr.pipeline" in modules
    rr = [i for i in found if i.file == "rcn_fast/pipelines/rr/pipeline.py"]
    assert any(i.target == "rcn_fast.pipelines.base" and i.module_level and "StagedPipeline" in i.names for i in rr)
    assert any(i.target == "rcn_fast.nli" and not i.module_level for i in rr)  # inside RR.__init__
    fake = {"rcn_fast.a": ROOT / "rcn_fast/a.py", "rcn_fast.b": ROOT / "rcn_fast/b.py",
            "rcn_fast.c": ROOT / "rcn_fast/c.py"}
    edges = [Import("rcn_fast/a.py", "rcn_fast.b", (), True), Import("rcn_fast/b.py", "rcn_fast.a", (), True),
             Import("rcn_fast/b.py", "rcn_fast.c", (), True), Import("rcn_fast/c.py", "rcn_fast.a", (), False)]
    assert cycles(fake, edges) == [["rcn_fast.a", "rcn_fast.b"]]  # c -> a is function-level: no cycle
    priv = private_imports([Import("rcn_fast/a.py", "rcn_fast.b", ("_x", "y", "__all__"), True),
                            Import("rcn_fast/a.py", "rcn_fast._validate", ("_hidden",), True),
                            Import("rcn_fast/a.py", "rcn_fast", ("_arrays",), True)])
    assert priv == {"rcn_fast/a.py": ["rcn_fast.b:_x"]}


def test_parse_relative_and_type_checking(tmp_path, monkeypatch):
    src = ("from typing import TYPE_CHECKING\nfrom . import sib\nfrom .sib import _p\n"
           "if TYPE_CHECKING:\n    from rcn_fast.eval.run import runner\n"
           "def f():\n    import rcn_fast.search.topn\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    pkg = tmp_path / "rcn_fast" / "x"
    pkg.mkdir(parents=True)
    (pkg / "m.py").write_text(src)
    mods = {"rcn_fast.x.m": pkg / "m.py", "rcn_fast.x.sib": pkg / "sib.py"}
    got = imports_of("rcn_fast.x.m", pkg / "m.py", mods)
    assert [(i.target, i.names, i.module_level) for i in got] == [
        ("rcn_fast.x.sib", (), True), ("rcn_fast.x.sib", ("_p",), True), ("rcn_fast.search.topn", (), False)]


# ---------------------------------------------------------------- the ratchets
def test_no_cycle_between_modules_even_inside_functions():
    """Issue 28: no import circle under rcn_fast/, lazy imports inside
    functions included (only a package's ``__init__`` is left out, see
    :func:`cycles`)."""
    modules, found = all_imports()
    assert cycles(modules, found, function_level=True) == []
    fake = {"rcn_fast.a": ROOT / "rcn_fast/a.py", "rcn_fast.b": ROOT / "rcn_fast/b.py"}
    planted = [Import("rcn_fast/a.py", "rcn_fast.b", (), True), Import("rcn_fast/b.py", "rcn_fast.a", (), False)]
    assert cycles(fake, planted) == [] and cycles(fake, planted, function_level=True) == [["rcn_fast.a", "rcn_fast.b"]]


def test_no_new_import_cycle():
    modules, found = all_imports()
    comps = cycles(modules, found)
    in_cycle = {modules[m].relative_to(ROOT).as_posix() for comp in comps for m in comp}
    new = in_cycle - CYCLE_FILES
    assert not new, (f"new import cycle(s) among module-level imports through {sorted(new)}; cycles: "
                     f"{[c for c in comps if any(modules[m].relative_to(ROOT).as_posix() in new for m in c)]}")
    _stale("import cycles", CYCLE_FILES - in_cycle)


def test_no_new_long_file():
    modules, _ = all_imports()
    big = long_files(modules)
    new = {f: n for f, n in big.items() if f not in LONG_FILES}
    assert not new, f"files above {MAX_LINES} lines (split them): {new}"
    _stale("long files", LONG_FILES - set(big))


def test_no_new_private_import():
    _, found = all_imports()
    priv = private_imports(found)
    grown = {f: names for f, names in priv.items() if len(names) > PRIVATE_IMPORTS.get(f, 0)}
    assert not grown, ("_private names imported from other rcn_fast modules (make them public or move them to a "
                       f"shared helper): {grown}")
    _stale("private imports", {f for f in PRIVATE_IMPORTS if len(priv.get(f, ())) < PRIVATE_IMPORTS[f]})


@pytest.mark.parametrize("kind", ["cycles", "long", "private"])
def test_allow_lists_name_real_files(kind):
    """Every allow-listed path exists under rcn_fast/ (a typo would hide nothing)."""
    entries = {"cycles": CYCLE_FILES, "long": LONG_FILES, "private": set(PRIVATE_IMPORTS)}[kind]
    missing = [f for f in entries if not (ROOT / f).is_file()]
    assert not missing, missing
