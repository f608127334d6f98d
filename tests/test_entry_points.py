"""Every documented ``python -m`` entry point starts and prints its help."""

from __future__ import annotations

import subprocess
import sys

import pytest

ENTRY_POINTS = [
    ("rcn_fast.info", "--json"),
    ("rcn_fast.corpus", "--help"),
    ("rcn_fast.kb", "--help"),
    ("rcn_fast.serve", "--help"),
    ("rcn_fast.train_retriever", "--help"),
]


@pytest.mark.parametrize("module,arg", ENTRY_POINTS)
def test_entry_point_runs(module: str, arg: str) -> None:
    res = subprocess.run([sys.executable, "-m", module, arg], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    out = res.stdout
    if arg == "--help":
        assert "usage:" in out and module.replace("rcn_fast.", "") in out
    else:
        assert '"backends"' in out and "choice_logprobs" in out


def test_source_checkout_finds_installed_native_module() -> None:
    """``python -m rcn_fast.info`` run from the repository root imports the
    source tree (cwd first on sys.path) and still loads the installed _C."""
    import json
    import os
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    if not (root / "rcn_fast" / "__init__.py").is_file():
        pytest.skip("not run from a source checkout")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONSAFEPATH", "PYTHONPATH")}
    res = subprocess.run([sys.executable, "-m", "rcn_fast.info", "--json"], cwd=root, env=env,
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    info = json.loads(res.stdout)
    assert "error" not in info["native"], info["native"]
    assert info["backends"]["topn"]["cpu (numpy float32)"]["uses"] == "native"
