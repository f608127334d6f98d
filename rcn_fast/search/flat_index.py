"""FlatIndex: an exact inner-product / cosine index over rcn_fast.topn.

Stored as a directory: ``index.json`` (dim, metric, dtype, count, format
version) and ``embeddings.npy`` (row-major [count, dim]). ``load(mmap=True)``
memory-maps the matrix, so a large index searches without first being read
into process memory.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from rcn_fast import _arrays as A
from rcn_fast.search.topn import topn

_FORMAT = "rcn_fast.FlatIndex/1"
_METRICS = ("ip", "cosine")
_DTYPES = ("float32", "float16")


class FlatIndex:
    """Exact search over a flat matrix of embeddings.

    Parameters
    ----------
    dim : int
        Embedding width ``d``.
    metric : {"ip", "cosine"}
        ``"cosine"`` L2-normalises vectors on ``add`` and queries on
        ``search`` (zero vectors stay zero).
    dtype : {"float32", "float16"}
        Storage dtype of the embeddings; scores are accumulated in float32.

    Examples
    --------
    >>> import numpy as np, rcn_fast
    >>> index = rcn_fast.FlatIndex(3, metric="cosine")
    >>> index.add(np.array([[1, 0, 0], [0, 2, 0]], dtype=np.float32))
    >>> scores, ids = index.search(np.array([[0, 1, 0]], dtype=np.float32), k=1)
    >>> ids.tolist(), scores.tolist()
    ([[1]], [[1.0]])
    """

    def __init__(self, dim: int, metric: str = "ip", dtype: str = "float32") -> None:
        if isinstance(dim, bool) or not isinstance(dim, (int, np.integer)) or dim < 1:
            raise ValueError(f"dim: expected a positive int, got {dim!r}")
        if metric not in _METRICS:
            raise ValueError(f"metric: expected one of {list(_METRICS)}, got {metric!r}")
        if dtype not in _DTYPES:
            raise ValueError(f"dtype: expected one of {list(_DTYPES)}, got {dtype!r}")
        self.dim, self.metric, self.dtype = int(dim), metric, dtype
        self._chunks: list[np.ndarray] = []
        self._data: np.ndarray = np.empty((0, self.dim), dtype=dtype)
        self._n = 0

    # ------------------------------------------------------------ building
    def add(self, x: Any) -> None:
        """Append vectors.

        Parameters
        ----------
        x : array [n, dim]
            Any float dtype, numpy or torch; converted to the index dtype.
            Non-finite values raise ValueError.
        """
        arr = A.to_float32_numpy(A.as_array(x, "x"))
        A.check_rank(arr, 2, "x", f"[n, {self.dim}]")
        if arr.shape[1] != self.dim:
            raise ValueError(f"x: expected {self.dim} columns, got shape {arr.shape}")
        if not np.isfinite(arr).all():
            raise ValueError("x: contains NaN or infinite values")
        if self.metric == "cosine":
            arr = _normalize(arr)
        self._chunks.append(arr.astype(self.dtype))
        self._n += arr.shape[0]

    def __len__(self) -> int:
        return self._n

    @property
    def embeddings(self) -> np.ndarray:
        """The stored matrix [len(self), dim] (a memory map after ``load(mmap=True)``)."""
        if self._chunks:
            parts = ([self._data] if len(self._data) else []) + self._chunks
            self._data = np.concatenate(parts, axis=0) if len(parts) > 1 else parts[0]
            self._chunks = []
        return self._data

    # ------------------------------------------------------------ searching
    def search(self, q: Any, k: int, *, backend: str | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Top-``k`` rows for each query.

        Parameters
        ----------
        q : array [Q, dim] or [dim]
        k : int >= 1
        backend : optional backend name for :func:`rcn_fast.topn`

        Returns
        -------
        scores : float32 [Q, k]; ids : int64 [Q, k] (``-1`` padded).
        """
        arr = A.to_float32_numpy(A.as_array(q, "q"))
        if arr.ndim == 1:
            arr = arr[None, :]
        A.check_rank(arr, 2, "q", f"[Q, {self.dim}]")
        if arr.shape[1] != self.dim:
            raise ValueError(f"q: expected {self.dim} columns, got shape {arr.shape}")
        if self.metric == "cosine":
            arr = _normalize(arr)
        data = self.embeddings
        if data.dtype != np.float32:
            arr = arr.astype(data.dtype)
        return topn(arr, data, k, backend=backend)

    # ------------------------------------------------------------ storage
    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the index to directory ``path`` (created if needed)."""
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        tmp = path / "embeddings.npy.tmp"
        with open(tmp, "wb") as f:
            np.save(f, np.ascontiguousarray(self.embeddings))
        os.replace(tmp, path / "embeddings.npy")
        meta = {"format": _FORMAT, "dim": self.dim, "metric": self.metric,
                "dtype": self.dtype, "count": len(self)}
        (path / "index.json").write_text(json.dumps(meta, indent=2) + "\n")

    @classmethod
    def load(cls, path: str | os.PathLike[str], mmap: bool = True) -> "FlatIndex":
        """Open an index written by :meth:`save`.

        Parameters
        ----------
        path : directory
        mmap : bool
            Memory-map the embeddings (read-only) instead of reading them.
        """
        path = Path(path)
        try:
            meta = json.loads((path / "index.json").read_text())
        except FileNotFoundError:
            raise FileNotFoundError(f"path: {path} has no index.json (not a FlatIndex directory)") from None
        if meta.get("format") != _FORMAT:
            raise ValueError(f"path: {path} holds format {meta.get('format')!r}, expected {_FORMAT!r}")
        data = np.load(path / "embeddings.npy", mmap_mode="r" if mmap else None)
        if data.shape != (meta["count"], meta["dim"]) or data.dtype.name != meta["dtype"]:
            raise ValueError(
                f"path: embeddings.npy is {data.dtype}{list(data.shape)} but index.json says "
                f"{meta['dtype']}[{meta['count']}, {meta['dim']}]"
            )
        index = cls(meta["dim"], meta["metric"], meta["dtype"])
        index._data, index._n = data, int(meta["count"])
        return index

    def __repr__(self) -> str:
        return f"FlatIndex(dim={self.dim}, metric={self.metric!r}, dtype={self.dtype!r}, n={len(self)})"


def _normalize(x: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    return x / np.where(norms > 0, norms, 1.0)
