"""The one door for files inside a folder the user names: what rcn_fast
reads from a store, a model folder, a task folder or a cache, and what it
writes under ``--output-path``, a cache or a store being built.

Reading (:func:`inside`, :func:`check_links`): a file is opened by its real
path, and only when that path is inside the folder. A symbolic link inside
the folder that leads out of it (``texts.bin -> ~/.ssh/id_rsa``) is refused
with a :class:`LinkError` naming the link and its target -- before
anything is read -- however well the manifest's sizes were made to match.
Links that stay inside the folder are followed (a Hugging Face cache
snapshot's links into its repository's ``blobs/`` stay inside the
repository folder, which is the folder checked for them).

Writing (:func:`no_links`, :func:`open_write`, :func:`make_dirs`): nothing
is written through a symbolic link planted under the folder -- not the
file, not a folder between the root and it (``checkpoints -> /elsewhere``,
``llm_cache.sqlite -> /elsewhere/x``): a :class:`LinkError` names the link.
New files are opened with ``O_NOFOLLOW``, so a link planted between the
check and the open is refused too. The root itself may be a link (the
user named it).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import IO, Any

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_MODES = {"r": os.O_RDONLY, "w": os.O_WRONLY | os.O_CREAT | os.O_TRUNC, "a": os.O_WRONLY | os.O_CREAT | os.O_APPEND,
          "x": os.O_WRONLY | os.O_CREAT | os.O_EXCL}


class LinkError(OSError, ValueError):
    """A symbolic link leads a read out of its folder, or was planted where
    rcn_fast writes; the message names the link and the folder. An
    ``OSError`` (a file-system refusal, as the CLIs report one) and a
    ``ValueError`` (the error of a bad store or folder argument)."""


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def _full(root: str | os.PathLike[str], path: str | os.PathLike[str]) -> tuple[str, str]:
    """(absolute root, absolute path): ``path`` absolute, or relative
    written from where ``root`` is written (``out/checkpoints/x`` for root
    ``out``: taken as is), or else relative to ``root`` (``texts.bin``)."""
    base, rel = os.path.abspath(os.fspath(root)), os.fspath(path)
    if not os.path.isabs(rel) and _under(os.path.normpath(rel), os.path.normpath(os.fspath(root))) \
            and os.path.normpath(os.fspath(root)) != ".":
        return base, os.path.abspath(rel)
    return base, os.path.join(base, rel)


def inside(root: str | os.PathLike[str], path: str | os.PathLike[str], *, what: str = "path",
           written_outside: bool = True) -> Path:
    """The real path of ``path`` (absolute; relative written from where
    ``root`` is written, as ``root / name`` gives it; or a name relative to
    ``root``),
    refusing one that a symbolic link leads out of ``root``.

    ``written_outside``: whether ``path`` may name a file outside ``root``
    as written (``../data/q.jsonl`` in a task file: its author's choice);
    False for a name read from a file in the folder (a manifest's).

    Raises
    ------
    LinkError
        ``path`` lies in ``root`` as written, but its real path does not
        (or, ``written_outside=False``, it does not lie in ``root`` as
        written): the message names ``what``, the link and where it leads.
    """
    base, p = _full(root, path)
    if not written_outside and not _under(os.path.normpath(p), base):
        raise LinkError(f"{what}: {os.fspath(path)!r} names a file outside {base}")
    real, real_root = os.path.realpath(p), os.path.realpath(base)
    if _under(os.path.normpath(p), base) and not _under(real, real_root):
        raise LinkError(f"{what}: {p} leads out of {base} (a symbolic link to {real}); rcn_fast reads only files "
                        "inside the folder it is given: replace the link by the file itself")
    return Path(real)


def check_links(folder: str | os.PathLike[str], *, root: str | os.PathLike[str] | None = None, what: str = "path",
                limit: int = 100_000) -> None:
    """:func:`inside` ``root`` (default: ``folder`` itself) for every
    symbolic link under ``folder`` (walked without following links, at most
    ``limit`` entries).

    Raises
    ------
    LinkError
        A link under ``folder`` leads out of ``root``.
    """
    root = folder if root is None else root
    seen = 0
    for dirpath, dirnames, filenames in os.walk(os.fspath(folder), followlinks=False):
        for name in dirnames + filenames:
            seen += 1
            full = os.path.join(dirpath, name)
            if os.path.islink(full):
                inside(root, full, what=what)
        if seen > limit:
            return


def no_links(root: str | os.PathLike[str], path: str | os.PathLike[str], *, what: str = "path") -> Path:
    """``path`` (as :func:`inside` reads it), checked for writing:
    neither it nor a folder between ``root`` and it is a symbolic link.

    Raises
    ------
    LinkError
        A link was found: the message names it, where it leads and ``what``.
    """
    base, p = _full(root, path)
    p = os.path.normpath(p)
    if not _under(p, base):
        raise LinkError(f"{what}: {p} is not inside {base}")
    parts = os.path.relpath(p, base).split(os.sep) if p != base else []
    cur = base
    for part in parts:
        cur = os.path.join(cur, part)
        if os.path.islink(cur):
            raise LinkError(f"{what}: {cur} is a symbolic link (to {os.readlink(cur)}) planted in {base}; rcn_fast "
                            "does not write through links: remove it")
    return Path(p)


def make_dirs(root: str | os.PathLike[str], path: str | os.PathLike[str], *, what: str = "path") -> Path:
    """``os.makedirs(path, exist_ok=True)`` under ``root``, refusing links (:func:`no_links`)."""
    p = no_links(root, path, what=what)
    os.makedirs(p, exist_ok=True)
    return no_links(root, p, what=what)


def open_write(root: str | os.PathLike[str], path: str | os.PathLike[str], mode: str = "w", *,
               what: str = "path", encoding: str | None = "utf-8", perms: int = 0o666) -> IO[Any]:
    """Open ``path`` under ``root`` for writing (``mode`` ``"w"``, ``"a"``,
    ``"x"`` or ``"r+"``, with ``"b"`` for bytes; ``"+"`` also reads),
    without following a symbolic link: not the file's (``O_NOFOLLOW``),
    not a folder's between ``root`` and it (:func:`no_links`).

    Raises
    ------
    LinkError
        A link is in the way (named).
    OSError
        The file cannot be opened.
    """
    p = no_links(root, path, what=what)
    kind = mode.replace("b", "").replace("t", "").replace("+", "")
    if kind not in _MODES or kind == "r" and "+" not in mode:
        raise ValueError(f"mode: expected 'w', 'a', 'x' or 'r+' (with 'b' for bytes), got {mode!r}")
    flags = _MODES[kind] | _NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    if "+" in mode:
        flags = (flags & ~os.O_WRONLY) | os.O_RDWR
    try:
        fd = os.open(p, flags, perms)
    except OSError as exc:
        if os.path.islink(p):
            raise LinkError(f"{what}: {p} is a symbolic link (to {os.readlink(p)}) planted in "
                            f"{os.path.abspath(os.fspath(root))}; rcn_fast does not write through links: remove it") \
                from None
        raise
    return os.fdopen(fd, mode.replace("x", "w"), encoding=None if "b" in mode else encoding)


def write_text(root: str | os.PathLike[str], path: str | os.PathLike[str], text: str, *, what: str = "path") -> None:
    """Write ``text`` (UTF-8) to ``path`` under ``root`` through :func:`open_write`."""
    with open_write(root, path, "w", what=what) as f:
        f.write(text)


__all__ = ["LinkError", "inside", "check_links", "no_links", "make_dirs", "open_write", "write_text"]
