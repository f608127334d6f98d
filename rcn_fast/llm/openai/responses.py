"""Reading an OpenAI-compatible server's answers (:mod:`rcn_fast.llm.openai.client`).

Every field the client reads is checked for its type here, and an answer
of the wrong shape -- a JSON list where an object belongs, a log-prob
that is a string, a top-log-probs entry without its ``token`` -- is a
:class:`ServerError` naming the field, never an ``AttributeError``,
``KeyError`` or ``ValueError`` from deep inside the client. The *values*
of log-probs (NaN, ``+inf``, positive) are checked where the label they
score is known (:func:`rcn_fast.llm.scoring.choice.check_label_scores`), so that
error names the question and the label.
"""

from __future__ import annotations

import json
import math
from typing import Any

from rcn_fast.llm.base import logsumexp


class ServerError(RuntimeError):
    """The server answered with an error that retrying does not fix
    (``status``: the HTTP status, or None)."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class NoPromptLogprobs(Exception):
    """An answer without the prompt log-probs that were asked for."""


def answer_object(raw: bytes, url: str, status: int) -> dict[str, Any]:
    """The JSON object of a successful answer's body; anything else (not
    JSON, a list, a string) is a :class:`ServerError`."""
    try:
        out = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise ServerError(f"{url}: the answer is not JSON: {raw[:200]!r}", status) from None
    if not isinstance(out, dict):
        raise ServerError(f"{url}: the answer is a JSON {type(out).__name__}, expected an object: "
                          f"{str(out)[:200]}", status)
    return out


def retry_after(value: str | None) -> float | None:
    """Seconds from a ``Retry-After`` header; None when it gives no usable
    hint (missing, an HTTP date, negative, NaN or infinite)."""
    if not value:
        return None
    try:
        s = float(value)
    except ValueError:
        return None
    return s if math.isfinite(s) and s >= 0 else None


def logprob_value(v: Any, where: str) -> float:
    """A log-prob field as a float: a JSON number (NaN and infinities as
    Python's JSON reader gives them); anything else is a ServerError
    naming ``where``."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ServerError(f"the server's {where} is {v!r} ({type(v).__name__}), expected a number")
    return float(v)


def choices(out: Any, n: int) -> list[dict[str, Any]]:
    """The ``n`` choices of a response (n=1 each), ordered by index."""
    ch = out.get("choices") if isinstance(out, dict) else None
    if not isinstance(ch, list) or not all(isinstance(c, dict) for c in ch):
        raise ServerError(f"unexpected response shape (choices: expected a list of objects): {str(out)[:200]}")
    if not all(isinstance(c.get("index", 0), int) for c in ch):
        raise ServerError(f"unexpected response shape (choices[].index: expected ints): {str(out)[:200]}")
    ch = sorted(ch, key=lambda c: c.get("index", 0))
    if len(ch) != n:
        raise ServerError(f"expected {n} choices (one per prompt), got {len(ch)}: the server does not take a list "
                          f"of prompts; set prompts_per_request=1")
    return ch


def prompt_lps(out: Any, prompts: list[list[int]], how: str) -> list[float]:
    """log p(last token | the tokens before it) of each prompt, from the
    response's prompt log-probs (``how``: ``"vllm"`` for
    ``prompt_logprobs``, else the ``echo`` fields). Values are returned as
    the server gave them (checked later, per label)."""
    vals = []
    for i, (c, p) in enumerate(zip(choices(out, len(prompts)), prompts)):
        n = len(p)
        if how == "vllm":
            pl = c.get("prompt_logprobs")
            if not isinstance(pl, list) or len(pl) < n or not isinstance(pl[n - 1], dict):
                raise NoPromptLogprobs("no prompt_logprobs in the answer")
            entry = pl[n - 1].get(str(p[-1]))
            v = entry.get("logprob") if isinstance(entry, dict) else entry
            field = f"choices[{i}].prompt_logprobs[{n - 1}][{str(p[-1])!r}]"
        else:
            lp = c.get("logprobs") or {}
            tl = lp.get("token_logprobs") if isinstance(lp, dict) else None
            if not isinstance(tl, list) or len(tl) < n or tl[0] is not None:
                raise NoPromptLogprobs("no prompt log-probs in the answer to echo=true, logprobs=1")
            v = tl[n - 1]
            field = f"choices[{i}].logprobs.token_logprobs[{n - 1}]"
        vals.append(logprob_value(v, f"prompt log-prob of the label token ({field})"))
    return vals


def merge(pairs: list[tuple[str, float]]) -> tuple[dict[str, float], int] | None:
    """(token string -> logprob, tokens spelled alike combined by
    logsumexp; the number of entries the server sent)."""
    if not pairs:
        return None
    merged: dict[str, list[float]] = {}
    for t, v in pairs:
        merged.setdefault(t, []).append(v)
    return {t: logsumexp(v) for t, v in merged.items()}, len(pairs)


def top_completion(choice: dict[str, Any]) -> tuple[dict[str, float], int] | None:
    """The next-token top log-probs of a ``/completions`` choice (None: none sent)."""
    lp = choice.get("logprobs")
    if not isinstance(lp, dict):
        return None
    tops = lp.get("top_logprobs") or []
    if not isinstance(tops, list):
        raise ServerError(f"the server's logprobs.top_logprobs is {str(tops)[:80]}, expected a list of objects")
    if not tops or not tops[0]:
        return None
    first = tops[0]
    if not isinstance(first, dict):
        raise ServerError(f"the server's logprobs.top_logprobs[0] is {str(first)[:80]}, expected an object "
                          f"(token -> log-prob)")
    return merge([(str(t), logprob_value(v, f"logprobs.top_logprobs[0][{t!r}]")) for t, v in first.items()])


def top_chat(out: dict[str, Any]) -> tuple[dict[str, float], int] | None:
    """The next-token top log-probs of a ``/chat/completions`` answer (None: none sent)."""
    ch = out.get("choices")
    if not isinstance(ch, list) or not ch or not isinstance(ch[0], dict):
        return None
    lp = ch[0].get("logprobs")
    if not lp:
        return None
    if not isinstance(lp, dict):
        raise ServerError(f"the server's choices[0].logprobs is {str(lp)[:80]}, expected an object")
    content = lp.get("content") or []
    if not isinstance(content, list):
        raise ServerError(f"the server's choices[0].logprobs.content is {str(content)[:80]}, expected a list")
    if not content:
        return None
    if not isinstance(content[0], dict):
        raise ServerError(f"the server's choices[0].logprobs.content[0] is {str(content[0])[:80]}, expected an object")
    entries = content[0].get("top_logprobs") or []
    if not isinstance(entries, list):
        raise ServerError(f"the server's choices[0].logprobs.content[0].top_logprobs is {str(entries)[:80]}, "
                          f"expected a list")
    pairs = []
    for j, e in enumerate(entries):
        where = f"choices[0].logprobs.content[0].top_logprobs[{j}]"
        if not isinstance(e, dict) or not isinstance(e.get("token"), str):
            raise ServerError(f"the server's {where} has no string 'token': {str(e)[:80]}")
        if "logprob" not in e:
            raise ServerError(f"the server's {where} has no 'logprob': {str(e)[:80]}")
        pairs.append((e["token"], logprob_value(e["logprob"], f"{where}.logprob")))
    return merge(pairs)


def error_message(raw: bytes) -> str:
    """The server's own message from an error answer (at most 300 characters)."""
    try:
        body = json.loads(raw or b"{}")
        err = body.get("error") if isinstance(body, dict) else None
        if isinstance(err, dict):
            return str(err.get("message") or body)[:300]
        return str(err or (body.get("detail") if isinstance(body, dict) else None) or body)[:300]
    except Exception:
        return raw[:300].decode("utf-8", "replace")


def usage_tokens(out: Any, key: str) -> int | None:
    """``usage[key]`` of an answer when it is an int (None otherwise)."""
    usage = out.get("usage") if isinstance(out, dict) else None
    v = usage.get(key) if isinstance(usage, dict) else None
    return v if isinstance(v, int) and not isinstance(v, bool) else None
