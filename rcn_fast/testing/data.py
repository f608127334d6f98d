"""Where the tests and benchmarks find the benchmark files: ``$RCN_FAST_SHARED``
when set, else the ``shared/`` folder next to the source checkout
(``<checkout>/../shared``; an installed package has none: set the variable)."""

from __future__ import annotations

import os
from pathlib import Path

_CHECKOUT = Path(__file__).resolve().parents[2]

SHARED = Path(os.environ.get("RCN_FAST_SHARED", _CHECKOUT.parent / "shared"))


def commonsense_dir() -> Path:
    """``SHARED/data/commonsense`` (may not exist: callers skip without it)."""
    return SHARED / "data" / "commonsense"


__all__ = ["SHARED", "commonsense_dir"]
