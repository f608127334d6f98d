"""The one door for files inside a folder the user names: what rcn_fast
reads from a store, an index, a task folder, a model folder or a cache,
and what it writes under ``--output-path``, a cache or a store being built.

Files by handle, not by name. A :class:`Folder` opens the folder once
(the user named it: that one open follows links) and keeps its
descriptor; every file beneath it is reached from that descriptor by
:func:`rcn_fast._beneath.open_beneath` (``openat2`` with
``RESOLVE_BENEATH``, or a walk of ``openat(..., O_NOFOLLOW)`` one
component at a time), and is then ``fstat``-ed, read, written or
memory-mapped through the descriptor it was opened as. Nothing is checked
by name and used by name, so swapping a component between two steps (a
file for a link, a folder for a link) changes at most which file *under
the folder* is reached.

Reading follows a symbolic link only while it stays beneath the folder
(a Hugging Face cache snapshot's ``snapshots/<rev>/x -> ../../blobs/<sha>``
stays inside its repository folder, the root its readers name); a link
leading out (``texts.bin -> ~/.ssh/id_rsa``), an absolute link and ``..``
above the folder are a :class:`LinkError` naming the link and its target,
before anything is read. Writing follows no link at all: a link planted
as the file or as a folder on the way (``checkpoints -> /elsewhere``) is a
:class:`LinkError` naming it, and nothing is written. Walks
(:meth:`Folder.walk`, :func:`glob`, :func:`check_links`) never follow a
link and refuse (:class:`WalkLimitError`) past their entry limit instead
of stopping silently.

Data read, written and mapped from those descriptors (arrays, whole files,
the files a reader is given) is :mod:`rcn_fast._file_data`'s; the
resolver is :mod:`rcn_fast._beneath`'s.

Every function takes the root as a path or as an open :class:`Folder`
(hot paths open the root once and pass it); a path under the root is a
name relative to it, a path written from where the root is written
(``out/checkpoints/x`` for the root ``out``) or an absolute path inside
it. What the door cannot promise is in docs/security.md (hard links, a
root swapped before it is opened, platforms without ``openat``).
"""

from __future__ import annotations

import contextlib
import errno
import fnmatch
import os
import stat as _stat
from pathlib import Path
from typing import IO, Any, Iterator, Union

from rcn_fast._beneath import (
    O_CLOEXEC,
    O_DIRECTORY,
    O_NOFOLLOW,
    O_PATH,
    Entry,
    Refused,
    WalkLimitError,
    open_beneath,
    walk_fd,
)
from rcn_fast._beneath import names as _names

#: entries a walk, glob or link check visits at most before it refuses
MAX_WALK_ENTRIES = 100_000
#: folder levels a walk descends at most
MAX_WALK_DEPTH = 64
_MODES = {"w": os.O_WRONLY | os.O_CREAT | os.O_TRUNC, "a": os.O_WRONLY | os.O_CREAT | os.O_APPEND,
          "x": os.O_WRONLY | os.O_CREAT | os.O_EXCL, "r": os.O_RDWR}


class LinkError(OSError, ValueError):
    """A symbolic link leads a read out of its folder, or was planted where
    rcn_fast writes; the message names the link and the folder. An
    ``OSError`` (a file-system refusal, as the CLIs report one) and a
    ``ValueError`` (the error of a bad store or folder argument)."""


def _reopen(path: str, what: str) -> "Folder":
    return Folder(path, what=what)


Root = Union[str, "os.PathLike[str]", "Folder"]


