"""The stream-order and device checks (issue 55 item 2) without a GPU.

Every CUDA path's Python orchestration runs on CPU tensors through the
recording stand-in of tests/cuda_standin.py (torch.cuda's streams, events
and device contexts, and the native and Triton launchers): the tensors
stand for tensors of GPU 1 while the current device is GPU 0. A read of
data another stream wrote with no wait after the write, a host read of a
copy no synchronisation covered, or a launch (or event) under another
device than the data's fails the test. Each path's results are also
compared with the CPU reference, so a stand-in launcher that computed
nothing would fail too.

What these found in fca19ce's code (each test names its finding): W1 the
GEMM tiles' side streams waited before the query split was enqueued; C2 the
merge of the GEMM tiles and every int8 launch ran under the current device;
W3 the encoder's download event was recorded on the current device's
stream; C4 the Triton launches had no device guard; and the torch
backend's finishing kernel (the default top-n path for CUDA tensors) also
launched under the current device.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from tests.cuda_standin import DeviceError, GpuStandIn, StreamOrderError  # noqa: E402


def _mod():
    from rcn_fast import _native

    mod, why = _native.cpu_module()
    if mod is None or not hasattr(mod, "topn_finish_rows"):
        pytest.skip(f"rcn_fast._C with the top-n kernels is needed: {why}")
    return mod


def _integer_data(rng, Q, N, d):
    """Queries of small integers and a corpus of halves: every score is
    exact in float32 whatever the summation order or the query split."""
    q = rng.integers(-3, 4, (Q, d)).astype(np.float32)
    c = (np.round(rng.standard_normal((N, d)) * 2) / 2).astype(np.float32)
    return q, c


def _reference(q, c, k):
    from rcn_fast.search import topn_reference

    return topn_reference(q, c.astype(np.float32), k)


# ------------------------------------------------------------------ the stand-in itself
def test_the_stand_in_catches_a_missing_wait_and_accepts_waits_and_events(monkeypatch):
    with GpuStandIn(monkeypatch) as gpu:
        with torch.cuda.device(1):
            cur, side = torch.cuda.current_stream(1), torch.cuda.Stream(1)
            a = torch.ones(64, device="cpu")  # written on the current stream
            with torch.cuda.stream(side):
                with pytest.raises(StreamOrderError, match="reads bytes ones wrote on stream"):
                    a.sum()
            side.wait_stream(cur)
            with torch.cuda.stream(side):
                b = a * 2  # ordered after the write now
            ev = torch.cuda.Event()
            ev.record(side)
            with pytest.raises(StreamOrderError):
                b + 1  # the current stream has not waited for side
            cur.wait_event(ev)
            (b + 1).sum()
            host = torch.empty(64, pin_memory=True)
            host.copy_(b, non_blocking=True)
            with pytest.raises(StreamOrderError, match="the host"):
                host.numpy()
            done = torch.cuda.Event()
            done.record(cur)
            done.synchronize()
            host.numpy()
        with pytest.raises(DeviceError, match="current device is 0"):
            gpu.launch("a kernel", cur.cuda_stream, [a], [])
        with torch.cuda.device(1):
            with pytest.raises(DeviceError, match="stream of device 0"):
                gpu.launch("a kernel", torch.cuda.current_stream(0).cuda_stream, [a], [])
        with pytest.raises(DeviceError, match="an event recorded"):
            torch.cuda.Event().record()  # on device 0's stream


# ------------------------------------------------------------------ GEMM tiles (cuda_tiled.py)
@pytest.fixture
def small_tiles(monkeypatch):
    from rcn_fast.search import cuda_tiled

    # several query tiles and row tiles at test sizes
    monkeypatch.setattr(cuda_tiled, "TILE_QUERIES", 4)
    monkeypatch.setattr(cuda_tiled, "MIN_SLICE_COLS", 64)
    monkeypatch.setattr(cuda_tiled, "TILE_SCORE_BYTES", 4 * 3 * 4 * 128)
    return cuda_tiled


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_the_gemm_tiles_split_the_queries_before_the_side_streams_wait(monkeypatch, small_tiles, dtype):
    """W1: float32 queries on a half-precision corpus are split into terms on
    the current stream; the side streams' GEMMs read the terms, so they must
    wait after the split is enqueued, in every query tile."""
    _mod()
    rng = np.random.default_rng(1)
    q, c = _integer_data(rng, 9, 700, 24)
    with GpuStandIn(monkeypatch) as gpu:
        s, i = small_tiles.topn_tiled(torch.from_numpy(q), torch.from_numpy(c).to(getattr(torch, dtype)), 7)
    assert sum("topn_block_select" in x for x in gpu.launches) >= 6  # 3 query tiles x 2+ row tiles
    ref = _reference(q, c, 7)
    np.testing.assert_array_equal(i.numpy(), ref[1])
    np.testing.assert_array_equal(s.numpy(), ref[0])


def test_the_gemm_tiles_run_under_the_inputs_device(monkeypatch, small_tiles):
    """C2: the merge after the streams' block ran under the current device
    (0) with a stream of the data's device (1)."""
    _mod()
    rng = np.random.default_rng(2)
    q, c = _integer_data(rng, 6, 500, 16)
    with GpuStandIn(monkeypatch):
        s, i = small_tiles.topn_tiled(torch.from_numpy(q), torch.from_numpy(c), 5)  # float32: one term
    np.testing.assert_array_equal(i.numpy(), _reference(q, c, 5)[1])


