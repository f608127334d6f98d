"""Reading a task's questions: :func:`load_task_questions` (a local file, a
pinned URL, a hub dataset or a folder, with ``--limit``), the conversion of
dataset rows per kind of task, and :func:`split_inline_choices`."""

from __future__ import annotations

import hashlib
import json
import re
import warnings
from pathlib import Path
from typing import Any, Callable, Iterable

from rcn_fast._templates import TemplateLimitError, TemplateRenderError, fill_fields
from rcn_fast.eval.tasks import lm_eval as lm_eval_tasks
from rcn_fast.eval.tasks.sources import check_limit, dataset_rows, is_saved, split_files, take_n
from rcn_fast._file_data import confined
from rcn_fast.eval.tasks.spec import TaskCountWarning, TaskError, TaskSpec, package_path, task_root

_YES_NO_FIELDS = {"id": "qid", "question": "question", "answer": "answer"}


_OPTION = re.compile(r"\(([A-Z])\)\s*")
# the end of the last inline option: a sentence end followed by a new sentence
_TRAILER = re.compile(r"(?<=[^\s])([.?!])\s+(?=[A-Z0-9\"'(])")
_ABBREVIATION = re.compile(r"(?:\b(?:Mr|Mrs|Ms|Dr|St|Jr|Sr|Mt|Prof|vs|etc|No)|\b[A-Z])$")


def split_inline_choices(text: str) -> tuple[str, list[str], list[str]]:
    """``"stem (A) first (B) second"`` -> (stem, choices, labels).

    Text after the last option's sentence (``"... (B) ice. Why?"``) is not
    part of that option: it is appended to the stem. A final ``.``/``?``/``!``
    after an option is dropped.

    Raises
    ------
    ValueError
        Fewer than two options written as ``(A) ... (B) ...``.
    """
    parts = _OPTION.split(text)
    if len(parts) < 5:
        raise ValueError("expected options written as '(A) ... (B) ...' inside the question")
    stem = parts[0].strip()
    labels = parts[1::2]
    choices = [c.strip() for c in parts[2::2]]
    m = next((m for m in _TRAILER.finditer(choices[-1])
              if m.group(1) != "." or not _ABBREVIATION.search(choices[-1][:m.start()])), None)
    if m is not None:
        trailer = choices[-1][m.end():].strip()
        choices[-1] = choices[-1][:m.start()].strip()
        stem = f"{stem} {trailer}".strip()
    choices = [c[:-1].rstrip() if len(c) > 1 and c[-1] in ".?!" else c for c in choices]
    if any(not c for c in choices):
        raise ValueError(f"an empty option in {text!r}")
    return stem, choices, labels


def _permute(q: Any, key: str) -> Any:
    from rcn_fast.data import MCQuestion

    import numpy as np

    seed = int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "little")
    order = np.random.default_rng(seed).permutation(len(q.choices)).tolist()
    choices = [q.choices[i] for i in order]
    answer = None if q.answer is None else order.index(q.answer)
    return MCQuestion(id=q.id, question=q.question, choices=choices, answer=answer, meta=q.meta)



def _convert_mc(spec: TaskSpec, rows: Iterable[Any], split: str, where: str) -> list[Any]:
    from rcn_fast.data import DataFormatError, FieldMap, MCQuestion
    from rcn_fast.data.loaders import convert_record

    f = dict(spec.fields or {})
    f.setdefault("choices", None)
    for k in ("question", "choices", "fixed_choices"):
        if isinstance(f.get(k), list):
            f[k] = tuple(f[k])
    try:
        fmap = FieldMap(**f)
    except TypeError as exc:
        raise TaskError(f"task {spec.name!r}: bad fields ({exc})") from None
    out = []
    for row, rec in enumerate(rows):
        rec = dict(rec)
        if spec.question_template:
            try:
                rec["_question"] = fill_fields(spec.question_template, rec)
            except KeyError as exc:
                raise DataFormatError(f"{where}: row {row}: question_template needs field {exc}") from None
            except (TemplateRenderError, TemplateLimitError) as exc:
                raise DataFormatError(f"{where}: row {row}: {exc}") from None
            fm = FieldMap(**{**fmap.to_dict(), "question": "_question"})
        else:
            fm = fmap
        if spec.choices_in_question:
            qf = fmap.question if isinstance(fmap.question, str) else fmap.question[0]
            try:
                stem, choices, labels = split_inline_choices(str(rec.get(qf, "")))
            except ValueError as exc:
                raise DataFormatError(f"{where}: row {row}: {exc}") from None
            rec["_question"], rec["_choices"], rec["_labels"] = stem, choices, labels
            fm = FieldMap(**{**fm.to_dict(), "question": "_question", "choices": "_choices", "labels": "_labels"})
        q = convert_record(rec, fm, row, where)
        if fmap.id is None:
            q = MCQuestion(id=f"{spec.name}-{split}-{row}", question=q.question, choices=q.choices, labels=q.labels,
                           answer=q.answer, meta=q.meta)
        if spec.shuffle_choices:  # the dataset stores the answer first
            q = _permute(q, f"{spec.name}/{q.id}")
        out.append(q)
    return out


