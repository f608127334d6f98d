"""The subgraph vector database (SEPTA sec. 4.2): one vector per subgraph,
``g = (||h|| / ||e|| * e + h) / 2`` (eq. 9), searched by cosine with
:class:`rcn_fast.FlatIndex`."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from rcn_fast._stamped_json import read_stamped_json
from rcn_fast.search import FlatIndex
from rcn_fast.septa.align import subgraph_vectors

_FORMAT = "rcn_fast.septa.SubgraphDB/1"


class SubgraphDB:
    """Subgraph vectors + their centre nodes and texts.

    Parameters
    ----------
    vectors : float array [S, d]
        The eq. 9 vectors (use :meth:`from_embeddings` to build them from e, h).
    centres : int array [S]
        Centre node of each subgraph.
    texts : list of str, length S
        Textualised subgraphs (shown in traces).
    dtype : {"float32", "float16"}
        Storage dtype of the index.
    """

    def __init__(self, vectors: Any, centres: Sequence[int] | np.ndarray, texts: Sequence[str], *,
                 dtype: str = "float32", index: FlatIndex | None = None, norms: Any = None) -> None:
        self.centres = np.asarray(centres, dtype=np.int64)
        self.texts = list(texts)
        if index is None:
            v = np.asarray(vectors, dtype=np.float32)
            if v.ndim != 2:
                raise ValueError(f"vectors: expected [S, d], got shape {v.shape}")
            norms = np.linalg.norm(v, axis=1)
            index = FlatIndex(v.shape[1], metric="cosine", dtype=dtype)
            index.add(v)
        self.index = index
        self.norms = np.asarray(norms, dtype=np.float32) if norms is not None else np.ones(len(index), np.float32)
        if not (len(self.index) == len(self.centres) == len(self.texts)):
            raise ValueError(f"vectors, centres, texts: expected equal lengths, got {len(self.index)}, "
                             f"{len(self.centres)}, {len(self.texts)}")

    @classmethod
    def from_embeddings(cls, e: np.ndarray, h: np.ndarray, centres: Any, texts: Sequence[str],
                        dtype: str = "float32") -> "SubgraphDB":
        """Build from graph embeddings ``e`` and text embeddings ``h`` (both
        [S, d], aligned space) with eq. 9."""
        if e.shape != h.shape:
            raise ValueError(f"e, h: expected equal shapes, got {e.shape} and {h.shape}")
        return cls(subgraph_vectors(np.asarray(e, np.float32), np.asarray(h, np.float32)), centres, texts,
                   dtype=dtype)

    @property
    def dim(self) -> int:
        return self.index.dim

    def __len__(self) -> int:
        return len(self.index)

    @property
    def vectors(self) -> np.ndarray:
        """The stored (L2-normalised) vectors [S, d]."""
        return self.index.embeddings

    def get(self, ids: Any) -> np.ndarray:
        """The eq. 9 vectors (original norms) of subgraphs ``ids`` (any int
        shape; ``-1`` gives zeros) -> float32 [*ids.shape, d]."""
        ids = np.asarray(ids, dtype=np.int64)
        flat = ids.ravel()
        ok = flat >= 0
        out = np.zeros((flat.size, self.dim), dtype=np.float32)
        if ok.any():
            rows = flat[ok]
            out[ok] = np.asarray(self.vectors[rows], dtype=np.float32) * self.norms[rows, None]
        return out.reshape(*ids.shape, self.dim)

    def search(self, queries: Any, k: int, backend: str | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Top-``k`` subgraphs by cosine: scores float32 [Q, k], ids int64 [Q, k] (-1 padded)."""
        return self.index.search(queries, k, backend=backend)

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write to directory ``path`` (the FlatIndex files + centres + texts)."""
        path = Path(path)
        self.index.save(path / "index")
        np.save(path / "centres.npy", self.centres)
        np.save(path / "norms.npy", self.norms)
        with open(path / "texts.jsonl.tmp", "w") as f:
            for t in self.texts:
                f.write(json.dumps(t) + "\n")
        os.replace(path / "texts.jsonl.tmp", path / "texts.jsonl")
        (path / "db.json").write_text(json.dumps({"format": _FORMAT, "count": len(self), "dim": self.dim}) + "\n")

    @classmethod
    def load(cls, path: str | os.PathLike[str], mmap: bool = True) -> "SubgraphDB":
        path = Path(path)
        read_stamped_json(path / "db.json", _FORMAT, what="a SEPTA subgraph database")  # the format check
        with open(path / "texts.jsonl") as f:
            texts = [json.loads(line) for line in f]
        return cls(None, np.load(path / "centres.npy"), texts, index=FlatIndex.load(path / "index", mmap=mmap),
                   norms=np.load(path / "norms.npy"))
