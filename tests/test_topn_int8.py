"""The exact int8 bounded scan (issue 45 item 4, rcn_fast/search/int8_bounded.py).

Without a GPU: the intervals hold every float32 score whatever the order
of the float32 sums (adversarial rows: large dynamic range, near-zero,
single spikes); rcn_fast._C's scan (csrc/topn/topn_int8.h, the CUDA
kernel's formula) equals the numpy reference to the bit; the search
equals the exact search to the bit (scores and ids: by construction) on
random rows, integer rows, duplicates, near-ties one float32 step apart, a
zero query, k up to N, and a hypothesis property test; the files, the
FlatIndex and the corpus build option. With a GPU (marked gpu): the kernel
equals the CPU to the bit, and the GPU search equals the exact search.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

import rcn_fast
from rcn_fast import _native
from rcn_fast.search import int8_bounded as ib
from rcn_fast.search import int8_files as files
from tests.conftest import requires_gpu
from tests.retrieval.fixtures import corpus_jsonl, corpus_records, one_torch_thread, run_cli, tiny_model  # noqa: F401

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


def _rows(rng, n, d, dtype=np.float16):
    x = rng.standard_normal((n, d)).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    return x.astype(dtype)


def _adversarial(rng, n, d, dtype):
    x = rng.standard_normal((n, d)).astype(np.float32)
    x[0] = 0.0  # a zero row
    x[1] *= 1e-4  # tiny values (float16 subnormals)
    x[2, :] = 1e-3
    x[2, min(5, d - 1)] = 30.0  # one spike: the scale is set by it, the rest rounds to 0
    x[3] *= np.logspace(-4, 2, d).astype(np.float32)  # a large dynamic range
    x[4] = x[5]  # duplicates
    return x.astype(dtype)


def _copy(x):
    return ib.build_int8(x)


# ------------------------------------------------------------------ the bounds


@pytest.mark.parametrize("dtype", [np.float16, np.float32])
@pytest.mark.parametrize("d", [1, 15, 16, 77, 768, 1024])
def test_the_interval_holds_every_float32_score_in_any_order(dtype, d):
    rng = np.random.default_rng(d)
    x = _adversarial(rng, 40, d, dtype)
    q = rng.standard_normal((6, d)).astype(np.float32)
    q[1] *= 1e-3
    q[2] = 0.0
    q[3, :] = 0.0
    q[3, 0] = 5.0
    q[4] = x[3].astype(np.float32)  # a query along the large-range row
    q[5] = q[5].astype(np.float16)  # float16 values, as FlatIndex casts them
    copy = _copy(x)
    qcodes, params = ib.query_terms(q, copy.width)
    lo, hi = ib.intervals_reference(copy.codes, copy.rows, qcodes, params)
    xf = x.astype(np.float32)
    prods = q[:, None, :] * xf[None, :, :]  # float32 products
    orders = {
        "forward": np.cumsum(prods, axis=2, dtype=np.float32)[:, :, -1],
        "reverse": np.cumsum(prods[:, :, ::-1], axis=2, dtype=np.float32)[:, :, -1],
        "pairwise": prods.sum(2, dtype=np.float32),
        "float64": (q.astype(np.float64) @ xf.T.astype(np.float64)).astype(np.float32),
        "blas": q @ xf.T,
    }
    for name, f in orders.items():
        assert (lo <= f).all() and (f <= hi).all(), name
    assert (lo <= hi).all() and np.isfinite(lo).all() and np.isfinite(hi).all()


def test_native_scan_equals_the_reference_to_the_bit():
    mod = _native.cpu_module()[0]
    assert hasattr(mod, "topn_int8_intervals")
    rng = np.random.default_rng(1)
    for d in (16, 100, 768):
        x = _adversarial(rng, 300, d, np.float16)
        q = rng.standard_normal((5, d)).astype(np.float32) * np.float32([1, 1e-3, 1e3, 0, 7])[:, None]
        copy = _copy(x)
        qcodes, params = ib.query_terms(q, copy.width)
        lo, hi = ib.intervals_reference(copy.codes, copy.rows, qcodes, params)
        nlo, nhi = np.empty_like(lo), np.empty_like(hi)
        mod.topn_int8_intervals(copy.codes, copy.rows, qcodes, params, nlo, nhi)
        np.testing.assert_array_equal(nlo, lo)
        np.testing.assert_array_equal(nhi, hi)


def test_native_scan_names_bad_arguments():
    mod = _native.cpu_module()[0]
    copy = _copy(_rows(np.random.default_rng(2), 10, 20))
    qcodes, params = ib.query_terms(np.ones((2, 20), np.float32), copy.width)
    lo = np.empty((2, 10), np.float32)
    with pytest.raises(ValueError, match="codes: expected"):
        mod.topn_int8_intervals(np.zeros((10, 20), np.int8), copy.rows, qcodes, params, lo, lo.copy())
    with pytest.raises(ValueError, match="rows: expected"):
        mod.topn_int8_intervals(copy.codes, copy.rows[:5], qcodes, params, lo, lo.copy())
    with pytest.raises(ValueError, match="qcodes"):
        mod.topn_int8_intervals(copy.codes, copy.rows, qcodes[:, :1], params, lo, lo.copy())
    with pytest.raises(ValueError, match="qparams"):
        mod.topn_int8_intervals(copy.codes, copy.rows, qcodes, params[:, :4], lo, lo.copy())
    with pytest.raises(ValueError, match="lo, hi"):
        mod.topn_int8_intervals(copy.codes, copy.rows, qcodes, params, lo[:, :5], lo.copy())


def test_a_torch_build_equals_the_numpy_build():
    """build_int8 of a torch tensor (on its device: the GPU build of the
    benchmarks) gives the numpy build's codes and bounds."""
    torch = pytest.importorskip("torch")
    x = _adversarial(np.random.default_rng(11), 300, 77, np.float16)
    a, b = ib.build_int8(x, chunk=100), ib.build_int8(torch.from_numpy(x), chunk=64)
    assert isinstance(b.codes, torch.Tensor) and b.dim == a.dim == 77
    np.testing.assert_array_equal(b.codes.numpy(), a.codes)
    np.testing.assert_array_equal(b.rows.numpy(), a.rows)


