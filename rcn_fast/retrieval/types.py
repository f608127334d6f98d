"""Data shapes the retrieval stack hands to the rest of rcn_fast."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class Passage:
    """One retrieved passage.

    Attributes
    ----------
    id : str
        The corpus id of the passage (the input file's id field).
    text : str
        The passage text as stored (without the encoder's passage prefix).
    score : float
        Similarity to the query (inner product of the stored embeddings;
        cosine when the store was built with ``normalize=True``).
    meta : dict
        At least ``{"row": int}``, the row of the passage in the store.
    """

    id: str
    text: str
    score: float
    meta: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Passage":
        return cls(id=str(d["id"]), text=str(d["text"]), score=float(d["score"]), meta=dict(d.get("meta", {})))
