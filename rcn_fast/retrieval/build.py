"""Resumable, shardable corpus build: input file -> :class:`CorpusStore`.

The input is cut into fixed-size chunks (``chunk_size`` records). One read
of the file hashes it and records where each chunk lies (byte range for
JSON lines / TSV, row range for Parquet; :func:`scan_input`, memoised per
file in the rcn_fast cache); each chunk is then read on its own
(:func:`read_chunk`). Each finished chunk is written atomically to
``DIR/parts/`` (a ``.npz`` with its embeddings, texts and ids, renamed into
place only when complete), and ``DIR/build.json`` records the settings.
Running the same command again skips every chunk already in ``parts/``;
settings that differ from ``build.json`` (another input file, encoder,
dtype, chunk size, ...) are an error, not a silently mixed store. When all
chunks exist they are joined into the store files and ``manifest.json`` is
written last.

Shards: with ``num_shards=S, shard_id=I`` a machine embeds chunks
``c`` with ``c % S == I`` into its own directory, decoding only those
chunks; :func:`merge_shards` joins the S directories into a store
identical to a one-machine build. :mod:`rcn_fast.retrieval.build_ray`
runs the same chunks on a Ray Data actor pool instead.
"""

from __future__ import annotations

import csv
import datetime as _dt
import hashlib
import json
import logging
import os
import shutil
import sys
import time
from dataclasses import asdict, astuple, dataclass
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from rcn_fast._arrays import require
from rcn_fast.retrieval.conventions import DEDUP, detect_text_field, first_in_chunk, keep_mask, select_rows, text_digests
from rcn_fast.retrieval.store import (
    DATA_FILES, FLAT_INDEX_FORMAT, FORMAT, CorpusStore, build_id_table, id_hash, read_manifest, sha256_file,
    texts_to_blob, write_json_atomic,
)

logger = logging.getLogger("rcn_fast.retrieval")
BUILD_FORMAT = "rcn_fast.CorpusBuild/1"
FORMATS = ("jsonl", "tsv", "parquet")
# Testing/debug hook: seconds to sleep after each finished chunk (lets a test
# kill a build mid-way on a tiny corpus). Never set in normal use.
THROTTLE_ENV = "RCN_FAST_BUILD_THROTTLE"


