"""Reading a corpus input file (JSON lines, TSV, Parquet) for the store
build: records one by one (:func:`iter_records`), one scan of the file
that hashes it and records where each chunk lies (:func:`scan_input`,
memoised per file in the rcn_fast cache), and one chunk at a time
(:func:`read_chunk`)."""

from __future__ import annotations

import csv
import hashlib
import json
import logging
import os
import sys
import time
from dataclasses import astuple, dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

from rcn_fast._arrays import require
from rcn_fast._cache_dirs import cache_dir, read_trusted, trusted_cache
from rcn_fast._hashing import sha256_file
from rcn_fast._jsonl import parse_json_lines
from rcn_fast.retrieval.conventions import InputError
from rcn_fast.retrieval.store import write_json_atomic

logger = logging.getLogger("rcn_fast.retrieval")
FORMATS = ("jsonl", "tsv", "parquet")


def infer_format(path: str) -> str:
    name = path.lower()
    if name.endswith((".jsonl", ".json", ".ndjson")):
        return "jsonl"
    if name.endswith((".tsv", ".tab")):
        return "tsv"
    if name.endswith((".parquet", ".pq")):
        return "parquet"
    raise ValueError(f"input: cannot tell the format of {path!r} from its suffix; pass format='jsonl'|'tsv'|'parquet'")


# ---------------------------------------------------------------------- input
def _not_json(path: str) -> Callable[[int, str], str]:
    """The message for a line of the input ``path`` that is not JSON."""
    return lambda lineno, why: f"input: {path} line {lineno} is not valid JSON ({why})"


def iter_records(path: str, fmt: str, id_field: str = "id", text_field: str = "text") -> Iterator[tuple[str, str]]:
    """Stream (id, text) pairs from a JSON lines, TSV or Parquet file.

    Ids are turned into str; a missing field or a non-string text is a
    ValueError naming the record (line or row number) and the field.
    """
    if fmt == "jsonl":
        with open(path, "rb") as f:
            lines = enumerate(_decoded_lines(f, path), 1)
            for lineno, rec in parse_json_lines(lines, _not_json(path), error=InputError):
                yield _fields(rec, id_field, text_field, f"{path} line {lineno}")
    elif fmt == "tsv":
        csv.field_size_limit(min(sys.maxsize, 2**31 - 1))
        with open(path, "rb") as f:
            reader = csv.DictReader(_decoded_lines(f, path), delimiter="\t")
            missing = [k for k in (id_field, text_field) if k not in (reader.fieldnames or [])]
            if missing:
                raise InputError(f"input: {path} header {reader.fieldnames} lacks the column(s) {missing} "
                                 "(set id_field / text_field)")
            for rowno, rec in enumerate(reader, 2):
                yield _fields(rec, id_field, text_field, f"{path} line {rowno}")
    elif fmt == "parquet":
        pq = require("pyarrow.parquet", "pip install pyarrow  (needed to read Parquet corpora)")
        pf = pq.ParquetFile(path)
        names = pf.schema_arrow.names
        missing = [k for k in (id_field, text_field) if k not in names]
        if missing:
            raise InputError(f"input: {path} columns {names} lack {missing} (set id_field / text_field)")
        row = 0
        for batch in pf.iter_batches(columns=[id_field, text_field], batch_size=8192):
            d = batch.to_pydict()
            for i, t in zip(d[id_field], d[text_field]):
                yield _fields({id_field: i, text_field: t}, id_field, text_field, f"{path} row {row}")
                row += 1
    else:
        raise ValueError(f"format: expected one of {list(FORMATS)}, got {fmt!r}")


def _decoded_lines(f: Any, path: str) -> Iterator[str]:
    """The lines of binary file ``f`` decoded as UTF-8 (line ends kept; a
    leading byte-order mark dropped); ValueError naming the file, line and
    byte offset of the first byte that is not UTF-8."""
    for lineno, raw in enumerate(f, 1):
        yield _decode_line(raw, lineno, path)


def _decode_line(raw: bytes, lineno: int, path: str) -> str:
    if lineno == 1 and raw.startswith(b"\xef\xbb\xbf"):
        raw = raw[3:]
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(f"input: {path} line {lineno} is not valid UTF-8 (byte {raw[exc.start]:#04x} at "
                         f"column {exc.start + 1}); convert the file to UTF-8") from None


