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
``temperature``, ``top_p``, ``n``, ``seed``, ``stop``. Next-token logprobs
(``logprobs`` without ``echo``) need ``max_tokens=1``. A sample depends
only on (prompt, parameters, seed, sample index), not on the other prompts
of the request.

The model runs under a lock (requests are answered in threads, one model
call at a time); it is meant for tests, demos and small jobs. To scale, run
vLLM or SGLang and point ``load_llm("openai:<url>#<model>")`` at them.

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
* ``max_logprobs``: the cap on requested top log-probs (None: the vocabulary).
* ``latency``: seconds added to every answer (outside the model lock), to
  measure a client's throughput against a remote server.
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

from rcn_fast._validate import is_int
from rcn_fast.llm import chat as chatlib
from rcn_fast.llm.base import GenerationParams
from rcn_fast.llm.hf import HFLLM


class APIError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class OpenAIServer(ThreadingHTTPServer):
    """``ThreadingHTTPServer`` answering the OpenAI API from an :class:`HFLLM`
    (the switches are described in the module notes)."""

    daemon_threads = True
    request_queue_size = 256

    def __init__(
        self,
        llm: HFLLM,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        model_name: str = "local",
        faults: list[str] | None = None,
        extensions: bool = True,
        token_prompts: bool = True,
        prompt_logprobs: bool = True,
        max_logprobs: int | None = 20,
        latency: float = 0.0,
    ) -> None:
        if not isinstance(llm, HFLLM):
            raise TypeError(f"llm: expected an HFLLM (the local backend), got {type(llm).__name__}")
        for f in faults or []:
            _check_fault(f)
        if max_logprobs is not None and (not is_int(max_logprobs) or max_logprobs < 0):
            raise ValueError(f"max_logprobs: expected an int >= 0 or None, got {max_logprobs!r}")
        if not isinstance(latency, (int, float)) or latency < 0:
            raise ValueError(f"latency: expected seconds >= 0, got {latency!r}")
        super().__init__((host, port), _Handler)
        self.llm = llm
        self.model_name = model_name
        self.faults = list(faults or [])
        self.extensions = bool(extensions)
        self.token_prompts = bool(token_prompts)
        self.prompt_logprobs = bool(prompt_logprobs)
        self.max_logprobs = max_logprobs
        self.latency = float(latency)
        self.requests_seen = 0
        self.prompts_seen = 0  # completions prompts answered (a list prompt counts each)
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
        want = bool(body.get("logprobs", False))
        k = self._check_k(body.get("top_logprobs") or 0, "top_logprobs") if want else None
        choices, usage = self._complete([ids], body, chat=True, k=k, echo=False, prompt_k=None)
        return {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion", "created": int(time.time()),
                "model": self.model_name, "choices": choices, "usage": usage}

    def completions(self, body: dict[str, Any]) -> dict[str, Any]:
        prompts = self._prompt_ids(body.get("prompt"), body.get("add_special_tokens", True))
        with self._lock:
            self.prompts_seen += len(prompts)
        k = body.get("logprobs")
        k = None if k is None else self._check_k(k, "logprobs")
        echo = bool(body.get("echo", False)) and self.prompt_logprobs
        pk = body.get("prompt_logprobs") if self.prompt_logprobs else None
        pk = None if pk is None else self._check_k(pk, "prompt_logprobs")
        choices, usage = self._complete(prompts, body, chat=False, k=k, echo=echo, prompt_k=pk)
        return {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion", "created": int(time.time()),
                "model": self.model_name, "choices": choices, "usage": usage}

    # ------------------------------------------------------------ helpers

    def _check_k(self, k: Any, name: str) -> int:
        if not is_int(k) or k < 0:
            raise APIError(400, f"{name}: expected an int >= 0, got {k!r}")
        cap = len(self.llm.tokenizer) if self.max_logprobs is None else self.max_logprobs
        if k > cap:
            raise APIError(400, f"{name}: requested {k} log-probs, more than the server's max_logprobs ({cap})")
        return k

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

    def _prompt_logprobs(self, prompts: list[list[int]], k: int) -> list[list[tuple[float, list[tuple[int, float]]] | None]]:
        """Per prompt, per position: None at 0, then (log-prob of the prompt
        token, the top ``k`` (id, log-prob)) under the full-vocabulary
        log-softmax of the previous position."""
        torch = __import__("torch")
        llm = self.llm
        out: list[list[Any]] = [[] for _ in prompts]
        for batch in llm._batches(prompts):
            rows = [prompts[i] for i in batch]
            ids, mask, pos = llm._pad_left(rows)
            with torch.inference_mode():
                logits = llm.model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=False).logits
            T = ids.shape[1]
            for j, i in enumerate(batch):
                n = len(rows[j])
                lp = torch.log_softmax(logits[j, T - n : T - 1].float(), dim=-1)  # predicts tokens 1..n-1
                nxt = torch.tensor(rows[j][1:], device=lp.device)
                got = lp.gather(1, nxt[:, None])[:, 0].tolist()
                tops: list[list[tuple[int, float]]] = [[] for _ in got]
                if k > 0:
                    tv, ti = torch.topk(lp, min(k, lp.shape[1]), dim=-1)
                    tops = [list(zip(a, b)) for a, b in zip(ti.tolist(), tv.tolist())]
                out[i] = [None, *zip(got, tops)]
        return out

    def _complete(self, prompts: list[list[int]], body: dict[str, Any], *, chat: bool, k: int | None, echo: bool,
                  prompt_k: int | None) -> tuple[list[dict], dict]:
        max_tokens = body.get("max_completion_tokens", body.get("max_tokens", 16))
        try:
            params = GenerationParams(
                max_new_tokens=max_tokens, temperature=body.get("temperature", 1.0), top_p=body.get("top_p", 1.0),
                num_samples=body.get("n", 1), seed=body.get("seed") or 0, stop=body.get("stop"),
            )
        except (TypeError, ValueError) as exc:
            raise APIError(400, str(exc)) from None
        want = k is not None
        if want and params.max_new_tokens != 1:
            raise APIError(400, "logprobs: this server returns logprobs only with max_tokens=1 (next-token scoring)")
        echo_text, echo = echo, echo and want
        tok = self.llm.tokenizer
        with self._model_lock:
            top = self.llm.top_logprobs_ids(prompts, max(k or 0, 1)) if want else None
            plp = self._prompt_logprobs(prompts, max(k or 0, prompt_k or 0)) if echo or prompt_k is not None else None
            gens = self.llm.generate_ids(prompts, params)
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
    ap.add_argument("--max-logprobs", type=int, default=20, help="cap on requested top log-probs (vLLM's default 20)")
    args = ap.parse_args(argv)
    llm = load_llm(args.model, dtype=args.dtype, device=args.device, batch_size=args.batch_size)
    server = make_server(llm, args.host, args.port, model_name=args.name or args.model, max_logprobs=args.max_logprobs)
    print(f"serving {args.model} at {server.base_url}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


if __name__ == "__main__":
    main()
