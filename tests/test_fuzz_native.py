"""Hypothesis fuzzing of the native entry points (issue 17): ``topn``,
``sample_subsets`` and ``FlatIndex``, with empty shapes, odd strides,
float16/bfloat16, NaN/inf/huge/tiny values, k far beyond N and a bad
argument now and then; and ``FlatIndex.load`` of saved indexes with files
cut short or bytes flipped.

Every example runs in a worker subprocess, so a crash (a signal: SIGSEGV,
SIGABRT, SIGKILL) fails the example with its inputs instead of taking the
test run down; the worker is restarted and hypothesis shrinks the case.
Results are checked in this process against the numpy reference, and
failures must be ValueError/TypeError (a user mistake named in the message).

Examples per property: ``RCN_FAST_FUZZ_EXAMPLES`` (default 300, about 20 s
in all on two busy cores); with it set, hypothesis also explores randomly
instead of replaying its derandomised sequence.
"""

from __future__ import annotations

import os
import pickle
import signal
import struct
import subprocess
import sys

import numpy as np
import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from rcn_fast import _native  # noqa: E402
from rcn_fast.search import topn_reference  # noqa: E402

if _native.cpu_module()[0] is None:
    pytest.skip("rcn_fast._C is not built", allow_module_level=True)

EXAMPLES = int(os.environ.get("RCN_FAST_FUZZ_EXAMPLES", "300"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, database=None,
                derandomize="RCN_FAST_FUZZ_EXAMPLES" not in os.environ,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

# ------------------------------------------------------------------ the worker
WORKER = r'''
import os, pickle, struct, sys
import numpy as np
import rcn_fast

def read():
    head = sys.stdin.buffer.read(8)
    if len(head) < 8:
        return None
    return pickle.loads(sys.stdin.buffer.read(struct.unpack("<Q", head)[0]))

def write(obj):
    blob = pickle.dumps(obj)
    sys.stdout.buffer.write(struct.pack("<Q", len(blob)) + blob)
    sys.stdout.buffer.flush()

def as_dtype(x, dtype):
    if dtype == "bfloat16":
        import ml_dtypes
        return x.astype(ml_dtypes.bfloat16)
    return x.astype(dtype)

def layout(x, how):
    """The same values with other strides."""
    if x.ndim < 2 or x.size == 0 or how == "c":
        return x
    if how == "wide":  # row stride > row length
        big = np.zeros(x.shape[:-1] + (x.shape[-1] + 3,), x.dtype)
        big[..., : x.shape[-1]] = x
        return big[..., : x.shape[-1]]
    if how == "fortran":  # the last axis is not contiguous
        return np.asfortranarray(x)
    if how == "reversed":  # negative row strides
        return np.ascontiguousarray(x[::-1])[::-1]
    if how == "every_other":
        big = np.zeros((2 * x.shape[0],) + x.shape[1:], x.dtype)
        big[::2] = x
        return big[::2]
    raise ValueError(how)

def run(kind, a):
    if kind == "topn":
        q = layout(as_dtype(a["q"], a["qdtype"]), a["qlayout"])
        c = layout(as_dtype(a["c"], a["cdtype"]), a["clayout"])
        s, i = rcn_fast.topn(q, c, a["k"], backend=a["backend"])
        return np.asarray(s), np.asarray(i)
    if kind == "sample":
        q = layout(as_dtype(a["q"], a["dtype"]), a["layout"])
        c = layout(as_dtype(a["c"], a["dtype"]), a["layout"])
        return rcn_fast.sample_subsets(q, c, a["N"], a["K"], tau=a["tau"], seed=a["seed"], valid=a["valid"],
                                       first=a["first"], backend=a["backend"], return_logprobs=True)
    if kind == "flat":
        index = rcn_fast.FlatIndex(a["dim"], metric=a["metric"], dtype=a["dtype"])
        errors = []
        for x in a["adds"]:
            try:
                index.add(x)
                errors.append(None)
            except ValueError as exc:
                errors.append(str(exc))
        s, i = index.search(a["q"], a["k"])
        return errors, np.asarray(index.embeddings, np.float32), s, i
    if kind == "flatfile":
        import tempfile, pathlib
        with tempfile.TemporaryDirectory() as tmp:
            path = pathlib.Path(tmp) / "idx"
            index = rcn_fast.FlatIndex(a["x"].shape[1], dtype=a["dtype"])
            index.add(a["x"])
            index.save(path)
            target = path / a["file"]
            data = bytearray(target.read_bytes())
            if a["cut"] is not None:
                data = data[: min(a["cut"], len(data))]
            for pos, byte in a["flips"]:
                if data:
                    data[pos % len(data)] ^= byte
            target.write_bytes(bytes(data))
            try:
                loaded = rcn_fast.FlatIndex.load(path, mmap=a["mmap"], verify=a["verify"])
            except (ValueError, FileNotFoundError) as exc:
                return ("refused", type(exc).__name__, str(exc))
            s, i = loaded.search(a["x"][:2], 3)
            return ("loaded", np.array(loaded.embeddings, np.float32), s, i)
    raise ValueError(kind)

while True:
    msg = read()
    if msg is None:
        break
    try:
        write(("ok", run(*msg)))
    except Exception as exc:
        write(("error", type(exc).__name__, str(exc)))
'''


class Worker:
    """A subprocess running one example at a time; restarted after a crash."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen | None = None
        self.calls = 0
        self.crashes: list[str] = []

    def _start(self) -> None:
        env = {**os.environ, "RCN_FAST_NUM_THREADS": os.environ.get("RCN_FAST_NUM_THREADS", "3")}
        self.proc = subprocess.Popen([sys.executable, "-c", WORKER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     env=env)

    def call(self, kind: str, args: dict) -> tuple:
        if self.proc is None or self.proc.poll() is not None:
            self._start()
        self.calls += 1
        blob = pickle.dumps((kind, args))
        try:
            self.proc.stdin.write(struct.pack("<Q", len(blob)) + blob)
            self.proc.stdin.flush()
            head = self.proc.stdout.read(8)
            if len(head) == 8:
                return pickle.loads(self.proc.stdout.read(struct.unpack("<Q", head)[0]))
        except BrokenPipeError:
            pass
        rc = self.proc.wait(30)
        self._close_pipes()
        self.proc = None
        why = f"signal {signal.Signals(-rc).name}" if rc < 0 else f"exit status {rc}"
        self.crashes.append(f"{kind}: {why}")
        return ("died", why)

    def _close_pipes(self) -> None:
        for pipe in (self.proc.stdin, self.proc.stdout):
            try:
                pipe.close()
            except OSError:  # a dead worker's pipe
                pass

    def close(self) -> None:
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.stdin.close()
                self.proc.wait(30)
            self._close_pipes()


@pytest.fixture(scope="module")
def worker():
    w = Worker()
    yield w
    w.close()
    print(f"\nfuzz: {w.calls} worker calls, {len(w.crashes)} crash(es): {w.crashes}")


def outcome(res: tuple, what: str) -> tuple:
    """The worker's answer; a dead worker or an unexpected exception type fails."""
    assert res[0] != "died", f"{what}: the worker died ({res[1]})"
    if res[0] == "error":
        assert res[1] in ("ValueError", "TypeError"), f"{what}: {res[1]}: {res[2]}"
        assert ":" in res[2], f"{what}: the message names no argument: {res[2]}"
    return res


# ------------------------------------------------------------------ strategies
SPECIALS = [np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-40, 3e4, -6e4, 1e-7]


@st.composite
def matrices(draw, rows, cols, dtype):
    """float32 values for a [rows, cols] matrix of ``dtype``: mostly normal,
    sometimes scaled, sometimes with special values dropped in."""
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    scale = draw(st.sampled_from([1.0, 1.0, 1e-3, 100.0]))
    x = (rng.standard_normal((rows, cols)) * scale).astype(np.float32)
    if rows and cols and draw(st.booleans()) and draw(st.booleans()):
        n_special = draw(st.integers(1, 4))
        for _ in range(n_special):
            x[rng.integers(rows), rng.integers(cols)] = draw(st.sampled_from(SPECIALS))
    if dtype == "float32" and rows and cols and draw(st.integers(0, 9)) == 0:
        x[rng.integers(rows)] *= 1e15  # huge but finite products in float32
    return x


@st.composite
def topn_cases(draw):
    big = draw(st.integers(0, 19)) == 0  # now and then enough rows for several scan threads
    Q = draw(st.integers(0, 40 if big else 6))
    N = draw(st.integers(2000, 12000)) if big else draw(st.integers(0, 300))
    d = draw(st.integers(1, 64 if big else 40))
    cdtype = draw(st.sampled_from(["float32", "float16", "bfloat16"]))
    qdtype = draw(st.sampled_from(["float32", cdtype]))
    k = draw(st.one_of(st.integers(1, 8), st.integers(1, max(1, N + 20)), st.integers(1, 3000)))
    return {
        "q": draw(matrices(Q, d, qdtype)), "c": draw(matrices(N, d, cdtype)), "k": k,
        "qdtype": qdtype, "cdtype": cdtype,
        "qlayout": draw(st.sampled_from(["c", "wide", "fortran", "reversed", "every_other"])),
        "clayout": draw(st.sampled_from(["c", "wide", "fortran", "reversed", "every_other"])),
        "backend": "native",
    }


# ------------------------------------------------------------------ properties
def _rounded(x: np.ndarray, dtype: str) -> np.ndarray:
    if dtype == "bfloat16":
        import ml_dtypes

        return x.astype(ml_dtypes.bfloat16).astype(np.float32)
    return x.astype(dtype).astype(np.float32)


@FUZZ
@given(case=topn_cases())
def test_fuzz_topn_native_matches_the_reference(worker, case):
    res = outcome(worker.call("topn", case), "topn")
    assert res[0] == "ok", res  # every generated case is a valid call
    s, i = res[1]
    q, c, k = _rounded(case["q"], case["qdtype"]), _rounded(case["c"], case["cdtype"]), case["k"]
    Q, N = q.shape[0], c.shape[0]
    assert s.shape == i.shape == (Q, k) and s.dtype == np.float32 and i.dtype == np.int64
    with np.errstate(all="ignore"):  # inf * 0 in the inputs
        rs, ri = topn_reference(q, c, k)
    # the same padding, and scores within float32 summation-order error of the reference
    np.testing.assert_array_equal(s == -np.inf, rs == -np.inf)
    np.testing.assert_array_equal(i == -1, s == -np.inf)
    finite = np.isfinite(rs)
    np.testing.assert_array_equal(s[~finite], rs[~finite])
    with np.errstate(all="ignore"):
        bound = np.abs(q).astype(np.float64) @ np.abs(c).astype(np.float64).T  # sum |q_j c_j| per pair
    bound = bound[np.isfinite(bound)]  # a finite score has a finite bound
    tol = 1e-5 * (bound.max() if bound.size else 0.0) + 1e-30
    if finite.any():
        np.testing.assert_allclose(s[finite], rs[finite], rtol=1e-5, atol=tol)
    # every returned id is a real row, once per query, whose own score is the one returned
    for row in range(Q):
        got = i[row][i[row] >= 0]
        assert len(set(got.tolist())) == len(got) and ((got >= 0) & (got < N)).all()
        if len(got):
            with np.errstate(all="ignore"):
                own = c[got].astype(np.float64) @ q[row].astype(np.float64)
            ok = np.isclose(own, s[row, : len(got)], rtol=1e-4, atol=tol) | ~np.isfinite(s[row, : len(got)])
            assert ok.all()


@st.composite
def sample_cases(draw):
    B = draw(st.integers(0, 4))
    n = draw(st.integers(0, 60))
    d = draw(st.integers(1, 24))
    dtype = draw(st.sampled_from(["float32", "float16", "bfloat16"]))
    c = draw(matrices(B * n, d, dtype)).reshape(B, n, d)
    valid = draw(st.one_of(st.none(), st.just("lengths"), st.just("mask")))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    if valid == "lengths":
        valid = rng.integers(0, n + 1, B).astype(np.int64)
    elif valid == "mask":
        valid = rng.random((B, n)) < draw(st.sampled_from([0.0, 0.3, 0.9]))
    return {
        "q": draw(matrices(B, d, dtype)), "c": c, "dtype": dtype, "valid": valid,
        "N": draw(st.integers(1, 6)), "K": draw(st.one_of(st.integers(1, 6), st.integers(1, 80))),
        "tau": draw(st.sampled_from([1.0, 0.05, 7.5, 1e-3, 0.0, -1.0, float("nan")])),
        "seed": draw(st.integers(0, 2**64 - 1)), "first": draw(st.sampled_from(["uniform", "relevance"])),
        "layout": draw(st.sampled_from(["c", "wide", "reversed"])), "backend": "native",
    }


@FUZZ
@given(case=sample_cases())
def test_fuzz_sample_subsets_native_never_crashes_and_draws_valid_subsets(worker, case):
    res = outcome(worker.call("sample", case), "sample_subsets")
    if not (case["tau"] > 0):
        assert res[0] == "error" and res[2].startswith("tau:"), res
        return
    if res[0] == "error":  # non-finite scores are refused, naming the question and candidate
        assert not (np.isfinite(case["c"]).all() and np.isfinite(case["q"]).all()) or \
            not np.isfinite(1.0 / case["tau"]), res
        return
    ids, logp = res[1]
    B, n = case["c"].shape[:2]
    N, K = case["N"], case["K"]
    assert ids.shape == logp.shape == (B, N, K)
    valid = case["valid"]
    if valid is None:
        mask = np.ones((B, n), bool)
    elif isinstance(valid, np.ndarray) and valid.dtype == bool:
        mask = valid
    else:
        mask = np.arange(n)[None, :] < np.asarray(valid)[:, None]
    for b in range(B):
        want = min(K, int(mask[b].sum()))
        for s in range(N):
            row = ids[b, s]
            real = row[row >= 0]
            assert len(real) == want and (row[want:] == -1).all(), (b, s, row)
            assert len(set(real.tolist())) == len(real) and mask[b, real].all()
            assert (logp[b, s, want:] == 0).all() and (logp[b, s, :want] <= 1e-6).all()
            assert np.isfinite(logp[b, s]).all()


@st.composite
def flat_cases(draw):
    dim = draw(st.integers(1, 16))
    dtype = draw(st.sampled_from(["float32", "float16"]))
    adds = []
    for _ in range(draw(st.integers(0, 3))):
        x = draw(matrices(draw(st.integers(0, 30)), dim, "float32"))
        if draw(st.integers(0, 4)) == 0:
            x = x * np.float32(draw(st.sampled_from([1e20, 1e-30, 7e4, 1e-42])))
        adds.append(x)
    Q = draw(st.integers(0, 4))
    return {"dim": dim, "metric": draw(st.sampled_from(["ip", "cosine"])), "dtype": dtype, "adds": adds,
            "q": draw(matrices(Q, dim, "float32")) if Q else np.zeros((0, dim), np.float32),
            "k": draw(st.integers(1, 40))}


@FUZZ
@given(case=flat_cases())
def test_fuzz_flat_index_stores_only_finite_rows_and_searches_them(worker, case):
    res = outcome(worker.call("flat", case), "FlatIndex")
    if res[0] == "error":  # only a query the index cannot take (never here) may fail
        pytest.fail(f"FlatIndex.search failed: {res}")
    errors, emb, s, i = res[1]
    kept = [x for x, e in zip(case["adds"], errors) if e is None]
    for x, e in zip(case["adds"], errors):
        if e is not None:  # refused: a row that is not finite, before or after the cast
            assert e.startswith("x: ") and "rows [" in e
    assert emb.shape == (sum(len(x) for x in kept), case["dim"])
    assert np.isfinite(emb).all()  # nothing non-finite is ever stored
    if case["metric"] == "cosine" and len(emb):
        norms = np.linalg.norm(emb.astype(np.float64), axis=1)
        assert (np.isclose(norms, 1.0, atol=2e-3) | (norms == 0)).all()
        rows = np.concatenate(kept).astype(np.float64)
        assert ((norms == 0) == (np.abs(rows).max(axis=1) == 0)).all()  # only zero rows stay zero
    Q, k = case["q"].shape[0], case["k"]
    assert s.shape == i.shape == (Q, k)
    np.testing.assert_array_equal(i == -1, s == -np.inf)
    assert ((i >= -1) & (i < len(emb))).all()


@st.composite
def damaged_files(draw):
    rows, dim = draw(st.integers(0, 20)), draw(st.integers(1, 8))
    return {
        "x": np.random.default_rng(draw(st.integers(0, 2**32 - 1))).standard_normal((rows, dim)).astype(np.float32),
        "dtype": draw(st.sampled_from(["float32", "float16"])),
        "file": draw(st.sampled_from(["embeddings.npy", "index.json"])),
        "cut": draw(st.one_of(st.none(), st.integers(0, 800))),
        "flips": draw(st.lists(st.tuples(st.integers(0, 10**6), st.integers(1, 255)), max_size=3)),
        "mmap": draw(st.booleans()), "verify": draw(st.booleans()),
    }


@FUZZ
@given(case=damaged_files())
def test_fuzz_flat_index_load_refuses_damaged_files_by_name(worker, case):
    res = outcome(worker.call("flatfile", case), "FlatIndex.load")
    assert res[0] == "ok", res
    out = res[1]
    damaged = case["cut"] is not None or case["flips"]
    if out[0] == "refused":
        assert damaged, out
        assert out[2].startswith("path: ") and ("index.json" in out[2] or "embeddings.npy" in out[2]
                                                or "format" in out[2]), out
        return
    emb = out[1]
    if case["verify"] and case["file"] == "embeddings.npy":
        # a checksum-verified load returns exactly what was saved
        np.testing.assert_array_equal(emb, case["x"].astype(case["dtype"]).astype(np.float32))
    assert out[2].shape == out[3].shape == (min(2, len(case["x"])), 3)
