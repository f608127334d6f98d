"""The on-disk corpus store: embeddings, texts and ids of a passage corpus.
Its layout is written (:func:`write_chunk`, :func:`write_store`) and read
(:class:`CorpusStore`) here, and nowhere else.

A store is a directory::

    manifest.json        what was built, by which encoder, with checksums
    index.json           FlatIndex header (so FlatIndex.load(DIR) works)
    embeddings.npy       [count, dim] float16/float32, memory-mapped
    texts.bin            UTF-8 texts back to back; text_offsets.npy int64 [count+1]
    ids.bin              UTF-8 ids back to back;   id_offsets.npy   int64 [count+1]
    id_table.npy         int64 open-addressing hash table id -> row (-1 = empty)
    faiss/               trained faiss indexes, when the faiss backend built any
                         (``<factory>-<key>.faiss``; see index.faiss_index)

Every file is memory-mapped on open; lookups by row are two offset reads,
lookups by id one hash and (expected) one or two probes: O(1) both. The
store folder is opened once (a :class:`rcn_fast._files.Folder`, kept by
the store) and every file beneath its descriptor, then sized, checked and
mapped through the descriptor it was opened as, never by name again: a
link out of the store (``texts.bin -> ~/.ssh/id_rsa``) is refused naming
it, and a file swapped for one while the store opens is the file opened
or refused, never the outside file. Opening checks, cheaply and every
time: each file's size against the manifest (a truncated or replaced
file is an error naming it), the arrays' shapes and dtypes against the
manifest, both offset arrays (start at 0, never decrease, end at their
file's size), the id table (a power of two of slots, each row once) and
that no embedding row holds a NaN or an infinity (named; see
:func:`rcn_fast.search.flat_index.check_finite_rows`).
Each scan of a whole file (offsets, id table, embeddings) is remembered
per version of the file (:func:`rcn_fast._hashing.check_once`), so
reopening an unchanged store costs a few ``stat`` calls. ``verify=True`` also
compares sha256 checksums (a same-size change that keeps the arrays
consistent is found only then). A build refuses non-finite embeddings,
naming the passages.
"""

from __future__ import annotations

import datetime as _dt
import io
import json
import logging
import os
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np

from rcn_fast._arrays import nonfinite_rows, row_list
from rcn_fast._file_data import create_npy, map_fd, read_fd, read_npy
from rcn_fast._files import Folder, Root, open_read, write_atomic
from rcn_fast._hashing import sha256_fd, sha256_file
from rcn_fast._stamped_json import read_stamped_json
from rcn_fast.retrieval.conventions import InputError, keep_mask, select_rows, text_digests
from rcn_fast.retrieval.id_table import build_id_table, id_hash
from rcn_fast.retrieval.id_table import check_id_table as _check_id_table

logger = logging.getLogger("rcn_fast.retrieval")

FORMAT = "rcn_fast.CorpusStore/1"
FLAT_INDEX_FORMAT = "rcn_fast.FlatIndex/1"  # the header FlatIndex.load reads
DATA_FILES = ("embeddings.npy", "texts.bin", "text_offsets.npy", "ids.bin", "id_offsets.npy", "id_table.npy")
MANIFEST = "manifest.json"  # written last: its presence marks a finished store
FLAT_INDEX_HEADER = "index.json"
CHUNK_GLOB = "chunk-*.npz"  # the chunk files a build leaves in parts/ (see chunk_name)


def write_json_atomic(path: Path, obj: Any, *, root: Root | None = None) -> None:
    """``obj`` as JSON at ``path`` (a temporary file, fsync, rename), from
    the descriptor of ``root`` (default: its folder): never through a
    symbolic link planted there (:func:`rcn_fast._files.write_atomic`)."""
    path = Path(path)
    write_atomic(path.parent if root is None else root, path.name if root is None else path,
                 json.dumps(obj, indent=2, sort_keys=False) + "\n")