def test_the_build_refuses_what_it_cannot_bound():
    with pytest.raises(ValueError, match="at most 1024"):
        ib.build_int8(np.zeros((2, 1025), np.float16))
    bad = np.ones((5, 8), np.float16)
    bad[3, 2] = np.inf
    with pytest.raises(ValueError, match="row 3"):
        ib.build_int8(bad)


def test_an_offset_view_is_refused_by_the_binding_and_copied_by_the_search():
    """Issue 55, C3: the scans read the codes 16 bytes and the query codes 4
    bytes at a time; the binding checked the width but not the start, so an
    offset view faulted on a GPU (a misaligned address). Both bindings
    refuse it naming the argument; the search copies such a view."""
    mod = _native.cpu_module()[0]
    rng = np.random.default_rng(12)
    x = _rows(rng, 30, 32)
    copy = _copy(x)
    q = rng.standard_normal((3, 32)).astype(np.float32)
    qcodes, params = ib.query_terms(q, copy.width)
    buf = np.zeros(copy.codes.nbytes + 32, np.int8)
    start = (-buf.ctypes.data) % 16 + 1  # one byte past a 16-byte boundary
    off = buf[start : start + copy.codes.nbytes].reshape(copy.codes.shape)
    off[...] = copy.codes
    assert off.flags.c_contiguous and off.ctypes.data % 16 == 1
    lo = np.empty((3, 30), np.float32)
    with pytest.raises(ValueError, match="codes: expected a 16-byte aligned start"):
        mod.topn_int8_intervals(off, copy.rows, qcodes, params, lo, lo.copy())
    qbuf = np.zeros(qcodes.nbytes + 8, np.int8)
    qs = (-qbuf.ctypes.data) % 4 + 2
    qoff = qbuf[qs : qs + qcodes.nbytes].reshape(qcodes.shape)
    qoff[...] = qcodes
    with pytest.raises(ValueError, match="qcodes: expected a 4-byte aligned start"):
        mod.topn_int8_intervals(copy.codes, copy.rows, qoff, params, lo, lo.copy())
    got = ib.topn_int8_numpy(q, x, ib.Int8Copy(off, copy.rows, copy.dim), 4)
    ref = ib.topn_exact_numpy(q, x, 4)
    np.testing.assert_array_equal(got[1], ref[1])


