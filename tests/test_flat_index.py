"""FlatIndex: search correctness, cosine, save/load round trip, memory mapping."""

from __future__ import annotations

import json

import numpy as np
import pytest

import rcn_fast
from rcn_fast.search import topn_reference


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("metric", ["ip", "cosine"])
def test_search_matches_reference(rng, dtype, metric):
    x = rng.standard_normal((1234, 48)).astype(np.float32) * rng.uniform(0.1, 5, (1234, 1)).astype(np.float32)
    q = rng.standard_normal((11, 48)).astype(np.float32)
    index = rcn_fast.FlatIndex(48, metric=metric, dtype=dtype)
    index.add(x[:500])
    index.add(x[500:])
    assert len(index) == 1234
    stored = x / np.linalg.norm(x, axis=1, keepdims=True) if metric == "cosine" else x
    stored = stored.astype(dtype)
    qq = q / np.linalg.norm(q, axis=1, keepdims=True) if metric == "cosine" else q
    s, i = index.search(q, 20)
    rs, ri = topn_reference(qq.astype(dtype), stored, 20)
    np.testing.assert_allclose(s, rs, rtol=1e-3 if dtype == "float16" else 1e-5, atol=1e-3)
    assert np.mean(i == ri) > 0.98
    if metric == "cosine":
        assert (s <= 1.001).all()


def test_single_query_vector_and_k_above_size():
    index = rcn_fast.FlatIndex(2)
    index.add([[1.0, 0.0], [0.0, 1.0]])
    s, i = index.search(np.array([1.0, 0.5], np.float32), 4)
    assert i.tolist() == [[0, 1, -1, -1]]


def test_save_load_roundtrip_and_mmap(tmp_path, rng):
    x = rng.standard_normal((3000, 32)).astype(np.float32)
    q = rng.standard_normal((5, 32)).astype(np.float32)
    index = rcn_fast.FlatIndex(32, metric="cosine", dtype="float16")
    index.add(x)
    expected = index.search(q, 15)
    index.save(tmp_path / "idx")
    meta = json.loads((tmp_path / "idx" / "index.json").read_text())
    assert meta["count"] == 3000 and meta["dtype"] == "float16" and meta["metric"] == "cosine"

    mm = rcn_fast.FlatIndex.load(tmp_path / "idx", mmap=True)
    assert isinstance(mm.embeddings, np.memmap)  # searched in place, not read first
    assert (len(mm), mm.dim, mm.metric, mm.dtype) == (3000, 32, "cosine", "float16")
    got = mm.search(q, 15)
    np.testing.assert_array_equal(got[0], expected[0])
    np.testing.assert_array_equal(got[1], expected[1])

    mem = rcn_fast.FlatIndex.load(tmp_path / "idx", mmap=False)
    assert not isinstance(mem.embeddings, np.memmap)
    np.testing.assert_array_equal(mem.search(q, 15)[1], expected[1])

    # adding to a loaded index keeps the old rows
    mem.add(x[:10])
    assert len(mem) == 3010 and mem.search(x[:1], 2)[1][0, 0] in (0, 3000)


def test_load_rejects_mismatched_files(tmp_path, rng):
    index = rcn_fast.FlatIndex(4)
    index.add(rng.standard_normal((10, 4)))
    index.save(tmp_path / "idx")
    meta = json.loads((tmp_path / "idx" / "index.json").read_text())
    meta["count"] = 11
    (tmp_path / "idx" / "index.json").write_text(json.dumps(meta))
    with pytest.raises(ValueError, match="index.json says"):
        rcn_fast.FlatIndex.load(tmp_path / "idx")
    with pytest.raises(FileNotFoundError, match="not a FlatIndex directory"):
        rcn_fast.FlatIndex.load(tmp_path / "nothing")


@pytest.mark.parametrize(
    "kwargs,match",
    [({"dim": 0}, "dim"), ({"dim": 3, "metric": "l2"}, "metric"), ({"dim": 3, "dtype": "int8"}, "dtype")],
)
def test_constructor_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        rcn_fast.FlatIndex(**kwargs)


def test_add_and_search_errors():
    index = rcn_fast.FlatIndex(3)
    with pytest.raises(ValueError, match="x: expected 3 columns"):
        index.add(np.zeros((2, 4), np.float32))
    with pytest.raises(ValueError, match="x: contains NaN"):
        index.add(np.array([[np.nan, 0, 0]], np.float32))
    index.add(np.zeros((2, 3), np.float32))
    with pytest.raises(ValueError, match="q: expected 3 columns"):
        index.search(np.zeros((1, 2), np.float32), 1)
    with pytest.raises(ValueError, match="k: expected k >= 1"):
        index.search(np.zeros((1, 3), np.float32), 0)
