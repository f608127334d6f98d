"""The int8 bounded scan's kernels (issue 55, S2 and S6; the exactness
argument: rcn_fast/search/int8_bounded.py, its tests: test_topn_int8.py).

Without a GPU: every CPU variant compiled in and supported here (generic,
avx2, and the vnni ones where the CPU has them) equals the numpy reference
to the bit, the 16-bit query term's single rounding included (a_of_dot =
a_of_terms, checked over the whole range); the candidates the CPU driver
keeps while it scans are exactly the pairs with hi >= T; the CUDA search's
host emulation (its launch plan, blocks, the mma.m16n8k32.s8 fragments by
the PTX ISA's layout, the __dp4a lanes, filter_tile) writes bit-equal
intervals, every pair with hi >= T, no pair twice, a bound never above T,
and counts past a full buffer; the rescoring holds at most its budget of
rows. With a GPU (marked gpu): the kernels equal the emulation.
"""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

from rcn_fast import _native
from rcn_fast.search import int8_bounded as ib
from tests.conftest import requires_gpu

VARIANTS = ("generic", "avx2", "avx512vnni", "avxvnni")


def _mod():
    mod, why = _native.cpu_module()
    if mod is None or not hasattr(mod, "topn_int8_candidates"):
        pytest.skip(f"rcn_fast._C with the int8 search is needed: {why}")
    return mod


def _supported():
    mod = _mod()
    return [v for v in VARIANTS if mod.topn_int8_isa(v) is not None]


def _data(rng, n, d, n_q, dtype=np.float16):
    x = rng.standard_normal((n, d)).astype(np.float32)
    x *= rng.choice([1e-3, 1.0, 100.0], (n, 1)).astype(np.float32)
    x[0] = 0.0  # a zero row
    if n > 4:
        x[3] = x[2]  # duplicates
    q = rng.standard_normal((n_q, d)).astype(np.float32)
    q *= rng.choice([1.0, 1e-3, 1e3, 7.0], (n_q, 1)).astype(np.float32)
    if n_q > 1:
        q[1] = 0.0  # a zero query: every row ties
    return x.astype(dtype), q


def _intervals(x, q):
    copy = ib.build_int8(x)
    qcodes, params = ib.query_terms(q, copy.width)
    lo, hi = ib.intervals_reference(copy.codes, copy.rows, qcodes, params)
    return copy, qcodes, params, lo, hi


# ------------------------------------------------------------------ the CPU variants


def test_the_variant_in_use_is_reported():
    mod = _mod()
    info = mod.build_info()
    assert info["int8_scan"] == mod.topn_int8_isa("") and info["int8_scan"] in info["int8_scan_compiled"].split(",")
    assert "generic" in _supported()
    with pytest.raises(ValueError, match="isa: 'sse9'"):
        mod.topn_int8_intervals(np.zeros((1, 16), np.int8), np.ones((1, 3), np.float32), np.zeros((1, 2, 16), np.int8),
                                np.ones((1, 5), np.float32), np.empty((1, 1), np.float32),
                                np.empty((1, 1), np.float32), isa="sse9")


@pytest.mark.parametrize("d", [1, 16, 33, 100, 768, 1024])
def test_every_variant_equals_the_reference_to_the_bit(d):
    """Few queries (one row streamed at a time) and many (rows widened once,
    queries in blocks), odd row counts: lo and hi to the bit."""
    mod = _mod()
    rng = np.random.default_rng(d)
    for n_q in (1, 2, 3, 4, 5, 7, 70):
        x, q = _data(rng, 37, d, n_q)
        copy, qcodes, params, lo, hi = _intervals(x, q)
        for isa in _supported():
            got_lo, got_hi = np.empty_like(lo), np.empty_like(hi)
            mod.topn_int8_intervals(copy.codes, copy.rows, qcodes, params, got_lo, got_hi, num_threads=2, isa=isa)
            np.testing.assert_array_equal(got_lo, lo, err_msg=f"{isa} d={d} Q={n_q}")
            np.testing.assert_array_equal(got_hi, hi, err_msg=f"{isa} d={d} Q={n_q}")