def _convert_yes_no(spec: TaskSpec, rows: Iterable[Any], split: str, where: str) -> list[Any]:
    from rcn_fast.data.yes_no import yes_no_record

    f = {**_YES_NO_FIELDS, **(spec.fields or {})}
    unknown = set(f) - set(_YES_NO_FIELDS)
    if unknown:
        raise TaskError(f"task {spec.name!r}: yes/no fields are {sorted(_YES_NO_FIELDS)}, got {sorted(unknown)}")
    return [yes_no_record(dict(rec), f"{where} row {row}", id_field=f["id"], question_field=f["question"],
                          answer_field=f["answer"], default_id=f"{spec.name}-{split}-{row}")
            for row, rec in enumerate(rows)]


def _convert_open(spec: TaskSpec, rows: Iterable[Any], split: str, where: str) -> list[Any]:
    from rcn_fast.data.open_domain import OpenFieldMap, convert_open_record

    f = dict(spec.fields or {})
    if isinstance(f.get("answers"), list):
        f["answers"] = tuple(f["answers"])
    try:
        fmap = OpenFieldMap(**f)
    except (TypeError, ValueError) as exc:
        raise TaskError(f"task {spec.name!r}: bad fields ({exc})") from None
    out = []
    for row, rec in enumerate(rows):
        q = convert_open_record(dict(rec), fmap, row, where)
        if fmap.id is None:  # ids that do not depend on where the rows were read from
            q.id = f"{spec.name}-{split}-{row}"
        out.append(q)
    return out


def _load_mc_file(path: str, split: str | None, limit: int | None) -> list[Any]:
    from rcn_fast.data import load_questions

    return load_questions(path, split=split, limit=limit)


def _load_yes_no_file(path: str, split: str | None, limit: int | None) -> list[Any]:
    from rcn_fast.data.yes_no import load_yes_no_questions

    return load_yes_no_questions(path, split=split, limit=limit)


def _load_open_file(path: str, split: str | None, limit: int | None) -> list[Any]:
    from rcn_fast.data.open_domain import load_open_questions

    return load_open_questions(path, split=split, limit=limit)


#: Task kind -> (read a local question file, convert dataset rows): a new kind of task adds its readers here.
READERS: dict[str, tuple[Callable[..., list[Any]], Callable[..., list[Any]]]] = {
    "multiple_choice": (_load_mc_file, _convert_mc),
    "yes_no": (_load_yes_no_file, _convert_yes_no),
    "open": (_load_open_file, _convert_open),
}


def _read_file(spec: TaskSpec, path: Path, split: str | None, limit: int | None = None) -> list[Any]:
    """The questions of a local file (or a folder of ``*<split>*.jsonl``), in
    file order: every one, or the first ``limit``."""
    return READERS[spec.kind][0](str(path), split, limit)


def _read_limited(spec: TaskSpec, path: Path, split: str | None, limit: int | float | None) -> tuple[list[Any], int]:
    """The questions ``limit`` keeps and the number in the file. With a
    limit, a JSON-lines file's records are counted without parsing and only
    the kept ones are parsed (:func:`rcn_fast.data.loaders.count_records`);
    a JSON array is parsed whole."""
    from rcn_fast.data.loaders import count_records, split_file

    # a task file's data is read beneath its folder, a folder's files beneath it (rcn_fast._files)
    with confined(task_root(spec, path) or (path if path.is_dir() else None), what=f"task {spec.name!r}"):
        total = None if limit is None else count_records(split_file(path, split) or path)
        if total is None:
            qs = _read_file(spec, path, split)
            return qs[:take_n(len(qs), limit)], len(qs)
        n = take_n(total, limit)
        return _read_file(spec, path, split, limit=max(n, 1))[:n], total


