"""Where rcn_fast caches things it can rebuild (ONNX exports, corpus input
scans): ``$RCN_FAST_CACHE`` when set (also the pinned-URL task cache's
override), else the older ``$RCN_FAST_CACHE_DIR``, else
``$XDG_CACHE_HOME/rcn_fast`` (``~/.cache/rcn_fast``)."""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    """The root folder of rcn_fast's rebuildable caches (not created here)."""
    for var in ("RCN_FAST_CACHE", "RCN_FAST_CACHE_DIR"):
        env = os.environ.get(var, "").strip()
        if env:
            return Path(env).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "rcn_fast"


__all__ = ["cache_root"]
