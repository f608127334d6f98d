"""Shared benchmark plumbing: every benchmark records its time under a group
(the same workload), and the session ends with a table of ratios against
the peers measured in the same run.

Run: ``python -m pytest bench/ --benchmark-only`` (see README for sizes);
the quick settings (smaller workloads, one round each)::

    RCN_FAST_BENCH_QUICK=1 python -m pytest bench/ --benchmark-only --benchmark-min-rounds=1

Rounds follow pytest-benchmark's own options: most benchmarks call
``benchmark(fn)`` (calibrated: ``--benchmark-min-rounds``,
``--benchmark-max-time``, ``--benchmark-warmup`` ...); workloads of many
seconds a call use the ``pedantic`` fixture below, which takes its rounds
from ``--benchmark-min-rounds``. Helpers shared with the tests (tiny models,
the baselines) come from :mod:`rcn_fast.testing`, never from ``tests/``.
"""

from __future__ import annotations

import datetime
import json
import os
import re
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

# rcn_fast.testing.data finds ../shared next to the checkout it was imported
# from; an installed rcn_fast has none, so name this checkout's
os.environ.setdefault("RCN_FAST_SHARED", str(Path(__file__).resolve().parents[1].parent / "shared"))

_RESULTS: dict[str, dict[str, float]] = defaultdict(dict)
_NOTES: list[str] = []
_FAST = {"native", "rcn_fast", "batched", "cuda", "triton", "onnx"}


@pytest.fixture
def note():
    """``note(line)``: a line printed in the session's summary (a figure
    that is not a time: a rate against the hardware's, a retrieval
    agreement)."""
    return _NOTES.append


@pytest.fixture
def record():
    """``record(group, impl, benchmark)`` after a benchmark ran: keeps its mean."""

    def _record(group: str, impl: str, benchmark: Any) -> None:
        stats = getattr(benchmark, "stats", None)
        if stats is not None:
            _RESULTS[group][impl] = stats.stats.mean

    return _record


def pedantic_rounds(config: Any) -> tuple[int, int]:
    """(rounds, warm-up rounds) of a pedantic benchmark from pytest-benchmark's
    options: ``--benchmark-min-rounds`` rounds (its default: 5), and one
    warm-up round when ``--benchmark-warmup`` is on (and
    ``--benchmark-warmup-iterations`` is not 0)."""
    rounds = max(1, int(config.getoption("benchmark_min_rounds")))
    warm = bool(config.getoption("benchmark_warmup")) and int(config.getoption("benchmark_warmup_iterations")) > 0
    return rounds, int(warm)


@pytest.fixture
def pedantic(request, benchmark):
    """``pedantic(fn, *args, **kwargs)``: time a workload of seconds a call
    without pytest-benchmark's calibration run, ``--benchmark-min-rounds``
    rounds of one call each (see :func:`pedantic_rounds`); returns ``fn``'s
    result."""
    rounds, warm = pedantic_rounds(request.config)

    def _run(fn: Any, *args: Any, **kwargs: Any) -> Any:
        return benchmark.pedantic(fn, args=args, kwargs=kwargs, rounds=rounds, warmup_rounds=warm, iterations=1)

    return _run


GPU_RESULTS = Path(__file__).with_name("gpu_results")
#: Environment variables of a GPU run (bench/gpu_check.sh sets them): the
#: results folder (default bench/gpu_results) and the command to record.
RESULTS_ENV, COMMAND_ENV = "RCN_FAST_GPU_RESULTS", "RCN_FAST_GPU_COMMAND"


def _gpu_name() -> str | None:
    try:
        import torch

        return torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    except Exception:  # noqa: BLE001 - no torch or no driver: nothing to record
        return None


def _gpu_capability() -> str | None:
    """The compute capability of GPU 0 ("9.0"), or None."""
    try:
        import torch

        major, minor = torch.cuda.get_device_capability(0)
        return f"{major}.{minor}"
    except Exception:  # noqa: BLE001 - no torch or no driver
        return None


