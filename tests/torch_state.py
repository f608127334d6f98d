"""The process-wide torch state of the test session, watched (issue 47).

A test that changes torch's thread count, default dtype, deterministic
flags or grad mode and does not put them back changes the numbers of every
test after it (transformers' float32 matmuls reduce in another order with
another thread count), so a suite passes or fails by the order its tests
run in. tests/conftest.py records the state before the first test and,
after each test's teardown, fails the test that left it changed (naming
what changed) and restores it, so the next test starts from the same state.

A module or fixture that wants another thread count for its tests takes it
with :func:`pinned_torch_threads` (restored on exit, and expected by the
check while it holds), not with a bare ``torch.set_num_threads``.
"""

from __future__ import annotations

import sys
from contextlib import contextmanager
from typing import Any, Callable, Iterator

#: thread counts pinned by pinned_torch_threads, innermost last
_PINNED: list[int] = []
_BASELINE: dict[str, Any] | None = None


def _cuda_matmul(torch: Any) -> Any:
    return torch.backends.cuda.matmul


def _settings(torch: Any) -> dict[str, tuple[Callable[[], Any], Callable[[Any], None] | None]]:
    """name -> (read, write) of each process-wide setting watched (write None: cannot be set back)."""
    cudnn = torch.backends.cudnn
    out: dict[str, tuple[Callable[[], Any], Callable[[Any], None] | None]] = {
        "torch.get_num_threads()": (torch.get_num_threads, torch.set_num_threads),
        "torch.get_num_interop_threads()": (torch.get_num_interop_threads, None),
        "torch.get_default_dtype()": (torch.get_default_dtype, torch.set_default_dtype),
        "torch.are_deterministic_algorithms_enabled()": (
            lambda: (torch.are_deterministic_algorithms_enabled(),
                     torch.is_deterministic_algorithms_warn_only_enabled()),
            lambda v: torch.use_deterministic_algorithms(v[0], warn_only=v[1])),
        "torch.is_grad_enabled()": (torch.is_grad_enabled, torch.set_grad_enabled),
        "torch.is_inference_mode_enabled()": (torch.is_inference_mode_enabled, None),
        "torch.is_anomaly_enabled()": (torch.is_anomaly_enabled, torch.set_anomaly_enabled),
        "torch.get_float32_matmul_precision()": (torch.get_float32_matmul_precision,
                                                 torch.set_float32_matmul_precision),
        "torch.backends.cudnn.deterministic": (lambda: cudnn.deterministic,
                                               lambda v: setattr(cudnn, "deterministic", v)),
        "torch.backends.cudnn.benchmark": (lambda: cudnn.benchmark, lambda v: setattr(cudnn, "benchmark", v)),
        "torch.backends.cuda.matmul.allow_tf32": (lambda: _cuda_matmul(torch).allow_tf32,
                                                  lambda v: setattr(_cuda_matmul(torch), "allow_tf32", v)),
    }
    if hasattr(torch, "get_default_device"):  # torch >= 2.3
        out["torch.get_default_device()"] = (torch.get_default_device, torch.set_default_device)
    return out


def snapshot() -> dict[str, Any] | None:
    """The watched settings now, or None when torch is not imported (never imported here)."""
    torch = sys.modules.get("torch")
    if torch is None or not hasattr(torch, "get_num_threads"):
        return None
    return {name: read() for name, (read, _) in _settings(torch).items()}


def expected() -> dict[str, Any] | None:
    """The state every test must leave: the session's first, with the
    innermost :func:`pinned_torch_threads` count in force."""
    if _BASELINE is None:
        return None
    want = dict(_BASELINE)
    if _PINNED:
        want["torch.get_num_threads()"] = _PINNED[-1]
    return want


def start() -> None:
    """Record the session's state, once torch is imported (before the first
    test that runs with it; collection imports it for the whole suite)."""
    global _BASELINE
    if _BASELINE is None:
        _BASELINE = snapshot()


def changes() -> dict[str, tuple[Any, Any]]:
    """``{setting: (expected, now)}`` of each watched setting that differs."""
    want, now = expected(), snapshot()
    if want is None or now is None:
        return {}
    return {k: (want[k], now[k]) for k in want if now.get(k) != want[k]}


def restore() -> dict[str, tuple[Any, Any]]:
    """Set back every changed setting that can be; returns what had changed."""
    changed = changes()
    torch = sys.modules.get("torch")
    if changed and torch is not None:
        settings = _settings(torch)
        for name, (want, _) in changed.items():
            write = settings[name][1]
            if write is not None:
                write(want)
    return changed


def describe(changed: dict[str, tuple[Any, Any]]) -> str:
    return "; ".join(f"{k} is {now!r}, expected {want!r}" for k, (want, now) in changed.items())


@contextmanager
def pinned_torch_threads(n: int) -> Iterator[None]:
    """Run the block with ``n`` torch intra-op threads; the count before is
    restored on exit. The state check expects ``n`` while the block runs
    (use it in a module-scoped fixture to pin a module's tests)."""
    import torch

    start()
    prev = torch.get_num_threads()
    torch.set_num_threads(n)
    _PINNED.append(n)
    try:
        yield
    finally:
        _PINNED.pop()
        torch.set_num_threads(prev)


__all__ = ["snapshot", "expected", "start", "changes", "restore", "describe", "pinned_torch_threads"]
