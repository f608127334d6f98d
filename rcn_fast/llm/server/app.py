"""A small OpenAI-compatible HTTP server over rcn_fast's local backend.

    python -m rcn_fast.serve --model PATH_OR_SPEC [--host 127.0.0.1] [--port 8000]

Endpoints: ``POST /v1/chat/completions``, ``POST /v1/completions``,
``GET /v1/models``, ``GET /health`` (200 while the model is loaded and the
queue has room, else 503) and ``GET /metrics`` (Prometheus text,
:mod:`~rcn_fast.llm.server.metrics`). It behaves like vLLM where clients
depend on it (docs/serving.md lists the fields):

* ``"stream": true`` answers with server-sent events in OpenAI's chunk
  format (:mod:`~rcn_fast.llm.server.completion`); a client that leaves
  mid-stream stops its generation at the next token;
* log-probs of generated tokens for any ``max_tokens`` (chat ``logprobs`` +
  ``top_logprobs``, completions ``logprobs``), the model's own log-softmax
  (:mod:`~rcn_fast.llm.server.responses`); prompt log-probs with ``echo``
  and vLLM's ``prompt_logprobs``;
* ``prompt`` (completions) is a string, strings, token ids or lists of
  token ids; prompt ``p``'s sample ``s`` is choice ``p * n + s``; a text
  prompt gets the tokenizer's special tokens unless ``add_special_tokens``
  is false; a chat is rendered by the model's template (the vLLM/SGLang
  extensions ``continue_final_message`` / ``add_generation_prompt``);
* ``max_tokens`` (``max_completion_tokens``), ``temperature``, ``top_p``,
  ``n``, ``seed``, ``stop``, ``logit_bias`` (added before sampling; log-probs
  are the unbiased ones); ``model`` is the served name or absent (404
  otherwise); a NaN in the logits is HTTP 500 naming it, never text.

One request holds the model at a time (first come, first served). Every
request is held to the limits of :mod:`~rcn_fast.llm.server.limits`, its
body to the budgets of :mod:`~rcn_fast.llm.server.body` (a stream too: it
holds its budget, its connection and the model no longer than a request
may); a chat template that fails on the request's messages is HTTP 400 (as
vLLM: include, nesting and syntax errors too); a MemoryError in a handler
is HTTP 503 and the server goes on. Each request writes one log line
(:func:`~rcn_fast.llm.server.metrics.log_request`).

Test switches (constructor only): ``faults`` -- the next requests misbehave
on purpose, one each: ``"500"``, ``"503"``, ``"429"`` (an HTTP error),
``"drop"`` (closed unanswered), ``"slow:SECONDS"``, ``"no-logprobs"`` (an
answer without its log-probs); ``extensions=False`` -- ignore
``continue_final_message`` / ``add_generation_prompt`` (OpenAI's API,
llama.cpp); ``token_prompts=False`` -- one string prompt only (HTTP 422
otherwise, as llama-cpp-python); ``prompt_logprobs=False`` -- ignore
``echo`` and ``prompt_logprobs``; ``latency`` -- seconds added to every
whole answer.
"""

from __future__ import annotations

import hmac
import json
import socket
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable

from rcn_fast.llm.server.body import InflightBytes, parse_request, scan_cost
from rcn_fast.llm.server.completion import Completion
from rcn_fast.llm.server.connections import FifoLock, ReadWatchdog, RequestGuard, client_gone, refuse_connection
from rcn_fast.llm.server.limits import (
    APIError, Cancelled, ServeLimits, check_model, check_request_sizes, content_length, longest_token_chars,
    resolve_context,
)
from rcn_fast.llm.server.metrics import ServerMetrics, log, log_request
from rcn_fast.llm.server.protocol import ServedModel, is_served_model
from rcn_fast.llm.server.responses import Shapes
from rcn_fast.llm.server.routes import chat_ask, completion_ask
from rcn_fast.llm.server.streaming import EventStream