def _kernel_versions() -> dict[str, int]:
    """The compiled CUDA kernels' versions (rcn_fast._cuda.KERNEL_VERSIONS), or {}."""
    from rcn_fast import _native

    mod = _native.cuda_compiled_module()
    return {k: int(v) for k, v in dict(getattr(mod, "KERNEL_VERSIONS", {}) or {}).items()} if mod else {}


def results_path(name: str, folder: Path) -> Path:
    """``<folder>/<device name in lower case, runs of other characters as ->.json``."""
    return Path(folder) / (re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") + ".json")


def write_gpu_results(results: dict[str, dict[str, float]], folder: Path | None = None,
                      kernels: dict[str, int] | None = None, command: str | None = None) -> Path | None:
    """Write the GPU groups (names containing " GPU ") of a run to
    ``<folder>/<device>.json`` (folder: ``$RCN_FAST_GPU_RESULTS`` or
    bench/gpu_results): mean milliseconds per group and implementation,
    merged into what earlier runs on that device recorded with the same CUDA
    kernel versions. A file recorded with other versions is kept as
    ``<device>-<its date>.json`` (its figures measured kernels that are gone
    from the build, so the dispatcher never uses them, but the history
    stays), and a new file is started. Each file records the GPU's name and
    compute capability: its records count for that GPU only
    (rcn_fast/_crossovers.py). docs/gpu.md's tables and the dispatcher's
    table are made from these files by ``python bench/gpu_table.py --write``."""
    groups = {g: {impl: round(t * 1e3, 3) for impl, t in impls.items()} for g, impls in results.items()
              if " GPU " in f" {g} "}
    name = _gpu_name() if groups else None
    if not groups or name is None:
        return None
    import rcn_fast

    folder = Path(folder or os.environ.get(RESULTS_ENV) or GPU_RESULTS)
    kernels = _kernel_versions() if kernels is None else kernels
    folder.mkdir(parents=True, exist_ok=True)
    path = results_path(name, folder)
    old = json.loads(path.read_text()) if path.exists() else {}
    if old and old.get("cuda_kernels") != kernels:
        keep = path.with_name(f"{path.stem}-{old.get('updated', 'earlier')}.json")
        n = 2
        while keep.exists():
            keep = path.with_name(f"{path.stem}-{old.get('updated', 'earlier')}-{n}.json")
            n += 1
        path.rename(keep)
        old = {}
    data = {"groups": {}, **old}
    data["groups"].update(groups)
    data.update({"device": name, "updated": datetime.date.today().isoformat(), "unit": "ms (mean)",
                 "rcn_fast": rcn_fast.__version__, "cuda_kernels": kernels,
                 "command": command or os.environ.get(COMMAND_ENV) or data.get("command") or "python -m pytest bench/"})
    capability = _gpu_capability()
    if capability:
        data["capability"] = capability
    data.pop("note", None)
    path.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    return path


def pytest_sessionfinish(session):  # pragma: no cover - needs a GPU
    path = write_gpu_results(_RESULTS)
    if path is not None:
        print(f"\nrcn_fast: GPU figures recorded in {path}")


def pytest_terminal_summary(terminalreporter):  # pragma: no cover - reporting only
    tr = terminalreporter
    if _NOTES:
        tr.section("rcn_fast: figures beside the times")
        for line in _NOTES:
            tr.write_line(line)
    if not _RESULTS:
        return
    tr.section("rcn_fast: ratios against peers in this run (peer time / ours)")
    for group, impls in sorted(_RESULTS.items()):
        ours = [i for i in impls if i in _FAST]
        if not ours:
            continue
        base = "dispatched" if "dispatched" in impls else ours[0]  # GPU top-n: the default against its peers
        cells = [f"{base} {impls[base] * 1e3:.1f} ms"]
        for impl, t in sorted(impls.items()):
            if impl != base:
                cells.append(f"{impl} {t * 1e3:.1f} ms (x{t / impls[base]:.2f})")
        tr.write_line(f"{group}: " + "; ".join(cells))
