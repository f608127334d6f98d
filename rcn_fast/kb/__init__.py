"""ZEBRA's example knowledge base: examples (question, choices, explanations),
their retriever, and the silver-KB builder.

* :class:`Example`, :class:`ExampleKB` -- records, JSON-lines load/save.
* :class:`ExampleRetriever` -- dense retrieval of examples; queries and
  entries are both written ``"question [SEP] A. c1 [SEP] B. c2 ..."``.
* :func:`build_silver` -- ZEBRA's silver recipe with any LLM (resumable);
  CLI: ``python -m rcn_fast.kb build-silver --train FILE --llm SPEC --out FILE``.

A KB file is JSON lines, one example per line::

    {"id": "...", "question": "...", "choices": ["..."], "labels": ["A", ...],
     "answer": 0, "explanations": ["...", ...], "text": "<explanations joined>"}

The ``id``/``text`` fields make the same file a corpus input of
``python -m rcn_fast.corpus build`` (one passage per example); ``to-corpus``
writes one passage per explanation instead.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator, Sequence

import numpy as np

from rcn_fast._validate import is_int

SEP = " [SEP] "


@dataclass
class Example:
    """One KB entry."""

    id: str
    question: str
    choices: list[str]
    labels: list[str] | None = None
    answer: int | None = None
    explanations: list[str] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.id = str(self.id)
        if not isinstance(self.question, str) or not self.question.strip():
            raise ValueError(f"question: expected non-empty text (example id {self.id!r})")
        if isinstance(self.choices, str) or not isinstance(self.choices, (list, tuple)) or not self.choices:
            raise TypeError(f"choices: expected a non-empty list of strings (example id {self.id!r})")
        self.choices = [str(c) for c in self.choices]
        if self.labels is None:
            self.labels = [chr(ord("A") + i) for i in range(len(self.choices))]
        self.labels = [str(x) for x in self.labels]
        if len(self.labels) != len(self.choices):
            raise ValueError(f"labels: expected {len(self.choices)} labels, got {len(self.labels)} "
                             f"(example id {self.id!r})")
        if isinstance(self.explanations, str) or not isinstance(self.explanations, (list, tuple)):
            raise TypeError(f"explanations: expected a list of strings (example id {self.id!r})")
        self.explanations = [str(e) for e in self.explanations if str(e).strip()]

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["text"] = " ".join(self.explanations)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Example":
        d = dict(d)
        d.pop("text", None)
        known = {"id", "question", "choices", "labels", "answer", "explanations", "meta"}
        extra = {k: d.pop(k) for k in list(d) if k not in known}
        ex = cls(**d)
        ex.meta.update(extra)
        return ex

    @classmethod
    def from_question(cls, q: Any, explanations: Sequence[str]) -> "Example":
        return cls(id=q.id, question=q.question, choices=list(q.choices), labels=list(q.labels),
                   answer=q.answer, explanations=list(explanations))


def entry_text(question: str, choices: Sequence[str], labels: Sequence[str], sep: str = SEP) -> str:
    """``"question [SEP] A. c1 [SEP] B. c2 ..."`` (query and entry encoding)."""
    return sep.join([question, *(f"{lab}. {c}" for lab, c in zip(labels, choices))])


class ExampleKB:
    """A list of :class:`Example` with JSON-lines I/O."""

    def __init__(self, examples: Iterable[Example] = ()) -> None:
        self.examples = list(examples)
        for i, ex in enumerate(self.examples):
            if not isinstance(ex, Example):
                raise TypeError(f"examples[{i}]: expected an Example, got {type(ex).__name__}")

    def __len__(self) -> int:
        return len(self.examples)

    def __iter__(self) -> Iterator[Example]:
        return iter(self.examples)

    def __getitem__(self, i: int) -> Example:
        return self.examples[i]

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> "ExampleKB":
        """Read a KB file (JSON lines); errors name the line."""
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"path: example KB {path} does not exist")
        out = []
        with open(path, encoding="utf-8") as f:
            for lineno, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    out.append(Example.from_dict(json.loads(line)))
                except json.JSONDecodeError as exc:
                    raise ValueError(f"path: {path} line {lineno} is not valid JSON ({exc.msg})") from None
                except (TypeError, ValueError, KeyError) as exc:
                    raise ValueError(f"path: {path} line {lineno}: {exc}") from None
        return cls(out)

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the KB as JSON lines (atomically)."""
        path = Path(path)
        tmp = path.with_name(path.name + ".tmp")
        with open(tmp, "w", encoding="utf-8") as f:
            for ex in self.examples:
                f.write(json.dumps(ex.to_dict(), ensure_ascii=False) + "\n")
        os.replace(tmp, path)

    def corpus_records(self, per_explanation: bool = True) -> list[dict[str, str]]:
        """``{"id", "text"}`` records for a ReConnect corpus: one per
        explanation (ids ``"<example id>#<i>"``) or one per example."""
        if not per_explanation:
            return [{"id": ex.id, "text": " ".join(ex.explanations)} for ex in self.examples if ex.explanations]
        return [{"id": f"{ex.id}#{i}", "text": e} for ex in self.examples for i, e in enumerate(ex.explanations)]