def test_extreme_codes_and_terms_stay_exact():
    """Codes of +-127 against query terms at their ends (c1 = +-127, c2 =
    -128 and 127: the 16-bit term's extremes, the widest lanes) over the
    widest row: the avx2 lanes cannot overflow and the float64 sum is exact."""
    mod = _mod()
    w, n = 1024, 9
    codes = np.full((n, w), 127, np.int8)
    codes[1::2] = -127
    codes[4, ::2] = -127
    rows = np.ones((n, 3), np.float32)
    qcodes = np.zeros((4, 2, w), np.int8)
    qcodes[0, 0], qcodes[0, 1] = 127, 127
    qcodes[1, 0], qcodes[1, 1] = -127, -128
    qcodes[2, 0], qcodes[2, 1] = 127, -128
    qcodes[3, 0, ::3], qcodes[3, 1, 1::3] = -127, 127
    params = np.tile(np.float32([1.0, 0.0, 0.0, 0.0, 1e-40]), (4, 1))
    lo, hi = ib.intervals_reference(codes, rows, qcodes, params)
    for isa in _supported():
        got_lo, got_hi = np.empty_like(lo), np.empty_like(hi)
        mod.topn_int8_intervals(codes, rows, qcodes, params, got_lo, got_hi, isa=isa)
        np.testing.assert_array_equal(got_lo, lo, err_msg=isa)
        np.testing.assert_array_equal(got_hi, hi, err_msg=isa)


def test_one_rounding_of_the_combined_dot_is_the_two_terms_rounding():
    """A = RN(I1 + I2 / 256) (a_of_terms) equals RN(256 I1 + I2) / 256
    (a_of_dot, the CPU variants' one product for both terms) for every
    I1, I2 of the scan's range, the rounding boundaries included."""
    rng = np.random.default_rng(0)
    lim = 1024 * 127 * 128
    i1 = np.concatenate([rng.integers(-lim, lim, 2_000_000), rng.integers(-300, 300, 200_000),
                         np.array([0, 1, -1, 2**16, 2**16 + 1, 2**23, 2**24 - 1, -(2**24 - 1), lim, -lim])])
    i2 = rng.integers(-lim, lim, i1.shape[0])
    i2[-20:] = [0, 128, -128, 127, 255, 256, 2**23, -(2**23), lim, -lim] * 2
    two = (i1.astype(np.float32) + i2.astype(np.float32) * np.float32(0.00390625)).astype(np.float32)
    one = (256 * i1 + i2).astype(np.float32) * np.float32(0.00390625)
    np.testing.assert_array_equal(one.view(np.uint32), two.view(np.uint32))


@pytest.mark.parametrize("k", [1, 7, 100, 299, 300])
def test_the_candidates_are_exactly_the_pairs_reaching_T(k):
    """The CPU driver's candidates (threads over rows, each with its running
    k-th largest lo) equal {j : hi_j >= T}, T the k-th largest lo of the
    query, whatever the thread count; k = N keeps every row."""
    mod = _mod()
    rng = np.random.default_rng(k)
    x, q = _data(rng, 300, 40, 6, np.float32)
    x[100:140] = x[7]  # ties around the top
    q[2] = x[7]
    copy, qcodes, params, lo, hi = _intervals(x, q)
    t = -np.partition(-lo, k - 1, axis=1)[:, k - 1]
    for threads in (1, 2, 3):
        for isa in _supported():
            counts, ids = mod.topn_int8_candidates(copy.codes, copy.rows, qcodes, params, k, num_threads=threads,
                                                   isa=isa)
            got = np.split(ids, np.cumsum(counts)[:-1])
            for qi in range(q.shape[0]):
                np.testing.assert_array_equal(got[qi], np.flatnonzero(hi[qi] >= t[qi]), err_msg=f"{isa} {threads}")
    with pytest.raises(ValueError, match="k: expected"):
        mod.topn_int8_candidates(copy.codes, copy.rows, qcodes, params, 0)


def test_the_native_and_reference_candidates_give_one_search():
    rng = np.random.default_rng(3)
    x, q = _data(rng, 2000, 64, 9)
    copy = ib.build_int8(x)
    qcodes, params = ib.query_terms(q, copy.width)
    a = ib.native_candidates(copy, qcodes, params, 50)
    b = ib.candidates_reference(copy, qcodes, params, 50, chunk=333)
    np.testing.assert_array_equal(a[0], b[0])
    np.testing.assert_array_equal(a[1], b[1])
    ref = ib.topn_exact_numpy(q, x, 50)
    for kw in ({}, {"chunk": 333}):
        s, i = ib.topn_int8_numpy(q, x, copy, 50, **kw)
        np.testing.assert_array_equal(i, ref[1])
        np.testing.assert_array_equal(s, ref[0])


