"""``python -m rcn_fast.info``: version, build, hardware, optional packages,
and the backend each op will use.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
from typing import Any

OPTIONAL_PACKAGES = (
    "torch", "triton", "transformers", "faiss", "onnxruntime", "onnx", "numba",
    "flash_attn", "gguf", "ml_dtypes", "pytest_benchmark",
)


def _op_modules() -> None:
    """Import the modules that register ops with the dispatcher."""
    import importlib

    for name in ("rcn_fast.search.topn", "rcn_fast.sampling", "rcn_fast.llm.scoring.choice"):
        try:
            importlib.import_module(name)
        except ImportError:
            pass


def build_info() -> dict[str, Any]:
    """Everything ``python -m rcn_fast.info`` prints, as a dict.

    Keys: ``version``, ``python``, ``platform``, ``package_path`` (the
    directory rcn_fast was imported from), ``native`` (compiler, SIMD
    compiled and active, CPU features, threads, the module's file; or the
    load error),
    ``cuda`` (compiled?, usable?, devices, reason), ``cuda_stack`` (torch
    and the CUDA it was built with, the driver, and whether the CUDA module
    fits them: :mod:`rcn_fast._cuda_versions`), ``packages`` (optional
    package -> importable), ``backends`` (op -> the backend chosen for
    float32 CPU numpy inputs and for CUDA torch inputs of several dtypes and
    sizes, with every other backend's reason; for CUDA inputs also
    ``on_a_gpu``: per GPU a recorded run names, the choice its measured
    crossovers make there, and torch for any other GPU; see
    :mod:`rcn_fast._crossovers`).
    """
    import importlib.util

    import rcn_fast
    from rcn_fast import _crossovers, _cuda_versions, _dispatch, _native

    info: dict[str, Any] = {
        "version": rcn_fast.__version__,
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "package_path": os.path.dirname(os.path.abspath(rcn_fast.__file__)),
    }
    mod, err = _native.cpu_module()
    info["native"] = {**mod.build_info(), "file": mod.__file__} if mod is not None else {"error": err}

    cuda: dict[str, Any] = {"compiled": bool(_native.build_config().get("cuda_compiled", False))}
    cmod = _native.cuda_compiled_module()
    if cmod is not None:
        try:
            cuda.update(cmod.cuda_info())
        except Exception as exc:  # pragma: no cover - driver-specific
            cuda["error"] = str(exc)
    usable, why = _native.cuda_module()
    cuda["gpu_usable"] = usable is not None
    if why:
        cuda["reason"] = why
    info["cuda"] = cuda
    torch_, driver = _cuda_versions.torch_info(), _cuda_versions.driver_info()
    module = cuda if cmod is not None and "toolkit" in cuda else None
    info["cuda_stack"] = {"torch": torch_, "driver": driver,
                          "checks": [{"check": c, "ok": ok, "why": why}
                                     for c, ok, why in _cuda_versions.compatibility(torch_, module, driver)]}

    info["packages"] = {p: importlib.util.find_spec(p) is not None for p in OPTIONAL_PACKAGES}

    _op_modules()
    backends: dict[str, Any] = {}
    for name, op in sorted(_dispatch.ops().items()):
        entry: dict[str, Any] = {}
        for label, ctx in _contexts(name).items():
            report = op.report(ctx)
            try:
                chosen: str | None = op.select(ctx).name
            except (_dispatch.BackendUnavailableError, ValueError):
                chosen = None
            entry[label] = {"uses": chosen,
                            "why_not_others": {b: r for b, r in report if r and b != chosen}}
            if ctx["device"] == "cuda" and name in _crossovers.SIZE_KEY:
                # what each recorded GPU would run, from its measured crossovers (any other GPU: torch)
                on = {}
                for gpu in _crossovers.recorded_gpus():
                    kernel, why = _crossovers.kernel_choice(name, {**ctx, **gpu})
                    on[gpu["gpu"]] = (f"cuda ({kernel}): measured at least as fast as torch" if kernel
                                      else "torch: " + why)
                on["any other GPU"] = "torch: no recorded run on it (bench/gpu_check.sh records one)"
                entry[label]["on_a_gpu"] = on
        backends[name] = entry
    info["backends"] = backends
    return info


def _contexts(op: str) -> dict[str, dict[str, Any]]:
    """Typical inputs per op: CPU numpy float32, and CUDA torch tensors at the
    sizes and dtypes where the GPU choice differs (see rcn_fast._crossovers)."""
    base = {"dtype": "float32", "Q": 32, "N": 100_000, "d": 768, "k": 10,
            "B": 32, "n": 100, "num_subsets": 3, "subset_size": 5}
    out = {"cpu (numpy float32)": {**base, "library": "numpy", "device": "cpu"}}
    if op == "topn":
        for dt in ("float32", "float16"):
            for q in (1, 32, 512):
                out[f"cuda (torch {dt}, Q={q})"] = {**base, "dtype": dt, "Q": q, "library": "torch",
                                                     "device": "cuda"}
    elif op == "sample_subsets":
        for dt in ("float32", "float16", "bfloat16"):
            out[f"cuda (torch {dt}, B=1000)"] = {**base, "dtype": dt, "B": 1000, "library": "torch",
                                                  "device": "cuda"}
    else:
        out["cuda (torch float32)"] = {**base, "library": "torch", "device": "cuda"}
    return out


def format_info(info: dict[str, Any]) -> str:
    lines = [f"rcn_fast {info['version']}  (Python {info['python']}, {info['platform']})",
             f"package       : {info['package_path']}"]
    nat = info["native"]
    if "error" in nat:
        lines.append(f"native module : NOT LOADED - {nat['error']}")
    else:
        lines.append(f"native file   : {nat['file']}")
        lines.append(f"native module : {nat['compiler']}; SIMD compiled [{nat['simd_compiled']}], "
                     f"active {nat['simd_active']}" + (f" ({nat['simd_note']})" if nat["simd_note"] else ""))
        lines.append(f"cpu features  : {nat['cpu_features'] or '-'}; threads {nat['num_threads']}")
        if "llm_kernels" in nat:
            lines.append(f"llm engine    : GGML-format kernels compiled [{nat['llm_kernels_compiled']}], "
                         f"active {nat['llm_kernels']}")
        if "int8_scan" in nat:
            lines.append(f"int8 scan     : variants compiled [{nat['int8_scan_compiled']}], active {nat['int8_scan']}")
    cu = info["cuda"]
    state = "compiled" if cu["compiled"] else "not compiled"
    if cu["compiled"]:
        state += f" for sm {cu.get('architectures', '?')} (toolkit {cu.get('toolkit', '?')})"
    lines.append(f"cuda          : {state}; GPU usable: {cu['gpu_usable']}"
                 + (f" - {cu['reason']}" if cu.get("reason") else ""))
    st = info["cuda_stack"]
    t, d = st["torch"], st["driver"]
    if t.get("version") is None:
        lines.append("torch         : not installed")
    else:
        gpus = ", ".join(f"{g['name']} (sm {g['cc']})" for g in t.get("devices", [])) or "none usable"
        lines.append(f"torch         : {t['version']}, " + (f"CUDA {t['cuda']}; GPUs: {gpus}" if t.get("cuda")
                                                             else "a CPU build"))
    lines.append("driver        : " + (f"NVIDIA {d['release'] or '(release unknown)'}, runs CUDA {d['cuda']}"
                                       if d.get("cuda") else f"none ({d.get('reason', 'no NVIDIA driver')})"))
    for c in st["checks"]:
        mark = {True: "ok  ", False: "FAIL", None: "n/a "}[c["ok"]]
        lines.append(f"  {mark} {c['check']}: {c['why']}")
    pk = info["packages"]
    lines.append("packages      : " + ", ".join(f"{p} {'yes' if ok else 'no'}" for p, ok in pk.items()))
    lines.append("backends:")
    for op, entry in info["backends"].items():
        for label, e in entry.items():
            lines.append(f"  {op:<16} {label:<28} -> {e['uses'] or 'none'}")
            for b, r in e["why_not_others"].items():
                lines.append(f"  {'':<16} {'':<28}    {b}: {r}")
            for gpu, choice in e.get("on_a_gpu", {}).items():
                lines.append(f"  {'':<16} {'':<28}    on {gpu} -> {choice}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rcn_fast.info", description=__doc__)
    parser.add_argument("--json", action="store_true", help="print JSON instead of text")
    args = parser.parse_args(argv)
    info = build_info()
    print(json.dumps(info, indent=2) if args.json else format_info(info))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
