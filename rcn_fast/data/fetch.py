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

Downloads are bounded: a task may pin the file's size too (``size:``, in
bytes), and the download stops as soon as the body grows past it; without
it at most :data:`MAX_DOWNLOAD_BYTES` are read. The whole download has a
deadline (:data:`DEFAULT_DEADLINE_S`) besides the socket timeout, so a
server that sends a byte now and then cannot hold it forever. Bytes are
written to ``.part-<pid>-*`` files beside the cache entry, removed on
failure and on SIGTERM, and stale ones (of dead processes) are removed
before each download.
"""

from __future__ import annotations

import contextlib
import hashlib
import http.client
import os
import re
import signal
import socket
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any, Iterator

from rcn_fast._validate import is_int

_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_CHUNK = 1 << 20
_TRUE = {"1", "true", "yes", "on"}
_PART = ".part-"
#: The most bytes a download without a pinned ``size`` may have (256 MiB;
#: the task files pinned in rcn_fast are a few MB at most).
MAX_DOWNLOAD_BYTES = 256 << 20
#: Seconds a whole download may take, however slowly the server sends.
DEFAULT_DEADLINE_S = 600.0


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


def fetch_pinned(url: str, sha256: str, *, size: int | None = None, timeout: float = 60.0,
                 deadline: float = DEFAULT_DEADLINE_S, max_bytes: int = MAX_DOWNLOAD_BYTES) -> Path:
    """The local copy of a file pinned by its SHA-256, downloading it once.

    The download is bounded: it stops as soon as the body grows past
    ``size`` (or, without ``size``, past ``max_bytes``), and after
    ``deadline`` seconds in all, however slowly the server sends. The bytes
    go to a ``.part-<pid>-*`` file beside the cache entry, removed on any
    failure and on SIGTERM; stale ones of dead processes are removed first.

    Parameters
    ----------
    url : str
        ``http(s)://`` (or ``file://``) address of the file.
    sha256 : str
        The 64 hex digits of the SHA-256 of the file's bytes.
    size : int, optional
        The file's size in bytes (``size:`` in a task YAML); a body of
        another size is refused without reading past it.
    timeout : float
        Seconds to wait on the server for each read (socket timeout).
    deadline : float
        Seconds the whole download may take (default
        :data:`DEFAULT_DEADLINE_S`).
    max_bytes : int
        The most bytes read when ``size`` is not given (default
        :data:`MAX_DOWNLOAD_BYTES`).

    Returns
    -------
    pathlib.Path
        The verified file in the cache (:func:`cached_path`).

    Raises
    ------
    FetchError
        The downloaded bytes have another checksum or size, or too many of
        them (nothing is cached); the URL cannot be reached, the connection
        broke or the deadline passed, and nothing is cached; or offline mode
        is on and nothing is cached.
    ValueError
        A malformed ``url``, ``sha256``, ``size``, ``timeout``, ``deadline`` or ``max_bytes``.
    """
    if not isinstance(url, str) or urllib.parse.urlparse(url).scheme not in ("http", "https", "file"):
        raise ValueError(f"url: expected an http(s):// or file:// address, got {url!r}")
    want = check_sha256(sha256)
    size = check_size(size)
    for name, val in (("timeout", timeout), ("deadline", deadline)):
        if isinstance(val, bool) or not isinstance(val, (int, float)) or not val > 0 or val == float("inf"):
            raise ValueError(f"{name}: expected a positive number of seconds, got {val!r}")
    limit = size if size is not None else check_size(max_bytes, "max_bytes")
    dest = cached_path(url, want)
    if dest.is_file():
        if sha256_of(dest) == want:
            if size is not None and dest.stat().st_size != size:
                raise FetchError(f"{url}: the cached file {dest} has the pinned sha256 but {dest.stat().st_size} "
                                 f"bytes, and the task pins size {size}: correct the task's size:")
            return dest
        dest.unlink()  # a damaged cache entry: fetch it again
    if is_offline():
        raise FetchError(f"{url} is not in the cache ({dest}) and offline mode is on; run once online, or "
                         f"download the file yourself (sha256 {want}) and pass its path")
    dest.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_parts(dest.parent)
    fd, tmp = tempfile.mkstemp(prefix=f"{_PART}{os.getpid()}-", dir=dest.parent)
    try:
        with _term_raises(), os.fdopen(fd, "wb") as out:
            got_bytes, got = _download(url, out, want, size=size, limit=limit, timeout=float(timeout),
                                       deadline=float(deadline))
        if size is not None and got_bytes != size:
            raise FetchError(f"{url}: the server sent {got_bytes} bytes, the task pins size {size}; nothing was "
                             f"cached")
        if got != want:
            raise FetchError(f"checksum mismatch for {url}: the downloaded file has sha256 {got}, the task pins "
                             f"{want} (the file changed upstream or the download was damaged); nothing was cached")
        os.replace(tmp, dest)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return dest


def _download(url: str, out: Any, want: str, *, size: int | None, limit: int, timeout: float,
              deadline: float) -> tuple[int, str]:
    """Stream ``url`` into ``out``: ``(bytes, sha256 hex)``, or a FetchError.

    A :class:`_Watchdog` shuts the connection down when ``deadline`` passes,
    whether the server is slow with its headers or its body."""
    h = hashlib.sha256()
    n = 0
    pinned = f"the task pins size {size}" if size is not None else \
        f"the most read without a pinned size is {limit} bytes (add size: to the task)"
    hint = f"download the file yourself (sha256 {want}) and pass its path"
    too_slow = f"cannot download {url}: not finished after {deadline:g} s ({{}} bytes received; the server is too " \
               f"slow); {hint}"
    watchdog = _Watchdog(deadline)
    try:
        with watchdog:
            req = urllib.request.Request(url, headers={"User-Agent": "rcn_fast"})
            with watchdog.opener().open(req, timeout=min(timeout, deadline)) as resp:
                declared = resp.headers.get("Content-Length") if hasattr(resp, "headers") else None
                if declared is not None and declared.strip().isdigit() and int(declared) > limit:
                    raise FetchError(f"{url}: the server announces {int(declared)} bytes and {pinned}; "
                                     f"nothing was downloaded")
                read = getattr(resp, "read1", None) or resp.read  # read1: what has arrived, not a full chunk
                while not watchdog.fired:
                    chunk = read(_CHUNK)
                    if not chunk:
                        break
                    n += len(chunk)
                    if n > limit:
                        raise FetchError(f"{url}: the server sent more than {limit} bytes and {pinned}; stopped "
                                         f"there, nothing was cached")
                    h.update(chunk)
                    out.write(chunk)
    except http.client.IncompleteRead as exc:
        if watchdog.fired:
            raise FetchError(too_slow.format(n + len(exc.partial))) from None
        raise FetchError(f"cannot download {url} (the connection closed after {n + len(exc.partial)} bytes, "
                         f"before the end of the file); {hint}") from None
    except http.client.HTTPException as exc:
        if watchdog.fired:
            raise FetchError(too_slow.format(n)) from None
        raise FetchError(f"cannot download {url} (a malformed HTTP response: {type(exc).__name__}: {exc}); "
                         f"{hint}") from None
    except (urllib.error.URLError, OSError) as exc:
        if watchdog.fired:
            raise FetchError(too_slow.format(n)) from None
        reason = getattr(exc, "reason", None) or exc
        raise FetchError(f"cannot download {url} ({reason}); {hint}") from None
    if watchdog.fired:
        raise FetchError(too_slow.format(n))
    return n, h.hexdigest()


class _Watchdog:
    """Shuts down the sockets of one download when its deadline passes, so
    neither headers nor a body sent a byte at a time can outlast it (the
    socket timeout only bounds each wait)."""

    def __init__(self, seconds: float) -> None:
        self.fired = False
        self._socks: list[socket.socket] = []
        self._lock = threading.Lock()
        self._timer = threading.Timer(seconds, self._fire)
        self._timer.daemon = True

    def __enter__(self) -> "_Watchdog":
        self._timer.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._timer.cancel()

    def watch(self, sock: socket.socket) -> None:
        with self._lock:
            self._socks.append(sock)
            if self.fired:
                _shut(sock)

    def _fire(self) -> None:
        with self._lock:
            self.fired = True
            for sock in self._socks:
                _shut(sock)

    def opener(self) -> urllib.request.OpenerDirector:
        """urllib's default opener whose HTTP(S) connections report their sockets here."""
        dog = self

        def watched(cls: type) -> type:
            class Watched(cls):  # type: ignore[misc, valid-type]
                def connect(self) -> None:
                    super().connect()
                    dog.watch(self.sock)
            return Watched

        class HTTP(urllib.request.HTTPHandler):
            def do_open(self, http_class: Any, req: Any, **kw: Any) -> Any:
                return super().do_open(watched(http_class), req, **kw)

        class HTTPS(urllib.request.HTTPSHandler):
            def do_open(self, http_class: Any, req: Any, **kw: Any) -> Any:
                return super().do_open(watched(http_class), req, **kw)

        return urllib.request.build_opener(HTTP, HTTPS)


