"""Comparing predictions whose informational scores may differ in the last
float bits: the passages' scores and the trace's retrieval scores (the
search kernel blocks queries by batch), the sampler's relevance,
probabilities and draw probabilities (float32 on other batch shapes)."""

from __future__ import annotations

from typing import Any

import numpy as np


def pop_scores(d: dict[str, Any]) -> list[float]:
    """Remove the informational floats of a prediction dict (in place) and return them in order."""
    out = [p.pop("score") for p in d.get("passages", [])]
    for e in d.get("trace", []):
        if e.get("type") == "retrieve":
            out += [x for row in e.pop("scores", []) for x in row]
            out += [p.pop("score") for p in e.get("passages", []) if isinstance(p, dict) and p.get("score") is not None]
        if e.get("type") == "sample":
            for k in ("relevance", "probability"):
                out += e.pop(k, None) or []
            out += [x for r in e.pop("draw_probability", None) or [] for x in r]
    return out


def assert_same_prediction(a: Any, b: Any) -> None:
    """Equal predictions, the informational floats within 1e-6."""
    da, db = a.to_dict(), b.to_dict()
    np.testing.assert_allclose(pop_scores(da), pop_scores(db), rtol=1e-6, atol=1e-6)
    assert da == db