def test_the_rescoring_holds_at_most_its_budget_of_rows():
    """S6: the candidates' rows are rescored a bounded chunk at a time (the
    query broadcast, never gathered), the scores bit-equal the unchunked
    ones; a zero query makes every row a candidate."""
    rng = np.random.default_rng(4)
    n, d = 20_000, 64
    x = rng.standard_normal((n, d)).astype(np.float16)
    q = np.zeros((2, d), np.float32)
    q[1] = rng.standard_normal(d)
    qi = np.repeat(np.arange(2), n)
    j = np.tile(np.arange(n), 2)
    whole = np.concatenate([ib.rescore_reference(np.broadcast_to(v, (n, d)), x) for v in q])
    tracemalloc.start()
    got = ib.rescore_chunked(q, x, qi, j, budget=64 << 10)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    np.testing.assert_array_equal(got, whole)
    assert peak < 2 * n * 4 + (1 << 20), peak  # the scores and a few chunks, not [2n, d] float32 arrays


# ------------------------------------------------------------------ the CUDA search, emulated


def _emulate(copy, qcodes, params, k, *, sms=4, cap=None, bound=None):
    mod = _mod()
    n_q, n = qcodes.shape[0], len(copy)
    cap = cap if cap is not None else n_q * n + 5
    out = {"bound": np.zeros(n_q, np.int32) if bound is None else bound, "q": np.full(cap, n_q, np.int32),
           "j": np.full(cap, -7, np.int64), "lo": np.zeros(cap, np.float32), "hi": np.zeros(cap, np.float32),
           "count": np.zeros(1, np.int64)}
    mod.topn_int8_scan_emulated(copy.codes, copy.rows, qcodes, params, k, out["bound"], out["q"], out["j"], out["lo"],
                                out["hi"], out["count"], sms)
    return out


def _key_to_float(keys):
    k = keys.astype(np.uint32)
    u = np.where(k & 0x80000000, k & 0x7FFFFFFF, ~k).astype(np.uint32)
    return np.where(k == 0, -np.inf, u.view(np.float32))


CASES = [  # (n, d, Q, k, sms): the dp4a kernel (Q <= 2), the mma kernel with one and two A tiles, every chunk count
    (1001, 16, 1, 10, 4), (777, 100, 2, 30, 2), (513, 48, 3, 5, 1), (700, 768, 8, 64, 4), (450, 80, 9, 20, 3),
    (333, 1024, 17, 300, 2), (260, 256, 5, 1024, 1), (97, 512, 2, 97, 132), (64, 200, 16, 1, 4),
]


@pytest.mark.parametrize("n,d,n_q,k,sms", CASES)
def test_the_emulated_search_keeps_every_pair_reaching_T(n, d, n_q, k, sms):
    rng = np.random.default_rng(n + d)
    x, q = _data(rng, n, d, n_q)
    copy, qcodes, params, lo, hi = _intervals(x, q)
    k = min(k, n)
    out = _emulate(copy, qcodes, params, k, sms=sms)
    c = int(out["count"][0])
    cq, cj = out["q"][:c], out["j"][:c]
    assert (out["q"][c:] == n_q).all() and (out["j"][c:] == -7).all()  # nothing written past the count
    np.testing.assert_array_equal(out["lo"][:c], lo[cq, cj])  # the kernels' intervals, to the bit
    np.testing.assert_array_equal(out["hi"][:c], hi[cq, cj])
    assert len(set(zip(cq.tolist(), cj.tolist()))) == c  # no pair twice
    t = -np.partition(-lo, k - 1, axis=1)[:, k - 1]
    need = set(zip(*np.nonzero(hi >= t[:, None])))
    assert need <= set(zip(cq.tolist(), cj.tolist()))
    assert (_key_to_float(out["bound"]) <= t).all()  # the running bound never passes T
    keep = hi[cq, cj] >= t[cq]
    assert set(zip(cq[keep].tolist(), cj[keep].tolist())) == need


def test_without_k_every_pair_is_written_once():
    rng = np.random.default_rng(8)
    for n_q in (1, 2, 5, 16):
        x, q = _data(rng, 131, 72, n_q)
        copy, qcodes, params, lo, hi = _intervals(x, q)
        out = _emulate(copy, qcodes, params, 0)
        c = int(out["count"][0])
        assert c == n_q * 131
        grid_lo = np.full_like(lo, np.nan)
        grid_lo[out["q"][:c], out["j"][:c]] = out["lo"][:c]
        np.testing.assert_array_equal(grid_lo, lo)


