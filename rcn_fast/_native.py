"""Loading of the compiled modules, with the reason when one cannot load.

``rcn_fast._C`` (CPU kernels) is always built by ``pip install .``;
``rcn_fast._cuda`` only when the CUDA toolkit was found at build time. A
missing or unloadable module never breaks ``import rcn_fast``: the backends
that need it report why they cannot run, and ``python -m rcn_fast.info``
prints the reason.
"""

from __future__ import annotations

import importlib
from functools import lru_cache
from types import ModuleType
from typing import Any


def _try_import(name: str) -> tuple[ModuleType | None, str | None]:
    try:
        return importlib.import_module(name), None
    except Exception as exc:  # ImportError, OSError from a missing libcuda, ...
        return None, f"{type(exc).__name__}: {exc}"


def build_config() -> dict[str, Any]:
    """What the native module was built with (rcn_fast._C.build_info()), or {}."""
    mod, _ = cpu_module()
    return dict(mod.build_info()) if mod is not None else {}


@lru_cache(maxsize=None)
def cpu_module() -> tuple[ModuleType | None, str | None]:
    """``(rcn_fast._C, None)`` or ``(None, why it cannot load)``."""
    mod, err = _try_import("rcn_fast._C")
    if mod is None:
        err = f"rcn_fast._C is not importable ({err}); reinstall with `pip install .`"
    return mod, err


@lru_cache(maxsize=None)
def cuda_module() -> tuple[ModuleType | None, str | None]:
    """``(rcn_fast._cuda, None)`` when it loads and sees a usable GPU, else the reason."""
    cfg = build_config()
    if cfg and not cfg.get("cuda_compiled", False):
        return None, (
            "CUDA kernels were not compiled into this build (RCN_FAST_CUDA="
            f"{cfg.get('cuda_option', '?')}; rebuild with "
            "`pip install . -Ccmake.define.RCN_FAST_CUDA=ON` on a machine with nvcc)"
        )
    mod, err = _try_import("rcn_fast._cuda")
    if mod is None:
        return None, f"rcn_fast._cuda cannot load: {err}"
    try:
        info = mod.cuda_info()
    except Exception as exc:  # pragma: no cover - driver-specific
        return None, f"CUDA runtime error: {exc}"
    if not info.get("usable", False):
        return None, f"no usable CUDA device ({info.get('reason') or 'none found'})"
    return mod, None


def cuda_compiled_module() -> ModuleType | None:
    """``rcn_fast._cuda`` if it imports, whether or not a GPU is usable."""
    return _try_import("rcn_fast._cuda")[0]
