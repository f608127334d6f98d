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
from rcn_fast._crossovers import GpuMeasurement, cuda_slower_reason, nearest_measurements


@pytest.fixture
def fake_gpu(monkeypatch):
    """A usable CUDA module as far as the availability checks can tell, with
    the kernel versions the recorded runs measured (version 1)."""
    mod = types.SimpleNamespace(TOPN_MAX_K=1024, topn=None, sample_subsets=None,
                                KERNEL_VERSIONS={"topn": 1, "sample_subsets": 1})
    monkeypatch.setattr(_native, "cuda_module", lambda: (mod, None))
    monkeypatch.setattr(_native, "cuda_compiled_module", lambda: mod)
    return mod


H100, H200, A100 = "NVIDIA H100", "NVIDIA H200", "NVIDIA A100-SXM4-80GB"
#: The kernel versions the recorded H200 run of 2026-11-27 measured (bench/gpu_results/nvidia-h200.json).
V2 = {"topn": 2, "topn_tiled": 1, "topn_int8": 1, "sample_subsets": 2, "sample_subsets_gram": 1}


def _topn_ctx(dtype: str, Q: int, k: int = 100, gpu: str = H100) -> dict:
    return {"library": "torch", "device": "cuda", "dtype": dtype, "Q": Q, "N": 1_000_000, "d": 768, "k": k,
            "gpu": gpu, "aligned": True}


def _sampler_ctx(dtype: str, B: int, gpu: str = H100) -> dict:
    return {"library": "torch", "device": "cuda", "dtype": dtype, "B": B, "n": 100, "d": 768, "N": 9, "K": 5,
            "gpu": gpu}


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


def test_sampler_on_cuda_follows_the_measurement_per_dtype_and_gpu(fake_gpu):
    op = _dispatch.get("sample_subsets")
    # float32: the version 1 kernel measured faster on the H100 and on the H200
    for gpu in (H100, H200):
        assert op.select(_sampler_ctx("float32", 1000, gpu)).name == "cuda"
        assert dict(op.report(_sampler_ctx("float32", 1000, gpu)))["cuda"] is None
    # float16: slower on the H100 (13.6 vs 9.7 ms), not slower on the H200 at B = 1,000: each GPU its own
    assert op.select(_sampler_ctx("float16", 1000, H100)).name == "torch"
    assert "measured slower than torch on NVIDIA H100" in dict(op.report(_sampler_ctx("float16", 1000)))["cuda"]
    assert op.select(_sampler_ctx("float16", 1000, H200)).name == "cuda"
    # float16 at B = 10,000: slower on the H200 (116.9 vs 75.9 ms)
    assert "116.9 vs 75.9" in dict(op.report(_sampler_ctx("float16", 10_000, H200)))["cuda"]
    # bfloat16: faster on the H200 (3.12 vs 14.12 ms), never measured on the H100
    assert op.select(_sampler_ctx("bfloat16", 1000, H200)).name == "cuda"
    assert op.select(_sampler_ctx("bfloat16", 1000, H100)).name == "torch"


def test_a_new_kernel_version_is_not_picked_until_measured(fake_gpu):
    """A rebuilt kernel (version 3 here) has no recorded run: torch serves
    every CUDA call, with the reason; forcing the kernel still works."""
    fake_gpu.KERNEL_VERSIONS = {"topn": 3, "sample_subsets": 3}  # (the gpu of the contexts: the H100)
    for op_name, ctx in (("sample_subsets", _sampler_ctx("float32", 1000)),
                         ("sample_subsets", _sampler_ctx("bfloat16", 1000)),
                         ("topn", _topn_ctx("float16", 1)), ("topn", {**_topn_ctx("bfloat16", 32),
                                                                      "query_dtype": "bfloat16"})):
        op = _dispatch.get(op_name)
        assert op.select(ctx).name == "torch"
        why = dict(op.report(ctx))["cuda"]
        assert "kernel version 3 not yet measured" in why and "version 1, 2" in why
        assert "not in this build" in why  # the second kernel of each op: not in this (fake) build
        assert op.select(ctx, backend="cuda").name == "cuda"
    # issue 55 rebuilt every kernel (the int8 scan twice): none is measured yet
    assert _crossovers.KERNEL_VERSIONS == {"topn": 3, "topn_tiled": 2, "topn_int8": 3, "sample_subsets": 3,
                                           "sample_subsets_gram": 2}


