"""Measured GPU speeds: where rcn_fast's CUDA kernels beat the torch path.

The dispatcher (:mod:`rcn_fast._dispatch`) never picks a backend known to be
slower. An op's ``cuda`` backend has one or more kernels (:data:`KERNELS`:
for top-n the tensor-core scan and the GEMM tiles with a block select; for
the sampler the warp-per-subset kernel and the Gram kernel). For CUDA
tensors a kernel is chosen only where a recorded run on the same GPU showed
it at least as fast as the op's torch backend, and only for the workload it
measured:

* the GPU: a record counts for the GPU it ran on, by name (the call's
  ``torch.cuda.get_device_name``); a record that says ``"match":
  "capability"`` counts for every GPU of its compute capability instead. A
  GPU no record names runs torch (issue 55, C5: the H200's records chose
  kernels on every GPU, an A100 included);
* the dtypes (the corpus's, and for top-n the queries');
* for top-n, the algorithm the call would run (:func:`topn_algorithm`: the
  tensor-core scan, the tiled kernel it falls back to for k > 256, d % 8 !=
  0 or unaligned rows, or the GEMM tiles), the same ``d % 8 == 0`` class and
  a ``k`` within a factor of :data:`K_RATIO` of the measured one (issue 55,
  S4: a scan measured at k = 100 sent k = 1,000 to the tiled fallback);
* the nearest measured size (``Q`` queries for ``topn``, ``B`` questions for
  ``sample_subsets``, compared on a log scale);
* the kernel version that run measured: a rebuilt kernel (a new version, see
  ``rcn_fast._cuda.KERNEL_VERSIONS``) must be measured again.

Where several recorded runs are nearest, every one of them must show the
kernel at least as fast. Where several kernels qualify, the fastest (mean
over those runs) serves. Where nothing is measured, torch serves: a CUDA
kernel must earn its place. ``backend="cuda"`` (or ``RCN_FAST_BACKEND``)
still forces the CUDA backend; it then runs the measured kernel, else the
op's own choice by shape.

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
#: each); issue 55 rebuilt all of them (launch bounds from the launch
#: tables, the samplers without FMA contraction, the tiled kernel's -0.0,
#: the block select's terms as a template parameter): 3, 2, 2, 3, 2; its
#: int8 redesign (the filter inside the kernel, tensor-core IMMA, no
#: interval matrix) made the int8 scan 3. The
#: int8 scan serves the calls that pass an int8 copy (``Int8Corpus``), not a
#: choice of the dispatcher: it has a results column (``cuda_int8``) but no
#: entry in :data:`KERNELS`.
KERNEL_VERSIONS = {"topn": 3, "topn_tiled": 2, "topn_int8": 3, "sample_subsets": 3, "sample_subsets_gram": 2}

#: A top-n record counts for calls whose k is within this factor of its own.
K_RATIO = 4
#: The tensor-core scan's limits (rcn_fast._cuda.TOPN_MMA_MAX_K; queries a call).
SCAN_MAX_K = 256
SCAN_MAX_QUERIES = 65535 * 8

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
    capability: str | None = None  # the GPU's compute capability ("9.0"), where the record says
    match: str = "name"  # "name": counts for that GPU; "capability": for every GPU of that capability
    k: int | None = None  # top-n: the workload's k and d
    d: int | None = None
    algorithm: str = ""  # what the kernel ran (topn_algorithm); "" = not recorded

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


def topn_algorithm(kernel: str, ctx: Mapping[str, Any]) -> str:
    """What top-n ``kernel`` runs for a call ``ctx`` (dtype, k, d, Q and,
    for CUDA tensors, ``aligned``: 16-byte aligned corpus rows): the
    tensor-core ``"scan"``, the ``"tiled_v1"`` kernel it falls back to
    (float32 corpus, k > 256, d % 8 != 0, unaligned rows, more queries than
    its grid takes), or the ``"gemm_tiles"``; ``""`` where ctx lacks k or d."""
    if kernel == "topn_tiled":
        return "gemm_tiles"
    k, d = ctx.get("k"), ctx.get("d")
    if not isinstance(k, int) or not isinstance(d, int):
        return ""
    scan = (ctx.get("dtype") in ("float16", "bfloat16") and k <= SCAN_MAX_K and d % 8 == 0
            and bool(ctx.get("aligned", True)) and int(ctx.get("Q", 1)) <= SCAN_MAX_QUERIES)
    return "scan" if scan else "tiled_v1"


def kernel_algorithm(op: str, kernel: str, ctx: Mapping[str, Any]) -> str:
    """The algorithm ``kernel`` of ``op`` runs for ``ctx`` (top-n:
    :func:`topn_algorithm`; a sampler kernel runs one)."""
    if op == "topn":
        return topn_algorithm(kernel, ctx)
    return {"sample_subsets": "warp", "sample_subsets_gram": "gram"}.get(kernel, "")


def _gpu_matches(m: GpuMeasurement, ctx: Mapping[str, Any]) -> bool:
    gpu = ctx.get("gpu")
    if not gpu:
        return False  # an unknown GPU: no record counts
    if m.match == "capability":
        return m.capability is not None and ctx.get("capability") == m.capability
    return m.device == gpu


def _matches(m: GpuMeasurement, op: str, kernel: str | None, ctx: Mapping[str, Any], version: int | None) -> bool:
    if m.op != op or m.dtype != ctx.get("dtype") or (kernel is not None and m.kernel_key != kernel):
        return False
    if m.query_dtype is not None and ctx.get("query_dtype", "float32") != m.query_dtype:
        return False
    if not _gpu_matches(m, ctx):
        return False
    if op == "topn":
        k, d = ctx.get("k"), ctx.get("d")
        if m.algorithm and m.algorithm != kernel_algorithm(op, m.kernel_key, ctx):
            return False
        if m.d is not None and isinstance(d, int) and (m.d % 8 == 0) != (d % 8 == 0):
            return False
        if m.k is not None and isinstance(k, int) and k >= 1 and abs(math.log2(k / m.k)) > math.log2(K_RATIO):
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


def _dtypes(op: str, ctx: Mapping[str, Any]) -> str:
    if op != "topn":
        return str(ctx.get("dtype"))
    return f"{ctx.get('dtype')} (queries {ctx.get('query_dtype', 'float32')})"


def _what(op: str, ctx: Mapping[str, Any]) -> str:
    return f"{_dtypes(op, ctx)} on {ctx.get('gpu') or 'an unknown GPU'}"


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
        where = sorted({m.device for m in table if m.op == op and m.kernel_key == kernel
                        and m.kernel_version == version and not _gpu_matches(m, ctx)})
        elsewhere = f"; measured on {', '.join(where)} only (a record counts for its own GPU)" if where else ""
        algo = kernel_algorithm(op, kernel, ctx)
        return None, (f"kernel version {version} not yet measured against torch for {_what(op, ctx)}"
                      f"{f' ({algo})' if algo else ''}{older}{elsewhere}")
    slower = [m for m in rows if m.cuda_ms > m.torch_ms]
    if not slower:
        return sum(m.cuda_ms for m in rows) / len(rows), ""
    m = slower[0]
    return None, (f"measured slower than torch on {m.device}: {m.cuda_ms:g} vs {m.torch_ms:g} ms at "
                  f"{SIZE_KEY.get(op, 'size')}={m.size} ({_dtypes(op, ctx)}, {m.shape}; kernel version "
                  f"{m.kernel_version}; `{m.command}`, bench/gpu_results/{m.source})")


#: The keys of a call's ctx the choice depends on.
_CHOICE_KEYS = ("dtype", "query_dtype", "k", "d", "Q", "aligned", "gpu", "capability")


def kernel_choice(op: str, ctx: Mapping[str, Any], table: tuple[GpuMeasurement, ...] | None = None,
                  versions: Mapping[str, int] | None = None) -> tuple[str | None, str]:
    """``(kernel key, "")`` of the fastest kernel of ``op`` that every
    nearest recorded run of its built version on the call's GPU measured at
    least as fast as torch for ``ctx``; ``(None, why none)`` when there is
    none."""
    if table is None and versions is None:
        key = tuple((k, ctx.get(k)) for k in _CHOICE_KEYS) + ((SIZE_KEY[op], _size(op, ctx)),)
        return _kernel_choice_cached(op, key, tuple(sorted(built_kernel_versions().items())))
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
def _kernel_choice_cached(op: str, key: tuple[tuple[str, Any], ...],
                          versions: tuple[tuple[str, int], ...]) -> tuple[str | None, str]:
    return _kernel_choice(op, {k: v for k, v in key if v is not None}, load_measurements(), dict(versions))


def recorded_gpus(table: tuple[GpuMeasurement, ...] | None = None) -> list[dict[str, str]]:
    """``{"gpu": name, "capability": cc}`` of every GPU a record names."""
    seen: dict[str, dict[str, str]] = {}
    for m in load_measurements() if table is None else table:
        seen.setdefault(m.device, {"gpu": m.device, **({"capability": m.capability} if m.capability else {})})
    return [seen[name] for name in sorted(seen)]


_GPUS: dict[int, dict[str, str]] = {}


def gpu_identity(device: Any) -> dict[str, str]:
    """``{"gpu": name, "capability": "major.minor"}`` of a CUDA device (a
    torch device or tensor; asked once per device index), the keys a call's
    ctx carries so that only records of its GPU count."""
    import torch

    dev = getattr(device, "device", device)
    index = dev.index if getattr(dev, "index", None) is not None else torch.cuda.current_device()
    if index not in _GPUS:
        major, minor = torch.cuda.get_device_capability(index)
        _GPUS[index] = {"gpu": str(torch.cuda.get_device_name(index)), "capability": f"{major}.{minor}"}
    return dict(_GPUS[index])


def cuda_slower_reason(op: str, ctx: Mapping[str, Any], table: tuple[GpuMeasurement, ...] | None = None,
                       versions: Mapping[str, int] | None = None) -> str | None:
    """Why no CUDA kernel of ``op`` should serve ``ctx`` automatically
    (None: one measured at least as fast as torch there, see
    :func:`kernel_choice`)."""
    kernel, why = kernel_choice(op, ctx, table, versions)
    return None if kernel is not None else why