# ---------------------------------------------------------------------- store
class CorpusStore:
    """Read access to a built corpus directory (see the module docstring).

    Use :meth:`open`. Rows are 0..len-1 in input order.
    """

    def __init__(self, path: Path, manifest: dict[str, Any], mmap: bool = True, *, _built: bool = False,
                 _folder: Folder | None = None) -> None:
        self.path = Path(path)
        self.manifest = manifest
        #: the store folder, open: every file is reached beneath its descriptor (rcn_fast._files)
        self.folder = _folder if _folder is not None else Folder(self.path)
        self._fds: dict[str, int | None] = self._open_all()
        fds = self._fds
        try:
            self.check_sizes()
            mode = "r" if mmap else None
            self.embeddings: np.ndarray = self._load_npy("embeddings.npy", mode)
            self._text_off = self._load_npy("text_offsets.npy", mode)
            self._id_off = self._load_npy("id_offsets.npy", mode)
            self._id_table = self._load_npy("id_table.npy", mode)
            self._texts = _bytes_view(fds["texts.bin"], mmap)
            self._ids = _bytes_view(fds["ids.bin"], mmap)
            n = int(manifest["count"])
            if self.embeddings.shape != (n, int(manifest["dim"])) or len(self._text_off) != n + 1 \
                    or len(self._id_off) != n + 1:
                raise ValueError(
                    f"path: {self.path} is inconsistent: manifest says {n} rows of dim {manifest['dim']}, files hold "
                    f"embeddings {self.embeddings.shape}, {len(self._text_off) - 1} texts, {len(self._id_off) - 1} "
                    "ids")
            self.check_arrays(_built=_built)
        finally:
            self._close_all()

    def _open_all(self) -> dict[str, int | None]:
        """A descriptor of each data file (None: missing), opened beneath the store's."""
        fds: dict[str, int | None] = {}
        for name in DATA_FILES:
            try:
                fds[name] = self.folder.open_fd(name)
            except (FileNotFoundError, NotADirectoryError):
                fds[name] = None
        return fds

    def _close_all(self) -> None:
        for fd in self._fds.values():
            if fd is not None:
                os.close(fd)
        self._fds = {}

    def _load_npy(self, name: str, mode: str | None) -> np.ndarray:
        """The array of the data file ``name`` from its open descriptor,
        any failure a ValueError naming it."""
        try:
            return read_npy(self._fds[name], mmap=mode is not None, where=self.path / name)
        except ValueError as exc:
            raise ValueError(f"{exc}; check the store with `python -m rcn_fast.corpus verify` and restore the file "
                             "or rebuild the store") from None

    def check_arrays(self, *, _built: bool = False) -> None:
        """The cheap checks of every open (module notes): dtypes, offsets,
        id table, finite embeddings; ValueError naming the file and rows.

        The scans of whole files (offsets that never decrease, the id
        table's rows, finite embeddings) run once per version of each file
        (:func:`rcn_fast._hashing.check_once`). ``_built``: the store was
        just written by :func:`write_store`, which checked every embedding
        row and built the id table itself: those two scans are skipped.
        """
        from rcn_fast._hashing import check_once
        from rcn_fast.search.flat_index import check_finite_rows

        if not self._fds:  # called again later: the files opened afresh (checked as the ones now there)
            self._fds = self._open_all()
            try:
                return self.check_arrays(_built=_built)
            finally:
                self._close_all()
        fix = "check the store with `python -m rcn_fast.corpus verify` and rebuild it"
        n = len(self)
        if self.embeddings.dtype.name != self.manifest["dtype"]:
            raise ValueError(f"path: {self.path}/embeddings.npy holds {self.embeddings.dtype}, the manifest says "
                             f"{self.manifest['dtype']}; {fix}")
        for name, off, blob, blob_name in (("text_offsets.npy", self._text_off, self._texts, "texts.bin"),
                                           ("id_offsets.npy", self._id_off, self._ids, "ids.bin")):
            if off.dtype != np.int64 or off.ndim != 1:
                raise ValueError(f"path: {self.path}/{name} holds {off.dtype}{list(off.shape)}, expected int64 "
                                 f"[{n + 1}]; {fix}")
            check_once(self.path / name, "nondecreasing-offsets",
                       lambda: _check_nondecreasing(off, f"path: {self.path}/{name}", fix), fd=self._fds[name])
            if int(off[0]) != 0 or int(off[-1]) != len(blob):
                raise ValueError(f"path: {self.path}/{name} is damaged: it runs from {int(off[0])} to {int(off[-1])}, "
                                 f"not 0 to {len(blob)} (the size of {blob_name}); {fix}")
        table = self._id_table
        size = len(table)
        if table.dtype != np.int64 or table.ndim != 1 or size <= n or size & (size - 1):
            raise ValueError(f"path: {self.path}/id_table.npy holds {table.dtype}{list(table.shape)}, expected int64 "
                             f"slots, a power of two above {n}; {fix}")
        if not _built:
            check_once(self.path / "id_table.npy", f"id-table-rows/{n}",
                       lambda: _check_id_table(table, n, f"path: {self.path}/id_table.npy", fix),
                       fd=self._fds["id_table.npy"])
            check_finite_rows(self.path / "embeddings.npy", self.embeddings, fix, fd=self._fds["embeddings.npy"])

    @classmethod
    def open(cls, path: str | os.PathLike[str], *, mmap: bool = True, verify: bool = False) -> "CorpusStore":
        """Open a store directory.

        Parameters
        ----------
        path : directory written by ``python -m rcn_fast.corpus build``.
        mmap : bool
            Memory-map the files (default) instead of reading them.
        verify : bool
            Also recompute the sha256 of every file against the manifest
            (reads every byte: minutes for a 20M-passage store). Without
            it, opening still compares every file's size with the
            manifest's record (a truncated, missing or replaced file of
            another size is an error), but a same-size replacement goes
            unnoticed.

        Raises
        ------
        FileNotFoundError
            No ``manifest.json`` (not a finished store).
        ValueError
            Unknown format, a file missing or of the wrong size (or, with
            ``verify``, the wrong checksum), or array shapes that disagree
            with the manifest. The message names the files.
        """
        path = Path(path)
        try:
            root = Folder(path)
        except (FileNotFoundError, NotADirectoryError):
            raise FileNotFoundError(f"path: {path} has no manifest.json, so it is not a finished corpus store "
                                    "(no such folder)") from None
        try:
            if not root.is_file(MANIFEST):
                hint = ""
                if root.is_file("shard.json"):
                    hint = (" (one finished shard of a sharded build: join the shards with `python -m rcn_fast.corpus "
                            "merge`)")
                elif root.is_file("build.json"):
                    hint = " (an unfinished build: run the same build command again to resume)"
                raise FileNotFoundError(f"path: {path} has no manifest.json, so it is not a finished corpus store"
                                        f"{hint}")
            manifest = read_manifest(path / MANIFEST, root=root)
            store = cls(path, manifest, mmap=mmap, _folder=root)
        except BaseException:
            root.close()
            raise
        if verify:
            store.verify()
        return store

    def check_sizes(self) -> None:
        """Raise ValueError naming every data file that is missing or whose
        size differs from the manifest's record (one ``stat`` per file)."""
        files = self.manifest.get("files")
        if not isinstance(files, dict) or not files:
            raise ValueError(f"path: {self.path}/manifest.json records no files, so the store cannot be checked; "
                             "rebuild it")
        bad = []
        for name in DATA_FILES:
            rec = files.get(name)
            fd = self._fds.get(name)
            size = os.fstat(fd).st_size if fd is not None else None
            if rec is None:
                bad.append(f"{name} (not in the manifest)")
            elif fd is None:
                bad.append(f"{name} (missing)")
            elif not isinstance(rec, dict) or not isinstance(rec.get("bytes"), int):
                bad.append(f"{name} (the manifest's record {rec!r} has no byte count)")
            elif size != int(rec["bytes"]):
                bad.append(f"{name} ({size} bytes, the manifest records {rec['bytes']}: "
                           "truncated, still being written or replaced)")
        if bad:
            raise ValueError(f"path: {self.path} does not match its manifest: {', '.join(bad)}; restore the files "
                             "or rebuild the store")

    def verify(self) -> None:
        """Raise ValueError naming every file whose sha256 or size differs
        from the manifest."""
        bad = []
        for name, rec in self.manifest["files"].items():
            try:
                fd = self.folder.open_fd(name)  # a name from the manifest: never a file outside the store
            except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
                bad.append(f"{name} (missing)")
                continue
            try:
                if not isinstance(rec, dict) or "sha256" not in rec or "bytes" not in rec:
                    bad.append(f"{name} (the manifest records no checksum)")
                elif os.fstat(fd).st_size != rec["bytes"] or sha256_fd(fd) != rec["sha256"]:
                    bad.append(f"{name} (checksum mismatch)")
            finally:
                os.close(fd)
        if bad:
            raise ValueError(f"path: {self.path} does not match its manifest: {', '.join(bad)}")

    # -------------------------------------------------------------- lookups
    def __len__(self) -> int:
        return int(self.manifest["count"])

    @property
    def dim(self) -> int:
        return int(self.manifest["dim"])

    def _check_row(self, row: int) -> int:
        r = int(row)
        if r < 0 or r >= len(self):
            raise IndexError(f"row: {row} out of range for a store of {len(self)} rows")
        return r

    def text(self, row: int) -> str:
        """The text of ``row`` (O(1))."""
        r = self._check_row(row)
        return bytes(self._texts[self._text_off[r]:self._text_off[r + 1]]).decode("utf-8")

    def id(self, row: int) -> str:
        """The id of ``row`` (O(1))."""
        r = self._check_row(row)
        return bytes(self._ids[self._id_off[r]:self._id_off[r + 1]]).decode("utf-8")

    def texts(self, rows: Iterable[int]) -> list[str]:
        return [self.text(r) for r in rows]

    def ids(self, rows: Iterable[int]) -> list[str]:
        return [self.id(r) for r in rows]

    def row_of(self, id: str) -> int:
        """The row holding ``id`` (O(1) expected); KeyError when absent."""
        if not isinstance(id, str):
            raise TypeError(f"id: expected a str, got {type(id).__name__}")
        table = self._id_table
        size = len(table)
        if size == 0 or size & (size - 1):
            raise ValueError(f"path: {self.path}/id_table.npy holds {size} slots, not a power of two: the store is "
                             "corrupt; check it with `python -m rcn_fast.corpus verify` and rebuild it")
        mask = size - 1
        pos = id_hash(id) & mask
        for _ in range(size):  # a sound table has an empty slot; a corrupt one may not
            r = int(table[pos])
            if r < 0:
                raise KeyError(id)
            if r >= len(self):
                break
            if self.id(r) == id:
                return r
            pos = (pos + 1) & mask
        raise ValueError(f"path: {self.path}/id_table.npy is corrupt (no empty slot on the probe path of {id!r}, "
                         "or a row out of range): check the store with `python -m rcn_fast.corpus verify` and "
                         "rebuild it")

    def __contains__(self, id: object) -> bool:
        try:
            self.row_of(id)  # type: ignore[arg-type]
            return True
        except (KeyError, TypeError):
            return False

    def get(self, id: str) -> str:
        """The text of passage ``id``."""
        return self.text(self.row_of(id))

    def index(self, mmap: bool = True) -> Any:
        """The embeddings as a :class:`rcn_fast.FlatIndex` (memory-mapped)."""
        from rcn_fast import FlatIndex

        return FlatIndex.load(self.path, mmap=mmap)

    def info(self) -> dict[str, Any]:
        """A summary for ``python -m rcn_fast.corpus info``."""
        m = self.manifest
        size = sum(rec["bytes"] for rec in m["files"].values() if isinstance(rec, dict) and "bytes" in rec)
        enc = m.get("encoder") if isinstance(m.get("encoder"), dict) else {}
        return {
            "path": str(self.path), "count": m["count"], "dim": m["dim"], "dtype": m["dtype"],
            "encoder": {k: enc.get(k) for k in ("model", "backend", "quantize", "pooling", "normalize",
                                                "query_prefix", "passage_prefix", "max_length")},
            "input": m.get("input"), "bytes": size, "built_at": m.get("built_at"), "shards": m.get("shards", 1),
            "faiss_indexes": [n.rpartition("/")[2] for n in self.folder.glob("faiss/*.faiss")],
        }

    def __repr__(self) -> str:
        return f"CorpusStore({str(self.path)!r}, count={len(self)}, dim={self.dim}, dtype={self.manifest['dtype']!r})"


