"""A small OpenAI-compatible HTTP server over rcn_fast's local backend.

    python -m rcn_fast.serve --model PATH_OR_SPEC [--host 127.0.0.1] [--port 8000]

Endpoints: ``GET /v1/models``, ``POST /v1/chat/completions`` and
``POST /v1/completions`` with the fields rcn_fast's OpenAI client uses:
``messages`` / ``prompt``, ``max_tokens`` (or ``max_completion_tokens``),
``temperature``, ``top_p``, ``n``, ``seed``, ``stop``, ``logprobs`` and
``top_logprobs`` (with ``max_tokens=1``: the next-token distribution, the
way label scoring asks for it), and the vLLM/SGLang extensions
``continue_final_message`` / ``add_generation_prompt`` for pre-filled
assistant turns.

It serves one request at a time (stdlib ``http.server``; requests are
answered in threads but the model runs under a lock) and is meant for
tests, demos and small jobs; to scale, run vLLM or SGLang and point
``load_llm("openai:<url>#<model>")`` at them.

Test switches (constructor only):

* ``faults``: the next requests misbehave on purpose, one fault each, in
  order -- ``"500"``, ``"503"``, ``"429"`` (an HTTP error), ``"drop"`` (the
  connection is closed without an answer), ``"slow:SECONDS"`` (the answer
  comes after SECONDS, past a client's timeout) or ``"no-logprobs"`` (a
  normal answer without its ``logprobs`` fields) -- so clients' retries and
  errors can be tested.
* ``extensions=False``: ignore ``continue_final_message`` /
  ``add_generation_prompt``, as a server without these vLLM/SGLang
  extensions (OpenAI's API) does: a pre-filled assistant turn is closed and
  a new assistant turn is opened after it.
"""

from __future__ import annotations

import argparse
import json
import socket
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from rcn_fast.llm import chat as chatlib
from rcn_fast.llm.base import GenerationParams
from rcn_fast.llm.hf import HFLLM


class APIError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class OpenAIServer(ThreadingHTTPServer):
    """``ThreadingHTTPServer`` answering the OpenAI API from an :class:`HFLLM`."""

    daemon_threads = True

    def __init__(
        self,
        llm: HFLLM,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        model_name: str = "local",
        faults: list[str] | None = None,
        extensions: bool = True,
    ) -> None:
        if not isinstance(llm, HFLLM):
            raise TypeError(f"llm: expected an HFLLM (the local backend), got {type(llm).__name__}")
        for f in faults or []:
            _check_fault(f)
        super().__init__((host, port), _Handler)
        self.llm = llm
        self.model_name = model_name
        self.faults = list(faults or [])
        self.extensions = bool(extensions)
        self.requests_seen = 0
        self._lock = threading.Lock()
        self._model_lock = threading.Lock()

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

    # ------------------------------------------------------------ endpoints

    def chat_completions(self, body: dict[str, Any]) -> dict[str, Any]:
        messages = body.get("messages")
        try:
            (chat,) = chatlib.validate_chats([messages], "messages")
        except (TypeError, ValueError) as exc:
            raise APIError(400, str(exc).replace("messages[0]", "messages")) from None
        tok = self.llm.tokenizer
        cont = bool(body.get("continue_final_message", False)) and self.extensions
        if cont and chat[-1]["role"] != "assistant":
            raise APIError(400, "continue_final_message needs a final assistant message")
        if cont or not chatlib.has_chat_template(tok):
            text = chatlib.render_chat(tok, chat, system_role=self.llm.system_role)
        else:
            folded = chat if self.llm.system_role else chatlib.fold_system(chat)
            gen_prompt = bool(body.get("add_generation_prompt", True)) if self.extensions else True
            text = tok.apply_chat_template(folded, tokenize=False, add_generation_prompt=gen_prompt)
        ids = self.llm.encode_texts([text])[0]
        choices, usage = self._complete(ids, body, chat=True)
        return {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion", "created": int(time.time()),
                "model": self.model_name, "choices": choices, "usage": usage}

    def completions(self, body: dict[str, Any]) -> dict[str, Any]:
        prompt = body.get("prompt")
        if not isinstance(prompt, str) or not prompt:
            raise APIError(400, "prompt: expected a non-empty string")
        tok = self.llm.tokenizer
        special = not (tok.bos_token and prompt.startswith(tok.bos_token)) and not chatlib.has_chat_template(tok)
        ids = list(tok.encode(prompt, add_special_tokens=special))
        choices, usage = self._complete(ids, body, chat=False)
        return {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion", "created": int(time.time()),
                "model": self.model_name, "choices": choices, "usage": usage}

    def _complete(self, ids: list[int], body: dict[str, Any], chat: bool) -> tuple[list[dict], dict]:
        max_tokens = body.get("max_completion_tokens", body.get("max_tokens", 16))
        try:
            params = GenerationParams(
                max_new_tokens=max_tokens, temperature=body.get("temperature", 1.0), top_p=body.get("top_p", 1.0),
                num_samples=body.get("n", 1), seed=body.get("seed") or 0, stop=body.get("stop"),
            )
        except (TypeError, ValueError) as exc:
            raise APIError(400, str(exc)) from None
        if chat:
            want = bool(body.get("logprobs", False))
            k = int(body.get("top_logprobs") or 0) if want else 0
        else:
            k = body.get("logprobs")
            want = k is not None
            k = int(k or 0)
        if want and params.max_new_tokens != 1:
            raise APIError(400, "logprobs: this server returns logprobs only with max_tokens=1 (next-token scoring)")
        if want and not 0 <= k <= len(self.llm.tokenizer):
            raise APIError(400, f"top_logprobs: expected 0..{len(self.llm.tokenizer)}, got {k}")
        with self._model_lock:
            if want:
                top = self.llm.top_logprobs_ids([ids], max(k, 1))[0]
                gens = self.llm.generate_ids([ids], params)[0]
            else:
                top = []
                gens = self.llm.generate_ids([ids], params)[0]
        tok = self.llm.tokenizer
        choices = []
        for i, g in enumerate(gens):
            c: dict[str, Any] = {"index": i, "finish_reason": g.finish_reason}
            if chat:
                c["message"] = {"role": "assistant", "content": g.text}
            else:
                c["text"] = g.text
            if want:
                entries = [(tok.decode([t]), lp) for t, lp in top[:k]]
                first = top[0]
                if chat:
                    c["logprobs"] = {"content": [{
                        "token": tok.decode([first[0]]), "logprob": first[1],
                        "top_logprobs": [{"token": s, "logprob": lp} for s, lp in entries],
                    }]}
                else:
                    d: dict[str, float] = {}
                    for s, lp in entries:
                        d.setdefault(s, lp)
                    c["logprobs"] = {"tokens": [tok.decode([first[0]])], "token_logprobs": [first[1]], "top_logprobs": [d]}
            choices.append(c)
        gen_total = sum(g.generated_tokens for g in gens)
        return choices, {"prompt_tokens": len(ids), "completion_tokens": gen_total, "total_tokens": len(ids) + gen_total}


