"""The native engine against llama.cpp at the sizes people run: batch-1
greedy decoding and prompt processing on the Llama-3.1-shaped files of
bench/engine_models.py (1B; 3B opt-in), each file's load time, and the
share of the cores' read bandwidth each decode reaches, all in one run
(bench/bench_engine.py runs it: ``--sizes`` there, or its pytest-benchmark
test).

Per file and implementation (the native engine with llama.cpp's 8-bit
arithmetic, ``activations="q8"``; with float32 activations, the default,
``"f32"``; ``llama_cpp.Llama`` with ``n_threads`` threads):

* load: seconds to build the model from the file (warm page cache; the
  engine's includes its interleaved copies);
* prompt: tokens/s of one prefill of a short chat (SmolLM2's template,
  about 100 tokens);
* decode: tokens/s of 64 greedy tokens after it (forced: end-of-turn is
  not a stop, so every implementation decodes 64);
* bandwidth share: decode bytes (every matrix once a token: the file's
  tensor bytes, a tied head counted once) x tokens/s / the read bandwidth
  of ``threads`` threads summing a 2 GiB array, measured in the same run.

Rounds alternate between the implementations; each figure is the best of
``repeats`` and comes with the load average when it was taken, and decode
also as tokens per second of the process's CPU time (what a loaded machine
distorts least). The machine may be shared: compare ratios within one run.

llama.cpp runs with ``OMP_WAIT_POLICY=PASSIVE`` unless the environment
sets it (as the project's llama.cpp backend does: its spinning OpenMP
barriers stall it when the cores are shared; set ``OMP_WAIT_POLICY=ACTIVE``
to time it spinning).
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any, Callable

import numpy as np

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # read when llama.cpp's OpenMP starts (see above)

NEW_TOKENS = 64
CHAT = [{"role": "system", "content": "You answer questions about everyday life in one short sentence."},
        {"role": "user", "content": "Where would you put a plate after washing it, and why? Think of a kitchen with a "
                                    "cupboard, a table, a sink and an oven, and say which one you would pick."}]


def read_bandwidth(threads: int, gib: float = 2.0, repeats: int = 3) -> float:
    """Bytes/s of ``threads`` threads summing their shares of one float32
    array of ``gib`` GiB (numpy releases the GIL in the sum): the best of
    ``repeats``."""
    a = np.ones(int(gib * (1 << 30)) // 4, dtype=np.float32)
    parts = np.array_split(a, threads)
    best = float("inf")
    for _ in range(repeats):
        ts = [threading.Thread(target=p.sum) for p in parts]
        t = time.perf_counter()
        for x in ts:
            x.start()
        for x in ts:
            x.join()
        best = min(best, time.perf_counter() - t)
    return a.nbytes / best


def weight_bytes(path: str) -> int:
    """Bytes a decoding step reads: every tensor of the file once."""
    from rcn_fast.llm.backends.engine.gguf_file import GGUFFile

    g = GGUFFile(path)
    return sum(t.nbytes for t in g.tensors.values())


class Native:
    """The engine's decoder on a file (``activations``: "q8" or "f32")."""

    def __init__(self, path: str, threads: int, activations: str) -> None:
        from rcn_fast.llm.backends.engine.gguf_file import GGUFFile
        from rcn_fast.llm.backends.engine.model import NativeLlama

        t = time.perf_counter()
        self.m = NativeLlama(GGUFFile(path), num_threads=threads, activations=activations)
        self.load_s = time.perf_counter() - t

    def prefill(self, ids: list[int]) -> Any:
        n = len(ids)
        self.cache = self.m.new_cache(1, n + NEW_TOKENS + 1)
        return self.m.forward(np.array(ids), np.zeros(n), np.arange(n), self.cache, np.array([n - 1]))[0]

    def decode(self, n0: int, logits: Any) -> list[int]:
        out = []
        for pos in range(n0, n0 + NEW_TOKENS):
            out.append(int(np.argmax(logits)))
            logits = self.m.forward(np.array(out[-1:]), np.zeros(1), np.array([pos]), self.cache, np.array([0]))[0]
        return out


class LlamaCpp:
    """``llama_cpp.Llama`` on a file (its defaults otherwise)."""

    def __init__(self, path: str, threads: int) -> None:
        import llama_cpp

        t = time.perf_counter()
        self.llm = llama_cpp.Llama(path, n_ctx=512, n_threads=threads, n_threads_batch=threads, verbose=False)
        self.load_s = time.perf_counter() - t

    def prefill(self, ids: list[int]) -> Any:
        self.llm.reset()
        self.llm.eval(ids)
        return self.llm.scores[self.llm.n_tokens - 1]

    def decode(self, n0: int, logits: Any) -> list[int]:
        out = []
        for _ in range(NEW_TOKENS):
            out.append(int(np.argmax(logits)))
            self.llm.eval(out[-1:])
            logits = self.llm.scores[self.llm.n_tokens - 1]
        return out