def _fields(rec: Any, id_field: str, text_field: str, where: str) -> tuple[str, str]:
    if not isinstance(rec, dict):
        raise InputError(f"input: {where} is a {type(rec).__name__}, expected an object")
    if id_field not in rec or rec[id_field] is None:
        raise InputError(f"input: {where} has no {id_field!r} field (set id_field)")
    if text_field not in rec or not isinstance(rec[text_field], str):
        raise InputError(f"input: {where} has no string {text_field!r} field (set text_field)")
    return str(rec[id_field]), rec[text_field]


def check_input(path: str, fmt: str | None = None, id_field: str = "id", text_field: str | None = None) -> int:
    """Read every record of a corpus input file as the build reads it and
    return how many there are; :class:`InputError` naming the file and the
    line (row) of the first one that cannot be read, ``EmptyInputError``
    for a file without records. ``text_field`` None: ``text``, else
    FlashRAG's ``contents`` (:func:`rcn_fast.retrieval.conventions.detect_text_field`)."""
    from rcn_fast.retrieval.conventions import EmptyInputError, detect_text_field

    fmt = fmt or infer_format(path)
    if text_field is None:
        text_field = detect_text_field(path, fmt)
    n = sum(1 for _ in iter_records(path, fmt, id_field, text_field))
    if n == 0:
        raise EmptyInputError(path)
    return n


# -------------------------------------------------------------- chunk index
SCAN_FORMAT = "rcn_fast.CorpusScan/1"
# a file modified less than this many seconds before its scan is not memoised
# (a rewrite within the same timestamp tick could keep size, mtime and ctime)
_RACY_S = 2.0
_MEMO_MIN_BYTES = 64 << 20  # smaller files are re-read in about a second: not memoised
_WS = b" \t\n\r\x0b\x0c\x1c\x1d\x1e\x1f"  # the ASCII characters str.strip() removes


@dataclass(frozen=True)
class ChunkSpan:
    """Where chunk ``chunk`` of an input file lies.

    Attributes
    ----------
    chunk : int
        Chunk number (0-based, in input order; ``chunk_size`` records each,
        blank JSON lines / empty TSV rows not counted, as
        :func:`iter_records` skips them).
    start, stop : int
        Byte range ``[start, stop)`` (JSON lines, TSV) or row range
        (Parquet) holding exactly the chunk's records.
    first : int
        The line number of byte ``start`` (JSON lines), or the record
        number of the chunk's first record (TSV, Parquet); for messages.
    count : int
        Records in the chunk.
    """

    chunk: int
    start: int
    stop: int
    first: int
    count: int


