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
private group, which has no other member, is writable by the user alone). Another user who can write a cache could otherwise plant
an entry that passes every check a cache makes of itself (a content-hash
memo holding a file's current stats and its old hash; a tokenizer rebuilt
with a recomputed manifest). An untrusted cache is neither read nor
written: its work is recomputed, with one :class:`UntrustedCacheWarning`
per folder and process naming the folder and why.
"""

from __future__ import annotations

import os
import stat
import warnings
from pathlib import Path


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
    if st.st_uid not in (os.geteuid(), 0):
        return f"is owned by another user (uid {st.st_uid})"
    bits = st.st_mode & (stat.S_IWOTH | (0 if _private_group(st.st_gid) else stat.S_IWGRP))
    if bits:
        who = " and ".join(w for w, bit in (("group", stat.S_IWGRP), ("others", stat.S_IWOTH)) if bits & bit)
        return f"is writable by {who} (mode {stat.S_IMODE(st.st_mode):o})"
    return None


def trusted_cache(path: str | os.PathLike[str], root: str | os.PathLike[str] | None = None, *,
                  what: str = "cache") -> bool:
    """Whether the cache entry or folder ``path`` may be read and written.

    ``path`` and every existing folder from it up to ``root`` (default:
    :func:`cache_root` when ``path`` is under it, else ``path``'s parent),
    symbolic links resolved, must be owned by the current user (or root)
    and not writable by group or others. Otherwise one
    :class:`UntrustedCacheWarning` per folder and process names the folder
    (``what`` says which cache) and False is returned: the caller neither
    reads nor writes it, and recomputes. A path that does not exist yet
    is judged by the folders above it.
    """
    real = Path(os.path.realpath(os.fspath(path)))
    top = Path(os.path.realpath(os.fspath(root if root is not None else cache_root())))
    if real != top and top not in real.parents:
        top = real.parent if root is None else real
    chain = [real] + [p for p in real.parents if p == top or top in p.parents]
    for p in chain:
        why = _problem(p)
        if why is not None:
            if str(p) not in _WARNED:
                _WARNED.add(str(p))
                warnings.warn(UntrustedCacheWarning(
                    f"{what}: {p} {why}; it is ignored and its work recomputed (a cache must be owned by you and "
                    "writable only by you, as ssh's StrictModes asks: chmod go-w it, or use another cache folder)"),
                    stacklevel=2)
            return False
    return True


__all__ = ["cache_root", "cache_dir", "trusted_cache", "UntrustedCacheWarning"]
