"""The one place that decides which backend runs an op.

Each op has a priority list of backends (for example cuda -> native ->
torch -> numpy). For a call, every backend in turn says why it cannot serve
the inputs (a reason string) or accepts them (``None``); the first that
accepts runs. When none accepts, :class:`BackendUnavailableError` lists every
backend tried and why.

Overrides, strongest first:

* the ``backend=`` argument of the public function;
* the environment variable ``RCN_FAST_BACKEND``: either one backend name for
  every op (``RCN_FAST_BACKEND=numpy``) or per-op pairs
  (``RCN_FAST_BACKEND="topn=torch,sample_subsets=native"``).

A forced backend that cannot serve the inputs is an error, never a silent
fallback.

A backend may also be able to serve a call but be known to be slower than a
later one for it (``Backend.slower``, e.g. the measured GPU crossovers in
:mod:`rcn_fast._crossovers`): automatic selection then passes it over (the
reason shows in :meth:`Op.report` and ``python -m rcn_fast.info``), unless no
later backend can serve the call; forcing it still runs it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

ENV_VAR = "RCN_FAST_BACKEND"


class BackendUnavailableError(RuntimeError):
    """No backend (or not the requested one) can serve the call."""


@dataclass(frozen=True)
class Backend:
    """One implementation of an op.

    ``check(ctx)`` returns ``None`` when it can serve a call described by
    ``ctx`` (a dict the op builds: device, array library, dtypes, sizes ...)
    or a short reason why not. ``run(**kwargs)`` computes the result.
    ``slower(ctx)``, optional, returns a reason when the backend can serve
    ``ctx`` but is known to be slower than a later backend (automatic
    selection skips it then), else ``None``.
    """

    name: str
    check: Callable[[Mapping[str, Any]], str | None]
    run: Callable[..., Any]
    description: str = ""
    slower: Callable[[Mapping[str, Any]], str | None] | None = None

    def skip_reason(self, ctx: Mapping[str, Any]) -> str | None:
        """``slower(ctx)`` prefixed for reports, or None."""
        why = self.slower(ctx) if self.slower is not None else None
        return None if why is None else f"can serve, but skipped: {why}"


@dataclass
class Op:
    """An op with its backends in priority order."""

    name: str
    backends: list[Backend] = field(default_factory=list)

    def names(self) -> list[str]:
        return [b.name for b in self.backends]

    def requested(self, backend: str | None) -> str | None:
        """The backend forced by the argument or the environment, if any."""
        if backend is not None:
            return backend
        env = os.environ.get(ENV_VAR, "").strip()
        if not env:
            return None
        if "=" not in env:
            return env
        for item in env.split(","):
            op, _, name = item.partition("=")
            if op.strip() == self.name and name.strip():
                return name.strip()
        return None

    def select(self, ctx: Mapping[str, Any], backend: str | None = None) -> Backend:
        """The backend that will run a call described by ``ctx``."""
        forced = self.requested(backend)
        if forced is not None and forced not in self.names():
            source = "backend=" if backend is not None else f"{ENV_VAR}"
            raise ValueError(
                f"{source}: unknown backend {forced!r} for {self.name}; "
                f"expected one of {self.names()}"
            )
        tried: list[str] = []
        passed_over: Backend | None = None
        for b in self.backends:
            if forced is not None and b.name != forced:
                continue
            why = b.check(ctx)
            if why is None and forced is None:
                why = b.skip_reason(ctx)
                if why is not None:
                    passed_over = passed_over or b
            if why is None:
                return b
            tried.append(f"  {b.name}: {why}")
        if passed_over is not None:  # nothing faster can serve: the slower one will do
            return passed_over
        what = f"backend {forced!r} cannot" if forced else "no backend can"
        raise BackendUnavailableError(
            f"{self.name}: {what} serve this call ({_describe(ctx)}):\n" + "\n".join(tried)
        )

    def __call__(self, ctx: Mapping[str, Any], backend: str | None = None, **kwargs: Any) -> Any:
        return self.select(ctx, backend).run(**kwargs)

    def report(self, ctx: Mapping[str, Any]) -> list[tuple[str, str | None]]:
        """Every backend with its reason (None = can serve ``ctx`` and is not
        known to be slower than a later backend that can)."""
        out = []
        for b in self.backends:
            why = b.check(ctx)
            out.append((b.name, why if why is not None else b.skip_reason(ctx)))
        return out


def _describe(ctx: Mapping[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in ctx.items() if not k.startswith("_"))


_REGISTRY: dict[str, Op] = {}


def register(op: Op) -> Op:
    """Add an op to the registry (``python -m rcn_fast.info`` lists them)."""
    _REGISTRY[op.name] = op
    return op


def register_kernel_op(name: str, *, cuda: tuple[Callable, Callable, str], native: tuple[Callable, Callable, str],
                       torch: tuple[Callable, str], numpy: tuple[Callable, str]) -> Op:
    """Register an op of the native kernels with the one priority list they
    share: cuda (passed over where :mod:`rcn_fast._crossovers` measured it
    slower than torch for the call) -> native -> torch -> numpy reference.

    Parameters
    ----------
    name : str
        The op's name (also its key in the measured crossovers).
    cuda, native : (check, run, description)
    torch, numpy : (run, description)
        Checked by :func:`check_torch` / :func:`check_numpy`.
    """
    from rcn_fast import _crossovers

    return register(Op(name, [
        Backend("cuda", *cuda, slower=lambda ctx: _crossovers.cuda_slower_reason(name, ctx)),
        Backend("native", *native),
        Backend("torch", check_torch, *torch),
        Backend("numpy", check_numpy, *numpy),
    ]))


def get(name: str) -> Op:
    return _REGISTRY[name]


def ops() -> dict[str, Op]:
    return dict(_REGISTRY)


# ------------------------------------------------------- the common backend checks
def check_cuda(ctx: Mapping[str, Any], symbol: str, missing: str) -> tuple[Any, str | None]:
    """``(rcn_fast._cuda, None)`` when the CUDA extension can serve ``ctx``
    and has ``symbol``; else ``(module or None, why not)``."""
    from rcn_fast import _native

    mod, why = _native.cuda_module()
    if mod is None:
        return None, why
    if ctx["device"] != "cuda":
        return mod, f"inputs are on {ctx['device']}, not a CUDA device"
    if not hasattr(mod, symbol):
        return mod, missing
    return mod, None


def check_native(ctx: Mapping[str, Any], symbol: str, missing: str) -> str | None:
    """Why the CPU extension (rcn_fast._C) cannot serve ``ctx`` (None: it can)."""
    from rcn_fast import _native

    mod, why = _native.cpu_module()
    if mod is None:
        return why
    if ctx["device"] != "cpu":
        return f"inputs are on {ctx['device']}; the native backend runs on the CPU"
    if not hasattr(mod, symbol):
        return missing
    return None


def check_torch(ctx: Mapping[str, Any]) -> str | None:
    """Why a torch backend cannot serve ``ctx`` (it takes torch tensors only)."""
    if ctx["library"] != "torch":
        return "inputs are numpy arrays (the torch backend takes torch tensors)"
    return None


def check_numpy(ctx: Mapping[str, Any]) -> str | None:
    """Why a numpy reference cannot serve ``ctx`` (it runs on the CPU only)."""
    if ctx["device"] != "cpu":
        return f"inputs are on {ctx['device']}; the numpy reference runs on the CPU"
    return None