# ------------------------------------------------------------------ the torch backend, the scan
@pytest.mark.parametrize("qdtype", ["float16", "float32"])
def test_the_torch_backend_finishes_under_the_inputs_device(monkeypatch, qdtype):
    """The default top-n path for CUDA tensors: the split kernel and the
    finishing kernel of each chunk launch under the corpus's device."""
    _mod()
    from rcn_fast.search.torch_backend import topn_torch

    rng = np.random.default_rng(3)
    q, c = _integer_data(rng, 5, 300, 16)
    ct = torch.from_numpy(c).half()
    with GpuStandIn(monkeypatch) as gpu:
        s, i = topn_torch(torch.from_numpy(q).to(getattr(torch, qdtype)), ct, 9, chunk=64, split=qdtype == "float32")
    assert sum("topn_finish_rows" in x for x in gpu.launches) == 5
    assert any("topn_split_queries" in x for x in gpu.launches) == (qdtype == "float32")
    np.testing.assert_array_equal(i.numpy(), _reference(q, c, 9)[1])


def test_the_scan_launches_under_the_inputs_device(monkeypatch):
    _mod()
    from rcn_fast.search.topn import run_cuda_kernel

    rng = np.random.default_rng(4)
    q, c = _integer_data(rng, 3, 200, 16)
    with GpuStandIn(monkeypatch) as gpu:
        s, i = run_cuda_kernel(torch.from_numpy(q), torch.from_numpy(c), 4, "topn")
    assert gpu.launches == ["topn on stream 1"]
    np.testing.assert_array_equal(i.numpy(), _reference(q, c, 4)[1])


# ------------------------------------------------------------------ the int8 scan
def _int8_case(rng, n=700, d=48, n_q=3):
    from rcn_fast.search.int8_bounded import build_int8

    rows = rng.standard_normal((n, d)).astype(np.float32)
    rows[300:320] = rows[11]  # duplicates: ties at the top of query 0
    q = rng.standard_normal((n_q, d)).astype(np.float32)
    q[0] = rows[11]
    return rows, q, build_int8(rows)


@pytest.mark.parametrize("n_q,rows_on", [(1, "device"), (2, "host"), (3, "device"), (17, "host")])
def test_the_int8_search_runs_in_order_on_the_copys_device(monkeypatch, n_q, rows_on):
    """C2: every launch of the int8 search ran under the current device.
    Issue 55, S2 and S6: the search is one scan launch (the kernels' host
    emulation computes it), one host wait for the candidates' count, the
    final filter on the device, the rescoring in chunks (rows on the
    device, or gathered on the host a chunk at a time); the ids and scores
    equal the exact search's."""
    _mod()
    from rcn_fast.search import int8_cuda
    from rcn_fast.search.int8_bounded import Int8Corpus, topn_exact_numpy, topn_int8

    rows, q, copy = _int8_case(np.random.default_rng(5 + n_q), n_q=n_q)
    monkeypatch.setattr(int8_cuda, "RESCORE_BYTES", 4 * 48 * 7)  # chunks of 7 rows
    with GpuStandIn(monkeypatch, sms=4) as gpu:
        dev_copy = type(copy)(torch.from_numpy(copy.codes), torch.from_numpy(copy.rows), copy.dim)
        corpus = Int8Corpus(torch.from_numpy(rows) if rows_on == "device" else rows, dev_copy)
        s, i = topn_int8(torch.from_numpy(q), corpus, 25)
    assert [x.split(" on ")[0] for x in gpu.launches] == ["topn_int8_scan"]
    ref = topn_exact_numpy(q, rows, 25)
    np.testing.assert_array_equal(i.numpy(), ref[1])
    np.testing.assert_allclose(s.numpy(), ref[0], rtol=1e-6)  # torch's float32 sum, in its own order


