"""The sha256 of a file, read in 4 MiB blocks: one helper for every
checksum the package writes or checks (store files, ONNX exports, GGUF
conversions, saved indexes, corpus inputs); and :func:`content_fingerprint`,
the content hash of a file or folder, hashed again only when a file's
size, mtime or inode changes (what keys evaluation checkpoints to the data
they read); :func:`check_once`, a check of a file (a store's finite
embeddings) run again only when its stats change.

Files are hashed from a descriptor (:func:`sha256_fd`), and a folder is
walked through the files door (:meth:`rcn_fast._files.Folder.walk`): from
the folder's descriptor, never following a link (a link is hashed as its
target's text: a folder holding ``a -> .`` costs one entry, not a loop),
bounded to :data:`rcn_fast._files.MAX_WALK_ENTRIES` entries (past it the
fingerprint is refused, not taken of a part)."""

from __future__ import annotations

import hashlib
import os
import stat
import time
from typing import Any, Callable

from rcn_fast._cache_dirs import cache_dir, trusted_cache


def sha256_file(path: str | os.PathLike[str]) -> str:
    """Hex sha256 of the file at ``path`` (a file the caller names; read
    in 4 MiB blocks from the descriptor it was opened as)."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    try:
        return sha256_fd(fd)
    finally:
        os.close(fd)


def sha256_fd(fd: int) -> str:
    """Hex sha256 of the whole file open as ``fd`` (read from offset 0 in
    4 MiB blocks with ``pread``: the descriptor's offset is not moved)."""
    h = hashlib.sha256()
    pos = 0
    while True:
        block = os.pread(fd, 1 << 22, pos)
        if not block:
            return h.hexdigest()
        h.update(block)
        pos += len(block)


# ---------------------------------------------------------------- content fingerprints
#: Seconds a file must be unchanged before its hash is memoised (a write in the
#: same mtime tick as the hash must never be taken for the hashed content).
RACY_SECONDS = 2.0
_MEMO_FORMAT = "rcn_fast.content_hashes/1"
_PROCESS_MEMO: dict[tuple[str, tuple[int, ...]], str] = {}
#: Memo files the memo folder may hold; past this, a write removes the least
#: recently written ones down to half of it (a lost memo costs one hash).
MAX_MEMO_FILES = 4096


def _memo_file(memo_dir: str | os.PathLike[str] | None, key: str, suffix: str) -> str:
    """The memo file for ``key`` in ``memo_dir`` (default
    ``<rcn_fast cache>/content_hashes``)."""
    if memo_dir is None:
        memo_dir = cache_dir("content_hashes")
    return os.path.join(os.fspath(memo_dir), hashlib.sha256(key.encode()).hexdigest()[:32] + suffix)


def _write_memo(memo_file: str, record: dict) -> None:
    """Write ``record`` to ``memo_file`` atomically (through the files door,
    from the memo folder's descriptor), then keep its folder within
    :data:`MAX_MEMO_FILES`; a cache that cannot be written is ignored (the
    file is hashed or checked again next time)."""
    import json

    from rcn_fast._files import write_atomic

    memo_dir = os.path.dirname(memo_file)
    if not trusted_cache(memo_file, what="memo"):
        return
    try:
        os.makedirs(memo_dir, exist_ok=True)
        write_atomic(memo_dir, os.path.basename(memo_file), json.dumps(record), what="memo", fsync=False)
    except OSError:
        return
    _prune_memos(memo_dir, keep=memo_file)


def _read_memo(memo_file: str, what: str) -> dict:
    """The JSON object of a memo file, {} when absent, unreadable or not
    trusted (the folder chain, and the opened file itself:
    :func:`rcn_fast._cache_dirs.read_trusted`)."""
    import json

    from rcn_fast._cache_dirs import read_trusted

    try:
        if not trusted_cache(memo_file, what=what):
            return {}  # another user could have written it: hash (or check) the files
        raw = read_trusted(os.path.dirname(memo_file), os.path.basename(memo_file), what=what)
        got = json.loads(raw) if raw is not None else {}
    except (OSError, ValueError, TypeError):
        return {}
    return got if isinstance(got, dict) else {}


def _prune_memos(memo_dir: str, keep: str) -> None:
    """Past :data:`MAX_MEMO_FILES` files, remove the least recently written
    (by mtime) down to half of it, never ``keep`` (the memo just written).
    Temporary files of writers killed mid-write count too."""
    try:
        with os.scandir(memo_dir) as it:
            files = [e for e in it if e.is_file(follow_symlinks=False)]
        if len(files) <= MAX_MEMO_FILES:
            return
        aged = []
        for e in files:
            try:
                aged.append((e.stat(follow_symlinks=False).st_mtime_ns, e.path))
            except OSError:
                continue
        aged.sort()
        excess = len(aged) - MAX_MEMO_FILES // 2
        for _, path in aged:
            if excess <= 0:
                break
            if path == keep:  # both os.path.join(memo_dir, name)
                continue
            try:
                os.unlink(path)
                excess -= 1
            except OSError:
                continue
    except OSError:
        pass


def _stat_key(st: os.stat_result) -> tuple[int, ...]:
    """What must be unchanged for a stored hash to be trusted: device,
    inode, size, mtime and ctime (ctime cannot be set back by a user, so a
    rewritten or replaced file never matches)."""
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def _unsettled(fd: int, st: os.stat_result, now: float) -> bool:
    """Whether a result about the file open as ``fd`` (stat-ed ``st``
    before it was read) must not be remembered: its stats have changed
    since, or it changed less than :data:`RACY_SECONDS` before ``now``."""
    return _stat_key(os.fstat(fd)) != _stat_key(st) or now - max(st.st_mtime_ns, st.st_ctime_ns) / 1e9 < RACY_SECONDS


def _open_target(path: str | os.PathLike[str], root: Any) -> tuple[int, str]:
    """(descriptor, label) of the file or folder ``path``: named by the
    caller (``root`` None: its own links followed), or beneath ``root``
    through the files door. FileNotFoundError naming it when absent."""
    from rcn_fast._files import folder

    try:
        if root is None:
            label = os.path.abspath(os.fspath(path))
            fd = os.open(label, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NONBLOCK", 0))
        else:
            with folder(root) as r:
                label = str(r.full(path))
                fd = r.open_fd(path, getattr(os, "O_DIRECTORY", 0) if r.is_dir(path) else os.O_RDONLY)
    except FileNotFoundError:
        raise FileNotFoundError(f"{path} does not exist") from None
    st = os.fstat(fd)
    if not (stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode)):
        os.close(fd)
        raise OSError(f"{label} is neither a file nor a folder")
    return fd, label


def content_fingerprint(path: str | os.PathLike[str], memo_dir: str | os.PathLike[str] | None = None, *,
                        root: Any = None) -> str:
    """The sha256 (hex) of what a file or folder holds.

    A file: the sha256 of its bytes. A folder: the sha256 over every entry
    under it (hidden names left out), in path order: a file its relative
    path, size and sha256; a symbolic link its relative path and target
    (never followed: ``a -> .`` is one entry, not a loop). The folder is
    walked from its descriptor through the files door, at most
    :data:`rcn_fast._files.MAX_WALK_ENTRIES` entries
    (:class:`rcn_fast._files.WalkLimitError` past them), and each file is
    hashed from the descriptor it was opened as.

    ``root``: ``path`` lies beneath this folder and is opened through the
    door (a link out of it is a :class:`rcn_fast._files.LinkError`);
    default: ``path`` is a file or folder the caller names.

    Cheap on a rerun: every file is ``stat``-ed, and a file is hashed again
    only when its device, inode, size, mtime or ctime differ from those
    recorded with its hash -- in this process, or (read only when a file
    is not remembered in this process) in a small JSON memo per file or
    folder under ``memo_dir`` (default ``<rcn_fast cache>/content_hashes``,
    :func:`rcn_fast._cache_dirs.cache_root`). A file changed less than
    :data:`RACY_SECONDS` before it was hashed is not memoised. A memo that
    cannot be read or written is ignored (the files are hashed), and so is
    a memo folder or file another user owns or could write (one warning:
    :func:`rcn_fast._cache_dirs.trusted_cache`). The memo
    folder keeps at most :data:`MAX_MEMO_FILES` files (the least recently
    written go first).

    Raises
    ------
    FileNotFoundError
        ``path`` does not exist.
    """
    from rcn_fast._files import Folder

    fd, label = _open_target(path, root)
    try:
        st0 = os.fstat(fd)
        is_dir = stat.S_ISDIR(st0.st_mode)
        now = time.time()
        links: list[tuple[str, str]] = []
        if is_dir:
            f = Folder.from_fd(os.dup(fd), label)
            try:
                entries = list(f.walk(hidden=False))
            except BaseException:
                f.close()
                raise
            files = [(e.rel, f"{label}/{e.rel}", e.stat) for e in entries if e.kind == "file"]
            links = [(e.rel, e.target or "") for e in entries if e.kind == "link"]

            def opener(rel: str) -> int:
                return f.open_fd(rel, links=False)
        else:
            f = None
            files = [(".", label, st0)]

            def opener(rel: str) -> int:
                return os.dup(fd)
        try:
            shas = [_PROCESS_MEMO.get((lab, _stat_key(st))) for _, lab, st in files]
            if None in shas:  # a file not hashed with these stats in this process: ask the memo file
                shas = _hash_files(files, opener, _memo_file(memo_dir, label, ".json"), label, now)
        finally:
            if f is not None:
                f.close()
    finally:
        os.close(fd)
    if not is_dir:
        return shas[0]
    lines = [(rel, f"{rel}\0{st.st_size}\0{sha}\n") for (rel, _, st), sha in zip(files, shas)]
    lines += [(rel, f"{rel}\0link\0{target}\n") for rel, target in links]
    h = hashlib.sha256(b"rcn_fast.folder/1\0")
    for _, line in sorted(lines):
        h.update(line.encode())
    return h.hexdigest()


def _hash_files(files: list[tuple[str, str, os.stat_result]], opener: Callable[[str], int], memo_file: str,
                root: str, now: float) -> list[str]:
    """The sha256 of each ``(rel, label, stat)`` of :func:`content_fingerprint`'s
    ``root``: from this process's memo or ``memo_file`` when recorded with
    the same stats, else hashed from ``opener(rel)`` (a descriptor; a file
    whose ``fstat`` differs from the walk's, or that changed within
    :data:`RACY_SECONDS`, is used and never remembered)."""
    got = _read_memo(memo_file, "content-hash memo")
    stored = got.get("files") if got.get("format") == _MEMO_FORMAT and got.get("root") == root else {}
    stored = stored if isinstance(stored, dict) else {}
    shas: list[str] = []
    keep: dict[str, list] = {}
    for rel, f, st in files:
        key = _stat_key(st)
        rec = stored.get(rel)
        sha = _PROCESS_MEMO.get((f, key))
        if sha is None and isinstance(rec, list) and len(rec) == 2 and isinstance(rec[1], str) \
                and isinstance(rec[0], list) and tuple(rec[0]) == key:
            sha = rec[1]  # recorded with exactly these stats
        if sha is None:
            fd = opener(rel)
            try:
                sha = sha256_fd(fd)
                unsettled = _stat_key(os.fstat(fd)) != key or _unsettled(fd, st, now)
            finally:
                os.close(fd)
            if unsettled:
                shas.append(sha)
                continue  # changing or just changed: used now, never remembered
        _PROCESS_MEMO[(f, key)] = sha
        keep[rel] = [list(key), sha]
        shas.append(sha)
    if keep != stored:
        _write_memo(memo_file, {"format": _MEMO_FORMAT, "root": root, "files": keep})
    return shas


_PASSED: set[tuple[str, str, tuple[int, ...]]] = set()


def check_once(path: str | os.PathLike[str], tag: str, check: Callable[[], None],
               memo_dir: str | os.PathLike[str] | None = None, *, fd: int | None = None) -> None:
    """Run ``check()`` (which raises on a bad file) unless it already passed
    on the file with the same device, inode, size, mtime and ctime -- in
    this process or, recorded in the same memo folder as
    :func:`content_fingerprint`, in an earlier one. A pass on a file changed
    less than :data:`RACY_SECONDS` before is not recorded.

    ``fd``: the descriptor the checked data was read or mapped from (its
    ``fstat`` is what is compared and recorded; ``path`` only names it);
    default: ``path`` is opened here (a file the caller names).
    ``tag`` names the check (another check of the same file is not skipped).
    A memo folder another user owns or could write is neither read nor
    written (:func:`rcn_fast._cache_dirs.trusted_cache`): the check runs.
    """
    own = fd is None
    if own:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NONBLOCK", 0))
    try:
        label = os.path.abspath(os.fspath(path))
        st = os.fstat(fd)
        key = _stat_key(st)
        if (label, tag, key) in _PASSED:
            return
        memo_file = _memo_file(memo_dir, f"{tag}\0{label}", ".passed.json")
        got = _read_memo(memo_file, "check memo")
        if got.get("format") == _MEMO_FORMAT and got.get("path") == label and got.get("tag") == tag \
                and isinstance(got.get("stat"), list) and tuple(got["stat"]) == key:
            _PASSED.add((label, tag, key))
            return
        check()
        if _unsettled(fd, st, time.time()):
            return  # changing or just changed: checked now, never remembered
    finally:
        if own:
            os.close(fd)
    _PASSED.add((label, tag, key))
    _write_memo(memo_file, {"format": _MEMO_FORMAT, "path": label, "tag": tag, "stat": list(key)})


__all__ = ["sha256_file", "sha256_fd", "content_fingerprint", "check_once", "RACY_SECONDS", "MAX_MEMO_FILES"]
