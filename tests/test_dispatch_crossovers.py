"""The dispatcher never picks a backend known to be slower (issue 22).

No GPU is needed: a stand-in for the CUDA module makes the ``cuda``
backends' availability checks pass, so only the measured-crossover rule
decides. ``select`` never runs a kernel.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import types
from pathlib import Path

import numpy as np
import pytest

import rcn_fast
from rcn_fast import _crossovers, _dispatch, _native
from rcn_fast._crossovers import GpuMeasurement, cuda_slower_reason, nearest_measurement


@pytest.fixture
def fake_gpu(monkeypatch):
    """A usable CUDA module as far as the availability checks can tell."""
    mod = types.SimpleNamespace(TOPN_MAX_K=1024, topn=None, sample_subsets=None)
    monkeypatch.setattr(_native, "cuda_module", lambda: (mod, None))
    return mod


def _topn_ctx(dtype: str, Q: int, k: int = 100) -> dict:
    return {"library": "torch", "device": "cuda", "dtype": dtype, "Q": Q, "N": 1_000_000, "d": 768, "k": k}


def _sampler_ctx(dtype: str, B: int) -> dict:
    return {"library": "torch", "device": "cuda", "dtype": dtype, "B": B, "n": 100, "d": 768, "N": 9, "K": 5}


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("Q", [1, 7, 32, 100, 512, 4096])
def test_topn_on_cuda_goes_to_torch_where_the_kernel_measured_slower(fake_gpu, dtype, Q):
    op = _dispatch.get("topn")
    ctx = _topn_ctx(dtype, Q)
    assert op.select(ctx).name == "torch"
    why = dict(op.report(ctx))["cuda"]
    assert why is not None and "measured slower than torch" in why and "bench/bench_topn.py" in why
    # forcing the kernel still works
    assert op.select(ctx, backend="cuda").name == "cuda"


def test_sampler_on_cuda_follows_the_measurement_per_dtype(fake_gpu):
    op = _dispatch.get("sample_subsets")
    # float32: the kernel measured faster (8.1 vs 9.7 ms on an H100)
    assert op.select(_sampler_ctx("float32", 1000)).name == "cuda"
    assert dict(op.report(_sampler_ctx("float32", 1000)))["cuda"] is None
    # float16: measured slower (13.6 vs 9.7 ms)
    assert op.select(_sampler_ctx("float16", 1000)).name == "torch"
    assert "measured slower" in dict(op.report(_sampler_ctx("float16", 1000)))["cuda"]
    # bfloat16: never measured -> torch until it is
    assert op.select(_sampler_ctx("bfloat16", 1000)).name == "torch"
    assert "not yet measured" in dict(op.report(_sampler_ctx("bfloat16", 1000)))["cuda"]
    assert op.select(_sampler_ctx("bfloat16", 1000), backend="cuda").name == "cuda"


def test_the_environment_override_still_forces_the_kernel(fake_gpu, monkeypatch):
    monkeypatch.setenv(_dispatch.ENV_VAR, "topn=cuda")
    assert _dispatch.get("topn").select(_topn_ctx("float32", 32)).name == "cuda"


def test_cpu_choice_is_unchanged(fake_gpu):
    ctx = {"library": "numpy", "device": "cpu", "dtype": "float32", "Q": 32, "N": 1000, "d": 8, "k": 10}
    assert _dispatch.get("topn").select(ctx).name == "native"


def test_nearest_measurement_on_a_log_scale():
    table = (
        GpuMeasurement("topn", "float32", 1, 1.0, 2.0, "GPU", "s", "cmd"),
        GpuMeasurement("topn", "float32", 512, 9.0, 3.0, "GPU", "s", "cmd"),
    )
    assert nearest_measurement("topn", {"dtype": "float32", "Q": 4}, table).size == 1
    assert nearest_measurement("topn", {"dtype": "float32", "Q": 200}, table).size == 512
    # just below the geometric midpoint (22.6): the smaller measured size is nearer
    assert nearest_measurement("topn", {"dtype": "float32", "Q": 22}, table).size == 1
    assert nearest_measurement("topn", {"dtype": "float16", "Q": 4}, table) is None
    assert cuda_slower_reason("topn", {"dtype": "float32", "Q": 2}, table) is None  # kernel faster
    assert "9 vs 3 ms at Q=512" in cuda_slower_reason("topn", {"dtype": "float32", "Q": 1000}, table)
    assert "not yet measured" in cuda_slower_reason("topn", {"dtype": "bfloat16", "Q": 1}, table)


def test_the_table_names_device_and_command_for_every_row():
    assert _crossovers.MEASUREMENTS
    for m in _crossovers.MEASUREMENTS:
        assert m.op in _crossovers.SIZE_KEY and m.device and m.command.startswith("python -m pytest bench/")
        assert m.cuda_ms > 0 and m.torch_ms > 0


def test_a_slower_backend_still_serves_when_nothing_else_can():
    calls = []
    op = _dispatch.Op("toy", [
        _dispatch.Backend("fast_but_slow", lambda ctx: None, lambda: calls.append("a") or "a",
                          slower=lambda ctx: "measured slower"),
        _dispatch.Backend("other", lambda ctx: "cannot", lambda: "b"),
    ])
    assert op({}) == "a"
    op2 = _dispatch.Op("toy2", [
        _dispatch.Backend("first", lambda ctx: None, lambda: "a", slower=lambda ctx: "measured slower"),
        _dispatch.Backend("second", lambda ctx: None, lambda: "b"),
    ])
    assert op2({}) == "b"
    assert dict(op2.report({}))["first"] == "can serve, but skipped: measured slower"


def test_torch_backend_chunks_big_on_a_gpu_and_agrees_with_the_reference(rng):
    torch = pytest.importorskip("torch")
    from rcn_fast.search import topn_reference
    from rcn_fast.search.topn import _run_torch
    from rcn_fast.search.torch_backend import chunk_rows

    assert chunk_rows(1, "cpu") == 1 << 16
    assert chunk_rows(1, "cuda") >= 1 << 26  # one chunk for a 1M-row corpus at Q = 1
    assert chunk_rows(512, "cuda") >= 1 << 20  # and at Q = 512
    assert chunk_rows(1 << 20, "cuda") == 1 << 16
    q = rng.standard_normal((5, 12)).astype(np.float32)
    c = np.round(rng.standard_normal((301, 12)), 1).astype(np.float32)  # ties across chunks
    ref = topn_reference(q, c, 17)
    for chunk in (None, 7, 64):
        s, i = _run_torch(torch.from_numpy(q), torch.from_numpy(c), 17, chunk=chunk)
        np.testing.assert_array_equal(i.numpy(), ref[1])


def test_info_says_what_a_gpu_would_run():
    res = subprocess.run([sys.executable, "-m", "rcn_fast.info", "--json"], capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0, res.stderr
    info = json.loads(res.stdout)
    topn = info["backends"]["topn"]
    assert topn["cpu (numpy float32)"]["uses"] == "native"
    for q in (1, 32, 512):
        assert topn[f"cuda (torch float16, Q={q})"]["on_a_gpu"].startswith("torch: measured slower")
    samp = info["backends"]["sample_subsets"]
    assert samp["cuda (torch float32, B=1000)"]["on_a_gpu"].startswith("cuda")
    assert samp["cuda (torch float16, B=1000)"]["on_a_gpu"].startswith("torch")
    if not info["cuda"]["gpu_usable"]:
        assert topn["cuda (torch float32, Q=32)"]["uses"] == "torch"
    assert rcn_fast.__version__


# ------------------------------------------- bench/gpu_results <-> the table
BENCH = Path(__file__).resolve().parents[1] / "bench"


def _load_bench_module(name: str):
    spec = importlib.util.spec_from_file_location(f"_rcn_bench_{name}", BENCH / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_crossover_table_matches_the_recorded_gpu_results():
    """Every row of rcn_fast/_crossovers.py is a figure recorded under
    bench/gpu_results (so README's table and the dispatcher cannot drift)."""
    recorded = {}
    for path in (BENCH / "gpu_results").glob("*.json"):
        data = json.loads(path.read_text())
        recorded[data["device"]] = data["groups"]
    assert recorded, "bench/gpu_results has no recorded GPU run"
    for m in _crossovers.MEASUREMENTS:
        groups = recorded[m.device]
        key = f" Q={m.size} {m.dtype}" if m.op == "topn" else f" B={m.size} "
        hits = [impls for g, impls in groups.items()
                if g.startswith(m.op) and key in g + " " and g.endswith(m.dtype)]
        assert len(hits) == 1, (m, list(groups))
        assert hits[0]["cuda"] == m.cuda_ms and hits[0]["torch_cuda"] == m.torch_ms


def test_gpu_results_recorder_and_table(tmp_path, monkeypatch):
    conftest = _load_bench_module("conftest")
    results = {"topn GPU N=10 Q=1 float32": {"cuda": 0.002, "torch_cuda": 0.001},
               "topn N=10 Q=1 float32": {"native": 0.5}}
    monkeypatch.setattr(conftest, "_gpu_name", lambda: None)
    assert conftest.write_gpu_results(results, tmp_path) is None  # no GPU: nothing written
    monkeypatch.setattr(conftest, "_gpu_name", lambda: "Test GPU 9000")
    path = conftest.write_gpu_results(results, tmp_path)
    assert path.name == "test-gpu-9000.json"
    data = json.loads(path.read_text())
    assert data["groups"] == {"topn GPU N=10 Q=1 float32": {"cuda": 2.0, "torch_cuda": 1.0}}
    conftest.write_gpu_results({"topn GPU N=10 Q=32 float32": {"cuda": 0.003}}, tmp_path)
    assert len(json.loads(path.read_text())["groups"]) == 2  # merged with the earlier run
    table = _load_bench_module("gpu_table").tables(tmp_path)
    assert "| topn GPU N=10 Q=1 float32 | 2 | 1 | x0.50 |" in table