def test_the_h200_run_of_the_version_2_kernels_decides(fake_gpu):
    """bench/gpu_results/nvidia-h200.json (2026-11-27, kernel versions 2):
    the v2 sampler measured faster than torch for every dtype at B = 1,000
    and 10,000, so it serves; the v2 scan only for a float16 corpus with
    float32 queries at Q = 1 (1.232 vs 1.441 ms); the new kernels (GEMM
    tiles, Gram sampler) have no recorded run: not picked."""
    fake_gpu.KERNEL_VERSIONS = dict(V2)
    samp = _dispatch.get("sample_subsets")
    for dt in ("float32", "float16", "bfloat16"):
        for b in (1000, 10_000):
            assert samp.select(_sampler_ctx(dt, b, H200)).name == "cuda"
            assert _crossovers.kernel_choice("sample_subsets", _sampler_ctx(dt, b, H200)) == ("sample_subsets", "")
    topn = _dispatch.get("topn")
    assert topn.select({**_topn_ctx("float16", 1, gpu=H200), "query_dtype": "float32"}).name == "cuda"
    assert _crossovers.kernel_choice("topn", {**_topn_ctx("float16", 1, gpu=H200), "query_dtype": "float32"})[0] \
        == "topn"
    for dt, qdt, q in (("float16", "float16", 1), ("float16", "float32", 32), ("bfloat16", "float32", 1),
                       ("float32", "float32", 512), ("bfloat16", "bfloat16", 512)):
        ctx = {**_topn_ctx(dt, q, gpu=H200), "query_dtype": qdt}
        assert topn.select(ctx).name == "torch"
        why = dict(topn.report(ctx))["cuda"]
        assert "measured slower than torch on NVIDIA H200" in why and "topn_tiled: kernel version 1 not yet" in why


def test_the_fastest_measured_kernel_serves(fake_gpu):
    fake_gpu.KERNEL_VERSIONS = {"topn": 2, "topn_tiled": 1}
    row = dict(dtype="float16", size=512, device="GPU A", shape="N=1000000", command="cmd", query_dtype="float16",
               source="a.json")
    table = (GpuMeasurement("topn", cuda_ms=6.0, torch_ms=7.0, kernel_version=2, kernel="topn", **row),
             GpuMeasurement("topn", cuda_ms=5.0, torch_ms=7.0, kernel_version=1, kernel="topn_tiled", **row))
    ctx = {**_topn_ctx("float16", 512, gpu="GPU A"), "query_dtype": "float16"}
    assert _crossovers.kernel_choice("topn", ctx, table) == ("topn_tiled", "")
    slower_tiles = (table[0], GpuMeasurement("topn", cuda_ms=8.0, torch_ms=7.0, kernel_version=1,
                                             kernel="topn_tiled", **row))
    assert _crossovers.kernel_choice("topn", ctx, slower_tiles) == ("topn", "")
    old_tiles = (GpuMeasurement("topn", cuda_ms=5.0, torch_ms=7.0, kernel_version=9, kernel="topn_tiled", **row),)
    kernel, why = _crossovers.kernel_choice("topn", ctx, old_tiles)
    assert kernel is None and "topn_tiled: kernel version 1 not yet measured" in why and "version 9" in why


def test_the_compiled_module_reports_the_source_kernel_versions():
    mod = _native.cuda_compiled_module()
    if mod is None:
        pytest.skip("rcn_fast._cuda was not compiled")
    assert dict(mod.KERNEL_VERSIONS) == _crossovers.KERNEL_VERSIONS


def test_a_run_of_the_built_version_decides(fake_gpu):
    fake_gpu.KERNEL_VERSIONS = {"topn": 2, "sample_subsets": 2}
    table = (GpuMeasurement("topn", "float16", 1, 0.3, 0.5, "GPU A", "N=1000000", "cmd", "float16", 2, "a.json"),
             GpuMeasurement("topn", "float16", 1, 0.4, 0.5, "GPU B", "N=1000000", "cmd", "float16", 2, "b.json"),
             GpuMeasurement("topn", "float16", 512, 9.0, 7.0, "GPU A", "N=1000000", "cmd", "float16", 2, "a.json"))
    ctx = {**_topn_ctx("float16", 1, gpu="GPU A"), "query_dtype": "float16"}
    assert cuda_slower_reason("topn", ctx, table, {"topn": 2}) is None  # faster on GPU A
    assert cuda_slower_reason("topn", {**ctx, "gpu": "GPU B"}, table, {"topn": 2}) is None  # and on GPU B
    assert "not yet measured" in cuda_slower_reason("topn", {**ctx, "query_dtype": "float32"}, table, {"topn": 2})
    assert "9 vs 7 ms at Q=512" in cuda_slower_reason("topn", {**ctx, "Q": 400}, table, {"topn": 2})
    slower_on_b = table[:1] + (GpuMeasurement("topn", "float16", 1, 0.6, 0.5, "GPU B", "N=1000000", "cmd",
                                              "float16", 2, "b.json"),)
    assert cuda_slower_reason("topn", ctx, slower_on_b, {"topn": 2}) is None  # GPU A's record decides for GPU A
    assert "GPU B" in cuda_slower_reason("topn", {**ctx, "gpu": "GPU B"}, slower_on_b, {"topn": 2})
    # the fake module's own versions decide when none are given: version 2 of the scan was measured
    assert cuda_slower_reason("topn", ctx, table) is None