def test_a_full_buffer_counts_on_and_a_second_scan_from_the_bounds_fits():
    rng = np.random.default_rng(9)
    x, q = _data(rng, 900, 48, 4)
    copy, qcodes, params, lo, hi = _intervals(x, q)
    first = _emulate(copy, qcodes, params, 20, cap=10)
    total = int(first["count"][0])
    assert total > 10 and (first["q"][:10] < 4).all()  # the first 10 slots written, the count went on
    again = _emulate(copy, qcodes, params, 20, cap=total, bound=first["bound"].copy())
    assert int(again["count"][0]) <= total
    t = -np.partition(-lo, 19, axis=1)[:, 19]
    c = int(again["count"][0])
    assert set(zip(*np.nonzero(hi >= t[:, None]))) <= set(zip(again["q"][:c].tolist(), again["j"][:c].tolist()))


def test_non_finite_bounds_never_make_a_candidate_or_a_bound():
    """A row whose bounds are NaN (no build makes one) has NaN intervals: the
    filter never keeps it and it never raises a bound (NaN fails >=)."""
    rng = np.random.default_rng(10)
    x, q = _data(rng, 400, 32, 3)
    copy = ib.build_int8(x)
    copy.rows[5] = np.nan
    qcodes, params = ib.query_terms(q, copy.width)
    out = _emulate(copy, qcodes, params, 10)
    c = int(out["count"][0])
    assert 5 not in set(out["j"][:c].tolist()) and np.isfinite(out["lo"][:c]).all()


def test_the_final_filter_on_the_device_equals_the_reference():
    """int8_cuda.final_filter (torch ops, no host wait): the slots with hi
    >= T, T the k-th largest lo of the query's candidates; free slots
    (query Q) never kept."""
    torch = pytest.importorskip("torch")
    from rcn_fast.search import int8_cuda

    rng = np.random.default_rng(11)
    x, q = _data(rng, 500, 40, 5)
    copy, qcodes, params, lo, hi = _intervals(x, q)
    for k in (1, 13, 500):
        out = _emulate(copy, qcodes, params, k, sms=3)
        keep = int8_cuda.final_filter(torch, torch.from_numpy(out["q"]), torch.from_numpy(out["lo"]),
                                      torch.from_numpy(out["hi"]), 5, k).numpy()
        c = int(out["count"][0])
        t = -np.partition(-lo, k - 1, axis=1)[:, k - 1]
        assert not keep[c:].any()
        np.testing.assert_array_equal(keep[:c], hi[out["q"][:c], out["j"][:c]] >= t[out["q"][:c]])


# ------------------------------------------------------------------ on a GPU


@requires_gpu
@pytest.mark.parametrize("n,d,n_q,k,sms", CASES)
def test_the_kernels_equal_the_emulation(n, d, n_q, k, sms):
    """The same intervals to the bit, every pair with hi >= T, the bound
    never above T (the order of the blocks differs: the candidate sets
    may)."""
    torch = pytest.importorskip("torch")
    mod = _native.cuda_module()[0]
    rng = np.random.default_rng(n + d)
    x, q = _data(rng, n, d, n_q)
    copy, qcodes, params, lo, hi = _intervals(x, q)
    k = min(k, n)
    g = copy.to("cuda")
    cap = n_q * n + 5
    bound = torch.zeros(n_q, dtype=torch.int32, device="cuda")
    cq = torch.full((cap,), n_q, dtype=torch.int32, device="cuda")
    cj = torch.zeros(cap, dtype=torch.int64, device="cuda")
    clo, chi = torch.zeros(cap, device="cuda"), torch.zeros(cap, device="cuda")
    count = torch.zeros(1, dtype=torch.int64, device="cuda")
    mod.topn_int8_scan(g.codes, g.rows, torch.from_numpy(qcodes).cuda(), torch.from_numpy(params).cuda(), k, bound,
                       cq, cj, clo, chi, count, torch.cuda.current_stream().cuda_stream)
    c = int(count.item())
    cq, cj = cq[:c].cpu().numpy(), cj[:c].cpu().numpy()
    np.testing.assert_array_equal(clo[:c].cpu().numpy(), lo[cq, cj])
    np.testing.assert_array_equal(chi[:c].cpu().numpy(), hi[cq, cj])
    t = -np.partition(-lo, k - 1, axis=1)[:, k - 1]
    assert set(zip(*np.nonzero(hi >= t[:, None]))) <= set(zip(cq.tolist(), cj.tolist()))
    assert len(set(zip(cq.tolist(), cj.tolist()))) == c
    assert (_key_to_float(bound.cpu().numpy()) <= t).all()
