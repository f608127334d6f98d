"""The CPU-vs-GPU draw comparison of the subset samplers (issue 55, Y2; a
step of bench/gpu_check.sh). Not a timing: the same seed, the same inputs,
the draws of

* the GPU samplers (``backend="cuda"``: the warp sampler and the Gram
  sampler, compiled with --fmad=false),
* the CPU build (``backend="native"``),
* the host emulation of each GPU sampler's arithmetic (the warp sampler's
  lane logic with its dot-product order, rcn_fast._C ``emulate_lanes=32``;
  the Gram sampler's mma emulation, ``sample_subsets_gram_emulated``),

compared subset by subset. Expected: the GPU's ids equal the emulation's
everywhere (its log-probabilities within logf's last bit), and the CPU's
wherever no uniform falls within a rounding error of a CDF boundary (the
CPU sums its dot products in another order): all but about 1e-6 a draw.

    python bench/gpu_draws.py [--out DIR] [--B 1000] [--emulated-B 48]

Prints a table; writes ``<DIR>/draws/<device>.json`` (default DIR:
bench/gpu_results). Exit status 0 when the GPU equals the emulation and
agrees with the CPU on at least 99.9% of the subsets, 1 otherwise, 0 with
a printed reason where no GPU is usable (nothing to compare).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
N_CAND, D, N_SUB, K = 100, 768, 9, 5
DTYPES = ("float32", "float16", "bfloat16")
KERNELS = ("sample_subsets", "sample_subsets_gram")
MIN_CPU_AGREEMENT = 0.999


def _inputs(torch, B: int, dtype: str, seed: int = 0):
    gen = torch.Generator(device="cpu").manual_seed(seed)
    q = torch.randn((B, D), generator=gen)
    c = torch.randn((B, N_CAND, D), generator=gen)
    q /= q.norm(dim=1, keepdim=True)
    c /= c.norm(dim=2, keepdim=True)
    return q, c.to(getattr(torch, dtype))


def _emulated(mod, kernel: str, q, c, first: bool, seed: int, tau: float, vec: bool):
    B = c.shape[0]
    ids = np.empty((B, N_SUB, K), np.int64)
    lp = np.empty((B, N_SUB, K), np.float32)
    import torch

    bf16 = c.dtype == torch.bfloat16
    arr = c.view(torch.int16).numpy().view(np.uint16) if bf16 else c.numpy()  # numpy has no bfloat16
    keys = np.arange(B, dtype=np.int64)
    if kernel == "sample_subsets_gram":
        mod.sample_subsets_gram_emulated(q.numpy(), arr, None, keys, tau, seed, first, ids, lp, bf16)
    else:
        mod.sample_subsets(q.numpy(), arr, None, keys, tau, seed, first, ids, lp, 0, bf16, 32, vec)
    return ids, lp


def compare(B: int = 1000, emulated_B: int = 48, seed: int = 5, tau: float = 0.7) -> tuple[list[dict], str | None]:
    """Rows of the comparison, or ``([], why)`` where no GPU is usable."""
    try:
        import torch
    except ImportError:
        return [], "torch is not installed"
    from rcn_fast import _native
    from rcn_fast.sampling.relevance import run_cuda_kernel, sample_subsets

    gpu, why = _native.cuda_module()
    if gpu is None or not torch.cuda.is_available():
        return [], f"no usable GPU: {why or 'torch.cuda.is_available() is False'}"
    cpu, why = _native.cpu_module()
    if cpu is None:
        return [], f"rcn_fast._C is missing: {why}"
    rows = []
    for dtype in DTYPES:
        q, c = _inputs(torch, B, dtype)
        qd, cd = q.cuda(), c.cuda()
        for first in (True, False):
            keys = np.arange(B, dtype=np.int64)
            h_ids, h_lp = sample_subsets(q, c, N_SUB, K, tau=tau, seed=seed, first="relevance" if first else "uniform",
                                         backend="native", return_logprobs=True)
            for kernel in KERNELS:
                g_ids, g_lp = run_cuda_kernel(qd, cd, N_SUB, K, tau, seed, keys, None, first, kernel=kernel)
                g_ids, g_lp = g_ids.cpu().numpy(), g_lp.cpu().numpy()
                same_cpu = (g_ids == h_ids.numpy()).all(axis=-1)
                m = emulated_B
                e_ids, e_lp = _emulated(cpu, kernel, q[:m], c[:m], first, seed, tau, vec=True)
                same_emu = (g_ids[:m] == e_ids).all(axis=-1)
                rows.append({
                    "kernel": kernel, "dtype": dtype, "first": "relevance" if first else "uniform",
                    "subsets": int(same_cpu.size), "same_as_cpu": float(same_cpu.mean()),
                    "logp_vs_cpu": float(np.abs(g_lp - h_lp.numpy())[same_cpu].max(initial=0.0)),
                    "emulated_subsets": int(same_emu.size), "same_as_emulation": float(same_emu.mean()),
                    "logp_vs_emulation": float(np.abs(g_lp[:m] - e_lp)[same_emu].max(initial=0.0)),
                })
    return rows, None


def table(rows: list[dict]) -> str:
    head = ("| kernel | dtype | first | subsets equal to the CPU's | max logp diff | subsets equal to the "
            "emulation's | max logp diff |")
    lines = [head, "|---" * 7 + "|"]
    for r in rows:
        lines.append(f"| {r['kernel']} | {r['dtype']} | {r['first']} | {r['same_as_cpu']:.6f} of {r['subsets']} | "
                     f"{r['logp_vs_cpu']:.2e} | {r['same_as_emulation']:.6f} of {r['emulated_subsets']} | "
                     f"{r['logp_vs_emulation']:.2e} |")
    return "\n".join(lines)


def verdict(rows: list[dict]) -> list[str]:
    """What fails the step: the GPU differs from its emulation, or from the CPU too often."""
    bad = []
    for r in rows:
        what = f"{r['kernel']} {r['dtype']} first={r['first']}"
        if r["same_as_emulation"] < 1.0:
            bad.append(f"{what}: the GPU's ids differ from the emulation of its arithmetic")
        if r["same_as_cpu"] < MIN_CPU_AGREEMENT:
            bad.append(f"{what}: only {r['same_as_cpu']:.4f} of the subsets equal the CPU's")
    return bad


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=HERE / "gpu_results", help="results folder (draws/<device>.json)")
    ap.add_argument("--B", type=int, default=1000, help="questions compared with the CPU (default 1000)")
    ap.add_argument("--emulated-B", type=int, default=48, help="questions compared with the emulation (default 48)")
    args = ap.parse_args(argv)
    rows, why = compare(args.B, args.emulated_B)
    if why is not None:
        print(f"gpu_draws: skipped: {why}")
        return 0
    print(table(rows))
    import torch

    from rcn_fast import __version__

    device = torch.cuda.get_device_name(0)
    path = args.out / "draws" / (device.lower().replace(" ", "-") + ".json")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"device": device, "rcn_fast": __version__, "workload":
                                {"n": N_CAND, "d": D, "N": N_SUB, "K": K, "B": args.B, "emulated_B": args.emulated_B},
                                "rows": rows}, indent=1) + "\n")
    print(f"gpu_draws: written {path}")
    bad = verdict(rows)
    for line in bad:
        print(f"gpu_draws: FAIL {line}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
