"""The CUDA top-n by GEMM tiles and block selects (issue 45 item 3,
rcn_fast/search/cuda_tiled.py; csrc/topn/cuda/topn_block_select.cu).

Without a GPU: the block select and the merge of its slices' lists run on
the host through rcn_fast._C's ``topn_block_select_emulated`` (the kernels'
code, csrc/topn/topn_block_select.h, with one thread as the block) against
the numpy reference, a split query's terms summed as the torch backend sums
them; the tile shapes. With a GPU (marked gpu): the whole path against the
CPU at odd sizes, several query and row tiles, every dtype.
"""

from __future__ import annotations

import numpy as np
import pytest

import rcn_fast
from rcn_fast.search import cuda_tiled
from tests.conftest import requires_gpu
from tests.test_topn_cuda_scan import _cpu as _scan_cpu
from tests.test_topn_cuda_scan import check_integer_data
from tests.test_topn_cuda_scan import _reference as _matrix_reference

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


def _cpu():
    return _scan_cpu("topn_block_select_emulated")


def _emulated(tile, terms, scales, R, k, row0, slices, round_=1024, merge_round=256):
    mod = _cpu()
    qt = tile.shape[0] // terms
    out_s, out_i = np.empty((qt, k), np.float32), np.empty((qt, k), np.int64)
    mod.topn_block_select_emulated(tile, terms, scales, R, k, row0, slices, round_, merge_round, out_s, out_i)
    return out_s, out_i


def _combined(tile, terms, scales, R):
    """The tile's scores as the torch backend sums a split query's terms:
    each term times its scale rounded to float32, then added smallest first."""
    qt = tile.shape[0] // terms
    parts = tile[:, :R].reshape(terms, qt, R).astype(np.float32)
    if terms == 1:
        return parts[0]
    sc = scales.reshape(terms, qt, 1).astype(np.float32)
    with np.errstate(invalid="ignore", over="ignore"):
        acc = (parts[-1] * sc[-1]).astype(np.float32)
        for t in range(terms - 2, -1, -1):
            acc = ((parts[t] * sc[t]).astype(np.float32) + acc).astype(np.float32)
    return acc


def _reference(scores, k, row0=0):
    s, i = _matrix_reference(scores, k)
    return s, np.where(i >= 0, i + row0, -1)


