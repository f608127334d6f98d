"""Measured CPU speeds of the GGUF backends: which one ``engine="auto"``
tries first for a file.

``load_llm(path.gguf)`` with ``engine="auto"`` orders the backends that
accept the call's options by recorded decode speed, then loads the first
that runs the file (:mod:`rcn_fast.llm.backends.probe`). A recorded run
counts for a file when it measured the same quantisation (the file's
dominant matrix type: ``Q4_K`` for a ``Q4_K_M`` file, ``Q8_0``, ...) on the
same CPU class (vendor and instruction-set level: ``avx512-vnni``,
``avx512``, ``avx2``, ``generic``, or the machine type off x86; the CPU's
model name is recorded but not compared); of those, the runs at the
measured model size nearest to the file's (parameters, log scale; ties go
to the smaller size) decide: the backends in order of their mean decode
tokens/s there, then the backends no such run measured, in the default
order. A file more than :data:`MAX_BELOW` times smaller than the
smallest measured size keeps the default order (at a few million
parameters per-token overheads decide, not the weights' read that a 1B
measurement shows); one larger than the largest measured size takes
that one's order (the read of the weights only grows).

Where no run matches (another CPU class, a quantisation never measured)
the default order holds: on a machine without a CUDA GPU ``native``
(rcn_fast's engine: batch-invariant scoring, a row scores the same bits in
any batch, and no extra dependency), then ``llamacpp``, then
``transformers``; with a CUDA GPU (and ``device`` left ``"auto"``)
``transformers`` first. The records are ``engine_speeds.json`` beside this
module, written by ``python bench/engine_speeds.py --write`` (decode and
prompt tokens/s of each backend on each file, the CPU class and the
versions with each row).
"""

from __future__ import annotations

import json
import math
import platform
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources
from typing import Any, Sequence

#: a file this many times smaller than the smallest measured size keeps the default order (per-token
#: overheads, not the weights' read, decide there; above the largest measured size that one holds)
MAX_BELOW = 8
#: the backends of a .gguf file, in the default order on a CPU
DEFAULT_ORDER = ("native", "llamacpp", "transformers")
#: with a CUDA GPU (device "auto"): transformers computes on it
CUDA_ORDER = ("transformers", "native", "llamacpp")
FORMAT = "rcn_fast-engine-speeds-1"
FILE = "engine_speeds.json"


@dataclass(frozen=True)
class SpeedRecord:
    """One backend on one file, measured: decode and prompt tokens/s."""

    backend: str
    quant: str
    params: int
    decode_tok_s: float
    prompt_tok_s: float
    cpu: dict[str, str]
    threads: int
    file: str = ""
    command: str = ""
    versions: dict[str, str] = field(default_factory=dict)
    date: str = ""
    load_average: float = 0.0  # the machine's 1-minute load when measured (a shared machine: read the ratios)

    def cpu_class(self) -> tuple[str, str]:
        return (self.cpu.get("vendor", ""), self.cpu.get("isa", ""))


def _flags_isa(flags: set[str]) -> str:
    if {"avx512f", "avx512bw", "avx512vl"} <= flags:
        return "avx512-vnni" if "avx512_vnni" in flags else "avx512"
    if {"avx2", "fma"} <= flags:
        return "avx2"
    return "generic"


@lru_cache(maxsize=1)
def cpu_info() -> dict[str, str]:
    """This machine's CPU: ``{"vendor", "isa", "model"}`` (from
    ``/proc/cpuinfo`` on Linux; elsewhere the machine type)."""
    machine = platform.machine().lower()
    info = {"vendor": "", "isa": machine if machine not in ("x86_64", "amd64") else "generic", "model": ""}
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            text = f.read(1 << 20)
    except OSError:
        return info
    fields: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip():
            break  # the first processor is enough
        k, _, v = line.partition(":")
        fields.setdefault(k.strip(), v.strip())
    info["vendor"] = fields.get("vendor_id", fields.get("CPU implementer", ""))
    info["model"] = fields.get("model name", "")
    if machine in ("x86_64", "amd64"):
        info["isa"] = _flags_isa(set(fields.get("flags", "").split()))
    return info


@lru_cache(maxsize=None)
def load_records(text: str | None = None) -> tuple[SpeedRecord, ...]:
    """The recorded runs (``text``: a JSON document instead of the
    package's file; empty when the file is missing)."""
    if text is None:
        try:
            text = resources.files("rcn_fast.llm.backends").joinpath(FILE).read_text(encoding="utf-8")
        except FileNotFoundError:
            return ()
    doc = json.loads(text)
    if doc.get("format") != FORMAT:
        raise ValueError(f"{FILE}: expected format {FORMAT!r}, got {doc.get('format')!r}")
    return tuple(SpeedRecord(**row) for row in doc["rows"])


def file_kind(g: Any) -> tuple[str, int]:
    """(the dominant matrix type by bytes, the parameter count) of a
    :class:`~rcn_fast.llm.backends.engine.gguf_file.GGUFFile`."""
    from rcn_fast.llm.backends.engine.ggml_types import type_name

    by_type: dict[int, int] = {}
    params = 0
    for t in g.tensors.values():
        n = math.prod(t.shape)
        params += n
        if len(t.shape) == 2:
            by_type[t.ggml_type] = by_type.get(t.ggml_type, 0) + t.nbytes
    quant = type_name(max(by_type, key=lambda k: (by_type[k], -k))) if by_type else "none"
    return quant, params


def ranking(quant: str, params: int, candidates: Sequence[str], *, cuda: bool = False,
            cpu: dict[str, str] | None = None,
            records: tuple[SpeedRecord, ...] | None = None) -> tuple[list[str], str]:
    """``candidates`` in the order ``engine="auto"`` tries them for a file
    of ``quant`` and ``params`` (module notes), and why that order."""
    default = [b for b in (CUDA_ORDER if cuda else DEFAULT_ORDER) if b in candidates]
    if cuda:
        return default, "a CUDA GPU: transformers first"
    me = cpu or cpu_info()
    mine = (me.get("vendor", ""), me.get("isa", ""))
    rows = [r for r in (load_records() if records is None else records)
            if r.quant == quant and r.cpu_class() == mine and r.backend in candidates and r.params > 0]
    if not rows:
        return default, (f"no recorded run of {quant} files on this CPU class ({mine[0] or '?'}, {mine[1]}): the "
                         f"default order")
    size = max(1, params)
    smallest = min(r.params for r in rows)
    if size * MAX_BELOW < smallest:
        return default, (f"{quant} files are measured on this CPU class from {smallest / 1e6:.0f}M parameters on, this "
                         f"one has {size / 1e6:.2g}M: the default order")
    best = min(rows, key=lambda r: (abs(math.log2(size) - math.log2(r.params)), r.params)).params
    at = [r for r in rows if r.params == best]
    speed = {b: sum(r.decode_tok_s for r in at if r.backend == b) / n
             for b in {r.backend for r in at} if (n := sum(1 for r in at if r.backend == b))}
    measured = sorted(speed, key=lambda b: (-speed[b], default.index(b)))
    order = measured + [b for b in default if b not in speed]
    shown = ", ".join(f"{b} {speed[b]:.1f} tok/s" for b in measured)
    return order, f"recorded decode speed of {quant} at {best / 1e6:.0f}M parameters on {mine[1]}: {shown}"


__all__ = ["SpeedRecord", "MAX_BELOW", "DEFAULT_ORDER", "CUDA_ORDER", "FORMAT", "FILE", "cpu_info", "load_records", "file_kind",
           "ranking"]
