"""Helpers for the SEPTA tests: a deterministic bag-of-words text encoder
(a test double standing in for precomputed frozen-encoder embeddings) and
small knowledge graphs with word-like node names."""

from __future__ import annotations

import hashlib
import re
from typing import Any, Sequence

import numpy as np

from rcn_fast.kg import KnowledgeGraph


class BagOfWordsEncoder:
    """Sum of fixed random word vectors, L2-normalised (float32 [n, dim]).

    Implements the encoder interface SEPTA uses (``dim``,
    ``encode_queries``, ``encode_passages``, ``describe``)."""

    def __init__(self, dim: int = 64, seed: int = 0) -> None:
        self._dim, self.seed = dim, seed
        self._cache: dict[str, np.ndarray] = {}

    @property
    def dim(self) -> int:
        return self._dim

    def _word(self, w: str) -> np.ndarray:
        v = self._cache.get(w)
        if v is None:
            s = int.from_bytes(hashlib.blake2b(f"{self.seed}:{w}".encode(), digest_size=8).digest(), "little")
            v = np.random.default_rng(s).standard_normal(self._dim).astype(np.float32)
            self._cache[w] = v
        return v

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        out = np.zeros((len(texts), self._dim), dtype=np.float32)
        for i, t in enumerate(texts):
            for w in re.findall(r"[a-z0-9]+", t.lower()):
                out[i] += self._word(w)
        n = np.linalg.norm(out, axis=1, keepdims=True)
        return out / np.where(n > 0, n, 1.0)

    def encode_queries(self, texts: Sequence[str], batch_size: int | None = None, **kw: Any) -> np.ndarray:
        return self.encode(texts)

    def encode_passages(self, texts: Sequence[str], batch_size: int | None = None, **kw: Any) -> np.ndarray:
        return self.encode(texts)

    def describe(self) -> dict[str, Any]:
        return {"model": "bag-of-words", "dim": self._dim, "seed": self.seed}


def word_graph(num_nodes: int = 600, num_edges: int = 2000, seed: int = 0) -> KnowledgeGraph:
    """A random graph whose nodes are named by distinct pseudo-words and whose
    relations have templates."""
    rng = np.random.default_rng(seed)
    syll = ["ka", "lo", "mi", "tu", "re", "so", "na", "vi", "po", "de", "gu", "ze"]
    names: list[str] = []
    seen = set()
    while len(names) < num_nodes:
        w = "".join(rng.choice(syll, size=3))
        if w not in seen:
            seen.add(w)
            names.append(w)
    rels = ["is_a", "part_of", "used_for", "at_location", "capable_of", "has_property"]
    h = rng.integers(0, num_nodes, num_edges)
    t = rng.integers(0, num_nodes, num_edges)
    r = rng.integers(0, len(rels), num_edges)
    return KnowledgeGraph(names, rels, h, r, t, source="test-words")


try:
    import pytest

    @pytest.fixture(autouse=True)
    def one_torch_thread():
        """Run each SEPTA test with one torch thread (tiny models; on busy
        shared cores, spinning OpenMP workers make them far slower)."""
        from tests.torch_state import pinned_torch_threads

        with pinned_torch_threads(1):
            yield
except ImportError:  # pragma: no cover
    pass
