"""Paths built from user text (task names, pipeline names, file stems,
model names): one helper that keeps them inside the folder they belong to.

Every place that turns a user-controlled string into a file or folder name
calls :func:`safe_component` (one name, never a path) or :func:`child_path`
(a path under a base folder, checked), so ``name: ../../../x`` in a task
YAML or an absolute name cannot write outside ``--output-path``.
"""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")
_MAX = 200


class UnsafePathError(ValueError):
    """A path built from user text would leave the folder it belongs to."""


def safe_component(text: object, fallback: str = "x") -> str:
    """``text`` as one file-name component: every run of characters other
    than letters, digits and ``. _ -`` becomes ``_`` (path separators,
    NUL, spaces), leading dots and ``_`` are dropped (no hidden files, no
    ``.``/``..``), and an empty result is ``fallback``. A result longer than
    200 characters keeps its start, a digest of the whole and its suffix.

    >>> safe_component("../../../x")
    'x'
    >>> safe_component("/abs/name")
    'abs_name'
    >>> safe_component("arc-easy")
    'arc-easy'
    """
    out = _UNSAFE.sub("_", str(text)).lstrip("._").rstrip("_") or fallback
    if len(out) > _MAX:  # file systems take 255 bytes: keep the start, a digest of the whole and the suffix
        suffix = os.path.splitext(out)[1][:16]
        out = f"{out[:_MAX - 30]}-{hashlib.sha256(out.encode()).hexdigest()[:12]}{suffix}"
    return out


def child_path(base: str | os.PathLike[str], *parts: str) -> Path:
    """``base / part / ...`` with every part made a :func:`safe_component`,
    checked to stay under ``base`` (lexically, so a ``base`` reached
    through a symbolic link is fine).

    Raises
    ------
    UnsafePathError
        The result would not be inside ``base`` (cannot happen for
        sanitised parts; kept as the guarantee callers rely on).
    """
    root = Path(os.path.normpath(os.path.abspath(os.fspath(base))))
    path = root.joinpath(*(safe_component(p) for p in parts))
    norm = Path(os.path.normpath(str(path)))
    if norm != root and root not in norm.parents:
        raise UnsafePathError(f"{path} is not inside {root}")
    return Path(base).joinpath(*(safe_component(p) for p in parts))


def check_name(text: object, what: str) -> str:
    """``text`` if it is a name that is also a safe file-name part (no path
    separator, not ``.``/``..``, no leading dot, no control character);
    else :class:`UnsafePathError` naming ``what``."""
    if not isinstance(text, str) or not text.strip():
        raise UnsafePathError(f"{what}: expected a non-empty name, got {text!r}")
    bad = ("/" in text or "\\" in text or text.startswith(".") or os.path.isabs(text)
           or any(ord(c) < 32 for c in text))
    if bad:
        raise UnsafePathError(f"{what}: {text!r} is not a valid name (it names folders and files of the output: "
                              "no '/', '\\', leading '.', or control characters)")
    return text


__all__ = ["safe_component", "child_path", "check_name", "UnsafePathError"]