class ExampleRetriever:
    """Dense retrieval of KB examples for questions.

    Queries and entries are both written with :func:`entry_text` and
    embedded by the same encoder (queries with ``encode_queries``, entries
    with ``encode_passages``: the encoder's own prefixes apply). Entries
    without explanations are not indexed.

    Parameters
    ----------
    kb : ExampleKB
    encoder : EncoderLike
    sep : str
        Separator between the question and each choice.
    embeddings : array [len(kb), d], optional
        Precomputed entry embeddings (rows of the whole KB).
    """

    def __init__(self, kb: ExampleKB, encoder: Any, *, sep: str = SEP, embeddings: Any = None) -> None:
        from rcn_fast.search import FlatIndex

        if not isinstance(kb, ExampleKB):
            raise TypeError(f"kb: expected an ExampleKB, got {type(kb).__name__}")
        self.kb, self.encoder, self.sep = kb, encoder, sep
        self.rows = [i for i, ex in enumerate(kb) if ex.explanations]
        if embeddings is not None:
            emb = np.asarray(embeddings, dtype=np.float32)
            if emb.shape[0] != len(kb):
                raise ValueError(f"embeddings: expected {len(kb)} rows (one per example), got shape {emb.shape}")
            emb = emb[self.rows]
        elif self.rows:
            texts = [entry_text(kb[i].question, kb[i].choices, kb[i].labels, sep) for i in self.rows]
            emb = np.asarray(encoder.encode_passages(texts), dtype=np.float32)
        else:
            emb = np.zeros((0, int(encoder.dim)), np.float32)
        self.index = FlatIndex(int(emb.shape[1]) if emb.shape[0] else int(encoder.dim))
        if len(emb):
            self.index.add(emb)

    def retrieve(self, questions: Sequence[Any], k: int, *, exclude_ids: Sequence[str | None] | None = None
                 ) -> list[list[tuple[Example, float]]]:
        """Top-``k`` examples (with explanations) per question, best first.

        Parameters
        ----------
        questions : sequence of MCQuestion-like, length B
        k : int >= 1
        exclude_ids : sequence (length B) of str or None, optional
            Per question, a KB id never to return (e.g. its own id).

        Returns
        -------
        list (length B) of lists of (Example, score)
        """
        if not is_int(k) or k < 1:
            raise ValueError(f"k: expected an int >= 1, got {k!r}")
        questions = list(questions)
        if exclude_ids is not None and len(exclude_ids) != len(questions):
            raise ValueError(f"exclude_ids: expected {len(questions)} entries, got {len(exclude_ids)}")
        if not questions:
            return []
        if not self.rows:
            return [[] for _ in questions]
        texts = [entry_text(q.question, q.choices, q.labels, self.sep) for q in questions]
        qemb = np.asarray(self.encoder.encode_queries(texts), dtype=np.float32)
        kk = min(k + (1 if exclude_ids is not None else 0), len(self.rows))
        scores, ids = self.index.search(qemb, kk)
        out = []
        for b in range(len(questions)):
            skip = None if exclude_ids is None else exclude_ids[b]
            lst = []
            for s, j in zip(scores[b].tolist(), ids[b].tolist()):
                if j < 0:
                    break
                ex = self.kb[self.rows[j]]
                if skip is not None and ex.id == skip:
                    continue
                lst.append((ex, float(s)))
                if len(lst) == k:
                    break
            out.append(lst)
        return out


def __getattr__(name: str) -> Any:
    if name in ("build_silver", "silver_chat", "SilverResult"):
        from rcn_fast.kb import silver

        return getattr(silver, name)
    raise AttributeError(f"module 'rcn_fast.kb' has no attribute {name!r}")


__all__ = ["Example", "ExampleKB", "ExampleRetriever", "entry_text", "SEP", "build_silver", "silver_chat"]
