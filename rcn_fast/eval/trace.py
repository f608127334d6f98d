"""Reading the per-question traces of a run (the schema is in
docs/evaluation.md, "Per-question records and their trace").

* :func:`truncation_counts` -- per stage, how many generations stopped at
  the token limit (``finish_reason == "length"``) out of how many;
* :func:`truncation_line` -- that as one line of the run's output, printed
  after each task before the table (a knowledge generation cut mid-sentence
  distorts what the answer step reads: the output says how often).
"""

from __future__ import annotations

from typing import Any, Iterable


def generation_finishes(entry: dict[str, Any]) -> list[str]:
    """The finish reasons of a ``generate`` trace entry (one per sample;
    ``[]`` for any other entry)."""
    if entry.get("type") != "generate":
        return []
    if isinstance(entry.get("finish_reasons"), list):
        return [str(x) for x in entry["finish_reasons"]]
    return [str(entry["finish_reason"])] if entry.get("finish_reason") is not None else []


def truncation_counts(predictions: Iterable[dict[str, Any]]) -> dict[str, list[int]]:
    """Per stage (in first-seen order), ``[cut, total]``: the generations of
    ``predictions`` (prediction dicts, each with its ``trace``) that
    stopped at ``max_new_tokens`` (``finish_reason == "length"``), and all
    of them. Stages without generations are absent."""
    out: dict[str, list[int]] = {}
    for p in predictions:
        for e in p.get("trace") or []:
            if not isinstance(e, dict):
                continue
            reasons = generation_finishes(e)
            if reasons:
                c = out.setdefault(str(e.get("stage")), [0, 0])
                c[0] += sum(r == "length" for r in reasons)
                c[1] += len(reasons)
    return out


def truncation_line(task: str, pipeline: str, counts: dict[str, list[int]], max_new_tokens: Any = None) -> str | None:
    """``[task] pipeline: 3 of 160 generations stopped at the token limit
    (max_new_tokens=128): query_expansion 1/40, ...``; None without
    generations."""
    if not counts:
        return None
    cut = sum(c for c, _ in counts.values())
    total = sum(t for _, t in counts.values())
    limit = f" (max_new_tokens={max_new_tokens})" if max_new_tokens is not None else ""
    stages = ", ".join(f"{s} {c}/{t}" for s, (c, t) in counts.items())
    return f"[{task}] {pipeline}: {cut} of {total} generations stopped at the token limit{limit}: {stages}"


__all__ = ["generation_finishes", "truncation_counts", "truncation_line"]
