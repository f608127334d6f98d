"""Where rcn_fast caches things it can rebuild, and the one door every
cache and memo is read and written through.

Where: ``$RCN_FAST_CACHE`` when set (also the pinned-URL task cache's
override), else the older ``$RCN_FAST_CACHE_DIR``, else
``$XDG_CACHE_HOME/rcn_fast`` (``~/.cache/rcn_fast``); :func:`cache_dir`
names one cache's folder under it.

Trust (:func:`trusted_cache`): a cache or memo is trusted only when the
entry and every folder from it up to its cache's root are owned by the
current user (or root) and writable by nobody else -- the rule of ssh's
``StrictModes`` (with Debian's refinement: writable by the user's own
private group, which has no other member, is writable by the user alone) --
and so is every file in it: an entry folder holding a file another user
owns or may write (left there before the folder was made private: ``chmod
go-w`` on a folder does not change the files in it), or a symbolic link
(rcn_fast writes none), is not trusted. Another user who can write a cache
could otherwise plant an entry that passes every check a cache makes of
itself (a content-hash memo holding a file's current stats and its old
hash; a tokenizer rebuilt with a recomputed manifest). An untrusted cache
is neither read nor written: its work is recomputed, with one
:class:`UntrustedCacheWarning` per folder and process naming the folder and
why. A cache file rcn_fast reads itself is read through the files door and
judged again by the ``fstat`` of the descriptor it was opened as
(:func:`read_trusted`), so the file read is the file judged.
"""

from __future__ import annotations

import os
import stat
import warnings
from pathlib import Path
from typing import Any


class UntrustedCacheWarning(UserWarning):
    """A cache folder (or entry) is owned by another user or writable by
    group or others: it is ignored and its work recomputed."""


#: folders warned about in this process (one warning each)
_WARNED: set[str] = set()


def cache_root() -> Path:
    """The root folder of rcn_fast's rebuildable caches (not created here)."""
    for var in ("RCN_FAST_CACHE", "RCN_FAST_CACHE_DIR"):
        env = os.environ.get(var, "").strip()
        if env:
            return Path(env).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "rcn_fast"


def cache_dir(name: str) -> Path:
    """The folder of the cache ``name`` under :func:`cache_root` (not created
    here); read and write it through :func:`trusted_cache`."""
    return cache_root() / name


def _private_group(gid: int) -> bool:
    """Whether ``gid`` is the current user's own group with no other member
    (a "user private group", as ``umask 002`` systems give every user):
    writable by that group is writable by the user alone."""
    try:
        import grp
        import pwd

        user, group = pwd.getpwuid(os.geteuid()), grp.getgrgid(gid)
    except (ImportError, KeyError):
        return False
    return gid == user.pw_gid and group.gr_name == user.pw_name and not group.gr_mem


def _problem(path: Path) -> str | None:
    """Why ``path`` (an existing file or folder) cannot be trusted, or None."""
    try:
        st = os.stat(path)
    except OSError:
        return None  # gone: nothing to read
    return stat_problem(st)


def stat_problem(st: os.stat_result) -> str | None:
    """Why a file or folder with the stats ``st`` cannot be trusted (owned
    by another user, writable by group or others), or None."""
    if st.st_uid not in (os.geteuid(), 0):
        return f"is owned by another user (uid {st.st_uid})"
    bits = st.st_mode & (stat.S_IWOTH | (0 if _private_group(st.st_gid) else stat.S_IWGRP))
    if bits:
        who = " and ".join(w for w, bit in (("group", stat.S_IWGRP), ("others", stat.S_IWOTH)) if bits & bit)
        return f"is writable by {who} (mode {stat.S_IMODE(st.st_mode):o})"
    return None


def _warn(p: Path | str, why: str, what: str) -> None:
    if str(p) not in _WARNED:
        _WARNED.add(str(p))
        warnings.warn(UntrustedCacheWarning(
            f"{what}: {p} {why}; it is ignored and its work recomputed (a cache must be owned by you and "
            "writable only by you, as ssh's StrictModes asks: chmod go-w it, or use another cache folder)"),
            stacklevel=3)


