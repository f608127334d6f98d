"""How ReConnect turns its query-expansion output into retrieval queries.

The paper says only that the model writes k explanations (sec. 3.1); the
authors' released code (``OurRAG.process_knowledge``) decides what a line
is, and rcn_fast follows it by default (``query_parsing="reference"``):

1. strip the generated text (the continuation of the pre-filled
   ``Explanations:`` turn) and keep its first paragraph (up to the first
   ``"\\n\\n"``);
2. split it into lines and delete every ``*`` of a line (the bullet and
   any ``**bold**`` marks; other markers such as ``1.``, ``-`` or ``D:``
   stay);
3. strip each line, drop the empty ones, keep the first k.

So a numbered list keeps its numbers, an answer line written right after
the list (``Answer: B``) is a query when the list has fewer than k lines,
and a run-on repetition (``D: ...`` again and again) fills the k slots
with its first lines. ``query_parsing="markers"`` is rcn_fast's former
parser, :func:`rcn_fast.prompts.parse_bullets` (list markers stripped;
paragraph breaks may hold spaces).
"""

from __future__ import annotations

from rcn_fast._validate import check_choice
from rcn_fast._validate import check_int as _int
from rcn_fast.prompts import parse_bullets

#: The ``query_parsing`` rules of :class:`~rcn_fast.pipelines.ReConnectConfig`.
QUERY_PARSINGS = ("reference", "markers")


def reference_lines(text: str, max_items: int | None = None) -> list[str]:
    """The reference code's explanation lines (see the module docstring).

    Parameters
    ----------
    text : str
        The generated continuation (without the pre-fill).
    max_items : int, optional
        Keep at most this many lines (>= 0); None = all.

    Returns
    -------
    list of str

    Examples
    --------
    >>> reference_lines(" plants need light\\n* 2. water helps\\n\\nAnswer: B", 3)
    ['plants need light', '2. water helps']
    """
    if not isinstance(text, str):
        raise TypeError(f"text: expected str, got {type(text).__name__}")
    _int(max_items, "max_items", 0, allow_none=True)
    lines = text.strip().split("\n\n")[0].split("\n")
    out = [line.replace("*", "").strip() for line in lines]
    out = [line for line in out if line]
    return out if max_items is None else out[:max_items]


def parse_queries(text: str, max_items: int | None, rule: str = "reference") -> list[str]:
    """Queries out of a query-expansion generation by ``rule``
    (``"reference"``: :func:`reference_lines`; ``"markers"``:
    :func:`rcn_fast.prompts.parse_bullets`)."""
    check_choice(rule, "rule", QUERY_PARSINGS)
    if rule == "markers":
        return parse_bullets(text, max_items=max_items)
    return reference_lines(text, max_items)


__all__ = ["QUERY_PARSINGS", "reference_lines", "parse_queries"]