ROUTES = ("/v1/chat/completions", "/v1/completions")


class OpenAIServer(ThreadingHTTPServer):
    """``ThreadingHTTPServer`` answering the OpenAI API from a local backend
    (a :class:`~rcn_fast.llm.server.protocol.ServedModel`: transformers'
    ``HFLLM`` or the native engine's ``GGUFLLM``; the switches are described
    in the module notes; ``log_prompts`` adds the prompt text to each log
    line; ``limits`` are the fields of
    :class:`~rcn_fast.llm.server.limits.ServeLimits`, e.g.
    ``max_logprobs=20``, ``request_timeout=300.0``, ``api_key=None``)."""

    daemon_threads = True
    request_queue_size = 256

    def __init__(self, llm: ServedModel, host: str = "127.0.0.1", port: int = 0, *, model_name: str = "local",
                 faults: list[str] | None = None, extensions: bool = True, token_prompts: bool = True,
                 prompt_logprobs: bool = True, latency: float = 0.0, log_prompts: bool = False,
                 **limits: Any) -> None:
        if not is_served_model(llm):
            raise TypeError(f"llm: expected a local backend (rcn_fast.llm.server.protocol.ServedModel: HFLLM or "
                            f"GGUFLLM), got {type(llm).__name__}")
        for f in faults or []:
            _check_fault(f)
        if not isinstance(latency, (int, float)) or latency < 0:
            raise ValueError(f"latency: expected seconds >= 0, got {latency!r}")
        self.limits = ServeLimits(**limits)
        #: The context window enforced on prompt + max_tokens.
        self.context = resolve_context(self.limits, llm.context_length, llm.name)
        #: The most characters one token stands for (the request size budgets, :func:`check_request_sizes`).
        self.longest_token = longest_token_chars(llm.tokenizer)
        self.watchdog = ReadWatchdog()
        super().__init__((host, port), _Handler)  # a failed bind calls server_close, which stops the watchdog
        self.llm = llm
        self.model_name = model_name
        self.faults = list(faults or [])
        self.extensions = bool(extensions)
        self.token_prompts = bool(token_prompts)
        self.prompt_logprobs = bool(prompt_logprobs)
        self.latency = float(latency)
        self.log_prompts = bool(log_prompts)
        self.requests_seen = 0
        self.prompts_seen = 0  # completions prompts answered (a list prompt counts each)
        self.cancelled = 0  # requests stopped because their client went away
        self.queued = 0  # requests waiting for or holding the model
        self.metrics = ServerMetrics(model_name, self.context)
        self.inflight = InflightBytes(self.limits.max_inflight_bytes)
        self._lock = threading.Lock()
        self._model_lock = FifoLock()  # first come, first served
        self._slots = threading.BoundedSemaphore(self.limits.max_connections)

    @property
    def max_logprobs(self) -> int | None:
        return self.limits.max_logprobs

    @property
    def base_url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host}:{port}/v1"

    def next_fault(self) -> str | None:
        with self._lock:
            self.requests_seen += 1
            return self.faults.pop(0) if self.faults else None

    def start(self) -> threading.Thread:
        """Serve in a daemon thread; stop with ``shutdown()``."""
        t = threading.Thread(target=self.serve_forever, daemon=True)
        t.start()
        return t

    def server_close(self) -> None:
        self.watchdog.close()
        super().server_close()

    def health(self) -> tuple[int, dict[str, Any]]:
        """``/health``: 200 while the model is loaded and the queue has room
        (as vLLM's, with llama.cpp's body), else 503."""
        if self.llm is None:
            return 503, {"error": {"message": "Loading model", "type": "unavailable_error", "code": 503}}
        if self.queued >= self.limits.max_queue:
            return 503, {"error": {"message": f"the queue is full ({self.queued} requests, max_queue "
                                              f"{self.limits.max_queue})", "type": "unavailable_error", "code": 503}}
        return 200, {"status": "ok"}

    def render_metrics(self) -> str:
        running = int(self._model_lock.locked())
        return self.metrics.render(running, max(0, self.queued - running), self.inflight.held)

    # ------------------------------------------------------------ connections

    def serve_forever(self, poll_interval: float = 0.5) -> None:
        """As ``ThreadingHTTPServer.serve_forever``; a MemoryError in the
        accept loop is counted and the loop goes on (it never stops the
        server)."""
        while True:
            try:
                super().serve_forever(poll_interval)
                return
            except MemoryError:
                self.metrics.memory_error()
                time.sleep(0.05)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """An error a handler did not answer: logged when there is memory to
        log it; never raises (the default prints a traceback, which can
        itself fail and stop the accept loop)."""
        try:
            log.error("error while serving %s", client_address, exc_info=True)
        except BaseException:  # noqa: BLE001 -- nothing may escape into the accept loop
            pass

    def process_request(self, request: Any, client_address: Any) -> None:
        """One thread per connection, at most ``max_connections`` at once;
        a connection beyond that is answered 503 and closed."""
        if not self._slots.acquire(blocking=False):
            refuse_connection(request, self.limits.max_connections)
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()

    def run_model(self, sock: socket.socket | None, fn: Callable[[RequestGuard], Any]) -> Any:
        """``fn(guard)`` under the model lock (granted in arrival order), for
        a request of connection ``sock``: 503 when ``max_queue`` requests
        already wait for or hold the model; stopped (:class:`Cancelled`)
        when the client leaves while it waits or runs, or when it runs past
        ``request_timeout``."""
        with self._lock:
            if self.queued >= self.limits.max_queue:
                raise APIError(503, f"the server is busy ({self.queued} requests queued, max_queue "
                                    f"{self.limits.max_queue}); retry later", {"Retry-After": "1"})
            self.queued += 1
        try:
            self._model_lock.acquire_unless(lambda: sock is not None and client_gone(sock))
            try:
                guard = RequestGuard(sock, self.limits.request_timeout)
                with self.llm.checked_steps(guard.check):  # before every forward pass of this request
                    return fn(guard)
            finally:
                self._model_lock.release()
        finally:
            with self._lock:
                self.queued -= 1

    def count_prompts(self, n: int) -> None:
        with self._lock:
            self.prompts_seen += n


