"""bench/gpu_check.sh (issue 35 item 4) without a GPU: its arguments, the
steps it plans, the time budget, and the tables it prints from a results
file (bench/gpu_table.py)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"_rcn_bench_{name}", BENCH / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def gc():
    return _load("gpu_check")


@pytest.fixture(scope="module")
def gt():
    return _load("gpu_table")


# ------------------------------------------------------------------ arguments and plan


def test_defaults_plan_every_step_within_one_device_call(gc):
    """One device call may run 600 s: the default budget stays under it, and
    the paper-scale step is opt-in."""
    args = gc.parse_args([])
    steps = gc.plan(args, python="py", embed_exists=False)
    assert [s.name for s in steps] == ["build", "tests", "bench", "draws", "tables"]
    assert args.budget <= 540 and not args.quick and not args.paper_scale
    build = steps[0]
    assert build.env["RCN_FAST_CUDA"] == "ON" and "--no-build-isolation" in build.argv
    assert "--config-settings=cmake.define.RCN_FAST_CUDA_ARCHITECTURES=90" in build.argv
    assert steps[1].argv[-3:] == ["-m", "gpu", "tests"]
    bench = steps[2]
    assert {"bench/bench_topn.py", "bench/bench_sampling.py", "bench/bench_llm.py",
            "--benchmark-only"} <= set(bench.argv)
    assert bench.argv[bench.argv.index("-k") + 1] == "gpu or scoring_logits or scoring_hidden"
    assert bench.env["RCN_FAST_GPU_RESULTS"] == str((BENCH / "gpu_results").resolve())
    assert "RCN_FAST_BENCH_QUICK" not in bench.env
    draws = steps[3]
    assert draws.argv[1].endswith("gpu_draws.py")
    assert draws.argv[-2:] == ["--out", str((BENCH / "gpu_results").resolve())]
    assert steps[4].argv[1].endswith("gpu_table.py") and steps[4].argv[-1] == "--write"
    no_write = gc.plan(gc.parse_args(["--no-write"]), python="py", embed_exists=False)[-1]
    assert "--write" not in no_write.argv


def test_quick_out_skip_timeouts_and_the_embedding_step(gc, tmp_path):
    args = gc.parse_args(["--quick", "--out", str(tmp_path), "--skip-build", "--skip", "tests",
                          "--timeout", "bench=42", "--arch", "80;90", "--budget", "100"])
    steps = gc.plan(args, python="py", embed_exists=True)
    assert [s.name for s in steps] == ["bench", "draws", "embed", "tables"]
    bench, draws, embed, tables = steps
    assert draws.argv[-1] == str(tmp_path)
    assert bench.timeout == 42 and bench.env["RCN_FAST_BENCH_QUICK"] == "1"
    assert bench.env["RCN_FAST_BENCH_GPU_BS"] == "1000" and bench.env["RCN_FAST_GPU_RESULTS"] == str(tmp_path)
    assert "--benchmark-min-rounds=2" in bench.argv
    assert embed.argv[embed.argv.index("bench/bench_embed.py") + 1:][:2] == ["-k", "cuda"]
    assert embed.env == bench.env
    # two workloads of seconds a call: two rounds (one warm-up) whatever the other steps use
    assert [a for a in embed.argv if a.startswith("--benchmark-min-rounds")] == ["--benchmark-min-rounds=2"]
    assert tables.argv[-2:] == ["--folder", str(tmp_path)]  # results elsewhere: printed, docs untouched
    build = gc.plan(gc.parse_args(["--arch", "80;90"]), python="py", embed_exists=False)[0]
    assert "--config-settings=cmake.define.RCN_FAST_CUDA_ARCHITECTURES=80;90" in build.argv


@pytest.mark.parametrize("argv,message", [
    (["--timeout", "foo=3"], "STEP=SECONDS"),
    (["--timeout", "bench"], "STEP=SECONDS"),
    (["--timeout", "bench=-1"], "positive"),
    (["--budget", "0"], "positive"),
    (["--skip", "nothing"], "invalid choice"),
    (["--jobs", "x"], "invalid"),
])
def test_bad_arguments_exit_2_with_the_reason(gc, capsys, argv, message):
    with pytest.raises(SystemExit) as exc:
        gc.parse_args(argv)
    assert exc.value.code == 2 and message in capsys.readouterr().err


def test_the_shell_script_runs_the_driver(tmp_path):
    res = subprocess.run(["bash", str(BENCH / "gpu_check.sh"), "--dry-run", "--quick", "--out", str(tmp_path)],
                         capture_output=True, text=True, timeout=60, env={**os.environ, "PYTHON": sys.executable})
    assert res.returncode == 0, res.stderr
    assert res.stdout.splitlines()[0].startswith("build (timeout 150 s): RCN_FAST_CUDA=ON")
    assert "budget: 540 s" in res.stdout
    assert os.access(BENCH / "gpu_check.sh", os.X_OK)


def test_the_embedding_step_has_the_time_its_pair_needs(gc):
    """The H200 run of 2026-11-27: the pair (3 s and 7.6 s a call, setup
    included) recorded its figures, then hit the 60 s step timeout."""
    assert gc.STEP_TIMEOUTS["embed"] >= 120
    steps = {s.name: s for s in gc.plan(gc.parse_args([]), python="py", embed_exists=True)}
    assert steps["embed"].timeout >= 120


def test_the_paper_scale_step_is_opt_in(gc, tmp_path):
    assert "paper" not in [s.name for s in gc.plan(gc.parse_args([]), python="py", embed_exists=True)]
    args = gc.parse_args(["--paper-scale", "--skip", "build", "--skip", "tests", "--skip", "bench", "--skip",
                          "draws", "--skip", "embed", "--out", str(tmp_path)])
    steps = gc.plan(args, python="py", embed_exists=True)
    assert [s.name for s in steps] == ["paper", "tables"]
    paper = steps[0]
    assert paper.env[gc.PAPER_ENV] == "1" and paper.env["RCN_FAST_GPU_RESULTS"] == str(tmp_path)
    assert paper.argv[paper.argv.index("-k") + 1] == "paper_scale" and "bench/bench_topn.py" in paper.argv
    assert paper.timeout == gc.STEP_TIMEOUTS["paper"] <= 540


def test_the_budget_fits_the_recorded_step_times(gc):
    """The steps' recorded durations (H200, 2026-11-27: build 25 s, tests
    18 s, bench 34 s, the embedding pair about 70 s) leave room for this
    pass's new benchmarks within the default budget, and no step's timeout
    alone exceeds it."""
    assert 25 + 18 + 34 + 70 < gc.DEFAULT_BUDGET / 2
    assert all(t <= gc.DEFAULT_BUDGET for t in gc.STEP_TIMEOUTS.values())


# ------------------------------------------------------------------ the budget


class FakeClock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def test_steps_share_the_budget_and_failures_do_not_stop_the_rest(gc):
    clock = FakeClock()
    calls = []

    def runner(argv, cwd, env, timeout):
        calls.append((argv[0], timeout, env.get("X")))
        if argv[0] == "slow":
            clock.t += timeout
            raise subprocess.TimeoutExpired(argv, timeout)
        clock.t += 10
        return subprocess.CompletedProcess(argv, 3 if argv[0] == "bad" else 0)

    steps = [gc.Step("a", ["ok"], 50, {"X": "1"}), gc.Step("b", ["bad"], 50), gc.Step("c", ["slow"], 500),
             gc.Step("d", ["ok"], 50)]
    out = gc.run_steps(steps, budget=100, runner=runner, clock=clock, log=lambda *_: None)
    assert [o.status for o in out] == ["passed", "failed (exit 3)", "timed out after 80 s",
                                       "skipped: the 100 s budget is spent"]
    assert calls == [("ok", 50, "1"), ("bad", 50, None), ("slow", 80, None)]  # 'slow' capped by what was left
    assert "timed out" in gc.summary(out)


def test_the_tables_step_keeps_its_time_whatever_ran_before(gc):
    """The tables step regenerates docs/gpu.md and the dispatcher's table
    from what the run recorded: a step before it that runs long is cut
    short so that the tables still run."""
    clock = FakeClock()
    calls = []

    def runner(argv, cwd, env, timeout):
        calls.append((argv[0], timeout))
        clock.t += timeout
        if argv[0] == "slow":
            raise subprocess.TimeoutExpired(argv, timeout)
        return subprocess.CompletedProcess(argv, 0)

    steps = [gc.Step("bench", ["slow"], 500), gc.Step("tables", ["t"], 20)]
    out = gc.run_steps(steps, budget=100, runner=runner, clock=clock, log=lambda *_: None)
    assert calls == [("slow", 80), ("t", 20)]
    assert [o.status for o in out] == ["timed out after 80 s", "passed"]
    assert gc.RESERVED == ("tables",)


def test_main_exit_status(gc, monkeypatch, capsys):
    monkeypatch.setattr(gc, "run_steps", lambda steps, budget: [gc.Outcome("build", "passed", 1.0),
                                                                gc.Outcome("tests", "failed (exit 1)", 2.0)])
    assert gc.main(["--budget", "10"]) == 1
    monkeypatch.setattr(gc, "run_steps", lambda steps, budget: [gc.Outcome("build", "passed", 1.0),
                                                                gc.Outcome("embed", "skipped: x", 0.0)])
    assert gc.main([]) == 0
    assert gc.main(["--dry-run"]) == 0 and "budget: 540 s" in capsys.readouterr().out


# ------------------------------------------------------------------ the tables


SAMPLE = {
    "device": "Test GPU 9000", "updated": "2026-12-01", "unit": "ms (mean)",
    "cuda_kernels": {"topn": 2, "sample_subsets": 2}, "command": "bench/gpu_check.sh",
    "groups": {
        "topn GPU N=1000000 Q=512 float16 queries=float16": {"dispatched": 7.5, "torch_backend": 7.4, "cuda": 2.0,
                                                              "recipe": 7.2, "oneliner": 5.0},
        "topn GPU N=1000000 Q=32 float16 queries=float16": {"dispatched": 1.0, "torch_backend": 1.0, "cuda": 0.5,
                                                             "recipe": 0.9, "oneliner": 0.4},
        "topn GPU N=1000000 Q=1 float32 queries=float32": {"dispatched": 0.9, "torch_backend": 0.9, "cuda": 1.2,
                                                            "oneliner": 0.85},
        "sample_subsets GPU B=10000 n=100 d=768 K=5 N=9 float16": {"cuda": 1.1, "torch_cuda": 75.0},
        "sample_subsets GPU B=1000 n=100 d=768 K=5 N=9 float32": {"cuda": 3.0, "cuda_gram": 0.9, "torch_cuda": 9.0},
        "topn GPU N=23500000 Q=512 float16 queries=float16": {"dispatched": 170.0, "torch_backend": 169.9,
                                                               "cuda_tiled": 45.0, "recipe": 161.5},
        "llm label scoring GPU from logits B=256 V=128256": {"triton": 0.38, "torch full log_softmax+gather": 0.49},
    },
}


def test_tables_from_a_results_file(gt, tmp_path):
    (tmp_path / "test-gpu-9000.json").write_text(json.dumps(SAMPLE))
    text = gt.tables(tmp_path)
    # the file as found (it named bench/gpu_results/ whatever the folder)
    assert text.startswith(f"Test GPU 9000, updated 2026-12-01 (`{tmp_path.resolve() / 'test-gpu-9000.json'}`; "
                           "ms (mean); CUDA kernels: sample_subsets v2, topn v2)")
    lines = text.splitlines()
    head = "| workload | dispatched | torch_backend | cuda | cuda_tiled | recipe | oneliner | fastest exact |"
    assert head in lines
    rows = [ln for ln in lines if ln.startswith("| topn")]
    # numeric order of N and Q, the fastest exact implementation (never the half-precision one-liner)
    assert rows == ["| topn N=1000000 Q=1 float32 queries=float32 | 0.9 | 0.9 | 1.2 | - | - | 0.85 | oneliner |",
                    "| topn N=1000000 Q=32 float16 queries=float16 | 1 | 1 | 0.5 | - | 0.9 | 0.4 | cuda |",
                    "| topn N=1000000 Q=512 float16 queries=float16 | 7.5 | 7.4 | 2 | - | 7.2 | 5 | cuda |",
                    "| topn N=23500000 Q=512 float16 queries=float16 | 170 | 169.9 | - | 45 | 161.5 | - | cuda_tiled |"]
    assert "| sample_subsets B=10000 n=100 d=768 K=5 N=9 float16 | 1.1 | - | 75 | cuda |" in lines
    assert "| sample_subsets B=1000 n=100 d=768 K=5 N=9 float32 | 3 | 0.9 | 9 | cuda_gram |" in lines
    assert any(ln.startswith("| llm label scoring from logits B=256 V=128256 | 0.38 | 0.49 | triton |") for ln in lines)
    # the command-line printer, for one device
    res = subprocess.run([sys.executable, str(BENCH / "gpu_table.py"), "--folder", str(tmp_path),
                          "--device", "Test GPU 9000"], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0 and res.stdout.strip() == text.strip()
    bad = subprocess.run([sys.executable, str(BENCH / "gpu_table.py"), "--folder", str(tmp_path / "none")],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "--folder" in bad.stderr


def test_tables_name_the_real_folder_and_filter_by_device(gt, tmp_path):
    (tmp_path / "test-gpu-9000.json").write_text(json.dumps(SAMPLE))
    (tmp_path / "other-gpu.json").write_text(json.dumps({**SAMPLE, "device": "Other GPU"}))
    # the recorded runs: named relative to the repository, as docs/gpu.md shows them
    assert "(`bench/gpu_results/nvidia-h100.json`;" in gt.tables()
    both = gt.tables(tmp_path)
    one = gt.tables(tmp_path, device="Test GPU 9000")
    assert "Other GPU" in both and "Test GPU 9000" in both
    assert "Other GPU" not in one and one.startswith("Test GPU 9000, updated") and one in both
    assert gt.tables(tmp_path, device="No such GPU") == ""
    res = subprocess.run([sys.executable, str(BENCH / "gpu_table.py"), "--folder", str(tmp_path),
                          "--device", "Other GPU"], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0 and res.stdout.strip() == gt.tables(tmp_path, device="Other GPU").strip()
    assert f"`{tmp_path.resolve() / 'other-gpu.json'}`" in res.stdout and "Test GPU 9000" not in res.stdout


def test_crossover_rows_from_a_results_file(gt, tmp_path):
    (tmp_path / "test-gpu-9000.json").write_text(json.dumps(SAMPLE))
    rows = gt.crossover_rows(tmp_path)
    by = {(r["op"], r["size"], r["dtype"]): r for r in rows}
    assert set(by) == {("topn", 512, "float16"), ("topn", 32, "float16"), ("topn", 1, "float32"),
                       ("sample_subsets", 10000, "float16"), ("sample_subsets", 1000, "float32")}
    # a column per kernel: one row each, with the kernel's key and version (1 where the file names none)
    kernels = sorted((r["op"], r["size"], r["shape"], r["kernel"], r["kernel_version"]) for r in rows)
    assert ("topn", 512, "N=23500000", "topn_tiled", 1) in kernels and ("topn", 512, "N=1000000", "topn", 2) in kernels
    assert ("sample_subsets", 1000, "n=100 d=768 K=5 N=9", "sample_subsets_gram", 1) in kernels
    assert ("sample_subsets", 1000, "n=100 d=768 K=5 N=9", "sample_subsets", 2) in kernels
    assert len(rows) == 7
    r = next(r for r in rows if (r["op"], r["size"], r["shape"]) == ("topn", 512, "N=1000000"))
    assert (r["cuda_ms"], r["torch_ms"], r["peer"]) == (2.0, 7.4, "torch_backend")
    assert (r["query_dtype"], r["kernel_version"]) == ("float16", 2)
    assert r["shape"] == "N=1000000" and r["command"] == "bench/gpu_check.sh" and r["source"] == "test-gpu-9000.json"
    assert by[("sample_subsets", 10000, "float16")]["peer"] == "torch_cuda"


def test_write_updates_the_doc_block_and_the_measurements(gt, tmp_path):
    (tmp_path / "r").mkdir()
    (tmp_path / "r" / "test-gpu-9000.json").write_text(json.dumps(SAMPLE))
    doc = tmp_path / "gpu.md"
    doc.write_text(f"# x\n\n{gt.BEGIN}\nold\n{gt.END}\n\nafter\n")
    meas = tmp_path / "m.json"
    gt.write(tmp_path / "r", doc, meas)
    text = doc.read_text()
    assert "old" not in text and text.endswith("\n\nafter\n") and gt.tables(tmp_path / "r") in text
    assert json.loads(meas.read_text())["rows"] == gt.crossover_rows(tmp_path / "r")
    doc.write_text("no markers")
    with pytest.raises(SystemExit, match="markers"):
        gt.write(tmp_path / "r", doc, meas)
    assert gt.GPU_DOC.name == "gpu.md" and gt.GPU_DOC.parent.name == "docs"  # never README.md


# ------------------------------------------------------------------ the GPU benchmarks' extra info


def test_gpu_sampler_bench_records_subsets_and_gflops_of_its_own_b(monkeypatch):
    """bench/bench_sampling.py's GPU benchmark reports what the CPU ones do
    (subsets/s and textbook GFLOP/s, of its own B) plus GB/s; it once wrote
    subsets/s by hand and dropped GFLOP/s."""
    import numpy as np
    from types import SimpleNamespace

    bs = _load("bench_sampling")
    b, t = 10000, 0.002
    bench = SimpleNamespace(stats=SimpleNamespace(stats=SimpleNamespace(mean=t)), extra_info={}, group=None)
    recorded = []
    monkeypatch.setattr(bs, "_run_cuda", lambda benchmark, backend, q, c: np.zeros((b, bs.N, bs.K), np.int64))
    c = np.zeros((4, 8), np.float16)
    bs.test_gpu_sampler(bench, lambda *a: recorded.append(a), {b: (None, {"float16": c})}, b, "float16", "cuda")
    flops = 2 * b * (bs.n * bs.D + bs.N * (bs.K - 1) * bs.n * bs.D)
    assert bench.extra_info == {"subsets/s": round(b * bs.N / t, 1), "GFLOP/s (textbook)": round(flops / t / 1e9, 2),
                                "GB/s of one input read": round(c.nbytes / t / 1e9, 2)}
    assert recorded and recorded[0][:2] == (bench.group, "cuda")
    # no timing taken (--benchmark-disable): nothing recorded, no error
    off = SimpleNamespace(stats=None, extra_info={})
    assert bs._extra(off, b) is None and off.extra_info == {}


def test_the_bench_step_times_every_cuda_path(gc):
    """The bench step's selection collects a benchmark of every CUDA path a
    recorded run must measure before the dispatcher picks it: the scan
    (cuda), the GEMM tiles (cuda_tiled), the int8 bounded scan (cuda_int8),
    both samplers (cuda, cuda_gram), against their torch peers; the paper
    scale only under its own step."""
    res = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                          *gc.BENCH_FILES, "-k", gc.BENCH_SELECT], capture_output=True, text=True, timeout=300,
                         cwd=BENCH.parent)
    assert res.returncode == 0, res.stdout + res.stderr
    ids = res.stdout
    for needle in ("test_gpu_topn[", "cuda_tiled", "cuda_v1", "test_gpu_topn_int8[", "torch_backend", "recipe",
                   "test_gpu_sampler[cuda_gram", "test_gpu_sampler[cuda-", "test_gpu_sampler[torch_cuda"):
        assert needle in ids, needle
    assert "paper_scale" not in ids
    paper = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                            "bench/bench_topn.py", "-k", gc.PAPER_SELECT], capture_output=True, text=True,
                           timeout=300, cwd=BENCH.parent)
    assert paper.returncode == 0 and "cuda_int8" in paper.stdout and "cuda_tiled" in paper.stdout


# ------------------------------------------------------------------ the draws step (bench/gpu_draws.py)


def test_the_draws_step_without_a_gpu_says_why_and_passes(tmp_path, capsys):
    gd = _load("gpu_draws")
    rows, why = gd.compare(4, 2)
    if rows:
        pytest.skip("a GPU is usable here: the comparison ran")
    assert why and gd.main(["--out", str(tmp_path), "--B", "4"]) == 0
    assert "gpu_draws: skipped:" in capsys.readouterr().out and not (tmp_path / "draws").exists()


def test_the_draws_step_end_to_end_through_the_gpu_stand_in(tmp_path, monkeypatch, capsys):
    """bench/gpu_draws.py runs blind on a GPU: here the stand-in of
    tests/cuda_standin.py plays the GPU (its launchers compute on the CPU),
    so every step of the script runs: the inputs, the GPU and CPU draws,
    both emulations, the table, the file, the verdict."""
    pytest.importorskip("torch")
    from rcn_fast import _native
    from tests.cuda_standin import GpuStandIn

    mod, why = _native.cpu_module()
    if mod is None or not hasattr(mod, "sample_subsets_gram_emulated"):
        pytest.skip(f"rcn_fast._C with the samplers' test aids is needed: {why}")
    gd = _load("gpu_draws")
    with GpuStandIn(monkeypatch, name="NVIDIA Stand-In"):
        assert gd.main(["--out", str(tmp_path), "--B", "6", "--emulated-B", "3"]) == 0
    out = capsys.readouterr().out
    assert "| sample_subsets_gram | bfloat16 | uniform | 1.000000 of 54 |" in out
    data = json.loads((tmp_path / "draws" / "nvidia-stand-in.json").read_text())
    assert len(data["rows"]) == 12 and data["workload"]["B"] == 6
    assert all(r["same_as_cpu"] == 1.0 and r["emulated_subsets"] == 27 for r in data["rows"])


def test_the_draws_verdict_and_table():
    gd = _load("gpu_draws")
    row = {"kernel": "sample_subsets", "dtype": "float16", "first": "relevance", "subsets": 9000,
           "same_as_cpu": 1.0, "logp_vs_cpu": 1e-7, "emulated_subsets": 432, "same_as_emulation": 1.0,
           "logp_vs_emulation": 0.0}
    assert gd.verdict([row]) == []
    assert "| sample_subsets | float16 | relevance | 1.000000 of 9000 |" in gd.table([row])
    off = {**row, "same_as_emulation": 431 / 432}
    assert "differ from the emulation" in gd.verdict([off])[0]
    few = {**row, "same_as_cpu": 0.99}
    assert "only 0.9900 of the subsets equal the CPU's" in gd.verdict([few])[0]
