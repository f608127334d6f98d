"""The request-body door of :mod:`rcn_fast.llm.server.app`: every body is
measured on its bytes before any Python object of it exists, charged to
one server-wide budget, and only then parsed.

1. :func:`scan_body` reads the raw bytes once, a block at a time with
   numpy (bounded temporary memory, no Python object per byte or value):
   which quotes are real (not after an odd run of backslashes), hence
   which bytes lie inside strings; outside them, the commas, colons and
   opening brackets are counted -- every JSON value but the first follows
   one of them, every key follows a ``{`` or a comma -- so a body of
   ``{"junk": [{}, {}, ...]}`` is refused for its ``max_json_nodes``
   whatever its fields are named; the nesting depth is the running sum of
   brackets (``max_json_depth``); the strings' bytes are held to
   ``max_json_string_bytes``. Integers of more than :data:`MAX_INT_DIGITS`
   digits and number literals of more than :data:`MAX_NUMBER_CHARS`
   characters are never converted.
2. The scan gives the most memory the parse can hold (:func:`parse_cost`:
   the decoded text, :data:`NODE_BYTES` per value and four bytes per
   string byte -- an upper bound a test checks with ``tracemalloc`` on
   every kind of JSON value); :class:`InflightBytes` charges it, with the
   raw body and the scan (:func:`scan_cost`), to the server-wide
   ``max_inflight_bytes`` until the request ends (a stream included). A
   request that would pass the cap waits for nothing: it is HTTP 503 with
   ``Retry-After`` (one that could never fit alone is 413).
3. :func:`parse_request` parses with the standard library's C decoder and
   walks the result only when the scan or the parse saw something JSON
   allows and no tokenizer can read (a lone UTF-16 surrogate escape, an
   oversized number), naming the field.

What it cannot promise: the cost is of the parse; the work a request then
asks for (token ids, the model's activations, a response's log-probs) is
bounded by the limits of :mod:`rcn_fast.llm.server.limits`, not by this
budget, and the process's own memory (the model) is not counted; a
MemoryError that still happens is HTTP 503 and the server goes on.
"""

from __future__ import annotations

import json
import re
import threading
from dataclasses import dataclass
from typing import Any, Callable

from rcn_fast.llm.server.limits import MAX_INT_DIGITS, APIError, ServeLimits

#: Characters of the longest number literal converted (a longer one is refused, naming its field).
MAX_NUMBER_CHARS = 400
#: Bytes one JSON value or key may hold once parsed, beyond its string bytes (an upper bound: a dict
#: with its table, a list slot, a float, a 40-digit int, a str header; ``tracemalloc`` finds 34-104).
NODE_BYTES = 160
#: Bytes of temporary arrays the scan holds per byte of one block.
SCAN_BYTES_PER_BYTE = 32

_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89abcdefABCDEF]")
_BLOCK = 1 << 18


class OversizedNumber:
    """A number of more than :data:`MAX_INT_DIGITS` digits (an integer) or
    :data:`MAX_NUMBER_CHARS` characters in a request (never converted:
    :func:`parse_request` answers 400 naming its field)."""

    def __init__(self, digits: int) -> None:
        self.digits = digits

    def __repr__(self) -> str:
        return f"<a number of {self.digits:,} digits>"


@dataclass(frozen=True)
class BodyShape:
    """What :func:`scan_body` found: ``nodes`` (an upper bound of the values
    and keys), ``depth`` (the deepest nesting; 0 when the body opens no
    more brackets than ``max_json_depth``), ``string_bytes`` (inside
    quotes, as sent), ``surrogates`` (whether a ``\\uD800``-``\\uDFFF``
    escape occurs) and ``cost`` (:func:`parse_cost`)."""

    nodes: int
    depth: int
    string_bytes: int
    surrogates: bool
    cost: int


def parse_cost(raw_bytes: int, ascii_only: bool, nodes: int, string_bytes: int) -> int:
    """The most bytes parsing a body can hold beyond the raw body: the
    decoded text (4 bytes a character unless ASCII), :data:`NODE_BYTES`
    per value or key and 4 per string byte."""
    return (1 if ascii_only else 4) * raw_bytes + NODE_BYTES * nodes + 4 * string_bytes


def scan_cost(raw_bytes: int) -> int:
    """The bytes a request holds while its body is read and scanned: the
    body and the scan's temporary arrays (:data:`SCAN_BYTES_PER_BYTE` per
    byte of one block)."""
    return raw_bytes + SCAN_BYTES_PER_BYTE * min(raw_bytes, _BLOCK)