def _entry_problem(real: Path) -> tuple[Path, str] | None:
    """(what, why) when a cache entry holds a file or folder that cannot be
    trusted or a symbolic link: every entry under the folder ``real``
    (a bounded walk of the files door, links not followed) or the file
    ``real`` itself (not followed)."""
    from rcn_fast._files import Folder, WalkLimitError

    try:
        st = os.lstat(real)
    except OSError:
        return None
    if stat.S_ISLNK(st.st_mode):
        return real, "is a symbolic link"
    if not stat.S_ISDIR(st.st_mode):
        why = stat_problem(st)
        return (real, why) if why else None
    try:
        with Folder(real) as f:
            for e in f.walk(limit=10_000):
                why = "is a symbolic link" if e.kind == "link" else stat_problem(e.stat)
                if why:
                    return real / e.rel, why
    except WalkLimitError:
        return real, "holds more than 10,000 entries (not checked in part)"
    except OSError:
        return None
    return None


def read_trusted(folder: Any, name: str | os.PathLike[str], *, what: str = "cache",
                 limit: int = 64 << 20) -> bytes | None:
    """The bytes of the cache file ``name`` under ``folder`` (a path or
    :class:`rcn_fast._files.Folder`), read through the files door from the
    descriptor it was opened as, when that file itself is trusted (its
    ``fstat``: owned by you or root, not writable by group or others);
    None when absent, and None with one :class:`UntrustedCacheWarning`
    when it is not trusted. Call it on a folder :func:`trusted_cache`
    allows (the folder chain is judged there)."""
    from rcn_fast._files import folder as open_folder

    try:
        with open_folder(folder, what=what) as f:
            fd = f.open_fd(name)
            full = f.full(name)
    except (FileNotFoundError, NotADirectoryError):
        return None
    try:
        why = stat_problem(os.fstat(fd))
        if why is not None:
            _warn(full, why, what)
            return None
        with os.fdopen(os.dup(fd), "rb") as fh:
            data = fh.read(limit + 1)
    finally:
        os.close(fd)
    if len(data) > limit:
        raise ValueError(f"{what}: {full} holds more than {limit:,} bytes")
    return data


def trusted_cache(path: str | os.PathLike[str], root: str | os.PathLike[str] | None = None, *,
                  what: str = "cache") -> bool:
    """Whether the cache entry or folder ``path`` may be read and written.

    ``path`` and every existing folder from it up to ``root`` (default:
    :func:`cache_root` when ``path`` is under it, else ``path``'s parent),
    symbolic links resolved, must be owned by the current user (or root)
    and not writable by group or others; so must every file under the
    entry ``path`` (a bounded walk of at most 10,000 entries, links not
    followed), and the entry may hold no symbolic link. Otherwise one
    :class:`UntrustedCacheWarning` per folder and process names the folder
    (``what`` says which cache) and False is returned: the caller neither
    reads nor writes it, and recomputes. A path that does not exist yet
    is judged by the folders above it.
    """
    given = Path(os.path.abspath(os.fspath(path)))
    real = Path(os.path.realpath(os.fspath(path)))
    top = Path(os.path.realpath(os.fspath(root if root is not None else cache_root())))
    if real != top and top not in real.parents:
        top = real.parent if root is None else real
    chain = [real] + [p for p in real.parents if p == top or top in p.parents]
    for p in chain:
        why = _problem(p)
        if why is not None:
            _warn(p, why, what)
            return False
    bad = _entry_problem(given) if real != top else None  # the entry's own files (not a whole cache root)
    if bad is not None:
        _warn(bad[0], bad[1], what)
        return False
    return True


__all__ = ["cache_root", "cache_dir", "trusted_cache", "read_trusted", "stat_problem", "UntrustedCacheWarning"]
