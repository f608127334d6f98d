"""A small OpenAI-compatible HTTP server over rcn_fast's local backend.

    python -m rcn_fast.serve --model PATH_OR_SPEC [--host 127.0.0.1] [--port 8000]

Endpoints: ``GET /v1/models``, ``POST /v1/chat/completions`` and
``POST /v1/completions``. It behaves like vLLM where rcn_fast's OpenAI
client depends on it, so the client's tests catch what a real server would
do to it:

* ``prompt`` (completions) is a string, a list of strings, a list of token
  ids or a list of lists of token ids; every prompt gets ``n`` choices,
  prompt ``p``'s sample ``s`` at index ``p * n + s`` (as vLLM and OpenAI);
* a text prompt is tokenised with the tokenizer's special tokens (a BOS
  for tokenizers that add one) unless ``add_special_tokens`` is false;
  token-id prompts are used as given;
* ``logprobs`` (completions) / ``top_logprobs`` (chat) above
  ``max_logprobs`` (20, vLLM's and OpenAI's default) is HTTP 400;
* prompt log-probs: ``echo=true`` with ``logprobs`` (the OpenAI legacy
  fields: ``logprobs.tokens`` / ``token_logprobs`` / ``top_logprobs`` cover
  the prompt and then the generated token, the first prompt entry None) and
  vLLM's ``prompt_logprobs=k`` (``choices[i].prompt_logprobs``: per prompt
  position None first, then ``{token_id: {"logprob", "rank",
  "decoded_token"}}`` with the prompt token and the top ``k``);
* chat: the vLLM/SGLang extensions ``continue_final_message`` /
  ``add_generation_prompt`` for pre-filled assistant turns (a switch turns
  them off, see below); the chat's text is tokenised without added special
  tokens (its template writes them).

Other fields: ``max_tokens`` (or ``max_completion_tokens``),
``temperature``, ``top_p``, ``n``, ``seed``, ``stop``, ``logit_bias``
(``{token id: -100..100}`` added to the logits before sampling or the
greedy argmax; the log-probs returned are the model's own, unbiased).
``model`` must be the served name (``model_name``, what ``/v1/models``
lists) or absent: another name is HTTP 404, as OpenAI and vLLM answer. A
NaN in the model's logits while generating is HTTP 500 naming it, never
text. Next-token logprobs
(``logprobs`` without ``echo``) need ``max_tokens=1``. A sample depends
only on (prompt, parameters, seed, sample index), not on the other prompts
of the request.

The model runs under a lock (requests are answered in threads, one model
call at a time); it is meant for tests, demos and small jobs. To scale, run
vLLM or SGLang and point ``load_llm("openai:<url>#<model>")`` at them.

Limits (:mod:`rcn_fast.llm.server.limits`, each a constructor keyword and a
CLI option): a prompt longer than the context window or ``max_tokens``
beyond what is left of it is HTTP 400 with the numbers (as vLLM); ``n``,
prompts x ``n``, top log-probs and prompt-log-prob entries are capped;
every string and list a request holds has a size budget checked before any
work (stop strings: count and characters; messages; prompts); non-finite
or out-of-range numbers (a 5,000-digit ``max_tokens``) and invalid UTF-16
(a lone surrogate) are 400 naming the field; a chat template that fails or
exceeds its budgets on the request's messages is 400; a body over
``max_body_bytes`` is 413, a malformed ``Content-Length`` (or two that
differ) 400; a request
must arrive within ``read_timeout``; at most ``max_connections``
connections and ``max_queue`` waiting requests (503 with ``Retry-After``
beyond); a request holds the model at most ``request_timeout`` seconds
(504) and stops when its client disconnects. ``api_key``: every ``/v1``
request needs ``Authorization: Bearer KEY`` (401 otherwise).

Test switches (constructor only):

* ``faults``: the next requests misbehave on purpose, one fault each, in
  order -- ``"500"``, ``"503"``, ``"429"`` (an HTTP error), ``"drop"`` (the
  connection is closed without an answer), ``"slow:SECONDS"`` (the answer
  comes after SECONDS, past a client's timeout) or ``"no-logprobs"`` (a
  normal answer without its ``logprobs`` fields) -- so clients' retries and
  errors can be tested.
* ``extensions=False``: ignore ``continue_final_message`` /
  ``add_generation_prompt``, as OpenAI's API and llama.cpp's servers do: a
  pre-filled assistant turn is closed and a new assistant turn is opened
  after it.
* ``token_prompts=False``: accept only a string or a one-string list as a
  completions ``prompt`` (HTTP 422 otherwise), as llama-cpp-python's server.
* ``prompt_logprobs=False``: ignore ``echo`` and ``prompt_logprobs``, as a
  server without prompt log-probs (OpenAI's current models).
* ``max_logprobs`` (a limit): the cap on requested top log-probs (None: the
  vocabulary).
* ``latency``: seconds added to every answer (outside the model lock), to
  measure a client's throughput against a remote server.
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

from rcn_fast._templates import TemplateLimitError, TemplateRenderError, chat_prompt
from rcn_fast.llm import chat as chatlib
from rcn_fast.llm.server.limits import (
    APIError, Cancelled, FifoLock, ReadWatchdog, RequestGuard, ServeLimits, check_k, check_model, check_request_sizes,
    client_gone, content_length, logit_bias, longest_token_chars, parse_request, refuse_connection, resolve_context,
    sampling_params,
)
from rcn_fast.llm.server.protocol import ServedModel, is_served_model


class OpenAIServer(ThreadingHTTPServer):
    """``ThreadingHTTPServer`` answering the OpenAI API from a local backend
    (a :class:`~rcn_fast.llm.server.protocol.ServedModel`: transformers'
    ``HFLLM`` or the native engine's ``GGUFLLM``; the switches are described
    in the module notes; ``limits`` are the fields of
    :class:`~rcn_fast.llm.server.limits.ServeLimits`, e.g.
    ``max_logprobs=20``, ``request_timeout=300.0``, ``api_key=None``)."""

    daemon_threads = True
    request_queue_size = 256

    def __init__(
        self,
        llm: ServedModel,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        model_name: str = "local",
        faults: list[str] | None = None,
        extensions: bool = True,
        token_prompts: bool = True,
        prompt_logprobs: bool = True,
        latency: float = 0.0,
        **limits: Any,
    ) -> None:
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
        self.requests_seen = 0
        self.prompts_seen = 0  # completions prompts answered (a list prompt counts each)
        self.cancelled = 0  # requests stopped because their client went away
        self.queued = 0  # requests waiting for or holding the model
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

    # ------------------------------------------------------------ connections

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

    # ------------------------------------------------------------ endpoints

    def chat_completions(self, body: dict[str, Any], sock: socket.socket | None = None) -> dict[str, Any]:
        messages = body.get("messages")
        try:
            (chat,) = chatlib.validate_chats([messages], "messages")
        except (TypeError, ValueError) as exc:
            raise APIError(400, str(exc).replace("messages[0]", "messages")) from None
        tok = self.llm.tokenizer
        cont = bool(body.get("continue_final_message", False)) and self.extensions
        if cont and chat[-1]["role"] != "assistant":
            raise APIError(400, "continue_final_message needs a final assistant message")
        try:
            if cont or not chatlib.has_chat_template(tok):
                text = chatlib.render_chat(tok, chat, system_role=self.llm.system_role)
            else:
                folded = chat if self.llm.system_role else chatlib.fold_system(chat)
                gen_prompt = bool(body.get("add_generation_prompt", True)) if self.extensions else True
                text = chat_prompt(tok, folded, add_generation_prompt=gen_prompt)
        except (TemplateLimitError, TemplateRenderError) as exc:  # the chat is the client's: 400, as vLLM
            raise APIError(400, f"messages: {exc}") from None
        ids = list(tok.encode(text, add_special_tokens=not chatlib.has_chat_template(tok)))
        if not ids:
            raise APIError(400, "messages: the chat encodes to no tokens")
        want = bool(body.get("logprobs", False))
        k = (check_k(body, "top_logprobs", self._cap()) or 0) if want else None
        choices, usage = self._complete([ids], body, sock, chat=True, k=k, echo=False, prompt_k=None)
        return {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion", "created": int(time.time()),
                "model": self.model_name, "choices": choices, "usage": usage}

    def completions(self, body: dict[str, Any], sock: socket.socket | None = None) -> dict[str, Any]:
        prompts = self._prompt_ids(body.get("prompt"), body.get("add_special_tokens", True))
        k = check_k(body, "logprobs", self._cap())
        echo = bool(body.get("echo", False)) and self.prompt_logprobs
        pk = check_k(body, "prompt_logprobs", self._cap()) if self.prompt_logprobs else None
        with self._lock:
            self.prompts_seen += len(prompts)
        choices, usage = self._complete(prompts, body, sock, chat=False, k=k, echo=echo, prompt_k=pk)
        return {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion", "created": int(time.time()),
                "model": self.model_name, "choices": choices, "usage": usage}

    # ------------------------------------------------------------ helpers

    def _cap(self) -> int:
        return len(self.llm.tokenizer) if self.limits.max_logprobs is None else self.limits.max_logprobs

    def _prompt_ids(self, prompt: Any, add_special: Any) -> list[list[int]]:
        """``prompt`` (string, strings, token ids, lists of token ids) -> token ids per prompt."""
        tok = self.llm.tokenizer
        if not isinstance(add_special, bool):
            raise APIError(400, f"add_special_tokens: expected a bool, got {add_special!r}")
        if isinstance(prompt, str):
            items: list[Any] = [prompt]
        elif isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            items = [prompt]
        elif isinstance(prompt, list) and prompt:
            items = prompt
        else:
            raise APIError(400, "prompt: expected a non-empty string, list of strings, token ids or lists of token ids")
        if not self.token_prompts and not (len(items) == 1 and isinstance(items[0], str)):
            raise APIError(422, "prompt: this server takes one string prompt (token_prompts=False)")
        out = []
        V = len(tok)
        for i, p in enumerate(items):
            if isinstance(p, str) and p:
                out.append(list(tok.encode(p, add_special_tokens=add_special)))
            elif isinstance(p, list) and p and all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < V for t in p):
                out.append(list(p))
            else:
                raise APIError(400, f"prompt[{i}]: expected a non-empty string or a non-empty list of token ids < {V}")
        return out

    def _complete(self, prompts: list[list[int]], body: dict[str, Any], sock: socket.socket | None, *, chat: bool,
                  k: int | None, echo: bool, prompt_k: int | None) -> tuple[list[dict], dict]:
        params = sampling_params(body, [len(p) for p in prompts], self.limits, self.context)
        bias = logit_bias(body, len(self.llm.tokenizer))
        want = k is not None
        if want and params.max_new_tokens != 1:
            raise APIError(400, "logprobs: this server returns logprobs only with max_tokens=1 (next-token scoring)")
        echo_text, echo = echo, echo and want
        plp_k = max(k or 0, prompt_k or 0) if echo or prompt_k is not None else None
        if plp_k is not None:
            entries = sum(len(p) for p in prompts) * params.num_samples * (plp_k + 1)
            if entries > self.limits.max_logprob_entries:
                raise APIError(400, f"{'prompt_logprobs' if prompt_k is not None else 'echo'}: the answer would hold {entries} prompt log-probs (prompt tokens x "
                                    f"n x (top-k + 1)), more than the server's max_logprob_entries "
                                    f"({self.limits.max_logprob_entries}); send fewer or shorter prompts per request")
        tok = self.llm.tokenizer

        def work(guard: RequestGuard) -> tuple[Any, Any, Any]:
            top = self.llm.top_logprobs_ids(prompts, max(k or 0, 1)) if want else None
            plp = (self.llm.prompt_logprobs_ids(prompts, plp_k, chunk=self.limits.logprob_chunk, check=guard.check)
                   if plp_k is not None else None)
            return top, plp, self.llm.generate_ids(prompts, params, logit_bias=bias)

        top, plp, gens = self.run_model(sock, work)
        choices = []
        for p, ids in enumerate(prompts):
            for s, g in enumerate(gens[p]):
                c: dict[str, Any] = {"index": p * params.num_samples + s, "finish_reason": g.finish_reason}
                if chat:
                    c["message"] = {"role": "assistant", "content": g.text}
                else:
                    c["text"] = (tok.decode(ids) if echo_text else "") + g.text
                if want:
                    assert top is not None
                    entries = [(tok.decode([t]), lp) for t, lp in top[p][: k or 0]]
                    first = top[p][0]
                    if chat:
                        c["logprobs"] = {"content": [{
                            "token": tok.decode([first[0]]), "logprob": first[1],
                            "top_logprobs": [{"token": t, "logprob": lp} for t, lp in entries],
                        }]}
                    else:
                        d: dict[str, float] = {}
                        for t, lp in entries:
                            d.setdefault(t, lp)
                        lp_block: dict[str, Any] = {"tokens": [tok.decode([first[0]])], "token_logprobs": [first[1]],
                                                    "top_logprobs": [d]}
                        if echo:
                            assert plp is not None
                            lp_block = _echo_block(tok, ids, plp[p], k or 0, lp_block)
                        c["logprobs"] = lp_block
                if prompt_k is not None and not chat:
                    assert plp is not None
                    c["prompt_logprobs"] = [None] + [
                        {str(t): {"logprob": v, "rank": None, "decoded_token": tok.decode([t])}
                         for t, v in [(ids[q], e[0]), *e[1][:prompt_k]]}
                        for q, e in enumerate(plp[p][1:], start=1)
                    ]
                choices.append(c)
        n_prompt = sum(len(x) for x in prompts)
        gen_total = sum(g.generated_tokens for row in gens for g in row)
        return choices, {"prompt_tokens": n_prompt, "completion_tokens": gen_total, "total_tokens": n_prompt + gen_total}


def _echo_block(tok: Any, ids: list[int], plp: list[Any], k: int, gen: dict[str, Any]) -> dict[str, Any]:
    """The OpenAI legacy ``logprobs`` of an ``echo`` request: the prompt's
    tokens (first entry None), then the generated token's."""
    tokens = [tok.decode([t]) for t in ids]
    token_lps: list[float | None] = [None]
    tops: list[dict[str, float] | None] = [None]
    for q, (lp, top) in enumerate(plp[1:], start=1):
        token_lps.append(lp)
        d: dict[str, float] = {}
        for t, v in top[:k]:
            d.setdefault(tok.decode([t]), v)
        d.setdefault(tokens[q], lp)
        tops.append(d)
    return {"tokens": tokens + gen["tokens"], "token_logprobs": token_lps + gen["token_logprobs"],
            "top_logprobs": tops + gen["top_logprobs"]}