def _scan(raw: bytes, max_depth: int) -> tuple[int, int, int]:
    """(commas + colons + opening brackets outside strings, deepest nesting
    (0 while no more than ``max_depth`` brackets were opened), string
    bytes) of ``raw``, one block at a time with the state carried across
    blocks: the run of backslashes before the block (a quote after an odd
    run is escaped) and whether the block starts inside a string."""
    import numpy as np

    marks = np.zeros(256, dtype=np.int8)
    marks[[0x2C, 0x3A]] = 2  # , :
    marks[[0x5B, 0x7B]] = 1  # [ {
    marks[[0x5D, 0x7D]] = -1  # ] }
    counted = opened = depth = best = string_bytes = 0
    run = 0  # backslashes just before the block
    inside = False
    for a in range(0, len(raw), _BLOCK):
        b = np.frombuffer(raw, dtype=np.uint8, count=min(_BLOCK, len(raw) - a), offset=a)
        n = len(b)
        idx = np.arange(n, dtype=np.int32)
        last = np.maximum.accumulate(np.where(b == 0x5C, np.int32(-1 - run), idx))  # last non-backslash <= i
        runs = idx - last  # backslashes ending at i
        del last, idx
        escaped = np.empty(n, dtype=bool)
        escaped[0] = run % 2 == 1
        np.not_equal(runs[:-1] % 2, 0, out=escaped[1:])
        quotes = (b == 0x22) & ~escaped
        del escaped
        odd = (np.cumsum(quotes, dtype=np.int32) + int(inside)) % 2 == 1  # inside a string (its opening quote too)
        string_bytes += int(np.count_nonzero(odd & ~quotes))
        m = marks[b]
        m[odd | quotes] = 0
        opens = int(np.count_nonzero(m == 1))
        counted += int(np.count_nonzero(m == 2)) + opens
        opened += opens
        if opened > max_depth:  # below that, no nesting can be deeper
            steps = np.cumsum(np.where(m == 2, np.int8(0), m), dtype=np.int32) + depth
            best = max(best, int(steps.max()))
            depth = int(steps[-1])
        else:
            depth += opens - int(np.count_nonzero(m == -1))
        run = int(runs[-1])
        inside = bool(odd[-1])
    return counted, best, string_bytes


def scan_body(raw: bytes, limits: ServeLimits) -> BodyShape:
    """Measure a request body on its bytes (module notes, step 1): HTTP 400
    naming the budget when it holds more values and keys than
    ``max_json_nodes``, nests deeper than ``max_json_depth`` or holds more
    string bytes than ``max_json_string_bytes``; no Python object of the
    body is made. The count is exact on valid JSON; on a body that is not,
    it covers the valid part the parser reads before its error (the only
    part that becomes objects)."""
    counted, depth, string_bytes = _scan(raw, limits.max_json_depth)
    nodes = 1 + counted
    if nodes > limits.max_json_nodes:
        raise APIError(400, f"request body: {nodes:,} JSON values and keys, more than the server's max_json_nodes "
                            f"({limits.max_json_nodes:,})")
    if string_bytes > limits.max_json_string_bytes:
        raise APIError(400, f"request body: {string_bytes:,} bytes of strings, more than the server's "
                            f"max_json_string_bytes ({limits.max_json_string_bytes:,})")
    if depth > limits.max_json_depth:
        raise APIError(400, f"invalid JSON: nested too deeply ({depth:,} levels, more than the server's "
                            f"max_json_depth ({limits.max_json_depth}))")
    surrogates = _SURROGATE_ESCAPE.search(raw) is not None
    return BodyShape(nodes, depth, string_bytes, surrogates, parse_cost(len(raw), raw.isascii(), nodes, string_bytes))


def _lone_surrogate(text: str) -> int | None:
    """The index of the first lone UTF-16 surrogate of ``text`` (None when it has none)."""
    try:
        text.encode("utf-8")
        return None
    except UnicodeEncodeError as exc:
        return exc.start


def _join(keys: list[Any]) -> str:
    """``messages[0].content`` from the keys and indices leading to a value."""
    out = ""
    for k in keys:
        out += f"[{k}]" if isinstance(k, int) else (f".{k}" if out else str(k))
    return out


_END = object()


