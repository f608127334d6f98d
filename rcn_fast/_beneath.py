"""Opening a path *beneath* a folder's descriptor: the mechanism of the
files door (:mod:`rcn_fast._files`), apart from its API.

:func:`open_beneath` ``(dirfd, rel, flags)`` returns a descriptor of the
file ``rel`` names under the folder open as ``dirfd``, reached without
ever leaving that folder:

* where the kernel has ``openat2`` (Linux >= 5.6; called through
  ``ctypes``, as glibc has no wrapper before 2.36), in one system call with
  ``RESOLVE_BENEATH`` (and ``RESOLVE_NO_SYMLINKS`` when no link may be
  followed), ``RESOLVE_NO_MAGICLINKS`` always: the kernel resolves the
  path atomically and refuses any step out of ``dirfd`` (``..`` above it,
  an absolute link, a link leading out);
* elsewhere -- and to name the link in an error -- by the portable walk:
  one ``openat(..., O_NOFOLLOW)`` per component from ``dirfd``, holding a
  descriptor per level; a link that may be followed is read with
  ``readlinkat`` and its (relative) target resolved from the descriptor of
  its own folder, ``..`` popping the held descriptors (never the file
  system's ``..``, never above ``dirfd``). An absolute link leads out.

Nothing is checked by name and then used by name: every step starts from
a descriptor, so a component swapped between two steps (a folder renamed
over, a link planted) can only change *which file under the folder* is
reached, never lead out of it. Regular files are opened ``O_NONBLOCK``
(a FIFO planted in place of a file cannot hang the open) and checked with
``fstat`` before the flag is cleared.

``RCN_FAST_NO_OPENAT2=1`` forces the portable walk (the tests run both).
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
O_DIRECTORY = getattr(os, "O_DIRECTORY", 0)
O_NONBLOCK = getattr(os, "O_NONBLOCK", 0)
O_PATH = getattr(os, "O_PATH", 0)
#: the dir-fd calls the walk needs (``openat``, ``readlinkat``, ``mkdirat``): POSIX systems
SUPPORTED = os.open in os.supports_dir_fd and os.readlink in os.supports_dir_fd and bool(O_NOFOLLOW)
#: links followed in one resolution at most (the kernel's own limit)
MAX_LINKS = 40

_RESOLVE_NO_MAGICLINKS, _RESOLVE_NO_SYMLINKS, _RESOLVE_BENEATH = 0x02, 0x04, 0x08
#: openat2's number: one table for every architecture since Linux 5.1's unification (alpha/ia64 differ: not used)
_SYS_OPENAT2 = 437
_OPENAT2_MACHINES = {"x86_64", "amd64", "aarch64", "arm64", "riscv64", "ppc64le", "s390x", "loongarch64"}


class Refused(Exception):
    """A step out of the folder (or through a link where none may be
    followed); :mod:`rcn_fast._files` words it as a ``LinkError``.

    Attributes
    ----------
    kind : {"out", "absolute", "above", "planted", "loop"}
        A link leading out; an absolute link; ``..`` above the folder; a
        link where none may be followed; too many links.
    at : str
        The path (relative to the folder) of the link or component.
    target : str
        The link's target as written ("" for ``..``).
    """

    def __init__(self, kind: str, at: str, target: str = "") -> None:
        super().__init__(kind, at, target)
        self.kind, self.at, self.target = kind, at, target


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


_libc: ctypes.CDLL | None = None
#: None: not tried yet; False: unavailable here (old kernel, seccomp, another OS)
_openat2_ok: bool | None = None


def openat2_available() -> bool:
    """Whether this process resolves through ``openat2`` (tried once)."""
    global _libc, _openat2_ok
    if os.environ.get("RCN_FAST_NO_OPENAT2", "").strip() not in ("", "0"):
        return False
    if _openat2_ok is None:
        _openat2_ok = False
        if platform.system() == "Linux" and platform.machine().lower() in _OPENAT2_MACHINES:
            try:
                _libc = ctypes.CDLL(None, use_errno=True)
                _libc.syscall.restype = ctypes.c_long
                fd = _openat2(os.open("/", os.O_RDONLY | O_DIRECTORY | O_CLOEXEC), ".", os.O_RDONLY | O_DIRECTORY,
                              0, _RESOLVE_BENEATH, probe=True)
                _openat2_ok = fd is not None and fd >= 0
                if fd is not None and fd >= 0:
                    os.close(fd)
            except (OSError, AttributeError):
                _openat2_ok = False
    return bool(_openat2_ok)


def _openat2(dirfd: int, rel: str, flags: int, mode: int, resolve: int, *, probe: bool = False) -> int | None:
    """``openat2(dirfd, rel, {flags, mode, resolve})``: the descriptor, None
    where the call is unavailable (then never tried again), or OSError
    (errno as the kernel set it). ``probe``: ``dirfd`` is closed here."""
    global _openat2_ok
    how = _OpenHow(flags | O_CLOEXEC, mode if flags & os.O_CREAT else 0, resolve)
    try:
        while True:
            fd = _libc.syscall(ctypes.c_long(_SYS_OPENAT2), ctypes.c_int(dirfd), ctypes.c_char_p(os.fsencode(rel)),
                               ctypes.byref(how), ctypes.c_size_t(ctypes.sizeof(how)))
            if fd >= 0:
                return int(fd)
            err = ctypes.get_errno()
            if err == errno.EINTR:
                continue
            if err in (errno.ENOSYS, errno.EPERM, errno.E2BIG) or (err == errno.EINVAL and probe):
                _openat2_ok = False  # not this kernel, or a seccomp filter refusing it: the portable walk
                return None
            raise OSError(err, os.strerror(err), rel)
    finally:
        if probe:
            os.close(dirfd)


def _regular(fd: int, rel: str, flags: int) -> int:
    """``fd`` (opened with ``O_NONBLOCK`` added), checked to be a regular
    file unless a folder was asked for; the flag cleared again."""
    try:
        st = os.fstat(fd)
        if flags & O_DIRECTORY or flags & O_PATH:
            return fd
        if not stat.S_ISREG(st.st_mode):
            raise OSError(errno.EISDIR if stat.S_ISDIR(st.st_mode) else errno.EINVAL,
                          "is a folder" if stat.S_ISDIR(st.st_mode) else "not a regular file", rel)
        if not flags & O_NONBLOCK:
            os.set_blocking(fd, True)
        return fd
    except BaseException:
        os.close(fd)
        raise


def open_beneath(dirfd: int, rel: str, flags: int, mode: int = 0o666, *, links: bool = True,
                 create_dirs: bool = False, anchors: tuple[str, ...] = ()) -> int:
    """A descriptor of ``rel`` (a relative path) beneath the folder ``dirfd``.

    Parameters
    ----------
    dirfd : int
        The folder's descriptor (not closed).
    rel : str
        ``/``-separated; ``.`` and ``..`` allowed as long as they stay
        beneath ``dirfd``. ``""`` or ``"."``: the folder itself.
    flags : int
        ``os.open`` flags (``O_CLOEXEC`` is added; ``O_NONBLOCK`` is used
        for the open of a regular file and cleared after its ``fstat``).
    links : bool
        Follow symbolic links that stay beneath the folder (reads); False:
        any link on the way is refused (writes).
    create_dirs : bool
        Create missing folders on the way (mode 0o777 less the umask).
    anchors : tuple of str
        Absolute paths that name the folder ``dirfd`` (as written, and its
        real path): an absolute link whose target lies under one of them
        is resolved from ``dirfd`` (the rest of its target); any other
        absolute link leads out.

    Raises
    ------
    Refused
        A step out of the folder, through a refused link, or too many links.
    OSError
        The file cannot be opened (missing, not a regular file, denied).
    """
    if os.path.isabs(rel):
        raise Refused("absolute", rel)
    want = flags | O_CLOEXEC | (0 if flags & (O_DIRECTORY | O_PATH) else O_NONBLOCK)
    if not create_dirs and openat2_available():
        resolve = _RESOLVE_BENEATH | _RESOLVE_NO_MAGICLINKS | (0 if links else _RESOLVE_NO_SYMLINKS)
        try:
            fd = _openat2(dirfd, rel or ".", want, mode, resolve)
        except OSError as exc:
            if exc.errno not in (errno.EXDEV, errno.ELOOP, errno.EAGAIN):
                raise  # EXDEV: out; ELOOP: a link; EAGAIN: a rename raced: the walk names it or reaches the file
            fd = None
        if fd is not None:
            return _regular(fd, rel, flags)
    return _regular(_walk(dirfd, rel, want, mode, links=links, create_dirs=create_dirs, anchors=anchors), rel, flags)


def _under(target: str, anchors: tuple[str, ...]) -> str | None:
    """The rest of the absolute ``target`` below the first anchor it lies under, or None."""
    for a in anchors:
        a = a.rstrip("/")
        if target == a or target.startswith(a + "/"):
            return target[len(a):].lstrip("/")
    return None


def _walk(dirfd: int, rel: str, flags: int, mode: int, *, links: bool, create_dirs: bool,
          anchors: tuple[str, ...] = ()) -> int:
    """The portable walk of :func:`open_beneath` (module notes)."""
    pending = [p for p in reversed(rel.split("/"))]  # a stack: the next component last
    stack: list[int] = []  # descriptors opened here, one per level below dirfd
    names: list[str] = []  # the components they stand for (for messages)
    hops = 0
    followed = ("", "")  # the last link followed: (where, its target)
    try:
        while True:
            while pending and pending[-1] in ("", "."):
                pending.pop()
            cur = stack[-1] if stack else dirfd
            if not pending:  # the folder itself (or where the components led)
                return os.open(".", flags & ~(os.O_CREAT | os.O_EXCL | os.O_TRUNC), mode, dir_fd=cur) \
                    if flags & (O_DIRECTORY | O_PATH) else _raise(errno.EISDIR, "is a folder", rel)
            name = pending.pop()
            if name == "..":
                if not stack:  # above the folder: through a followed link, that link leads out
                    raise Refused("out", *followed) if followed[0] else Refused("above", "/".join(names + [".."]))
                os.close(stack.pop())
                names.pop()
                continue
            last = not [p for p in pending if p not in ("", ".")]
            at = "/".join(names + [name])
            try:
                if last:
                    fd = os.open(name, flags | O_NOFOLLOW, mode, dir_fd=cur)
                    if flags & O_PATH and stat.S_ISLNK(os.fstat(fd).st_mode):  # O_PATH opens the link itself
                        os.close(fd)
                        raise OSError(errno.ELOOP, "a symbolic link", name)
                else:
                    fd = os.open(name, os.O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC, dir_fd=cur)
            except FileNotFoundError:
                if not create_dirs or last and not flags & O_DIRECTORY:
                    raise
                try:
                    os.mkdir(name, 0o777, dir_fd=cur)
                except FileExistsError:
                    pass  # made meanwhile (or a link planted: the retry refuses it)
                pending.append(name)
                hops += 1
                if hops > MAX_LINKS:
                    raise Refused("loop", at) from None
                continue
            except OSError as exc:
                if exc.errno not in (errno.ELOOP, errno.ENOTDIR, errno.EMLINK, errno.EEXIST):
                    raise
                try:
                    target = os.readlink(name, dir_fd=cur)
                except OSError:
                    # not a link (now): a link swapped back for a file or folder meanwhile (the open said ELOOP,
                    # or ENOTDIR for a link where a folder was asked): try the step again, a bounded number of times
                    if exc.errno in (errno.ELOOP, errno.ENOTDIR, errno.EMLINK):
                        hops += 1
                        if hops <= MAX_LINKS:
                            pending.append(name)
                            continue
                    raise exc from None
                if not links:
                    raise Refused("planted", at, target) from None
                hops += 1
                if hops > MAX_LINKS:
                    raise Refused("loop", at, target) from None
                if target.startswith("/"):
                    rest = _under(target, anchors)
                    if rest is None:
                        raise Refused("absolute", at, target) from None
                    while stack:  # an absolute name of a file in the folder: from the folder's own descriptor
                        os.close(stack.pop())
                        names.pop()
                    target = rest
                pending.extend(reversed(target.split("/")))  # resolved from the link's own folder
                followed = (at, target)
                continue
            if last:
                return fd
            stack.append(fd)
            names.append(name)
    finally:
        for fd in stack:
            os.close(fd)


class WalkLimitError(OSError, ValueError):
    """A walk of a folder went past its entry or depth limit: refused (the
    message names the folder and the limit), never passed unchecked."""


@dataclass(frozen=True)
class Entry:
    """One entry of :meth:`Folder.walk`: ``rel`` (``/``-separated, relative
    to the folder walked from), ``kind`` (``"file"``, ``"dir"``, ``"link"``
    or ``"other"``), its ``lstat`` and, for a link, its ``target``."""

    rel: str
    kind: str
    stat: os.stat_result
    target: str | None = None


def names(fd: int, limit: int, where: Path) -> list[str]:
    """The names in the folder open as ``fd`` (unsorted); past ``limit`` a :class:`WalkLimitError`."""
    out = []
    with os.scandir(fd) as it:
        for e in it:
            out.append(e.name)
            if len(out) > limit:
                raise WalkLimitError(f"path: {where} holds more than {limit:,} entries; rcn_fast walks at most that "
                                     "many (refused, not checked in part)")
    return out


def walk_fd(fd: int, prefix: str, where: Path, seen: list[int], limit: int, hidden: bool,
            depth: int, max_depth: int = 64) -> Iterator[Entry]:
    """The entries under the folder open as ``fd``, depth first in name order, from descriptors
    (``fstatat``, ``openat(O_NOFOLLOW)``), never following a link; ``seen[0]`` counts them."""
    for name in sorted(names(fd, limit - seen[0], where)):
        seen[0] += 1
        if seen[0] > limit:
            raise WalkLimitError(f"path: {where} holds more than {limit:,} entries; rcn_fast walks at most that "
                                 "many (refused, not checked in part)")
        if not hidden and name.startswith("."):
            continue
        st = os.stat(name, dir_fd=fd, follow_symlinks=False)
        rel = prefix + name
        if stat.S_ISLNK(st.st_mode):
            yield Entry(rel, "link", st, os.readlink(name, dir_fd=fd))
        elif stat.S_ISDIR(st.st_mode):
            yield Entry(rel, "dir", st)
            if depth <= 0:
                raise WalkLimitError(f"path: {where} nests folders more than {max_depth} levels deep ({rel}); "
                                     "refused, not checked in part")
            sub = os.open(name, os.O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC, dir_fd=fd)
            try:
                yield from walk_fd(sub, rel + "/", where, seen, limit, hidden, depth - 1, max_depth)
            finally:
                os.close(sub)
        else:
            yield Entry(rel, "file" if stat.S_ISREG(st.st_mode) else "other", st)


def _raise(err: int, what: str, rel: str) -> int:
    raise OSError(err, what, rel)


def link_out(dirfd: int, rel: str, anchors: tuple[str, ...] = ()) -> Refused | None:
    """Why following ``rel`` beneath ``dirfd`` would leave the folder (the
    :class:`Refused` naming the link), or None when it stays beneath it
    (or does not exist). Used to name the link in a refusal, and by
    ``check_links`` for folders a third-party library reads by name."""
    try:
        os.close(_walk(dirfd, rel, os.O_RDONLY | O_CLOEXEC | (O_PATH or O_NONBLOCK), 0, links=True,
                       create_dirs=False, anchors=anchors))
    except Refused as r:
        return r
    except OSError:
        return None
    return None


__all__ = ["open_beneath", "link_out", "openat2_available", "names", "walk_fd", "Entry", "Refused", "WalkLimitError",
           "SUPPORTED", "MAX_LINKS"]
