"""A toy LLM backend in one module, for the registry tests: ``toy:<label>``
prefers ``<label>`` in label scoring and answers ``"Answer: <label>"``.

It is what a new backend needs and no more: a class behind the
:class:`rcn_fast.llm.LLM` protocol and a loader ``load_toy(rest, **options)``
registered for a spec prefix (:func:`rcn_fast.llm.registry.register_backend`).
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from rcn_fast.llm.base import Cost, CostTracker, Generation, SampleBackend, check_tags, normalise_labels
from rcn_fast.llm.chat import validate_chats

#: The loads this module did: (rest of the spec, options).
LOADS: list[tuple[str, dict[str, Any]]] = []


class ToyLLM(SampleBackend):
    """Gives ``prefer`` log-probability log(0.9) and splits the rest evenly."""

    def __init__(self, prefer: str, device: str | None = None) -> None:
        if not prefer:
            raise ValueError("spec: expected 'toy:<label>'")
        self.prefer = prefer
        self.identity = f"toy:{prefer}"
        self.cost = CostTracker()

    def _draw(self, valid: list[Any], params: Any, sids: list[list[int]],
              tags: list[str] | None) -> list[list[Generation]]:
        self.cost.record_rows([Cost(len(ids), 3, 2 * len(ids)) for ids in sids], tags)
        return [[Generation(f"Answer: {self.prefer}", 3, 2, "stop") for _ in ids] for ids in sids]

    def label_logprobs(self, chats: Sequence[Any], labels: Any, *, tags: Sequence[str] | None = None) -> np.ndarray:
        valid = validate_chats(chats)
        rows = normalise_labels(labels, len(valid))
        tags = check_tags(tags, len(valid))
        out = np.full((len(rows), max(len(r) for r in rows)), -np.inf, dtype=np.float32)
        for i, row in enumerate(rows):
            rest = np.log(0.1 / max(len(row) - 1, 1)) if self.prefer in row else np.log(1.0 / len(row))
            out[i, : len(row)] = [np.log(0.9) if lab == self.prefer else rest for lab in row]
        self.cost.record_rows([Cost(1, 3, 0)] * len(rows), tags)
        return out


def load_toy(rest: str, **options: Any) -> ToyLLM:
    """The loader: ``toy:<label>`` -> :class:`ToyLLM` (``options``: ``device``)."""
    LOADS.append((rest, dict(options)))
    return ToyLLM(rest, **options)