class Folder:
    """A folder opened once; every file beneath it is reached from its
    descriptor (module notes).

    Parameters
    ----------
    path : str or path
        The folder (the user named it: a link here is followed).
    what : str
        The argument messages name (``"path"``, ``"checkpoint"``, ``"model"``).
    create : bool
        Create the folder (and its parents) first.
    """

    def __init__(self, path: str | os.PathLike[str], *, what: str = "path", create: bool = False) -> None:
        self.fd = -1
        self.what = what
        self.path = Path(os.path.abspath(os.fspath(path)))
        self._written = os.path.normpath(os.fspath(path))
        if create:
            os.makedirs(self.path, exist_ok=True)
        self.fd = os.open(self.path, os.O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        self._anchors: tuple[str, ...] | None = None

    @classmethod
    def from_fd(cls, fd: int, path: str | os.PathLike[str], *, what: str = "path") -> "Folder":
        """A :class:`Folder` over the folder descriptor ``fd`` (owned from
        now on: closed with it), named ``path`` in messages."""
        f = cls.__new__(cls)
        f.fd, f.what, f.path = fd, what, Path(os.path.abspath(os.fspath(path)))
        f._written, f._anchors = str(f.path), None
        return f

    @property
    def anchors(self) -> tuple[str, ...]:
        """The absolute names of this folder: as written, and its real path
        (read from its descriptor where ``/proc`` has it)."""
        if self._anchors is None:
            try:
                real = os.readlink(f"/proc/self/fd/{self.fd}")
            except OSError:
                real = os.path.realpath(self.path)
            self._anchors = tuple(dict.fromkeys((str(self.path), real)))
        return self._anchors

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> "Folder":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Folder({str(self.path)!r})"

    def __reduce__(self) -> tuple[Any, ...]:
        """In another process the folder is opened again by its path (a descriptor is this process's)."""
        return (_reopen, (str(self.path), self.what))

    # ---------------------------------------------------------------- names
    def rel(self, path: str | os.PathLike[str]) -> str:
        """``path`` relative to the folder (see the module notes); a path
        written outside it is a :class:`LinkError`."""
        p = os.fspath(path)
        base = str(self.path).rstrip(os.sep) or os.sep
        if os.path.isabs(p):
            n = os.path.normpath(p)
        elif self._written not in (".", "") and (os.path.normpath(p) == self._written
                                                 or os.path.normpath(p).startswith(self._written + os.sep)):
            n = os.path.abspath(p)
        else:
            return p.replace(os.sep, "/")
        if n == base:
            return ""
        if not n.startswith(base.rstrip(os.sep) + os.sep):
            raise LinkError(f"{self.what}: {p} is not inside {self.path}")
        return n[len(base.rstrip(os.sep)) + 1:].replace(os.sep, "/")

    def full(self, path: str | os.PathLike[str]) -> Path:
        """The path of ``path`` under the folder, for messages."""
        r = self.rel(path)
        return self.path / r if r else self.path

    def _refusal(self, r: Refused, path: str | os.PathLike[str]) -> LinkError:
        full, at = self.full(path), self.path / r.at if r.at else self.path
        if r.kind == "planted":
            return LinkError(f"{self.what}: {at} is a symbolic link (to {r.target}) planted in {self.path}; rcn_fast "
                             "does not write through links: remove it")
        if r.kind == "above":
            return LinkError(f"{self.what}: {os.fspath(path)!r} names a file outside {self.path} (.. climbs above "
                             "the folder)")
        if r.kind == "loop":
            return LinkError(f"{self.what}: {full}: too many symbolic links on the way (a loop?) in {self.path}")
        where = "" if at == full else f", at {at}"
        return LinkError(f"{self.what}: {full} leads out of {self.path} (a symbolic link to {r.target}{where}); "
                         "rcn_fast reads only files inside the folder it is given: replace the link by the file itself")

    # ---------------------------------------------------------------- opening
    def open_fd(self, path: str | os.PathLike[str], flags: int = os.O_RDONLY, mode: int = 0o666, *,
                links: bool = True, create_dirs: bool = False) -> int:
        """A descriptor of ``path`` beneath the folder (``os.open`` flags;
        the caller closes it). ``links``: follow links that stay inside
        (reads); False refuses any (writes).

        Raises
        ------
        LinkError
            A link leads out, or was found where none may be followed.
        OSError
            Cannot be opened (the message names the full path).
        """
        rel = self.rel(path)
        try:
            return open_beneath(self.fd, rel, flags, mode, links=links, create_dirs=create_dirs,
                                anchors=self.anchors if links else ())
        except Refused as r:
            raise self._refusal(r, path) from None
        except OSError as exc:
            raise OSError(exc.errno, exc.strerror, str(self.full(path))) from None

    def open_read(self, path: str | os.PathLike[str], *, links: bool = True) -> IO[bytes]:
        """``path`` open for reading (binary, reads of the descriptor;
        ``links=False``: no link followed, as for a file rcn_fast wrote)."""
        return os.fdopen(self.open_fd(path, links=links), "rb")

    def read_bytes(self, path: str | os.PathLike[str], *, limit: int | None = None, links: bool = True) -> bytes:
        """The bytes of ``path``; past ``limit`` bytes a ValueError naming it."""
        with self.open_read(path, links=links) as f:
            data = f.read() if limit is None else f.read(limit + 1)
        if limit is not None and len(data) > limit:
            raise ValueError(f"{self.what}: {self.full(path)} holds more than {limit:,} bytes")
        return data

    def read_text(self, path: str | os.PathLike[str], *, limit: int | None = None, links: bool = True) -> str:
        """The UTF-8 text of ``path`` (UnicodeDecodeError on other bytes)."""
        return self.read_bytes(path, limit=limit, links=links).decode("utf-8")

    def stat(self, path: str | os.PathLike[str] = "", *, links: bool = True) -> os.stat_result:
        """``fstat`` of ``path`` opened beneath the folder (``links=False``:
        the entry itself, a link not followed). FileNotFoundError when absent."""
        rel = self.rel(path)
        if not links:
            head, _, name = rel.rpartition("/")
            if name in ("", ".", ".."):
                return self.stat(path)
            fd = self.open_fd(head or ".", os.O_RDONLY | O_DIRECTORY, links=False)
            try:
                return os.stat(name, dir_fd=fd, follow_symlinks=False)
            except OSError as exc:
                raise OSError(exc.errno, exc.strerror, str(self.full(path))) from None
            finally:
                os.close(fd)
        fd = self.open_fd(path, O_PATH or (os.O_RDONLY | os.O_NONBLOCK))
        try:
            return os.fstat(fd)
        finally:
            os.close(fd)

    def exists(self, path: str | os.PathLike[str]) -> bool:
        """Whether ``path`` exists beneath the folder (a link leading out
        is a :class:`LinkError`, not False)."""
        try:
            self.stat(path)
            return True
        except (FileNotFoundError, NotADirectoryError):
            return False

    def is_file(self, path: str | os.PathLike[str]) -> bool:
        try:
            return _stat.S_ISREG(self.stat(path).st_mode)
        except (FileNotFoundError, NotADirectoryError):
            return False

    def is_dir(self, path: str | os.PathLike[str]) -> bool:
        try:
            return _stat.S_ISDIR(self.stat(path).st_mode)
        except (FileNotFoundError, NotADirectoryError):
            return False

    def sub(self, path: str | os.PathLike[str], *, create: bool = False, links: bool = True) -> "Folder":
        """The folder ``path`` beneath this one, opened as a :class:`Folder`
        of its own (``create``: made first, and then no link is followed)."""
        fd = self.open_fd(path, os.O_RDONLY | O_DIRECTORY, links=links and not create, create_dirs=create)
        return Folder.from_fd(fd, self.full(path), what=self.what)

    def listdir(self, path: str | os.PathLike[str] = "", *, limit: int = MAX_WALK_ENTRIES) -> list[str]:
        """The sorted names in the folder ``path`` (at most ``limit``, else
        a :class:`WalkLimitError`)."""
        fd = self.open_fd(path, os.O_RDONLY | O_DIRECTORY)
        try:
            return sorted(_names(fd, limit, self.full(path)))
        finally:
            os.close(fd)

    def walk(self, path: str | os.PathLike[str] = "", *, limit: int = MAX_WALK_ENTRIES, hidden: bool = True,
             depth: int = MAX_WALK_DEPTH) -> Iterator[Entry]:
        """Every entry under the folder ``path``, depth first in name order,
        never following a link (a link is an entry of kind ``"link"``).
        ``hidden=False`` leaves out names starting with ``.`` (and what is
        under them). Past ``limit`` entries or ``depth`` levels a
        :class:`WalkLimitError` naming the folder."""
        top = self.open_fd(path, os.O_RDONLY | O_DIRECTORY)
        prefix = os.path.normpath(self.rel(path) or ".").replace(os.sep, "/")
        prefix = "" if prefix == "." else prefix
        seen = [0]
        try:
            yield from walk_fd(top, f"{prefix}/" if prefix else "", self.full(path), seen, limit, hidden, depth, depth)
        finally:
            os.close(top)

    def glob(self, pattern: str, *, limit: int = MAX_WALK_ENTRIES) -> list[str]:
        """The files (and links) under the folder matching ``pattern``
        (``/``-separated, relative; ``*``, ``?``, ``[...]`` within a name,
        ``**`` any folders), sorted; a bounded walk (:meth:`walk`), links
        not followed into. A leading ``.`` is matched only by a pattern
        that writes it, as glob does."""
        parts = [p for p in pattern.split("/") if p not in ("", ".")]
        if not parts or os.path.isabs(pattern) or ".." in parts:
            raise LinkError(f"{self.what}: the pattern {pattern!r} is not a relative path inside {self.path}")
        fixed = []
        for p in parts[:-1]:
            if _magic(p):
                break
            fixed.append(p)
        start = "/".join(fixed)
        if start and not self.is_dir(start):
            return []
        rest = parts[len(fixed):]
        found = []
        for e in self.walk(start, limit=limit):
            if e.kind in ("file", "link") and _match(rest, e.rel.split("/")[len(fixed):]):
                found.append(e.rel)
        return sorted(found)

    # ---------------------------------------------------------------- writing
    def open_write(self, path: str | os.PathLike[str], mode: str = "w", *, encoding: str | None = "utf-8",
                   perms: int = 0o666) -> IO[Any]:
        """``path`` open for writing (``mode`` ``"w"``, ``"a"``, ``"x"`` or
        ``"r+"``, with ``"b"`` for bytes; ``"+"`` also reads), following no
        link on the way (module notes).

        Raises
        ------
        LinkError
            A link is in the way (named).
        ValueError
            Another mode.
        """
        kind = mode.replace("b", "").replace("t", "").replace("+", "")
        if kind not in _MODES or kind == "r" and "+" not in mode:
            raise ValueError(f"mode: expected 'w', 'a', 'x' or 'r+' (with 'b' for bytes), got {mode!r}")
        flags = _MODES[kind] | (os.O_RDWR if "+" in mode else 0)
        if "+" in mode:
            flags &= ~os.O_WRONLY
        fd = self.open_fd(path, flags, perms, links=False)
        return os.fdopen(fd, mode.replace("x", "w"), encoding=None if "b" in mode else encoding)

    def make_dirs(self, path: str | os.PathLike[str]) -> None:
        """``path`` and the folders on the way created (those that exist
        are kept), following no link."""
        os.close(self.open_fd(path, os.O_RDONLY | O_DIRECTORY, links=False, create_dirs=True))

    def _parent(self, path: str | os.PathLike[str], *, create: bool = False) -> tuple[int, str]:
        """(descriptor of the folder holding ``path``, its last name): no link on the way."""
        rel = self.rel(path)
        head, _, name = rel.rpartition("/")
        if name in ("", ".", ".."):
            raise IsADirectoryError(errno.EISDIR, "names a folder, not a file", str(self.full(path)))
        return self.open_fd(head or ".", os.O_RDONLY | O_DIRECTORY, links=False, create_dirs=create), name

    def replace(self, src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
        """Rename ``src`` over ``dst`` (``renameat`` from the descriptors of
        their folders: a link is renamed as itself, never followed)."""
        a, an = self._parent(src)
        try:
            b, bn = self._parent(dst)
            try:
                os.replace(an, bn, src_dir_fd=a, dst_dir_fd=b)
            except OSError as exc:
                raise OSError(exc.errno, exc.strerror, str(self.full(dst))) from None
            finally:
                os.close(b)
        finally:
            os.close(a)

    def unlink(self, path: str | os.PathLike[str], *, missing_ok: bool = True) -> None:
        """Remove the file (or link) ``path``, following no link on the way."""
        fd, name = self._parent(path)
        try:
            os.unlink(name, dir_fd=fd)
        except FileNotFoundError:
            if not missing_ok:
                raise
        finally:
            os.close(fd)

    def write_atomic(self, path: str | os.PathLike[str], data: bytes | str, *, fsync: bool = True,
                     perms: int = 0o666) -> None:
        """``data`` (text as UTF-8) in ``path``: written to a temporary file
        beside it, flushed to disk and renamed over it, all from the
        descriptor of its folder (a reader sees the old file or the whole
        new one)."""
        raw = data.encode("utf-8") if isinstance(data, str) else data
        fd, name = self._parent(path)
        tmp = f".{name}.{os.getpid()}.{id(raw):x}.tmp"
        try:
            out = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | O_NOFOLLOW | O_CLOEXEC, perms, dir_fd=fd)
            try:
                with os.fdopen(out, "wb") as f:
                    f.write(raw)
                    f.flush()
                    if fsync:
                        os.fsync(f.fileno())
                os.replace(tmp, name, src_dir_fd=fd, dst_dir_fd=fd)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tmp, dir_fd=fd)
                raise
        except OSError as exc:
            raise OSError(exc.errno, exc.strerror, str(self.full(path))) from None
        finally:
            os.close(fd)


