"""Readers of the public knowledge sources ReConnect retrieves from.

Each source is named by the user (``NAME=LOCATION``) and read as a stream of
:class:`SourceDocument` (nothing is held in memory beyond one record):

* a **folder** (RACo's release): every ``*.tsv`` / ``*.jsonl`` / ``*.parquet``
  file under it, in sorted path order; each document's ``source`` label is
  ``NAME/<path relative to the folder, without suffix>`` (e.g.
  ``raco/cbd/anli_train``), so ``--exclude cbd`` can drop the commonsense
  benchmark datasets part by its folder or file name;
* a **DPR-style TSV** file: ``id<TAB>text<TAB>title`` rows (RACo's layout),
  with or without the ``id	text	title`` header row;
* a **JSON-lines**, **JSON** (a list) or **Parquet** file, or a **Hugging
  Face dataset** ``hub:OWNER/NAME[:CONFIG][@SPLIT]`` (streamed, split
  ``train`` by default), whose records are read by :func:`record_texts`:
  ZEBRA-KB explanation records (``id``, ``positives``: the explanations, and
  ``explanation`` in the ECQA configs) give one document per explanation;
  statement records give their ``text`` / ``contents`` / ``statement`` /
  ``fact`` field, else OpenBookQA's ``fact1`` (the commonsense layout's
  training facts), or the field the user names.

What a source held is counted in a :class:`SourceStats` (records read,
records without a text and their fields), so a source that yields no
document can say which fields it saw and suggest ``--text-field``.
"""

from __future__ import annotations

import csv
import json
import os
import sys
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from rcn_fast._jsonl import parse_json_lines

#: Fields read as one statement per record, in this order, when no text field is named
#: (``fact1``: OpenBookQA's records in the commonsense layout, one science fact each).
STATEMENT_FIELDS = ("text", "contents", "statement", "fact", "fact1")
#: Records without a text whose field names :class:`SourceStats` keeps.
FIELD_SAMPLE = 1000
#: File suffixes a source folder is scanned for.
FOLDER_SUFFIXES = (".tsv", ".jsonl", ".parquet")


@dataclass(frozen=True)
class SourceSpec:
    """A named source: ``name`` labels its documents, ``location`` says where it is."""

    name: str
    location: str

    @classmethod
    def parse(cls, spec: str) -> SourceSpec:
        """``"NAME=PATH_OR_HUB_ID"`` -> SourceSpec; ValueError naming ``--source`` otherwise."""
        if not isinstance(spec, str) or "=" not in spec:
            raise ValueError(f"--source: expected NAME=PATH_OR_HUB_ID, got {spec!r}")
        name, location = spec.split("=", 1)
        name, location = name.strip(), location.strip()
        if not name or not location or "/" in name or name in {".", ".."}:
            raise ValueError(f"--source: expected NAME=PATH_OR_HUB_ID with a plain NAME (no '/'), got {spec!r}")
        return cls(name, location)


@dataclass
class SourceStats:
    """What reading one source saw: ``records`` read (JSON/Parquet records,
    TSV rows), ``without_text`` of them that gave no document (no text in
    the field read) and ``fields``, the field names of the first
    :data:`FIELD_SAMPLE` such records with how many had each."""

    records: int = 0
    without_text: int = 0
    fields: Counter = field(default_factory=Counter)

    def count(self, rec: Any, texts: int) -> None:
        """One record read that gave ``texts`` documents."""
        self.records += 1
        if texts:
            return
        self.without_text += 1
        if isinstance(rec, dict) and self.without_text <= FIELD_SAMPLE:
            self.fields.update(str(k) for k in rec)

    def to_dict(self) -> dict[str, Any]:
        return {"records": self.records, "without_text": self.without_text, "fields": dict(self.fields)}

    @classmethod
    def from_dict(cls, d: Any) -> SourceStats:
        d = d if isinstance(d, dict) else {}
        return cls(int(d.get("records", 0)), int(d.get("without_text", 0)), Counter(d.get("fields") or {}))

    def explain(self, name: str, location: str, text_field: str | None) -> str | None:
        """The warning for a source without records, or with records that
        gave no document (None when every record gave one)."""
        if not self.records:
            return f"--source {name} ({location}): holds no record"
        if not self.without_text:
            return None
        searched = (f"the field {text_field!r}" if text_field else
                    f"ZEBRA-KB's positives/explanation or one of the fields {', '.join(STATEMENT_FIELDS)}")
        seen = ", ".join(f for f, _ in self.fields.most_common(20)) or "none (not JSON objects with fields)"
        what = ("no record" if self.without_text == self.records
                else f"{self.without_text:,} of its {self.records:,} records")
        return (f"--source {name} ({location}): {what} held a text in {searched}; the fields of those records: {seen}. Name the field that holds the statement "
                "with --text-field FIELD")