def test_tiny_values_are_searched_exactly():
    """Issue 55, W4: the bound on A = fl(s_q s_j) (I1 + I2 / 256) assumes a
    normal s_q s_j; with values near 3e-21 the product is subnormal, the
    intervals miss scores and the bounded scan returned other ids than the
    exact search. servable() now refuses (s_q * min s_j < 2^-100) and the
    rows are searched exactly."""
    rng = np.random.default_rng(0)
    rows = (rng.standard_normal((300, 64)) * 3e-21).astype(np.float32)
    q = (rng.standard_normal((4, 64)) * 3e-21).astype(np.float32)
    copy = ib.build_int8(rows)
    qcodes, params = ib.query_terms(q, copy.width)
    lo, hi = ib.intervals_reference(copy.codes, copy.rows, qcodes, params)
    f = np.stack([ib.rescore_reference(np.broadcast_to(v, rows.shape), rows) for v in q])
    assert ((f < lo) | (f > hi)).any()  # the interval cannot be trusted here
    assert not ib.servable(q, copy)
    assert copy.smallest_scale() * float(np.abs(q).max(1).min() / 127) < ib.MIN_SCALE_PRODUCT
    s, i = rcn_fast.topn(q, ib.Int8Corpus(rows, copy), 5)
    ref = ib.topn_exact_numpy(q, rows, 5)
    np.testing.assert_array_equal(i, ref[1])
    # ordinary values still take the bounded scan
    big = rows * np.float32(1e20)
    assert ib.servable(q * np.float32(1e20), ib.build_int8(big))


# ------------------------------------------------------------------ the search equals the exact search


def _check(q, x, k, **kw):
    copy = _copy(x)
    got = ib.topn_int8_numpy(q, x, copy, k, **kw)
    ref = ib.topn_exact_numpy(q, x, k)
    np.testing.assert_array_equal(got[1], ref[1])
    np.testing.assert_array_equal(got[0], ref[0])
    return got


@pytest.mark.parametrize("dtype", [np.float16, np.float32])
@pytest.mark.parametrize("n,d,k,chunk", [(3000, 64, 10, None), (3000, 64, 100, 700), (500, 768, 500, None),
                                         (257, 5, 1, 31), (40, 16, 40, 7)])
def test_search_equals_the_exact_search(dtype, n, d, k, chunk):
    rng = np.random.default_rng(n + d + k)
    x = _rows(rng, n, d, dtype)
    q = rng.standard_normal((4, d)).astype(np.float32)
    q[1] = x[7]  # a query equal to a row
    _check(q, x, k, chunk=chunk)


def test_search_with_duplicates_near_ties_and_integers():
    rng = np.random.default_rng(3)
    x = rng.integers(-3, 4, (2000, 32)).astype(np.float16)  # integer rows: ties everywhere
    x[100:130] = x[5]  # thirty duplicates of a row
    q = np.abs(rng.integers(-3, 4, (5, 32))).astype(np.float32)
    q[0] = x[5]
    _check(q, x, 50)
    # near-ties: rows one float32 step apart in score
    base = _rows(rng, 1000, 48, np.float32)
    base[500:520] = base[3]
    base[510:520, 0] = np.nextafter(base[510:520, 0], np.float32(2))
    _check(base[[3, 0]].astype(np.float32), base, 25, chunk=128)


def test_a_zero_query_ranks_every_row_tied():
    rng = np.random.default_rng(4)
    x = _rows(rng, 300, 24)
    s, i = _check(np.zeros((2, 24), np.float32), x, 17)
    assert (i == np.arange(17)).all() and (s == 0).all()


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 120), d=st.integers(1, 40), k=st.integers(1, 130), levels=st.integers(1, 5),
       chunk=st.integers(1, 50), half=st.booleans())
def test_search_property(n, d, k, levels, chunk, half):
    """Few distinct values (ties and duplicate rows everywhere), any chunk:
    the exact search's scores and ids."""
    rng = np.random.default_rng(n * 1000 + d * 10 + k)
    x = (rng.integers(0, levels, (n, d)) * rng.choice([0.5, -0.25, 1.0], (n, d))).astype(np.float16 if half
                                                                                        else np.float32)
    q = rng.integers(-2, 3, (3, d)).astype(np.float32) * np.float32(0.75)
    _check(q, x, min(k, n), chunk=chunk)


