"""Loading questions: local files in the CommonsenseQA JSON-lines layout, or
Hugging Face datasets by name.

Local layout (one JSON object per line)::

    {"id": "...", "question": {"stem": "...", "choices": [{"label": "A", "text": "..."}, ...]},
     "answerKey": "A", ...any other fields, kept in MCQuestion.meta}

Hugging Face datasets are read with ``datasets.load_dataset`` (an optional
dependency, imported when needed) and converted with a :class:`FieldMap`;
the maps of well-known commonsense datasets are built in (see
:data:`HF_FIELD_MAPS`), and any other dataset can be read by passing one.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, TypeVar

from rcn_fast._file_data import open_named
from rcn_fast._files import listdir
from rcn_fast._jsonl import parse_json_lines
from rcn_fast.data.questions import MCQuestion
from rcn_fast._validate import is_int

T = TypeVar("T")


class DataFormatError(ValueError):
    """A malformed record; the message names the file and line."""


# ---------------------------------------------------------------- text files
def _not_utf8(path: Path | str, data: bytes, exc: UnicodeDecodeError, first_line: int = 1) -> DataFormatError:
    line = first_line + data.count(b"\n", 0, exc.start)
    col = exc.start - (data.rfind(b"\n", 0, exc.start) + 1) + 1
    bad = data[exc.start:exc.end].hex(" ")
    return DataFormatError(f"{path}:{line}: not UTF-8 text (byte(s) {bad} at column {col}); "
                           f"save the file as UTF-8")


def decode_utf8(data: bytes, path: str | os.PathLike[str]) -> str:
    """``data`` (the bytes of the file ``path``) as text.

    Raises
    ------
    DataFormatError
        Bytes that are not UTF-8, naming the file, line and column.
    """
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _not_utf8(path, data, exc) from None


def read_text(path: str | os.PathLike[str]) -> str:
    """A UTF-8 text file's contents (a BOM is dropped); bytes that are not
    UTF-8 raise :class:`DataFormatError` naming the file and line. Opened
    with :func:`rcn_fast._files.open_named` (beneath a task file's folder
    when read for one)."""
    with open_named(path) as f:
        data = f.read()
    text = decode_utf8(data, path)
    return text[1:] if text.startswith("\ufeff") else text


def iter_lines(path: str | os.PathLike[str]) -> Iterator[tuple[int, str]]:
    """``(line number, text)`` of each line of a UTF-8 file, read one line at
    a time; a line that is not UTF-8 raises :class:`DataFormatError` naming
    the file and line."""
    with open_named(path) as f:
        for lineno, raw in enumerate(f, start=1):
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise _not_utf8(path, raw, exc, first_line=lineno) from None
            if lineno == 1 and text.startswith("\ufeff"):
                text = text[1:]
            yield lineno, text


# ---------------------------------------------------------------- local files
def parse_csqa_record(rec: Any, where: str) -> MCQuestion:
    """One CommonsenseQA-layout record -> MCQuestion (``where`` prefixes errors)."""
    if not isinstance(rec, dict):
        raise DataFormatError(f"{where}: expected a JSON object, got {type(rec).__name__}")
    q = rec.get("question")
    if isinstance(q, dict):
        stem, choices = q.get("stem"), q.get("choices")
    else:
        stem, choices = q, rec.get("choices")
    if not isinstance(stem, str) or not stem.strip():
        raise DataFormatError(f"{where}: missing question text (question.stem)")
    if not isinstance(choices, list) or not choices:
        raise DataFormatError(f"{where}: missing choices (question.choices: a list of {{label, text}})")
    labels, texts = [], []
    for j, ch in enumerate(choices):
        if not isinstance(ch, dict) or "text" not in ch:
            raise DataFormatError(f"{where}: choice {j} is not an object with a 'text'")
        texts.append(str(ch["text"]))
        labels.append(str(ch.get("label", chr(ord("A") + j))))
    answer = None
    key = rec.get("answerKey")
    if key not in (None, ""):
        key = str(key)
        if key not in labels:
            raise DataFormatError(f"{where}: answerKey {key!r} is not one of the labels {labels}")
        answer = labels.index(key)
    meta = {k: v for k, v in rec.items() if k not in ("id", "question", "choices", "answerKey")}
    if isinstance(q, dict):
        meta.update({k: v for k, v in q.items() if k not in ("stem", "choices")})
    qid = rec.get("id", where)
    try:
        return MCQuestion(id=str(qid), question=stem, choices=texts, labels=labels, answer=answer, meta=meta)
    except (TypeError, ValueError) as exc:
        raise DataFormatError(f"{where}: {exc}") from None


def read_records(path: str | os.PathLike[str], parse: Callable[[Any, str, int], T], limit: int | None = None, *,
                 arrays: bool = True) -> list[T]:
    """Parsed records of a JSON-lines file (blank lines skipped) or, with
    ``arrays``, of a file holding one JSON array.

    ``parse(record, where, n)`` converts one record; ``where`` names it for
    error messages (``"<path>:<line>"`` or ``"<path>: record <n>"``), ``n``
    is its line (or 1-based record) number. At most ``limit`` records: a
    JSON-lines file is read no further than the line of the last one kept
    (the lines after it are never parsed); a JSON array is parsed whole.

    Raises
    ------
    DataFormatError
        On a line (or file) that is not valid JSON, naming the file and line.
    """
    path = Path(path)
    out: list[T] = []
    if arrays and _starts_with_bracket(path):
        try:
            records = json.loads(read_text(path))
        except json.JSONDecodeError as exc:
            raise DataFormatError(f"{path}:{exc.lineno}: not valid JSON ({exc.msg})") from None
        for i, rec in enumerate(records):
            out.append(parse(rec, f"{path}: record {i + 1}", i + 1))
            if limit is not None and len(out) >= limit:
                break
        return out
    for lineno, rec in parse_json_lines(iter_lines(path), lambda n, why: f"{path}:{n}: not valid JSON ({why})",
                                        error=DataFormatError):
        out.append(parse(rec, f"{path}:{lineno}", lineno))
        if limit is not None and len(out) >= limit:
            break
    return out


def count_records(path: str | os.PathLike[str]) -> int | None:
    """How many records a JSON-lines file holds (its non-blank lines),
    counted without parsing them; None for a file holding one JSON array
    (that needs a full parse).

    With this count a reader can honour ``--limit`` (the first N records, or
    a fraction of them) by parsing only the records it keeps: a JSON-lines
    file is read in order, so the first N records need only the first N
    lines. Anything that picks records from the whole file (shuffling,
    sampling) needs the whole file parsed.
    """
    path = Path(path)
    if _starts_with_bracket(path):
        return None
    n = 0
    with open_named(path) as f:
        for raw in f:
            if raw.strip() and raw.strip() != b"\xef\xbb\xbf":
                n += 1
    return n


#: Other names of the ``dev`` split, as question files of a folder spell it.
FILE_SPLITS = {"validation": "dev", "valid": "dev", "val": "dev"}


def file_split(split: str | None) -> str:
    """How question files name ``split`` (default ``dev``; ``validation``,
    ``valid`` and ``val`` are ``dev`` there: :data:`FILE_SPLITS`)."""
    want = split or "dev"
    return FILE_SPLITS.get(want, want)


def split_file(path: Path, split: str | None) -> Path | None:
    """The ``*<split>*.jsonl`` file of a directory of question files (the
    first by name; ``split`` default ``dev``, ``validation`` also matches
    ``dev``), or None when ``path`` is not such a directory (a file, or a
    dataset saved with ``save_to_disk``)."""
    if not path.is_dir() or (path / "dataset_info.json").exists() or (path / "dataset_dict.json").exists():
        return None
    want = file_split(split)
    files = [path / n for n in listdir(path) if n.endswith(".jsonl") and not n.startswith(".")
             and want in n[:-len(".jsonl")]]
    if not files:
        raise FileNotFoundError(f"path_or_name: no *{want}*.jsonl file in {path}")
    return files[0]


def hf_split(datasets: Any, name: str, config: str | None, split: str,
             dataset_kwargs: dict[str, Any] | None) -> Any:
    """One split of a Hugging Face dataset: a directory saved with
    ``save_to_disk``, or a hub id read with ``datasets.load_dataset``."""
    if Path(name).is_dir():
        ds = datasets.load_from_disk(name)
        return ds[split] if isinstance(ds, datasets.DatasetDict) else ds
    return datasets.load_dataset(name, config, split=split, **(dataset_kwargs or {}))


def check_limit(limit: Any) -> None:
    """``limit`` is None or a positive int (not a bool)."""
    if limit is not None and (not is_int(limit) or limit < 1):
        raise ValueError(f"limit: expected a positive int, got {limit!r}")


def read_jsonl(path: str | os.PathLike[str], limit: int | None = None) -> list[MCQuestion]:
    """Questions of a CommonsenseQA-layout JSON-lines file (or a JSON array).

    Raises
    ------
    DataFormatError
        On a malformed line, naming the file and line number.
    """
    return read_records(path, lambda rec, where, _: parse_csqa_record(rec, where), limit)


def _starts_with_bracket(path: Path) -> bool:
    """Whether a file holds one JSON array (its first non-space byte is ``[``)."""
    with open_named(path) as f:
        head = f.read(64).lstrip(b"\xef\xbb\xbf \t\r\n")
    return head[:1] == b"["


# ---------------------------------------------------------------- Hugging Face
@dataclass(frozen=True)
class FieldMap:
    """How to read a multiple-choice record of a Hugging Face dataset.

    Field paths use dots for nesting (``"question.stem"``).

    Attributes
    ----------
    question : field with the question text; several fields joined by a
        space when a tuple is given (e.g. HellaSwag's context parts).
    choices : one field holding a list (or a ``{"label": [...], "text": [...]}``
        dict), or a tuple of fields, one per choice.
    answer : field with the answer.
    answer_type : ``"label"`` (matches a label), ``"index"`` (0-based),
        ``"index1"`` (1-based), ``"text"`` (matches a choice text) or
        ``"bool"`` (True -> the first choice, "Yes").
    labels : field with the labels, if the dataset has them.
    id : field with the record id (default: the row number).
    fixed_choices : choices shared by every record (e.g. ("Yes", "No")).
    """

    question: str | tuple[str, ...]
    choices: str | tuple[str, ...] | None
    answer: str
    answer_type: str = "label"
    labels: str | None = None
    id: str | None = None
    fixed_choices: tuple[str, ...] | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def get_field(rec: Any, path: str) -> Any:
    """The value at a dotted ``path`` of a record (``"question.stem"``); KeyError(path) when absent."""
    cur = rec
    for part in path.split("."):
        if not isinstance(cur, dict) or part not in cur:
            raise KeyError(path)
        cur = cur[part]
    return cur


def convert_record(rec: dict[str, Any], fmap: FieldMap, row: int, where: str) -> MCQuestion:
    """One dataset row -> MCQuestion following ``fmap``."""
    try:
        qf = fmap.question if isinstance(fmap.question, tuple) else (fmap.question,)
        question = " ".join(str(get_field(rec, f)).strip() for f in qf).strip()
        labels = None
        if fmap.fixed_choices is not None:
            texts = list(fmap.fixed_choices)
        elif isinstance(fmap.choices, tuple):
            texts = [str(get_field(rec, f)) for f in fmap.choices]
        else:
            raw = get_field(rec, str(fmap.choices))
            if isinstance(raw, dict):
                texts = [str(t) for t in raw["text"]]
                labels = [str(x) for x in raw.get("label", [])] or None
            else:
                texts = [str(t) for t in raw]
        if fmap.labels is not None:
            labels = [str(x) for x in get_field(rec, fmap.labels)]
        raw_answer = get_field(rec, fmap.answer)
    except KeyError as exc:
        raise DataFormatError(f"{where}: row {row}: missing field {exc.args[0]!r}") from None
    answer: int | None = None
    if raw_answer not in (None, "", -1):
        t = fmap.answer_type
        lab = labels or [chr(ord("A") + j) for j in range(len(texts))]
        if t == "label":
            if str(raw_answer) not in lab:
                raise DataFormatError(f"{where}: row {row}: answer {raw_answer!r} is not one of the labels {lab}")
            answer = lab.index(str(raw_answer))
        elif t in ("index", "index1"):
            answer = int(raw_answer) - (1 if t == "index1" else 0)
        elif t == "text":
            if str(raw_answer) not in texts:
                raise DataFormatError(f"{where}: row {row}: answer {raw_answer!r} is not one of the choices")
            answer = texts.index(str(raw_answer))
        elif t == "bool":
            answer = 0 if bool(raw_answer) else 1
        else:
            raise ValueError(f"answer_type: expected label|index|index1|text|bool, got {t!r}")
    qid = str(get_field(rec, fmap.id)) if fmap.id else f"{where}-{row}"
    try:
        return MCQuestion(id=qid, question=question, choices=texts, labels=labels, answer=answer)
    except (TypeError, ValueError) as exc:
        raise DataFormatError(f"{where}: row {row}: {exc}") from None


_CSQA_LIKE = FieldMap(question="question", choices="choices", answer="answerKey", id="id")

#: Built-in field maps: dataset name (optionally ``name:config``) -> FieldMap.
HF_FIELD_MAPS: dict[str, FieldMap] = {
    "tau/commonsense_qa": _CSQA_LIKE,
    "commonsense_qa": _CSQA_LIKE,
    "allenai/ai2_arc": _CSQA_LIKE,
    "ai2_arc": _CSQA_LIKE,
    "allenai/openbookqa": FieldMap(question="question_stem", choices="choices", answer="answerKey", id="id"),
    "openbookqa": FieldMap(question="question_stem", choices="choices", answer="answerKey", id="id"),
    "allenai/qasc": _CSQA_LIKE,
    "qasc": _CSQA_LIKE,
    "ybisk/piqa": FieldMap(question="goal", choices=("sol1", "sol2"), answer="label", answer_type="index"),
    "piqa": FieldMap(question="goal", choices=("sol1", "sol2"), answer="label", answer_type="index"),
    "allenai/winogrande": FieldMap(question="sentence", choices=("option1", "option2"), answer="answer", answer_type="index1"),
    "winogrande": FieldMap(question="sentence", choices=("option1", "option2"), answer="answer", answer_type="index1"),
    "Rowan/hellaswag": FieldMap(question="ctx", choices="endings", answer="label", answer_type="index", id="ind"),
    "hellaswag": FieldMap(question="ctx", choices="endings", answer="label", answer_type="index", id="ind"),
    "allenai/sciq": FieldMap(question="question", choices=("correct_answer", "distractor1", "distractor2", "distractor3"), answer="correct_answer", answer_type="text"),
    "sciq": FieldMap(question="question", choices=("correct_answer", "distractor1", "distractor2", "distractor3"), answer="correct_answer", answer_type="text"),
    "tasksource/commonsense_qa_2.0": FieldMap(question="question", choices=None, answer="answer", answer_type="text", fixed_choices=("yes", "no"), id="id"),
}


def load_hf(name: str, config: str | None = None, split: str | None = None,
            fmap: FieldMap | None = None, limit: int | None = None,
            dataset_kwargs: dict[str, Any] | None = None) -> list[MCQuestion]:
    """Questions of a Hugging Face dataset (``datasets`` is imported lazily).

    Parameters
    ----------
    name : dataset id on the hub (or a local dataset directory saved with
        ``Dataset.save_to_disk``).
    config : dataset configuration (e.g. ``"ARC-Easy"``).
    split : default ``"validation"``.
    fmap : field map; default the built-in one for ``name``.
    dataset_kwargs : more ``datasets.load_dataset`` arguments, e.g.
        ``{"revision": "refs/convert/parquet", "data_dir": "plain_text"}`` for
        a repository that only has a loading script (``datasets`` >= 4 does
        not run them; the hub's parquet conversion keeps each config in a folder).
    """
    from rcn_fast._arrays import require

    datasets = require("datasets", "pip install datasets")
    fmap = fmap or HF_FIELD_MAPS.get(name)
    if fmap is None:
        raise ValueError(
            f"path_or_name: no built-in field map for dataset {name!r}; pass fields=FieldMap(...) "
            f"(known: {sorted(HF_FIELD_MAPS)})"
        )
    split = split or "validation"
    ds = hf_split(datasets, name, config, split, dataset_kwargs)
    out = []
    for row, rec in enumerate(take_first(ds, limit)):
        out.append(convert_record(rec, fmap, row, f"{name}[{split}]"))
    return out


def take_first(it: Iterable[Any], limit: int | None) -> Iterator[Any]:
    """The first ``limit`` items of ``it`` (every item with None), lazily."""
    for i, x in enumerate(it):
        if limit is not None and i >= limit:
            return
        yield x


# ---------------------------------------------------------------- entry point
def load_questions(path_or_name: str | os.PathLike[str], split: str | None = None,
                   limit: int | None = None, *, config: str | None = None,
                   fields: FieldMap | None = None, dataset_kwargs: dict[str, Any] | None = None) -> list[MCQuestion]:
    """Load multiple-choice questions from a local file or a Hugging Face dataset.

    Parameters
    ----------
    path_or_name : str or path
        A ``.jsonl``/``.json`` file in the CommonsenseQA layout; a directory
        holding ``*<split>*.jsonl`` files (e.g. ``csqa/`` with
        ``csqa-dev.jsonl``); or a Hugging Face dataset id (``"name"`` or
        ``"name:config"``).
    split : str, optional
        For directories: the file whose name contains it (``dev``, ``train``,
        ``test``; ``validation`` also matches ``dev``). For datasets: the split.
    limit : int, optional
        Keep the first ``limit`` questions.
    config, fields : Hugging Face dataset configuration and field map.
    dataset_kwargs : dict, optional
        More ``datasets.load_dataset`` arguments (``revision``, ``data_dir`` ...).

    Returns
    -------
    list[MCQuestion]
    """
    return load_local_or_hf(path_or_name, split, limit, config, read_jsonl,
                            lambda name, cfg: load_hf(name, config=cfg, split=split, fmap=fields, limit=limit,
                                                      dataset_kwargs=dataset_kwargs))


def load_local_or_hf(path_or_name: str | os.PathLike[str], split: str | None, limit: int | None,
                     config: str | None, read_local: Callable[[Path, int | None], list[T]],
                     load_dataset: Callable[[str, str | None], list[T]]) -> list[T]:
    """What :func:`load_questions` and
    :func:`rcn_fast.data.load_open_questions` share: a file, or the
    ``*<split>*.jsonl`` file of a directory (:func:`split_file`), is read
    with ``read_local(path, limit)``; anything else is a Hugging Face
    dataset id ``"name"`` or ``"name:config"`` loaded with
    ``load_dataset(name, config)``.

    Raises
    ------
    ValueError
        ``limit`` is not None or a positive int.
    FileNotFoundError
        A ``.jsonl``/``.json`` path that does not exist, or a directory
        without a file of the split.
    """
    check_limit(limit)
    path = Path(path_or_name)
    local = path if path.is_file() else split_file(path, split)
    if local is not None:
        return read_local(local, limit)
    name = str(path_or_name)
    if name.endswith((".jsonl", ".json")):
        raise FileNotFoundError(f"path_or_name: {name} does not exist")
    if ":" in name and config is None and not path.exists():
        name, config = name.split(":", 1)
    return load_dataset(name, config)