@dataclass(frozen=True)
class SourceDocument:
    """One document read from a source, before deduplication."""

    source: str  # label: NAME or NAME/relative/path
    orig_id: str
    text: str


def record_texts(rec: Any, text_field: str | None = None) -> list[tuple[str, str]]:
    """The ``(suffix, text)`` documents one record holds.

    ZEBRA-KB explanation records (a ``positives`` list, optionally an
    ``explanation`` string) give one document per explanation, suffixed
    ``#0``, ``#1`` ...; statement records give their text field (suffix
    ``""``). Empty or missing texts give nothing; a record that is not an
    object is a ValueError.
    """
    if not isinstance(rec, dict):
        raise ValueError(f"expected a JSON object per record, got {type(rec).__name__}")
    if text_field is not None:
        return _texts_of(rec.get(text_field))
    if "positives" in rec or "explanation" in rec:
        out = _texts_of(rec.get("positives"))
        seen = {t for _, t in out}
        extra = rec.get("explanation")
        if isinstance(extra, str) and extra.strip() and extra.strip() not in seen:
            out.append((f"#{len(out)}", extra.strip()))
        return out
    for field in STATEMENT_FIELDS:
        if field in rec:
            return _texts_of(rec[field])
    return []


def _texts_of(value: Any) -> list[tuple[str, str]]:
    if isinstance(value, str):
        return [("", value.strip())] if value.strip() else []
    if value is None:
        return []
    if hasattr(value, "tolist"):  # numpy / pyarrow arrays
        value = value.tolist()
    if isinstance(value, (list, tuple)):
        return [(f"#{i}", v.strip()) for i, v in enumerate(value) if isinstance(v, str) and v.strip()]
    return []


def iter_source(spec: SourceSpec, *, text_field: str | None = None,
                exclude: frozenset[str] = frozenset(), stats: SourceStats | None = None) -> Iterator[SourceDocument]:
    """Stream the documents of one source (see the module docstring for the layouts).

    Files (of a folder) whose label has a path component in ``exclude`` are
    not read at all. ``stats``, when given, counts the records read and
    those without a text (:class:`SourceStats`).
    """
    loc = spec.location
    stats = stats if stats is not None else SourceStats()
    if loc.startswith("hub:"):
        for row, where, rec in iter_records(loc, what=f"--source {spec.name}"):
            yield from _docs_of(rec, spec.name, str(row), text_field, where, stats)
        return
    path = Path(loc)
    if path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix.lower() in FOLDER_SUFFIXES)
        if not files:
            raise FileNotFoundError(f"--source {spec.name}: no {'/'.join(FOLDER_SUFFIXES)} files under {path}")
        for f in files:
            label = f"{spec.name}/{f.relative_to(path).with_suffix('').as_posix()}"
            if is_excluded(label, exclude):
                continue
            yield from _iter_file(f, label, text_field, stats)
        return
    if not path.is_file():
        raise FileNotFoundError(f"--source {spec.name}: {loc} is neither a file, a folder nor hub:OWNER/NAME")
    yield from _iter_file(path, spec.name, text_field, stats)


def is_excluded(label: str, exclude: frozenset[str]) -> bool:
    """Whether a source label (``NAME/part/...``) names an excluded source in any component."""
    return bool(exclude) and any(part in exclude for part in label.split("/"))


def _iter_file(path: Path, label: str, text_field: str | None, stats: SourceStats) -> Iterator[SourceDocument]:
    suffix = path.suffix.lower()
    if suffix == ".tsv":
        yield from _iter_tsv(path, label, stats)
    elif suffix in (".parquet", ".jsonl", ".json"):
        for row, where, rec in iter_records(path, what=f"--source {label}"):
            yield from _docs_of(rec, label, str(row), text_field, where, stats)
    else:
        raise ValueError(f"--source {label}: unsupported file type {path.name} (expected .tsv, .jsonl, .json or .parquet)")