def test_a_record_counts_only_for_its_gpu(fake_gpu):
    """Issue 55, C5: the H200's records chose kernels on every GPU (an A100
    was sent the warp sampler whose launch failed there at 16 subsets). A
    record counts for the GPU it ran on, by name; one that says so counts
    for every GPU of its compute capability; an unmeasured GPU runs torch."""
    fake_gpu.KERNEL_VERSIONS = dict(V2)
    samp = _dispatch.get("sample_subsets")
    assert samp.select(_sampler_ctx("float32", 1000, H200)).name == "cuda"
    ctx = _sampler_ctx("float32", 1000, A100)
    assert samp.select(ctx).name == "torch"
    why = dict(samp.report(ctx))["cuda"]
    assert "on NVIDIA A100-SXM4-80GB" in why and "measured on NVIDIA H200 only" in why
    assert samp.select({**ctx, "gpu": None}).name == "torch"  # a GPU that cannot be named
    row = dict(dtype="float16", size=1, device="NVIDIA H100 80GB HBM3", shape="N=1000000", command="cmd",
               query_dtype="float16", source="a.json", kernel="topn", kernel_version=2, k=100, d=768,
               algorithm="scan", capability="9.0")
    by_name = (GpuMeasurement("topn", cuda_ms=1.0, torch_ms=2.0, **row),)
    by_cc = (GpuMeasurement("topn", cuda_ms=1.0, torch_ms=2.0, match="capability", **row),)
    tctx = {**_topn_ctx("float16", 1, gpu=H200), "query_dtype": "float16", "capability": "9.0"}
    assert _crossovers.kernel_choice("topn", tctx, by_name, {"topn": 2})[0] is None
    assert _crossovers.kernel_choice("topn", {**tctx, "gpu": row["device"]}, by_name, {"topn": 2})[0] == "topn"
    assert _crossovers.kernel_choice("topn", tctx, by_cc, {"topn": 2})[0] == "topn"  # the same capability
    assert _crossovers.kernel_choice("topn", {**tctx, "capability": "8.0"}, by_cc, {"topn": 2})[0] is None


def test_k_d_and_the_algorithm_key_a_topn_record(fake_gpu):
    """Issue 55, S4: a record of the tensor-core scan (k = 100, d = 768)
    counted for calls the scan cannot serve (k > 256, d % 8 != 0: the tiled
    fallback runs) and for any k. Now the algorithm the call would run, the
    d % 8 class and a k within K_RATIO of the record's must match."""
    row = dict(dtype="float16", size=1, device="GPU", shape="N=1000000", command="cmd", query_dtype="float16",
               source="a.json", kernel="topn", kernel_version=3)
    ctx0 = {"dtype": "float16", "Q": 1, "k": 100, "d": 768, "gpu": "GPU"}
    table = (GpuMeasurement("topn", cuda_ms=1.0, torch_ms=2.0, k=100, d=768,
                            algorithm=_crossovers.topn_algorithm("topn", ctx0), **row),)
    assert table[0].algorithm == "scan"
    v = {"topn": 3}
    assert _crossovers.kernel_choice("topn", {**ctx0, "query_dtype": "float16"}, table, v)[0] == "topn"
    for change, algo in (({"k": 300}, "tiled_v1"), ({"d": 770}, "tiled_v1"), ({"aligned": False}, "tiled_v1"),
                         ({"k": 10}, "scan"), ({"k": 401}, "tiled_v1"), ({"dtype": "float32"}, None)):
        ctx = {**ctx0, "query_dtype": "float16", **change}
        if algo:
            assert _crossovers.topn_algorithm("topn", ctx) == algo
        kernel, why = _crossovers.kernel_choice("topn", ctx, table, v)
        assert kernel is None and "not yet measured" in why, change
    for k in (25, 50, 200, 256):
        assert _crossovers.kernel_choice("topn", {**ctx0, "query_dtype": "float16", "k": k}, table, v)[0] == "topn"
    assert _crossovers.topn_algorithm("topn_tiled", ctx0) == "gemm_tiles"


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
    g = {"gpu": "GPU"}
    assert [m.size for m in nearest_measurements("topn", {"dtype": "float32", "Q": 4, **g}, table)] == [1]
    assert [m.size for m in nearest_measurements("topn", {"dtype": "float32", "Q": 200, **g}, table)] == [512]
    # just below the geometric midpoint (22.6): the smaller measured size is nearer
    assert [m.size for m in nearest_measurements("topn", {"dtype": "float32", "Q": 22, **g}, table)] == [1]
    assert nearest_measurements("topn", {"dtype": "float16", "Q": 4, **g}, table) == []
    assert nearest_measurements("topn", {"dtype": "float32", "Q": 4}, table) == []  # no GPU named: none counts
    v1, v2 = {"topn": 1}, {"topn": 2}
    assert cuda_slower_reason("topn", {"dtype": "float32", "Q": 2, **g}, table, v1) is None  # kernel faster
    assert "9 vs 3 ms at Q=512" in cuda_slower_reason("topn", {"dtype": "float32", "Q": 1000, **g}, table, v1)
    assert "not yet measured" in cuda_slower_reason("topn", {"dtype": "bfloat16", "Q": 1, **g}, table, v1)
    assert "not yet measured" in cuda_slower_reason("topn", {"dtype": "float32", "Q": 1, **g}, table, v2)