# -------------------------------------------------------------------- helpers
def _magic(part: str) -> bool:
    return any(c in part for c in "*?[")


def _match(pat: list[str], parts: list[str]) -> bool:
    if not pat:
        return not parts
    if pat[0] == "**":
        return _match(pat[1:], parts) or (bool(parts) and not parts[0].startswith(".") and _match(pat, parts[1:]))
    if not parts or (parts[0].startswith(".") and not pat[0].startswith(".")):
        return False
    return fnmatch.fnmatchcase(parts[0], pat[0]) and _match(pat[1:], parts[1:])


@contextlib.contextmanager
def folder(root: Root, *, what: str = "path", create: bool = False) -> Iterator[Folder]:
    """``root`` as a :class:`Folder`: the one given (kept open), or opened
    here (``create``: made first, as the user named it) and closed on exit."""
    if isinstance(root, Folder):
        yield root
        return
    f = Folder(root, what=what, create=create)
    try:
        yield f
    finally:
        f.close()


# -------------------------------------------------------------------- module-level API
def open_read(root: Root, path: str | os.PathLike[str], *, what: str = "path", links: bool = True) -> IO[bytes]:
    """:meth:`Folder.open_read` of ``path`` under ``root``."""
    with folder(root, what=what) as f:
        return f.open_read(path, links=links)


