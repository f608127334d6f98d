"""rcn_fast.topn against a plain float64 numpy reference, faiss, and bad input."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

import rcn_fast
from rcn_fast.search import topn_reference

ml_dtypes = pytest.importorskip("ml_dtypes")
torch = pytest.importorskip("torch")


# ---------------------------------------------------------------- reference
def exact_scores(q: np.ndarray, c: np.ndarray) -> np.ndarray:
    """float64 inner products of the values actually stored (after dtype rounding)."""
    return np.asarray(q, np.float64) @ np.asarray(c, np.float64).T


def assert_valid_topn(scores, ids, q, c, k, rtol):
    """The returned set is a correct top-k: compare against the reference's
    k-th score with a tolerance, never raw index order (ties may differ)."""
    scores = np.asarray(torch.as_tensor(scores).float()) if torch.is_tensor(scores) else np.asarray(scores)
    ids = np.asarray(ids.cpu()) if torch.is_tensor(ids) else np.asarray(ids)
    assert scores.dtype == np.float32 and ids.dtype == np.int64
    assert scores.shape == ids.shape == (q.shape[0], k)
    ref = exact_scores(q, c)
    scale = np.abs(np.asarray(q, np.float64)).sum(1, keepdims=True) * np.abs(np.asarray(c, np.float64)).max(initial=0)
    tol = rtol * np.maximum(scale, 1e-30)
    for r in range(q.shape[0]):
        admissible = np.flatnonzero(~np.isnan(ref[r]) & (ref[r] > -np.inf))
        n_real = min(k, admissible.size)
        got = ids[r, :n_real]
        assert (ids[r, n_real:] == -1).all() and np.isneginf(scores[r, n_real:]).all()
        assert (got >= 0).all() and len(set(got.tolist())) == n_real
        np.testing.assert_allclose(scores[r, :n_real], ref[r, got], rtol=0, atol=tol[r, 0])
        assert (np.diff(scores[r, :n_real]) <= tol[r, 0]).all(), "scores not descending"
        if n_real:
            kth = np.sort(ref[r, admissible])[::-1][n_real - 1]
            assert (ref[r, got] >= kth - 2 * tol[r, 0]).all(), "a returned row is below the k-th best"


RTOL = {"float32": 1e-5, "float16": 1e-5, "bfloat16": 1e-5}  # inputs are exact; only fp32 accumulation differs


def make(rng, shape, dtype, lib):
    x = rng.standard_normal(shape).astype(np.float32)
    if dtype == "float16":
        x = x.astype(np.float16)
    elif dtype == "bfloat16":
        x = x.astype(ml_dtypes.bfloat16)
    if lib == "torch":
        if dtype == "bfloat16":
            return torch.from_numpy(x.view(np.int16).copy()).view(torch.bfloat16), x
        return torch.from_numpy(x.copy()), x
    return x, x


# ---------------------------------------------------------------- correctness
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("d", [1, 7, 768, 1023])
@pytest.mark.parametrize("Q", [1, 2, 3, 4, 5, 17])
def test_native_matches_reference(rng, dtype, d, Q):
    N, k = 301, 10
    c, c_np = make(rng, (N, d), dtype, "numpy")
    q = rng.standard_normal((Q, d)).astype(np.float32)
    s, i = rcn_fast.topn(q, c, k, backend="native")
    assert_valid_topn(s, i, q, c_np, k, RTOL[dtype])


@pytest.mark.parametrize("backend", ["native", "torch", "numpy"])
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("N,k", [(1, 1), (5, 3), (5, 8), (1000, 100), (97, 97)])
def test_backends_torch_inputs(rng, backend, dtype, N, k):
    d, Q = 33, 6
    c, c_np = make(rng, (N, d), dtype, "torch")
    q = torch.from_numpy(rng.standard_normal((Q, d)).astype(np.float32))
    s, i = rcn_fast.topn(q, c, k, backend=backend)
    assert torch.is_tensor(s) and torch.is_tensor(i)
    assert_valid_topn(s, i, q.numpy(), c_np, k, RTOL[dtype])


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_queries_in_corpus_dtype(rng, dtype):
    c, c_np = make(rng, (200, 64), dtype, "numpy")
    q, q_np = make(rng, (9, 64), dtype, "numpy")
    s, i = rcn_fast.topn(q, c, 5)
    assert_valid_topn(s, i, np.asarray(q_np, np.float32), c_np, 5, RTOL[dtype])


def test_all_backends_agree_exactly_on_ties():
    # duplicated rows and integer-valued data: every backend computes exact
    # scores, so the tie rule (lower id first) decides the order everywhere
    rng = np.random.default_rng(7)
    base = rng.integers(-3, 4, size=(40, 16)).astype(np.float32)
    c = np.concatenate([base, base, base[:5]])
    q = rng.integers(-2, 3, size=(13, 16)).astype(np.float32)
    ref = topn_reference(q, c, 30)
    for backend in ("native", "numpy"):
        s, i = rcn_fast.topn(q, c, 30, backend=backend)
        np.testing.assert_array_equal(i, ref[1])
        np.testing.assert_array_equal(s, ref[0])
    s, i = rcn_fast.topn(torch.from_numpy(q), torch.from_numpy(c), 30, backend="torch")
    np.testing.assert_array_equal(i.numpy(), ref[1])
    # spelled out for one query: equal scores come lower id first
    full = q[0] @ c.T
    order = sorted(range(len(c)), key=lambda j: (-full[j], j))[:30]
    assert ref[1][0].tolist() == order


def test_k_larger_than_n_pads():
    c = np.eye(3, dtype=np.float32)
    s, i = rcn_fast.topn(c[:1], c, 5)
    assert i.tolist() == [[0, 1, 2, -1, -1]]
    assert s[0, :3].tolist() == [1.0, 0.0, 0.0] and np.isneginf(s[0, 3:]).all()


def test_non_finite_policy():
    c = np.ones((6, 4), dtype=np.float32)
    c[1, 0] = np.nan
    c[2, :] = -np.inf
    c[3, 0] = np.inf
    q = np.ones((2, 4), dtype=np.float32)
    for backend in ("native", "numpy"):
        s, i = rcn_fast.topn(q, c, 6, backend=backend)
        # +inf first, NaN and -inf rows never returned, then padding
        assert i[0].tolist() == [3, 0, 4, 5, -1, -1], backend
        assert np.isposinf(s[0, 0]) and np.isneginf(s[0, 4:]).all()


def test_non_contiguous_inputs(rng):
    big = rng.standard_normal((400, 130)).astype(np.float32)
    c = big[::3, 1:129:2]          # row stride 390, inner stride 2 (copied)
    q = big[5:9, 0:128:2]
    s, i = rcn_fast.topn(q, c, 7)
    assert_valid_topn(s, i, q, c, 7, 1e-5)
    rows = big[::2, :64]           # row stride only: used without a copy
    s, i = rcn_fast.topn(big[:20, :64], rows, 7)
    assert_valid_topn(s, i, big[:20, :64], rows, 7, 1e-5)
    ct = np.asfortranarray(big[:50, :20])
    s, i = rcn_fast.topn(big[:3, :20], ct, 4)
    assert_valid_topn(s, i, big[:3, :20], ct, 4, 1e-5)
    tq = torch.from_numpy(big[:64, :40]).t()  # [40, 64] non-contiguous tensor
    s, i = rcn_fast.topn(tq, torch.from_numpy(big[100:300, :64]), 5)
    assert_valid_topn(s, i, tq.numpy(), big[100:300, :64], 5, 1e-5)


@pytest.mark.parametrize("N,d,Qs", [(5000, 96, (1, 3, 40)), (60_001, 64, (1, 7))])
def test_thread_count_does_not_change_results(rng, monkeypatch, N, d, Qs):
    # the second corpus is scanned in dozens of chunks shared by the threads
    c = rng.standard_normal((N, d)).astype(np.float16)
    for Q in Qs:
        q = rng.standard_normal((Q, d)).astype(np.float32)
        monkeypatch.setenv("RCN_FAST_NUM_THREADS", "1")
        a = rcn_fast.topn(q, c, 50)
        monkeypatch.setenv("RCN_FAST_NUM_THREADS", "2")
        b = rcn_fast.topn(q, c, 50)
        monkeypatch.setenv("RCN_FAST_NUM_THREADS", "5")
        e = rcn_fast.topn(q, c, 50)
        np.testing.assert_array_equal(a[1], b[1])
        np.testing.assert_array_equal(a[1], e[1])
        np.testing.assert_array_equal(a[0], b[0])


def _avx2_usable() -> bool:
    from rcn_fast import _native

    mod, _ = _native.cpu_module()
    info = mod.build_info() if mod is not None else {}
    features = info.get("cpu_features", "").split()
    return "avx2" in info.get("simd_compiled", "") and {"avx2", "fma", "f16c"} <= set(features)


@pytest.mark.skipif(not _avx2_usable(), reason="this build or CPU has no AVX2 variant to compare the generic one with")
def test_generic_simd_variant_matches_avx2(tmp_path):
    """The baseline build of the scan kernels gives the same top-n (run in a
    fresh process: the variant is chosen once per process)."""
    script = (
        "import numpy as np, rcn_fast\n"
        "rng = np.random.default_rng(3)\n"
        "c = rng.standard_normal((777, 131)).astype(np.float16)\n"
        "out = []\n"
        "for Q in (1, 2, 4, 21):\n"
        "    q = rng.standard_normal((Q, 131)).astype(np.float32)\n"
        "    out.append(rcn_fast.topn(q, c, 9)[1])\n"
        "np.save(__import__('sys').argv[1], np.concatenate([o.ravel() for o in out]))\n"
        "print(rcn_fast._C.build_info()['simd_active'])\n"
    )
    res = {}
    for variant in ("generic", "avx2"):
        env = dict(os.environ, RCN_FAST_SIMD=variant)
        path = tmp_path / f"{variant}.npy"
        out = subprocess.run([sys.executable, "-c", script, str(path)], env=env,
                             capture_output=True, text=True, check=True)
        res[variant] = (np.load(path), out.stdout.strip())
    assert res["generic"][1] == "generic"
    assert res["avx2"][1] == "avx2"  # otherwise both runs used the same code
    np.testing.assert_array_equal(res["generic"][0], res["avx2"][0])


def test_against_faiss(rng):
    faiss = pytest.importorskip("faiss")
    c = rng.standard_normal((20000, 64)).astype(np.float32)
    q = rng.standard_normal((37, 64)).astype(np.float32)
    index = faiss.IndexFlatIP(64)
    index.add(c)
    fs, fi = index.search(q, 25)
    s, i = rcn_fast.topn(q, c, 25)
    np.testing.assert_allclose(s, fs, rtol=1e-5, atol=1e-4)
    # same sets up to ties at the boundary (random data: none expected)
    assert np.mean([len(set(a) & set(b)) / 25 for a, b in zip(i.tolist(), fi.tolist())]) > 0.999


# ---------------------------------------------------------------- bad input
@pytest.mark.parametrize(
    "q,c,k,exc,match",
    [
        (np.zeros((3,), np.float32), np.zeros((4, 3), np.float32), 1, ValueError, "queries"),
        (np.zeros((2, 3), np.float32), np.zeros((4, 3, 1), np.float32), 1, ValueError, "corpus"),
        (np.zeros((2, 3), np.float32), np.zeros((4, 5), np.float32), 1, ValueError, "corpus: expected 3 columns"),
        (np.zeros((2, 3), np.float32), np.zeros((4, 3), np.float32), 0, ValueError, "k: expected k >= 1"),
        (np.zeros((2, 3), np.float32), np.zeros((4, 3), np.float32), 1.5, TypeError, "k: expected an int"),
        (np.zeros((2, 3), np.float32), np.zeros((4, 3), np.int32), 1, TypeError, "corpus"),
        (np.zeros((2, 3), np.float16), np.zeros((4, 3), np.float32), 1, TypeError, "queries: expected float32 or the corpus dtype"),
        (np.zeros((2, 0), np.float32), np.zeros((4, 0), np.float32), 1, ValueError, "queries: expected d >= 1"),
        ("text", np.zeros((4, 3), np.float32), 1, TypeError, "queries"),
    ],
)
def test_bad_input_names_the_argument(q, c, k, exc, match):
    with pytest.raises(exc, match=match):
        rcn_fast.topn(q, c, k)


def test_mixed_libraries_rejected():
    with pytest.raises(TypeError, match="corpus: expected the same array library"):
        rcn_fast.topn(np.zeros((1, 3), np.float32), torch.zeros(4, 3), 1)


def test_binding_checks_its_arguments_too():
    """The nanobind layer re-checks what the Python layer checked."""
    from rcn_fast import _C

    out_s, out_i = np.empty((1, 2), np.float32), np.empty((1, 2), np.int64)
    with pytest.raises(ValueError, match="corpus: expected 3 columns"):
        _C.topn(np.zeros((1, 3), np.float32), np.zeros((4, 2), np.float32), 2, out_s, out_i)
    with pytest.raises(ValueError, match="scores_out"):
        _C.topn(np.zeros((1, 3), np.float32), np.zeros((4, 3), np.float32), 3, out_s, out_i)
    with pytest.raises(ValueError, match="last dimension must be contiguous"):
        _C.topn(np.zeros((1, 6), np.float32)[:, ::2], np.zeros((4, 3), np.float32), 2, out_s, out_i)
    with pytest.raises(TypeError, match="queries: expected float32, float16 or bfloat16"):
        _C.topn(np.zeros((1, 3), np.float64), np.zeros((4, 3), np.float32), 2, out_s, out_i)


# ---------------------------------------------------------------- property test
hypothesis = pytest.importorskip("hypothesis")
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


@settings(max_examples=150, deadline=None)
@given(
    Q=st.integers(0, 9), N=st.integers(0, 40), d=st.integers(0, 20), k=st.integers(-2, 50),
    qdtype=st.sampled_from(["float32", "float16", "float64", "int64", "bfloat16"]),
    cdtype=st.sampled_from(["float32", "float16", "float64", "int8", "bfloat16"]),
    qstep=st.integers(1, 3), cstep=st.integers(1, 3), transpose=st.booleans(), qndim=st.integers(1, 3),
)
def test_random_inputs_never_crash(Q, N, d, k, qdtype, cdtype, qstep, cstep, transpose, qndim):
    rng = np.random.default_rng(Q * 1000 + N * 10 + d)

    def arr(rows, cols, dtype, step):
        base = rng.standard_normal((rows * step + 1, cols * step + 1)) * 3
        dt = ml_dtypes.bfloat16 if dtype == "bfloat16" else dtype
        return base.astype(dt)[::step, ::step][:rows, :cols]

    q = arr(Q, d, qdtype, qstep)
    if qndim != 2:
        q = q.reshape(-1) if qndim == 1 else q[..., None]
    c = arr(d, N, cdtype, cstep).T if transpose else arr(N, d, cdtype, cstep)
    try:
        s, i = rcn_fast.topn(q, c, k)
    except (TypeError, ValueError):
        return
    qf, cf = np.asarray(q, np.float32), np.asarray(c, np.float32)
    assert_valid_topn(s, i, qf, cf, k, 1e-4)


# ---------------------------------------------------------------- dispatch
def test_dispatch_override_and_errors(monkeypatch, rng):
    c = rng.standard_normal((50, 8)).astype(np.float32)
    q = c[:2]
    monkeypatch.setenv("RCN_FAST_BACKEND", "topn=numpy")
    assert rcn_fast._dispatch.get("topn").select({"device": "cpu", "library": "numpy", "k": 1}).name == "numpy"
    monkeypatch.setenv("RCN_FAST_BACKEND", "nosuch")
    with pytest.raises(ValueError, match="RCN_FAST_BACKEND: unknown backend 'nosuch'"):
        rcn_fast.topn(q, c, 3)
    monkeypatch.delenv("RCN_FAST_BACKEND")
    with pytest.raises(ValueError, match="backend=: unknown backend"):
        rcn_fast.topn(q, c, 3, backend="gpu")
    # a forced backend that cannot serve the call says why, never falls back
    with pytest.raises(rcn_fast.BackendUnavailableError, match="torch: inputs are numpy arrays"):
        rcn_fast.topn(q, c, 3, backend="torch")
    if rcn_fast._native.cuda_module()[0] is None:
        with pytest.raises(rcn_fast.BackendUnavailableError, match="cuda:"):
            rcn_fast.topn(q, c, 3, backend="cuda")


def test_info_reports_build_and_backends():
    info = rcn_fast.build_info()
    assert info["native"]["simd_active"] in ("generic", "avx2")
    assert info["native"]["compiler"]
    assert "compiled" in info["cuda"] and "gpu_usable" in info["cuda"]
    assert info["backends"]["topn"]["cpu (numpy float32)"]["uses"] == "native"
    out = subprocess.run([sys.executable, "-m", "rcn_fast.info"], capture_output=True, text=True, check=True)
    assert "SIMD compiled" in out.stdout and "topn" in out.stdout


def test_kernels_package_is_installed_inside_rcn_fast():
    import rcn_fast.kernels

    assert rcn_fast.kernels.__name__ == "rcn_fast.kernels"


# ---------------------------------------------------------------- CUDA (skipped without a GPU)
requires_gpu = pytest.mark.gpu


@requires_gpu
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("Q,N,d,k", [(1, 1, 1, 1), (3, 70000, 7, 100), (65, 1000, 768, 1024), (130, 5, 33, 8)])
def test_cuda_matches_reference(rng, dtype, Q, N, d, k):
    c, c_np = make(rng, (N, d), dtype, "torch")
    q = torch.from_numpy(rng.standard_normal((Q, d)).astype(np.float32))
    s, i = rcn_fast.topn(q.cuda(), c.cuda(), k, backend="cuda")
    assert s.is_cuda and i.is_cuda
    assert_valid_topn(s.cpu(), i.cpu(), q.numpy(), c_np, k, RTOL[dtype])


@requires_gpu
def test_cuda_ties_nonfinite_and_dispatch():
    rng = np.random.default_rng(7)
    base = rng.integers(-3, 4, size=(40, 16)).astype(np.float32)
    c = np.concatenate([base, base, base[:5]])
    c[3, 0] = np.nan
    c[4, :] = -np.inf
    q = rng.integers(-2, 3, size=(13, 16)).astype(np.float32)
    ref = topn_reference(q, c, 30)
    s, i = rcn_fast.topn(torch.from_numpy(q).cuda(), torch.from_numpy(c).cuda(), 30)
    np.testing.assert_array_equal(i.cpu().numpy(), ref[1])
    # k above the kernel's limit goes to the next backend, which says so
    big = torch.randn(3000, 8, device="cuda")
    op = rcn_fast._dispatch.get("topn")
    ctx = {"device": "cuda", "library": "torch", "k": 2000}
    assert op.select(ctx).name == "torch"
    assert "exceeds" in dict(op.report(ctx))["cuda"]
    s, i = rcn_fast.topn(big[:2], big, 2000)
    assert i.shape == (2, 2000)