def test_topn_takes_an_int8_corpus():
    """rcn_fast.topn(q, Int8Corpus(rows, copy), k): the bounded scan, numpy
    or torch; k beyond N pads; a non-finite query or a backend searches the
    rows exactly."""
    rng = np.random.default_rng(5)
    x = _rows(rng, 800, 32)
    corpus = ib.Int8Corpus(x, _copy(x))
    q = rng.standard_normal((3, 32)).astype(np.float32)
    s, i = rcn_fast.topn(q, corpus, 10)
    rs, ri = ib.topn_exact_numpy(q, x, 10)
    np.testing.assert_array_equal(i, ri)
    s, i = rcn_fast.topn(q, corpus, 900)
    assert i.shape == (3, 900) and (i[:, 800:] == -1).all() and np.isneginf(s[:, 800:]).all()
    bad = q.copy()
    bad[1, 3] = np.nan
    s, i = rcn_fast.topn(bad, corpus, 10)  # served by the exact search on the rows
    np.testing.assert_array_equal(i, rcn_fast.topn(bad, x, 10)[1])
    np.testing.assert_array_equal(rcn_fast.topn(q, corpus, 10, backend="numpy")[1], rcn_fast.topn(q, x, 10)[1])
    torch = pytest.importorskip("torch")
    ts, ti = rcn_fast.topn(torch.from_numpy(q), corpus, 10)
    assert isinstance(ti, torch.Tensor)
    np.testing.assert_array_equal(ti.numpy(), ri)
    with pytest.raises(ValueError, match="does not match rows"):
        ib.Int8Corpus(x[:10], corpus.copy)
    with pytest.raises(ValueError, match="columns"):
        rcn_fast.topn(q[:, :5], corpus, 3)


# ------------------------------------------------------------------ files, FlatIndex, the corpus build


def _index(tmp_path, n=500, d=48):
    rng = np.random.default_rng(6)
    index = rcn_fast.FlatIndex(d, metric="cosine", dtype="float16")
    index.add(rng.standard_normal((n, d)).astype(np.float32))
    index.save(tmp_path)
    return index


def test_flat_index_searches_through_its_int8_copy(tmp_path):
    index = _index(tmp_path)
    assert rcn_fast.FlatIndex.load(tmp_path).int8 is None
    copy = files.write_int8_copy(tmp_path)
    loaded = rcn_fast.FlatIndex.load(tmp_path, verify=True)
    assert loaded.int8 is not None and len(loaded.int8) == len(index) and loaded.int8.width == 48
    np.testing.assert_array_equal(loaded.int8.codes, copy.codes)
    q = np.random.default_rng(7).standard_normal((4, 48)).astype(np.float32)
    got = loaded.search(q, 20, int8=True)
    exact = loaded.search(q, 20)
    np.testing.assert_array_equal(got[1], exact[1])
    np.testing.assert_allclose(got[0], exact[0], rtol=2e-6, atol=1e-6)  # two float32 orders of one sum
    loaded.add(np.ones((1, 48), np.float32))
    assert loaded.int8 is None  # the rows changed
    with pytest.raises(ValueError, match="no int8 copy"):
        loaded.search(q, 3, int8=True)


def test_a_stale_or_damaged_copy_is_an_error_naming_the_fix(tmp_path):
    _index(tmp_path)
    files.write_int8_copy(tmp_path)
    codes = tmp_path / files.CODES
    data = bytearray(codes.read_bytes())
    data[-1] ^= 1
    codes.write_bytes(bytes(data))
    with pytest.raises(ValueError, match="sha256"):
        rcn_fast.FlatIndex.load(tmp_path, verify=True)
    codes.write_bytes(bytes(data[:-3]))
    with pytest.raises(ValueError, match="bytes, the record says"):
        rcn_fast.FlatIndex.load(tmp_path)
    files.write_int8_copy(tmp_path)
    rng = np.random.default_rng(8)
    other = rcn_fast.FlatIndex(48, metric="cosine", dtype="float16")
    other.add(rng.standard_normal((500, 48)).astype(np.float32))
    other.save(tmp_path)  # new embeddings, the old copy left beside them
    with pytest.raises(ValueError, match="built from other embeddings"):
        rcn_fast.FlatIndex.load(tmp_path)
    meta = json.loads((tmp_path / files.RECORD).read_text())
    meta["format"] = "other/1"
    (tmp_path / files.RECORD).write_text(json.dumps(meta))
    with pytest.raises(ValueError, match="Int8Copy"):
        files.load_int8_copy(tmp_path)


