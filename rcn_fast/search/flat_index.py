"""FlatIndex: an exact inner-product / cosine index over rcn_fast.topn.

Stored as a directory: ``index.json`` (dim, metric, dtype, count, format
version, and the size and sha256 of the matrix) and ``embeddings.npy``
(row-major [count, dim]). ``load(mmap=True)`` memory-maps the matrix, so a
large index searches without first being read into process memory.
``load`` compares the matrix with its header and the recorded size (a
truncated file is an error naming it); ``load(verify=True)`` also
recomputes the checksum. An int8 copy written beside the matrix
(:mod:`rcn_fast.search.int8_files`) is attached on ``load`` (``index.int8``)
and serves ``search(..., int8=True)`` by the exact int8 bounded scan
(:mod:`rcn_fast.search.int8_bounded`); on a GPU, pass
``Int8Corpus(rows, index.int8.to("cuda"))`` to :func:`rcn_fast.topn`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from rcn_fast import _arrays as A
from rcn_fast._file_data import read_npy
from rcn_fast._files import Folder
from rcn_fast._hashing import sha256_fd
from rcn_fast._stamped_json import read_stamped_json, write_stamped_json
from rcn_fast._validate import is_int
from rcn_fast.search.records import file_record
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
        if not is_int(dim, numpy=True) or dim < 1:
            raise ValueError(f"dim: expected a positive int, got {dim!r}")
        if metric not in _METRICS:
            raise ValueError(f"metric: expected one of {list(_METRICS)}, got {metric!r}")
        if dtype not in _DTYPES:
            raise ValueError(f"dtype: expected one of {list(_DTYPES)}, got {dtype!r}")
        self.dim, self.metric, self.dtype = int(dim), metric, dtype
        self._chunks: list[np.ndarray] = []
        self._data: np.ndarray = np.empty((0, self.dim), dtype=dtype)
        self._n = 0
        self.int8: Any = None  # the int8 copy (rcn_fast.search.int8_bounded.Int8Copy) of the rows, if loaded

    # ------------------------------------------------------------ building
    def add(self, x: Any) -> None:
        """Append vectors.

        Parameters
        ----------
        x : array [n, dim]
            Any float dtype, numpy or torch; converted to float32, then
            (``"cosine"``) normalised in float64, then stored in the index
            dtype.

        Raises
        ------
        ValueError
            Rows with NaN or infinite values, or (``dtype="float16"``)
            values beyond float16's range (``|x| > 65504``), naming the
            rows; nothing is added then.
        """
        arr = A.to_float32_numpy(A.as_array(x, "x"))
        A.check_rank(arr, 2, "x", f"[n, {self.dim}]")
        if arr.shape[1] != self.dim:
            raise ValueError(f"x: expected {self.dim} columns, got shape {arr.shape}")
        bad = ~np.isfinite(arr).all(axis=1)
        if bad.any():
            raise ValueError(f"x: contains NaN or infinite values in rows {A.row_list(bad)}")
        if self.metric == "cosine":
            arr = _normalize(arr)
        with np.errstate(over="ignore"):  # overflow is checked just below, naming the rows
            stored = arr.astype(self.dtype)
        bad = ~np.isfinite(stored).all(axis=1)
        if bad.any():
            raise ValueError(
                f"x: rows {A.row_list(bad)} hold values beyond the range of {self.dtype} (|x| > "
                f"{float(np.finfo(self.dtype).max):g}); use dtype='float32' or scale the vectors")
        self._chunks.append(stored)
        self._n += arr.shape[0]
        self.int8 = None  # the rows changed: an int8 copy of the old ones no longer bounds them

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
    def search(self, q: Any, k: int, *, backend: str | None = None,
               int8: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """Top-``k`` rows for each query.

        Parameters
        ----------
        q : array [Q, dim] or [dim]
        k : int >= 1
        backend : optional backend name for :func:`rcn_fast.topn` (a
            backend searches the rows themselves, never the int8 copy)
        int8 : bool, default False
            Search through the loaded int8 copy (exact: the bounded scan,
            :mod:`rcn_fast.search.int8_bounded`, the same ids and scores as
            the rows' own search up to float32 near-ties). Off by default:
            on the CPU the native scan of the rows is faster (200k x 768
            float16, k = 100, 2 shared cores: 118 vs 150 ms at Q = 1, 0.84
            vs 5.4 s at Q = 32). True without a copy is an error.

        Returns
        -------
        scores : float32 [Q, k]; ids : int64 [Q, k] (``-1`` padded).

        Notes
        -----
        With ``dtype="float16"`` the queries are rounded to float16 like the
        stored rows, unless that would overflow (``|q| > 65504``): then they
        are searched in float32. An empty index returns ``(-inf, -1)``.
        """
        if int8 and self.int8 is None:
            raise ValueError("int8: this index has no int8 copy; write one with "
                             "rcn_fast.search.int8_files.write_int8_copy(path) and load the index again")
        arr = A.query_matrix(q, self.dim)
        if self.metric == "cosine":
            arr = _normalize(arr)
        data = self.embeddings
        if data.dtype != np.float32:
            with np.errstate(over="ignore"):
                cast = arr.astype(data.dtype)
            if np.isfinite(cast).all() or not np.isfinite(arr).all():
                arr = cast
        if int8:
            from rcn_fast.search.int8_bounded import Int8Corpus

            return topn(arr, Int8Corpus(data, self.int8), k)
        return topn(arr, data, k, backend=backend)

    # ------------------------------------------------------------ storage
    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the index to directory ``path`` (created if needed).

        ``embeddings.npy`` is written to a temporary name and renamed into
        place; ``index.json`` (written the same way, last) records its size
        and sha256.
        """
        with Folder(path, create=True) as root:  # every file beneath its descriptor, no link followed
            tmp = f".embeddings.npy.{os.getpid()}.tmp"
            with root.open_write(tmp, "w+b") as f:
                np.save(f, np.ascontiguousarray(self.embeddings))
                f.flush()
                os.fsync(f.fileno())
                record = {"bytes": os.fstat(f.fileno()).st_size, "sha256": sha256_fd(f.fileno())}
            root.replace(tmp, "embeddings.npy")
            meta = {"format": _FORMAT, "dim": self.dim, "metric": self.metric,
                    "dtype": self.dtype, "count": len(self), "files": {"embeddings.npy": record}}
            write_stamped_json(Path(path) / "index.json", meta, root=root)

    @classmethod
    def load(cls, path: str | os.PathLike[str], mmap: bool = True, *, verify: bool = False) -> "FlatIndex":
        """Open an index written by :meth:`save` (or a corpus store directory).

        Parameters
        ----------
        path : directory
        mmap : bool
            Memory-map the embeddings (read-only) instead of reading them.
        verify : bool
            Also recompute the sha256 of ``embeddings.npy`` against the
            record in ``index.json`` (or, in a corpus store, in
            ``manifest.json``). Reads every byte.

        Raises
        ------
        FileNotFoundError
            No ``index.json`` or no ``embeddings.npy``.
        ValueError
            ``index.json`` is not valid JSON, lacks a key or holds another
            format; ``embeddings.npy`` is not a ``.npy`` file, is shorter
            than its header says (truncated), differs in size or (with
            ``verify``) checksum from the record, disagrees with
            ``index.json`` in shape or dtype, or holds NaN or infinite rows
            (named; :func:`check_finite_rows`). The message names the file.
        """
        path = Path(path)
        try:
            root = Folder(path)
        except (FileNotFoundError, NotADirectoryError):
            raise FileNotFoundError(f"path: {path} has no index.json (not a FlatIndex directory)") from None
        with root:  # every file beneath the folder's descriptor (rcn_fast._files)
            return cls._load(root, mmap=mmap, verify=verify)

    @classmethod
    def _load(cls, root: Folder, *, mmap: bool, verify: bool) -> "FlatIndex":
        path = root.path
        head = path / "index.json"
        meta = read_stamped_json(head, _FORMAT, what="a FlatIndex directory",
                                 fix="; restore it or save the index again", root=root)
        missing = [key for key in ("dim", "metric", "dtype", "count") if key not in meta]
        if missing:
            raise ValueError(f"path: {head} lacks the key(s) {missing}; restore it or save the index again")
        try:
            cls(meta["dim"], meta["metric"], meta["dtype"])  # the settings themselves
        except (TypeError, ValueError) as exc:
            raise ValueError(f"path: {head} holds an invalid setting ({exc}); restore it or save the index "
                             "again") from None
        if not is_int(meta["count"]) or meta["count"] < 0:
            raise ValueError(f"path: {head} holds count {meta['count']!r}, expected an int >= 0")
        emb = path / "embeddings.npy"
        try:
            fd = root.open_fd("embeddings.npy")
        except (FileNotFoundError, NotADirectoryError):
            raise FileNotFoundError(f"path: {path} has no embeddings.npy (the index matrix)") from None
        try:
            record = file_record(root, meta)
            size = os.fstat(fd).st_size
            if record is not None and "bytes" in record and size != int(record["bytes"]):
                raise ValueError(f"path: {emb} holds {size} bytes, the record says {record['bytes']}: truncated, "
                                 "still being written or replaced; restore it or save the index again")
            if verify:
                if record is None or "sha256" not in record:
                    raise ValueError(f"path: {head} records no checksum of embeddings.npy (saved by an older "
                                     "version), so it cannot be verified; save the index again")
                if sha256_fd(fd) != record["sha256"]:
                    raise ValueError(f"path: {emb} does not match its recorded sha256 (corrupted or replaced)")
            try:
                data = read_npy(fd, mmap=mmap, where=emb)
            except (ValueError, OSError) as exc:
                raise ValueError(f"{exc}; restore it or save the index again") from None
            if data.shape != (meta["count"], meta["dim"]) or data.dtype.name != meta["dtype"]:
                raise ValueError(
                    f"path: embeddings.npy is {data.dtype}{list(data.shape)} but index.json says "
                    f"{meta['dtype']}[{meta['count']}, {meta['dim']}]"
                )
            check_finite_rows(emb, data, "restore it or save the index again", fd=fd)
        finally:
            os.close(fd)
        index = cls(meta["dim"], meta["metric"], meta["dtype"])
        index._data, index._n = data, int(meta["count"])
        from rcn_fast.search.int8_files import load_int8_copy

        index.int8 = load_int8_copy(root, mmap=mmap, verify=verify)
        return index

    def __repr__(self) -> str:
        return f"FlatIndex(dim={self.dim}, metric={self.metric!r}, dtype={self.dtype!r}, n={len(self)})"


def check_finite_rows(path: Path, data: np.ndarray, fix: str, *, fd: int | None = None) -> None:
    """ValueError naming ``path`` and the rows when the matrix ``data``
    (read from ``path``; from the descriptor ``fd`` when given, whose
    ``fstat`` keys the memo) holds a NaN or an infinity: such a row scores
    NaN and search would silently skip it.

    Every row is scanned (in blocks, on the values' bits:
    :func:`rcn_fast._arrays.nonfinite_rows`), once per version of the
    file: a pass is remembered for the file's device, inode, size, mtime
    and ctime (:func:`rcn_fast._hashing.check_once`), so reopening an
    unchanged file costs one ``stat``. A scan rather than a recorded
    checksum: it costs about a fifth of hashing the file (what
    ``verify=True`` does; ``bench/bench_store_checks.py``), names the
    damaged rows, and needs nothing recorded at build time (stores and
    indexes written before it are checked too).
    """
    from rcn_fast._hashing import check_once

    def scan() -> None:
        bad = A.nonfinite_rows(data)
        if bad.any():
            raise ValueError(f"path: {path} holds NaN or infinite values in rows {A.row_list(bad)}: the file is "
                             f"damaged (search would skip those rows); {fix}")

    check_once(path, "finite-rows", scan, fd=fd)


def _normalize(x: np.ndarray) -> np.ndarray:
    """Rows of ``x`` float32 [n, d] scaled to unit L2 norm, computed in
    float64 (no overflow or underflow for any finite float32 row); zero rows
    stay zero. Returns float32 [n, d]."""
    x64 = x.astype(np.float64)
    with np.errstate(invalid="ignore", over="ignore"):  # a non-finite query row stays non-finite
        norms = np.sqrt(np.einsum("ij,ij->i", x64, x64))[:, None]
        return (x64 / np.where(norms > 0, norms, 1.0)).astype(np.float32)


