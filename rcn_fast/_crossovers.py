"""Measured GPU speeds: where rcn_fast's CUDA kernels beat the torch path.

The dispatcher (:mod:`rcn_fast._dispatch`) never picks a backend known to be
slower. An op's ``cuda`` backend has one or more kernels (:data:`KERNELS`:
for top-n the tensor-core scan and the GEMM tiles with a block select; for
the sampler the warp-per-subset kernel and the Gram kernel). For CUDA
tensors a kernel is chosen only where a recorded GPU run showed it at least
as fast as the op's torch backend on the same GPU, for the same dtypes, at
the nearest measured size (``Q`` queries for ``topn``, ``B`` questions for
``sample_subsets``, compared on a log scale), and only for the kernel
version that run measured: a rebuilt kernel (a new version, see
``rcn_fast._cuda.KERNEL_VERSIONS``) must be measured again. Where several
recorded runs (devices, workloads) are nearest, every one of them must show
the kernel at least as fast. Where several kernels qualify, the fastest
(mean over those runs) serves. Where nothing is measured, torch serves: a
CUDA kernel must earn its place. ``backend="cuda"`` (or
``RCN_FAST_BACKEND``) still forces the CUDA backend; it then runs the
measured kernel, else the op's own choice by shape.

The measurements are ``rcn_fast/_gpu_measurements.json``, generated from the
recorded runs in ``bench/gpu_results/*.json`` (a test keeps the two equal)::

    bench/gpu_check.sh                    # on a GPU: build, test, benchmark, record
    python bench/gpu_table.py --write     # this table and docs/gpu.md's GPU tables
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Mapping

#: Each op's CUDA kernels: ``(kernel key, implementation name in
#: bench/gpu_results)``. The key names the kernel in
#: ``rcn_fast._cuda.KERNEL_VERSIONS`` and in a results file's
#: ``cuda_kernels``; the implementation name is its column in the groups.
KERNELS: dict[str, tuple[tuple[str, str], ...]] = {
    "topn": (("topn", "cuda"), ("topn_tiled", "cuda_tiled")),
    "sample_subsets": (("sample_subsets", "cuda"), ("sample_subsets_gram", "cuda_gram")),
}

#: The version of each CUDA kernel in this source tree (the compiled module
#: reports its own: ``rcn_fast._cuda.KERNEL_VERSIONS``). Issue 35 made the
#: scan and the warp sampler version 2; issue 45 added the GEMM tiles with a
#: block select, the int8 bounded scan and the Gram sampler (version 1
#: each). The int8 scan serves the calls that pass an int8 copy
#: (``Int8Corpus``), not a choice of the dispatcher: it has a results
#: column (``cuda_int8``) but no entry in :data:`KERNELS`.
KERNEL_VERSIONS = {"topn": 2, "topn_tiled": 1, "topn_int8": 1, "sample_subsets": 2, "sample_subsets_gram": 1}

MEASUREMENTS_FILE = Path(__file__).with_name("_gpu_measurements.json")


@dataclass(frozen=True)
class GpuMeasurement:
    """One recorded comparison: mean milliseconds per call of a CUDA kernel
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
    kernel: str = ""  # the kernel key (KERNELS); "" = the op's first kernel

    @property
    def kernel_key(self) -> str:
        return self.kernel or KERNELS[self.op][0][0]


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


def built_kernel_versions() -> dict[str, int]:
    """The version of every kernel in the compiled CUDA module (this source
    tree's, :data:`KERNEL_VERSIONS`, where none is compiled; a build that
    reports no versions: version 1 of the ops' first kernels)."""
    from rcn_fast import _native

    mod = _native.cuda_compiled_module()
    if mod is None:
        return dict(KERNEL_VERSIONS)
    versions = getattr(mod, "KERNEL_VERSIONS", None)
    if versions is None:
        return {kernels[0][0]: 1 for kernels in KERNELS.values()}
    return {str(k): int(v) for k, v in dict(versions).items()}


def built_kernel_version(kernel: str) -> int | None:
    """The compiled version of ``kernel`` (a key of :data:`KERNELS`), None
    when the build lacks it."""
    return built_kernel_versions().get(kernel)


def _matches(m: GpuMeasurement, op: str, kernel: str | None, ctx: Mapping[str, Any], version: int | None) -> bool:
    if m.op != op or m.dtype != ctx.get("dtype") or (kernel is not None and m.kernel_key != kernel):
        return False
    if m.query_dtype is not None and ctx.get("query_dtype", "float32") != m.query_dtype:
        return False
    return version is None or m.kernel_version == version


def _size(op: str, ctx: Mapping[str, Any]) -> int:
    key = SIZE_KEY.get(op)
    size = ctx.get(key) if key else None
    return size if isinstance(size, int) and size >= 1 else 1


