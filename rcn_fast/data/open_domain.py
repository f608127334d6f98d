"""Open-domain questions (a question and a list of gold answer aliases) and
their metrics, for ActiveRAG's own setting (NQ, TriviaQA, PopQA, WebQuestions).

Local layout (one JSON object per line, or a JSON array of them)::

    {"id": "...", "question": "...", "answers": ["alias 1", "alias 2", ...], ...other fields -> meta}

Hugging Face datasets are read with ``datasets.load_dataset`` (imported when
needed) through an :class:`OpenFieldMap`; the maps of the four datasets of
the ActiveRAG paper are built in (:data:`OPEN_FIELD_MAPS`) and any other
dataset can be read by passing one.

Metrics
-------
* :func:`normalize_answer` -- lower case, punctuation deleted, the articles
  ``a``/``an``/``the`` removed, white space collapsed (the usual SQuAD
  normalisation).
* :func:`string_em` -- ActiveRAG's accuracy ("StringEM"): true when the
  normalised text of any gold alias occurs inside the normalised
  prediction (plain substring containment, as in the paper; aliases that
  normalise to nothing never match).
* :func:`exact_match` -- true when the normalised prediction equals a
  normalised gold alias.
"""

from __future__ import annotations

import json
import os
import re
import string
import unicodedata
from dataclasses import asdict, dataclass, field
from typing import Any, Sequence

from rcn_fast.data.loaders import DataFormatError, get_field, take_first, hf_split, load_local_or_hf, read_records
from rcn_fast.data.questions import check_question_text