def read_bytes(root: Root, path: str | os.PathLike[str], *, what: str = "path", limit: int | None = None,
               links: bool = True) -> bytes:
    """:meth:`Folder.read_bytes` of ``path`` under ``root``."""
    with folder(root, what=what) as f:
        return f.read_bytes(path, limit=limit, links=links)


def read_text(root: Root, path: str | os.PathLike[str], *, what: str = "path", limit: int | None = None,
              links: bool = True) -> str:
    """:meth:`Folder.read_text` of ``path`` under ``root``."""
    with folder(root, what=what) as f:
        return f.read_text(path, limit=limit, links=links)


def stat(root: Root, path: str | os.PathLike[str] = "", *, what: str = "path", links: bool = True) -> os.stat_result:
    """:meth:`Folder.stat` of ``path`` under ``root``."""
    with folder(root, what=what) as f:
        return f.stat(path, links=links)


def is_file(root: Root, path: str | os.PathLike[str], *, what: str = "path") -> bool:
    """Whether ``path`` under ``root`` is a regular file (a link leading out raises)."""
    try:
        with folder(root, what=what) as f:
            return f.is_file(path)
    except (FileNotFoundError, NotADirectoryError):
        return False


def open_fd(root: Root, path: str | os.PathLike[str], flags: int = os.O_RDONLY, *, what: str = "path") -> int:
    """:meth:`Folder.open_fd` of ``path`` under ``root`` (reads: links inside followed)."""
    with folder(root, what=what) as f:
        return f.open_fd(path, flags)