def scan_input(path: str, fmt: str, chunk_size: int, *, memo: bool = True) -> tuple[str, int, list[ChunkSpan]]:
    """Hash an input file and find where each chunk lies, in one read.

    A shard or a Ray worker then reads only its own chunks
    (:func:`read_chunk`) instead of decoding every record of the file.

    Parameters
    ----------
    path : str
    fmt : {"jsonl", "tsv", "parquet"}
    chunk_size : int
    memo : bool
        Reuse (and save) the answer in ``<rcn_fast cache>/corpus_scan``
        (``$RCN_FAST_CACHE``, else ``~/.cache/rcn_fast``), keyed by the file's
        real path, device, inode, size, mtime and ctime (ctime cannot be set
        back by a user, so a rewritten file always misses). Files under
        64 MiB, and files changed less than 2 s before their scan, are
        never memoised.

    Returns
    -------
    (sha256 hex digest, size in bytes, list of ChunkSpan)
    """
    st = os.stat(path)
    key = {"format": SCAN_FORMAT, "path": os.path.realpath(path), "dev": st.st_dev, "ino": st.st_ino,
           "size": st.st_size, "mtime_ns": st.st_mtime_ns, "ctime_ns": st.st_ctime_ns, "fmt": fmt,
           "chunk_size": chunk_size}
    memo_file = _scan_memo_dir() / (hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest() + ".json")
    memo = memo and trusted_cache(memo_file, what="input scan memo")  # another user could have written it
    try:
        raw = read_trusted(memo_file.parent, memo_file.name, what="input scan memo") if memo else None
    except (OSError, ValueError):  # a link planted as the memo, a memo too large: scanned again
        raw = None
    if raw is not None:  # the memo file itself judged by the fstat of its descriptor (rcn_fast._cache_dirs)
        try:
            got = json.loads(raw)
            if got.get("key") == key:
                logger.info("input %s: hash and chunk offsets reused from %s", path, memo_file)
                return got["sha256"], got["bytes"], [ChunkSpan(*s) for s in got["spans"]]
        except (OSError, ValueError, TypeError, KeyError):
            pass
    t0 = time.time()
    if fmt == "jsonl":
        sha, spans = _scan_lines(path, chunk_size)
    elif fmt == "tsv":
        sha, spans = _scan_tsv(path, chunk_size)
    elif fmt == "parquet":
        pq = require("pyarrow.parquet", "pip install pyarrow  (needed to read Parquet corpora)")
        n = pq.ParquetFile(path).metadata.num_rows
        sha = sha256_file(path)
        spans = [ChunkSpan(c, s, min(s + chunk_size, n), s, min(s + chunk_size, n) - s)
                 for c, s in enumerate(range(0, n, chunk_size))]
    else:
        raise ValueError(f"format: expected one of {list(FORMATS)}, got {fmt!r}")
    st2 = os.stat(path)
    if (st2.st_size, st2.st_mtime_ns, st2.st_ctime_ns) != (st.st_size, st.st_mtime_ns, st.st_ctime_ns):
        raise InputError(f"input: {path} changed while it was being read; rerun once it is complete")
    if memo and st.st_size >= _MEMO_MIN_BYTES and t0 - max(st.st_mtime_ns, st.st_ctime_ns) / 1e9 > _RACY_S:
        try:
            memo_file.parent.mkdir(parents=True, exist_ok=True)
            write_json_atomic(memo_file, {"key": key, "sha256": sha, "bytes": st.st_size,
                                          "spans": [list(astuple(s)) for s in spans]})
        except OSError as exc:  # a read-only cache is no error
            logger.debug("input scan memo not written (%s)", exc)
    return sha, st.st_size, spans


def _scan_memo_dir() -> Path:
    return cache_dir("corpus_scan")


def _is_blank(raw: bytes, lineno: int) -> bool:
    """Whether iter_records skips this JSON line (its decoded text strips
    to nothing), without decoding most lines."""
    s = raw.strip(_WS)
    if not s:
        return True
    if s[0] < 0x80:
        return False  # starts with a printable ASCII character
    if lineno == 1 and raw.startswith(b"\xef\xbb\xbf"):
        raw = raw[3:]
    return not raw.decode("utf-8", errors="replace").strip()


def _scan_lines(path: str, chunk_size: int) -> tuple[str, list[ChunkSpan]]:
    h = hashlib.sha256()
    spans: list[ChunkSpan] = []
    pos = start = 0
    start_line = 1
    n = 0
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, 1):
            h.update(raw)
            pos += len(raw)
            if _is_blank(raw, lineno):
                continue
            n += 1
            if n == chunk_size:
                spans.append(ChunkSpan(len(spans), start, pos, start_line, n))
                start, start_line, n = pos, lineno + 1, 0
    if n:
        spans.append(ChunkSpan(len(spans), start, pos, start_line, n))
    return h.hexdigest(), spans


def _scan_tsv(path: str, chunk_size: int) -> tuple[str, list[ChunkSpan]]:
    csv.field_size_limit(min(sys.maxsize, 2**31 - 1))
    h = hashlib.sha256()
    pos = [0]

    def lines(f: Any) -> Iterator[str]:
        for lineno, raw in enumerate(f, 1):
            h.update(raw)
            pos[0] += len(raw)
            yield _decode_line(raw, lineno, path)

    spans: list[ChunkSpan] = []
    with open(path, "rb") as f:
        reader = csv.reader(lines(f), delimiter="\t")  # reads no line ahead of the row it returns
        next(reader, None)  # header
        start, n, rec = pos[0], 0, 0
        for row in reader:
            if row == []:  # DictReader skips these
                continue
            n += 1
            if n == chunk_size:
                spans.append(ChunkSpan(len(spans), start, pos[0], rec + 2, n))
                start, n, rec = pos[0], 0, rec + n
        if n:
            spans.append(ChunkSpan(len(spans), start, pos[0], rec + 2, n))
        for raw in f:  # nothing left after the last row; keep the hash whole regardless
            h.update(raw)
    return h.hexdigest(), spans


