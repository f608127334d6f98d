"""Corpus-file conventions of the store build (:mod:`rcn_fast.retrieval.build`).

* The text field: ``text`` (rcn_fast, DPR/BEIR-style files) or ``contents``
  (FlashRAG's ``{"id", "contents"}`` corpora) when none is named, whichever
  the file has (:func:`detect_text_field`).
* Exact duplicates: by default a passage whose text equals an earlier
  passage's (same bytes) is dropped, the first one kept, and the count is
  logged; ``keep_duplicates`` keeps them. A file of facts attached to
  questions (OpenBookQA's ``fact1``: 4,957 rows, 1,294 distinct) otherwise
  fills the top-k with copies of one sentence. Duplicates are dropped
  inside each chunk before it is embedded (:func:`first_in_chunk`) and
  across chunks when the store is written (:func:`keep_mask`), so every
  executor, shard split and resumed build gives the store a one-pass
  "keep the first" would.
"""

from __future__ import annotations

import csv
import hashlib
import sys
from typing import Any, Sequence

import numpy as np

from rcn_fast._arrays import require
from rcn_fast._jsonl import parse_json_lines

TEXT_FIELDS = ("text", "contents")
DEDUP = "exact-text"  # the build spec's value when duplicates are dropped


class InputError(ValueError):
    """A corpus input file whose content cannot be read as passages (a
    line that is not UTF-8 or JSON, a record without its id or text, a
    missing column, a repeated id, a file that changed during the build):
    the message names the file and the line (row) or records. A build that
    meets one keeps nothing (the input must change, and with it every
    chunk's key)."""


class EmptyInputError(ValueError):
    """A corpus file that holds no record (``path``: the file)."""

    def __init__(self, path: str, why: str | None = None) -> None:
        self.path = path
        super().__init__(f"input: {path} holds no records"
                         + (f": {why}" if why else
                            " (an empty file: a statements file written by `python -m rcn_fast.corpus assemble` is "
                            "empty when no source gave a document; rerun assemble as its warning says, e.g. with "
                            "--text-field FIELD naming the records' text)"))


def detect_text_field(path: str, fmt: str) -> str:
    """``"text"`` or ``"contents"``: the one the file's first record (JSON
    lines) or its header / columns (TSV, Parquet) has, ``text`` first.

    Raises
    ------
    ValueError
        The file has neither (the message names what it has and the option
        to set).
    """
    if fmt == "jsonl":
        names = _first_json_keys(path)
    elif fmt == "tsv":  # the header row (bad bytes are reported by the reader, with their line)
        csv.field_size_limit(min(sys.maxsize, 2**31 - 1))
        with open(path, "rb") as f:
            header = f.readline().decode("utf-8", errors="replace").lstrip("\ufeff").rstrip("\r\n")
        names = next(csv.reader([header], delimiter="\t"), [])
    elif fmt == "parquet":
        names = require("pyarrow.parquet", "pip install pyarrow  (needed to read Parquet corpora)") \
            .ParquetFile(path).schema_arrow.names
    else:
        raise ValueError(f"format: expected 'jsonl', 'tsv' or 'parquet', got {fmt!r}")
    for name in TEXT_FIELDS:
        if name in names:
            return name
    raise ValueError(f"input: {path} has no 'text' or 'contents' field (its first record has {sorted(names)[:20]}); "
                     "name the text field with --text-field (text_field=)")


def _first_json_keys(path: str) -> list[str]:
    with open(path, "rb") as f:
        lines = ((n, raw.decode("utf-8", errors="replace").lstrip("\ufeff")) for n, raw in enumerate(f, 1))
        for _, rec in parse_json_lines(
                lines, lambda n, why: f"input: {path} line {n} is not valid JSON ({why})",
                not_object=lambda n, kind: f"input: {path} line {n} is a {kind}, expected an object"):
            return list(rec)
    raise EmptyInputError(path)


def first_in_chunk(ids: Sequence[str], texts: Sequence[str]) -> tuple[list[str], list[str], int]:
    """Drop the records of one chunk whose text repeats an earlier one of the
    chunk: (kept ids, kept texts, how many were dropped)."""
    seen: set[str] = set()
    kid: list[str] = []
    ktext: list[str] = []
    for i, t in zip(ids, texts):
        if t not in seen:
            seen.add(t)
            kid.append(i)
            ktext.append(t)
    return kid, ktext, len(texts) - len(ktext)


def text_digests(text_blob: np.ndarray, text_len: np.ndarray) -> np.ndarray:
    """128-bit BLAKE2b digests of the texts of one chunk file.

    Parameters
    ----------
    text_blob : uint8 [bytes]
        The chunk's UTF-8 texts, concatenated.
    text_len : int [n]
        Their byte lengths.

    Returns
    -------
    numpy structured array [n] of two uint64 fields ``hi``, ``lo``.
    """
    blob = np.ascontiguousarray(text_blob, dtype=np.uint8).tobytes()
    out = np.empty(len(text_len), dtype=[("hi", "<u8"), ("lo", "<u8")])
    raw = bytearray()
    pos = 0
    for n in np.asarray(text_len, dtype=np.int64).tolist():
        raw += hashlib.blake2b(blob[pos:pos + n], digest_size=16).digest()
        pos += n
    if len(text_len):
        out[:] = np.frombuffer(bytes(raw), dtype=out.dtype)
    return out


def keep_mask(digests: Sequence[np.ndarray]) -> tuple[list[np.ndarray], int]:
    """Which rows to keep, across chunks in order: the first row of each
    distinct text (equal 128-bit BLAKE2b digests: equal bytes).

    Parameters
    ----------
    digests : list of the chunks' :func:`text_digests`, in store order

    Returns
    -------
    (one bool [n_chunk] mask per chunk, number of rows dropped)
    """
    sizes = [len(d) for d in digests]
    n = int(sum(sizes))
    if n == 0:
        return [np.ones(0, bool) for _ in digests], 0
    alld = np.concatenate(digests)
    _, first = np.unique(alld, return_index=True)  # return_index: the first occurrence (stable sort)
    keep = np.zeros(n, dtype=bool)
    keep[first] = True
    bounds = np.cumsum([0] + sizes)
    return [keep[a:b] for a, b in zip(bounds[:-1], bounds[1:])], n - len(first)


def select_rows(z: Any, mask: np.ndarray) -> dict[str, np.ndarray]:
    """The arrays of a chunk file (``emb``, ``text_blob``/``text_len``,
    ``id_blob``/``id_len``, ``hashes``) restricted to the ``mask`` rows."""
    out = {"emb": z["emb"][mask], "hashes": z["hashes"][mask]}
    for kind in ("text", "id"):
        blob, lens = z[f"{kind}_blob"], np.asarray(z[f"{kind}_len"], dtype=np.int64)
        starts = np.concatenate([[0], np.cumsum(lens)[:-1]]).astype(np.int64)
        parts = [blob[s:s + n] for s, n, k in zip(starts.tolist(), lens.tolist(), mask.tolist()) if k]
        out[f"{kind}_blob"] = np.concatenate(parts) if parts else np.zeros(0, dtype=np.uint8)
        out[f"{kind}_len"] = lens[mask]
    return out


__all__ = ["TEXT_FIELDS", "DEDUP", "EmptyInputError", "InputError", "detect_text_field", "first_in_chunk", "text_digests", "keep_mask", "select_rows"]
