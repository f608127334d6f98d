"""The CUDA stack this process sees, and whether rcn_fast's CUDA module fits it.

``python -m rcn_fast.info`` prints it: the installed torch and the CUDA it
was built with, the NVIDIA driver (its release and the newest CUDA it
runs), the CUDA toolkit and architectures ``rcn_fast._cuda`` was compiled
for, and a verdict per check (:func:`compatibility`). Nothing here needs a
GPU: every figure comes from a library call or a file, and what is missing
is reported as missing.

The rules (NVIDIA's compatibility rules, as the CUDA Compatibility guide
states them):

* the driver must run the module's CUDA major release: a module built with
  toolkit 13.x needs a driver whose CUDA version is 13.0 or newer (minor
  version compatibility covers 13.1, 13.2, ... on a 13.0 driver);
* a GPU runs the module's cubin for its own major architecture at an equal
  or higher minor (sm_80 code runs on sm_86 and sm_89), or the PTX of an
  equal or lower architecture, JIT-compiled (the build embeds PTX for each
  architecture it lists); otherwise the module has no code for it;
* torch brings its own CUDA runtime; the same driver must run it too. The two
  runtimes may differ (they share tensors through DLPack, not a runtime).
"""

from __future__ import annotations

import ctypes
import importlib.util
import re
from typing import Any

#: Where the NVIDIA kernel module states its release.
NVIDIA_PROC_VERSION = "/proc/driver/nvidia/version"


def _cuda_version_text(v: int | None) -> str | None:
    """``13000`` -> ``"13.0"`` (the encoding of cudaDriverGetVersion)."""
    if not v:
        return None
    return f"{v // 1000}.{(v % 1000) // 10}"


def _major_minor(text: str | None) -> tuple[int, int] | None:
    m = re.match(r"\s*(\d+)\.(\d+)", text or "")
    return (int(m.group(1)), int(m.group(2))) if m else None


def driver_info() -> dict[str, Any]:
    """The NVIDIA driver: ``release`` (e.g. ``"580.159.04"``, from the
    kernel module) and ``cuda`` (the newest CUDA version it runs, from
    ``cuDriverGetVersion`` in ``libcuda.so.1``); ``None`` where absent, with
    ``reason`` saying why. A driver that is installed but too old for a
    module is reported by :func:`compatibility`, not here."""
    out: dict[str, Any] = {"release": None, "cuda": None}
    try:
        with open(NVIDIA_PROC_VERSION, encoding="utf-8", errors="replace") as f:
            m = re.search(r"Kernel Module\s+(?:for\s+\S+\s+)?([0-9][0-9.]+)", f.read(4096))
            out["release"] = m.group(1) if m else None
    except OSError:
        pass
    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError:
        out["reason"] = "libcuda.so.1 not found"
        return out
    v = ctypes.c_int(0)
    rc = lib.cuDriverGetVersion(ctypes.byref(v))
    if rc == 0:
        out["cuda"] = _cuda_version_text(v.value)
    else:
        out["reason"] = f"cuDriverGetVersion failed (CUresult {rc})"
    return out


def torch_info() -> dict[str, Any]:
    """The installed torch: ``version``, ``cuda`` (the CUDA it was built
    with, ``None`` for a CPU build), ``devices`` (name and compute
    capability of each GPU torch can use); ``{"version": None}`` without torch."""
    if importlib.util.find_spec("torch") is None:
        return {"version": None}
    import torch

    out: dict[str, Any] = {"version": torch.__version__, "cuda": torch.version.cuda, "devices": []}
    try:
        if torch.cuda.is_available():
            for i in range(torch.cuda.device_count()):
                cc = torch.cuda.get_device_capability(i)
                out["devices"].append({"name": torch.cuda.get_device_name(i), "cc": f"{cc[0]}.{cc[1]}"})
    except Exception as exc:  # pragma: no cover - driver-specific
        out["error"] = str(exc)
    return out


def _runs_on(cc: str, architectures: str) -> str | None:
    """How a GPU of compute capability ``cc`` runs a module built for
    ``architectures`` (``"80,90"``): the cubin or the PTX it uses, or ``None``."""
    dev = _major_minor(cc)
    archs = sorted(int(a) for a in re.findall(r"\d+", architectures or ""))
    if dev is None or not archs:
        return None
    d = dev[0] * 10 + dev[1]
    cubins = [a for a in archs if a // 10 == dev[0] and a <= d]
    if cubins:
        return f"sm_{max(cubins)} code"
    ptx = [a for a in archs if a <= d]
    return f"compute_{max(ptx)} PTX (JIT-compiled at first use)" if ptx else None


def compatibility(torch_: dict[str, Any], module: dict[str, Any] | None, driver: dict[str, Any]) -> list[tuple[str, bool | None, str]]:
    """The checks, each ``(what, ok, why)``; ``ok`` is ``None`` where the
    check does not apply here (no CUDA module, no GPU).

    Parameters
    ----------
    torch_ : dict
        :func:`torch_info`.
    module : dict or None
        ``rcn_fast._cuda.cuda_info()`` (``toolkit``, ``architectures``), or
        ``None`` when the CUDA module was not compiled.
    driver : dict
        :func:`driver_info`.
    """
    checks: list[tuple[str, bool | None, str]] = []
    drv = _major_minor(driver.get("cuda"))
    if module is None:
        checks.append(("cuda module", None, "not compiled (RCN_FAST_CUDA=ON builds it)"))
    else:
        need = _major_minor(module.get("toolkit"))
        if need is None:
            checks.append(("driver runs the cuda module", None, "the module's toolkit version is unknown"))
        elif drv is None:
            checks.append(("driver runs the cuda module", None,
                           f"built with CUDA {module.get('toolkit')}; no CUDA driver here, the CPU kernels serve"))
        else:
            ok = drv[0] >= need[0]
            checks.append(("driver runs the cuda module", ok,
                           f"driver CUDA {driver['cuda']} {'>=' if ok else '<'} {need[0]}.0 "
                           f"(module built with CUDA {module.get('toolkit')})"
                           + ("" if ok else f"; update the driver or rebuild with a CUDA {drv[0]}.x toolkit")))
        for dev in torch_.get("devices", []):
            how = _runs_on(dev["cc"], module.get("architectures", ""))
            checks.append((f"code for {dev['name']} (sm {dev['cc']})", how is not None,
                           how or f"built for sm {module.get('architectures')} only; rebuild with "
                                  f"-Ccmake.define.RCN_FAST_CUDA_ARCHITECTURES=...;{dev['cc'].replace('.', '')}"))
    tcuda = _major_minor(torch_.get("cuda"))
    if torch_.get("version") is None:
        checks.append(("torch", None, "not installed"))
    elif tcuda is None:
        checks.append(("torch uses CUDA", None, f"torch {torch_['version']} is a CPU build"))
    elif drv is None:
        checks.append(("driver runs torch's CUDA", None,
                       f"torch built with CUDA {torch_['cuda']}; no CUDA driver here, torch runs on the CPU"))
    else:
        ok = drv[0] >= tcuda[0]
        checks.append(("driver runs torch's CUDA", ok,
                       f"driver CUDA {driver['cuda']} {'>=' if ok else '<'} {tcuda[0]}.0 (torch built with CUDA "
                       f"{torch_['cuda']})"))
    return checks