@pytest.mark.parametrize("terms", [1, 2, 3])
@pytest.mark.parametrize("Qt,R,k,slices,round_,merge_round", [
    (3, 5000, 100, 4, 1024, 256),   # the kernel's sizes
    (2, 3000, 17, 9, 64, 32),       # many slices, many flushes
    (4, 50, 64, 7, 3, 5),           # k beyond a slice and beyond R
    (1, 1, 1, 1, 1, 1),
    (2, 700, 1024, 2, 1024, 256),   # the largest k
])
def test_block_select_matches_the_reference(terms, Qt, R, k, slices, round_, merge_round):
    rng = np.random.default_rng(Qt * 100 + R + k + terms)
    tile = np.round(rng.standard_normal((terms * Qt, R + 3)), 1).astype(np.float32)  # ties; 3 unused columns
    tile[0, ::7] = np.nan
    tile[-1, ::5] = -np.inf
    tile[0, R // 2] = np.inf
    scales = (2.0 ** rng.integers(-12, 3, terms * Qt)).astype(np.float32) if terms > 1 else None
    got = _emulated(tile, terms, scales, R, k, 1000, slices, round_, merge_round)
    ref = _reference(_combined(tile, terms, scales, R), k, 1000)
    np.testing.assert_array_equal(got[1], ref[1])
    np.testing.assert_array_equal(got[0], ref[0])


@settings(max_examples=60, deadline=None)
@given(Qt=st.integers(1, 3), R=st.integers(0, 400), k=st.integers(1, 70), slices=st.integers(1, 12),
       round_=st.integers(1, 50), merge_round=st.integers(1, 50), levels=st.integers(1, 6),
       terms=st.integers(1, 3), nonfinite=st.booleans())
def test_block_select_property(Qt, R, k, slices, round_, merge_round, levels, terms, nonfinite):
    """Few distinct values (ties everywhere), NaN and infinities, any slice
    and round sizes: the ids and scores of the reference."""
    rng = np.random.default_rng(Qt * 7919 + R * 31 + k + terms)
    tile = rng.integers(0, levels, (terms * Qt, max(R, 1))).astype(np.float32)
    if nonfinite:
        tile[rng.random(tile.shape) < 0.2] = np.nan
        tile[rng.random(tile.shape) < 0.1] = -np.inf
        tile[rng.random(tile.shape) < 0.05] = np.inf
    scales = (2.0 ** rng.integers(-3, 3, terms * Qt)).astype(np.float32) if terms > 1 else None
    got = _emulated(tile, terms, scales, R, k, 7, slices, round_, merge_round)
    ref = _reference(_combined(tile, terms, scales, R), k, 7)
    np.testing.assert_array_equal(got[1], ref[1])
    np.testing.assert_array_equal(got[0], ref[0])


def test_block_select_reads_strided_tiles():
    """A tile whose rows are further apart than R (torch.mm's output of a
    narrower slice): only the first R columns count."""
    rng = np.random.default_rng(3)
    full = rng.standard_normal((4, 900)).astype(np.float32)
    full[:, 600:] = 100.0  # beyond R: never selected
    got = _emulated(full[:, :800], 1, None, 600, 10, 0, 3)
    np.testing.assert_array_equal(got[1], _reference(full[:, :600], 10)[1])


def test_block_select_names_bad_arguments():
    mod = _cpu()
    tile = np.zeros((4, 10), np.float32)
    out = np.empty((2, 3), np.float32), np.empty((2, 3), np.int64)
    with pytest.raises(ValueError, match="terms"):
        mod.topn_block_select_emulated(tile, 4, None, 10, 3, 0, 1, 8, 8, *out)
    with pytest.raises(ValueError, match="scales"):
        mod.topn_block_select_emulated(tile, 2, None, 10, 3, 0, 1, 8, 8, *out)
    with pytest.raises(ValueError, match="R: expected"):
        mod.topn_block_select_emulated(tile, 2, np.ones(4, np.float32), 11, 3, 0, 1, 8, 8, *out)
    with pytest.raises(ValueError, match="k: expected"):
        mod.topn_block_select_emulated(tile, 2, np.ones(4, np.float32), 10, 0, 0, 1, 8, 8, *out)
    with pytest.raises(ValueError, match="slices, round"):
        mod.topn_block_select_emulated(tile, 2, np.ones(4, np.float32), 10, 3, 0, 0, 8, 8, *out)
    with pytest.raises(ValueError, match="scores_out, ids_out"):
        mod.topn_block_select_emulated(tile, 1, None, 10, 3, 0, 1, 8, 8, *out)


def test_tile_shape_bounds_the_scores_and_fills_the_gpu():
    qt, rows, slices = cuda_tiled.tile_shape(512, 23_500_000, 1, 132)
    assert qt == 512 and 4 * qt * rows <= cuda_tiled.TILE_SCORE_BYTES and rows == 262_144 and slices == 1
    qt, rows, slices = cuda_tiled.tile_shape(1, 1_000_000, 1, 132)
    assert (qt, rows) == (1, 1_000_000) and slices == -(-1_000_000 // cuda_tiled.MIN_SLICE_COLS)  # one tile
    assert cuda_tiled.tile_shape(1, 23_500_000, 1, 132)[2] == 2 * 132  # slices fill the GPU
    qt, rows, slices = cuda_tiled.tile_shape(32, 1_000_000, 2, 132)  # a split float16 query: two terms
    assert 2 * 4 * qt * rows <= cuda_tiled.TILE_SCORE_BYTES and slices == -(-2 * 132 // 32)
    assert cuda_tiled.tile_shape(4096, 10, 3, 132) == (512, 10, 1)  # a tiny corpus: one slice
    qt, rows, slices = cuda_tiled.tile_shape(7, 9000, 1, 132)
    assert rows == 9000 and slices == 3  # slices of at least MIN_SLICE_COLS columns


# ------------------------------------------------------------------ on a GPU


def _tiled(q, c, k):
    from rcn_fast.search.topn import run_cuda_kernel

    return run_cuda_kernel(q, c, k, "topn_tiled")


@requires_gpu
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("qdtype", ["float32", "same"])
@pytest.mark.parametrize("Q,N,d,k", [(1, 1, 8, 1), (1, 50_003, 72, 100), (7, 30_001, 136, 17),
                                     (600, 9_001, 64, 256), (3, 5000, 768, 1024), (70, 777, 5, 5)])
def test_tiles_match_the_cpu_on_integer_data(monkeypatch, dtype, qdtype, Q, N, d, k):
    """Small integers: every product and sum is exact, so the tiles give the
    CPU's scores and ids exactly, ties (many) by lower id. Small tiles:
    several row tiles on the two streams and several query tiles."""
    monkeypatch.setattr(cuda_tiled, "TILE_SCORE_BYTES", 1 << 20)
    check_integer_data(_tiled, dtype, qdtype, Q, N, d, k)


@requires_gpu
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_tiles_on_random_data_agree_with_the_recipe(dtype):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(15)
    c = torch.from_numpy(rng.standard_normal((200_011, 128)).astype(np.float32)).to(getattr(torch, dtype)).cuda()
    q = torch.from_numpy(rng.standard_normal((1030, 128)).astype(np.float32)).cuda()
    for qq in (q, q.to(c.dtype)):
        s, i = _tiled(qq, c, 100)
        rs, ri = rcn_fast.topn(qq, c, 100, backend="torch")
        assert (i == ri).float().mean().item() >= 0.999
        torch.testing.assert_close(s, rs, rtol=1e-5, atol=1e-5)


@requires_gpu
def test_tiles_non_finite_and_strided_inputs():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(16)
    base = torch.from_numpy(rng.integers(-2, 3, (4000, 48)).astype(np.float32)).half()
    base[5, 3], base[9, 0], base[11, 1] = float("nan"), float("inf"), float("-inf")
    q = torch.from_numpy(rng.integers(1, 3, (3, 40)).astype(np.float32))
    for c in (base[:, :40], base[::2, 8:48]):
        s, i = _tiled(q.half().cuda(), c.cuda(), 30)
        rs, ri = rcn_fast.topn(q.half(), c, 30, backend="native")
        np.testing.assert_array_equal(i.cpu().numpy(), ri.numpy())
    s, i = rcn_fast.topn(q.cuda(), base[:, :40].cuda(), 30, backend="cuda")  # whichever kernel serves
    assert i.shape == (3, 30)
