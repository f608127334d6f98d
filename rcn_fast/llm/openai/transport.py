"""The OpenAI-compatible client's transport: kept-alive HTTP connections
reused across requests, retries with exponential backoff, and the worker
threads requests fan out on. Stdlib only (``http.client``).

A request is retried on timeouts, dropped connections, HTTP 429 and 5xx
(``Retry-After`` honoured, capped at ``max_backoff``); a kept-alive
connection the server had closed is retried at once. Other HTTP errors
raise :class:`~rcn_fast.llm.openai.responses.ServerError` at once with the
server's message. Nothing here knows what is asked: payloads are the
dialect's (:mod:`rcn_fast.llm.openai.dialect`).
"""

from __future__ import annotations

import http.client
import json
import os
import queue
import socket
import threading
import time
import urllib.parse
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Sequence

from rcn_fast.llm.openai.config import OpenAIConfig
from rcn_fast.llm.openai.responses import ServerError, answer_object, error_message, retry_after

RETRY_EXC = (http.client.HTTPException, ConnectionError, socket.timeout, TimeoutError, OSError)


def normalise_base_url(base_url: Any) -> str:
    """``base_url`` with a trailing ``/v1`` (added when missing); a
    ValueError naming ``base_url`` unless it is an http(s) URL with a host."""
    if not isinstance(base_url, str) or not base_url.startswith(("http://", "https://")):
        raise ValueError(f"base_url: expected an http(s) URL, got {base_url!r}")
    base = base_url.rstrip("/")
    base = base if base.endswith("/v1") else base + "/v1"
    if not urllib.parse.urlsplit(base).hostname:
        raise ValueError(f"base_url: expected an http(s) URL with a host, got {base_url!r}")
    return base


class Transport:
    """POSTs and GETs to one server, with pooled connections and retries.

    Parameters
    ----------
    base_url : str
        The server's URL ending in ``/v1`` (:func:`normalise_base_url`).
    config : OpenAIConfig
        Read at every request (``timeout``, ``max_retries``, ``backoff``,
        ``max_backoff``, ``concurrency``, ``api_key``, ``extra_body``), so a
        caller may swap it for a while (the preflight does).
    """

    def __init__(self, base_url: str, config: OpenAIConfig) -> None:
        self.base_url = base_url
        url = urllib.parse.urlsplit(base_url)
        self.https = url.scheme == "https"
        self.host, self.port, self.path = url.hostname, url.port, url.path
        self.config = config
        self.retries = 0
        self._lock = threading.Lock()
        self._pool: queue.LifoQueue[http.client.HTTPConnection] = queue.LifoQueue()
        self._executor: ThreadPoolExecutor | None = None

    def headers(self, **extra: str) -> dict[str, str]:
        """Request headers: ``extra`` and, when a key is set, ``Authorization``."""
        key = self.config.api_key or os.environ.get("OPENAI_API_KEY")
        return {**extra, "Authorization": f"Bearer {key}"} if key else dict(extra)

    def new_connection(self, timeout: float) -> http.client.HTTPConnection:
        cls = http.client.HTTPSConnection if self.https else http.client.HTTPConnection
        return cls(self.host, self.port, timeout=timeout)

    def _connection(self) -> tuple[http.client.HTTPConnection, bool]:
        try:
            return self._pool.get_nowait(), True
        except queue.Empty:
            return self.new_connection(self.config.timeout), False

    def post(self, route: str, body: dict[str, Any], probe: bool = False) -> dict[str, Any]:
        """POST ``body`` (plus ``extra_body``) to ``route`` with retries;
        the answer's JSON object. ``probe``: a 5xx that names the prompt
        (a validation error answered as 500, as llama-cpp-python does) is
        raised at once, as a 4xx is."""
        cfg = self.config
        data = json.dumps({**body, **cfg.extra_body}).encode()
        headers = self.headers(**{"Content-Type": "application/json", "Connection": "keep-alive"})
        last = ""
        url = self.base_url + route
        for attempt in range(cfg.max_retries + 1):
            wait = min(cfg.max_backoff, cfg.backoff * (2**attempt))
            conn, reused = self._connection()
            try:
                conn.request("POST", self.path + route, body=data, headers=headers)
                resp = conn.getresponse()
                raw = resp.read()
                status = resp.status
                if resp.will_close:
                    conn.close()
                else:
                    self._pool.put(conn)
            except RETRY_EXC as exc:
                conn.close()
                last = f"{type(exc).__name__}: {exc}"
                if reused and not isinstance(exc, (socket.timeout, TimeoutError)):
                    wait = 0.0  # a kept-alive connection the server had closed: retry at once
            else:
                if status < 400:
                    return answer_object(raw, url, status)
                detail = error_message(raw)
                if status == 429 or (status >= 500 and not (probe and "prompt" in detail)):
                    last = f"HTTP {status}: {detail}"
                    ra = retry_after(resp.getheader("Retry-After"))  # None: no usable hint
                    if ra is not None:
                        wait = min(cfg.max_backoff, ra)
                else:
                    raise ServerError(f"{url}: HTTP {status}: {detail}", status)
            if attempt < cfg.max_retries:
                self.retries += 1
                if wait:
                    time.sleep(wait)
        raise ServerError(f"{url}: gave up after {cfg.max_retries + 1} attempts; last error: {last}")

    def get_json(self, route: str, timeout: float) -> tuple[int, Any]:
        """One ``GET`` of ``base_url + route`` (no retries, a fresh connection).

        Returns
        -------
        (status, decoded JSON or None when the body is not JSON;
        ``{"error": message}`` for an HTTP error)

        Raises
        ------
        ServerError
            The server cannot be reached (refused, timed out, dropped); the
            message names the URL and the cause.
        """
        conn = self.new_connection(timeout)
        url = self.base_url + route
        try:
            conn.request("GET", self.path + route, headers=self.headers(Accept="application/json"))
            resp = conn.getresponse()
            raw = resp.read()
            status = resp.status
        except (http.client.HTTPException, OSError, socket.timeout) as exc:
            raise ServerError(f"{url}: cannot reach the server ({type(exc).__name__}: {exc})") from None
        finally:
            conn.close()
        if status >= 400:
            return status, {"error": error_message(raw)}
        try:
            return status, json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError):
            return status, None

    def map(self, fn: Callable[[Any], Any], items: Sequence[Any]) -> list[Any]:
        """``[fn(x) for x in items]``, on up to ``concurrency`` threads."""
        if len(items) <= 1 or self.config.concurrency == 1:
            return [fn(x) for x in items]
        if self._executor is None:
            with self._lock:
                if self._executor is None:
                    self._executor = ThreadPoolExecutor(self.config.concurrency, thread_name_prefix="rcn-openai")
        return list(self._executor.map(fn, items))

    def close(self) -> None:
        """Close the kept-alive connections and the worker threads."""
        ex, self._executor = self._executor, None
        if ex is not None:
            ex.shutdown(wait=True)
        while True:
            try:
                self._pool.get_nowait().close()
            except queue.Empty:
                break

    def __del__(self) -> None:  # pragma: no cover - best effort
        try:
            ex = self._executor
            if ex is not None:
                ex.shutdown(wait=False)
        except Exception:
            pass


__all__ = ["Transport", "normalise_base_url", "RETRY_EXC"]
