"""The int8 copy of a FlatIndex or corpus store directory, on disk.

Beside ``embeddings.npy``: ``int8_codes.npy`` (int8 [count, width]),
``int8_rows.npy`` (float32 [count, 3]: scale, norm bound, residual bound)
and ``int8.json`` (written last; format, dim, count, width, the size and
sha256 of each of the two files, and the record of the ``embeddings.npy``
the copy was built from). The bounds are only true for the rows they were
built from, so :func:`load_int8_copy` compares that record with the
directory's current one (``index.json`` or the store's ``manifest.json``):
a copy of other embeddings is an error naming the fix, never a wrong
search. The copy is written by :func:`write_int8_copy` (``python -m
rcn_fast.corpus build --int8-copy``) and attached by
:meth:`rcn_fast.FlatIndex.load` when present.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from rcn_fast._file_data import read_npy
from rcn_fast._files import Folder, Root, folder
from rcn_fast._hashing import sha256_fd
from rcn_fast._stamped_json import read_stamped_json, write_stamped_json
from rcn_fast.search.int8_bounded import MAX_DIM, Int8Copy, build_int8, width_of
from rcn_fast.search.records import embeddings_record

FORMAT = "rcn_fast.Int8Copy/1"
RECORD = "int8.json"
CODES, ROWS = "int8_codes.npy", "int8_rows.npy"


def _embeddings_record(root: Folder) -> dict[str, Any]:
    """The size/sha256 record of ``embeddings.npy`` (index.json or the
    store manifest), or ValueError naming what is missing."""
    rec = embeddings_record(root)
    if rec is None or "sha256" not in rec or "bytes" not in rec:
        raise ValueError(f"path: {root.path} records no size and sha256 of embeddings.npy, so an int8 copy could "
                         "not be tied to it; save the index (or rebuild the store) again")
    return {"bytes": int(rec["bytes"]), "sha256": str(rec["sha256"])}


def _save_npy(root: Folder, name: str, arr: np.ndarray) -> dict[str, Any]:
    """``arr`` saved as ``name`` (a temporary file renamed into place, from
    the folder's descriptor: never through a planted link); its record."""
    tmp = f".{name}.{os.getpid()}.tmp"
    with root.open_write(tmp, "w+b") as f:
        np.save(f, arr)
        f.flush()
        os.fsync(f.fileno())
        rec = {"bytes": os.fstat(f.fileno()).st_size, "sha256": sha256_fd(f.fileno())}
    root.replace(tmp, name)
    return rec


def write_int8_copy(path: str | os.PathLike[str], *, chunk: int = 1 << 16) -> Int8Copy:
    """Build the int8 copy of ``path/embeddings.npy`` (a FlatIndex or corpus
    store directory) and write it beside it; returns the copy.

    Raises
    ------
    ValueError
        Rows wider than MAX_DIM, non-finite rows, or no record of
        embeddings.npy in the directory.
    """
    with Folder(path) as root:
        record = _embeddings_record(root)
        fd = root.open_fd("embeddings.npy")
        try:
            emb = read_npy(fd, mmap=True, where=root.path / "embeddings.npy")
        finally:
            os.close(fd)
        if emb.ndim != 2 or emb.shape[1] > MAX_DIM:
            raise ValueError(f"path: {root.path}/embeddings.npy is {list(emb.shape)}; an int8 copy takes rows of at "
                             f"most {MAX_DIM} values")
        copy = build_int8(emb, chunk)
        files = {CODES: _save_npy(root, CODES, copy.codes), ROWS: _save_npy(root, ROWS, copy.rows)}
        write_stamped_json(root.path / RECORD, {"format": FORMAT, "dim": copy.dim, "count": len(copy),
                                                "width": copy.width, "embeddings": record, "files": files}, root=root)
    return copy


def load_int8_copy(path: Root, *, mmap: bool = True, verify: bool = False) -> Int8Copy | None:
    """The int8 copy written beside ``path/embeddings.npy``, or None when the
    directory has none. Every file (``int8.json`` too) is opened beneath
    the directory's descriptor (:mod:`rcn_fast._files`: a link leading out
    of it is a ``LinkError``), and checked, read and mapped through that
    descriptor; no message echoes what a file holds.

    Raises
    ------
    ValueError
        ``int8.json`` unreadable or of another format; the copy built from
        other embeddings than the directory's; a file missing, of another
        size than recorded, (``verify``) of another sha256, or of the wrong
        shape or dtype; bounds that are not finite and non-negative. The
        message names the file and the fix.
    """
    with folder(path) as root:
        return _load(root, mmap=mmap, verify=verify)


def _load(root: Folder, *, mmap: bool, verify: bool) -> Int8Copy | None:
    path = root.path
    if not root.exists(RECORD):
        return None
    fix = "; rebuild it with rcn_fast.search.int8_files.write_int8_copy (or `corpus build --int8-copy`)"
    meta = read_stamped_json(path / RECORD, FORMAT, what="an int8 copy", fix=fix, root=root)
    try:
        dim, count, width = int(meta["dim"]), int(meta["count"]), int(meta["width"])
        built_from, files = meta["embeddings"], meta["files"]
    except (KeyError, TypeError, ValueError):
        raise ValueError(f"path: {path / RECORD} lacks dim, count, width, embeddings or files{fix}") from None
    if not isinstance(built_from, dict) or _embeddings_record(root) != {"bytes": built_from.get("bytes"),
                                                                        "sha256": built_from.get("sha256")}:
        raise ValueError(f"path: {path}'s int8 copy was built from other embeddings than its embeddings.npy (its "
                         f"bounds would not hold){fix}")
    arrays = {}
    for name, dtype, shape in ((CODES, np.int8, (count, width)), (ROWS, np.float32, (count, 3))):
        f, rec = path / name, files.get(name) if isinstance(files, dict) else None
        try:
            fd = root.open_fd(name)
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            fd = None
        if fd is None or not isinstance(rec, dict):
            if fd is not None:
                os.close(fd)
            raise ValueError(f"path: {f} is missing or unrecorded{fix}")
        try:
            size = os.fstat(fd).st_size
            if size != rec.get("bytes"):
                raise ValueError(f"path: {f} holds {size} bytes, the record says {rec.get('bytes')}{fix}")
            if verify and sha256_fd(fd) != rec.get("sha256"):
                raise ValueError(f"path: {f} does not match its recorded sha256{fix}")
            try:
                arr = read_npy(fd, mmap=mmap, where=f)
            except (ValueError, OSError) as exc:
                raise ValueError(f"path: {f} cannot be read ({exc}){fix}") from None
        finally:
            os.close(fd)
        if arr.dtype != dtype or arr.shape != shape:
            raise ValueError(f"path: {f} is {arr.dtype}{list(arr.shape)}, expected {np.dtype(dtype)}{list(shape)}{fix}")
        arrays[name] = arr
    if width != width_of(dim):
        raise ValueError(f"path: {path / RECORD} says width {width} for dim {dim}{fix}")
    rows = arrays[ROWS]
    if not (np.isfinite(rows).all() and (rows[:, 0] > 0).all() and (rows[:, 1:] >= 0).all()):
        raise ValueError(f"path: {path / ROWS} holds bounds that are not finite and non-negative{fix}")
    return Int8Copy(arrays[CODES], rows, dim)
