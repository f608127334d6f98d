"""Data through the files door (:mod:`rcn_fast._files`): whole files and
arrays read, written and memory-mapped from the descriptor the door
opened (never opened again by name), and the files a reader is given.

* :func:`map_fd`, :func:`read_fd` -- the bytes of an open descriptor;
  :func:`fd_path` -- a path naming that very file, for a library that
  takes only a path (faiss memory-maps the store's index through it);
* :func:`read_npy` / :func:`load_npy` -- a ``.npy`` array mapped read-only
  from its descriptor (``np.memmap`` of the file object: numpy never opens
  it by name), or read; object arrays (pickles) refused, a file shorter
  than its header refused, a damaged header named, never quoted;
* :func:`create_npy` / :func:`save_npy` -- a ``.npy`` written beneath a
  folder's descriptor (mapped for writing, or atomically);
* :func:`confined` / :func:`open_named` -- a reader given a file (a task's
  question file) opens it beneath the task folder's descriptor while the
  folder is confined, else as its caller named it.
"""

from __future__ import annotations

import contextlib
import contextvars
import errno
import io
import mmap as _mmap
import os
import stat as _stat
from typing import IO, Any, Iterator

from rcn_fast._beneath import O_CLOEXEC
from rcn_fast._files import Folder, Root, folder, open_write, write_atomic


def map_fd(fd: int) -> "_mmap.mmap | None":
    """A read-only map of the whole file open as ``fd`` (None when empty):
    the bytes of that descriptor's file, whatever its name points at later."""
    size = os.fstat(fd).st_size
    return _mmap.mmap(fd, size, access=_mmap.ACCESS_READ) if size else None


