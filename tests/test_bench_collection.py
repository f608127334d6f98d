"""`pytest bench/ --benchmark-only` collects every benchmark (issue 27.4):
pyproject's python_files covers bench_*.py while testpaths keeps the main
test command on tests/; bench/ runs without the tests folder; the
benchmarks' rounds follow pytest-benchmark's own options."""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
BENCH = REPO / "bench"
BENCH_FILES = sorted(p.name for p in BENCH.glob("bench_*.py"))
# what the bench modules skip without (module-level importorskip)
BENCH_NEEDS = ("pytest_benchmark", "torch", "transformers", "onnxruntime", "bm25s", "pysbd")


def _imported_modules(path: Path) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
    return out


def test_bench_files_do_not_import_the_tests_folder():
    assert BENCH_FILES, f"no bench_*.py under {BENCH}"
    for path in sorted(BENCH.glob("*.py")):
        mods = _imported_modules(path)
        bad = sorted(m for m in mods if m == "tests" or m.startswith("tests.") or m.split(".")[0].startswith("test_")
                     or m.split(".")[0] in ("llm_helpers", "conftest"))
        assert not bad, f"{path.name} imports from the tests folder: {bad} (use rcn_fast.testing)"
        if path.name in RUNNERS:
            continue
        assert not re.search(r"""["']tests["']""", path.read_text()), f"{path.name} puts the tests folder on a path"


# bench/ files that run the test suite as a step of their own (in a
# subprocess, skipped when tests/ is absent): the device check, issue 35
RUNNERS = {"gpu_check.py"}


def _pytest_ini() -> dict:
    try:
        import tomllib
    except ImportError:  # Python 3.10
        tomllib = pytest.importorskip("tomli")
    return tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]


def test_pyproject_collects_bench_files_but_runs_only_tests_by_default():
    from fnmatch import fnmatch

    ini = _pytest_ini()
    assert ini["testpaths"] == ["tests"]
    for name in BENCH_FILES:
        assert any(fnmatch(name, pat) for pat in ini["python_files"]), f"{name} matches no python_files pattern"
    assert any(fnmatch("test_x.py", pat) for pat in ini["python_files"])


def _run_pytest(cwd: Path, *args: str, env_extra: dict[str, str] | None = None, timeout: int = 600):
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env.update(env_extra or {})
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)


def test_root_pytest_keeps_to_testpaths(tmp_path):
    """With the project's [tool.pytest.ini_options], `pytest` at the root
    collects tests/ only: a bench_*.py file is never run by the test
    command (a stand-in project: collecting the real suite takes minutes)."""
    (tmp_path / "pyproject.toml").write_text((REPO / "pyproject.toml").read_text())
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_a.py").write_text("def test_a():\n    pass\n")
    (tmp_path / "bench").mkdir()
    (tmp_path / "bench" / "bench_b.py").write_text("def test_b():\n    pass\n")
    root = _run_pytest(tmp_path, "--collect-only", "-q")
    assert root.returncode == 0, root.stdout + root.stderr
    assert "tests/test_a.py::test_a" in root.stdout and "bench_b" not in root.stdout
    named = _run_pytest(tmp_path, "--collect-only", "-q", "bench")
    assert named.returncode == 0 and "bench/bench_b.py::test_b" in named.stdout, named.stdout + named.stderr


def _tree_without_tests(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """A copy of pyproject.toml and bench/ with the rcn_fast in use linked
    beside it, and no tests folder anywhere on the path."""
    import rcn_fast

    root = tmp_path / "project"
    root.mkdir()
    shutil.copy(REPO / "pyproject.toml", root / "pyproject.toml")
    shutil.copytree(BENCH, root / "bench", ignore=shutil.ignore_patterns("__pycache__", "gpu_results"))
    site = tmp_path / "site"
    site.mkdir()
    (site / "rcn_fast").symlink_to(Path(rcn_fast.__file__).resolve().parent, target_is_directory=True)
    return root, {"PYTHONPATH": str(site), "PYTHONSAFEPATH": "1", "RCN_FAST_BENCH_QUICK": "1"}


@pytest.mark.slow
def test_pytest_bench_collects_every_file_without_the_tests_folder(tmp_path):
    for mod in BENCH_NEEDS:
        pytest.importorskip(mod)
    root, env = _tree_without_tests(tmp_path)
    proc = _run_pytest(root, "--collect-only", "-q", "bench/", "--benchmark-only", env_extra=env)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert not (root / "tests").exists() and "ModuleNotFoundError" not in out
    counts = {name: len(re.findall(rf"^bench/{re.escape(name)}::", proc.stdout, re.M)) for name in BENCH_FILES}
    assert all(n > 0 for n in counts.values()), counts


@pytest.mark.slow
def test_benchmark_min_rounds_sets_the_rounds(tmp_path):
    """--benchmark-min-rounds reaches a calibrated benchmark and the
    ``pedantic`` fixture of bench/conftest.py (heavy workloads)."""
    pytest.importorskip("pytest_benchmark")
    root, env = _tree_without_tests(tmp_path)
    for p in (root / "bench").glob("bench_*.py"):
        p.unlink()
    (root / "bench" / "bench_rounds.py").write_text(
        "import json, os\n\n"
        "def _log(tag):\n"
        "    with open(os.environ['ROUNDS_LOG'], 'a') as f:\n"
        "        f.write(tag + '\\n')\n\n"
        "def test_calibrated(benchmark):\n"
        "    benchmark(lambda: __import__('time').sleep(0.3))\n"
        "    _log(f'calibrated {len(benchmark.stats.stats.data)}')\n\n"
        "def test_heavy(pedantic, benchmark):\n"
        "    pedantic(_log, 'call')\n"
        "    _log(f'heavy {len(benchmark.stats.stats.data)}')\n")
    log = tmp_path / "rounds.log"
    env["ROUNDS_LOG"] = str(log)
    proc = _run_pytest(root, "-q", "bench/", "--benchmark-only", "--benchmark-min-rounds=7",
                       "--benchmark-max-time=0.000001", env_extra=env, timeout=300)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    lines = log.read_text().split()
    assert "calibrated" in lines and lines[lines.index("calibrated") + 1] == "7"
    assert lines.count("call") == 7 and lines[lines.index("heavy") + 1] == "7"