def _shut(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


def check_size(value: object, what: str = "size") -> int | None:
    """``value`` as a positive number of bytes (None stays None), or a
    ValueError naming ``what``."""
    if value is None:
        return None
    if not is_int(value) or int(value) < 1:
        raise ValueError(f"{what}: expected a positive number of bytes, got {value!r}")
    return int(value)


def remove_stale_parts(folder: str | os.PathLike[str]) -> int:
    """Remove the ``.part-*`` files of downloads that cannot finish any more
    (their process is gone, or nothing was written to them for
    :data:`DEFAULT_DEADLINE_S` seconds).

    Returns
    -------
    int
        How many were removed.
    """
    removed = 0
    try:
        entries = list(Path(folder).glob(f"{_PART}*"))
    except OSError:
        return 0
    for p in entries:
        pid_s = p.name[len(_PART):].split("-", 1)[0]
        try:
            fresh = time.time() - p.stat().st_mtime < DEFAULT_DEADLINE_S  # written to lately
            if fresh and (not pid_s.isdigit() or _pid_alive(int(pid_s))):
                continue  # a download that may still be running (another thread or process)
            p.unlink()
            removed += 1
        except OSError:
            continue
    return removed


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # exists, owned by someone else
        return True
    return True


class _Terminated(BaseException):
    """SIGTERM arrived during a download (turned into SystemExit after cleanup)."""


@contextlib.contextmanager
def _term_raises() -> Iterator[None]:
    """While a download runs in the main thread, SIGTERM (when nothing else
    handles it) raises instead of killing the process at once, so the
    ``finally`` that removes the ``.part-*`` file runs; the default comes
    back afterwards and the process exits with 128 + 15."""
    if threading.current_thread() is not threading.main_thread() or \
            signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        yield
        return

    def on_term(signum: int, frame: Any) -> None:
        raise _Terminated()

    signal.signal(signal.SIGTERM, on_term)
    try:
        yield
    except _Terminated:
        raise SystemExit(128 + signal.SIGTERM) from None
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


__all__ = ["FetchError", "cache_dir", "cached_path", "fetch_pinned", "is_offline", "sha256_of", "check_sha256",
           "check_size", "remove_stale_parts", "MAX_DOWNLOAD_BYTES", "DEFAULT_DEADLINE_S"]
