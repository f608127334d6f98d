"""Limits of :mod:`rcn_fast.llm.server.app`: what one request may ask for
and how each field is checked (HTTP 400 naming it) before any work.

The server follows vLLM where vLLM has a rule (a prompt longer than the
context window, or ``max_tokens`` beyond what is left of it, is HTTP 400
with the numbers; ``--max-logprobs``; ``--api-key`` as a Bearer token) and
adds the limits a server without vLLM's scheduler needs so that one request
cannot take it over:

* ``n`` and the number of sequences of a request (prompts x ``n``) are
  capped; top log-probs are capped for ``logprobs``, ``top_logprobs`` and
  ``prompt_logprobs``; prompt log-probs are computed ``logprob_chunk``
  positions at a time (only the top ``k`` of each position are kept);
* the body is measured on its bytes before it is parsed and charged to
  one server-wide budget (:mod:`rcn_fast.llm.server.body`:
  ``max_json_nodes``, ``max_json_depth``, ``max_json_string_bytes``,
  ``max_inflight_bytes``);
* every string and list the server reads has a budget checked before any
  work (:func:`check_request_sizes`): ``stop`` strings (``max_stop`` of
  them, ``max_stop_chars`` characters together, none longer than the
  context window can hold), ``messages`` (``max_messages``), prompts
  (``max_seqs`` of them, token lists no longer than the context,
  ``max_prompt_chars`` characters together);
* a request body above ``max_body_bytes`` is 413; the request line, headers
  and body must arrive within ``read_timeout`` seconds (a stalled or
  dripping connection is closed, so is a kept-alive one idle that long;
  the same timeout bounds every write of an answer or a stream to a client
  that stops reading); at most ``max_connections`` connections are served
  at once (more are answered 503 and closed);
* at most ``max_queue`` requests wait for or hold the model (more are 503
  with ``Retry-After``); they get it first come, first served; a request
  (a stream too) holds the model for at most ``request_timeout`` seconds
  (then HTTP 504, or an error event in a stream) and stops as soon as its
  client disconnects (checked before every forward pass of the model:
  between generated tokens, batches and prompt-log-prob chunks).

:mod:`rcn_fast.llm.server.connections` holds the machinery of the last
two points.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from rcn_fast._validate import is_int
from rcn_fast.llm.base import GenerationParams

#: The environment variable ``python -m rcn_fast.serve`` reads an API key from.
API_KEY_ENV = "RCN_FAST_API_KEY"


class APIError(Exception):
    """An error answered as ``{"error": {...}}`` with HTTP ``status`` (and
    extra response headers, e.g. ``Retry-After``)."""

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.headers = dict(headers or {})


class Cancelled(Exception):
    """A running request was stopped: ``reason`` is ``"disconnected"`` (its
    client went away) or ``"timeout"`` (it ran past ``request_timeout``)."""

    def __init__(self, reason: str, message: str = "") -> None:
        super().__init__(message or reason)
        self.reason = reason


@dataclass
class ServeLimits:
    """Per-request and per-connection limits of the server.

    Parameters
    ----------
    max_model_len : int or None
        Context window (prompt + generated tokens); None: the model's own
        (``HFLLM.context_length``). Larger than the model's is refused.
    max_n : int
        Largest ``n`` (OpenAI's limit, 128).
    max_seqs : int
        Largest number of sequences of one request (prompts x ``n``).
    max_logprobs : int or None
        Largest ``logprobs`` / ``top_logprobs`` / ``prompt_logprobs``
        (vLLM's default 20); None: the vocabulary.
    max_stop : int
        Most ``stop`` strings a request may give.
    max_stop_chars : int
        Characters of a request's ``stop`` strings together (transformers'
        stop-string matcher builds a table of vocabulary x stop-string
        characters for each request, and keeps the last few).
    max_messages : int
        Most ``messages`` of a chat request.
    max_prompt_chars : int or None
        Characters of a request's prompts (or of its messages' contents)
        together; None: what can fit the context window -- the context
        times four times the vocabulary's longest token (in characters:
        no text longer can encode to fewer tokens than the context holds).
    max_body_bytes : int
        Largest request body (HTTP 413 above).
    read_timeout : float
        Seconds a connection has to send a request's line, headers and
        body (and the longest a kept-alive connection may stay idle).
    request_timeout : float
        Seconds one request may hold the model (HTTP 504 after).
    max_queue : int
        Requests waiting for or holding the model at once (HTTP 503 above).
    max_connections : int
        Connections served at once (HTTP 503 and closed above).
    max_logprob_entries : int
        Most prompt-log-prob entries one response may hold (prompt tokens x
        ``n`` x (top-k + 1), summed over prompts) for ``echo`` /
        ``prompt_logprobs`` requests.
    logprob_chunk : int
        Prompt positions whose full-vocabulary log-softmax is computed at
        once for prompt log-probs.
    api_key : str or None
        When set, every ``/v1`` request needs ``Authorization: Bearer KEY``.
    max_json_nodes : int
        JSON values and keys of one body, counted on its bytes before it is
        parsed, fields the server never reads included (HTTP 400 above).
    max_json_depth : int
        Nesting of one body's arrays and objects (HTTP 400 above).
    max_json_string_bytes : int
        Bytes of one body's strings and keys together (HTTP 400 above).
    max_inflight_bytes : int
        Bytes all requests in flight may hold together: their bodies and
        what parsing them can make (:func:`rcn_fast.llm.server.body.parse_cost`);
        a request past it is HTTP 503 with ``Retry-After``.
    """

    max_model_len: int | None = None
    max_n: int = 128
    max_seqs: int = 1024
    max_logprobs: int | None = 20
    max_stop: int = 16
    max_stop_chars: int = 256
    max_messages: int = 1024
    max_prompt_chars: int | None = None
    max_body_bytes: int = 8 * 1024 * 1024
    read_timeout: float = 30.0
    request_timeout: float = 300.0
    max_queue: int = 32
    max_connections: int = 64
    max_logprob_entries: int = 1_000_000
    logprob_chunk: int = 256
    api_key: str | None = None
    max_json_nodes: int = 1_000_000
    max_json_depth: int = 64
    max_json_string_bytes: int = 4 * 1024 * 1024
    max_inflight_bytes: int = 1 << 30

    def __post_init__(self) -> None:
        for name in ("max_n", "max_seqs", "max_stop", "max_stop_chars", "max_messages", "max_body_bytes", "max_queue",
                     "max_connections", "max_logprob_entries", "logprob_chunk", "max_json_nodes", "max_json_depth",
                     "max_json_string_bytes", "max_inflight_bytes"):
            v = getattr(self, name)
            if not is_int(v) or v < 1:
                raise ValueError(f"{name}: expected an int >= 1, got {v!r}")
        for name in ("max_model_len", "max_logprobs", "max_prompt_chars"):
            v = getattr(self, name)
            if v is not None and (not is_int(v) or v < (0 if name == "max_logprobs" else 1)):
                raise ValueError(f"{name}: expected an int >= {0 if name == 'max_logprobs' else 1} or None, got {v!r}")
        for name in ("read_timeout", "request_timeout"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
                raise ValueError(f"{name}: expected seconds > 0, got {v!r}")
        if self.api_key is not None and (not isinstance(self.api_key, str) or not self.api_key):
            raise ValueError("api_key: expected a non-empty string or None")


def resolve_context(limits: ServeLimits, model_context: int | None, model: str) -> int:
    """The context window the server enforces: ``limits.max_model_len``,
    else the model's; a ValueError when neither is known or the first is
    larger than the second."""
    if limits.max_model_len is None:
        if model_context is None:
            raise ValueError(f"max_model_len: the config of {model} declares no context window; give one (--max-model-len)")
        return model_context
    if model_context is not None and limits.max_model_len > model_context:
        raise ValueError(f"max_model_len: {limits.max_model_len} is larger than the {model_context}-token context of {model}")
    return limits.max_model_len


# ------------------------------------------------------------ request fields
#: Digits of the longest integer a request may write (a seed is at most 20).
MAX_INT_DIGITS = 40


def longest_token_chars(tokenizer: Any) -> int:
    """The most characters one token of ``tokenizer`` can stand for (its
    longest vocabulary entry: a byte-level entry has one symbol per byte,
    at least one per character)."""
    return max((len(t) for t in tokenizer.get_vocab()), default=1)


def check_request_sizes(body: dict[str, Any], limits: ServeLimits, context: int, longest_token: int) -> None:
    """Every string and list of a request that the server reads, held to its
    budget before any work (HTTP 400 naming the field): ``stop`` (at most
    ``max_stop`` strings of ``max_stop_chars`` characters together, none
    longer than the context window can hold), ``messages`` (at most
    ``max_messages``), ``prompt`` (at most ``max_seqs`` prompts, a token
    list no longer than the context) and the characters of the prompts or
    messages together (``max_prompt_chars``)."""
    fits = context * longest_token  # the most characters the context window can hold
    stop = body.get("stop")
    if stop is not None:
        stops = [stop] if isinstance(stop, str) else stop
        if not isinstance(stops, list) or not all(isinstance(x, str) and x for x in stops):
            raise APIError(400, "stop: expected a non-empty string or a list of non-empty strings")
        if len(stops) > limits.max_stop:
            raise APIError(400, f"stop: {len(stops)} strings, more than the server's max_stop ({limits.max_stop})")
        total = sum(len(x) for x in stops)
        longest = max(range(len(stops)), key=lambda i: len(stops[i]), default=0)
        if stops and len(stops[longest]) > fits:
            raise APIError(400, f"stop[{longest}]: {len(stops[longest]):,} characters, longer than the "
                                f"{context}-token context window can hold; it could never match")
        if total > limits.max_stop_chars:
            raise APIError(400, f"stop: {total:,} characters in all, more than the server's max_stop_chars "
                                f"({limits.max_stop_chars})")
    budget = limits.max_prompt_chars or 4 * fits
    messages = body.get("messages")
    if isinstance(messages, list):
        if len(messages) > limits.max_messages:
            raise APIError(400, f"messages: {len(messages)} messages, more than the server's max_messages "
                                f"({limits.max_messages})")
        chars = sum(len(m["content"]) for m in messages if isinstance(m, dict) and isinstance(m.get("content"), str))
        if chars > budget:
            raise APIError(400, f"messages: {chars:,} characters of content, more than the context window can hold "
                                f"(max_prompt_chars {budget:,})")
    prompt = body.get("prompt")
    if isinstance(prompt, list) and prompt and not all(is_int(t) for t in prompt):
        if len(prompt) > limits.max_seqs:
            raise APIError(400, f"prompt: {len(prompt)} prompts, more than the server's max_seqs ({limits.max_seqs})")
        for i, p in enumerate(prompt):
            if isinstance(p, list) and len(p) > context:
                raise APIError(400, f"prompt[{i}]: {len(p)} tokens, more than the {context}-token context window")
    texts = [prompt] if isinstance(prompt, str) else [p for p in prompt if isinstance(p, str)] \
        if isinstance(prompt, list) else []
    if sum(map(len, texts)) > budget:
        raise APIError(400, f"prompt: {sum(map(len, texts)):,} characters, more than the context window can hold "
                            f"(max_prompt_chars {budget:,})")




def _number(body: dict[str, Any], name: str, default: float, lo: float, hi: float, lo_open: bool = False) -> float:
    v = body.get(name, default)
    if v is None:
        v = default
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise APIError(400, f"{name}: expected a finite number, got {v!r}")
    if v < lo or v > hi or (lo_open and v == lo):
        raise APIError(400, f"{name}: expected a number in {'(' if lo_open else '['}{lo:g}, {hi:g}], got {v!r}")
    return float(v)


def _int(body: dict[str, Any], name: str, default: int | None, lo: int, hi: int | None = None) -> int | None:
    v = body.get(name, default)
    if v is None:
        return default
    if not is_int(v) or v < lo or (hi is not None and v > hi):
        bound = f">= {lo}" if hi is None else f"in [{lo}, {hi}]"
        raise APIError(400, f"{name}: expected an int {bound}, got {v!r}")
    return int(v)


def check_k(body: dict[str, Any], name: str, cap: int) -> int | None:
    """``body[name]`` as a number of top log-probs (None when absent): an int
    in ``[0, cap]``, else HTTP 400 naming the field and the cap."""
    v = body.get(name)
    if v is None:
        return None
    if not is_int(v) or v < 0:
        raise APIError(400, f"{name}: expected an int >= 0, got {v!r}")
    if v > cap:
        raise APIError(400, f"{name}: requested {v} log-probs, more than the server's max_logprobs ({cap})")
    return int(v)


def sampling_params(body: dict[str, Any], prompt_lens: list[int], limits: ServeLimits, context: int) -> GenerationParams:
    """The request's decoding parameters, every field checked (HTTP 400
    naming it): ``max_tokens`` / ``max_completion_tokens`` (default 16)
    within what the context window leaves after the longest prompt,
    ``temperature`` (finite, >= 0), ``top_p`` (in (0, 1]), ``n`` (in
    ``[1, max_n]``; prompts x ``n`` <= ``max_seqs``), ``seed``, ``stop``."""
    longest = max(prompt_lens)
    if longest >= context:
        raise APIError(400, f"This model's maximum context length is {context} tokens. However, your request has "
                            f"{longest} input tokens. Please reduce the length of the input.")
    name = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    max_tokens = _int(body, name, 16, 1)
    assert max_tokens is not None
    if longest + max_tokens > context:
        raise APIError(400, f"This model's maximum context length is {context} tokens. However, you requested "
                            f"{longest + max_tokens} tokens ({longest} in the prompt, {max_tokens} in the completion). "
                            f"Please reduce the length of the prompt or {name}.")
    temperature = _number(body, "temperature", 1.0, 0.0, math.inf)
    top_p = _number(body, "top_p", 1.0, 0.0, 1.0, lo_open=True)
    n = _int(body, "n", 1, 1, limits.max_n)
    assert n is not None
    if n * len(prompt_lens) > limits.max_seqs:
        raise APIError(400, f"n: {len(prompt_lens)} prompts x n={n} is {n * len(prompt_lens)} sequences, more than the "
                            f"server's max_seqs ({limits.max_seqs})")
    seed = _int(body, "seed", 0, -(2**63), 2**64 - 1)
    stop = body.get("stop")
    try:
        return GenerationParams(max_new_tokens=max_tokens, temperature=temperature, top_p=top_p, num_samples=n,
                                seed=seed or 0, stop=stop)
    except (TypeError, ValueError) as exc:
        raise APIError(400, str(exc).replace("num_samples", "n")) from None


def check_model(body: dict[str, Any], served: str) -> None:
    """A request's ``model``: absent (the served model, as vLLM) or the
    name the server serves (``served``, what ``/v1/models`` lists); another
    name is HTTP 404, as OpenAI and vLLM answer."""
    model = body.get("model")
    if model is None:
        return
    if not isinstance(model, str):
        raise APIError(400, f"model: expected a string, got {type(model).__name__}")
    if model != served:
        raise APIError(404, f"The model `{model[:200]}` does not exist (this server serves {served!r}, see "
                            "/v1/models).")


def logit_bias(body: dict[str, Any], vocab_size: int) -> dict[int, float] | None:
    """A request's ``logit_bias`` (``{token id: -100..100}``; None when
    absent or empty); HTTP 400 naming a bad entry."""
    from rcn_fast.llm.backends.logits import check_logit_bias

    bias = body.get("logit_bias")
    if bias is None:
        return None
    if isinstance(bias, dict) and (len(bias) > vocab_size or any(len(str(k)) > MAX_INT_DIGITS for k in bias)):
        raise APIError(400, f"logit_bias: {len(bias)} entries, expected at most one per token id in [0, {vocab_size})")
    try:
        return check_logit_bias(bias, vocab_size) or None
    except ValueError as exc:
        raise APIError(400, str(exc)) from None


def content_length(value: str | list[str] | None, limit: int) -> int:
    """A request's ``Content-Length`` header (or every one it sent, a
    list) -> bytes: digits only (HTTP 400 otherwise), at most ``limit``
    (HTTP 413); several headers with different values are HTTP 400 (RFC
    9112 6.3: the framing is ambiguous, a request-smuggling vector)."""
    if isinstance(value, list):
        if len({v.strip() for v in value}) > 1:
            raise APIError(400, f"Content-Length: the request sends {len(value)} different values "
                                f"({', '.join(repr(v[:20]) for v in value[:4])}); send one")
        value = value[0] if value else None
    if value is None:
        return 0
    v = value.strip()
    if not v.isascii() or not v.isdigit():
        raise APIError(400, f"Content-Length: expected a number of bytes, got {value[:40]!r}")
    n = int(v)
    if n > limit:
        raise APIError(413, f"request body of {n} bytes is larger than the server's max_body_bytes ({limit})")
    return n


def stream_options(body: dict[str, Any]) -> tuple[bool, bool, bool]:
    """A request's ``stream`` (a bool, default false) and its
    ``stream_options`` (an object, only with ``stream``, as vLLM):
    ``include_usage`` (a last chunk with the usage and no choices) and
    vLLM's ``continuous_usage_stats`` (the usage so far in every chunk),
    both bools -> (stream, include_usage, continuous_usage)."""
    stream = body.get("stream", False)
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise APIError(400, f"stream: expected a bool, got {stream!r}"[:200])
    opts = body.get("stream_options")
    if opts is None:
        return stream, False, False
    if not stream:
        raise APIError(400, "stream_options: only allowed with stream=true")
    if not isinstance(opts, dict):
        raise APIError(400, f"stream_options: expected an object, got {type(opts).__name__}")
    flags = []
    for name in ("include_usage", "continuous_usage_stats"):
        v = opts.get(name, False)
        if v is not None and not isinstance(v, bool):
            raise APIError(400, f"stream_options.{name}: expected a bool, got {v!r}"[:200])
        flags.append(bool(v))
    return stream, flags[0], flags[1]


__all__ = ["API_KEY_ENV", "APIError", "Cancelled", "ServeLimits", "resolve_context", "check_request_sizes",
           "longest_token_chars", "MAX_INT_DIGITS", "check_k", "sampling_params", "content_length", "check_model", "logit_bias",
           "stream_options"]
