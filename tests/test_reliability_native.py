"""Issue 17, native and search faults: threads the system refuses, a k far
beyond N, empty inputs, float16 overflow and cosine normalisation in
FlatIndex, and FlatIndex files that are corrupt or truncated.

Resource-limit cases run in a child process that lowers its own address
space limit (RLIMIT_AS, what ``prlimit --as`` sets) to a little above what
it already uses, so the outcome does not depend on this machine's memory.
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import rcn_fast
from rcn_fast import _native

topn_mod = importlib.import_module("rcn_fast.search.topn")

NATIVE = _native.cpu_module()[0] is not None
needs_native = pytest.mark.skipif(not NATIVE, reason="rcn_fast._C is not built")

LIMIT_AS = '''
import resource, socket  # socket: imported lazily by numpy.testing, and needs address space to load
def limit_as(headroom):
    """RLIMIT_AS = what this process maps now + headroom bytes (prlimit --as)."""
    with open("/proc/self/status") as f:
        used = next(int(l.split()[1]) * 1024 for l in f if l.startswith("VmSize:"))
    resource.setrlimit(resource.RLIMIT_AS, (used + headroom, resource.getrlimit(resource.RLIMIT_AS)[1]))
'''


def run_limited(body: str, env: dict | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    if not sys.platform.startswith("linux"):
        pytest.skip("address-space limits are tested on Linux")
    code = LIMIT_AS + textwrap.dedent(body)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})


# ------------------------------------------------------------------ crashes
@needs_native
def test_refused_threads_fall_back_instead_of_aborting():
    """300 threads of 8 MB stacks cannot start under a 160 MB headroom
    (before: std::terminate, exit 134). The work of the threads that did not
    start runs on the caller, and a started thread that finds no memory for
    its buffers leaves its rows to the others, so the answer is right."""
    res = run_limited("""
        import numpy as np, numpy.testing, rcn_fast
        rng = np.random.default_rng(0)
        c = rng.standard_normal((40000, 256), dtype=np.float32).astype(np.float16)
        q = rng.standard_normal((64, 256), dtype=np.float32)
        ref_s, ref_i = rcn_fast.topn(q, c, 10, backend="numpy")
        exact = q.astype(np.float64) @ c.astype(np.float64).T  # the stored values' scores
        kth = np.sort(exact, axis=1)[:, -10]  # the reference threshold: each row's 10th best score
        for headroom in (160 << 20, 1 << 30):
            limit_as(headroom)
            s, i = rcn_fast.topn(q, c, 10, backend="native")
            np.testing.assert_allclose(s, ref_s, rtol=1e-4, atol=1e-3)
            # a top-10 set: 10 distinct ids per row, each scoring at least the threshold (ties may swap ids)
            distinct = all(len(set(row)) == 10 for row in i.tolist())
            got = np.take_along_axis(exact, i, axis=1)
            print("top-k set", distinct and bool((got >= kth[:, None] - 1e-3).all()))
    """, env={"RCN_FAST_NUM_THREADS": "300"})
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.splitlines() == ["top-k set True"] * 2, res.stdout


@needs_native
def test_refused_sampler_threads_fall_back_instead_of_aborting():
    res = run_limited("""
        import numpy as np, rcn_fast
        rng = np.random.default_rng(0)
        q = rng.standard_normal((64, 64), dtype=np.float32)
        c = rng.standard_normal((64, 300, 64), dtype=np.float32)
        ref = rcn_fast.sample_subsets(q, c, 16, 5, seed=3, backend="native")
        limit_as(160 << 20)
        got = rcn_fast.sample_subsets(q, c, 16, 5, seed=3, backend="native")
        print("same", bool((got == ref).all()))
    """, env={"RCN_FAST_NUM_THREADS": "300"})
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.strip() == "same True"


@needs_native
def test_refused_lane_team_raises_instead_of_aborting():
    """The warp-emulating lanes wait on each other, so they need all their
    threads at once: a refused thread is a RuntimeError, not an abort or a
    hang."""
    res = run_limited("""
        import numpy as np
        from rcn_fast import _native
        mod, _ = _native.cpu_module()
        rng = np.random.default_rng(0)
        q = rng.standard_normal((2, 8), dtype=np.float32)
        c = rng.standard_normal((2, 40, 8), dtype=np.float32)
        ids = np.empty((2, 3, 4), np.int64)
        limit_as(100 << 20)
        try:
            mod.sample_subsets(q, c, None, np.arange(2, dtype=np.int64), 1.0, 0, False, ids, None, 0, False, 32)
            print("ran")
        except RuntimeError as exc:
            print("RuntimeError:", exc)
    """, timeout=60)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "could not start 32 threads" in res.stdout or res.stdout.strip() == "ran", res.stdout


def test_huge_k_is_a_memory_error_naming_k_before_any_allocation():
    """k = 2**31 over 3 rows would write 24 GB of padding (before: the OOM
    killer). Under an address-space limit it is a MemoryError that names k
    and says k = N returns everything."""
    res = run_limited("""
        import numpy as np, rcn_fast
        q, c = np.ones((1, 4), np.float32), np.ones((3, 4), np.float32)
        limit_as(2 << 30)
        for backend in ("native", "numpy"):
            try:
                rcn_fast.topn(q, c, 2**31, backend=backend)
                print("no error")
            except MemoryError as exc:
                print("MemoryError:", exc)
        print(rcn_fast.topn(q, c, 5)[1].tolist())
    """)
    assert res.returncode == 0, res.stderr[-2000:]
    lines = res.stdout.splitlines()
    assert all(line.startswith("MemoryError: k: 1 x 2147483648 results") and "k=3 already returns" in line
               for line in lines[:2]), res.stdout
    assert lines[2] == "[[0, 1, 2, -1, -1]]"


def test_result_memory_check_uses_what_the_host_has(monkeypatch):
    monkeypatch.setattr(topn_mod, "host_bytes_available", lambda: 1 << 30)
    q, c = np.ones((2, 4), np.float32), np.ones((3, 4), np.float32)
    with pytest.raises(MemoryError, match=r"^k: 2 x 67108864 results .* 1.5 GiB, more than the 1.0 GiB"):
        rcn_fast.topn(q, c, 1 << 26)
    assert rcn_fast.topn(q, c, 4)[1].shape == (2, 4)  # small results never ask


def test_host_bytes_available_reports_something_on_linux():
    if not sys.platform.startswith("linux"):
        pytest.skip("reads /proc")
    have = topn_mod.host_bytes_available()
    assert have is not None and have > 0


# ------------------------------------------------------------------ empty inputs
def _backends():
    out = ["numpy"] + (["native"] if NATIVE else [])
    try:
        import torch  # noqa: F401

        out.append("torch")
    except ImportError:
        pass
    return out


@pytest.mark.parametrize("backend", _backends())
@pytest.mark.parametrize("Q,N", [(0, 3), (2, 0), (0, 0), (0, 3000)])
def test_empty_queries_or_corpus_give_the_empty_result_or_padding(backend, Q, N):
    q, c = np.ones((Q, 4), np.float32), np.ones((N, 4), np.float32)
    if backend == "torch":
        import torch

        q, c = torch.from_numpy(q), torch.from_numpy(c)
    s, i = rcn_fast.topn(q, c, 2, backend=backend)
    s, i = np.asarray(s), np.asarray(i)
    assert s.shape == i.shape == (Q, 2) and s.dtype == np.float32 and i.dtype == np.int64
    assert (s == -np.inf).all() and (i == -1).all()


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_search_on_an_empty_index(dtype):
    index = rcn_fast.FlatIndex(4, dtype=dtype)
    s, i = index.search(np.ones((3, 4), np.float32), 2)
    assert s.shape == (3, 2) and (s == -np.inf).all() and (i == -1).all()
    s, i = index.search(np.ones((0, 4), np.float32), 2)
    assert s.shape == (0, 2)


# ------------------------------------------------------------------ FlatIndex numbers
def test_float16_overflow_is_an_error_naming_the_rows():
    index = rcn_fast.FlatIndex(2, dtype="float16")
    x = np.array([[1.0, 2.0], [70000.0, 0.0], [3.0, -1e6]], np.float32)
    with pytest.raises(ValueError, match=r"x: rows \[1, 2\] \(2 of 3\) hold values beyond the range of float16"):
        index.add(x)
    assert len(index) == 0  # nothing added
    index.add(x[:1])
    assert np.isfinite(index.search(np.ones(2, np.float32), 1)[0]).all()
    # a query beyond float16's range is searched in float32 (no inf scores)
    s, i = index.search(np.array([1e5, 0.0], np.float32), 1)
    assert i.tolist() == [[0]] and np.isfinite(s).all() and s[0, 0] == pytest.approx(1e5)


def test_non_finite_rows_are_named():
    index = rcn_fast.FlatIndex(2)
    with pytest.raises(ValueError, match=r"x: contains NaN or infinite values in rows \[1\]"):
        index.add(np.array([[0.0, 1.0], [np.inf, 0.0]], np.float32))


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_cosine_normalises_huge_and_tiny_rows(dtype):
    """Norms near 1e20 overflowed float32 (rows stored as zeros); norms near
    1e-30 underflowed (rows left un-normalised)."""
    index = rcn_fast.FlatIndex(3, metric="cosine", dtype=dtype)
    x = np.array([[1e20, 1e20, 0.0], [1e-30, 0.0, 0.0], [0.0, 0.0, 3e-38], [0.0, 0.0, 0.0]], np.float32)
    index.add(x)
    emb = np.asarray(index.embeddings, np.float32)
    np.testing.assert_allclose(np.linalg.norm(emb[:3], axis=1), 1.0, rtol=1e-3)
    assert (emb[3] == 0).all()  # a zero row stays zero
    s, i = index.search(np.array([[2e-30, 2e-30, 0.0]], np.float32), 2)
    assert i[0, 0] == 0 and s[0, 0] == pytest.approx(1.0, rel=1e-3)


# ------------------------------------------------------------------ FlatIndex files
@pytest.fixture()
def saved(tmp_path, rng):
    index = rcn_fast.FlatIndex(8)
    index.add(rng.standard_normal((50, 8)).astype(np.float32))
    index.save(tmp_path / "idx")
    return tmp_path / "idx"


def test_index_json_records_the_checksum(saved):
    meta = json.loads((saved / "index.json").read_text())
    rec = meta["files"]["embeddings.npy"]
    assert rec["bytes"] == (saved / "embeddings.npy").stat().st_size and len(rec["sha256"]) == 64
    again = rcn_fast.FlatIndex.load(saved, verify=True)
    assert len(again) == 50


def test_bad_index_json_names_the_file(saved):
    (saved / "index.json").write_text('{"format": "rcn_fast.FlatIndex/1", "dim": ')
    with pytest.raises(ValueError, match=r"index.json is not valid JSON"):
        rcn_fast.FlatIndex.load(saved)
    (saved / "index.json").write_text(json.dumps({"format": "rcn_fast.FlatIndex/1", "metric": "ip",
                                                  "dtype": "float32", "count": 50}))
    with pytest.raises(ValueError, match=r"index.json lacks the key\(s\) \['dim'\]"):
        rcn_fast.FlatIndex.load(saved)


def test_truncated_embeddings_say_so(saved):
    emb = saved / "embeddings.npy"
    data = emb.read_bytes()
    emb.write_bytes(data[:-100])
    with pytest.raises(ValueError, match=r"embeddings.npy holds \d+ bytes, the record says"):
        rcn_fast.FlatIndex.load(saved)
    # without a size record (an older index.json), the .npy header still tells
    meta = json.loads((saved / "index.json").read_text())
    del meta["files"]
    (saved / "index.json").write_text(json.dumps(meta))
    with pytest.raises(ValueError, match=r"embeddings.npy is truncated"):
        rcn_fast.FlatIndex.load(saved)
    with pytest.raises(ValueError, match=r"cannot be verified"):
        emb.write_bytes(data)
        rcn_fast.FlatIndex.load(saved, verify=True)
    emb.write_bytes(b"not a numpy file at all")
    with pytest.raises(ValueError, match=r"embeddings.npy cannot be read \(not a .npy file, or its header is damaged"):
        rcn_fast.FlatIndex.load(saved)


def test_a_damaged_npy_header_is_a_value_error_naming_the_file(saved):
    emb = saved / "embeddings.npy"
    data = bytearray(emb.read_bytes())
    data[data.index(b"{")] = ord("(")  # same size: only the header parse can tell
    emb.write_bytes(bytes(data))
    with pytest.raises(ValueError, match=r"embeddings.npy cannot be read \(not a .npy file, or its header is damaged"):
        rcn_fast.FlatIndex.load(saved)


def test_verify_catches_a_same_size_replacement(saved):
    emb = saved / "embeddings.npy"
    data = bytearray(emb.read_bytes())
    data[-1] ^= 0xFF
    emb.write_bytes(bytes(data))
    assert len(rcn_fast.FlatIndex.load(saved)) == 50  # size and header agree: only a checksum can tell
    with pytest.raises(ValueError, match=r"embeddings.npy does not match its recorded sha256"):
        rcn_fast.FlatIndex.load(saved, verify=True)


def test_a_converted_mask_lives_until_the_sampler_returns():
    """The binding converts a mask of another dtype (int64 here) to uint8;
    the converted copy must outlive the kernel call. With freed memory
    filled with garbage (MALLOC_PERTURB_), an int64 mask used to give other
    subsets than the same mask as uint8 (a use-after-free); now they agree."""
    body = textwrap.dedent("""
        import numpy as np
        from rcn_fast import _native
        mod, _ = _native.cpu_module()
        rng = np.random.default_rng(0)
        B, n, d, S, K = 64, 300, 16, 4, 6
        q = rng.standard_normal((B, d)).astype(np.float32)
        c = rng.standard_normal((B, n, d)).astype(np.float32)
        mask = (rng.random((B, n)) < 0.5)
        mask[:, :K] = True
        keys = np.arange(B, dtype=np.int64)
        out = []
        for m in (mask.astype(np.uint8), mask.astype(np.int64)):
            ids = np.empty((B, S, K), np.int64)
            logp = np.empty((B, S, K), np.float32)
            mod.sample_subsets(q, c, m, keys, 0.5, 3, False, ids, logp, 0, False)
            out.append(ids)
        assert (out[0] == out[1]).all(), "an int64 mask gave other subsets than the same uint8 mask"
        assert mask[np.arange(B)[:, None, None], out[0]].all(), "a masked-out candidate was drawn"
        print("ok")
    """)
    env = dict(os.environ, MALLOC_PERTURB_="165")
    res = subprocess.run([sys.executable, "-c", body], capture_output=True, text=True, timeout=120, env=env)
    assert res.returncode == 0 and res.stdout.strip() == "ok", res.stderr[-2000:]
