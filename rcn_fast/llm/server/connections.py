"""Connections of :mod:`rcn_fast.llm.server.app`: who may bind where, how
long a connection may take to send its request, who holds the model next,
and how a running request learns that it must stop.

* :func:`exposure_warning` -- binding beyond loopback without an API key;
* :func:`client_gone` -- a peer that closed or reset its connection;
* :class:`ReadWatchdog` -- a request (line, headers, body) must arrive
  within its deadline, a dripping client too;
* :class:`FifoLock` -- the model goes to the waiting requests in arrival
  order; a waiter whose client leaves leaves the queue;
* :class:`RequestGuard` -- the check run before every forward pass of a
  request (client gone, time budget spent).
"""

from __future__ import annotations

import ipaddress
import json
import select
import socket
import threading
import time
from collections import deque
from typing import Callable

from rcn_fast.llm.server.limits import API_KEY_ENV, Cancelled

# ------------------------------------------------------------ binding and keys


def is_loopback(host: str) -> bool:
    """Whether ``host`` binds to the loopback interface only."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def exposure_warning(host: str, api_key: str | None) -> str | None:
    """The warning printed when the server binds to ``host`` beyond loopback
    without an API key (None when there is nothing to warn about)."""
    if api_key or is_loopback(host):
        return None
    return (f"warning: serving on {host} without an API key: anyone who can reach this address can use the model; "
            f"set --api-key (or {API_KEY_ENV}), or bind to 127.0.0.1")


# ------------------------------------------------------------ connections


def client_gone(sock: socket.socket) -> bool:
    """Whether the peer of ``sock`` has closed or reset the connection
    (non-blocking; pending pipelined bytes do not count as gone)."""
    try:
        ready, _, _ = select.select([sock], [], [], 0)
        if not ready:
            return False
        return sock.recv(1, socket.MSG_PEEK) == b""
    except (OSError, ValueError):
        return True


def refuse_connection(sock: socket.socket, cap: int) -> None:
    """Answer a connection over ``max_connections`` with 503 (best effort)."""
    data = json.dumps({"error": {"message": f"the server is serving its max_connections ({cap}); retry later",
                                 "type": "server_busy", "code": 503}}).encode()
    head = (f"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nContent-Length: {len(data)}\r\n"
            "Retry-After: 1\r\nConnection: close\r\n\r\n").encode()
    try:
        sock.settimeout(1.0)
        sock.sendall(head + data)
    except OSError:
        pass


class ReadWatchdog:
    """Closes connections whose request takes longer than its deadline to
    arrive: a socket timeout alone bounds each ``recv``, not a client that
    drips one byte just inside it. One daemon thread for all connections."""

    def __init__(self, interval: float = 0.05) -> None:
        self._deadlines: dict[socket.socket, float] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._interval = interval
        self._thread = threading.Thread(target=self._run, name="serve-read-watchdog", daemon=True)
        self._thread.start()

    def arm(self, sock: socket.socket, seconds: float) -> None:
        with self._lock:
            self._deadlines[sock] = time.monotonic() + seconds

    def disarm(self, sock: socket.socket) -> None:
        with self._lock:
            self._deadlines.pop(sock, None)

    def close(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            try:
                now = time.monotonic()
                with self._lock:
                    late = [s for s, d in self._deadlines.items() if d <= now]
                    for s in late:
                        del self._deadlines[s]
                for s in late:
                    try:
                        s.shutdown(socket.SHUT_RDWR)
                    except OSError:
                        pass
            except MemoryError:  # the watchdog outlives a moment without memory (it retries next round)
                continue


class FifoLock:
    """A lock granted in arrival order (a plain lock lets any waiter win), so
    the queued requests hold the model first come, first served. A waiter
    that gives up (``cancelled()`` true, checked every ``poll`` seconds)
    leaves the queue with :class:`Cancelled`."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._waiting: deque[object] = deque()
        self._held = False

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        """As ``threading.Lock.acquire`` (in arrival order)."""
        end = None if timeout < 0 else time.monotonic() + timeout
        try:
            self.acquire_unless(lambda: not blocking or (end is not None and time.monotonic() >= end))
        except Cancelled:
            return False
        return True

    def acquire_unless(self, cancelled: Callable[[], bool], poll: float = 0.05) -> None:
        """Wait for the lock in turn; :class:`Cancelled` ("disconnected")
        when ``cancelled()`` turns true first."""
        me = object()
        with self._cond:
            self._waiting.append(me)
            try:
                while self._held or self._waiting[0] is not me:
                    if cancelled():
                        raise Cancelled("disconnected")
                    self._cond.wait(poll)
                self._waiting.popleft()
                self._held = True
            except BaseException:
                if me in self._waiting:
                    self._waiting.remove(me)
                    self._cond.notify_all()
                raise

    def release(self) -> None:
        with self._cond:
            if not self._held:
                raise RuntimeError("release of an unlocked FifoLock")
            self._held = False
            self._cond.notify_all()

    def locked(self) -> bool:
        return self._held


class RequestGuard:
    """Stops the model work of one request: :meth:`check` raises
    :class:`Cancelled` when the client of ``sock`` is gone or the request
    has held the model for ``budget`` seconds. The server runs it before
    every forward pass of the request (``ServedModel.checked_steps``):
    every generated token, batch and prompt-log-prob chunk."""

    def __init__(self, sock: socket.socket | None, budget: float) -> None:
        self.sock = sock
        self.budget = budget
        self.started = time.monotonic()

    def check(self) -> None:
        if self.sock is not None and client_gone(self.sock):
            raise Cancelled("disconnected")
        if time.monotonic() - self.started > self.budget:
            raise Cancelled("timeout", f"the request ran past the server's request_timeout ({self.budget:g} s); "
                                       "ask for fewer tokens, samples or prompts per request")


__all__ = ["is_loopback", "exposure_warning", "client_gone", "refuse_connection", "ReadWatchdog", "FifoLock",
           "RequestGuard"]