_MANIFEST_KEYS = {"count": int, "dim": int, "dtype": str, "files": dict}


def read_manifest(path: Path, *, root: Root | None = None) -> dict[str, Any]:
    """The parsed ``manifest.json`` of a store (read beneath ``root``,
    default its folder, through the files door); ValueError naming the file
    when it is not UTF-8 JSON, holds another format, or lacks a key the
    store needs (or has it with the wrong type)."""
    manifest = read_stamped_json(path, FORMAT, what="a finished corpus store", fix="; restore it or rebuild the store",
                                 root=root)
    for key, typ in _MANIFEST_KEYS.items():
        if not isinstance(manifest.get(key), typ) or isinstance(manifest.get(key), bool):
            got = "no such key" if key not in manifest else f"a {type(manifest[key]).__name__}"
            raise ValueError(f"path: {path} needs {key!r} of type {typ.__name__} ({got}); restore it or rebuild the "
                             "store")
    return manifest


def _decreasing(off: np.ndarray, block: int = 1 << 20) -> np.ndarray:
    """Indices i where ``off[i + 1] < off[i]`` (read ``block`` entries at a time)."""
    out = []
    for s in range(0, max(len(off) - 1, 0), block):
        part = np.asarray(off[s : s + block + 1])
        out.append(np.flatnonzero(np.diff(part) < 0) + s)
    return np.concatenate(out) if out else np.zeros(0, dtype=np.int64)