def open_write(root: Root, path: str | os.PathLike[str], mode: str = "w", *, what: str = "path",
               encoding: str | None = "utf-8", perms: int = 0o666) -> IO[Any]:
    """:meth:`Folder.open_write` of ``path`` under ``root``."""
    with folder(root, what=what) as f:
        return f.open_write(path, mode, encoding=encoding, perms=perms)


def write_text(root: Root, path: str | os.PathLike[str], text: str, *, what: str = "path") -> None:
    """``text`` (UTF-8) in ``path`` under ``root``, through :func:`open_write`."""
    with open_write(root, path, "w", what=what) as f:
        f.write(text)


def write_atomic(root: Root, path: str | os.PathLike[str], data: bytes | str, *, what: str = "path",
                 fsync: bool = True) -> None:
    """:meth:`Folder.write_atomic` of ``path`` under ``root``."""
    with folder(root, what=what) as f:
        f.write_atomic(path, data, fsync=fsync)


def make_dirs(root: Root, path: str | os.PathLike[str], *, what: str = "path") -> None:
    """:meth:`Folder.make_dirs` of ``path`` under ``root`` (the root itself
    made first when missing: the folder the user named)."""
    with folder(root, what=what, create=True) as f:
        f.make_dirs(path)


def replace(root: Root, src: str | os.PathLike[str], dst: str | os.PathLike[str], *, what: str = "path") -> None:
    """:meth:`Folder.replace` of ``src`` over ``dst`` under ``root``."""
    with folder(root, what=what) as f:
        f.replace(src, dst)


