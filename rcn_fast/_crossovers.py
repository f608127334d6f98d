"""Measured GPU speeds: where rcn_fast's CUDA kernels lose to torch.

The dispatcher (:mod:`rcn_fast._dispatch`) never picks a backend known to be
slower. For CUDA tensors the CUDA kernel of an op is chosen only where a
measurement on a GPU showed it at least as fast as the op's torch backend on
the same GPU, for the same dtype, at the nearest measured size (``Q`` queries
for ``topn``, ``B`` questions for ``sample_subsets``, compared on a log
scale). Where nothing is measured for a dtype, torch serves: the CUDA kernel
must earn its place. ``backend="cuda"`` (or ``RCN_FAST_BACKEND``) still
forces the kernel.

Each row names the device and the bench command that produced it. Update the
table from a GPU run of::

    python -m pytest bench/bench_topn.py -k "cuda" --benchmark-only
    python -m pytest bench/bench_sampling.py -k "cuda" --benchmark-only

(``test_cuda`` is the kernel, ``test_torch_cuda*`` the torch peer.)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

_TOPN_CMD = "python -m pytest bench/bench_topn.py -k cuda --benchmark-only"
_SAMPLING_CMD = "python -m pytest bench/bench_sampling.py -k cuda --benchmark-only"


@dataclass(frozen=True)
class GpuMeasurement:
    """One measured point: mean milliseconds per call of the CUDA kernel and
    of torch on the same GPU, same inputs."""

    op: str
    dtype: str
    size: int
    cuda_ms: float
    torch_ms: float
    device: str
    shape: str
    command: str


# H100 80GB (SXM), 2026-11 (issue 22), one run each; N = 1,000,000 x 768,
# k = 100 for topn; B = 1000, n = 100, d = 768, N = 9, K = 5 for the sampler.
MEASUREMENTS: tuple[GpuMeasurement, ...] = (
    GpuMeasurement("topn", "float32", 1, 11.6, 1.5, "NVIDIA H100", "N=1M d=768 k=100", _TOPN_CMD),
    GpuMeasurement("topn", "float32", 32, 13.2, 2.7, "NVIDIA H100", "N=1M d=768 k=100", _TOPN_CMD),
    GpuMeasurement("topn", "float32", 512, 56.9, 26.5, "NVIDIA H100", "N=1M d=768 k=100", _TOPN_CMD),
    GpuMeasurement("topn", "float16", 1, 11.4, 1.1, "NVIDIA H100", "N=1M d=768 k=100", _TOPN_CMD),
    GpuMeasurement("topn", "float16", 32, 13.2, 1.7, "NVIDIA H100", "N=1M d=768 k=100", _TOPN_CMD),
    GpuMeasurement("topn", "float16", 512, 56.7, 13.2, "NVIDIA H100", "N=1M d=768 k=100", _TOPN_CMD),
    GpuMeasurement("sample_subsets", "float32", 1000, 8.1, 9.7, "NVIDIA H100",
                   "B=1000 n=100 d=768 N=9 K=5", _SAMPLING_CMD),
    GpuMeasurement("sample_subsets", "float16", 1000, 13.6, 9.7, "NVIDIA H100",
                   "B=1000 n=100 d=768 N=9 K=5", _SAMPLING_CMD),
)

# the size that decides which measurement applies to a call
SIZE_KEY = {"topn": "Q", "sample_subsets": "B"}


def nearest_measurement(op: str, ctx: Mapping[str, Any],
                        table: tuple[GpuMeasurement, ...] = MEASUREMENTS) -> GpuMeasurement | None:
    """The measurement of ``op`` for the call's dtype nearest to its size
    (log scale; ties go to the smaller measured size), or None."""
    rows = [m for m in table if m.op == op and m.dtype == ctx.get("dtype")]
    if not rows:
        return None
    key = SIZE_KEY.get(op)
    size = ctx.get(key) if key else None
    if not isinstance(size, int) or size < 1:
        size = 1
    return min(rows, key=lambda m: (abs(math.log2(size) - math.log2(m.size)), m.size))


def cuda_slower_reason(op: str, ctx: Mapping[str, Any],
                       table: tuple[GpuMeasurement, ...] = MEASUREMENTS) -> str | None:
    """Why the CUDA kernel of ``op`` should not serve ``ctx`` automatically
    (None: it was measured at least as fast as torch there)."""
    m = nearest_measurement(op, ctx, table)
    if m is None:
        return (f"not yet measured against torch for {ctx.get('dtype')} on a GPU; torch serves until "
                f"the kernel is measured faster (backend='cuda' forces it)")
    if m.cuda_ms <= m.torch_ms:
        return None
    key = SIZE_KEY.get(op, "size")
    return (f"measured slower than torch on {m.device}: {m.cuda_ms:g} vs {m.torch_ms:g} ms at "
            f"{key}={m.size} ({m.dtype}, {m.shape}; `{m.command}`); backend='cuda' forces it")