def test_the_table_names_device_and_command_for_every_row():
    assert _crossovers.load_measurements()
    for m in _crossovers.load_measurements():
        assert m.op in _crossovers.SIZE_KEY and m.device and m.command and m.source.endswith(".json")
        assert m.kernel_key in dict(_crossovers.KERNELS[m.op])
        assert m.cuda_ms > 0 and m.torch_ms > 0 and m.kernel_version >= 1


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
    # small integers and halves: every score is exact in float32 in any summation order, so the ids
    # (the tie rule included: many ties, across chunks) cannot depend on the CPU's GEMM
    q = rng.integers(-3, 4, (5, 12)).astype(np.float32)
    c = (np.round(rng.standard_normal((301, 12)) * 2) / 2).astype(np.float32)
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
    # per recorded GPU; every kernel was rebuilt by issue 55 and none is measured yet: torch everywhere
    for label in ("cuda (torch float16, Q=1)", "cuda (torch float32, Q=512)"):
        on = topn[label]["on_a_gpu"]
        assert set(on) == {"NVIDIA H100", "NVIDIA H200", "any other GPU"}
        assert all(v.startswith("torch:") for v in on.values())
        assert "kernel version 3 not yet measured" in on["NVIDIA H200"]
    samp = info["backends"]["sample_subsets"]
    for dt in ("float32", "float16", "bfloat16"):
        assert samp[f"cuda (torch {dt}, B=1000)"]["on_a_gpu"]["any other GPU"].startswith("torch: no recorded run")
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


def test_the_crossover_table_is_generated_from_the_recorded_gpu_results():
    """rcn_fast/_gpu_measurements.json is exactly what bench/gpu_table.py
    makes of bench/gpu_results (so the dispatcher cannot drift from the
    recorded runs), and every comparison in the files is in it."""
    gpu_table = _load_bench_module("gpu_table")
    assert _crossovers.MEASUREMENTS_FILE.read_text() == gpu_table.measurements_json(), (
        "rcn_fast/_gpu_measurements.json is stale: run python bench/gpu_table.py --write")
    recorded = {}
    for path in (BENCH / "gpu_results").glob("*.json"):
        recorded[path.name] = json.loads(path.read_text())
    assert {"nvidia-h100.json", "nvidia-h200.json", "nvidia-h200-2026-11-26.json",
            "nvidia-h200-cuda-events.json"} <= set(recorded)
    impl_of = {kernel: impl for kernels in _crossovers.KERNELS.values() for kernel, impl in kernels}
    for m in _crossovers.load_measurements():
        data = recorded[m.source]
        hits = [impls for g, impls in data["groups"].items()
                if g.startswith(m.op) and (f" Q={m.size} " in g or f" B={m.size} " in g)
                and m.dtype in g.split(" queries=")[0].split()[-1:] and impls.get(impl_of[m.kernel_key]) == m.cuda_ms]
        assert hits and hits[0][m.peer] == m.torch_ms, m
        assert m.kernel_version == data["cuda_kernels"].get(m.kernel_key, 1)
    n_cuda = sum(1 for d in recorded.values() for g, impls in d["groups"].items() if g.split()[0] in _crossovers.KERNELS
                 for _, impl in _crossovers.KERNELS[g.split()[0]] if impl in impls)
    assert len(_crossovers.load_measurements()) == n_cuda


