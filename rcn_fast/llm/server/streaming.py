"""Generated tokens -> the text a client may be sent, one token at a time,
and server-sent events on the wire (:mod:`rcn_fast.llm.server.app`).

* :class:`TextStream` -- incremental detokenisation as vLLM and text
  generation inference do it: the new tokens are decoded together with
  the tokens read last time, and the text that appears past the decode of
  those alone is the new text; a decode ending in U+FFFD (an incomplete UTF-8 character:
  the bytes of one character split across tokens) waits for the next
  token, so a character is never split between two chunks. Text that
  could be the start of a stop string is held back until the next token
  shows it is not (llama.cpp's server holds back a partial stop string
  the same way), so a stop string split across tokens or chunks is never
  sent; the text stops where the first stop string starts.
* :class:`RowStream` -- one choice: its tokens, the log-probs of those
  that count as generated (the end-of-turn token too, padding not), the
  text so far and whether the row has ended (a stop token, a stop string,
  ``max_tokens``), by the rule of the local backends
  (:func:`rcn_fast.llm.base.finish_generation`).
* :class:`EventStream` -- ``text/event-stream`` over HTTP/1.1 chunked
  transfer: ``data: {json}\\n\\n`` per event, ``data: [DONE]\\n\\n`` last,
  as OpenAI and vLLM send them. A write that fails or stalls past the
  socket's timeout is the client gone (:class:`~rcn_fast.llm.server.limits.Cancelled`).
"""

from __future__ import annotations

import json
from typing import Any, Sequence

from rcn_fast.llm.server.limits import Cancelled

class TextStream:
    """The text of one row's generated tokens, as far as it is final.

    Parameters
    ----------
    tokenizer
        ``decode(ids, skip_special_tokens=True)`` as the backends decode a
        generation.
    stop : list of str or None
        The request's stop strings.
    """

    def __init__(self, tokenizer: Any, stop: Sequence[str] | None) -> None:
        self.tok = tokenizer
        self.stop = [s for s in (stop or ()) if s]
        self.longest = max((len(s) for s in self.stop), default=0)
        self.ids: list[int] = []
        self.text = ""  # decoded so far (complete characters only)
        self.sent = 0  # characters of ``text`` handed out
        self.stopped = False  # a stop string occurs in the text
        self._prefix = 0  # ids[_prefix:_read] decoded as context of the new ids
        self._read = 0

    def _decode(self, ids: list[int]) -> str:
        return str(self.tok.decode(ids, skip_special_tokens=True))

    def push(self, token: int) -> str:
        """Add one generated token; the text that became final (may be "")."""
        self.ids.append(int(token))
        if self.stopped:
            return ""
        before = self._decode(self.ids[self._prefix : self._read])
        after = self._decode(self.ids[self._prefix :])
        if len(after) > len(before) and not after.endswith("\ufffd") and after.startswith(before):
            self.text += after[len(before) :]
            self._prefix, self._read = self._read, len(self.ids)  # the tokens just read are the next context
        return self._ready()

    def _ready(self) -> str:
        end = len(self.text)
        if self.stop:
            start = max(0, self.sent - self.longest)
            hits = [p for p in (self.text.find(s, start) for s in self.stop) if p >= 0]
            if hits:
                self.stopped = True
                end = min(hits)
            else:
                end = self._held_from(end)
        out = self.text[self.sent : end] if end > self.sent else ""
        self.sent = max(self.sent, end)
        return out

    def _held_from(self, end: int) -> int:
        """Where the longest tail of the unsent text that starts a stop
        string begins (``end`` when none does)."""
        for p in range(max(self.sent, end - self.longest + 1), end):
            tail = self.text[p:end]
            if any(s.startswith(tail) for s in self.stop):
                return p
        return end

    def finish(self, final: str) -> str:
        """The rest of the row's text once it has ended: ``final`` (the
        generation's text, :func:`~rcn_fast.llm.base.finish_generation`)
        past what was handed out. What was handed out is always a prefix of
        ``final`` (the invariant of the stream; a tokenizer whose decode of
        a longer sequence rewrites earlier text would break it: the rest is
        then what follows the longest common prefix)."""
        done = self.text[: self.sent]
        if final.startswith(done):
            return final[self.sent :]
        common = 0
        for a, b in zip(done, final):
            if a != b:
                break
            common += 1
        return final[common:]


class RowStream:
    """One choice of a request: :meth:`add` takes each generated token.

    Parameters
    ----------
    index : int
        The choice's index (prompt ``p``, sample ``s``: ``p * n + s``).
    tokenizer, stop
        As :class:`TextStream`.
    stop_ids, eos_ids : set of int
        Tokens that end the row; those of them that count as generated.
    max_tokens : int
    logprobs : bool
        Whether the log-prob entries are kept.
    """

    def __init__(self, index: int, tokenizer: Any, stop: Sequence[str] | None, stop_ids: set[int],
                 eos_ids: set[int], max_tokens: int, logprobs: bool) -> None:
        self.index = index
        self.text = TextStream(tokenizer, stop)
        self.stop_ids = stop_ids
        self.eos_ids = eos_ids
        self.max_tokens = max_tokens
        self.logprobs = logprobs
        self.tokens = 0
        self.entries: list[tuple[int, float, list[tuple[int, float]]]] = []
        self.ended = False

    def add(self, token: int, logprob: float | None, top: list[tuple[int, float]]) -> tuple[str, list[Any]]:
        """One generated token -> (the text that became final, the new
        log-prob entries ``(token, logprob, top)``); nothing after the row
        ended."""
        if self.ended:
            return "", []
        self.tokens += 1
        entry = [(token, float(logprob), top)] if self.logprobs and logprob is not None else []
        if token in self.stop_ids:
            self.ended = True
            entry = entry if token in self.eos_ids else []
            self.entries += entry
            return "", entry
        delta = self.text.push(token)
        self.ended = self.text.stopped or self.tokens >= self.max_tokens
        self.entries += entry
        return delta, entry


class EventStream:
    """Server-sent events on a handler's connection (chunked transfer).

    Parameters
    ----------
    handler : http.server.BaseHTTPRequestHandler
        The request's handler (its ``wfile`` and ``send_response``); its
        socket's timeout bounds every write.
    """

    def __init__(self, handler: Any) -> None:
        self.handler = handler
        self.started = False
        self.closed = False
        self.events = 0

    def start(self) -> None:
        """The 200 status and headers (once)."""
        if self.started:
            return
        h = self.handler
        self.started = True
        try:
            h.send_response(200)
            h.send_header("Content-Type", "text/event-stream; charset=utf-8")
            h.send_header("Cache-Control", "no-cache")
            h.send_header("Transfer-Encoding", "chunked")
            h.end_headers()
        except OSError:
            self._gone()

    def _write(self, data: bytes) -> None:
        try:
            self.handler.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            self.handler.wfile.flush()
        except OSError:
            self._gone()

    def _gone(self) -> None:
        self.closed = True
        self.handler.close_connection = True
        raise Cancelled("disconnected")

    def send(self, event: dict[str, Any]) -> None:
        """One ``data: {json}`` event."""
        self.start()
        self._write(b"data: " + json.dumps(event, ensure_ascii=False).encode() + b"\n\n")
        self.events += 1

    def end(self) -> None:
        """``data: [DONE]`` and the end of the chunked body."""
        self.start()
        self._write(b"data: [DONE]\n\n")
        try:
            self.handler.wfile.write(b"0\r\n\r\n")
            self.handler.wfile.flush()
        except OSError:
            self.handler.close_connection = True
        self.closed = True


__all__ = ["TextStream", "RowStream", "EventStream"]
