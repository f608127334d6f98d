"""Data shapes the retrieval stack hands to the rest of rcn_fast, and the
checks of the batches it takes (a sequence of str, a result count ``k``)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from rcn_fast._validate import is_int


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


def check_texts(texts: Any, name: str = "texts") -> list[str]:
    """``texts`` as a list of str (the API is batch first).

    Raises
    ------
    TypeError
        A single str, or an item that is not a str (the message names
        ``name`` and the item's index).
    """
    if isinstance(texts, str):
        raise TypeError(f"{name}: expected a sequence of str (batch first), got a single str; wrap it in a list")
    texts = list(texts)
    bad = next((i for i, t in enumerate(texts) if not isinstance(t, str)), None)
    if bad is not None:
        raise TypeError(f"{name}: expected str items, item {bad} is {type(texts[bad]).__name__}")
    return texts


def check_k(k: Any, name: str = "k") -> int:
    """``k`` (a count of results) as an int >= 1; a numpy integer counts, a
    bool does not. ValueError naming ``name`` otherwise."""
    if not is_int(k, numpy=True) or k < 1:
        raise ValueError(f"{name}: expected a positive int, got {k!r}")
    return int(k)
