"""Measured GPU speeds: where rcn_fast's CUDA kernels beat the torch path.

The dispatcher (:mod:`rcn_fast._dispatch`) never picks a backend known to be
slower. For CUDA tensors the CUDA kernel of an op is chosen only where a
recorded GPU run showed it at least as fast as the op's torch backend on the
same GPU, for the same dtypes, at the nearest measured size (``Q`` queries
for ``topn``, ``B`` questions for ``sample_subsets``, compared on a log
scale), and only for the kernel version that run measured: a rebuilt kernel
(a new version, see ``rcn_fast._cuda.KERNEL_VERSIONS``) must be measured
again. Where several recorded runs (devices, workloads) are nearest, every
one of them must show the kernel at least as fast. Where nothing is measured,
torch serves: the CUDA kernel must earn its place. ``backend="cuda"`` (or
``RCN_FAST_BACKEND``) still forces the kernel.

The measurements are ``rcn_fast/_gpu_measurements.json``, generated from the
recorded runs in ``bench/gpu_results/*.json`` (a test keeps the two equal)::

    bench/gpu_check.sh                    # on a GPU: build, test, benchmark, record
    python bench/gpu_table.py --write     # this table and docs/gpu.md's tables
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Mapping

#: The version of each op's CUDA kernel in this source tree (the compiled
#: module reports its own: ``rcn_fast._cuda.KERNEL_VERSIONS``). Issue 35 made
#: both version 2 (top-n: the tensor-core scan; sampler: 16-byte loads,
#: hardware float16 conversion).
KERNEL_VERSIONS = {"topn": 2, "sample_subsets": 2}

MEASUREMENTS_FILE = Path(__file__).with_name("_gpu_measurements.json")


@dataclass(frozen=True)
class GpuMeasurement:
    """One recorded comparison: mean milliseconds per call of the CUDA kernel
    and of the torch path on the same GPU, same inputs."""

    op: str
    dtype: str
    size: int
    cuda_ms: float
    torch_ms: float
    device: str
    shape: str
    command: str
    query_dtype: str | None = None  # top-n: the queries' dtype
    kernel_version: int = 1
    source: str = ""  # the bench/gpu_results file
    peer: str = "torch"  # the implementation timed as the torch path


@lru_cache(maxsize=None)
def load_measurements(path: Path = MEASUREMENTS_FILE) -> tuple[GpuMeasurement, ...]:
    """The recorded table (empty when the file is missing)."""
    try:
        rows = json.loads(Path(path).read_text())["rows"]
    except FileNotFoundError:
        return ()
    return tuple(GpuMeasurement(**row) for row in rows)


# the size that decides which measurement applies to a call
SIZE_KEY = {"topn": "Q", "sample_subsets": "B"}


def built_kernel_version(op: str) -> int:
    """The version of ``op``'s kernel in the compiled CUDA module (the source
    tree's, :data:`KERNEL_VERSIONS`, where none is compiled)."""
    from rcn_fast import _native

    mod = _native.cuda_compiled_module()
    versions = getattr(mod, "KERNEL_VERSIONS", None) if mod is not None else None
    if versions is None:
        return KERNEL_VERSIONS.get(op, 1) if mod is None else 1  # a build before versions: version 1
    return int(dict(versions).get(op, 1))


def _matches(m: GpuMeasurement, op: str, ctx: Mapping[str, Any], version: int | None) -> bool:
    if m.op != op or m.dtype != ctx.get("dtype"):
        return False
    if m.query_dtype is not None and ctx.get("query_dtype", "float32") != m.query_dtype:
        return False
    return version is None or m.kernel_version == version


def nearest_measurements(op: str, ctx: Mapping[str, Any], table: tuple[GpuMeasurement, ...] | None = None,
                         version: int | None = None) -> list[GpuMeasurement]:
    """The measurements of ``op`` for the call's dtypes (and kernel
    ``version``, when given) at the measured size nearest to the call's (log
    scale; ties go to the smaller size); empty when none."""
    rows = [m for m in (load_measurements() if table is None else table) if _matches(m, op, ctx, version)]
    if not rows:
        return []
    key = SIZE_KEY.get(op)
    size = ctx.get(key) if key else None
    if not isinstance(size, int) or size < 1:
        size = 1
    best = min(rows, key=lambda m: (abs(math.log2(size) - math.log2(m.size)), m.size)).size
    return [m for m in rows if m.size == best]


def cuda_slower_reason(op: str, ctx: Mapping[str, Any], table: tuple[GpuMeasurement, ...] | None = None,
                       version: int | None = None) -> str | None:
    """Why the CUDA kernel of ``op`` should not serve ``ctx`` automatically
    (None: every nearest recorded run of the built kernel version measured
    it at least as fast as torch there)."""
    version = built_kernel_version(op) if version is None else version
    table = load_measurements() if table is None else table
    rows = nearest_measurements(op, ctx, table, version)
    what = ctx.get("dtype") if op != "topn" else f"{ctx.get('dtype')} (queries {ctx.get('query_dtype', 'float32')})"
    if not rows:
        others = sorted({m.kernel_version for m in table if m.op == op and m.kernel_version != version})
        older = f"; recorded runs measured kernel version {', '.join(map(str, others))}" if others else ""
        return (f"kernel version {version} not yet measured against torch for {what} on a GPU{older}; torch "
                f"serves until a recorded run shows the kernel faster (bench/gpu_check.sh; backend='cuda' forces it)")
    slower = [m for m in rows if m.cuda_ms > m.torch_ms]
    if not slower:
        return None
    m = slower[0]
    key = SIZE_KEY.get(op, "size")
    return (f"measured slower than torch on {m.device}: {m.cuda_ms:g} vs {m.torch_ms:g} ms at "
            f"{key}={m.size} ({what}, {m.shape}; kernel version {m.kernel_version}; `{m.command}`, "
            f"bench/gpu_results/{m.source}); backend='cuda' forces it")
