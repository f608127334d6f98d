"""The vector indexes a :class:`~rcn_fast.retrieval.Retriever` searches,
with one contract (:class:`~rcn_fast.retrieval.protocols.VectorIndex`):
``search(q, k)`` -> scores float32 [Q, k], rows int64 [Q, k], best first,
``(-inf, -1)`` padded beyond the rows held.

* :class:`FlatIndex` (:mod:`rcn_fast.search`): exact, over the
  memory-mapped embeddings of a store (``CorpusStore.index()``).
* :class:`FaissIndex`: a faiss index (IVF, PQ, ...) over the same store,
  trained once on a sample, filled in chunks, saved in the store directory
  and memory-mapped back on later loads (:meth:`FaissIndex.build`).

The retriever is handed its index; it never builds one.
"""

from __future__ import annotations

import glob
import hashlib
import json
import logging
import os
import re
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator

import numpy as np

from rcn_fast import _arrays as A
from rcn_fast._arrays import require
from rcn_fast._file_data import fd_path, read_fd
from rcn_fast._files import Folder, open_fd
from rcn_fast._validate import check_k, is_int
from rcn_fast.search import FlatIndex
from rcn_fast.search.topn import check_result_memory

if TYPE_CHECKING:
    from rcn_fast.retrieval.store import CorpusStore

logger = logging.getLogger("rcn_fast.retrieval")


