"""The multiple-choice question record every pipeline consumes."""

from __future__ import annotations

import string
from dataclasses import asdict, dataclass, field
from typing import Any

from rcn_fast._validate import is_int

MAX_CHOICES = 26
DEFAULT_LABELS = tuple(string.ascii_uppercase)


def check_question_text(qid: Any, question: Any) -> str:
    """The question id as str; ValueError unless ``question`` is non-empty text."""
    qid = qid if isinstance(qid, str) else str(qid)
    if not isinstance(question, str) or not question.strip():
        raise ValueError(f"question: expected non-empty text (question id {qid!r})")
    return qid


@dataclass
class MCQuestion:
    """One multiple-choice question.

    Parameters
    ----------
    id : str
        Stable identifier (used as the random-stream key of the sampler and
        as the cache key of LLM calls).
    question : str
        The question text (CommonsenseQA's ``stem``).
    choices : list[str]
        Choice texts, 1 to 26 of them.
    labels : list[str], optional
        One label per choice; defaults to ``A``, ``B``, ``C`` ...
    answer : int, optional
        Index of the correct choice, when known.
    meta : dict, optional
        Anything else the source record had (e.g. OpenBookQA's ``fact1``).
    """

    id: str
    question: str
    choices: list[str]
    labels: list[str] | None = None
    answer: int | None = None
    meta: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.id = check_question_text(self.id, self.question)
        if isinstance(self.choices, str) or not isinstance(self.choices, (list, tuple)):
            raise TypeError(f"choices: expected a list of strings (question id {self.id!r})")
        self.choices = [str(c) for c in self.choices]
        if not 1 <= len(self.choices) <= MAX_CHOICES:
            raise ValueError(
                f"choices: expected 1 to {MAX_CHOICES} choices, got {len(self.choices)} (question id {self.id!r})"
            )
        if self.labels is None:
            self.labels = list(DEFAULT_LABELS[: len(self.choices)])
        else:
            self.labels = [str(x) for x in self.labels]
            if len(self.labels) != len(self.choices):
                raise ValueError(
                    f"labels: expected {len(self.choices)} labels (one per choice), got {len(self.labels)} "
                    f"(question id {self.id!r})"
                )
            if len(set(self.labels)) != len(self.labels):
                raise ValueError(f"labels: expected distinct labels, got {self.labels} (question id {self.id!r})")
        if self.answer is not None:
            if not is_int(self.answer):
                raise TypeError(f"answer: expected a choice index (int), got {self.answer!r} (question id {self.id!r})")
            if not 0 <= self.answer < len(self.choices):
                raise ValueError(
                    f"answer: index {self.answer} is out of range for {len(self.choices)} choices "
                    f"(question id {self.id!r})"
                )
        if self.meta is None:
            self.meta = {}

    @property
    def answer_label(self) -> str | None:
        return None if self.answer is None else self.labels[self.answer]  # type: ignore[index]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "MCQuestion":
        return cls(**d)