def load_task_questions(spec: TaskSpec, *, limit: int | float | None = None, split: str | None = None) -> list[Any]:
    """The questions of a task.

    Parameters
    ----------
    spec : TaskSpec
    limit : int or float, optional
        The first ``limit`` questions, or (a float in (0, 1)) that fraction
        of the split, rounded up. A JSON-lines file is parsed only up to
        the last question kept (the rest is counted, not parsed).
    split : str, optional
        Overrides ``spec.split``.

    Returns
    -------
    list of :class:`~rcn_fast.data.MCQuestion` (``multiple_choice`` and
    ``yes_no`` tasks) or :class:`~rcn_fast.data.OpenQuestion` (``open``).

    Warns
    -----
    TaskCountWarning
        The split has another number of questions than ``spec.expected_count``.

    Raises
    ------
    rcn_fast.data.DataFormatError
        A malformed record (file and line, or dataset row), or bytes that are not UTF-8.
    rcn_fast.data.fetch.FetchError
        A pinned URL whose file cannot be had or does not match its checksum.
    TaskError
        A split the data does not have, or bad task fields.
    FileNotFoundError
        A local file that does not exist.
    """
    limit = check_limit(limit)
    split = split or spec.split
    expected = spec.expected_count if split == spec.split else None
    if spec.lm_eval is not None:  # a task in lm-evaluation-harness's format
        qs, total, where = lm_eval_tasks.load_questions(spec, limit, split or "validation")
    elif spec.url or spec.local:
        if spec.url:
            from rcn_fast.data.fetch import fetch_pinned

            path = fetch_pinned(spec.url, str(spec.sha256), size=spec.size)
        else:
            path = package_path(str(spec.local))
        qs, total = _read_limited(spec, path, split, limit)
        where = str(path)
    else:
        p = Path(str(spec.dataset))  # ~ is not expanded (a task file's data lies in its own folder)
        if p.is_dir() and not is_saved(p) and split_files(p, split) and _jsonl_layout_fits(spec, p, split):
            qs, total = _read_limited(spec, p, split, limit)  # a folder of JSON-lines split files in rcn_fast's layouts
            where = str(split_files(p, split)[0])
        else:
            split = split or "validation"
            ds, where = dataset_rows(spec, split)
            total = len(ds)
            n = take_n(total, limit)
            rows = ds.select(range(n)) if n < total else ds
            qs = READERS[spec.kind][1](spec, rows, split, where)
    if expected is not None and total != expected:
        warnings.warn(TaskCountWarning(
            f"task {spec.name!r}: {where} has {total} questions, the paper's set has {expected} "
            f"(another file, split or version of the data?)"), stacklevel=2)
    return qs


def _jsonl_layout_fits(spec: TaskSpec, folder: Path, split: str | None) -> bool:
    """Whether a folder's ``*<split>*.jsonl`` is in rcn_fast's own layout for
    the task's kind (CommonsenseQA records for multiple choice) rather than
    a copy of the dataset's raw files."""
    if spec.kind != "multiple_choice":
        return True
    with confined(folder, what=f"task {spec.name!r}"):  # its files beneath the folder's descriptor
        return _has_csqa_question(split_files(folder, split)[0])


def _has_csqa_question(path: Path) -> bool:
    from rcn_fast.data.loaders import DataFormatError, iter_lines

    try:
        for _, line in iter_lines(path):
            if line.strip():
                rec = json.loads(line)
                return isinstance(rec, dict) and (isinstance(rec.get("question"), dict)
                                                  or isinstance(rec.get("choices"), list))
    except (OSError, json.JSONDecodeError, DataFormatError):
        return True  # the CommonsenseQA reader reports the problem with its line number
    return True



__all__ = ["load_task_questions", "split_inline_choices", "READERS"]