def test_the_h200_runs_are_recorded_as_found():
    """bench/gpu_results/nvidia-h200.json holds the 2026-11-27 run of the
    version 2 kernels (../shared/gpu/2026-11-27/nvidia-h200.json) as
    recorded; nvidia-h200-2026-11-26.json the version 1 run of the day
    before (../shared/gpu/nvidia-h200.json)."""
    # a run of other kernel versions keeps this file as nvidia-h200-<its date>.json (bench/conftest.py)
    files = sorted((BENCH / "gpu_results").glob("nvidia-h200*.json"))
    data = next(d for d in map(json.loads, (p.read_text() for p in files))
                if d["cuda_kernels"] == {"topn": 2, "sample_subsets": 2})
    assert data["device"] == "NVIDIA H200"
    assert data["groups"]["sample_subsets GPU B=10000 n=100 d=768 K=5 N=9 float16"] == {"cuda": 12.31,
                                                                                        "torch_cuda": 67.152}
    old = json.loads((BENCH / "gpu_results" / "nvidia-h200-2026-11-26.json").read_text())
    assert old["cuda_kernels"] == {"topn": 1, "sample_subsets": 1}
    assert old["groups"]["topn GPU N=1000000 Q=1 float16"] == {"cuda": 11.579, "dispatched": 3.705, "torch_cuda": 1.427}
    shared = Path(__file__).resolve().parents[1] / ".." / "shared" / "gpu"
    if (shared / "2026-11-27" / "nvidia-h200.json").exists():
        assert data == json.loads((shared / "2026-11-27" / "nvidia-h200.json").read_text())
    if (shared / "nvidia-h200.json").exists():
        assert old["groups"] == json.loads((shared / "nvidia-h200.json").read_text())["groups"]


def test_docs_gpu_tables_are_the_recorded_results():
    gpu_table = _load_bench_module("gpu_table")
    text = (BENCH.parent / "docs" / "gpu.md").read_text()
    assert gpu_table.doc_block() in text, "docs/gpu.md's tables are stale: run python bench/gpu_table.py --write"


def test_gpu_results_recorder(tmp_path, monkeypatch):
    conftest = _load_bench_module("conftest")
    results = {"topn GPU N=10 Q=1 float32": {"cuda": 0.002, "torch_backend": 0.001},
               "topn N=10 Q=1 float32": {"native": 0.5}}
    monkeypatch.setattr(conftest, "_gpu_name", lambda: None)
    assert conftest.write_gpu_results(results, tmp_path, kernels={"topn": 2}) is None  # no GPU: nothing written
    monkeypatch.setattr(conftest, "_gpu_name", lambda: "Test GPU 9000")
    path = conftest.write_gpu_results(results, tmp_path, kernels={"topn": 2}, command="bench/gpu_check.sh")
    assert path.name == "test-gpu-9000.json"
    data = json.loads(path.read_text())
    assert data["groups"] == {"topn GPU N=10 Q=1 float32": {"cuda": 2.0, "torch_backend": 1.0}}
    assert data["cuda_kernels"] == {"topn": 2} and data["command"] == "bench/gpu_check.sh"
    conftest.write_gpu_results({"topn GPU N=10 Q=32 float32": {"cuda": 0.003}}, tmp_path, kernels={"topn": 2})
    assert len(json.loads(path.read_text())["groups"]) == 2  # merged with the earlier run
    # a rebuilt kernel: the figures of the old one are not mixed in; its file is kept under its date
    updated = json.loads(path.read_text())["updated"]
    conftest.write_gpu_results({"topn GPU N=10 Q=512 float32": {"cuda": 0.004}}, tmp_path, kernels={"topn": 3})
    assert list(json.loads(path.read_text())["groups"]) == ["topn GPU N=10 Q=512 float32"]
    kept = tmp_path / f"test-gpu-9000-{updated}.json"
    assert json.loads(kept.read_text())["cuda_kernels"] == {"topn": 2}
    assert len(json.loads(kept.read_text())["groups"]) == 2
    # the results folder from the environment (bench/gpu_check.sh --out)
    monkeypatch.setenv(conftest.RESULTS_ENV, str(tmp_path / "elsewhere"))
    assert conftest.write_gpu_results(results, kernels={}).parent == tmp_path / "elsewhere"
