"""Yes/no questions (StrategyQA-style records: a question and a boolean
answer) as two-choice :class:`MCQuestion` records.

A yes/no question has choices ``["yes", "no"]`` with labels ``["A", "B"]``;
answer True is index 0 ("yes"), False index 1 ("no"). Every multiple-choice
pipeline runs on them unchanged; RR and self-consistency also recognise
them (:func:`is_yes_no`) and use their yes/no prompt.

Local files: JSON lines, one record per line::

    {"qid": "...", "question": "Did Aristotle use a laptop?", "answer": false, ...}

(``id`` is accepted for ``qid``; other fields are kept in ``meta``). Hugging
Face datasets by name through ``datasets`` (e.g. ``"ChilleD/StrategyQA"``,
fields ``qid`` / ``question`` / ``answer``; other field names via
``id_field`` / ``question_field`` / ``answer_field``).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from rcn_fast.data.loaders import DataFormatError, check_limit, read_records, split_file
from rcn_fast.data.questions import MCQuestion

YES_NO_CHOICES = ("yes", "no")
YES_NO_LABELS = ("A", "B")
_TRUE = {"true", "yes", "1", "y", "t"}
_FALSE = {"false", "no", "0", "n", "f"}


def yes_no_question(id: Any, question: str, answer: bool | None, meta: dict[str, Any] | None = None) -> MCQuestion:
    """A yes/no question as an MCQuestion.

    Parameters
    ----------
    id : str (other values are converted with ``str``)
    question : str
    answer : bool or None
        True -> choice 0 ("yes"), False -> choice 1 ("no"), None -> unknown.
    meta : dict, optional

    Returns
    -------
    MCQuestion with choices ``["yes", "no"]``, labels ``["A", "B"]`` and
    ``meta["yes_no"] = True``.
    """
    if answer is not None and not isinstance(answer, bool):
        raise TypeError(f"answer: expected True, False or None, got {answer!r} (question id {id!r})")
    m = dict(meta or {})
    m["yes_no"] = True
    return MCQuestion(id=str(id), question=question, choices=list(YES_NO_CHOICES), labels=list(YES_NO_LABELS),
                      answer=None if answer is None else (0 if answer else 1), meta=m)


def is_yes_no(question: MCQuestion) -> bool:
    """Whether a question is a yes/no question (its choices are "yes" and
    "no", in any case and order, or ``meta["yes_no"]`` is set)."""
    if question.meta.get("yes_no"):
        return True
    return sorted(c.strip().lower() for c in question.choices) == ["no", "yes"]


def _bool(v: Any, where: str, field: str) -> bool | None:
    if v is None or isinstance(v, bool):
        return v
    if isinstance(v, (int, float)) and v in (0, 1):
        return bool(v)
    if isinstance(v, str) and v.strip().lower() in _TRUE | _FALSE:
        return v.strip().lower() in _TRUE
    raise DataFormatError(f"{where}: {field} must be true or false (or yes/no, 1/0), got {v!r}")


def yes_no_record(rec: Any, where: str, id_field: str, question_field: str, answer_field: str,
                  default_id: str) -> MCQuestion:
    """One yes/no record (a JSON object or a dataset row) -> MCQuestion.

    ``where`` prefixes error messages (file and line, or dataset and row);
    ``default_id`` is used when the record has no id. Raises
    :class:`DataFormatError` on a malformed record.
    """
    if not isinstance(rec, dict):
        raise DataFormatError(f"{where}: expected a JSON object, got {type(rec).__name__}")
    q = rec.get(question_field)
    if not isinstance(q, str) or not q.strip():
        raise DataFormatError(f"{where}: missing question text (field {question_field!r})")
    ans = _bool(rec.get(answer_field), where, repr(answer_field))
    qid = rec.get(id_field)
    if qid is None and id_field == "qid":
        qid = rec.get("id")
    if qid is None:
        qid = default_id
    meta = {k: v for k, v in rec.items() if k not in (id_field, question_field, answer_field, "id")}
    try:
        return yes_no_question(str(qid), q, ans, meta)
    except (TypeError, ValueError) as exc:
        raise DataFormatError(f"{where}: {exc}") from None


def load_yes_no_questions(path_or_name: str | os.PathLike[str], split: str | None = None, limit: int | None = None,
                          *, config: str | None = None, id_field: str = "qid", question_field: str = "question",
                          answer_field: str = "answer",
                          dataset_kwargs: dict[str, Any] | None = None) -> list[MCQuestion]:
    """Load yes/no questions from a JSON-lines file or a Hugging Face dataset.

    Parameters
    ----------
    path_or_name : str or path
        A ``.jsonl`` file (one object per line; blank lines skipped), a
        directory holding ``*<split>*.jsonl``, or a Hugging Face dataset id
        / a directory saved with ``save_to_disk``.
    split : str, optional
        Directory: the file whose name contains it (default ``"dev"``).
        Dataset: the split (default ``"test"`` when the dataset has one,
        else its first split; ChilleD/StrategyQA has train and test).
    limit : int, optional
        Keep the first ``limit`` questions.
    config : str, optional
        Dataset configuration.
    id_field, question_field, answer_field : str
        Field names (defaults ``qid`` (``id`` also read), ``question``,
        ``answer``). Answers may be booleans, 0/1 or "yes"/"no"/"true"/"false".
    dataset_kwargs : dict, optional
        More ``datasets.load_dataset`` arguments (``revision``, ``data_dir`` ...).

    Returns
    -------
    list[MCQuestion] (see :func:`yes_no_question`)

    Raises
    ------
    DataFormatError
        A malformed record, naming the file and line (or dataset row).
    """
    check_limit(limit)
    fields = dict(id_field=id_field, question_field=question_field, answer_field=answer_field)
    path = Path(path_or_name)
    path = split_file(path, split) or path
    if path.is_file():
        return read_records(path, lambda rec, where, n: yes_no_record(rec, where, default_id=f"{path.stem}-{n}",
                                                                       **fields), limit, arrays=False)
    name = str(path_or_name)
    if name.endswith((".jsonl", ".json")):
        raise FileNotFoundError(f"path_or_name: {name} does not exist")
    from rcn_fast._arrays import require

    datasets = require("datasets", "pip install datasets")
    if Path(name).is_dir():
        ds = datasets.load_from_disk(name)
    else:
        ds = datasets.load_dataset(name, config, **(dataset_kwargs or {}))
    if isinstance(ds, datasets.DatasetDict):
        splits = list(ds.keys())
        use = split or ("test" if "test" in splits else splits[0])
        if use not in ds:
            raise ValueError(f"split: dataset {name!r} has splits {splits}, not {use!r}")
        ds, split = ds[use], use
    out = []
    for row, rec in enumerate(ds):
        if limit is not None and row >= limit:
            break
        out.append(yes_no_record(dict(rec), f"{name}[{split}] row {row}", default_id=f"{name}-{row}", **fields))
    return out


__all__ = ["yes_no_question", "yes_no_record", "load_yes_no_questions", "is_yes_no", "YES_NO_CHOICES", "YES_NO_LABELS"]
