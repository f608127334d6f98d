"""The test session is hermetic (issue 47): its caches are its own (never
~/.cache), and no test leaves torch's process-wide state changed for the
tests after it (tests/torch_state.py, checked by tests/conftest.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests import torch_state
from tests.conftest import REPO, SESSION_CACHE


def test_the_caches_are_the_sessions_own():
    from rcn_fast._cache_dirs import cache_root

    assert cache_root().is_relative_to(SESSION_CACHE)
    assert Path(os.environ["HF_HOME"]).is_relative_to(SESSION_CACHE)
    assert not cache_root().is_relative_to(Path.home() / ".cache")
    constants = pytest.importorskip("huggingface_hub.constants")
    assert Path(constants.HF_HUB_CACHE).is_relative_to(SESSION_CACHE), constants.HF_HUB_CACHE


def test_a_child_process_gets_the_sessions_caches():
    code = "from rcn_fast._cache_dirs import cache_root; print(cache_root())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert Path(out.strip()).is_relative_to(SESSION_CACHE)


CHANGES = {
    "torch.get_num_threads()": lambda torch: torch.set_num_threads(torch.get_num_threads() + 1),
    "torch.get_default_dtype()": lambda torch: torch.set_default_dtype(torch.float64),
    "torch.are_deterministic_algorithms_enabled()": lambda torch: torch.use_deterministic_algorithms(True),
    "torch.is_grad_enabled()": lambda torch: torch.set_grad_enabled(False),
    "torch.get_float32_matmul_precision()": lambda torch: torch.set_float32_matmul_precision("medium"),
    "torch.is_anomaly_enabled()": lambda torch: torch.set_anomaly_enabled(True),
}


@pytest.mark.parametrize("setting", sorted(CHANGES))
def test_a_changed_setting_is_named_and_set_back(setting):
    torch = pytest.importorskip("torch")
    torch_state.start()
    before = torch_state.snapshot()
    assert torch_state.changes() == {}
    CHANGES[setting](torch)
    changed = torch_state.changes()
    assert setting in changed and changed[setting][0] == before[setting]  # (tf32 follows matmul precision)
    assert setting in torch_state.describe(changed)
    assert torch_state.restore() == changed
    assert torch_state.snapshot() == before and torch_state.changes() == {}


def test_pinned_threads_are_expected_while_pinned_and_restored_after():
    torch = pytest.importorskip("torch")
    torch_state.start()
    before = torch.get_num_threads()
    other = before + 1
    with torch_state.pinned_torch_threads(other):
        assert torch.get_num_threads() == other and torch_state.changes() == {}
        with torch_state.pinned_torch_threads(1):
            assert torch.get_num_threads() == 1 and torch_state.changes() == {}
        assert torch.get_num_threads() == other
        torch.set_num_threads(before)  # not what the pin expects
        assert list(torch_state.changes()) == ["torch.get_num_threads()"]
    assert torch.get_num_threads() == before and torch_state.changes() == {}


def test_the_suite_fails_the_test_that_leaves_state_changed(tmp_path):
    """A session with this conftest's hooks: the test that leaves torch's
    default dtype and thread count changed fails at its teardown naming
    both, and the test after it starts from the session's state."""
    pytest.importorskip("torch")
    (tmp_path / "conftest.py").write_text(
        "from tests.conftest import pytest_runtest_setup, pytest_runtest_teardown, session_caches  # noqa: F401\n")
    (tmp_path / "test_leaks.py").write_text(textwrap.dedent("""
        import torch

        BEFORE = (torch.get_num_threads(), torch.get_default_dtype())

        def test_leaves_state_changed():
            torch.set_num_threads(BEFORE[0] + 1)
            torch.set_default_dtype(torch.float64)

        def test_after_it():
            assert (torch.get_num_threads(), torch.get_default_dtype()) == BEFORE
    """))
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    run = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-rA", "--rootdir", str(tmp_path),
                          str(tmp_path)], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    out = run.stdout + run.stderr
    assert run.returncode == 1, out
    assert "ERROR at teardown of test_leaves_state_changed" in out, out
    assert "torch.get_num_threads() is" in out and "torch.get_default_dtype() is torch.float64" in out, out
    assert "PASSED test_leaks.py::test_after_it" in out, out
