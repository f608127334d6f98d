"""Packaging conventions (issue 51 items 1 and 3): the extras give ranges,
never exact pins, so ``pip install "rcn_fast[eval]"`` keeps an environment's
torch; the set-up commands choose the CPU torch themselves; ``python -m
rcn_fast.info`` reports the CUDA stack and whether the CUDA module fits it;
``RCN_FAST_CUDA=AUTO`` builds the CUDA module only where a CUDA driver is
present, and says so in the build log."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from rcn_fast import _cuda_versions as CV

tomllib = pytest.importorskip("tomllib")
requirements = pytest.importorskip("packaging.requirements")

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = ROOT / "pyproject.toml"


def _requirements() -> list[tuple[str, str]]:
    """(where, requirement string) for the base dependencies and every extra."""
    meta = tomllib.loads(PYPROJECT.read_text(encoding="utf-8"))["project"]
    out = [("dependencies", r) for r in meta["dependencies"]]
    out += [(f"extra [{name}]", r) for name, reqs in meta["optional-dependencies"].items() for r in reqs]
    return out


def test_no_extra_pins_a_release_exactly():
    pinned = [f"{where}: {r}" for where, r in _requirements()
              if any(s.operator in ("==", "===") for s in requirements.Requirement(r).specifier)]
    assert not pinned, f"exact pins replace a user's own release (give a range): {pinned}"


def test_every_upper_bound_gives_its_reason_beside_it():
    """An upper bound only where a known break exists, with the reason in a comment just above."""
    lines = PYPROJECT.read_text(encoding="utf-8").splitlines()
    bad = []
    for where, r in _requirements():
        if not any(s.operator in ("<", "<=", "!=", "~=") for s in requirements.Requirement(r).specifier):
            continue
        at = next(i for i, line in enumerate(lines) if f'"{r}"' in line)
        if not any(re.search(r"upper bound", lines[j], re.I) for j in range(max(0, at - 6), at)):
            bad.append(f"{where}: {r}")
    assert not bad, f"upper bounds without a '# Upper bound: <reason>' comment above them: {bad}"


@pytest.mark.parametrize("release", ["2.11.0", "2.13.0", "2.14.1"])
def test_every_torch_range_admits_the_releases_this_code_runs_on(release):
    """2.13.0 is the CPU build the set-up installs; 2.11.0 the H200 image's; with either installed,
    the extras ask for nothing more (pip installs no torch)."""
    for where, r in _requirements():
        req = requirements.Requirement(r)
        if req.name == "torch":
            assert req.specifier.contains(release), f"{where}: {r} refuses torch {release}"


def _commands(text: str) -> list[str]:
    return [line for line in text.splitlines() if "pip install" in line and ".[" in line]


def test_the_set_up_commands_install_the_cpu_torch_before_the_package():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    cmds = _commands(readme)
    assert len(cmds) >= 2, "README's set-up and test commands install the package"
    for cmd in cmds:
        torch_at, pkg_at = cmd.find("pip install torch=="), cmd.find('".[')
        assert 0 <= torch_at < pkg_at, f"README installs the package before choosing torch: {cmd}"
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert ci.index("pip install -q torch==") < ci.index('pip install -q ".['), ".ci/run must mirror README"
    pinned = re.search(r"pip install torch==(\S+)", readme).group(1)
    assert f"torch=={pinned}" in ci


# ----------------------------------------------------------------- the CUDA stack


def test_the_stack_of_this_machine_is_reported():
    out = subprocess.run([sys.executable, "-m", "rcn_fast.info"], capture_output=True, text=True, check=True).stdout
    torch_line = next(line for line in out.splitlines() if line.startswith("torch "))
    import torch

    assert torch.__version__ in torch_line
    assert (f"CUDA {torch.version.cuda}" in torch_line) if torch.version.cuda else ("a CPU build" in torch_line)
    assert any(line.startswith("driver ") for line in out.splitlines())


_TORCH_GPU = {"version": "2.11.0+cu130", "cuda": "13.0", "devices": [{"name": "NVIDIA H200", "cc": "9.0"}]}
_MODULE = {"toolkit": "13.0.88", "architectures": "80,90"}


def _verdicts(torch_, module, driver):
    return {c: (ok, why) for c, ok, why in CV.compatibility(torch_, module, driver)}


def test_a_matching_stack_passes_every_check():
    v = _verdicts(_TORCH_GPU, _MODULE, {"release": "580.159.04", "cuda": "13.0"})
    assert all(ok for ok, _ in v.values()), v
    assert v["code for NVIDIA H200 (sm 9.0)"][1] == "sm_90 code"


def test_a_driver_older_than_the_modules_cuda_fails_and_says_what_to_do():
    v = _verdicts({**_TORCH_GPU, "cuda": "12.8"}, _MODULE, {"release": "550.54", "cuda": "12.4"})
    ok, why = v["driver runs the cuda module"]
    assert ok is False and "12.4 < 13.0" in why and "update the driver" in why
    assert v["driver runs torch's CUDA"][0] is True


@pytest.mark.parametrize("cc, expect", [("8.0", "sm_80 code"), ("8.6", "sm_80 code"), ("8.9", "sm_80 code"),
                                        ("9.0", "sm_90 code"), ("10.0", "compute_90 PTX"), ("12.0", "compute_90 PTX"),
                                        ("7.5", None)])
def test_which_code_each_gpu_runs(cc, expect):
    how = CV._runs_on(cc, "80,90")
    assert (how is None) if expect is None else how.startswith(expect)


def test_an_architecture_the_build_left_out_is_named_with_the_rebuild():
    v = _verdicts({**_TORCH_GPU, "devices": [{"name": "Tesla T4", "cc": "7.5"}]}, _MODULE,
                  {"release": "580.1", "cuda": "13.0"})
    ok, why = v["code for Tesla T4 (sm 7.5)"]
    assert ok is False and "RCN_FAST_CUDA_ARCHITECTURES" in why and "75" in why


def test_no_driver_and_a_cpu_torch_are_not_failures():
    v = _verdicts({"version": "2.13.0+cpu", "cuda": None, "devices": []}, _MODULE, {"release": None, "cuda": None})
    assert [ok for ok, _ in v.values()] == [None, None]
    assert _verdicts({"version": None}, None, {"cuda": None}) == {
        "cuda module": (None, "not compiled (RCN_FAST_CUDA=ON builds it)"), "torch": (None, "not installed")}


def test_the_driver_version_encoding():
    assert CV._cuda_version_text(13000) == "13.0" and CV._cuda_version_text(12040) == "12.4"
    assert CV._cuda_version_text(0) is None


# ----------------------------------------------------------------- RCN_FAST_CUDA=AUTO


def _configure(tmp_path: Path, name: str, *defs: str) -> str:
    build = tmp_path / name
    r = subprocess.run(["cmake", "-S", str(ROOT), "-B", str(build), f"-DPython_EXECUTABLE={sys.executable}",
                        "-DRCN_FAST_CUDA=AUTO", *defs], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    return r.stdout


@pytest.mark.slow
def test_auto_builds_the_cuda_module_only_where_a_driver_is(tmp_path):
    """The configure step's decision, from files only (no GPU is probed): with nvcc and no
    libcuda.so.1 the build log says why the CUDA module is skipped and how to force it; with a
    driver library in the searched folders, the module is built."""
    if shutil.which("cmake") is None or shutil.which("nvcc") is None:
        pytest.skip("needs cmake and nvcc (the CUDA compiler) on PATH")
    pytest.importorskip("nanobind", reason="the configure step finds nanobind through Python")
    empty, with_driver = tmp_path / "no-driver", tmp_path / "driver"
    empty.mkdir()
    with_driver.mkdir()
    (with_driver / "libcuda.so.1").write_bytes(b"")
    log = _configure(tmp_path, "b1", f"-DRCN_FAST_CUDA_DRIVER_DIRS={empty}")
    assert "found but no CUDA driver" in log and "RCN_FAST_CUDA=ON builds it anyway" in log
    assert "CUDA module enabled" not in log
    log = _configure(tmp_path, "b2", f"-DRCN_FAST_CUDA_DRIVER_DIRS={with_driver}")
    assert f"driver {with_driver / 'libcuda.so.1'} found" in log and "CUDA module enabled" in log
