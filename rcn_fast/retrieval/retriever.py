"""Retriever = Encoder + index + corpus store, batch first."""

from __future__ import annotations

import glob
import hashlib
import json
import logging
import os
import re
import time
from pathlib import Path
from typing import Any, Iterator, Protocol, Sequence, runtime_checkable

import numpy as np

from rcn_fast import _arrays as A
from rcn_fast._arrays import require
from rcn_fast.retrieval.store import CorpusStore
from rcn_fast.search.topn import check_result_memory
from rcn_fast.retrieval.types import Passage
from rcn_fast._validate import check_k, check_texts, is_int

logger = logging.getLogger("rcn_fast.retrieval")
_BACKENDS = ("native", "faiss")
# settings an encoder must share with the store's manifest to search it
_MATCH_KEYS = ("fingerprint", "pooling", "normalize", "query_prefix", "passage_prefix", "dim")


@runtime_checkable
class RetrieverLike(Protocol):
    """Anything that maps a batch of queries to ranked passages."""

    def retrieve(self, queries: Sequence[str], k: int = 5) -> list[list[Passage]]: ...


class Retriever:
    """Dense retrieval over a corpus store.

    Parameters
    ----------
    encoder : EncoderLike or None
        Encodes queries; None allows only :meth:`retrieve_embeddings`.
    store : CorpusStore
    backend : {"native", "faiss"}
        ``"native"`` (default): the exact :class:`rcn_fast.FlatIndex` over
        the memory-mapped embeddings. ``"faiss"``: a faiss index built from
        ``faiss_factory`` over the same store, for corpora past one
        machine's memory (``"IVF4096,PQ64"``: a compressed IVF-PQ index,
        ``"PQ64"``, ``"IVF1024,Flat"``, ...). See :func:`faiss_index`:
        it is trained on a sample, filled in chunks from the memory-mapped
        store, saved in the store directory and memory-mapped back on later
        loads.
    dedup : bool
        Default of ``retrieve(..., dedup=)``: drop passages whose text
        equals a higher-ranked one.
    faiss_factory : str
        faiss ``index_factory`` string (backend ``"faiss"`` only).
    nprobe : int
        IVF lists visited per query (faiss IVF indexes only).
    faiss_train_size : int, optional
        Training sample of a faiss index that needs training (default:
        ``max(256 * nlist, 65536)`` rows, at most the corpus).
    faiss_index_dir : path, optional
        Where trained faiss indexes are saved (default: ``faiss/`` inside
        the store directory).

    Attributes
    ----------
    index : FlatIndex or faiss.Index
    index_path : pathlib.Path or None
        The saved faiss index file in use (None for the native backend and
        for exact ``"Flat"`` faiss indexes, which are not saved).

    Examples
    --------
    >>> r = Retriever.load("corpus_dir")                     # doctest: +SKIP
    >>> r.retrieve(["what makes plants grow?"], k=3)[0][0]    # doctest: +SKIP
    Passage(id='f12', text='plants need sunlight to grow', score=0.83, meta={'row': 11})
    >>> big = Retriever.load("corpus_dir", backend="faiss", faiss_factory="IVF4096,PQ64", nprobe=32)  # doctest: +SKIP
    """

    def __init__(self, encoder: Any, store: CorpusStore, *, backend: str = "native", dedup: bool = False,
                 faiss_factory: str = "Flat", nprobe: int = 16, faiss_train_size: int | None = None,
                 faiss_index_dir: str | os.PathLike[str] | None = None) -> None:
        if backend not in _BACKENDS:
            raise ValueError(f"backend: expected one of {list(_BACKENDS)}, got {backend!r}")
        if not isinstance(store, CorpusStore):
            raise TypeError(f"store: expected a CorpusStore, got {type(store).__name__}")
        self.encoder, self.store, self.backend, self.dedup = encoder, store, backend, dedup
        if encoder is not None and int(encoder.dim) != store.dim:
            raise ValueError(f"encoder: produces dim {encoder.dim} but the store holds dim {store.dim}")
        self.index_path: Path | None = None
        if backend == "native":
            self.index = store.index(mmap=True)
        else:
            self.index, self.index_path = faiss_index(store, faiss_factory, nprobe=nprobe,
                                                      train_size=faiss_train_size, index_dir=faiss_index_dir)
        logger.info("retriever over %s (%d passages) with the %s backend", store.path, len(store), backend)

    @classmethod
    def load(cls, path: str | os.PathLike[str], encoder: Any = None, backend: str | None = None, *,
             encoder_backend: str | None = None, device: str | None = None, check: bool = True,
             verify: bool = False, **kwargs: Any) -> "Retriever":
        """Open a store directory and the encoder its manifest names.

        Parameters
        ----------
        path : store directory
        encoder : EncoderLike, optional
            Default: ``Encoder.from_config`` of the manifest's encoder
            (model files must still match the recorded fingerprint).
        backend : {"native", "faiss"}, optional
            Search backend (default ``"native"``).
        encoder_backend : {"torch", "onnx"}, optional
            Run the manifest's encoder with this backend instead.
        device : str, optional
            Encoder device.
        check : bool
            Refuse an encoder whose model fingerprint, pooling,
            normalisation, prefixes or dim differ from the manifest.
        verify : bool
            Recompute every store file's sha256 against the manifest before
            searching (reads the whole store). Without it only file sizes
            are compared (see :meth:`CorpusStore.open`).
        **kwargs : passed to :class:`Retriever` (``dedup``,
            ``faiss_factory``, ``nprobe``, ``faiss_train_size``,
            ``faiss_index_dir``).

        Raises
        ------
        ValueError
            A store file that does not match the manifest (named), or an
            encoder that does not match the store (with ``check``).
        """
        store = CorpusStore.open(path, verify=verify)
        m = store.manifest["encoder"]
        if encoder is None:
            from rcn_fast.retrieval.encoder import Encoder, EncoderConfig

            model = m.get("model_dir") or m["model"]
            if not Path(model).is_dir():
                model = m["model"]
            cfg = EncoderConfig(model=model, backend=encoder_backend or m["backend"], pooling=m["pooling"],
                                normalize=m["normalize"], query_prefix=m["query_prefix"],
                                passage_prefix=m["passage_prefix"], max_length=m["max_length"],
                                quantize=m.get("quantize") if (encoder_backend or m["backend"]) == "onnx" else None,
                                device=device)
            encoder = Encoder.from_config(cfg)
        if check and hasattr(encoder, "describe"):
            have = encoder.describe()
            diff = [f"{k}: store {m.get(k)!r} vs encoder {have.get(k)!r}" for k in _MATCH_KEYS
                    if m.get(k) != have.get(k)]
            if diff:
                raise ValueError(f"encoder: does not match the encoder the store {path} was built with ("
                                 + "; ".join(diff) + "); rebuild the store or pass check=False")
        return cls(encoder, store, backend=backend or "native", **kwargs)

    # ------------------------------------------------------------------ search
    def search(self, query_emb: Any, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Raw top-k: scores float32 [Q, k], rows int64 [Q, k] (-1 padded).

        The index is asked for at most as many rows as the store holds; the
        columns beyond it are padding (MemoryError naming ``k`` when the
        [Q, k] results cannot be allocated)."""
        k = check_k(k)
        q = A.to_float32_numpy(A.as_array(query_emb, "query_emb"))
        if q.ndim == 1:
            q = q[None, :]
        A.check_rank(q, 2, "query_emb", f"[Q, {self.store.dim}]")
        if q.shape[1] != self.store.dim:
            raise ValueError(f"query_emb: expected {self.store.dim} columns, got shape {q.shape}")
        if self.backend == "native":
            return self.index.search(q, int(k))
        kk = min(k, len(self.store))
        if kk == k:
            scores, ids = self.index.search(np.ascontiguousarray(q), kk)
            return scores.astype(np.float32), ids.astype(np.int64)
        check_result_memory(len(q), len(self.store), k)
        out_s = np.full((len(q), k), -np.inf, np.float32)
        out_i = np.full((len(q), k), -1, np.int64)
        if kk:
            scores, ids = self.index.search(np.ascontiguousarray(q), kk)
            out_s[:, :kk], out_i[:, :kk] = scores, ids
        return out_s, out_i

    def retrieve_embeddings(self, query_emb: Any, k: int = 5, *, dedup: bool | None = None) -> list[list[Passage]]:
        """Passages for already-embedded queries.

        Parameters
        ----------
        query_emb : float array [Q, dim] (or [dim])
        k : int
            Passages per query (fewer when the corpus is smaller).
        dedup : bool, optional
            Drop passages whose exact text already appeared higher in the
            same list (more candidates are fetched to still return k).

        Returns
        -------
        list (length Q) of lists of :class:`Passage`, best first.
        """
        k = check_k(k)
        dedup = self.dedup if dedup is None else dedup
        q = A.to_float32_numpy(A.as_array(query_emb, "query_emb"))
        if q.ndim == 1:
            q = q[None, :]
        n = len(self.store)
        # never ask for more rows than the store holds: a huge k costs nothing
        fetch = max(min(k * 2 if dedup else k, n), 1)
        while True:
            scores, rows = self.search(q, fetch)
            out, short = [], False
            for s_row, r_row in zip(scores, rows):
                seen: set[str] = set()
                lst: list[Passage] = []
                for s, r in zip(s_row, r_row):
                    if r < 0:
                        break
                    text = self.store.text(int(r))
                    if dedup:
                        if text in seen:
                            continue
                        seen.add(text)
                    lst.append(Passage(id=self.store.id(int(r)), text=text, score=float(s), meta={"row": int(r)}))
                    if len(lst) == k:
                        break
                if dedup and len(lst) < k and fetch < n:
                    short = True
                out.append(lst)
            if not short:
                return out
            fetch = min(fetch * 2, n)

    def retrieve(self, queries: Sequence[str], k: int = 5, *, dedup: bool | None = None,
                 batch_size: int | None = None) -> list[list[Passage]]:
        """Top-``k`` passages for each query (queries encoded with the
        encoder's query prefix).

        Parameters
        ----------
        queries : sequence of str, length Q
        k : int
        dedup : bool, optional
        batch_size : int, optional
            Encoder batch size.

        Returns
        -------
        list (length Q) of lists (length <= k) of :class:`Passage`.
        """
        if self.encoder is None:
            raise ValueError("encoder: this retriever has none; use retrieve_embeddings or pass an encoder")
        queries = check_texts(queries, "queries")
        check_k(k)
        if not queries:
            return []
        emb = self.encoder.encode_queries(queries, batch_size=batch_size)
        return self.retrieve_embeddings(emb, k, dedup=dedup)

    def __repr__(self) -> str:
        return f"Retriever(store={self.store!r}, backend={self.backend!r}, encoder={self.encoder!r})"


# --------------------------------------------------------------------- faiss
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


def faiss_index(store: CorpusStore, factory: str = "Flat", *, nprobe: int = 16, train_size: int | None = None,
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

    if path.is_file():
        flag = faiss.IO_FLAG_MMAP if ivf is not None else getattr(faiss, "IO_FLAG_MMAP_IFC", 0)
        try:
            loaded = faiss.read_index(str(path), flag)
        except RuntimeError:  # this faiss cannot memory-map the type: read it
            loaded = faiss.read_index(str(path))
            flag = 0
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
        root.mkdir(parents=True, exist_ok=True)
        tmp = root / f".{path.name}.{os.getpid()}.tmp"
        faiss.write_index(index, str(tmp))
        os.replace(tmp, path)
        (root / f"{path.name}.json").write_text(json.dumps(
            {"format": _FAISS_FORMAT, "key": json.loads(key_src), "ntotal": int(index.ntotal), "dim": dim,
             "faiss": getattr(faiss, "__version__", None)}, indent=2) + "\n")
        for old in root.glob(f"{glob.escape(slug)}-*.faiss"):  # same factory, an earlier store or sample
            if old != path:
                old.unlink(missing_ok=True)
                Path(f"{old}.json").unlink(missing_ok=True)
        logger.info("saved faiss index %s to %s", factory, path)
    except OSError as exc:
        logger.warning("could not save the faiss index to %s (%s); it is kept in memory only and will be "
                       "trained again at the next load (pass faiss_index_dir= a writable directory)", path, exc)
        return index, None
    return index, path


def _set_nprobe(faiss: Any, index: Any, nprobe: int) -> None:
    ivf = _ivf_of(faiss, index)
    if ivf is not None:
        ivf.nprobe = min(int(nprobe), int(ivf.nlist))


__all__ = ["Retriever", "RetrieverLike", "faiss_index"]
