"""The sha256 of a file, read in 4 MiB blocks: one helper for every
checksum the package writes or checks (store files, ONNX exports, GGUF
conversions, saved indexes, corpus inputs); and :func:`content_fingerprint`,
the content hash of a file or folder, hashed again only when a file's
size, mtime or inode changes (what keys evaluation checkpoints to the data
they read); :func:`check_once`, a check of a file (a store's finite
embeddings) run again only when its stats change."""

from __future__ import annotations

import hashlib
import os
import time
from typing import Callable

from rcn_fast._cache_dirs import cache_dir, trusted_cache


def sha256_file(path: str | os.PathLike[str]) -> str:
    """Hex sha256 of the file at ``path`` (read in 4 MiB blocks)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


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
    """Write ``record`` to ``memo_file`` atomically, then keep its folder
    within :data:`MAX_MEMO_FILES`; a cache that cannot be written is
    ignored (the file is hashed or checked again next time)."""
    import json

    memo_dir = os.path.dirname(memo_file)
    if not trusted_cache(memo_file, what="memo"):
        return
    try:
        os.makedirs(memo_dir, exist_ok=True)
        tmp = f"{memo_file}.{os.getpid()}.tmp"
        with open(tmp, "w", encoding="utf-8") as out:
            json.dump(record, out)
        os.replace(tmp, memo_file)
    except OSError:
        return
    _prune_memos(memo_dir, keep=memo_file)


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


def _folder_files(root: str) -> list[str]:
    """Relative paths of the regular files under ``root``, sorted; names
    starting with ``.`` (files and folders) are left out, as the Hugging
    Face ``datasets`` loader leaves them out."""
    out = []
    for dirpath, dirnames, filenames in os.walk(root, followlinks=True):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        rel = os.path.relpath(dirpath, root)
        out += [os.path.normpath(os.path.join(rel, f)) for f in filenames if not f.startswith(".")
                and os.path.isfile(os.path.join(dirpath, f))]
    return sorted(out)


def _unsettled(path: str, st: os.stat_result, now: float) -> bool:
    """Whether a result about the file at ``path`` (stat-ed ``st`` before
    it was read) must not be remembered: its stats have changed since, or
    it changed less than :data:`RACY_SECONDS` before ``now``."""
    return _stat_key(os.stat(path)) != _stat_key(st) or now - max(st.st_mtime_ns, st.st_ctime_ns) / 1e9 < RACY_SECONDS


def content_fingerprint(path: str | os.PathLike[str], memo_dir: str | os.PathLike[str] | None = None) -> str:
    """The sha256 (hex) of what a file or folder holds.

    A file: the sha256 of its bytes (:func:`sha256_file`). A folder: the
    sha256 over every file under it (hidden names left out), each entry
    its relative path, size and sha256, in path order.

    Cheap on a rerun: every file is ``stat``-ed, and a file is hashed again
    only when its device, inode, size, mtime or ctime differ from those
    recorded with its hash -- in this process, or (read only when a file
    is not remembered in this process) in a small JSON memo per file or
    folder under ``memo_dir`` (default ``<rcn_fast cache>/content_hashes``,
    :func:`rcn_fast._cache_dirs.cache_root`). A file changed less than
    :data:`RACY_SECONDS` before it was hashed is not memoised. A memo that
    cannot be read or written is ignored (the files are hashed), and so is
    a memo folder another user owns or could write (one warning:
    :func:`rcn_fast._cache_dirs.trusted_cache`). The memo
    folder keeps at most :data:`MAX_MEMO_FILES` files (the least recently
    written go first).

    Raises
    ------
    FileNotFoundError
        ``path`` does not exist.
    """
    root = os.path.realpath(os.fspath(path))
    if not os.path.exists(root):
        raise FileNotFoundError(f"{path} does not exist")
    is_dir = os.path.isdir(root)
    now = time.time()
    files = []
    for rel in _folder_files(root) if is_dir else ["."]:
        f = root if rel == "." else os.path.join(root, rel)
        files.append((rel, f, os.stat(f)))
    shas = [_PROCESS_MEMO.get((f, _stat_key(st))) for _, f, st in files]
    if None in shas:  # a file not hashed with these stats in this process: ask the memo file
        shas = _hash_files(files, _memo_file(memo_dir, root, ".json"), root, now)
    if not is_dir:
        return shas[0]
    h = hashlib.sha256(b"rcn_fast.folder/1\0")
    for (rel, _, st), sha in zip(files, shas):
        h.update(f"{rel}\0{st.st_size}\0{sha}\n".encode())
    return h.hexdigest()


def _hash_files(files: list[tuple[str, str, os.stat_result]], memo_file: str, root: str, now: float) -> list[str]:
    """The sha256 of each ``(rel, path, stat)`` of :func:`content_fingerprint`'s
    ``root``: from this process's memo or ``memo_file`` when recorded with
    the same stats, else hashed (and remembered unless :func:`_unsettled`)."""
    import json

    try:
        if not trusted_cache(memo_file, what="content-hash memo"):
            raise OSError("untrusted")  # another user could have written it: hash the files
        with open(memo_file, encoding="utf-8") as fh:
            got = json.load(fh)
        stored = got["files"] if got.get("format") == _MEMO_FORMAT and got.get("root") == root else {}
        stored = stored if isinstance(stored, dict) else {}
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        stored = {}
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
            sha = sha256_file(f)
            if _unsettled(f, st, now):
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
               memo_dir: str | os.PathLike[str] | None = None) -> None:
    """Run ``check()`` (which raises on a bad file) unless it already passed
    on ``path`` with the same device, inode, size, mtime and ctime -- in this
    process or, recorded in the same memo folder as
    :func:`content_fingerprint`, in an earlier one. A pass on a file changed
    less than :data:`RACY_SECONDS` before is not recorded.

    ``tag`` names the check (another check of the same file is not skipped).
    A memo folder another user owns or could write is neither read nor
    written (:func:`rcn_fast._cache_dirs.trusted_cache`): the check runs.
    """
    import json

    real = os.path.realpath(os.fspath(path))
    st = os.stat(real)
    key = _stat_key(st)
    if (real, tag, key) in _PASSED:
        return
    memo_file = _memo_file(memo_dir, f"{tag}\0{real}", ".passed.json")
    try:
        if not trusted_cache(memo_file, what="check memo"):
            raise OSError("untrusted")  # another user could have written it: run the check
        with open(memo_file, encoding="utf-8") as fh:
            got = json.load(fh)
        if got.get("format") == _MEMO_FORMAT and got.get("path") == real and got.get("tag") == tag \
                and isinstance(got.get("stat"), list) and tuple(got["stat"]) == key:
            _PASSED.add((real, tag, key))
            return
    except (OSError, ValueError, TypeError, AttributeError):
        pass
    check()
    if _unsettled(real, st, time.time()):
        return  # changing or just changed: checked now, never remembered
    _PASSED.add((real, tag, key))
    _write_memo(memo_file, {"format": _MEMO_FORMAT, "path": real, "tag": tag, "stat": list(key)})


__all__ = ["sha256_file", "content_fingerprint", "check_once", "RACY_SECONDS", "MAX_MEMO_FILES"]
