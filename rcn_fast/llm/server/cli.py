"""``python -m rcn_fast.serve``: the command line of :mod:`rcn_fast.llm.server.app`.

A model that cannot be loaded, a port in use or an address that cannot be
bound is one message on stderr and exit code 2 (no traceback).
"""

from __future__ import annotations

import argparse
import errno
import logging
import os
import sys
from typing import NoReturn

from rcn_fast.llm.server.connections import exposure_warning
from rcn_fast.llm.server.limits import API_KEY_ENV, ServeLimits

_D = ServeLimits()


def _fail(message: str) -> NoReturn:
    print(f"python -m rcn_fast.serve: error: {message}", file=sys.stderr, flush=True)
    raise SystemExit(2)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (every limit has the default of :class:`ServeLimits`)."""
    ap = argparse.ArgumentParser(prog="python -m rcn_fast.serve",
                                 description="A small OpenAI-compatible HTTP server over rcn_fast's local backend.")
    ap.add_argument("--model", required=True, help="model directory, .gguf file, package:<module> or hub id")
    ap.add_argument("--host", default="127.0.0.1",
                    help="address to bind (default 127.0.0.1; another address without --api-key is warned about)")
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--name", default=None, help="model name clients send (default: --model)")
    ap.add_argument("--engine", default="auto", choices=["auto", "native", "transformers"],
                    help="the local backend: 'auto' (the native engine for a .gguf on a machine without a CUDA GPU, "
                         "else transformers), 'native' or 'transformers'")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--api-key", default=None,
                    help=f"require 'Authorization: Bearer KEY' on every /v1 request (default: ${API_KEY_ENV}, else none)")
    ap.add_argument("--max-model-len", type=int, default=None,
                    help="context window enforced on prompt + max_tokens (default: the model's)")
    ap.add_argument("--max-logprobs", type=int, default=_D.max_logprobs,
                    help="cap on logprobs / top_logprobs / prompt_logprobs (vLLM's default 20)")
    ap.add_argument("--max-n", type=int, default=_D.max_n, help="cap on n (default %(default)s, OpenAI's)")
    ap.add_argument("--max-seqs", type=int, default=_D.max_seqs,
                    help="cap on prompts x n of one request (default %(default)s)")
    ap.add_argument("--max-stop", type=int, default=_D.max_stop, help="cap on stop strings (default %(default)s)")
    ap.add_argument("--max-stop-chars", type=int, default=_D.max_stop_chars,
                    help="cap on the characters of a request's stop strings together (default %(default)s)")
    ap.add_argument("--max-messages", type=int, default=_D.max_messages,
                    help="cap on the messages of a chat request (default %(default)s)")
    ap.add_argument("--max-prompt-chars", type=int, default=_D.max_prompt_chars,
                    help="cap on the characters of a request's prompts or messages together (default: what the "
                         "context window can hold)")
    ap.add_argument("--max-logprob-entries", type=int, default=_D.max_logprob_entries,
                    help="cap on prompt tokens x n x (top-k + 1) of an echo / prompt_logprobs request "
                         "(default %(default)s)")
    ap.add_argument("--max-body-bytes", type=int, default=_D.max_body_bytes,
                    help="largest request body, HTTP 413 above (default %(default)s)")
    ap.add_argument("--read-timeout", type=float, default=_D.read_timeout,
                    help="seconds to send a request's headers and body, and the longest idle keep-alive "
                         "(default %(default)s)")
    ap.add_argument("--request-timeout", type=float, default=_D.request_timeout,
                    help="seconds one request may hold the model, HTTP 504 after (default %(default)s)")
    ap.add_argument("--max-queue", type=int, default=_D.max_queue,
                    help="requests waiting for or holding the model, HTTP 503 above (default %(default)s)")
    ap.add_argument("--max-connections", type=int, default=_D.max_connections,
                    help="connections served at once, HTTP 503 above (default %(default)s)")
    ap.add_argument("--max-json-nodes", type=int, default=_D.max_json_nodes,
                    help="JSON values and keys of one request body, counted before it is parsed, HTTP 400 above "
                         "(default %(default)s)")
    ap.add_argument("--max-json-depth", type=int, default=_D.max_json_depth,
                    help="nesting of one request body, HTTP 400 above (default %(default)s)")
    ap.add_argument("--max-json-string-bytes", type=int, default=_D.max_json_string_bytes,
                    help="bytes of one request body's strings together, HTTP 400 above (default %(default)s)")
    ap.add_argument("--max-inflight-bytes", type=int, default=_D.max_inflight_bytes,
                    help="bytes all requests in flight may hold together (bodies and their parses), HTTP 503 "
                         "with Retry-After above (default %(default)s)")
    ap.add_argument("--log-prompts", action="store_true",
                    help="add each request's prompt text to its log line (default: never logged)")
    return ap


def _log_to_stderr() -> None:
    """The request log (one line per request, logger ``rcn_fast.serve``) on
    stderr, unless the embedding program configured that logger."""
    log = logging.getLogger("rcn_fast.serve")
    if not log.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        log.addHandler(handler)
        log.setLevel(logging.INFO)
        log.propagate = False


def main(argv: list[str] | None = None) -> None:
    """Parse ``argv``, load the model, bind and serve until interrupted."""
    args = build_parser().parse_args(argv)
    api_key = args.api_key if args.api_key is not None else (os.environ.get(API_KEY_ENV) or None)
    try:
        limits = ServeLimits(
            max_model_len=args.max_model_len, max_n=args.max_n, max_seqs=args.max_seqs,
            max_logprobs=args.max_logprobs, max_logprob_entries=args.max_logprob_entries, max_stop=args.max_stop,
            max_stop_chars=args.max_stop_chars, max_messages=args.max_messages, max_prompt_chars=args.max_prompt_chars,
            max_body_bytes=args.max_body_bytes, read_timeout=args.read_timeout,
            request_timeout=args.request_timeout, max_queue=args.max_queue,
            max_connections=args.max_connections, api_key=api_key, max_json_nodes=args.max_json_nodes,
            max_json_depth=args.max_json_depth, max_json_string_bytes=args.max_json_string_bytes,
            max_inflight_bytes=args.max_inflight_bytes,
        )
    except ValueError as exc:
        _fail(f"{exc} (the option of the same name, see --help)")
    from rcn_fast.llm.load import load_llm
    from rcn_fast.llm.server.app import make_server
    from rcn_fast.llm.server.protocol import is_served_model

    try:  # a .gguf runs on the native engine where load_llm picks it (the CPU), else on transformers
        llm = load_llm(args.model, dtype=args.dtype, device=args.device, batch_size=args.batch_size,
                       engine=args.engine)
    except Exception as exc:  # noqa: BLE001 -- any load failure is one message, not a traceback
        _fail(f"--model {args.model!r} could not be loaded: {type(exc).__name__}: {exc}")
    if not is_served_model(llm):
        _fail(f"--model {args.model!r}: expected a local model (directory, .gguf, package: or hub id), "
              f"got a {type(llm).__name__}")
    limit_fields = {f: getattr(limits, f) for f in limits.__dataclass_fields__}
    try:
        server = make_server(llm, args.host, args.port, model_name=args.name or args.model,
                             log_prompts=args.log_prompts, **limit_fields)
    except ValueError as exc:
        _fail(str(exc).replace("max_model_len:", "--max-model-len:"))
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            _fail(f"--port {args.port} on {args.host} is already in use; stop what serves there or choose another --port")
        _fail(f"cannot serve on {args.host}:{args.port}: {exc.strerror or exc}")
    warning = exposure_warning(args.host, api_key)
    if warning:
        print(warning, file=sys.stderr, flush=True)
    _log_to_stderr()
    print(f"serving {args.model} at {server.base_url}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


if __name__ == "__main__":
    main()