def listdir(root: Root, path: str | os.PathLike[str] = "", *, what: str = "path",
            limit: int = MAX_WALK_ENTRIES) -> list[str]:
    """:meth:`Folder.listdir` of ``path`` under ``root``."""
    with folder(root, what=what) as f:
        return f.listdir(path, limit=limit)


def glob(root: Root, pattern: str, *, what: str = "path", limit: int = MAX_WALK_ENTRIES) -> list[str]:
    """:meth:`Folder.glob` of ``pattern`` under ``root``."""
    with folder(root, what=what) as f:
        return f.glob(pattern, limit=limit)


def check_links(path: str | os.PathLike[str], *, root: Root | None = None, what: str = "path",
                limit: int = MAX_WALK_ENTRIES) -> None:
    """Refuse a folder handed to a library that reads it by name
    (transformers, bm25s, datasets) when a symbolic link under it leads out
    of ``root`` (default: the folder itself): a bounded walk from the
    descriptor, each link resolved beneath ``root``. This is a check, not a
    handle: the library opens the files again by name (docs/security.md).

    Raises
    ------
    LinkError
        A link under ``path`` leads out of ``root`` (named).
    WalkLimitError
        More than ``limit`` entries: refused, not checked in part.
    """
    from rcn_fast._beneath import link_out

    with folder(path if root is None else root, what=what) as r:
        start = "" if root is None else r.rel(os.path.abspath(os.fspath(path)))
        for e in r.walk(start, limit=limit):
            if e.kind == "link":
                why = link_out(r.fd, e.rel, r.anchors)
                if why is not None:
                    raise r._refusal(why, e.rel)


def refuse_links(root: Root, path: str | os.PathLike[str], *, what: str = "path") -> None:
    """A :class:`LinkError` naming the link when ``path`` under ``root`` or
    a folder on the way is a symbolic link (nothing when a part is
    missing). A check for a library that opens the file by name itself
    (sqlite): rcn_fast's own reads and writes open beneath the folder's
    descriptor instead."""
    try:
        f = root if isinstance(root, Folder) else Folder(root, what=what)
    except (FileNotFoundError, NotADirectoryError):
        return  # no folder yet: no link in it
    try:
        if os.path.normpath(f.rel(path) or ".") == ".":
            return  # the folder itself (the user named it)
        try:
            fd, name = f._parent(path)
        except (FileNotFoundError, NotADirectoryError):
            return  # a folder on the way is missing: no link there (a link on the way is a LinkError)
        try:
            st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            target = os.readlink(name, dir_fd=fd) if _stat.S_ISLNK(st.st_mode) else None
        except FileNotFoundError:
            return
        finally:
            os.close(fd)
        if target is not None:
            raise f._refusal(Refused("planted", f.rel(path), target), path)
    finally:
        if f is not root:
            f.close()


__all__ = ["LinkError", "WalkLimitError", "Folder", "Entry", "folder", "open_read", "open_fd", "read_bytes",
           "read_text", "stat", "is_file", "open_write", "write_text", "write_atomic", "make_dirs", "replace",
           "listdir", "glob", "check_links", "refuse_links", "MAX_WALK_ENTRIES", "MAX_WALK_DEPTH"]
