"""The one parse loop of a JSON-lines file: every reader of JSON lines
(benchmark questions, lm-eval task data, corpus sources, corpus build
inputs and their chunked reads, the input-layout sniffing) numbers its
decoded lines its own way and names a bad line in its own words, and parses
them here: blank lines skipped, a line that is not JSON (or, where asked,
not a JSON object) an error naming it, never a bare ``JSONDecodeError``."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator
from typing import Any


def parse_json_lines(lines: Iterable[tuple[int, str]], bad_json: Callable[[int, str], str], *,
                     error: type[Exception] = ValueError,
                     not_object: Callable[[int, str], str] | None = None) -> Iterator[tuple[int, Any]]:
    """The JSON value of each non-blank line of ``lines``.

    Parameters
    ----------
    lines : iterable of (int, str)
        Numbered (from 1), decoded lines.
    bad_json : callable
        ``bad_json(n, why)``: the message for line ``n`` that is not JSON
        (``why``: the decoder's reason).
    error : type
        The exception class raised with that message.
    not_object : callable, optional
        When given, each value must be a JSON object; ``not_object(n,
        type_name)`` is the message for one that is not.

    Yields
    ------
    (int, object)
        The line's number and its parsed value.
    """
    for n, line in lines:
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as exc:
            raise error(bad_json(n, exc.msg)) from None
        if not_object is not None and not isinstance(rec, dict):
            raise error(not_object(n, type(rec).__name__))
        yield n, rec


__all__ = ["parse_json_lines"]