def read_chunk(path: str, fmt: str, span: ChunkSpan, id_field: str = "id",
               text_field: str = "text") -> tuple[list[str], list[str]]:
    """The (ids, texts) of one chunk found by :func:`scan_input`, reading
    only its bytes (rows); records are checked and errors worded as
    :func:`iter_records` does."""
    if fmt == "jsonl":
        recs = _read_jsonl_span(path, span, id_field, text_field)
    elif fmt == "tsv":
        recs = _read_tsv_span(path, span, id_field, text_field)
    elif fmt == "parquet":
        recs = _read_parquet_span(path, span, id_field, text_field)
    else:
        raise ValueError(f"format: expected one of {list(FORMATS)}, got {fmt!r}")
    if len(recs) != span.count:
        raise InputError(f"input: {path} chunk {span.chunk} holds {len(recs)} records where its scan found "
                         f"{span.count}; the file changed since the build began (pass --overwrite to start over)")
    return [r[0] for r in recs], [r[1] for r in recs]


def _span_lines(f: Any, span: ChunkSpan) -> Iterator[tuple[int, bytes]]:
    f.seek(span.start)
    left = span.stop - span.start
    for lineno, raw in enumerate(f, span.first):
        if left <= 0:
            break
        left -= len(raw)
        yield lineno, raw


def _read_jsonl_span(path: str, span: ChunkSpan, id_field: str, text_field: str) -> list[tuple[str, str]]:
    out = []
    with open(path, "rb") as f:
        lines = ((lineno, _decode_line(raw, lineno, path)) for lineno, raw in _span_lines(f, span))
        for lineno, rec in parse_json_lines(lines, _not_json(path), error=InputError):
            out.append(_fields(rec, id_field, text_field, f"{path} line {lineno}"))
    return out


def _read_tsv_span(path: str, span: ChunkSpan, id_field: str, text_field: str) -> list[tuple[str, str]]:
    csv.field_size_limit(min(sys.maxsize, 2**31 - 1))
    with open(path, "rb") as f:
        header = next(csv.reader(_decoded_lines(f, path), delimiter="\t"), None) or []
        missing = [k for k in (id_field, text_field) if k not in header]
        if missing:
            raise InputError(f"input: {path} header {header} lacks the column(s) {missing} "
                             "(set id_field / text_field)")
        # line numbers inside the span only matter for decoding errors
        lines = (_decode_line(raw, lineno, path) for lineno, raw in _span_lines(f, span))
        reader = csv.DictReader(lines, fieldnames=header, delimiter="\t")
        return [_fields(rec, id_field, text_field, f"{path} line {rowno}") for rowno, rec in
                enumerate(reader, span.first)]


def _read_parquet_span(path: str, span: ChunkSpan, id_field: str, text_field: str) -> list[tuple[str, str]]:
    pq = require("pyarrow.parquet", "pip install pyarrow  (needed to read Parquet corpora)")
    pf = pq.ParquetFile(path)
    names = pf.schema_arrow.names
    missing = [k for k in (id_field, text_field) if k not in names]
    if missing:
        raise InputError(f"input: {path} columns {names} lack {missing} (set id_field / text_field)")
    groups, row, first = [], 0, None
    for g in range(pf.metadata.num_row_groups):
        n = pf.metadata.row_group(g).num_rows
        if row < span.stop and row + n > span.start:
            groups.append(g)
            first = row if first is None else first
        row += n
    if not groups:
        return []
    table = pf.read_row_groups(groups, columns=[id_field, text_field])
    d = table.slice(span.start - first, span.stop - span.start).to_pydict()
    return [_fields({id_field: i, text_field: t}, id_field, text_field, f"{path} row {span.start + k}")
            for k, (i, t) in enumerate(zip(d[id_field], d[text_field]))]


__all__ = ["FORMATS", "ChunkSpan", "InputError", "infer_format", "iter_records", "read_chunk", "scan_input",
           "check_input"]
