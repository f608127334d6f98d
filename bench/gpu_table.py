"""Print README's GPU tables from bench/gpu_results/*.json (written by a GPU
run of the benchmarks, see bench/conftest.py).

    python bench/gpu_table.py
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

FOLDER = Path(__file__).with_name("gpu_results")


def tables(folder: Path = FOLDER) -> str:
    out = []
    for path in sorted(folder.glob("*.json")):
        data = json.loads(path.read_text())
        out.append(f"{data['device']} (updated {data['updated']}; {data['unit']}; `{path.name}`)\n")
        out.append("| workload | " + " | ".join(("rcn_fast CUDA", "torch on the GPU", "torch / CUDA")) + " |")
        out.append("|---|---|---|---|")
        for group, impls in sorted(data["groups"].items()):
            cuda, peer = impls.get("cuda"), impls.get("torch_cuda")
            ratio = f"x{peer / cuda:.2f}" if cuda and peer else "-"
            cells = [f"{v:g}" if v is not None else "-" for v in (cuda, peer)]
            out.append(f"| {group} | {cells[0]} | {cells[1]} | {ratio} |")
        out.append("")
    return "\n".join(out)


if __name__ == "__main__":
    sys.stdout.write(tables())