def _walk(body: dict[str, Any], surrogates: bool) -> None:
    """HTTP 400 naming the first field that holds an :class:`OversizedNumber`
    (or, when ``surrogates``, a lone UTF-16 surrogate in a value or key).
    Depth first, one iterator per open container: no per-value path is
    built (``keys`` holds the way to the open container)."""
    stack: list[Any] = [iter(body.items())]
    keys: list[Any] = []
    while stack:
        item = next(stack[-1], _END)
        if item is _END:
            stack.pop()
            if keys:
                keys.pop()
            continue
        key, v = item
        if surrogates and isinstance(key, str) and _lone_surrogate(key) is not None:
            raise APIError(400, f"{_join(keys) or 'body'}: a key holds a lone UTF-16 surrogate ({key[:40]!r})")
        if isinstance(v, OversizedNumber):
            raise APIError(400, f"{_join([*keys, key])}: expected a number in range, got {v!r}")
        if surrogates and isinstance(v, str):
            at = _lone_surrogate(v)
            if at is not None:
                raise APIError(400, f"{_join([*keys, key])}: invalid text: a lone UTF-16 surrogate {v[at]!r} at "
                                    f"character {at}")
        if isinstance(v, (dict, list)):
            stack.append(iter(v.items()) if isinstance(v, dict) else iter(enumerate(v)))
            keys.append(key)


def parse_request(raw: bytes, limits: ServeLimits | None = None,
                  reserve: Callable[[int], None] | None = None) -> dict[str, Any]:
    """The request body as a JSON object, measured before it is parsed and
    checked before any work: :func:`scan_body` (HTTP 400 over a budget of
    ``limits``, the defaults of :class:`ServeLimits` when None), then
    ``reserve(cost)`` (it raises to refuse: :meth:`InflightBytes.charge`),
    then the parse: HTTP 400 for invalid JSON or UTF-8, a body that is not
    an object, a string (or key) holding a lone UTF-16 surrogate
    (``"\\ud800"``: it cannot be encoded, so no tokenizer can read it) or an
    oversized number -- each naming the field (``messages[0].content``,
    ``max_tokens``)."""
    raw = raw or b"{}"
    shape = scan_body(raw, limits or ServeLimits())
    if reserve is not None:
        reserve(shape.cost)
    oversized: list[OversizedNumber] = []

    def number(text: str, convert: Callable[[str], Any], longest: int) -> Any:
        if len(text) <= longest:
            return convert(text)
        oversized.append(OversizedNumber(len(text.lstrip("-"))))
        return oversized[-1]

    try:
        body = json.loads(raw.decode("utf-8"), parse_int=lambda t: number(t, int, MAX_INT_DIGITS),
                          parse_float=lambda t: number(t, float, MAX_NUMBER_CHARS))
    except RecursionError:
        raise APIError(400, "invalid JSON: nested too deeply") from None
    except UnicodeDecodeError as exc:
        raise APIError(400, f"invalid JSON: the body is not UTF-8 ({exc.reason} at byte {exc.start})") from None
    except json.JSONDecodeError as exc:
        raise APIError(400, f"invalid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise APIError(400, "expected a JSON object")
    if oversized or shape.surrogates:
        _walk(body, shape.surrogates)
    return body


class InflightBytes:
    """One server-wide budget of the bytes requests in flight hold (their
    raw bodies and what parsing them can make, :func:`parse_cost`).

    A request is charged before its body is read (its ``Content-Length``)
    and before it is parsed (the scan's cost); :meth:`release` gives all of
    it back when the request ends. A charge that would pass ``cap`` is
    refused at once (HTTP 503 with ``Retry-After``, or 413 when the request
    alone is larger than the cap): nothing waits, so nothing piles up."""

    def __init__(self, cap: int) -> None:
        self.cap = int(cap)
        self.held = 0
        self.refused = 0
        self._lock = threading.Lock()

    def charge(self, n: int, ticket: list[int]) -> None:
        """Charge ``n`` more bytes to a request (``ticket``: a one-item list
        of what it holds so far, released by :meth:`release`)."""
        with self._lock:
            if ticket[0] + n > self.cap:
                self.refused += 1
                raise APIError(413, f"request body: parsing it could hold {ticket[0] + n:,} bytes, more than the "
                                    f"server's max_inflight_bytes ({self.cap:,}) for all requests together")
            if self.held + n > self.cap:
                self.refused += 1
                raise APIError(503, f"the server holds {self.held:,} bytes of requests in flight; this one needs "
                                    f"{n:,} more, past its max_inflight_bytes ({self.cap:,}); retry later",
                               {"Retry-After": "1"})
            self.held += n
            ticket[0] += n

    def release(self, ticket: list[int]) -> None:
        with self._lock:
            self.held -= ticket[0]
            ticket[0] = 0


__all__ = ["parse_request", "scan_body", "parse_cost", "BodyShape", "InflightBytes", "OversizedNumber",
           "MAX_NUMBER_CHARS", "NODE_BYTES"]
