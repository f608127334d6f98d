"""One prepared device check (bench/gpu_check.sh runs this): build the
extension for the GPU, run the GPU tests, time every CUDA kernel against its
torch peer, compare the samplers' draws with the CPU's, record the figures
in bench/gpu_results/<device>.json and print docs/gpu.md's tables.

Made to run blind on one H100 or H200 in one device call (at most 9
minutes, under the 10 minutes one call may run) with only what a CUDA 13 /
torch 2.11 image has (nothing is fetched, nothing asks a question). The
steps, in order:

* build: ``pip install -e .`` with RCN_FAST_CUDA=ON for ``--arch`` (90);
* tests: the GPU tests (``-m gpu``): every kernel against the CPU, the
  samplers' draws against the emulation of their arithmetic;
* bench: every kernel, old and new, timed against its torch peer in the
  same run: top-n by the tensor-core scan (``cuda``), the tiled kernel it
  falls back to (``cuda_v1``, forced for every dtype), the GEMM tiles
  (``cuda_tiled``), the int8 bounded scan (``cuda_int8``: version 3, the
  filter inside the kernel, __dp4a at Q = 1 and IMMA at Q = 32 and 512), the default
  (``dispatched``) and the torch backend and recipes; the warp and Gram
  samplers; the Triton label scoring;
* draws: bench/gpu_draws.py, the CPU-vs-GPU draw comparison of both
  samplers (issue 55, Y2): printed, and written to
  ``gpu_results/draws/<device>.json``;
* embed: the corpus embedding (E5-base shape) against sentence-transformers;
* tables: docs/gpu.md's tables and the dispatcher's table
  (rcn_fast/_gpu_measurements.json) regenerated from the files, so kernels
  measured faster become the default on that GPU at once (python
  bench/gpu_table.py --write). Its time is kept in reserve: it runs even
  when the steps before it ran long.

``--paper-scale`` adds a step that times top-n over the paper's store size
(23.5M x 768 float16 resident: 36 GB; an H200, or it skips with the reason);
run it in a call of its own (``--skip build --skip tests --skip bench --skip
draws --skip embed --paper-scale``) when the default steps already fill one.
Each step runs with its own timeout, never beyond what is left of the total
budget; a step that fails or times out is reported and the next ones still
run (the benchmarks record what they measured even when the tests failed).
A results file of other kernel versions is kept as
``<device>-<its date>.json`` (bench/conftest.py). Exit status: 0 when every
step that ran passed, 1 otherwise, 2 for bad arguments.

    bench/gpu_check.sh [--quick] [--out DIR] [--skip-build] [--skip STEP] [--budget S]
                       [--timeout STEP=S] [--arch 90] [--no-write] [--paper-scale] [--dry-run]
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
STEP_NAMES = ("build", "tests", "bench", "draws", "embed", "paper", "tables")
# seconds each step may take at most (the total budget caps them too). On the
# H200 (2026-11-27): build 25 s, tests 18 s, bench 34 s; the embedding pair
# (two workloads of 3 and 7.6 s a call, setup included) needed more than 60 s;
# the embed step also runs the command twice in a fresh process (cold start) and
# once over 200,000 statements (issue 46): about 90 s expected. Issue 55 added
# the tiled kernel for every dtype to the bench (about 25 s more) and the
# draws step (about 20 s: the emulation runs 32 host threads).
STEP_TIMEOUTS = {"build": 150, "tests": 120, "bench": 200, "draws": 60, "embed": 200, "paper": 300, "tables": 20}
#: Steps whose time is kept in reserve: the steps before them never eat it.
RESERVED = ("tables",)
DEFAULT_BUDGET = 540.0  # seconds: one device call may run 600
BENCH_FILES = ("bench/bench_topn.py", "bench/bench_sampling.py", "bench/bench_llm.py")
BENCH_SELECT = "gpu or scoring_logits or scoring_hidden"
EMBED_FILE = "bench/bench_embed.py"
PAPER_SELECT = "paper_scale"
PAPER_ENV = "RCN_FAST_BENCH_PAPER_SCALE"


@dataclass
class Step:
    name: str
    argv: list[str]
    timeout: float
    env: dict[str, str] = field(default_factory=dict)


def positive(kind):
    def parse(text: str):
        value = kind(text)
        if value <= 0:
            raise argparse.ArgumentTypeError(f"expected a positive number, got {text}")
        return value

    return parse


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="bench/gpu_check.sh", description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true",
                    help="smaller workloads (top-n N = 100,000; sampler B = 1,000) and fewer rounds")
    ap.add_argument("--out", type=Path, default=HERE / "gpu_results",
                    help="folder of the results file (default: bench/gpu_results)")
    ap.add_argument("--skip", action="append", default=[], choices=STEP_NAMES, metavar="STEP",
                    help=f"skip a step (repeatable): {', '.join(STEP_NAMES)}")
    ap.add_argument("--skip-build", action="store_true", help="same as --skip build (reuse the installed build)")
    ap.add_argument("--budget", type=positive(float), default=DEFAULT_BUDGET,
                    help=f"seconds for all steps together (default: {DEFAULT_BUDGET:g})")
    ap.add_argument("--timeout", action="append", default=[], metavar="STEP=SECONDS",
                    help="override one step's timeout, e.g. --timeout bench=120")
    ap.add_argument("--arch", default="90", help="CUDA architectures to build (CMake list, default: 90)")
    ap.add_argument("--jobs", type=positive(int), default=os.cpu_count() or 4, help="parallel build jobs")
    ap.add_argument("--no-write", action="store_true",
                    help="with the default --out, do not update docs/gpu.md's tables and "
                         "rcn_fast/_gpu_measurements.json from the results (they are updated by default)")
    ap.add_argument("--paper-scale", action="store_true",
                    help="add the step timing top-n over 23.5M x 768 float16 resident (36 GB of GPU memory)")
    ap.add_argument("--dry-run", action="store_true", help="print the steps and their timeouts, run nothing")
    args = ap.parse_args(argv)
    if args.skip_build:
        args.skip.append("build")
    timeouts = dict(STEP_TIMEOUTS)
    for item in args.timeout:
        name, sep, value = item.partition("=")
        if not sep or name not in STEP_NAMES:
            ap.error(f"--timeout: expected STEP=SECONDS with STEP in {', '.join(STEP_NAMES)}, got {item!r}")
        try:
            timeouts[name] = positive(float)(value)
        except (ValueError, argparse.ArgumentTypeError):
            ap.error(f"--timeout: expected a positive number of seconds, got {item!r}")
    args.timeouts = timeouts
    return args


def plan(args: argparse.Namespace, python: str = sys.executable, embed_exists: bool | None = None) -> list[Step]:
    """The steps to run, in order (those not skipped)."""
    if embed_exists is None:
        embed_exists = (REPO / EMBED_FILE).exists()
    out = str(Path(args.out).resolve())
    bench_env = {"RCN_FAST_GPU_RESULTS": out,
                 "RCN_FAST_GPU_COMMAND": "bench/gpu_check.sh" + (" --quick" if args.quick else "")}
    rounds = ["--benchmark-min-rounds=3", "--benchmark-max-time=0.25", "--benchmark-warmup=on",
              "--benchmark-warmup-iterations=1"]
    if args.quick:
        bench_env.update({"RCN_FAST_BENCH_QUICK": "1", "RCN_FAST_BENCH_GPU_BS": "1000"})
        rounds = ["--benchmark-min-rounds=2", "--benchmark-max-time=0.1", "--benchmark-warmup=on",
                  "--benchmark-warmup-iterations=1"]
    pytest = [python, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
    steps = [
        Step("build", [python, "-m", "pip", "install", "--no-deps", "--no-build-isolation", "-e", ".",
                       f"--config-settings=cmake.define.RCN_FAST_CUDA_ARCHITECTURES={args.arch}"],
             args.timeouts["build"], {"RCN_FAST_CUDA": "ON", "CMAKE_BUILD_PARALLEL_LEVEL": str(args.jobs)}),
        Step("tests", pytest + ["-m", "gpu", "tests"], args.timeouts["tests"]),
        Step("bench", pytest + list(BENCH_FILES) + ["-k", BENCH_SELECT, "--benchmark-only",
                                                    "--benchmark-columns=mean,min,rounds"] + rounds,
             args.timeouts["bench"], bench_env),
    ]
    steps.append(Step("draws", [python, str(HERE / "gpu_draws.py"), "--out", out], args.timeouts["draws"],
                      bench_env))
    if embed_exists:
        # two workloads of seconds a call (pedantic: min-rounds calls + one warm-up): two rounds suffice
        embed_rounds = [r for r in rounds if not r.startswith("--benchmark-min-rounds")] + ["--benchmark-min-rounds=2"]
        steps.append(Step("embed", pytest + [EMBED_FILE, "-k", "cuda", "--benchmark-only"] + embed_rounds,
                          args.timeouts["embed"], bench_env))
    if args.paper_scale:
        steps.append(Step("paper", pytest + ["bench/bench_topn.py", "-k", PAPER_SELECT, "--benchmark-only",
                                             "--benchmark-columns=mean,min,rounds"] + rounds,
                          args.timeouts["paper"], {**bench_env, PAPER_ENV: "1"}))
    tables = [python, str(HERE / "gpu_table.py"), "--folder", out]
    if Path(out) == (HERE / "gpu_results").resolve() and not args.no_write:
        tables.append("--write")  # keep docs/gpu.md's tables and the dispatcher's table equal to the files
    steps.append(Step("tables", tables, args.timeouts["tables"]))
    if not (REPO / "tests").is_dir():  # a checkout without the test suite: benchmarks only
        steps = [s for s in steps if s.name != "tests"]
    return [s for s in steps if s.name not in args.skip]


@dataclass
class Outcome:
    name: str
    status: str  # "passed", "failed (exit N)", "timed out after S s", "skipped: ..."
    seconds: float


def run_steps(steps: list[Step], budget: float, runner=subprocess.run, clock=time.monotonic,
              log=print) -> list[Outcome]:
    """Run the steps in order, each within min(its timeout, what is left of
    the budget less the timeouts of the reserved steps still to come); steps
    that no longer fit (less than 5 s left) are skipped. ``runner`` is
    :func:`subprocess.run`'s signature (tests pass a fake)."""
    start = clock()
    outcomes = []
    for i, step in enumerate(steps):
        reserve = sum(s.timeout for s in steps[i + 1:] if s.name in RESERVED)
        left = budget - (clock() - start) - reserve
        if left < 5:
            outcomes.append(Outcome(step.name, f"skipped: the {budget:g} s budget is spent", 0.0))
            log(f"== {step.name}: skipped (budget spent)")
            continue
        limit = min(step.timeout, left)
        log(f"== {step.name} (at most {limit:.0f} s): {shlex.join(step.argv)}")
        t0 = clock()
        try:
            res = runner(step.argv, cwd=REPO, env={**os.environ, **step.env}, timeout=limit)
            status = "passed" if res.returncode == 0 else f"failed (exit {res.returncode})"
        except subprocess.TimeoutExpired:
            status = f"timed out after {limit:.0f} s"
        except OSError as exc:
            status = f"failed ({exc})"
        outcomes.append(Outcome(step.name, status, clock() - t0))
        log(f"== {step.name}: {status} ({clock() - t0:.0f} s)")
    return outcomes


def summary(outcomes: list[Outcome]) -> str:
    return "\n".join(f"{o.name:<8} {o.status} ({o.seconds:.0f} s)" for o in outcomes)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    steps = plan(args)
    if args.dry_run:
        for s in steps:
            env = " ".join(f"{k}={shlex.quote(v)}" for k, v in s.env.items())
            print(f"{s.name} (timeout {s.timeout:g} s): {env + ' ' if env else ''}{shlex.join(s.argv)}")
        print(f"budget: {args.budget:g} s")
        return 0
    outcomes = run_steps(steps, args.budget)
    print("\n" + summary(outcomes))
    return 0 if all(o.status == "passed" or o.status.startswith("skipped") for o in outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
