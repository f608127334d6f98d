"""The Table 3 strategies of rcn_fast.sampling.sample: random, topk, mmr,
cluster (and relevance, which is sample_subsets)."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from rcn_fast.sampling import STRATEGIES, sample, sample_subsets


def _data(rng, B, n, d):
    return (rng.standard_normal((B, d)).astype(np.float32),
            rng.standard_normal((B, n, d)).astype(np.float32))


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_common_contract(strategy):
    rng = np.random.default_rng(1)
    B, n, d, N, K = 4, 11, 6, 5, 4
    q, c = _data(rng, B, n, d)
    valid = np.array([11, 3, 0, 7])
    ids = sample(strategy, q, c, N, K, seed=3, valid=valid)
    assert ids.shape == (B, N, K) and ids.dtype == np.int64
    for b in range(B):
        real = ids[b] >= 0
        assert (real.sum(-1) == min(valid[b], K)).all()
        assert (ids[b][real] < valid[b]).all()
        for row in ids[b]:
            r = row[row >= 0]
            assert len(set(r.tolist())) == len(r)  # no repeats inside a subset
    # deterministic, and a question does not depend on its batch
    assert (ids == sample(strategy, q, c, N, K, seed=3, valid=valid)).all()
    alone = sample(strategy, q[3:], c[3:], N, K, seed=3, valid=valid[3:], keys=np.array([3]))
    assert (alone[0] == ids[3]).all()
    # empty batch, no candidates
    assert sample(strategy, q[:0], c[:0], N, K).shape == (0, N, K)
    assert (sample(strategy, q, c[:, :0], N, K) == -1).all()


def test_relevance_is_sample_subsets():
    rng = np.random.default_rng(2)
    q, c = _data(rng, 3, 9, 5)
    a = sample("relevance", q, c, 4, 3, seed=5, tau=0.5, first="relevance")
    b = sample_subsets(q, c, 4, 3, seed=5, tau=0.5, first="relevance")
    assert (a == b).all()


def test_random_is_uniform_without_replacement():
    rng = np.random.default_rng(3)
    n, K, N = 7, 3, 21_000
    q, c = _data(rng, 1, n, 4)
    ids = sample("random", q, c, N, K, seed=9)[0]
    # every ordered triple equally likely: 7 * 6 * 5 = 210 cells of 100
    code = ids[:, 0] * 49 + ids[:, 1] * 7 + ids[:, 2]
    _, counts = np.unique(code, return_counts=True)
    assert counts.size == 210
    assert stats.chisquare(counts).pvalue > 1e-3
    # it ignores the embeddings
    assert (ids == sample("random", q * 5, c[:, ::-1], N, K, seed=9)[0]).all()


def test_topk_order_ties_and_identical_subsets():
    q = np.array([[1.0, 0.0]], np.float32)
    c = np.array([[[0.5, 0], [0.9, 0], [0.5, 1], [0.1, 0], [0.9, 3]]], np.float32)
    ids = sample("topk", q, c, 3, 4)
    assert ids[0].tolist() == [[1, 4, 0, 2]] * 3  # ties: lower index first
    rng = np.random.default_rng(4)
    q, c = _data(rng, 5, 30, 8)
    ids = sample("topk", q, c, 2, 6)
    rel = np.einsum("bd,bnd->bn", q, c)
    assert (ids[:, 0] == np.argsort(-rel, axis=1, kind="stable")[:, :6]).all()
    assert (ids[:, 0] == ids[:, 1]).all()


def test_mmr_lambda_one_is_topk_and_redundancy_is_penalised():
    rng = np.random.default_rng(5)
    q, c = _data(rng, 3, 15, 8)
    assert (sample("mmr", q, c, 2, 5, mmr_lambda=1.0) == sample("topk", q, c, 2, 5)).all()
    # two copies of the most relevant document: top-k takes both, MMR one
    q = np.array([[1.0, 0.0, 0.0]], np.float32)
    c = np.array([[[1.0, 0.2, 0.0], [1.0, 0.2, 0.0], [0.6, 0.0, 0.8], [0.7, -0.7, 0.0]]], np.float32)
    assert sample("topk", q, c, 1, 2)[0, 0].tolist() == [0, 1]
    assert sample("mmr", q, c, 1, 2, mmr_lambda=0.5)[0, 0].tolist() == [0, 3]
    with pytest.raises(ValueError, match="mmr_lambda"):
        sample("mmr", q, c, 1, 2, mmr_lambda=1.5)


def test_cluster_takes_one_per_cluster_in_relevance_order():
    rng = np.random.default_rng(6)
    d, per = 6, 8
    centres = np.eye(d, dtype=np.float32)[:3] * 10  # three far-apart blobs
    pts = np.concatenate([ctr + 0.1 * rng.standard_normal((per, d)) for ctr in centres]).astype(np.float32)
    perm = rng.permutation(len(pts))
    c = pts[perm][None]
    blob = (np.arange(len(pts)) // per)[perm]
    q = np.array([[0.5, 3.0, -1.0, 0, 0, 0]], np.float32)  # blob 1 > blob 0 > blob 2
    ids = sample("cluster", q, c, 40, 3, seed=2)[0]
    assert (blob[ids] == np.array([1, 0, 2])).all()
    assert len({tuple(r) for r in ids.tolist()}) > 10  # members drawn per subset
    # fewer candidates than clusters: each valid candidate once
    few = sample("cluster", q, c, 4, 3, valid=np.array([2]))[0]
    assert (np.sort(few[:, :2], axis=1) == [0, 1]).all() and (few[:, 2] == -1).all()


def test_strategy_errors():
    rng = np.random.default_rng(7)
    q, c = _data(rng, 2, 5, 3)
    with pytest.raises(ValueError, match="strategy"):
        sample("greedy", q, c, 2, 2)
    with pytest.raises(ValueError, match="subset_size"):
        sample("topk", q, c, 2, 0)
    with pytest.raises(ValueError, match="query_emb"):
        sample("cluster", q[:1], c, 2, 2)
    bad = c.copy()
    bad[1, 2, 0] = np.nan
    with pytest.raises(ValueError, match="cand_emb: question 1, candidate 2"):
        sample("mmr", q, bad, 2, 2)
    assert (sample("mmr", q, bad, 2, 2, valid=np.array([5, 2]))[1] < 2).all()


def test_torch_in_torch_out():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(8)
    q, c = _data(rng, 2, 9, 4)
    for s in STRATEGIES:
        out = sample(s, torch.from_numpy(q), torch.from_numpy(c).to(torch.bfloat16), 3, 2, seed=1)
        assert isinstance(out, torch.Tensor) and out.dtype == torch.int64 and out.shape == (2, 3, 2)
