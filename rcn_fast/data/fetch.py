"""Files pinned by content: downloaded once, verified, read offline afterwards.

A task can name its data as a URL and the SHA-256 of the file's bytes
(``url:`` and ``sha256:`` in the task YAML, e.g. the ReConnect authors'
evaluation files on GitHub). :func:`fetch_pinned` downloads the file into
a cache folder under its checksum, checks the bytes and returns the cached
path; later calls find the file there and never touch the network.

Cache folder: ``$RCN_FAST_CACHE/tasks`` when ``RCN_FAST_CACHE`` is set,
else ``$HF_HOME/rcn_fast/tasks`` (``HF_HOME`` defaults to
``$XDG_CACHE_HOME/huggingface``, i.e. ``~/.cache/huggingface``), so the
task files sit beside the Hugging Face datasets the other tasks read.
Offline mode (``HF_HUB_OFFLINE=1``, ``HF_DATASETS_OFFLINE=1`` or
``RCN_FAST_OFFLINE=1``) reads the cache only.
"""

from __future__ import annotations

import hashlib
import os
import re
import tempfile
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_CHUNK = 1 << 20
_TRUE = {"1", "true", "yes", "on"}


class FetchError(ValueError):
    """A pinned file that cannot be had: a checksum mismatch, an unreachable
    URL while nothing is cached, or offline mode with an empty cache."""


def cache_dir() -> Path:
    """The folder pinned task files are cached in (see the module docstring).

    Returns
    -------
    pathlib.Path (not created here)
    """
    env = os.environ.get("RCN_FAST_CACHE")
    if env:
        return Path(env).expanduser() / "tasks"
    hf_home = os.environ.get("HF_HOME")
    if not hf_home:
        base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
        hf_home = str(Path(base) / "huggingface")
    return Path(hf_home).expanduser() / "rcn_fast" / "tasks"


def is_offline() -> bool:
    """Whether offline mode is on (``HF_HUB_OFFLINE``, ``HF_DATASETS_OFFLINE``
    or ``RCN_FAST_OFFLINE`` set to 1/true/yes/on)."""
    return any(os.environ.get(k, "").strip().lower() in _TRUE
               for k in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "RCN_FAST_OFFLINE"))


def check_sha256(value: object, what: str = "sha256") -> str:
    """``value`` as a lower-case 64-digit hex string, or a ValueError naming ``what``."""
    if not isinstance(value, str) or not _SHA256.match(value.strip().lower()):
        raise ValueError(f"{what}: expected the 64 hexadecimal digits of a SHA-256 checksum, got {value!r}")
    return value.strip().lower()


def sha256_of(path: str | os.PathLike[str]) -> str:
    """SHA-256 (hex) of a file's bytes, read in 1 MiB chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(_CHUNK), b""):
            h.update(chunk)
    return h.hexdigest()


def _file_name(url: str) -> str:
    from rcn_fast._paths import safe_component

    return safe_component(Path(urllib.parse.urlparse(url).path).name, "data")


def cached_path(url: str, sha256: str) -> Path:
    """Where :func:`fetch_pinned` keeps the file of ``url`` pinned to ``sha256``."""
    return cache_dir() / check_sha256(sha256) / _file_name(url)


def fetch_pinned(url: str, sha256: str, *, timeout: float = 60.0) -> Path:
    """The local copy of a file pinned by its SHA-256, downloading it once.

    Parameters
    ----------
    url : str
        ``http(s)://`` (or ``file://``) address of the file.
    sha256 : str
        The 64 hex digits of the SHA-256 of the file's bytes.
    timeout : float
        Seconds to wait on the server.

    Returns
    -------
    pathlib.Path
        The verified file in the cache (:func:`cached_path`).

    Raises
    ------
    FetchError
        The downloaded bytes have another checksum (nothing is cached), the
        URL cannot be reached and nothing is cached, or offline mode is on
        and nothing is cached.
    ValueError
        A malformed ``url`` or ``sha256``.
    """
    if not isinstance(url, str) or urllib.parse.urlparse(url).scheme not in ("http", "https", "file"):
        raise ValueError(f"url: expected an http(s):// or file:// address, got {url!r}")
    want = check_sha256(sha256)
    dest = cached_path(url, want)
    if dest.is_file():
        if sha256_of(dest) == want:
            return dest
        dest.unlink()  # a damaged cache entry: fetch it again
    if is_offline():
        raise FetchError(f"{url} is not in the cache ({dest}) and offline mode is on; run once online, or "
                         f"download the file yourself (sha256 {want}) and pass its path")
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".part-", dir=dest.parent)
    h = hashlib.sha256()
    try:
        with os.fdopen(fd, "wb") as out:
            try:
                req = urllib.request.Request(url, headers={"User-Agent": "rcn_fast"})
                with urllib.request.urlopen(req, timeout=timeout) as resp:
                    for chunk in iter(lambda: resp.read(_CHUNK), b""):
                        h.update(chunk)
                        out.write(chunk)
            except (urllib.error.URLError, OSError) as exc:
                reason = getattr(exc, "reason", None) or exc
                raise FetchError(f"cannot download {url} ({reason}); download the file yourself "
                                 f"(sha256 {want}) and pass its path") from None
        got = h.hexdigest()
        if got != want:
            raise FetchError(f"checksum mismatch for {url}: the downloaded file has sha256 {got}, the task pins "
                             f"{want} (the file changed upstream or the download was damaged); nothing was cached")
        os.replace(tmp, dest)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return dest


__all__ = ["FetchError", "cache_dir", "cached_path", "fetch_pinned", "is_offline", "sha256_of", "check_sha256"]
