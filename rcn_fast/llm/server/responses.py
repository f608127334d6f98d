"""The JSON shapes of :mod:`rcn_fast.llm.server.app`'s answers, as OpenAI's
API and vLLM write them: chat and completion choices, their log-probs,
stream chunks and usage.

Log-probs of generated tokens (any ``max_tokens``):

* chat (``logprobs: true``, ``top_logprobs: k``): ``choices[i].logprobs =
  {"content": [{"token", "logprob", "bytes", "top_logprobs": [{"token",
  "logprob", "bytes"}] * k}]}``, one entry per generated token;
* completions (``logprobs: k``): the legacy block ``{"tokens",
  "token_logprobs", "top_logprobs", "text_offset"}``; each
  ``top_logprobs`` entry maps the decoded top ``k`` tokens and the sampled
  one to their log-probs (vLLM's rule: ``logprobs: 0`` gives the sampled
  token alone); with ``echo`` the prompt's tokens come first (the first
  prompt entry None).

A token's text is its own decode (special tokens written out, as vLLM);
``bytes`` is that text in UTF-8 (a token holding part of a character
decodes to U+FFFD, as in vLLM).
"""

from __future__ import annotations

from typing import Any, Sequence

#: (token id, log-prob, top [(token id, log-prob)]) of one generated token
Entry = tuple[int, float, list[tuple[int, float]]]


def token_text(tok: Any, token: int) -> str:
    return str(tok.decode([int(token)]))


def chat_logprobs(tok: Any, entries: Sequence[Entry], k: int) -> dict[str, Any]:
    """``choices[i].logprobs`` of a chat answer or chunk."""
    def one(t: int, lp: float) -> dict[str, Any]:
        s = token_text(tok, t)
        return {"token": s, "logprob": lp, "bytes": list(s.encode("utf-8"))}

    return {"content": [{**one(t, lp), "top_logprobs": [one(a, b) for a, b in top[:k]]} for t, lp, top in entries]}


def completion_logprobs(tok: Any, entries: Sequence[Entry], k: int, offset: int = 0) -> dict[str, Any]:
    """The legacy ``logprobs`` block of completion tokens whose text starts
    at character ``offset`` of the choice's text."""
    tokens, lps, tops, offsets = [], [], [], []
    for t, lp, top in entries:
        s = token_text(tok, t)
        d: dict[str, float] = {}
        for a, b in top[:k]:
            d.setdefault(token_text(tok, a), b)
        d.setdefault(s, lp)
        tokens.append(s)
        lps.append(lp)
        tops.append(d)
        offsets.append(offset)
        offset += len(s)
    return {"tokens": tokens, "token_logprobs": lps, "top_logprobs": tops, "text_offset": offsets}


def echo_logprobs(tok: Any, ids: Sequence[int], plp: list[Any], k: int, gen: dict[str, Any]) -> dict[str, Any]:
    """The legacy ``logprobs`` of an ``echo`` request: the prompt's tokens
    (first entry None; ``plp`` from ``ServedModel.prompt_logprobs_ids``),
    then the generated tokens' (``gen``, offsets counted from the prompt)."""
    tokens = [token_text(tok, t) for t in ids]
    token_lps: list[float | None] = [None]
    tops: list[dict[str, float] | None] = [None]
    for q, (lp, top) in enumerate(plp[1:], start=1):
        token_lps.append(lp)
        d: dict[str, float] = {}
        for t, v in top[:k]:
            d.setdefault(token_text(tok, t), v)
        d.setdefault(tokens[q], lp)
        tops.append(d)
    offsets, at = [], 0
    for s in tokens:
        offsets.append(at)
        at += len(s)
    return {"tokens": tokens + gen["tokens"], "token_logprobs": token_lps + gen["token_logprobs"],
            "top_logprobs": tops + gen["top_logprobs"], "text_offset": offsets + [at + o for o in gen["text_offset"]]}


def vllm_prompt_logprobs(tok: Any, ids: Sequence[int], plp: list[Any], k: int) -> list[Any]:
    """vLLM's ``choices[i].prompt_logprobs``: per prompt position None first,
    then ``{token_id: {"logprob", "rank", "decoded_token"}}`` with the prompt
    token and the top ``k``."""
    return [None] + [
        {str(t): {"logprob": v, "rank": None, "decoded_token": token_text(tok, t)}
         for t, v in [(ids[q], e[0]), *e[1][:k]]}
        for q, e in enumerate(plp[1:], start=1)
    ]


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


class Shapes:
    """The envelope of one request's answer or stream chunks (its ``id``,
    ``created``, served ``model`` and kind)."""

    def __init__(self, chat: bool, rid: str, created: int, model: str) -> None:
        self.chat = chat
        self.id = rid
        self.created = created
        self.model = model

    def answer(self, choices: list[dict[str, Any]], use: dict[str, int]) -> dict[str, Any]:
        return {"id": self.id, "object": "chat.completion" if self.chat else "text_completion",
                "created": self.created, "model": self.model, "choices": choices, "usage": use}

    def chunk(self, choices: list[dict[str, Any]], use: dict[str, int] | None = None) -> dict[str, Any]:
        out = {"id": self.id, "object": "chat.completion.chunk" if self.chat else "text_completion",
               "created": self.created, "model": self.model, "choices": choices}
        if use is not None:
            out["usage"] = use
        return out

    def delta(self, index: int, text: str | None, logprobs: dict[str, Any] | None = None,
              finish_reason: str | None = None, role: bool = False) -> dict[str, Any]:
        """One choice of a stream chunk: the chat ``delta`` (the role first)
        or the completion ``text``."""
        c: dict[str, Any] = {"index": index}
        if self.chat:
            d: dict[str, Any] = {"role": "assistant"} if role else {}
            if text is not None:
                d["content"] = text
            c["delta"] = d
        else:
            c["text"] = text or ""
        c["logprobs"] = logprobs
        c["finish_reason"] = finish_reason
        return c


__all__ = ["Entry", "Shapes", "token_text", "chat_logprobs", "completion_logprobs", "echo_logprobs",
           "vllm_prompt_logprobs", "usage"]