class FaissIndex:
    """A faiss inner-product index behind :class:`FlatIndex`'s ``search``.

    Parameters
    ----------
    index : faiss.Index
        Row ``i`` of the store is faiss id ``i``.
    path : pathlib.Path, optional
        The file the index was loaded from or saved to (None: in memory
        only, e.g. an exact ``"Flat"`` index).

    Examples
    --------
    >>> store = CorpusStore.open("corpus_dir")                                   # doctest: +SKIP
    >>> idx = FaissIndex.build(store, "IVF4096,PQ64", nprobe=32)                 # doctest: +SKIP
    >>> Retriever(encoder, store, idx).retrieve(["why is the sky blue?"], k=5)   # doctest: +SKIP
    """

    def __init__(self, index: Any, *, path: Path | None = None) -> None:
        if not hasattr(index, "search") or not hasattr(index, "ntotal"):
            raise TypeError(f"index: expected a faiss.Index, got {type(index).__name__}")
        self.index = index
        self.path = path

    @classmethod
    def build(cls, store: "CorpusStore", factory: str = "Flat", *, nprobe: int = 16,
              train_size: int | None = None, index_dir: str | os.PathLike[str] | None = None,
              seed: int = 0) -> "FaissIndex":
        """The faiss index ``factory`` over ``store``'s embeddings, trained
        and saved once, reused after (see :func:`faiss_index` for every
        parameter)."""
        index, path = faiss_index(store, factory, nprobe=nprobe, train_size=train_size, index_dir=index_dir,
                                  seed=seed)
        return cls(index, path=path)

    def __len__(self) -> int:
        return int(self.index.ntotal)

    @property
    def dim(self) -> int:
        """Vector width ``d``."""
        return int(self.index.d)

    def search(self, q: Any, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Top-``k`` rows for each query.

        Parameters
        ----------
        q : float array [Q, d] (or [d])
        k : int >= 1

        Returns
        -------
        scores : float32 [Q, k]; rows : int64 [Q, k]. faiss is asked for
            at most as many rows as it holds; the columns beyond are
            ``(-inf, -1)`` (MemoryError naming ``k`` when the [Q, k]
            results cannot be allocated).
        """
        k = check_k(k)
        arr = A.query_matrix(q, self.dim)
        n = len(self)
        kk = min(k, n)
        if kk == k:
            scores, ids = self.index.search(np.ascontiguousarray(arr), kk)
            return scores.astype(np.float32), ids.astype(np.int64)
        check_result_memory(len(arr), n, k)
        out_s = np.full((len(arr), k), -np.inf, np.float32)
        out_i = np.full((len(arr), k), -1, np.int64)
        if kk:
            scores, ids = self.index.search(np.ascontiguousarray(arr), kk)
            out_s[:, :kk], out_i[:, :kk] = scores, ids
        return out_s, out_i

    def __repr__(self) -> str:
        return f"FaissIndex({type(self.index).__name__}, ntotal={len(self)}, dim={self.dim}, path={self.path})"


_FAISS_HINT = "pip install 'rcn_fast[faiss]'  (faiss-cpu)"
_FAISS_FORMAT = "rcn_fast.FaissIndex/1"
_ADD_CHUNK_BYTES = 1 << 28  # float32 rows converted and added per step


def _ivf_of(faiss: Any, index: Any) -> Any | None:
    try:
        return faiss.extract_index_ivf(index)
    except Exception:  # not an IVF index
        return None


def _read_rows(emb: np.ndarray, rows: np.ndarray | None, chunk: int) -> Iterator[np.ndarray]:
    """float32 C-contiguous blocks of ``emb`` (all rows, or the sorted
    ``rows``), at most ``chunk`` rows each, read from the memory map."""
    n = len(emb) if rows is None else len(rows)
    for start in range(0, n, chunk):
        block = emb[start:start + chunk] if rows is None else emb[rows[start:start + chunk]]
        yield np.ascontiguousarray(block, dtype=np.float32)


def faiss_index(store: "CorpusStore", factory: str = "Flat", *, nprobe: int = 16, train_size: int | None = None,
                index_dir: str | os.PathLike[str] | None = None, seed: int = 0) -> tuple[Any, Path | None]:
    """A faiss inner-product index over a store's embeddings, built once and
    reused.

    The index is built without holding the corpus in memory: a training
    sample (``train_size`` rows chosen with ``seed``, read in row order from
    the memory-mapped store) trains it, then every row is added in chunks of
    about 256 MB of float32. It is saved as
    ``<index_dir>/<factory>-<key>.faiss`` where the key hashes the factory,
    the training size and seed and the store's manifest, so a rebuilt store
    or another factory builds a new index; later calls memory-map the saved
    file (``faiss.IO_FLAG_MMAP`` for IVF indexes, ``IO_FLAG_MMAP_IFC`` for
    flat-code indexes such as PQ) instead of training again. Exact
    ``"Flat"`` indexes need no training and are not saved (the native
    backend already searches the memory-mapped store exactly).

    Parameters
    ----------
    store : CorpusStore
    factory : str
        faiss ``index_factory`` string, built with ``METRIC_INNER_PRODUCT``.
    nprobe : int
        IVF lists visited per query (ignored by non-IVF indexes).
    train_size : int, optional
        Training rows; default ``max(256 * nlist, 65536)`` (as many points
        as faiss's k-means would sample for the coarse quantizer and for
        8-bit PQ codebooks), at most the corpus size.
    index_dir : path, optional
        Where the index is saved (default ``<store>/faiss``). When it
        cannot be written the index is kept in memory only (logged).
    seed : int
        Seed of the training sample.

    Returns
    -------
    (faiss.Index, pathlib.Path or None)
        The index (row ``i`` of the store is faiss id ``i``) and the file
        it was loaded from or saved to.
    """
    faiss = require("faiss", _FAISS_HINT)
    if not isinstance(factory, str) or not factory.strip():
        raise ValueError(f"faiss_factory: expected a faiss index_factory string, got {factory!r}")
    check_k(nprobe, "nprobe")
    if train_size is not None and (not is_int(train_size, numpy=True)
                                   or train_size < 1):
        raise ValueError(f"faiss_train_size: expected a positive int or None, got {train_size!r}")
    n, dim = len(store), store.dim
    try:
        index = faiss.index_factory(dim, factory, faiss.METRIC_INNER_PRODUCT)
    except RuntimeError as exc:
        raise ValueError(f"faiss_factory: faiss cannot build {factory!r} for dim {dim}: "
                         f"{str(exc).strip().splitlines()[-1]}") from exc
    chunk = max(1024, _ADD_CHUNK_BYTES // (4 * dim))
    if index.is_trained and isinstance(index, faiss.IndexFlat):
        for block in _read_rows(store.embeddings, None, chunk):
            index.add(block)
        return index, None

    ivf = _ivf_of(faiss, index)
    nlist = int(ivf.nlist) if ivf is not None else 0
    m = int(train_size) if train_size is not None else max(256 * nlist, 65536)
    m = min(m, n)
    key_src = json.dumps({"format": _FAISS_FORMAT, "factory": factory, "metric": "ip", "train_size": m,
                          "seed": seed, "manifest": hashlib.sha256(json.dumps(store.manifest, sort_keys=True)
                                                                   .encode()).hexdigest()}, sort_keys=True)
    key = hashlib.sha256(key_src.encode()).hexdigest()[:16]
    slug = re.sub(r"[^A-Za-z0-9_.-]+", "_", factory).strip("_") or "index"
    root = Path(index_dir) if index_dir is not None else store.path / "faiss"
    path = root / f"{slug}-{key}.faiss"

    loaded, flag = _read_faiss(faiss, root, path.name, ivf is not None)
    if loaded is not None:
        if loaded.ntotal != n or loaded.d != dim:
            raise ValueError(f"faiss_index_dir: {path} holds {loaded.ntotal} vectors of dim {loaded.d}, the store "
                             f"{n} of dim {dim}; delete the file to rebuild it")
        _set_nprobe(faiss, loaded, nprobe)
        logger.info("loaded faiss index %s from %s (%s, not retrained)", factory, path,
                    "memory-mapped" if flag else "read into memory")
        return loaded, path

    if not index.is_trained:
        rows = None if m == n else np.sort(np.random.default_rng(seed).choice(n, size=m, replace=False))
        sample = np.concatenate(list(_read_rows(store.embeddings, rows, chunk)), axis=0)
        logger.warning("training faiss index %s on %d of %d rows (one time; saved to %s) ...", factory, m, n, path)
        t0 = time.perf_counter()
        try:
            index.train(sample)
        except RuntimeError as exc:
            raise ValueError(
                f"faiss_factory: training {factory!r} on {m} rows failed ({str(exc).strip().splitlines()[-1]}); "
                "use fewer centroids (a smaller IVF nlist, 'PQ<M>x4' codes) or more rows (faiss_train_size)"
            ) from exc
        del sample
        logger.info("faiss training done in %.1f s", time.perf_counter() - t0)
    for block in _read_rows(store.embeddings, None, chunk):
        index.add(block)
    _set_nprobe(faiss, index, nprobe)
    try:
        with Folder(root, create=True, what="faiss_index_dir") as folder:  # beneath its descriptor, no link followed
            tmp = f".{path.name}.{os.getpid()}.tmp"
            with folder.open_write(tmp, "wb") as f:
                f.write(memoryview(faiss.serialize_index(index)))
            folder.replace(tmp, path.name)
            folder.write_atomic(f"{path.name}.json", json.dumps(
                {"format": _FAISS_FORMAT, "key": json.loads(key_src), "ntotal": int(index.ntotal), "dim": dim,
                 "faiss": getattr(faiss, "__version__", None)}, indent=2) + "\n")
            for old in folder.glob(f"{glob.escape(slug)}-*.faiss"):  # same factory, an earlier store or sample
                if old != path.name:
                    folder.unlink(old)
                    folder.unlink(f"{old}.json")
        logger.info("saved faiss index %s to %s", factory, path)
    except OSError as exc:
        logger.warning("could not save the faiss index to %s (%s); it is kept in memory only and will be "
                       "trained again at the next load (pass faiss_index_dir= a writable directory)", path, exc)
        return index, None
    return index, path


def _read_faiss(faiss: Any, root: Path, name: str, ivf: bool) -> tuple[Any, int]:
    """(the saved index ``root/name`` or None when there is none, the read flag): opened beneath the
    folder's descriptor (files door) and read from that descriptor -- memory-mapped through its
    ``/proc/self/fd`` path where the platform has one, else read into memory."""
    try:
        fd = open_fd(root, name, what="faiss_index_dir")
    except (FileNotFoundError, NotADirectoryError):
        return None, 0
    try:
        path = fd_path(fd)
        flag = (faiss.IO_FLAG_MMAP if ivf else getattr(faiss, "IO_FLAG_MMAP_IFC", 0)) if path else 0
        if path and flag:
            try:
                return faiss.read_index(path, flag), flag
            except RuntimeError:  # this faiss cannot memory-map the type: read it
                pass
        return faiss.deserialize_index(np.frombuffer(read_fd(fd), dtype=np.uint8)), 0
    finally:
        os.close(fd)


def _set_nprobe(faiss: Any, index: Any, nprobe: int) -> None:
    ivf = _ivf_of(faiss, index)
    if ivf is not None:
        ivf.nprobe = min(int(nprobe), int(ivf.nlist))


__all__ = ["FaissIndex", "FlatIndex", "faiss_index"]