class _Handler(BaseHTTPRequestHandler):
    server: OpenAIServer
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # quiet
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

    def _send(self, status: int, payload: dict[str, Any], headers: dict[str, str] | None = None) -> None:
        data = json.dumps(payload).encode()
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
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
        self._send(status, {"error": {"message": message, "type": kind, "code": status}}, headers)

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
        ``no-logprobs`` is applied to the answer by :meth:`do_POST`."""
        fault = self.server.next_fault()
        self._strip_logprobs = fault == "no-logprobs"
        if fault is None or fault == "no-logprobs":
            return False
        if fault.startswith("slow:"):
            time.sleep(float(fault[len("slow:") :]))
            return False
        if fault == "drop":
            self.close_connection = True
            try:
                self.connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            return True
        status = int(fault)
        self._error(status, f"injected fault {status}", {"Retry-After": "0"} if status == 429 else None)
        return True

    def do_GET(self) -> None:
        self.server.watchdog.disarm(self.connection)
        try:
            self._authorise()
        except APIError as exc:
            self._error(exc.status, str(exc))
            return
        if self._fault():
            return
        if self.path.rstrip("/") == "/v1/models":
            self._send(200, {"object": "list", "data": [{
                "id": self.server.model_name, "object": "model", "owned_by": "rcn_fast",
                "max_model_len": self.server.context}]})
        else:
            self._error(404, f"no route {self.path}")

    def _read_body(self) -> bytes | None:
        """The request body (None: answered with an error, or the client
        went away); the connection is closed after an error that leaves the
        body unread."""
        try:
            self._authorise()
            if self.headers.get("Transfer-Encoding"):
                raise APIError(411, "send the request body with a Content-Length (no Transfer-Encoding)")
            length = content_length(self.headers.get_all("Content-Length"), self.server.limits.max_body_bytes)
        except APIError as exc:
            self.close_connection = True
            self._error(exc.status, str(exc), exc.headers)
            return None
        raw = self.rfile.read(length) if length else b""
        if len(raw) < length:  # closed, or stalled past read_timeout
            self.close_connection = True
            return None
        self.server.watchdog.disarm(self.connection)
        return raw

    def do_POST(self) -> None:
        raw = self._read_body()
        if raw is None or self._fault():
            return
        try:
            body = parse_request(raw)
            route = self.path.rstrip("/")
            if route in ("/v1/chat/completions", "/v1/completions"):
                check_model(body, self.server.model_name)
                check_request_sizes(body, self.server.limits, self.server.context, self.server.longest_token)
            if route == "/v1/chat/completions":
                out = self.server.chat_completions(body, self.connection)
            elif route == "/v1/completions":
                out = self.server.completions(body, self.connection)
            else:
                raise APIError(404, f"no route {self.path}")
        except APIError as exc:
            self._error(exc.status, str(exc), exc.headers)
            return
        except Cancelled as exc:
            if exc.reason == "disconnected":
                with self.server._lock:
                    self.server.cancelled += 1
                self.close_connection = True
            else:
                self._error(504, str(exc))
            return
        except Exception as exc:  # an internal error is a 500 with its message
            self._error(500, f"{type(exc).__name__}: {exc}")
            return
        if self._strip_logprobs:
            for c in out.get("choices", []):
                c.pop("logprobs", None)
                c.pop("prompt_logprobs", None)
        if self.server.latency:
            time.sleep(self.server.latency)
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

