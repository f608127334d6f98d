"""Shared benchmark plumbing: every benchmark records its time under a group
(the same workload), and the session ends with a table of ratios against
the peers measured in the same run.

Run: ``python -m pytest bench/ --benchmark-only`` (see README for sizes).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import pytest

_RESULTS: dict[str, dict[str, float]] = defaultdict(dict)
_FAST = {"native", "rcn_fast", "batched", "cuda", "triton", "onnx"}


@pytest.fixture
def record():
    """``record(group, impl, benchmark)`` after a benchmark ran: keeps its mean."""

    def _record(group: str, impl: str, benchmark: Any) -> None:
        stats = getattr(benchmark, "stats", None)
        if stats is not None:
            _RESULTS[group][impl] = stats.stats.mean

    return _record


def pytest_terminal_summary(terminalreporter):  # pragma: no cover - reporting only
    if not _RESULTS:
        return
    tr = terminalreporter
    tr.section("rcn_fast: ratios against peers in this run (peer time / ours)")
    for group, impls in sorted(_RESULTS.items()):
        ours = [i for i in impls if i in _FAST]
        if not ours:
            continue
        base = ours[0]
        cells = [f"{base} {impls[base] * 1e3:.1f} ms"]
        for impl, t in sorted(impls.items()):
            if impl != base:
                cells.append(f"{impl} {t * 1e3:.1f} ms (x{t / impls[base]:.2f})")
        tr.write_line(f"{group}: " + "; ".join(cells))