def test_an_overflowing_candidate_buffer_scans_again(monkeypatch):
    """The candidate buffer is bounded: when the scan's atomic count passes
    it, the search scans again with a buffer of that count (from the
    bounds found) and drops nothing."""
    _mod()
    from rcn_fast.search import int8_cuda
    from rcn_fast.search.int8_bounded import Int8Corpus, topn_exact_numpy, topn_int8

    rows, q, copy = _int8_case(np.random.default_rng(9), n_q=4)
    monkeypatch.setattr(int8_cuda, "capacity", lambda n_q, k, sms: 5)
    with GpuStandIn(monkeypatch, sms=4) as gpu:
        dev_copy = type(copy)(torch.from_numpy(copy.codes), torch.from_numpy(copy.rows), copy.dim)
        s, i = topn_int8(torch.from_numpy(q), Int8Corpus(torch.from_numpy(rows), dev_copy), 10)
    assert [x.split(" on ")[0] for x in gpu.launches] == ["topn_int8_scan", "topn_int8_scan"]
    np.testing.assert_array_equal(i.numpy(), topn_exact_numpy(q, rows, 10)[1])


# ------------------------------------------------------------------ the encoders' pinned copies
def test_the_encoder_download_waits_for_its_own_device(monkeypatch):
    """W3: the event of the download was recorded on the current device's
    stream, which never sees the copy on the encoder's device: the host
    then read an unfilled pinned buffer."""
    from rcn_fast.retrieval.encoders.torch import CudaQueue

    with GpuStandIn(monkeypatch):
        queue = CudaQueue(torch.device("cpu"))  # the stand-in's data device (GPU 1); the current device is 0
        batch = queue.upload(queue.pin(np.arange(12, dtype=np.float32).reshape(4, 3)))
        out = batch * 2  # the encoder's output, on the device's stream
        got = queue.download(out).result()
    np.testing.assert_array_equal(got, np.arange(12, dtype=np.float32).reshape(4, 3) * 2)


# ------------------------------------------------------------------ sampling's CUDA path
@pytest.mark.parametrize("kernel", ["sample_subsets", "sample_subsets_gram"])
def test_the_sampler_launches_under_the_inputs_device(monkeypatch, kernel):
    mod = _mod()
    from rcn_fast.sampling.relevance import run_cuda_kernel

    rng = np.random.default_rng(6)
    B, n, d, N, K = 3, 20, 8, 4, 3
    q = rng.standard_normal((B, d)).astype(np.float32)
    c = rng.standard_normal((B, n, d)).astype(np.float32)
    keys = np.arange(B, dtype=np.int64)
    with GpuStandIn(monkeypatch) as gpu:
        ids, logp = run_cuda_kernel(torch.from_numpy(q), torch.from_numpy(c), N, K, 1.0, 7, keys, None, True,
                                    kernel=kernel)
    assert gpu.launches == [f"{kernel} on stream 1"]
    ref_ids = np.empty((B, N, K), np.int64)
    mod.sample_subsets(q, c, None, keys, 1.0, 7, True, ref_ids, None)
    np.testing.assert_array_equal(ids.numpy(), ref_ids)


# ------------------------------------------------------------------ the Triton launches
@pytest.mark.parametrize("which", ["logits", "hidden"])
def test_the_triton_launches_run_under_the_inputs_device(monkeypatch, which):
    """C4: Triton launches on the current device (and its stream); the
    launchers had no device guard."""
    from rcn_fast.llm.scoring import reference, triton_launch

    rng = np.random.default_rng(7)
    B, C, S, V, H = 3, 4, 2, 50, 8
    ids = torch.from_numpy(rng.integers(0, V, (B, C, S)).astype(np.int64))
    ids[0, 3, 1] = -1
    with GpuStandIn(monkeypatch) as gpu:
        monkeypatch.setattr(triton_launch, "kernels", gpu.triton_kernels)
        if which == "logits":
            logits = torch.from_numpy(rng.standard_normal((B, V)).astype(np.float32))
            got = triton_launch.run_triton_logits(logits, ids)
            with gpu.paused():
                ref = reference.choice_logprobs_reference(logits, ids)
        else:
            hidden = torch.from_numpy(rng.standard_normal((B, H)).astype(np.float32))
            weight = torch.from_numpy(rng.standard_normal((V, H)).astype(np.float32))
            got = triton_launch.run_triton_hidden(hidden, weight, ids)
            with gpu.paused():
                ref = reference.choice_logprobs_hidden_reference(hidden, weight, ids)
        out, arg = got
        out.sum()  # read on the device's stream after the launch
    torch.testing.assert_close(out, ref[0])
    assert torch.equal(arg, ref[1])
