"""A scriptable OpenAI-style HTTP server on 127.0.0.1 for fault tests: each
request is answered by a Python function, so a test can send what no real
server would (NaN log-probs, a JSON list, a string log-prob, a negative
``Retry-After``) and count what the client asked."""

from __future__ import annotations

import json
import math
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable

# handler(method, route, body) -> (status, payload, headers); payload: bytes, or an object sent as JSON
Handler = Callable[[str, str, Any], tuple[int, Any, dict[str, str]]]

LETTERS = "ABCDEFGHIJ"


class StubServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, handler: Handler, port: int = 0) -> None:
        super().__init__(("127.0.0.1", port), _Handler)
        self.handler = handler
        self.requests: list[tuple[str, str, Any]] = []
        self._thread = threading.Thread(target=self.serve_forever, daemon=True)
        self._thread.start()

    @property
    def base_url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host}:{port}/v1"

    def stop(self) -> None:
        self.shutdown()
        self.server_close()

    def __enter__(self) -> "StubServer":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()


class _Handler(BaseHTTPRequestHandler):
    server: StubServer

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _answer(self, method: str) -> None:
        n = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(n) if n else b""
        body = json.loads(raw) if raw else None
        route = self.path.split("/v1", 1)[-1].rstrip("/")
        self.server.requests.append((method, route, body))
        status, payload, headers = self.server.handler(method, route, body)
        data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for k, v in headers.items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        self._answer("GET")

    def do_POST(self) -> None:
        self._answer("POST")


def chat_answer(top: dict[str, Any] | None = None, prompt_tokens: int = 10, text: str = "A") -> dict[str, Any]:
    """A ``/chat/completions`` answer whose next-token top log-probs are ``top``."""
    choice: dict[str, Any] = {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "length"}
    if top is not None:
        choice["logprobs"] = {"content": [{"token": text, "logprob": -0.1, "top_logprobs": [
            {"token": t, "logprob": v} for t, v in top.items()]}]}
    return {"choices": [choice], "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": 1}}


def well_behaved(name: str = "x", top: dict[str, Any] | None = None, models: list[dict[str, Any]] | None = None,
                 completions: bool = False) -> Handler:
    """A chat server for ``name`` that continues pre-fills (prompt token
    counts differ with ``continue_final_message``) and answers every
    request with the next-token log-probs ``top`` (default: A likeliest);
    ``/completions`` is 404 unless ``completions``."""
    top = top if top is not None else {c: -1.0 - i for i, c in enumerate(LETTERS)}
    listed = models if models is not None else [{"id": name, "object": "model", "owned_by": "stub"}]

    def handle(method: str, route: str, body: Any) -> tuple[int, Any, dict[str, str]]:
        if method == "GET" and route == "/models":
            return 200, {"object": "list", "data": listed}, {}
        if route == "/chat/completions":
            if body.get("model") != name:
                return 404, {"error": {"message": f"The model `{body.get('model')}` does not exist."}}, {}
            n = 10 if body.get("continue_final_message") else 12
            return 200, chat_answer(top, prompt_tokens=n), {}
        if route == "/completions" and completions:
            return 200, {"choices": [{"index": 0, "text": "A", "logprobs": {"top_logprobs": [top]}}]}, {}
        return 404, {"error": {"message": f"no route {route}"}}, {}

    return handle


NAN, INF = math.nan, math.inf