def test_corpus_build_int8_copy_option(tmp_path, corpus_jsonl, tiny_model):
    res = run_cli("build", "--input", str(corpus_jsonl), "--encoder", str(tiny_model), "--backend", "torch",
                  "--out", str(tmp_path / "store"), "--no-progress", "--int8-copy")
    assert res.returncode == 0, res.stderr
    from rcn_fast.retrieval import CorpusStore

    store = CorpusStore.open(tmp_path / "store")
    index = store.index()
    assert index.int8 is not None and len(index.int8) == len(store)
    q = np.asarray(index.embeddings[:3], np.float32)
    np.testing.assert_array_equal(index.search(q, 5, int8=True)[1], index.search(q, 5)[1])


# ------------------------------------------------------------------ on a GPU


@requires_gpu
def test_the_kernel_equals_the_cpu_to_the_bit():
    """The search's kernels without a bound (k = 0: every pair a candidate)
    write every pair's interval: the CPU's to the bit, __dp4a (Q <= 2) and
    tensor cores (Q >= 3)."""
    torch = pytest.importorskip("torch")
    mod = _native.cuda_module()[0]
    rng = np.random.default_rng(9)
    for n_q in (1, 2, 3, 8, 13):
        x = _adversarial(rng, 5003, 768, np.float16)
        q = rng.standard_normal((n_q, 768)).astype(np.float32)
        copy = _copy(x)
        qcodes, params = ib.query_terms(q, copy.width)
        lo, hi = ib.intervals_reference(copy.codes, copy.rows, qcodes, params)
        g = copy.to("cuda")
        cap = n_q * len(copy)
        cand = [torch.empty(cap, dtype=t, device="cuda") for t in (torch.int32, torch.int64, torch.float32,
                                                                   torch.float32)]
        count = torch.zeros(1, dtype=torch.int64, device="cuda")
        mod.topn_int8_scan(g.codes, g.rows, torch.from_numpy(qcodes).cuda(), torch.from_numpy(params).cuda(), 0,
                           torch.zeros(n_q, dtype=torch.int32, device="cuda"), *cand, count,
                           torch.cuda.current_stream().cuda_stream)
        assert int(count.item()) == cap
        cq, cj, clo, chi = (t.cpu().numpy() for t in cand)
        np.testing.assert_array_equal(clo, lo[cq, cj])
        np.testing.assert_array_equal(chi, hi[cq, cj])
        assert len(set(zip(cq.tolist(), cj.tolist()))) == cap


@requires_gpu
@pytest.mark.parametrize("rows_on", ["cuda", "host"])
def test_the_gpu_search_equals_the_exact_search(rows_on):
    """Rows on the GPU, or on the host (past the memory wall): the ids of
    the exact search with the GPU's float32 rescoring."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(10)
    x = _rows(rng, 200_003, 128)
    x[1000:1040] = x[17]  # duplicates near the top of query 0
    q = rng.standard_normal((5, 128)).astype(np.float32)
    q[0] = x[17]
    copy = _copy(x).to("cuda")
    rows = torch.from_numpy(x).cuda() if rows_on == "cuda" else x
    s, i = rcn_fast.topn(torch.from_numpy(q).cuda(), ib.Int8Corpus(rows, copy), 100)
    qs = torch.from_numpy(q).cuda()
    xs = torch.from_numpy(x).cuda().float()
    exact = torch.stack([(qs[r][None, :] * xs).sum(1) for r in range(5)])  # the rescoring's arithmetic
    ids = torch.arange(exact.shape[1], device="cuda").expand_as(exact)
    from rcn_fast.search.torch_backend import order_by_score_then_id

    es, ei = order_by_score_then_id(torch, exact, ids)
    # torch's row sums may order their additions by the batch: ids equal up to float32 near-ties
    assert (i == ei[:, :100]).float().mean().item() >= 0.999
    torch.testing.assert_close(s, es[:, :100], rtol=1e-6, atol=1e-6)
    assert i[0, :41].tolist()[:1] == [17] and set(i[0, :41].tolist()) == {17, *range(1000, 1040)}
    ref = rcn_fast.topn(torch.from_numpy(q).cuda(), torch.from_numpy(x).cuda(), 100, backend="torch")
    assert (i == ref[1]).float().mean().item() >= 0.999