def read_npy(fd: int, *, mmap: bool = True, where: str | os.PathLike[str] = "") -> Any:
    """The ``.npy`` array in the file open as ``fd`` (not closed):
    memory-mapped read-only from the descriptor (``mmap=True``) or read.
    Object arrays (pickles) are refused; ValueError naming ``where`` for a
    damaged header or a file shorter than its header says."""
    import numpy as np

    f = io.FileIO(fd, "rb", closefd=False)
    try:
        f.seek(0)
        version = np.lib.format.read_magic(f)
        if version == (1, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_1_0(f)
        else:
            shape, fortran, dtype = np.lib.format.read_array_header_2_0(f)
        offset = f.tell()
    except Exception as exc:  # numpy's header parser raises ValueError, SyntaxError, tokenize.TokenError, ...
        # numpy's message quotes the header: not echoed (what a file holds never is)
        raise ValueError(f"path: {where} cannot be read (not a .npy file, or its header is damaged: "
                         f"{type(exc).__name__})") from None
    finally:
        f.close()
    if dtype.hasobject:
        raise ValueError(f"path: {where} cannot be read (it holds Python objects, a pickle, which rcn_fast never "
                         "loads)")
    count = int(np.prod(shape, dtype=np.int64))
    need = offset + count * dtype.itemsize
    size = os.fstat(fd).st_size
    if size < need:
        raise ValueError(f"path: {where} is truncated: {size} bytes, its header ({dtype}{list(shape)}) needs {need}; "
                         "it cannot be read")
    order = "F" if fortran else "C"
    if count == 0:
        return np.zeros(shape, dtype=dtype, order=order)
    if mmap:  # numpy maps the descriptor of the file object it is given (no open by name)
        return np.memmap(io.FileIO(fd, "rb", closefd=False), dtype=dtype, mode="r", offset=offset, shape=shape,
                         order=order)
    with os.fdopen(os.dup(fd), "rb") as g:
        g.seek(offset)
        return np.fromfile(g, dtype=dtype, count=count).reshape(shape, order=order)


def load_npy(root: Root, path: str | os.PathLike[str], *, mmap: bool = True, what: str = "path") -> Any:
    """:func:`read_npy` of ``path`` opened under ``root``."""
    with folder(root, what=what) as f:
        fd = f.open_fd(path)
        try:
            return read_npy(fd, mmap=mmap, where=f.full(path))
        finally:
            os.close(fd)


def create_npy(root: Root, path: str | os.PathLike[str], shape: tuple[int, ...], dtype: Any, *,
               what: str = "path") -> tuple[Any, "_mmap.mmap | None"]:
    """A new ``.npy`` file ``path`` under ``root`` (created through
    :meth:`Folder.open_write`, no link followed) of ``shape`` and ``dtype``,
    and its data as a writable array mapped from that descriptor:
    ``(array, mmap)`` (``mmap`` None for an empty array; flush it when done)."""
    import numpy as np

    dtype = np.dtype(dtype)
    header = {"descr": np.lib.format.dtype_to_descr(dtype), "fortran_order": False, "shape": tuple(shape)}
    with open_write(root, path, "w+b", what=what) as f:
        try:
            np.lib.format.write_array_header_1_0(f, header)
        except ValueError:  # a header too long for format 1.0
            f.seek(0)
            np.lib.format.write_array_header_2_0(f, header)
        offset = f.tell()
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        f.truncate(offset + nbytes)
        f.flush()
        if nbytes == 0:
            return np.zeros(shape, dtype=dtype), None
        m = _mmap.mmap(f.fileno(), offset + nbytes, access=_mmap.ACCESS_WRITE)
    return np.ndarray(shape, dtype=dtype, buffer=m, offset=offset), m


def fd_path(fd: int) -> str | None:
    """A path that opens exactly the file open as ``fd`` (``/proc/self/fd/N``
    on Linux), for a library that takes only a path (faiss); None where the
    platform has none."""
    p = f"/proc/self/fd/{fd}"
    return p if os.path.exists(p) else None


def read_fd(fd: int) -> bytes:
    """The whole file open as ``fd`` (``pread`` from offset 0: the
    descriptor's offset is not moved)."""
    out, pos = [], 0
    while True:
        block = os.pread(fd, 1 << 26, pos)
        if not block:
            return b"".join(out)
        out.append(block)
        pos += len(block)


def save_npy(root: Root, path: str | os.PathLike[str], arr: Any, *, what: str = "path") -> None:
    """``np.save`` of ``arr`` into ``path`` under ``root``, atomically
    (:meth:`Folder.write_atomic`)."""
    import numpy as np

    buf = io.BytesIO()
    np.save(buf, arr, allow_pickle=False)
    write_atomic(root, path, buf.getvalue(), what=what)


_CONFINED: "contextvars.ContextVar[Folder | None]" = contextvars.ContextVar("rcn_fast_files_confined", default=None)


@contextlib.contextmanager
def confined(root: str | os.PathLike[str] | None, *, what: str = "path") -> Iterator[None]:
    """Within the block, :func:`open_named` opens files under ``root`` (a
    task file's folder: its question files) beneath its descriptor; None
    changes nothing (files the user names are opened as named)."""
    if root is None:
        yield
        return
    with Folder(root, what=what) as f:
        token = _CONFINED.set(f)
        try:
            yield
        finally:
            _CONFINED.reset(token)


def open_named(path: str | os.PathLike[str]) -> IO[bytes]:
    """A file a reader was given (a question file), open for reading:
    beneath the folder of the enclosing :func:`confined` block when it lies
    under it (links leading out refused), else as named (the user named
    it: its links are followed)."""
    f = _CONFINED.get()
    if f is not None:
        p = os.path.abspath(os.fspath(path))
        base = str(f.path).rstrip(os.sep)
        if p == base or p.startswith(base + os.sep):
            return f.open_read(p)
    fd = os.open(os.fspath(path), os.O_RDONLY | O_CLOEXEC | os.O_NONBLOCK)
    try:
        if not _stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EISDIR if _stat.S_ISDIR(os.fstat(fd).st_mode) else errno.EINVAL,
                          "not a regular file", os.fspath(path))
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


__all__ = ["map_fd", "fd_path", "read_fd", "read_npy", "load_npy", "create_npy", "save_npy", "confined", "open_named"]
