"""Shared test fixtures: paths to ../shared data, GPU detection, seeds."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("RCN_FAST_SHARED", REPO.parent / "shared"))


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """../shared/data/commonsense, or skip (a user's checkout has no ../shared)."""
    path = SHARED / "data" / "commonsense"
    if not path.is_dir():
        pytest.skip(f"benchmark files not found at {path} (set RCN_FAST_SHARED to the shared/ folder)")
    return path


def gpu_available() -> bool:
    from rcn_fast import _native

    return _native.cuda_module()[0] is not None


requires_gpu = pytest.mark.skipif(not gpu_available(), reason="no usable CUDA device / CUDA build")


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(1234)