class _Handler(BaseHTTPRequestHandler):
    server: OpenAIServer
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass

    def _send(self, status: int, payload: dict[str, Any], headers: dict[str, str] | None = None) -> None:
        data = json.dumps(payload).encode()
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):  # the client gave up (e.g. its timeout)
            self.close_connection = True

    def _error(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        self._send(status, {"error": {"message": message, "type": "invalid_request_error" if status < 500 else "server_error", "code": status}}, headers)

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
        if self._fault():
            return
        if self.path.rstrip("/") == "/v1/models":
            self._send(200, {"object": "list", "data": [{"id": self.server.model_name, "object": "model", "owned_by": "rcn_fast"}]})
        else:
            self._error(404, f"no route {self.path}")

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        if self._fault():
            return
        try:
            body = json.loads(raw or b"{}")
            if not isinstance(body, dict):
                raise APIError(400, "expected a JSON object")
            route = self.path.rstrip("/")
            if route == "/v1/chat/completions":
                out = self.server.chat_completions(body)
            elif route == "/v1/completions":
                out = self.server.completions(body)
            else:
                raise APIError(404, f"no route {self.path}")
        except APIError as exc:
            self._error(exc.status, str(exc))
            return
        except json.JSONDecodeError as exc:
            self._error(400, f"invalid JSON: {exc}")
            return
        except Exception as exc:  # an internal error is a 500 with its message
            self._error(500, f"{type(exc).__name__}: {exc}")
            return
        if self._strip_logprobs:
            for c in out.get("choices", []):
                c.pop("logprobs", None)
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


def make_server(llm: HFLLM, host: str = "127.0.0.1", port: int = 0, **kwargs: Any) -> OpenAIServer:
    """An :class:`OpenAIServer` bound to ``host:port`` (port 0: any free port)."""
    return OpenAIServer(llm, host, port, **kwargs)


def main(argv: list[str] | None = None) -> None:
    from rcn_fast.llm.load import load_llm

    ap = argparse.ArgumentParser(prog="python -m rcn_fast.serve", description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="model directory, .gguf file, package:<module> or hub id")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--name", default=None, help="model name clients send (default: --model)")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--batch-size", type=int, default=16)
    args = ap.parse_args(argv)
    llm = load_llm(args.model, dtype=args.dtype, device=args.device, batch_size=args.batch_size)
    server = make_server(llm, args.host, args.port, model_name=args.name or args.model)
    print(f"serving {args.model} at {server.base_url}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


if __name__ == "__main__":
    main()
