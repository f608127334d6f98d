"""Durable per-question results: one JSON-lines file per task x pipeline x seed.

Each finished batch is appended and ``fsync``-ed before the next batch
starts, so a kill (Ctrl-C, SIGKILL, power loss) loses at most the batch in
flight, and that batch's LLM calls are already in the sqlite call cache: the
same command resumes without asking the model again. A line cut short by a
kill is dropped when the file is reopened. Several processes may share a
file (two runs of one evaluation into one folder): every append and the
reader's repair of a cut-off line hold an exclusive ``flock`` on the file,
so a reader never mistakes another process's append in progress for a
line cut short (on platforms without ``fcntl`` the repair is skipped: a
cut-off line is ignored, and the next append starts on a new line). The file name carries a hash of
everything that decides the answers (task data, pipeline settings and seed,
the model's weights or served identity -- see
:func:`rcn_fast.eval.run.loading.model_key` --, corpus, KB), so changed
settings or weights never reuse stale answers.

Every record read back goes through the same check as a fresh one (the
``check`` of :class:`Checkpoint`: :meth:`rcn_fast.eval.metrics.Task.check_record`
in an evaluation): a record that fails it -- a damaged line, a metric out
of range or NaN, log-probs that are NaN, all ``-inf`` or fewer than the
question's choices, a gold answer that is no longer the task's -- is left
out (its question is answered again) with one :class:`DamagedRecordWarning`
per file naming the file and the lines; it is never counted. Only the last
record of a question counts (a recomputed answer supersedes a bad one). A
line that is not JSON stays in the file; it is named while its question
(records are written ``id`` first) has no valid record, so once answered
again it is not warned about on every later load (a line whose id cannot
be read is always named).

Records written before issue 54 name the predicted label ``label`` and the
gold index ``answer``: they are read with today's names (``pred_label``,
``gold``; :func:`rcn_fast.eval.metrics.upgrade_record`), so they resume as
they are.

Shards (``--num-shards S --shard-id I``) append to their own files beside
the unsharded one (:mod:`rcn_fast.eval.run.shards`); every checkpoint also
reads the records of its siblings (the unsharded file and every shard file
of the same key), read-only and without repairing them, so a later run
with other shard settings, or none, finds every finished question.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import warnings
from pathlib import Path
from typing import IO, Any, Callable, Iterable, Iterator

from rcn_fast._files import make_dirs, open_write, read_bytes, read_text, refuse_links, write_atomic
from rcn_fast.eval.metrics import upgrade_record

try:
    import fcntl
except ImportError:  # not on this platform (Windows)
    fcntl = None  # type: ignore[assignment]


@contextlib.contextmanager
def _locked(f: IO[bytes]) -> Iterator[bool]:
    """Hold an exclusive flock on open file ``f``; yields whether a lock is held."""
    if fcntl is None:
        yield False
        return
    fcntl.flock(f.fileno(), fcntl.LOCK_EX)
    try:
        yield True
    finally:
        fcntl.flock(f.fileno(), fcntl.LOCK_UN)


class DamagedRecordWarning(UserWarning):
    """Records of a checkpoint file that fail the check of a fresh result
    were left out (their questions are answered again); the message names
    the file, the lines and why."""


def run_key(parts: dict[str, Any]) -> str:
    """sha256 (hex, 16 chars) of a canonical JSON of ``parts``."""
    blob = json.dumps(parts, sort_keys=True, default=str, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _damaged_id(line: str) -> str | None:
    """The question id a line that is not JSON starts with (records are
    written ``{"id": ...`` first), or None when it cannot be read."""
    head = '{"id": '
    if not line.startswith(head):
        return None
    try:
        qid, _ = json.JSONDecoder().raw_decode(line, len(head))
    except (ValueError, RecursionError):
        return None
    return str(qid)


def parse_lines(data: bytes) -> Iterator[tuple[int, Any, str]]:
    """``(line number, record or None when the line is not JSON, line)``
    for each non-empty line of a checkpoint file's bytes; records with the
    former prediction field names mapped (:func:`rcn_fast.eval.metrics.upgrade_record`)."""
    for n, raw in enumerate(data.split(b"\n"), 1):
        line = raw.decode("utf-8", errors="replace")
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except (json.JSONDecodeError, RecursionError):
            yield n, None, line
            continue
        yield n, upgrade_record(rec), line


def read_records(root: Path, path: Path) -> dict[str, dict[str, Any]]:
    """The records of a checkpoint file under ``root``, read only (nothing
    repaired, no lock taken): the last valid JSON record of each question
    id, whole lines only. For readers of a finished run (``show``)."""
    data = read_bytes(root, path, what="checkpoint", links=False)
    out: dict[str, dict[str, Any]] = {}
    for _, rec, _ in parse_lines(data[: data.rfind(b"\n") + 1]):
        if isinstance(rec, dict) and "id" in rec:
            out[str(rec["id"])] = rec
    return out


class Checkpoint:
    """Append-only store of the records of one task x pipeline x seed.

    Parameters
    ----------
    path : Path
        The unsharded ``.jsonl`` file; ``<path>.meta.json`` holds what the
        key hashes.
    meta : dict
        Written once, when the file is first created.
    shard : (shard_id, num_shards), optional
        Append to that shard's own file instead of ``path``.
    check : callable, optional
        ``check(record)`` raises ValueError for a record that is not a
        valid result (the rule of a fresh record); such a record read back
        is left out, with a :class:`DamagedRecordWarning`.
    root : Path, optional
        The output folder the file lies in (default: its folder): every
        read and write opens the file beneath that folder's descriptor
        through :mod:`rcn_fast._files`, following no link, so a symbolic
        link planted between ``root`` and a file (``checkpoints/``, the
        file itself) -- even while the run goes on -- is refused
        (:class:`rcn_fast._files.LinkError`, naming it) instead of followed.
    """

    def __init__(self, path: Path, meta: dict[str, Any], *, shard: tuple[int, int] | None = None,
                 check: Callable[[dict[str, Any]], None] | None = None, root: Path | None = None) -> None:
        from rcn_fast.eval.run.shards import shard_file, sibling_files

        base = Path(path)
        self.root = Path(root) if root is not None else base.parent
        self.base_path = base
        self.path = base if shard is None or shard[1] == 1 else shard_file(base, *shard)
        self.meta_path = base.with_suffix(".meta.json")
        self.meta = meta
        self.check = check
        self.records: dict[str, dict[str, Any]] = {}
        self._lines: dict[str, tuple[Path, int]] = {}  # where each record was read
        self._unreadable: dict[Path, list[tuple[int, str | None]]] = {}  # (line, its question id if readable)
        refuse_links(self.root, base.parent, what="checkpoint")  # named at once (every open refuses it too)
        for other in sibling_files(base, self.root):
            if other != self.path:
                self._load_other(other)
        self._load()
        self._drop_damaged()

    def _load_other(self, path: Path) -> None:
        """Records of a sibling file another process may be appending to:
        whole lines only, nothing repaired."""
        try:
            data = read_bytes(self.root, path, what="checkpoint", links=False)
        except FileNotFoundError:  # removed since it was listed
            return
        self._parse(data[: data.rfind(b"\n") + 1], path)

    def _drop_damaged(self) -> None:
        """Leave out the records ``check`` refuses (one warning per file,
        naming the lines; lines that are not JSON too, unless their
        question has a valid record: it is not answered again)."""
        failed: dict[Path, list[str]] = {}
        for qid in list(self.records) if self.check is not None else ():
            try:
                self.check(self.records[qid])
            except (ValueError, TypeError, KeyError) as exc:
                del self.records[qid]
                path, line = self._lines[qid]
                failed.setdefault(path, []).append(f"line {line} (question {qid!r}): {exc}")
        bad: dict[Path, list[str]] = {}
        unknown: set[Path] = set()  # files with a line whose question cannot be read
        for path, lines in self._unreadable.items():
            for n, qid in lines:
                if qid is None:
                    unknown.add(path)
                    bad.setdefault(path, []).append(f"line {n} (not JSON)")
                elif qid not in self.records:
                    bad.setdefault(path, []).append(f"line {n} (question {qid!r}): not JSON")
        for path, lines in failed.items():
            bad.setdefault(path, []).extend(lines)
        for path, lines in bad.items():
            more = f"; and {len(lines) - 3} more" if len(lines) > 3 else ""
            which = "the questions among them with no other valid record" if path in unknown else "their questions"
            warnings.warn(DamagedRecordWarning(
                f"checkpoint {path}: {len(lines)} record(s) are damaged or fail the check of a fresh result; "
                f"{which} are answered again: {'; '.join(lines[:3])}{more}"), stacklevel=3)

    def _load(self) -> None:
        try:
            f = open_write(self.root, self.path, "r+b", what="checkpoint")
        except (FileNotFoundError, NotADirectoryError):
            return
        except PermissionError:  # a read-only file: read it, repair nothing
            f, data = None, read_bytes(self.root, self.path, what="checkpoint", links=False)
            good = data.rfind(b"\n") + 1
            data = data[:good]
        if f is not None:
            with f, _locked(f) as locked:
                data = self._read_repair(f, locked)
        self._parse(data, self.path)

    @staticmethod
    def _read_repair(f: IO[bytes], locked: bool) -> bytes:
        """The whole lines of ``f``; a cut-off last line is truncated away
        when ``locked`` (an exclusive flock is held)."""
        data = f.read()
        good = data.rfind(b"\n") + 1
        if good < len(data):
            # under the lock no other process is mid-append, so this is a
            # line cut short by a kill: drop it
            if locked:
                f.truncate(good)
                f.flush()
                os.fsync(f.fileno())
            data = data[:good]
        return data

    def _parse(self, data: bytes, path: Path) -> None:
        for n, rec, line in parse_lines(data):
            if rec is None:  # a damaged line: its question is answered again
                self._unreadable.setdefault(path, []).append((n, _damaged_id(line)))
                continue
            if isinstance(rec, dict) and "id" in rec:
                self.records[str(rec["id"])] = rec
                self._lines[str(rec["id"])] = (path, n)

    def done(self) -> set[str]:
        return set(self.records)

    def stored_meta(self) -> dict[str, Any]:
        try:
            meta = json.loads(read_text(self.root, self.meta_path, what="checkpoint", links=False))
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError, UnicodeDecodeError, json.JSONDecodeError):
            return {}
        return meta if isinstance(meta, dict) else {}

    def write_meta(self, extra: dict[str, Any]) -> None:
        make_dirs(self.root, self.path.parent, what="checkpoint")
        meta = {**self.stored_meta(), **self.meta, **extra}
        # a temporary file per process (two runs may share the folder), renamed from the folder's descriptor
        write_atomic(self.root, self.meta_path, json.dumps(meta, indent=1, default=str), what="checkpoint")

    def append(self, records: Iterable[dict[str, Any]]) -> None:
        """Append records and make them durable (flush + fsync)."""
        records = list(records)
        if not records:
            return
        make_dirs(self.root, self.path.parent, what="checkpoint")
        blob = "".join(json.dumps(r, ensure_ascii=False, default=str) + "\n" for r in records)
        with open_write(self.root, self.path, "a+b", what="checkpoint") as f, _locked(f):
            data = blob.encode("utf-8")
            end = f.seek(0, os.SEEK_END)
            if end:
                f.seek(end - 1)
                if f.read(1) != b"\n":  # a cut-off line left in place: start on a new line
                    data = b"\n" + data
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        for r in records:
            self.records[str(r["id"])] = r


__all__ = ["Checkpoint", "DamagedRecordWarning", "run_key", "parse_lines", "read_records"]