@dataclass
class BuildConfig:
    """Settings of a corpus build (plain data; JSON/YAML serialisable).

    Attributes
    ----------
    input : str
        JSON lines, TSV (with a header row) or Parquet file.
    out : str
        Output directory.
    format : str or None
        ``"jsonl" | "tsv" | "parquet"``; None infers it from the suffix.
    id_field : str
        Column / key name of the id.
    text_field : str or None
        Column / key name of the text. None: ``"text"``, else FlashRAG's
        ``"contents"``, whichever the file has (resolved by
        :func:`prepare_build`).
    dtype : {"float16", "float32"}
        Storage dtype of the embeddings.
    batch_size : int
        Texts per encoder forward pass.
    chunk_size : int
        Records per resumable unit of work.
    num_shards, shard_id : int
        This machine embeds chunks ``c`` with ``c % num_shards == shard_id``.
    keep_parts : bool
        Keep ``parts/`` after the store is written.
    overwrite : bool
        Start over: first delete what an earlier build left in ``out``
        (its chunks, ``build.json``/``shard.json`` and the store files, and
        nothing else), even when the settings or the input changed.
    keep_duplicates : bool
        Keep passages whose text repeats an earlier one. Default False: the
        first of each distinct text is kept, the rest dropped and counted
        (:mod:`rcn_fast.retrieval.conventions`).
    """

    input: str
    out: str
    format: str | None = None
    id_field: str = "id"
    text_field: str | None = None
    dtype: str = "float16"
    batch_size: int = 64
    chunk_size: int = 4096
    num_shards: int = 1
    shard_id: int = 0
    keep_parts: bool = False
    overwrite: bool = False
    keep_duplicates: bool = False

    def __post_init__(self) -> None:
        self.input, self.out = str(self.input), str(self.out)
        if self.text_field is not None and (not isinstance(self.text_field, str) or not self.text_field):
            raise ValueError(f"text_field: expected a field name or None (text, else contents), got {self.text_field!r}")
        if self.format is None:
            self.format = infer_format(self.input)
        if self.format not in FORMATS:
            raise ValueError(f"format: expected one of {list(FORMATS)}, got {self.format!r}")
        if self.dtype not in ("float16", "float32"):
            raise ValueError(f"dtype: expected 'float16' or 'float32', got {self.dtype!r}")
        for name in ("batch_size", "chunk_size", "num_shards"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name}: expected a positive int, got {v!r}")
        if not (0 <= self.shard_id < self.num_shards):
            raise ValueError(f"shard_id: expected 0 <= shard_id < num_shards={self.num_shards}, got {self.shard_id}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


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
def iter_records(path: str, fmt: str, id_field: str = "id", text_field: str = "text") -> Iterator[tuple[str, str]]:
    """Stream (id, text) pairs from a JSON lines, TSV or Parquet file.

    Ids are turned into str; a missing field or a non-string text is a
    ValueError naming the record (line or row number) and the field.
    """
    if fmt == "jsonl":
        with open(path, "rb") as f:
            for lineno, line in enumerate(_decoded_lines(f, path), 1):
                if not line.strip():
                    continue
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise ValueError(f"input: {path} line {lineno} is not valid JSON ({exc.msg})") from None
                yield _fields(rec, id_field, text_field, f"{path} line {lineno}")
    elif fmt == "tsv":
        csv.field_size_limit(min(sys.maxsize, 2**31 - 1))
        with open(path, "rb") as f:
            reader = csv.DictReader(_decoded_lines(f, path), delimiter="\t")
            missing = [k for k in (id_field, text_field) if k not in (reader.fieldnames or [])]
            if missing:
                raise ValueError(f"input: {path} header {reader.fieldnames} lacks the column(s) {missing} "
                                 "(set id_field / text_field)")
            for rowno, rec in enumerate(reader, 2):
                yield _fields(rec, id_field, text_field, f"{path} line {rowno}")
    elif fmt == "parquet":
        pq = require("pyarrow.parquet", "pip install pyarrow  (needed to read Parquet corpora)")
        pf = pq.ParquetFile(path)
        names = pf.schema_arrow.names
        missing = [k for k in (id_field, text_field) if k not in names]
        if missing:
            raise ValueError(f"input: {path} columns {names} lack {missing} (set id_field / text_field)")
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
        raise ValueError(f"input: {path} line {lineno} is not valid UTF-8 (byte {raw[exc.start]:#04x} at "
                         f"column {exc.start + 1}); convert the file to UTF-8") from None


def _fields(rec: Any, id_field: str, text_field: str, where: str) -> tuple[str, str]:
    if not isinstance(rec, dict):
        raise ValueError(f"input: {where} is a {type(rec).__name__}, expected an object")
    if id_field not in rec or rec[id_field] is None:
        raise ValueError(f"input: {where} has no {id_field!r} field (set id_field)")
    if text_field not in rec or not isinstance(rec[text_field], str):
        raise ValueError(f"input: {where} has no string {text_field!r} field (set text_field)")
    return str(rec[id_field]), rec[text_field]


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
    if memo and memo_file.is_file():
        try:
            got = json.loads(memo_file.read_text(encoding="utf-8"))
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
        raise ValueError(f"input: {path} changed while it was being read; rerun once it is complete")
    if memo and st.st_size >= _MEMO_MIN_BYTES and t0 - max(st.st_mtime_ns, st.st_ctime_ns) / 1e9 > _RACY_S:
        try:
            memo_file.parent.mkdir(parents=True, exist_ok=True)
            write_json_atomic(memo_file, {"key": key, "sha256": sha, "bytes": st.st_size,
                                          "spans": [list(astuple(s)) for s in spans]})
        except OSError as exc:  # a read-only cache is no error
            logger.debug("input scan memo not written (%s)", exc)
    return sha, st.st_size, spans


def _scan_memo_dir() -> Path:
    from rcn_fast._cache_dirs import cache_root

    return cache_root() / "corpus_scan"


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
        raise ValueError(f"input: {path} chunk {span.chunk} holds {len(recs)} records where its scan found "
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
        for lineno, raw in _span_lines(f, span):
            line = _decode_line(raw, lineno, path)
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"input: {path} line {lineno} is not valid JSON ({exc.msg})") from None
            out.append(_fields(rec, id_field, text_field, f"{path} line {lineno}"))
    return out


def _read_tsv_span(path: str, span: ChunkSpan, id_field: str, text_field: str) -> list[tuple[str, str]]:
    csv.field_size_limit(min(sys.maxsize, 2**31 - 1))
    with open(path, "rb") as f:
        header = next(csv.reader(_decoded_lines(f, path), delimiter="\t"), None) or []
        missing = [k for k in (id_field, text_field) if k not in header]
        if missing:
            raise ValueError(f"input: {path} header {header} lacks the column(s) {missing} "
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
        raise ValueError(f"input: {path} columns {names} lack {missing} (set id_field / text_field)")
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


# ---------------------------------------------------------------------- build
def _spec(cfg: BuildConfig, encoder_desc: dict[str, Any], input_sha: str, input_bytes: int) -> dict[str, Any]:
    enc = {k: v for k, v in encoder_desc.items() if k != "model_dir"}
    spec = {
        "format": BUILD_FORMAT,
        "input": {"name": Path(cfg.input).name, "sha256": input_sha, "bytes": input_bytes, "format": cfg.format,
                  "id_field": cfg.id_field, "text_field": cfg.text_field},
        "encoder": enc, "dtype": cfg.dtype, "chunk_size": cfg.chunk_size, "num_shards": cfg.num_shards,
    }
    if not cfg.keep_duplicates:  # absent: duplicates kept (as every store built before this setting)
        spec["dedup"] = DEDUP
    return spec


def _diff(a: Any, b: Any, prefix: str = "") -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for k in sorted(set(a) | set(b)):
            out += _diff(a.get(k), b.get(k), f"{prefix}{k}.")
        return out
    return [] if a == b else [f"{prefix[:-1]}: {a!r} != {b!r}"]


@dataclass
class PreparedBuild:
    """What :func:`prepare_build` found: the build to run in ``out``.

    Attributes
    ----------
    out, parts : Path
        The output directory and its ``parts/`` folder.
    spec : dict
        The settings recorded in ``build.json`` and the manifest.
    state : dict
        The content of ``build.json``.
    spans : list of ChunkSpan
        Every chunk of the input (all shards).
    mine : list of int
        The chunks this shard builds (all of them for one shard).
    todo : list of int
        Chunks of ``mine`` not yet in ``parts/``.
    done_records : int
        Records of ``mine`` already in ``parts/`` (an earlier run's).
    store : CorpusStore or None
        The finished store when ``out`` already held it (nothing to do).
    """

    out: Path
    parts: Path
    spec: dict[str, Any]
    state: dict[str, Any]
    spans: list[ChunkSpan]
    mine: list[int]
    todo: list[int]
    done_records: int
    store: CorpusStore | None = None


def prepare_build(config: BuildConfig, encoder_desc: dict[str, Any]) -> PreparedBuild:
    """Check ``config.out`` against the settings, write ``build.json`` and
    list the chunks left to embed: the part of a build every executor shares.

    Parameters
    ----------
    config : BuildConfig
    encoder_desc : dict
        The encoder's ``describe()``.

    Returns
    -------
    PreparedBuild (its ``store`` is set when ``out`` already holds the
    finished store).

    Raises
    ------
    ValueError
        ``config.out`` holds a build or store made with other settings
        (the differing settings are listed).
    """
    cfg = config
    out = Path(cfg.out)
    inp = Path(cfg.input)
    if not inp.is_file():
        raise FileNotFoundError(f"input: {inp} does not exist")
    if cfg.text_field is None:
        cfg.text_field = detect_text_field(str(inp), cfg.format)
    t_hash = time.perf_counter()
    input_sha, input_bytes, spans = scan_input(str(inp), cfg.format, cfg.chunk_size)
    spec = _spec(cfg, encoder_desc, input_sha, input_bytes)
    logger.debug("input hashed and scanned in %.2f s", time.perf_counter() - t_hash)
    out.mkdir(parents=True, exist_ok=True)
    cleared = _clear_build(out) if cfg.overwrite else False
    parts = out / "parts"
    state = {"spec": spec, "shard_id": cfg.shard_id, "encoder_model_dir": encoder_desc.get("model_dir")}

    if (out / "manifest.json").is_file():
        manifest = read_manifest(out / "manifest.json")
        built = manifest.get("build") if isinstance(manifest.get("build"), dict) else {}
        diff = _diff({k: built.get(k) for k in spec if k != "num_shards"},
                     {k: v for k, v in spec.items() if k != "num_shards"})
        if diff:
            raise ValueError(f"out: {out} already holds a corpus store built with other settings: "
                             + "; ".join(diff) + ". Use another --out directory, or pass --overwrite "
                             "(overwrite=True) to replace it.")
        logger.warning("%s is already complete (%d passages); nothing to do", out, manifest["count"])
        return PreparedBuild(out, parts, spec, state, spans, [], [], 0, store=CorpusStore.open(out))

    build_file = out / "build.json"
    if build_file.is_file():
        try:
            prev = json.loads(build_file.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ValueError(f"out: {build_file} is not valid JSON ({exc}); pass --overwrite (overwrite=True) "
                             "to start the build over") from None
        prev = prev if isinstance(prev, dict) else {}
        diff = _diff({"spec": prev.get("spec"), "shard_id": prev.get("shard_id")},
                     {"spec": spec, "shard_id": cfg.shard_id})
        if diff:
            raise ValueError(f"out: {out} holds an unfinished build with other settings: " + "; ".join(diff)
                             + ". Rerun with the original settings to resume, pass --overwrite (overwrite=True) "
                             "to discard it and start over, or use another --out directory.")
    elif any(out.iterdir()) and not cleared:
        raise ValueError(f"out: {out} is not empty and holds no corpus build; choose an empty or new directory")
    else:
        write_json_atomic(build_file, state)

    parts.mkdir(exist_ok=True)
    for stale in parts.glob(".*.tmp*"):  # a chunk that was being written when killed
        stale.unlink(missing_ok=True)
    done_before = {p.name for p in parts.glob("chunk-*.npz")}
    if done_before:
        logger.warning("resuming %s: %d chunk(s) already done, skipping them", out, len(done_before))
    mine = [s.chunk for s in spans if s.chunk % cfg.num_shards == cfg.shard_id]
    todo = [c for c in mine if chunk_name(c) not in done_before]
    done_records = sum(spans[c].count for c in mine if chunk_name(c) in done_before)
    return PreparedBuild(out, parts, spec, state, spans, mine, todo, done_records)


def chunk_name(c: int) -> str:
    """File name of chunk ``c`` in ``parts/``."""
    return f"chunk-{c:08d}.npz"


def write_chunk(parts: Path, c: int, ids: list[str], texts: list[str], emb: Any, *, dim: int, dtype: str,
                dropped: int = 0) -> None:
    """Check a chunk's embeddings and write ``parts/chunk-c.npz``
    atomically (a temporary file, fsync, rename); ``dropped``: duplicate
    records left out of it (counted in the store's log and manifest)."""
    emb = np.asarray(emb, dtype=np.float32)
    if emb.shape != (len(texts), dim):
        raise ValueError(f"encoder: returned shape {emb.shape} for {len(texts)} texts, "
                         f"expected ({len(texts)}, {dim})")
    if not np.isfinite(emb).all():
        raise ValueError(f"encoder: non-finite embeddings in chunk {c}")
    tblob, tlen = texts_to_blob(texts)
    iblob, ilen = texts_to_blob(ids)
    name = chunk_name(c)
    tmp = parts / f".{name}.tmp.{os.getpid()}.npz"
    with open(tmp, "wb") as f:
        np.savez(f, emb=emb.astype(dtype), text_blob=tblob, text_len=tlen, id_blob=iblob, id_len=ilen,
                 hashes=np.fromiter((id_hash(i) for i in ids), dtype=np.int64, count=len(ids)),
                 dropped=np.int64(dropped))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, parts / name)


def finish_build(prep: PreparedBuild, config: BuildConfig, *, executor: str = "local") -> CorpusStore | None:
    """After every chunk of this shard is in ``parts/``: write ``shard.json``
    (one shard of many; returns None) or join the chunks into the store
    (returns it) and delete ``parts/`` and ``build.json`` unless
    ``keep_parts``."""
    cfg, out = config, prep.out
    missing = [c for c in prep.mine if not (prep.parts / chunk_name(c)).is_file()]
    if missing:
        raise RuntimeError(f"build of {out}: chunks {missing[:10]} are missing from parts/ after the run")
    if cfg.num_shards > 1:
        write_json_atomic(out / "shard.json", {**prep.state, "n_chunks": len(prep.spans), "chunks": prep.mine})
        return None
    store = _finalize(out, [prep.parts / chunk_name(c) for c in prep.mine], prep.spec,
                      model_dir=prep.state["encoder_model_dir"], shards=1, executor=executor)
    if not cfg.keep_parts:
        shutil.rmtree(prep.parts, ignore_errors=True)
        (out / "build.json").unlink(missing_ok=True)
    return store


def build_corpus(config: BuildConfig, encoder: Any, *, show_progress: bool = True) -> CorpusStore | None:
    """Embed a corpus into a store directory, resuming an unfinished build.

    The input is hashed and scanned once for where each chunk lies
    (:func:`scan_input`); a shard then decodes only its own chunks.

    Parameters
    ----------
    config : BuildConfig
    encoder : EncoderLike
        Its ``describe()`` goes into the manifest and must match on resume.
    show_progress : bool
        tqdm bar (docs/s) on stderr.

    Returns
    -------
    CorpusStore for a one-shard build; None for one shard of many (join the
    shard directories with :func:`merge_shards`).

    Raises
    ------
    ValueError
        ``config.out`` holds a build or store made with other settings
        (the differing settings are listed).
    """
    cfg = config
    prep = prepare_build(cfg, encoder.describe())
    if prep.store is not None:
        return prep.store
    throttle = float(os.environ.get(THROTTLE_ENV, "0") or 0)
    bar = None
    if show_progress:
        from tqdm.auto import tqdm

        bar = tqdm(desc=f"build {prep.out.name}" + (f" [shard {cfg.shard_id}/{cfg.num_shards}]"
                                                     if cfg.num_shards > 1 else ""),
                   total=prep.done_records + sum(prep.spans[c].count for c in prep.todo),
                   initial=prep.done_records, unit="doc", unit_scale=True, file=sys.stderr)
    computed = 0
    t0 = time.perf_counter()
    dim = int(prep.spec["encoder"]["dim"])
    for c in prep.todo:
        ids, texts = read_chunk(cfg.input, cfg.format, prep.spans[c], cfg.id_field, cfg.text_field)
        dropped = 0
        if not cfg.keep_duplicates:  # within the chunk now; across chunks when the store is written
            ids, texts, dropped = first_in_chunk(ids, texts)
        emb = encoder.encode_passages(texts, batch_size=cfg.batch_size)
        write_chunk(prep.parts, c, ids, texts, emb, dim=dim, dtype=cfg.dtype, dropped=dropped)
        computed += len(ids)
        if bar is not None:
            bar.update(len(ids) + dropped)
        if throttle:
            time.sleep(throttle)
    if bar is not None:
        bar.close()
    dt = time.perf_counter() - t0
    logger.info("encoded %d docs in %.1f s (%.1f docs/s), %d reused from an earlier run",
                computed, dt, computed / dt if dt > 0 else 0.0, prep.done_records)
    return finish_build(prep, cfg)


def _clear_build(out: Path) -> bool:
    """Delete what a build or store left in ``out`` (and nothing else);
    returns whether ``out`` held a build or store."""
    found = any((out / name).is_file() for name in ("manifest.json", "build.json", "shard.json"))
    for name in ("manifest.json", "index.json", "build.json", "shard.json", *DATA_FILES):
        (out / name).unlink(missing_ok=True)
    for stale in out.glob(".*.tmp"):
        stale.unlink(missing_ok=True)
    for sub in ("parts", "faiss"):
        if (out / sub).is_dir():
            shutil.rmtree(out / sub)
    if found:
        logger.warning("overwrite: cleared the earlier build in %s", out)
    return found


def merge_shards(shard_dirs: list[str | os.PathLike[str]], out: str | os.PathLike[str]) -> CorpusStore:
    """Join the directories of a sharded build into one store.

    Every shard must come from the same input, encoder and settings, and
    together they must cover every chunk once. The result is identical to
    a one-machine build of the same input. The shard directories are left
    as they are (delete them once the merged store is verified).

    Parameters
    ----------
    shard_dirs : list of directories, one per shard id 0..S-1 (any order)
    out : directory for the merged store

    Returns
    -------
    CorpusStore
    """
    if not shard_dirs:
        raise ValueError("shard_dirs: expected at least one shard directory")
    infos = []
    for d in shard_dirs:
        f = Path(d) / "shard.json"
        if not f.is_file():
            raise ValueError(f"shard_dirs: {d} has no shard.json (not a finished shard; rerun its build command)")
        infos.append(json.loads(f.read_text()))
    spec = infos[0]["spec"]
    for d, info in zip(shard_dirs[1:], infos[1:]):
        diff = _diff(spec, info["spec"])
        if diff:
            raise ValueError(f"shard_dirs: {d} was built with other settings than {shard_dirs[0]}: " + "; ".join(diff))
    n_chunks, S = infos[0]["n_chunks"], spec["num_shards"]
    got = sorted(i["shard_id"] for i in infos)
    if got != list(range(S)):
        raise ValueError(f"shard_dirs: expected shards 0..{S - 1} once each, got shard ids {got}")
    files = {}
    for d, info in zip(shard_dirs, infos):
        for c in info["chunks"]:
            p = Path(d) / "parts" / f"chunk-{c:08d}.npz"
            if not p.is_file():
                raise ValueError(f"shard_dirs: {d} lacks {p.name}")
            files[c] = p
    if sorted(files) != list(range(n_chunks)):
        raise ValueError(f"shard_dirs: chunks {sorted(set(range(n_chunks)) - set(files))} are missing")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    if (out / "manifest.json").exists():
        raise ValueError(f"out: {out} already holds a corpus store")
    return _finalize(out, [files[c] for c in range(n_chunks)], spec,
                     model_dir=infos[0].get("encoder_model_dir"), shards=S)


def _finalize(out: Path, chunk_files: list[Path], spec: dict[str, Any], *, model_dir: str | None,
              shards: int, executor: str = "local") -> CorpusStore:
    """Join chunk files (in order) into the store files, leaving out
    duplicate texts unless the spec keeps them; manifest last."""
    digests, dropped = [], 0
    for p in chunk_files:
        with np.load(p) as z:
            digests.append(text_digests(z["text_blob"], z["text_len"]) if spec.get("dedup") else
                           np.zeros(len(z["text_len"])))
            dropped += int(z["dropped"]) if "dropped" in z.files else 0
    masks, more = keep_mask(digests) if spec.get("dedup") else ([None] * len(chunk_files), 0)
    dropped += more
    counts = [len(d) if m is None else int(m.sum()) for d, m in zip(digests, masks)]
    if spec.get("dedup"):
        total = sum(counts) + dropped
        logger.info("dropped %d exact duplicate passage(s) of %d (the first of each text kept; "
                    "--keep-duplicates / keep_duplicates=True keeps them)", dropped, total)
    n, dim, dtype = int(sum(counts)), int(spec["encoder"]["dim"]), spec["dtype"]
    emb = np.lib.format.open_memmap(out / ".embeddings.npy.tmp", mode="w+", dtype=dtype, shape=(n, dim))
    t_off = np.zeros(n + 1, dtype=np.int64)
    i_off = np.zeros(n + 1, dtype=np.int64)
    hashes = np.zeros(n, dtype=np.int64)
    row = 0
    with open(out / ".texts.bin.tmp", "wb") as tf, open(out / ".ids.bin.tmp", "wb") as idf:
        for p, k, m in zip(chunk_files, counts, masks):
            with np.load(p) as npz:
                z = npz if m is None or m.all() else select_rows(npz, m)
                emb[row:row + k] = z["emb"]
                tf.write(z["text_blob"].tobytes())
                idf.write(z["id_blob"].tobytes())
                t_off[row + 1:row + k + 1] = t_off[row] + np.cumsum(z["text_len"])
                i_off[row + 1:row + k + 1] = i_off[row] + np.cumsum(z["id_len"])
                hashes[row:row + k] = z["hashes"]
            row += k
    emb.flush()
    del emb
    _check_unique_ids(hashes, out / ".ids.bin.tmp", i_off)
    table = build_id_table(hashes)
    for name, arr in (("text_offsets.npy", t_off), ("id_offsets.npy", i_off), ("id_table.npy", table)):
        with open(out / f".{name}.tmp", "wb") as f:
            np.save(f, arr)
    for name in ("embeddings.npy", "texts.bin", "ids.bin", "text_offsets.npy", "id_offsets.npy", "id_table.npy"):
        os.replace(out / f".{name}.tmp", out / name)
    write_json_atomic(out / "index.json", {"format": FLAT_INDEX_FORMAT, "dim": dim, "metric": "ip",
                                           "dtype": dtype, "count": n})
    files = {name: {"bytes": (out / name).stat().st_size, "sha256": sha256_file(out / name)}
             for name in ("embeddings.npy", "texts.bin", "text_offsets.npy", "ids.bin", "id_offsets.npy",
                          "id_table.npy")}
    manifest = {
        "format": FORMAT, "count": n, "dim": dim, "dtype": dtype,
        "encoder": {**spec["encoder"], "model_dir": model_dir},
        "input": spec["input"], "chunk_size": spec["chunk_size"], "shards": shards,
        "build": {k: v for k, v in spec.items()}, "executor": executor, "files": files,
        "duplicates_dropped": dropped if spec.get("dedup") else None,
        "built_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    }
    write_json_atomic(out / "manifest.json", manifest)
    logger.info("wrote corpus store %s: %d passages, dim %d, %s", out, n, dim, dtype)
    return CorpusStore.open(out)


def _check_unique_ids(hashes: np.ndarray, ids_file: Path, offsets: np.ndarray) -> None:
    order = np.argsort(hashes, kind="stable")
    sh = hashes[order]
    same = np.flatnonzero(sh[1:] == sh[:-1])
    if not same.size:
        return
    blob = np.fromfile(ids_file, dtype=np.uint8)

    def id_at(r: int) -> str:
        return bytes(blob[offsets[r]:offsets[r + 1]]).decode("utf-8")

    for j in same:
        a, b = int(order[j]), int(order[j + 1])
        if id_at(a) == id_at(b):
            raise ValueError(f"input: duplicate id {id_at(a)!r} (records {a} and {b}); ids must be unique")


__all__ = ["BuildConfig", "build_corpus", "merge_shards", "iter_records", "infer_format", "ChunkSpan", "scan_input",
           "read_chunk", "PreparedBuild", "prepare_build", "write_chunk", "finish_build", "chunk_name"]