def _iter_tsv(path: Path, label: str, stats: SourceStats) -> Iterator[SourceDocument]:
    """DPR-style rows ``id<TAB>text<TAB>title``; a header row starting with ``id`` names the columns
    (its ``text`` column is read, else the second)."""
    csv.field_size_limit(min(sys.maxsize, 2**31 - 1))
    with open(path, encoding="utf-8", newline="") as fh:
        reader = csv.reader(fh, delimiter="\t", quoting=csv.QUOTE_MINIMAL)
        text_col = 1
        for row_no, row in enumerate(reader, 1):
            if row_no == 1 and row and row[0].strip().lower() == "id":
                names = [c.strip().lower() for c in row]
                text_col = names.index("text") if "text" in names else 1
                continue
            if not row or (len(row) == 1 and not row[0].strip()):
                continue
            if len(row) <= text_col:
                raise ValueError(f"{path}:{row_no}: expected id<TAB>text[<TAB>title], got {len(row)} column(s)")
            text = row[text_col].strip()
            stats.count(None, 1 if text else 0)
            if text:
                yield SourceDocument(label, row[0].strip(), text)


def iter_records(location: str | os.PathLike[str], *, what: str = "--source") -> Iterator[tuple[int, str, Any]]:
    """``(row, where, record)`` of a JSON-lines, JSON (a list), or Parquet file, or of a
    Hugging Face dataset ``hub:OWNER/NAME[:CONFIG][@SPLIT]`` (streamed; split
    ``train`` by default). ``row`` counts records from 1; ``where`` names the
    file and row for messages."""
    loc = os.fspath(location)
    if loc.startswith("hub:"):
        yield from _iter_hub_records(loc[4:], what)
        return
    path = Path(loc)
    if not path.is_file():
        raise FileNotFoundError(f"{what}: {loc} is neither a file nor hub:OWNER/NAME")
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        yield from _iter_parquet_records(path)
    elif suffix in (".jsonl", ".json"):
        yield from _iter_json_records(path)
    else:
        raise ValueError(f"{what}: unsupported file type {path.name} (expected .jsonl, .json or .parquet)")


def _iter_json_records(path: Path) -> Iterator[tuple[int, str, Any]]:
    with open(path, encoding="utf-8") as fh:
        first = fh.read(1)
        while first and first.isspace():
            first = fh.read(1)
        fh.seek(0)
        if first == "[":  # one JSON list
            for row, rec in enumerate(json.load(fh), 1):
                yield row, f"{path}[{row}]", rec
            return
        for row, rec in parse_json_lines(enumerate(fh, 1), lambda n, why: f"{path}:{n}: not valid JSON ({why})"):
            yield row, f"{path}:{row}", rec


def _iter_parquet_records(path: Path) -> Iterator[tuple[int, str, Any]]:
    from rcn_fast._arrays import require

    pq = require("pyarrow.parquet", 'pip install "rcn_fast[parquet]"')
    row = 0
    for batch in pq.ParquetFile(path).iter_batches(batch_size=8192):
        for rec in batch.to_pylist():
            row += 1
            yield row, f"{path}[{row}]", rec


def _iter_hub_records(ident: str, what: str) -> Iterator[tuple[int, str, Any]]:
    from rcn_fast._arrays import require

    name, split = ident.rsplit("@", 1) if "@" in ident else (ident, "train")
    config = None
    if ":" in name:
        name, config = name.split(":", 1)
    if not name or "/" not in name:
        raise ValueError(f"{what}: expected hub:OWNER/NAME[:CONFIG][@SPLIT], got hub:{ident}")
    datasets = require("datasets", 'pip install "rcn_fast[data]"')
    ds = datasets.load_dataset(name, config, split=split, streaming=True)
    for row, rec in enumerate(ds, 1):
        yield row, f"hub:{ident}[{row}]", rec


def _docs_of(rec: Any, label: str, row: str, text_field: str | None, where: str,
             stats: SourceStats) -> Iterator[SourceDocument]:
    try:
        texts = record_texts(rec, text_field)
    except ValueError as exc:
        raise ValueError(f"{where}: {exc}") from None
    stats.count(rec, len(texts))
    rid = rec.get("id") if isinstance(rec, dict) else None
    base = str(rid) if rid is not None and str(rid) else row
    for suffix, text in texts:
        yield SourceDocument(label, base + suffix, text)


def describe_location(spec: SourceSpec) -> dict[str, Any]:
    """What identifies a source's content for a resumed run (path, size, mtime of files)."""
    loc = spec.location
    if loc.startswith("hub:"):
        return {"name": spec.name, "location": loc}
    path = Path(loc)
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    stats = []
    for f in files:
        try:
            st = f.stat()
        except OSError:
            continue
        stats.append([os.fspath(f.relative_to(path)) if path.is_dir() else f.name, st.st_size, int(st.st_mtime)])
    return {"name": spec.name, "location": os.fspath(path.resolve()), "files": stats}
