"""The CUDA tiled kernel (version 1, csrc/topn/cuda/topn.cu: the fallback
for a float32 corpus, k > 256, d % 8 != 0 or unaligned rows) without a GPU:
its merge of a chunk into the running lists (a radix select on
``topn_key``, csrc/topn/topn_order.h) run on the host by
``rcn_fast._C.topn_tiled_merge_emulated``, chunk after chunk, against the
numpy reference.

Issue 55, W2: ``topn_key`` gave -0.0 and +0.0 different keys, while the
ordering rule (``topn_better``, the reference) treats them as equal scores
ordered by id; where zeros of both signs straddled the k-th place the
kernel kept the +0.0 row over a -0.0 row of lower id.
"""

from __future__ import annotations

import numpy as np
import pytest

from rcn_fast.search.reference import select_topn
from tests.test_topn_cuda_scan import _cpu


def _run(scores: np.ndarray, k: int, chunk: int) -> tuple[np.ndarray, np.ndarray]:
    """The kernel's scan over score columns in chunks of ``chunk``."""
    mod = _cpu("topn_tiled_merge_emulated")
    Q, N = scores.shape
    run_s = np.full((Q, k), -np.inf, np.float32)
    run_i = np.full((Q, k), -1, np.int64)
    for r0 in range(0, N, chunk):
        part = np.ascontiguousarray(scores[:, r0 : r0 + chunk], np.float32)
        next_s, next_i = np.empty_like(run_s), np.empty_like(run_i)
        mod.topn_tiled_merge_emulated(run_s, run_i, part, r0, next_s, next_i)
        run_s, run_i = next_s, next_i
    return run_s, run_i


def _reference(scores, k):
    ids = np.broadcast_to(np.arange(scores.shape[1], dtype=np.int64), scores.shape)
    return select_topn(scores.astype(np.float32), ids, k)


def _same(got, ref):
    np.testing.assert_array_equal(got[1], ref[1])
    np.testing.assert_array_equal(got[0], ref[0])


@pytest.mark.parametrize("chunk", [3, 100])
def test_zeros_of_both_signs_across_the_kth_place_keep_the_lower_id(chunk):
    """-0.0 at ids 1 and 4, +0.0 at ids 2 and 6: all four tie; with k = 3
    (one above them) the two lowest ids, 1 and 2, are kept, whatever sign."""
    s = np.array([[1.0, -0.0, 0.0, -1.0, -0.0, -2.0, 0.0]], np.float32)
    got = _run(s, 3, chunk)
    _same(got, _reference(s, 3))
    assert got[1].tolist() == [[0, 1, 2]]
    # +0.0 first, then -0.0 at a lower id than another +0.0
    s2 = np.array([[0.0, 5.0, -0.0, 0.0, -0.0]], np.float32)
    _same(_run(s2, 2, chunk), _reference(s2, 2))
    assert _run(s2, 3, chunk)[1].tolist() == [[1, 0, 2]]


@pytest.mark.parametrize("k", [1, 5, 64, 1024])
def test_the_merge_equals_the_reference_on_ties_nan_inf_and_signed_zeros(k):
    rng = np.random.default_rng(k)
    Q, N = 4, 3000
    s = rng.integers(-3, 4, (Q, N)).astype(np.float32)  # many ties
    s[s == 0] = np.where(rng.random(int((s == 0).sum())) < 0.5, -0.0, 0.0)
    s[0, ::7] = np.nan
    s[1, ::11] = -np.inf
    s[2, ::13] = np.inf
    s[3] = rng.standard_normal(N).astype(np.float32)
    for chunk in (1, 97, 1024, N):
        _same(_run(s, k, chunk), _reference(s, k))


def test_fewer_admissible_scores_than_k_pad_with_minus_inf():
    s = np.full((2, 10), np.nan, np.float32)
    s[0, 3], s[1, 7] = -0.0, 2.0
    got = _run(s, 4, 4)
    _same(got, _reference(s, 4))
    assert got[1].tolist() == [[3, -1, -1, -1], [7, -1, -1, -1]]