class _Handler(BaseHTTPRequestHandler):
    server: OpenAIServer
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # one line per request: metrics.log_request
        pass

    def setup(self) -> None:
        self.timeout = self.server.limits.read_timeout  # a socket timeout on every read and write
        super().setup()

    def handle_one_request(self) -> None:
        """One request; its line, headers and body must arrive within
        ``read_timeout`` (the watchdog closes the connection otherwise)."""
        self.server.watchdog.arm(self.connection, self.server.limits.read_timeout)
        try:
            super().handle_one_request()
        except (TimeoutError, ConnectionError):
            self.close_connection = True
        finally:
            self.server.watchdog.disarm(self.connection)

    # ------------------------------------------------------------ answers

    def _send(self, status: int, payload: dict[str, Any] | str, headers: dict[str, str] | None = None) -> None:
        text = isinstance(payload, str)
        data = payload.encode() if text else json.dumps(payload).encode()
        self._status = status
        try:
            self.send_response(status)
            self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8" if text else "application/json")
            self.send_header("Content-Length", str(len(data)))
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            if self.close_connection:
                self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(data)
        except OSError:  # the client gave up (e.g. its timeout) or stalled past read_timeout
            self.close_connection = True

    def _error(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        kind = {401: "authentication_error", 413: "invalid_request_error", 503: "server_busy"}.get(
            status, "invalid_request_error" if status < 500 else "server_error")
        err = {"error": {"message": message, "type": kind, "code": status}}
        stream = getattr(self, "_stream", None)
        if stream is not None and stream.started:  # mid-stream: an error event, then [DONE] (as vLLM)
            self._status = status
            if not stream.closed:
                try:
                    stream.send(err)
                    stream.end()
                except Cancelled:
                    pass
            return
        self._send(status, err, headers)

    def _authorise(self) -> None:
        """``Authorization: Bearer KEY`` when the server has an API key (as
        vLLM's ``--api-key``, for every ``/v1`` route)."""
        key = self.server.limits.api_key
        if key is None:
            return
        got = self.headers.get("Authorization", "")
        scheme, _, token = got.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), key.encode()):
            raise APIError(401, "missing or wrong API key: send 'Authorization: Bearer <key>'")

    def _fault(self) -> bool:
        """Apply the next injected fault; True when the request is answered
        (or dropped) by it. ``slow:S`` sleeps and lets the request go on;
        ``no-logprobs`` is applied to the answer by :meth:`_post`."""
        fault = self.server.next_fault()
        self._strip_logprobs = fault == "no-logprobs"
        if fault is None or fault == "no-logprobs":
            return False
        if fault.startswith("slow:"):
            time.sleep(float(fault[len("slow:") :]))
            return False
        if fault == "drop":
            self.close_connection = True
            self._status = 0
            try:
                self.connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            return True
        status = int(fault)
        self._error(status, f"injected fault {status}", {"Retry-After": "0"} if status == 429 else None)
        return True

    # ------------------------------------------------------------ routes

    def _begin(self) -> None:
        self._t0 = time.monotonic()
        self._status = 0
        self._stream: EventStream | None = None
        self._info: dict[str, Any] = {"prompt_tokens": 0, "generated": 0, "ttft": None, "reasons": [], "prompt": None}

    def _end(self, method: str) -> None:
        """The request's metrics and log line."""
        latency = time.monotonic() - self._t0
        i = self._info
        route = self.path.split("?")[0].rstrip("/") or "/"
        try:
            log_request(self.client_address, method, self.path, self._status, prompt_tokens=i["prompt_tokens"],
                        generated=i["generated"], latency=latency, ttft=i["ttft"], stream=self._stream is not None,
                        prompt=i["prompt"] if self.server.log_prompts else None)
            self.server.metrics.finished(route, method, self._status, prompt_tokens=i["prompt_tokens"],
                                         generated=i["generated"], latency=latency, ttft=i["ttft"],
                                         reasons=i["reasons"])
        except MemoryError:
            pass

    def do_GET(self) -> None:
        self.server.watchdog.disarm(self.connection)
        self._begin()
        route = self.path.split("?")[0].rstrip("/")
        try:
            if route == "/health":
                self._send(*self.server.health())
            elif route == "/metrics":
                self._send(200, self.server.render_metrics())
            else:
                self._authorise()
                if self._fault():
                    return
                if route == "/v1/models":
                    self._send(200, {"object": "list", "data": [{
                        "id": self.server.model_name, "object": "model", "owned_by": "rcn_fast",
                        "max_model_len": self.server.context}]})
                else:
                    self._error(404, f"no route {self.path}")
        except APIError as exc:
            self._error(exc.status, str(exc))
        finally:
            self._end("GET")

    def do_POST(self) -> None:
        self._begin()
        ticket = [0]  # bytes this request holds of max_inflight_bytes
        out_of_memory = False
        try:
            self._post(ticket)
        except MemoryError:  # the frames of _post (and what they held) are gone once we are here
            out_of_memory = True
        finally:
            self.server.inflight.release(ticket)
        if out_of_memory:
            self.server.metrics.memory_error()
            self.close_connection = True
            self._error(503, "the server ran out of memory for this request; retry later, or send a smaller one",
                        {"Retry-After": "1"})
        self._end("POST")

    def _read_body(self, ticket: list[int]) -> bytes | None:
        """The request body (None: answered with an error, or the client
        went away); charged to ``max_inflight_bytes`` before it is read. The
        connection is closed after an error that leaves the body unread."""
        try:
            self._authorise()
            if self.headers.get("Transfer-Encoding"):
                raise APIError(411, "send the request body with a Content-Length (no Transfer-Encoding)")
            length = content_length(self.headers.get_all("Content-Length"), self.server.limits.max_body_bytes)
            self.server.inflight.charge(scan_cost(length), ticket)
        except APIError as exc:
            self.close_connection = True
            self._error(exc.status, str(exc), exc.headers)
            return None
        raw = self.rfile.read(length) if length else b""
        if len(raw) < length:  # closed, or stalled past read_timeout
            self.close_connection = True
            self._status = 408  # counted as a request timeout (nothing can be answered)
            return None
        self.server.watchdog.disarm(self.connection)
        return raw

    def _post(self, ticket: list[int]) -> None:
        raw = self._read_body(ticket)
        if raw is None or self._fault():
            return
        srv = self.server
        comp = None
        try:
            body = parse_request(raw, srv.limits, lambda n: srv.inflight.charge(n, ticket))
            del raw
            route = self.path.rstrip("/")
            if route not in ROUTES:
                raise APIError(404, f"no route {self.path}")
            check_model(body, srv.model_name)
            check_request_sizes(body, srv.limits, srv.context, srv.longest_token)
            ask, self._info["prompt"] = chat_ask(srv, body) if route == ROUTES[0] else completion_ask(srv, body)
            del body
            chat = ask.chat
            shapes = Shapes(chat, f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}", int(time.time()),
                            srv.model_name)
            self._stream = EventStream(self) if ask.stream else None
            comp = Completion(srv.llm, ask, shapes, self._stream, self._t0, srv.limits.logprob_chunk)
            self._info["prompt_tokens"] = comp.prompt_tokens
            out = srv.run_model(self.connection, lambda guard: comp.run(guard.check))
        except APIError as exc:
            self._error(exc.status, str(exc), exc.headers)
            return
        except Cancelled as exc:
            if exc.reason == "disconnected":
                with srv._lock:
                    srv.cancelled += 1
                self.close_connection = True
                self._status = 499  # nginx's "client closed request": nothing was answered
            else:
                self._error(504, str(exc))
            return
        except MemoryError:
            raise  # do_POST answers it 503, once this frame's objects are gone
        except Exception as exc:  # an internal error is a 500 with its message
            self._error(500, f"{type(exc).__name__}: {exc}")
            return
        finally:
            if comp is not None:  # a generation that did not end is counted as aborted, with its tokens so far
                done = bool(comp.reasons)
                self._info.update(ttft=comp.ttft,
                                  generated=comp.generated if done else sum(r.tokens for r in comp.rows.values()),
                                  reasons=comp.reasons if done else ["abort"] * len(comp.rows) * (comp.ttft is not None))
        if out is None:  # a stream, sent
            self._status = 200
            return
        if self._strip_logprobs:
            for c in out.get("choices", []):
                c.pop("logprobs", None)
                c.pop("prompt_logprobs", None)
        if srv.latency:
            time.sleep(srv.latency)
        self._send(200, out)


def _check_fault(fault: str) -> None:
    ok = fault in ("drop", "no-logprobs") or (fault.isdigit() and int(fault) >= 400)
    if fault.startswith("slow:"):
        try:
            ok = float(fault[len("slow:") :]) >= 0
        except ValueError:
            ok = False
    if not ok:
        raise ValueError(
            f"faults: expected an HTTP status >= 400, 'drop', 'slow:SECONDS' or 'no-logprobs', got {fault!r}"
        )


def make_server(llm: ServedModel, host: str = "127.0.0.1", port: int = 0, **kwargs: Any) -> OpenAIServer:
    """An :class:`OpenAIServer` bound to ``host:port`` (port 0: any free port)."""
    return OpenAIServer(llm, host, port, **kwargs)