def _timed(fn: Callable[[], Any]) -> tuple[float, float, Any]:
    """(wall seconds, process CPU seconds, result) of one call."""
    t, c = time.perf_counter(), time.process_time()
    out = fn()
    return time.perf_counter() - t, time.process_time() - c, out


def measure_file(size: str, quant: str, threads: int, repeats: int, bandwidth: float,
                 impls: tuple[str, ...] = ("native q8", "native f32", "llama.cpp")) -> list[dict[str, Any]]:
    """Rows (one per implementation) for the file of (size, quant)."""
    import engine_models

    path = str(engine_models.build(size, (quant,))[quant])
    models: dict[str, Any] = {}
    for name in impls:
        models[name] = LlamaCpp(path, threads) if name == "llama.cpp" else Native(path, threads, name.split()[-1])
    from rcn_fast.llm.backends.engine import GGUFLLM, EngineConfig

    ids = GGUFLLM(path, config=EngineConfig(num_threads=1)).encode_chats([CHAT])[0]
    best = {k: {"prompt": float("inf"), "decode": float("inf"), "decode_cpu": float("inf")} for k in models}
    load: dict[str, list[float]] = {k: [] for k in models}
    for _ in range(repeats):
        for name, m in models.items():
            tp, _, logits = _timed(lambda: m.prefill(ids))
            td, tc, _ = _timed(lambda: m.decode(len(ids), logits))
            best[name]["prompt"] = min(best[name]["prompt"], tp)
            best[name]["decode"] = min(best[name]["decode"], td)
            best[name]["decode_cpu"] = min(best[name]["decode_cpu"], tc)
            load[name].append(os.getloadavg()[0])
    nbytes = weight_bytes(path)
    rows = []
    for name, m in models.items():
        dec = NEW_TOKENS / best[name]["decode"]
        rows.append(dict(file=f"{size} {quant}", impl=name, size=size, quant=quant, file_mb=os.path.getsize(path) / 1e6,
                         load_s=m.load_s, prompt_tokens=len(ids), prompt_tok_s=len(ids) / best[name]["prompt"],
                         decode_tok_s=dec, decode_cpu_tok_s=NEW_TOKENS / best[name]["decode_cpu"],
                         bw_share=nbytes * dec / bandwidth, loadavg=max(load[name]), decode_s=best[name]["decode"]))
    del models
    return rows


def run_sizes(sizes: tuple[str, ...], threads: int = 2, repeats: int = 3,
              quants: tuple[str, ...] = ("Q4_0", "Q4_K_M", "Q8_0")) -> list[dict[str, Any]]:
    """Every file of ``sizes`` x ``quants``; the bandwidth measured first and after."""
    bw = read_bandwidth(threads)
    rows: list[dict[str, Any]] = []
    for size in sizes:
        for quant in quants:
            rows += measure_file(size, quant, threads, repeats, bw)
    bw_after = read_bandwidth(threads)
    for r in rows:
        r["bandwidth_gb_s"] = max(bw, bw_after) / 1e9
        r["bw_share"] *= bw / max(bw, bw_after)
    return rows


def print_sizes_table(rows: list[dict[str, Any]]) -> None:
    bw = rows[0]["bandwidth_gb_s"] if rows else float("nan")
    print(f"\nbatch-1 decoding, {NEW_TOKENS} greedy tokens after a {rows[0]['prompt_tokens'] if rows else '?'}-token chat "
          f"(read bandwidth {bw:.1f} GB/s)")
    print(f"  {'file':<11} {'impl':<11} {'MB':>6} {'load s':>7} {'prompt t/s':>10} {'decode t/s':>10} "
          f"{'x llama.cpp':>11} {'bw share':>8} {'t/cpu-s':>8} {'x llama.cpp':>11} {'loadavg':>7}")
    ref = {r["file"]: r for r in rows if r["impl"] == "llama.cpp"}
    for r in rows:
        base = ref.get(r["file"])
        ratio = r["decode_tok_s"] / base["decode_tok_s"] if base else float("nan")
        cpu_ratio = r["decode_cpu_tok_s"] / base["decode_cpu_tok_s"] if base else float("nan")
        print(f"  {r['file']:<11} {r['impl']:<11} {r['file_mb']:6.0f} {r['load_s']:7.2f} {r['prompt_tok_s']:10.1f} "
              f"{r['decode_tok_s']:10.2f} {ratio:11.2f} {r['bw_share']:8.2f} {r['decode_cpu_tok_s']:8.2f} "
              f"{cpu_ratio:11.2f} {r['loadavg']:7.1f}")


__all__ = ["read_bandwidth", "measure_file", "run_sizes", "print_sizes_table", "NEW_TOKENS", "CHAT"]