def nearest_measurements(op: str, ctx: Mapping[str, Any], table: tuple[GpuMeasurement, ...] | None = None,
                         version: int | None = None, kernel: str | None = None) -> list[GpuMeasurement]:
    """The measurements of ``op`` (of one ``kernel``, when given) for the
    call's dtypes (and kernel ``version``, when given) at the measured size
    nearest to the call's (log scale; ties go to the smaller size); empty
    when none."""
    rows = [m for m in (load_measurements() if table is None else table) if _matches(m, op, kernel, ctx, version)]
    if not rows:
        return []
    size = _size(op, ctx)
    best = min(rows, key=lambda m: (abs(math.log2(size) - math.log2(m.size)), m.size)).size
    return [m for m in rows if m.size == best]


def _what(op: str, ctx: Mapping[str, Any]) -> str:
    return str(ctx.get("dtype")) if op != "topn" else f"{ctx.get('dtype')} (queries {ctx.get('query_dtype', 'float32')})"


def _kernel_verdict(op: str, kernel: str, ctx: Mapping[str, Any], table: tuple[GpuMeasurement, ...],
                    version: int | None) -> tuple[float | None, str]:
    """``(mean ms of the kernel over the nearest runs, "")`` when every one
    measured it at least as fast as torch, else ``(None, why not)``."""
    if version is None:
        return None, f"kernel {kernel} is not in this build"
    rows = nearest_measurements(op, ctx, table, version, kernel)
    if not rows:
        others = sorted({m.kernel_version for m in table if m.op == op and m.kernel_key == kernel
                         and m.kernel_version != version})
        older = f"; recorded runs measured version {', '.join(map(str, others))}" if others else ""
        return None, (f"kernel version {version} not yet measured against torch for {_what(op, ctx)} on a "
                      f"GPU{older}")
    slower = [m for m in rows if m.cuda_ms > m.torch_ms]
    if not slower:
        return sum(m.cuda_ms for m in rows) / len(rows), ""
    m = slower[0]
    return None, (f"measured slower than torch on {m.device}: {m.cuda_ms:g} vs {m.torch_ms:g} ms at "
                  f"{SIZE_KEY.get(op, 'size')}={m.size} ({_what(op, ctx)}, {m.shape}; kernel version "
                  f"{m.kernel_version}; `{m.command}`, bench/gpu_results/{m.source})")


def kernel_choice(op: str, ctx: Mapping[str, Any], table: tuple[GpuMeasurement, ...] | None = None,
                  versions: Mapping[str, int] | None = None) -> tuple[str | None, str]:
    """``(kernel key, "")`` of the fastest kernel of ``op`` that every
    nearest recorded run of its built version measured at least as fast as
    torch for ``ctx``; ``(None, why none)`` when there is none."""
    if table is None and versions is None:
        return _kernel_choice_cached(op, ctx.get("dtype"), ctx.get("query_dtype", "float32"), _size(op, ctx),
                                     tuple(sorted(built_kernel_versions().items())))
    return _kernel_choice(op, ctx, load_measurements() if table is None else table,
                          built_kernel_versions() if versions is None else versions)


def _kernel_choice(op: str, ctx: Mapping[str, Any], table: tuple[GpuMeasurement, ...],
                   versions: Mapping[str, int]) -> tuple[str | None, str]:
    best: tuple[float, str] | None = None
    why = []
    for kernel, _ in KERNELS[op]:
        ms, reason = _kernel_verdict(op, kernel, ctx, table, versions.get(kernel))
        if ms is None:
            why.append(reason if len(KERNELS[op]) == 1 else f"{kernel}: {reason}")
        elif best is None or ms < best[0]:
            best = (ms, kernel)
    if best is not None:
        return best[1], ""
    return None, "; ".join(why) + " (torch serves until a recorded run shows a kernel faster: bench/gpu_check.sh; " \
                                  "backend='cuda' forces the CUDA backend)"


@lru_cache(maxsize=4096)
def _kernel_choice_cached(op: str, dtype: Any, query_dtype: Any, size: int,
                          versions: tuple[tuple[str, int], ...]) -> tuple[str | None, str]:
    ctx = {"dtype": dtype, "query_dtype": query_dtype, SIZE_KEY[op]: size}
    return _kernel_choice(op, ctx, load_measurements(), dict(versions))


def cuda_slower_reason(op: str, ctx: Mapping[str, Any], table: tuple[GpuMeasurement, ...] | None = None,
                       versions: Mapping[str, int] | None = None) -> str | None:
    """Why no CUDA kernel of ``op`` should serve ``ctx`` automatically
    (None: one measured at least as fast as torch there, see
    :func:`kernel_choice`)."""
    kernel, why = kernel_choice(op, ctx, table, versions)
    return None if kernel is not None else why