@dataclass
class OpenQuestion:
    """One open-domain question.

    Parameters
    ----------
    id : str
        Stable identifier (keys costs and the LLM call cache).
    question : str
        The question text.
    answers : list[str]
        Gold answer aliases (any of them counts as correct); may be empty
        for unlabelled questions (then the metrics are None).
    meta : dict, optional
        Anything else the source record had.
    """

    id: str
    question: str
    answers: list[str] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.id = check_question_text(self.id, self.question)
        if isinstance(self.answers, str) or not isinstance(self.answers, (list, tuple)):
            raise TypeError(f"answers: expected a list of strings (question id {self.id!r}), "
                            f"got {type(self.answers).__name__}")
        for j, a in enumerate(self.answers):
            if not isinstance(a, str):
                raise TypeError(f"answers[{j}]: expected a string (question id {self.id!r}), got {type(a).__name__}")
        self.answers = list(self.answers)
        if self.meta is None:
            self.meta = {}
        if not isinstance(self.meta, dict):
            raise TypeError(f"meta: expected a dict (question id {self.id!r}), got {type(self.meta).__name__}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "OpenQuestion":
        return cls(id=d["id"], question=d["question"], answers=list(d.get("answers", [])), meta=dict(d.get("meta", {})))


# ------------------------------------------------------------------- metrics
_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCT = set(string.punctuation) | {"\u2018", "\u2019", "\u201c", "\u201d", "\u2013", "\u2014", "\u2026"}


def normalize_answer(text: str) -> str:
    """Normalise an answer for matching.

    Unicode NFKC, lower case, punctuation deleted (``"U.S.A."`` -> ``"usa"``),
    the articles ``a``, ``an`` and ``the`` removed, runs of white space
    collapsed to one space (the SQuAD / DPR normalisation).

    Parameters
    ----------
    text : str

    Returns
    -------
    str

    Examples
    --------
    >>> normalize_answer("The  Eiffel Tower!")
    'eiffel tower'
    """
    if not isinstance(text, str):
        raise TypeError(f"text: expected str, got {type(text).__name__}")
    t = unicodedata.normalize("NFKC", text).lower()
    t = "".join(ch for ch in t if ch not in _PUNCT)
    t = _ARTICLES.sub(" ", t)
    return " ".join(t.split())


def _aliases(answers: str | Sequence[str]) -> list[str]:
    if isinstance(answers, str):
        return [answers]
    if not isinstance(answers, (list, tuple)):
        raise TypeError(f"answers: expected a string or a list of strings, got {type(answers).__name__}")
    for j, a in enumerate(answers):
        if not isinstance(a, str):
            raise TypeError(f"answers[{j}]: expected a string, got {type(a).__name__}")
    return list(answers)


def _normalised_prediction(prediction: Any) -> str:
    if not isinstance(prediction, str):
        raise TypeError(f"prediction: expected str, got {type(prediction).__name__}")
    return normalize_answer(prediction)


def string_em(prediction: str, answers: str | Sequence[str]) -> bool:
    """ActiveRAG's StringEM: does any gold alias occur in the prediction?

    Both sides are normalised with :func:`normalize_answer`; the test is
    substring containment (so ``"paris"`` matches ``"it is paris france"``).
    Aliases that normalise to the empty string never match.

    Parameters
    ----------
    prediction : str
        The model's answer text.
    answers : str or sequence of str
        Gold aliases.

    Returns
    -------
    bool
    """
    pred = _normalised_prediction(prediction)
    return any(a and a in pred for a in (normalize_answer(x) for x in _aliases(answers)))


def exact_match(prediction: str, answers: str | Sequence[str]) -> bool:
    """Does the normalised prediction equal a normalised gold alias?

    Parameters
    ----------
    prediction : str
    answers : str or sequence of str

    Returns
    -------
    bool
    """
    pred = _normalised_prediction(prediction)
    return any(pred == normalize_answer(x) for x in _aliases(answers))


# --------------------------------------------------------------- local files
def _parse_record(rec: Any, where: str) -> OpenQuestion:
    if not isinstance(rec, dict):
        raise DataFormatError(f"{where}: expected a JSON object, got {type(rec).__name__}")
    q = rec.get("question")
    if not isinstance(q, str) or not q.strip():
        raise DataFormatError(f"{where}: missing question text ('question': a non-empty string)")
    answers = rec.get("answers")
    if answers is None:
        raise DataFormatError(f"{where}: missing 'answers' (a list of gold answer strings)")
    if not isinstance(answers, list) or not all(isinstance(a, str) for a in answers):
        raise DataFormatError(f"{where}: 'answers' must be a list of strings, got {json.dumps(answers)[:80]}")
    qid = rec.get("id", where)
    meta = {k: v for k, v in rec.items() if k not in ("id", "question", "answers")}
    return OpenQuestion(id=str(qid), question=q, answers=answers, meta=meta)


def read_open_jsonl(path: str | os.PathLike[str], limit: int | None = None) -> list[OpenQuestion]:
    """Open-domain questions of a JSON-lines file (or a JSON array), read as
    :func:`rcn_fast.data.loaders.read_jsonl` reads multiple-choice ones."""
    return read_records(path, lambda rec, where, _: _parse_record(rec, where), limit)


# --------------------------------------------------------------- Hugging Face
@dataclass(frozen=True)
class OpenFieldMap:
    """How to read an open-domain record of a Hugging Face dataset.

    Field paths use dots for nesting (``"answer.aliases"``).

    Attributes
    ----------
    question : field with the question text.
    answers : field(s) with the gold aliases; several fields are concatenated
        (duplicates dropped, order kept).
    answers_format : ``"list"`` (a list of strings), ``"json"`` (a JSON
        string holding a list, PopQA's ``possible_answers``) or ``"str"``
        (one string).
    id : field with the record id (default: ``"<name>[<split>]-<row>"``).
    config : dataset configuration used when none is given.
    split : split used when none is given.
    """

    question: str
    answers: str | tuple[str, ...]
    answers_format: str = "list"
    id: str | None = None
    config: str | None = None
    split: str = "validation"

    def __post_init__(self) -> None:
        if self.answers_format not in ("list", "json", "str"):
            raise ValueError(f"answers_format: expected 'list', 'json' or 'str', got {self.answers_format!r}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


_NQ = OpenFieldMap(question="question", answers="answer", split="validation")
_TQA = OpenFieldMap(question="question", answers=("answer.value", "answer.aliases"), id="question_id",
                    config="rc.nocontext", split="validation")
_POPQA = OpenFieldMap(question="question", answers="possible_answers", answers_format="json", id="id", split="test")
_WEBQ = OpenFieldMap(question="question", answers="answers", split="test")

#: Built-in field maps: dataset name -> OpenFieldMap (the ActiveRAG datasets).
OPEN_FIELD_MAPS: dict[str, OpenFieldMap] = {
    "nq_open": _NQ,
    "google-research-datasets/nq_open": _NQ,
    "trivia_qa": _TQA,
    "mandarjoshi/trivia_qa": _TQA,
    "akariasai/PopQA": _POPQA,
    "web_questions": _WEBQ,
    "stanfordnlp/web_questions": _WEBQ,
}


def convert_open_record(rec: dict[str, Any], fmap: OpenFieldMap, row: int, where: str) -> OpenQuestion:
    """One dataset row -> OpenQuestion following ``fmap``."""
    try:
        question = str(get_field(rec, fmap.question)).strip()
        fields = fmap.answers if isinstance(fmap.answers, tuple) else (fmap.answers,)
        answers: list[str] = []
        for f in fields:
            raw = get_field(rec, f)
            if fmap.answers_format == "json":
                try:
                    raw = json.loads(raw) if isinstance(raw, str) else raw
                except json.JSONDecodeError:
                    raise DataFormatError(f"{where}: row {row}: field {f!r} is not a JSON list: {raw[:80]!r}") from None
            if isinstance(raw, str):
                raw = [raw]
            if not isinstance(raw, (list, tuple)):
                raise DataFormatError(f"{where}: row {row}: field {f!r}: expected a list of answers, "
                                      f"got {type(raw).__name__}")
            for a in raw:
                a = str(a)
                if a not in answers:
                    answers.append(a)
        qid = str(get_field(rec, fmap.id)) if fmap.id else f"{where}-{row}"
    except KeyError as exc:
        raise DataFormatError(f"{where}: row {row}: missing field {exc.args[0]!r}") from None
    try:
        return OpenQuestion(id=qid, question=question, answers=answers)
    except (TypeError, ValueError) as exc:
        raise DataFormatError(f"{where}: row {row}: {exc}") from None


def load_open_hf(name: str, config: str | None = None, split: str | None = None,
                 fmap: OpenFieldMap | None = None, limit: int | None = None,
                 dataset_kwargs: dict[str, Any] | None = None) -> list[OpenQuestion]:
    """Open-domain questions of a Hugging Face dataset (``datasets`` is imported lazily).

    Parameters
    ----------
    name : dataset id on the hub, or a directory saved with ``save_to_disk``.
    config : dataset configuration (default: the field map's, e.g. TriviaQA's
        ``"rc.nocontext"``).
    split : default: the field map's (``"validation"``; ``"test"`` for PopQA
        and WebQuestions).
    fmap : field map; default the built-in one for ``name``.
    limit : keep the first ``limit`` rows.
    dataset_kwargs : more ``datasets.load_dataset`` arguments (``revision``, ``data_dir`` ...).
    """
    from rcn_fast._arrays import require

    fmap = fmap or OPEN_FIELD_MAPS.get(name)
    if fmap is None:
        raise ValueError(
            f"path_or_name: no built-in field map for dataset {name!r}; pass fields=OpenFieldMap(...) "
            f"(known: {sorted(OPEN_FIELD_MAPS)})"
        )
    datasets = require("datasets", 'pip install "rcn_fast[data]"  (or pip install datasets)')
    split = split or fmap.split
    ds = hf_split(datasets, name, config or fmap.config, split, dataset_kwargs)
    out = []
    for row, rec in enumerate(take_first(ds, limit)):
        out.append(convert_open_record(rec, fmap, row, f"{name}[{split}]"))
    return out


def load_open_questions(path_or_name: str | os.PathLike[str], split: str | None = None,
                        limit: int | None = None, *, config: str | None = None,
                        fields: OpenFieldMap | None = None,
                        dataset_kwargs: dict[str, Any] | None = None) -> list[OpenQuestion]:
    """Load open-domain questions from a local file or a Hugging Face dataset.

    Parameters
    ----------
    path_or_name : str or path
        A ``.jsonl``/``.json`` file (``{"id", "question", "answers": [...]}``
        per record); a directory holding ``*<split>*.jsonl`` files; or a
        Hugging Face dataset id (``"name"`` or ``"name:config"``), with
        built-in field maps for ``nq_open``, ``trivia_qa`` /
        ``mandarjoshi/trivia_qa``, ``akariasai/PopQA`` and ``web_questions``.
    split : str, optional
        For directories: the file whose name contains it (default ``dev``;
        ``validation`` also matches ``dev``). For datasets: the split.
    limit, config, fields, dataset_kwargs
        As for :func:`rcn_fast.data.load_questions` (``fields`` is an
        :class:`OpenFieldMap`); both loaders share
        :func:`rcn_fast.data.loaders.load_local_or_hf`.

    Returns
    -------
    list[OpenQuestion]

    Raises
    ------
    DataFormatError
        A malformed record (the message names file and line, or dataset and row).
    FileNotFoundError
        A local path that does not exist.
    """
    if fields is not None and not isinstance(fields, OpenFieldMap):
        raise TypeError(f"fields: expected an OpenFieldMap, got {type(fields).__name__}")
    return load_local_or_hf(path_or_name, split, limit, config, read_open_jsonl,
                            lambda name, cfg: load_open_hf(name, config=cfg, split=split, fmap=fields, limit=limit,
                                                           dataset_kwargs=dataset_kwargs))


__all__ = [
    "OpenQuestion", "OpenFieldMap", "OPEN_FIELD_MAPS", "load_open_questions", "load_open_hf", "read_open_jsonl",
    "convert_open_record", "normalize_answer", "string_em", "exact_match",
]