def _check_nondecreasing(off: np.ndarray, where: str, fix: str) -> None:
    """ValueError naming ``where`` and the first entries of the offsets
    ``off`` that are smaller than the entries before them."""
    bad = _decreasing(off)
    if bad.size:
        raise ValueError(f"{where} is damaged: entries {[int(i) + 1 for i in bad[:5]]} are smaller than the entries "
                         f"before them; {fix}")


def _bytes_view(fd: int, mmap: bool) -> np.ndarray:
    """The bytes of the file open as ``fd``: mapped read-only from the
    descriptor (``mmap``), or read."""
    if mmap:
        m = map_fd(fd)
        return np.zeros(0, dtype=np.uint8) if m is None else np.frombuffer(m, dtype=np.uint8)
    return np.frombuffer(read_fd(fd), dtype=np.uint8)


def texts_to_blob(texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """UTF-8 blob uint8 [bytes] and lengths int64 [n]."""
    enc = [t.encode("utf-8") for t in texts]
    lengths = np.fromiter((len(b) for b in enc), dtype=np.int64, count=len(enc))
    blob = np.frombuffer(b"".join(enc), dtype=np.uint8)
    return blob, lengths


# --------------------------------------------------------------------- writer
def chunk_name(c: int) -> str:
    """File name of chunk ``c`` in ``parts/``."""
    return f"chunk-{c:08d}.npz"


def write_chunk(parts: Path, c: int, ids: list[str], texts: list[str], emb: Any, *, dim: int, dtype: str,
                dropped: int = 0) -> None:
    """Check a chunk's embeddings and write ``parts/chunk-c.npz``
    atomically (a temporary file, fsync, rename); ``dropped``: duplicate
    records left out of it (counted in the store's log and manifest)."""
    emb = np.asarray(emb, dtype=np.float32)
    if emb.shape != (len(texts), dim):
        raise ValueError(f"encoder: returned shape {emb.shape} for {len(texts)} texts, "
                         f"expected ({len(texts)}, {dim})")
    with np.errstate(over="ignore"):  # an overflow of the store's dtype is refused just below, naming the rows
        stored = emb.astype(dtype)
    bad = nonfinite_rows(stored)
    if bad.any():
        ids_bad = [ids[i] for i in np.flatnonzero(bad)[:5]]
        raise ValueError(f"encoder: NaN or infinite embeddings (in {dtype}) in chunk {c}, rows {row_list(bad)}, "
                         f"passage ids {ids_bad}: the encoder's numbers are broken (NaN weights, an overflow); "
                         "nothing was written")
    tblob, tlen = texts_to_blob(texts)
    iblob, ilen = texts_to_blob(ids)
    buf = io.BytesIO()
    np.savez(buf, emb=stored, text_blob=tblob, text_len=tlen, id_blob=iblob, id_len=ilen,
             hashes=np.fromiter((id_hash(i) for i in ids), dtype=np.int64, count=len(ids)), dropped=np.int64(dropped))
    write_atomic(parts, chunk_name(c), buf.getvalue())  # beneath the folder's descriptor, no link followed


def write_store(out: Path, chunk_files: list[Path], spec: dict[str, Any], *, model_dir: str | None,
                shards: int, executor: str = "local") -> CorpusStore:
    """Join chunk files (in order, as :func:`write_chunk` wrote them) into
    the store files of the module docstring, leaving out duplicate texts
    unless the spec keeps them; ``manifest.json`` last.

    Parameters
    ----------
    out : the store directory
    chunk_files : the ``parts/chunk-*.npz`` files, in row order
    spec : the build's settings (``encoder``, ``dtype``, ``input``,
        ``chunk_size``, ``dedup``, ...), recorded in the manifest
    model_dir : the encoder's resolved model directory (recorded)
    shards : how many shards built the chunks (recorded)
    executor : ``"local"`` or ``"ray"`` (recorded)

    Returns
    -------
    CorpusStore
        The store, opened.

    Raises
    ------
    ValueError
        Two records with the same id.
    """
    digests, dropped = [], 0
    for p in chunk_files:
        with _chunk(p) as z:
            digests.append(text_digests(z["text_blob"], z["text_len"]) if spec.get("dedup") else
                           np.zeros(len(z["text_len"])))
            dropped += int(z["dropped"]) if "dropped" in z.files else 0
    masks, more = keep_mask(digests) if spec.get("dedup") else ([None] * len(chunk_files), 0)
    dropped += more
    counts = [len(d) if m is None else int(m.sum()) for d, m in zip(digests, masks)]
    if spec.get("dedup"):
        total = sum(counts) + dropped
        logger.info("dropped %d exact duplicate passage(s) of %d (the first of each text kept; "
                    "--keep-duplicates / keep_duplicates=True keeps them)", dropped, total)
    n, dim, dtype = int(sum(counts)), int(spec["encoder"]["dim"]), spec["dtype"]
    root = Folder(out)
    try:
        return _join(root, chunk_files, counts, masks, spec, n, dim, dtype, dropped, model_dir=model_dir,
                     shards=shards, executor=executor)
    except BaseException:
        root.close()
        raise


def _chunk(p: Path) -> Any:
    """The ``.npz`` chunk file ``p`` (of the build's ``parts/``), opened
    through the files door (no pickles: ``allow_pickle`` stays off)."""
    return np.load(open_read(p.parent, p.name))


def _join(root: Folder, chunk_files: list[Path], counts: list[int], masks: list[Any], spec: dict[str, Any], n: int,
          dim: int, dtype: str, dropped: int, *, model_dir: str | None, shards: int, executor: str) -> CorpusStore:
    """The join of :func:`write_store`, every file written beneath ``root``'s descriptor."""
    out = root.path
    emb, emb_map = create_npy(root, ".embeddings.npy.tmp", (n, dim), dtype)
    t_off = np.zeros(n + 1, dtype=np.int64)
    i_off = np.zeros(n + 1, dtype=np.int64)
    hashes = np.zeros(n, dtype=np.int64)
    row = 0
    with root.open_write(".texts.bin.tmp", "wb") as tf, root.open_write(".ids.bin.tmp", "wb") as idf:
        for p, k, m in zip(chunk_files, counts, masks):
            with _chunk(p) as npz:
                z = npz if m is None or m.all() else select_rows(npz, m)
                emb[row:row + k] = z["emb"]
                bad = nonfinite_rows(emb[row:row + k])  # the rows as stored: the store's open need not scan them
                if bad.any():  # a chunk damaged on disk before this join: no store is written from it
                    raise ValueError(f"path: {p} holds NaN or infinite embeddings in rows {row_list(bad)}; delete it "
                                     "and run the build again")
                tf.write(z["text_blob"].tobytes())
                idf.write(z["id_blob"].tobytes())
                t_off[row + 1:row + k + 1] = t_off[row] + np.cumsum(z["text_len"])
                i_off[row + 1:row + k + 1] = i_off[row] + np.cumsum(z["id_len"])
                hashes[row:row + k] = z["hashes"]
            row += k
    if emb_map is not None:
        emb_map.flush()
    del emb, emb_map
    _check_unique_ids(hashes, lambda: np.frombuffer(root.read_bytes(".ids.bin.tmp"), dtype=np.uint8), i_off)
    table = build_id_table(hashes)
    for name, arr in (("text_offsets.npy", t_off), ("id_offsets.npy", i_off), ("id_table.npy", table)):
        with root.open_write(f".{name}.tmp", "wb") as f:
            np.save(f, arr)
    for name in ("embeddings.npy", "texts.bin", "ids.bin", "text_offsets.npy", "id_offsets.npy", "id_table.npy"):
        root.replace(f".{name}.tmp", name)
    write_json_atomic(out / FLAT_INDEX_HEADER, {"format": FLAT_INDEX_FORMAT, "dim": dim, "metric": "ip",
                                                "dtype": dtype, "count": n}, root=root)
    files = {}
    for name in ("embeddings.npy", "texts.bin", "text_offsets.npy", "ids.bin", "id_offsets.npy", "id_table.npy"):
        fd = root.open_fd(name)
        try:
            files[name] = {"bytes": os.fstat(fd).st_size, "sha256": sha256_fd(fd)}
        finally:
            os.close(fd)
    manifest = {
        "format": FORMAT, "count": n, "dim": dim, "dtype": dtype,
        "encoder": {**spec["encoder"], "model_dir": model_dir},
        "input": spec["input"], "chunk_size": spec["chunk_size"], "shards": shards,
        "build": {k: v for k, v in spec.items()}, "executor": executor, "files": files,
        "duplicates_dropped": dropped if spec.get("dedup") else None,
        "built_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    }
    write_json_atomic(out / MANIFEST, manifest, root=root)
    logger.info("wrote corpus store %s: %d passages, dim %d, %s", out, n, dim, dtype)
    # its rows and id table checked above
    return CorpusStore(out, read_manifest(out / MANIFEST, root=root), _built=True, _folder=root)


def _check_unique_ids(hashes: np.ndarray, ids_bytes: Any, offsets: np.ndarray) -> None:
    """ValueError naming the first id two rows share (``ids_bytes()``: the ids' bytes, read only then)."""
    order = np.argsort(hashes, kind="stable")
    sh = hashes[order]
    same = np.flatnonzero(sh[1:] == sh[:-1])
    if not same.size:
        return
    blob = ids_bytes()

    def id_at(r: int) -> str:
        return bytes(blob[offsets[r]:offsets[r + 1]]).decode("utf-8")

    for j in same:
        a, b = int(order[j]), int(order[j + 1])
        if id_at(a) == id_at(b):
            raise InputError(f"input: duplicate id {id_at(a)!r} (records {a} and {b}); ids must be unique")


__all__ = ["CorpusStore", "build_id_table", "id_hash", "FORMAT", "read_manifest", "sha256_file", "write_json_atomic",
           "chunk_name", "write_chunk", "write_store", "texts_to_blob", "DATA_FILES", "FLAT_INDEX_FORMAT",
           "MANIFEST", "FLAT_INDEX_HEADER", "CHUNK_GLOB"]
