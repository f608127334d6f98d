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


def content_fingerprint(path: str | os.PathLike[str], memo_dir: str | os.PathLike[str] | None = None) -> str:
    """The sha256 (hex) of what a file or folder holds.

    A file: the sha256 of its bytes (:func:`sha256_file`). A folder: the
    sha256 over every file under it (hidden names left out), each entry
    its relative path, size and sha256, in path order.

    Cheap on a rerun: every file is ``stat``-ed, and a file is hashed again
    only when its device, inode, size, mtime or ctime differ from those
    recorded with its hash -- in this process, or in a small JSON memo per
    file or folder under ``memo_dir`` (default ``<rcn_fast cache>/content_hashes``,
    :func:`rcn_fast._cache_dirs.cache_root`). A file changed less than
    :data:`RACY_SECONDS` before it was hashed is not memoised. A memo that
    cannot be read or written is ignored (the files are hashed).

    Raises
    ------
    FileNotFoundError
        ``path`` does not exist.
    """
    import json

    root = os.path.realpath(os.fspath(path))
    if not os.path.exists(root):
        raise FileNotFoundError(f"{path} does not exist")
    is_dir = os.path.isdir(root)
    rels = _folder_files(root) if is_dir else ["."]
    if memo_dir is None:
        from rcn_fast._cache_dirs import cache_root

        memo_dir = cache_root() / "content_hashes"
    memo_file = os.path.join(os.fspath(memo_dir), hashlib.sha256(root.encode()).hexdigest()[:32] + ".json")
    try:
        with open(memo_file, encoding="utf-8") as fh:
            got = json.load(fh)
        stored = got["files"] if got.get("format") == _MEMO_FORMAT and got.get("root") == root else {}
        stored = stored if isinstance(stored, dict) else {}
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        stored = {}
    now = time.time()
    entries: list[tuple[str, int, str]] = []
    keep: dict[str, list] = {}
    for rel in rels:
        f = root if rel == "." else os.path.join(root, rel)
        st = os.stat(f)
        key = _stat_key(st)
        rec = stored.get(rel)
        sha = _PROCESS_MEMO.get((f, key))
        if sha is None and isinstance(rec, list) and len(rec) == 2 and isinstance(rec[1], str) \
                and isinstance(rec[0], list) and tuple(rec[0]) == key:
            sha = rec[1]  # recorded with exactly these stats
        if sha is None:
            sha = sha256_file(f)
            if _stat_key(os.stat(f)) != key or now - max(st.st_mtime_ns, st.st_ctime_ns) / 1e9 < RACY_SECONDS:
                entries.append((rel, st.st_size, sha))
                continue  # changing or just changed: used now, never remembered
        _PROCESS_MEMO[(f, key)] = sha
        keep[rel] = [list(key), sha]
        entries.append((rel, st.st_size, sha))
    if keep != stored:
        try:
            os.makedirs(os.fspath(memo_dir), exist_ok=True)
            tmp = f"{memo_file}.{os.getpid()}.tmp"
            with open(tmp, "w", encoding="utf-8") as out:
                json.dump({"format": _MEMO_FORMAT, "root": root, "files": keep}, out)
            os.replace(tmp, memo_file)
        except OSError:
            pass  # a read-only cache: hashed again next time
    if not is_dir:
        return entries[0][2]
    h = hashlib.sha256(b"rcn_fast.folder/1\0")
    for rel, size, sha in entries:
        h.update(f"{rel}\0{size}\0{sha}\n".encode())
    return h.hexdigest()


_PASSED: set[tuple[str, str, tuple[int, ...]]] = set()


def check_once(path: str | os.PathLike[str], tag: str, check: Callable[[], None],
               memo_dir: str | os.PathLike[str] | None = None) -> None:
    """Run ``check()`` (which raises on a bad file) unless it already passed
    on ``path`` with the same device, inode, size, mtime and ctime -- in this
    process or, recorded in the same memo folder as
    :func:`content_fingerprint`, in an earlier one. A pass on a file changed
    less than :data:`RACY_SECONDS` before is not recorded.

    ``tag`` names the check (another check of the same file is not skipped).
    """
    import json

    real = os.path.realpath(os.fspath(path))
    st = os.stat(real)
    key = _stat_key(st)
    if (real, tag, key) in _PASSED:
        return
    if memo_dir is None:
        from rcn_fast._cache_dirs import cache_root

        memo_dir = cache_root() / "content_hashes"
    memo_file = os.path.join(os.fspath(memo_dir), hashlib.sha256(f"{tag}\0{real}".encode()).hexdigest()[:32]
                             + ".passed.json")
    try:
        with open(memo_file, encoding="utf-8") as fh:
            got = json.load(fh)
        if got.get("format") == _MEMO_FORMAT and got.get("path") == real and got.get("tag") == tag \
                and isinstance(got.get("stat"), list) and tuple(got["stat"]) == key:
            _PASSED.add((real, tag, key))
            return
    except (OSError, ValueError, TypeError, AttributeError):
        pass
    check()
    if _stat_key(os.stat(real)) != key or time.time() - max(st.st_mtime_ns, st.st_ctime_ns) / 1e9 < RACY_SECONDS:
        return  # changing or just changed: checked now, never remembered
    _PASSED.add((real, tag, key))
    try:
        os.makedirs(os.fspath(memo_dir), exist_ok=True)
        tmp = f"{memo_file}.{os.getpid()}.tmp"
        with open(tmp, "w", encoding="utf-8") as out:
            json.dump({"format": _MEMO_FORMAT, "path": real, "tag": tag, "stat": list(key)}, out)
        os.replace(tmp, memo_file)
    except OSError:
        pass  # a read-only cache: checked again next time


__all__ = ["sha256_file", "content_fingerprint", "check_once", "RACY_SECONDS"]
