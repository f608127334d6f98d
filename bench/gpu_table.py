"""docs/gpu.md's tables and the dispatcher's crossover table, both made from
the recorded GPU runs in bench/gpu_results/*.json (written by a GPU run of
the benchmarks, see bench/conftest.py and bench/gpu_check.sh).

    python bench/gpu_table.py                       # print the tables
    python bench/gpu_table.py --folder DIR          # ... of another results folder
    python bench/gpu_table.py --write               # docs/gpu.md's GPU block and rcn_fast/_gpu_measurements.json

A results file: ``{"device", "updated", "unit", "cuda_kernels": {op:
version}, "groups": {group: {impl: ms}}, ...}``, optionally ``"capability"``
(the GPU's compute capability, "9.0"), ``"match": "capability"`` (its
records then count for every GPU of that capability, not only for the GPU
named: rcn_fast/_crossovers.py) and ``"topn_k"`` / ``"topn_d"`` (the top-n
workload; default 100 and 768, bench/bench_topn.py's). Group names say the
op and the workload: ``topn GPU N=<N> Q=<Q> <dtype>[ queries=<dtype>]`` (no
``queries=``: float32 queries), ``sample_subsets GPU B=<B> ... <dtype>``,
``llm label scoring GPU ...``.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

from rcn_fast._crossovers import KERNELS, kernel_algorithm

HERE = Path(__file__).resolve().parent
FOLDER = HERE / "gpu_results"
REPO = HERE.parent
GPU_DOC = REPO / "docs" / "gpu.md"
MEASUREMENTS = REPO / "rcn_fast" / "_gpu_measurements.json"
BEGIN, END = "<!-- gpu-tables: begin (python bench/gpu_table.py --write) -->", "<!-- gpu-tables: end -->"

# columns of each op's table, in this order (others follow, sorted)
COLUMNS = {
    "topn": ("dispatched", "torch_backend", "cuda", "cuda_v1", "cuda_tiled", "cuda_int8", "recipe", "oneliner",
             "torch_cuda"),
    "sample_subsets": ("cuda", "cuda_gram", "torch_cuda"),
    "llm": ("triton",),
}
TITLES = {
    "topn": "top-n (k = 100, d = 768)",
    "sample_subsets": "subset sampler (n = 100, d = 768, K = 5, N = 9)",
    "llm": "label scoring (Triton)",
}
# the torch path a CUDA kernel is compared with, per op, first present wins:
# rcn_fast's torch backend, else the default call of a run whose default was
# the torch backend (kernel version 1 runs), else the bench's torch peer
PEERS = {"topn": ("torch_backend", "dispatched", "torch_cuda"), "sample_subsets": ("torch_cuda",)}
COMMANDS = {
    "topn": "python -m pytest bench/bench_topn.py -k gpu --benchmark-only",
    "sample_subsets": "python -m pytest bench/bench_sampling.py -k gpu --benchmark-only",
}
#: The top-n workload of bench/bench_topn.py's GPU groups (k, d), where a file does not say.
TOPN_K, TOPN_D = 100, 768
_TOPN = re.compile(r"^topn GPU (N=\d+) Q=(\d+) (\w+)(?: queries=(\w+))?$")
_SAMPLER = re.compile(r"^sample_subsets GPU B=(\d+) (.*) (\w+)$")


def load(folder: Path = FOLDER) -> list[tuple[str, dict]]:
    """``(file name, contents)`` of every results file, sorted by name."""
    return [(p.name, json.loads(p.read_text())) for p in sorted(Path(folder).glob("*.json"))]


def op_of(group: str) -> str:
    return group.split(" ", 1)[0]


def _fmt(v: float | None) -> str:
    return "-" if v is None else f"{v:g}"


# implementations that are not exact on half-precision inputs (float16
# products or sums rounded): never "fastest exact" there
INEXACT_ON_HALF = {"topn": ("oneliner", "torch_cuda")}


def _exact(op: str, group: str, impl: str) -> bool:
    half = group.split(" queries=")[0].endswith(("float16", "bfloat16"))
    return not (half and impl in INEXACT_ON_HALF.get(op, ()))


def table(op: str, groups: dict[str, dict[str, float]]) -> list[str]:
    """One op's markdown table: a row per group, a column per implementation
    (ms), and the fastest exact implementation."""
    impls = [c for c in COLUMNS.get(op, ()) if any(c in g for g in groups.values())]
    impls += sorted({i for g in groups.values() for i in g} - set(impls))
    lines = ["| workload | " + " | ".join(impls) + " | fastest exact |", "|---" * (len(impls) + 2) + "|"]
    for name, g in sorted(groups.items(), key=lambda kv: _sort_key(kv[0])):
        exact = {i: t for i, t in g.items() if _exact(op, name, i)}
        best = min(exact, key=exact.get) if exact else "-"
        label = name.replace(" GPU", "", 1)
        lines.append(f"| {label} | " + " | ".join(_fmt(g.get(i)) for i in impls) + f" | {best} |")
    return lines


def _sort_key(group: str):
    """Numbers in a group name sort as numbers (Q=32 before Q=512)."""
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", group)]


def _shown(folder: Path, name: str) -> str:
    """A results file as the tables name it: relative to the repository
    (``bench/gpu_results/<name>``) when inside it, else its absolute path."""
    path = Path(folder).resolve() / name
    try:
        return path.relative_to(REPO).as_posix()
    except ValueError:
        return str(path)


def tables(folder: Path = FOLDER, device: str | None = None) -> str:
    """Every results file as markdown (only those recorded on ``device``,
    when given): a heading line, then a table per op."""
    out = []
    for name, data in load(folder):
        if device is not None and data.get("device") != device:
            continue
        kernels = ", ".join(f"{k} v{v}" for k, v in sorted(data.get("cuda_kernels", {}).items())) or "unknown"
        out.append(f"{data['device']}, updated {data['updated']} (`{_shown(folder, name)}`; {data['unit']}; "
                   f"CUDA kernels: {kernels})\n")
        by_op: dict[str, dict] = {}
        for group, impls in data["groups"].items():
            by_op.setdefault(op_of(group), {})[group] = impls
        for op in sorted(by_op):
            out.append(f"{TITLES.get(op, op)}:\n")
            out.extend(table(op, by_op[op]))
            out.append("")
    return "\n".join(out)


def crossover_rows(folder: Path = FOLDER) -> list[dict]:
    """Every recorded comparison of a CUDA kernel with the torch path, for
    rcn_fast/_crossovers.py: op, dtype, query dtype (top-n), size (Q or B),
    both times, the peer implementation, device, workload, the kernel (one
    of the op's kernels, rcn_fast._crossovers.KERNELS: each has its column)
    and the version measured, and the file."""
    rows = []
    for name, data in load(folder):
        kernels = data.get("cuda_kernels", {})
        for group, impls in sorted(data["groups"].items(), key=lambda kv: _sort_key(kv[0])):
            op = op_of(group)
            if op == "topn":
                m = _TOPN.match(group)
                if not m:
                    continue
                shape, size, dtype, qdtype = m.group(1), int(m.group(2)), m.group(3), m.group(4) or "float32"
            elif op == "sample_subsets":
                m = _SAMPLER.match(group)
                if not m:
                    continue
                size, shape, dtype, qdtype = int(m.group(1)), m.group(2), m.group(3), None
            else:
                continue
            peer = next((p for p in PEERS[op] if p in impls), None)
            if peer is None:
                continue
            work = {"dtype": dtype, "Q": size}
            if op == "topn":
                work.update(k=int(data.get("topn_k", TOPN_K)), d=int(data.get("topn_d", TOPN_D)))
            for kernel, impl in KERNELS[op]:
                if impl not in impls:
                    continue
                rows.append({
                    "op": op, "dtype": dtype, "query_dtype": qdtype, "size": size, "cuda_ms": impls[impl],
                    "torch_ms": impls[peer], "peer": peer, "device": data["device"], "shape": shape,
                    "command": data.get("command") or COMMANDS[op], "kernel_version": int(kernels.get(kernel, 1)),
                    "source": name, "kernel": kernel, "capability": data.get("capability"),
                    "match": data.get("match", "name"), "k": work.get("k"), "d": work.get("d"),
                    "algorithm": kernel_algorithm(op, kernel, work),
                })
    return rows


def doc_block(folder: Path = FOLDER) -> str:
    """docs/gpu.md's GPU block: the tables between the markers."""
    return f"{BEGIN}\n{tables(folder)}\n{END}"


def write(folder: Path = FOLDER, doc: Path = GPU_DOC, measurements: Path = MEASUREMENTS) -> None:
    """docs/gpu.md's GPU block (between the markers) and the dispatcher's table."""
    text = doc.read_text()
    if BEGIN not in text or END not in text:
        raise SystemExit(f"{doc}: no GPU block markers ({BEGIN} ... {END})")
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    doc.write_text(head + doc_block(folder) + tail)
    measurements.write_text(measurements_json(folder))


def measurements_json(folder: Path = FOLDER) -> str:
    """rcn_fast/_gpu_measurements.json's text: one row a line."""
    rows = ",\n".join("  " + json.dumps(r) for r in crossover_rows(folder))
    return '{\n "generated_by": "python bench/gpu_table.py --write",\n "rows": [\n' + rows + "\n ]\n}\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--folder", type=Path, default=FOLDER, help="results folder (default: bench/gpu_results)")
    ap.add_argument("--write", action="store_true",
                    help="update docs/gpu.md's GPU block and rcn_fast/_gpu_measurements.json from the folder")
    ap.add_argument("--device", help="print only the files of this device (e.g. 'NVIDIA H100 80GB HBM3')")
    args = ap.parse_args(argv)
    if not args.folder.is_dir():
        ap.error(f"--folder: {args.folder} is not a folder")
    if args.write:
        write(args.folder)
    text = tables(args.folder, args.device or None)
    sys.stdout.write(text + ("\n" if text and not text.endswith("\n") else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
