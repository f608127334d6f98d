"""Evaluation shards: which questions a shard answers, and its file names.

A question belongs to shard ``sha256(question id) mod S``: the split depends
on the id alone, so it is the same for every task, pipeline and seed, does
not depend on the order of the questions, and a rerun with more questions
(a larger ``--limit``) leaves every old question in its shard.

Each shard appends to its own checkpoint file beside the unsharded one
(``seed0-<key>.shard-0002-of-0008.jsonl`` next to ``seed0-<key>.jsonl``), so
shards never write one file (no file locking across machines is needed on a
shared output folder); a run with other shard settings, or none, reads all
of them (see :class:`rcn_fast.eval.run.checkpoint.Checkpoint`).

A shard run also records the ids it was given
(``seed0-<key>.shard-0002-of-0008.assigned.json``), so the merging run can
tell a shard that stopped short (its questions are refused, naming the
shard, unless ``merge_fill_missing``: a merge makes no model call) from
questions no shard was given (a larger ``--limit``: answered as in any
run); a shard that never ran is one with no such file beside its siblings.
"""

from __future__ import annotations

import hashlib
import json
import re
import sys
import warnings
from collections import Counter
from pathlib import Path
from typing import Any, Iterable

from rcn_fast._files import Root, listdir, make_dirs, read_text, write_atomic
from rcn_fast.eval.config import MAX_SHARDS, EvalError

#: bytes a shard's assignment file may hold (ids of its questions)
MAX_ASSIGNMENT_BYTES = 64 << 20
_ASSIGNED = re.compile(r"\.shard-(\d{1,9})-of-(\d{1,9})\.assigned\.json$")
_SHARD_FILE = re.compile(r"\.shard-\d{1,9}-of-\d{1,9}")


class ShardFileWarning(UserWarning):
    """A file beside a checkpoint that names a shard rcn_fast would never
    write (a count past :data:`MAX_SHARDS`, a shard id past its count, a
    file too large): left out, with its name."""


def shard_of(question_id: str, num_shards: int) -> int:
    """The shard (``0 <= shard < num_shards``) that answers ``question_id``.

    >>> shard_of("q1", 1)
    0
    >>> 0 <= shard_of("csqa-dev-17", 8) < 8
    True
    """
    if num_shards == 1:
        return 0
    digest = hashlib.sha256(str(question_id).encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") % num_shards


def shard_file(base: Path, shard_id: int, num_shards: int) -> Path:
    """The checkpoint file of one shard, beside the unsharded ``base``."""
    return base.with_name(f"{base.stem}.shard-{shard_id:04d}-of-{num_shards:04d}{base.suffix}")


def sibling_files(base: Path, root: Root | None = None) -> list[Path]:
    """``base`` and every shard file beside it (any shard count), sorted:
    the names listed from the descriptor of their folder beneath ``root``
    (default: that folder), through the files door (each is opened through
    it again)."""
    try:
        names = listdir(base.parent if root is None else root, "" if root is None else base.parent,
                        what="checkpoint")
    except (FileNotFoundError, NotADirectoryError):
        return []
    found = [base] if base.name in names else []
    head = base.stem + ".shard-"
    found += [base.with_name(n) for n in names if n.startswith(head) and n.endswith(base.suffix)
              and _SHARD_FILE.fullmatch(n[len(base.stem):len(n) - len(base.suffix)])]
    return found


def assignment_file(base: Path, shard_id: int, num_shards: int) -> Path:
    """The file listing the question ids shard ``shard_id`` was given."""
    return base.with_name(f"{base.stem}.shard-{shard_id:04d}-of-{num_shards:04d}.assigned.json")


def _read_ids(path: Path) -> set[str]:
    """The ids an assignment file lists (read through the files door, at
    most :data:`MAX_ASSIGNMENT_BYTES`); empty when unreadable or absent."""
    try:
        data = json.loads(read_text(path.parent, path.name, what="checkpoint", limit=MAX_ASSIGNMENT_BYTES,
                                    links=False))
    except (OSError, ValueError):
        return set()
    ids = data.get("ids", []) if isinstance(data, dict) else []
    return {str(i) for i in ids} if isinstance(ids, list) else set()


def record_assignment(base: Path, shard_id: int, num_shards: int, ids: Iterable[str], *,
                      root: Root | None = None) -> None:
    """Add ``ids`` to the questions shard ``shard_id`` of ``num_shards`` was
    given (written atomically beneath ``root``, the output folder --
    default the checkpoint's folder --, following no link; the union over
    the shard's runs)."""
    path = assignment_file(base, shard_id, num_shards)
    ids = _read_ids(path) | {str(i) for i in ids}
    root = base.parent if root is None else root
    make_dirs(root, path.parent, what="checkpoint")
    write_atomic(root, path, json.dumps({"shard_id": shard_id, "num_shards": num_shards, "ids": sorted(ids)}),
                 what="checkpoint")


def shard_gaps(base: Path, pending: Iterable[str]) -> list[dict[str, Any]]:
    """Questions of a merging run that a shard was given and did not answer.

    Returns one entry per such shard: ``shard_id``, ``num_shards``,
    ``missing`` (a count), ``file`` (its checkpoint file) and ``ran``
    (False: a shard of a count seen beside ``base`` that never ran).
    """
    pending = {str(i) for i in pending}
    if not pending:
        return []
    gaps: list[dict[str, Any]] = []
    ran: dict[int, set[int]] = {}
    try:
        names = listdir(base.parent, what="checkpoint")
    except (FileNotFoundError, NotADirectoryError):
        return []
    for name in names:
        m = _ASSIGNED.search(name)
        if m is None or name != base.stem + m.group(0):
            continue
        sid, n = int(m.group(1)), int(m.group(2))
        if not 1 <= n <= MAX_SHARDS or sid >= n:  # no run writes it: a planted name costs nothing (issue 53, N9)
            warnings.warn(ShardFileWarning(
                f"checkpoint {base.parent / name}: names shard {sid} of {n}, which no run writes (at most "
                f"{MAX_SHARDS:,} shards, ids below the count); left out"), stacklevel=2)
            continue
        ran.setdefault(n, set()).add(sid)
        missing = len(_read_ids(base.parent / name) & pending)
        if missing:
            gaps.append({"shard_id": sid, "num_shards": n, "missing": missing, "file": shard_file(base, sid, n),
                         "ran": True})
    for n, sids in ran.items():
        per_shard = Counter(shard_of(q, n) for q in pending)  # one pass per shard count, not one per shard
        for sid in sorted(set(per_shard) - sids):
            gaps.append({"shard_id": sid, "num_shards": n, "missing": per_shard[sid], "file": shard_file(base, sid, n),
                         "ran": False})
    return gaps


def merge_guard(cfg: Any, units: Iterable[Any]) -> None:
    """Before a run: a shard run records the ids each unit gave it; a
    merging run (no shard settings) refuses to answer questions a shard was
    given but did not finish unless ``cfg.merge_fill_missing``, naming the
    shard and the count (with it: one log line per such shard).

    Raises
    ------
    rcn_fast.eval.config.EvalError
        A merge over an incomplete shard, without ``merge_fill_missing``.
    """
    units = list(units)
    if cfg.shard_id is not None:
        if cfg.num_shards > 1:
            for u in units:
                record_assignment(u.checkpoint.base_path, cfg.shard_id, cfg.num_shards, (q.id for q in u.questions),
                                  root=u.checkpoint.root)
        return
    problems = []
    for u in units:
        for g in shard_gaps(u.checkpoint.base_path, (q.id for q in u.pending)):
            what = "did not finish" if g["ran"] else "never ran; it was given"
            problems.append(f"{u.task.name} | {u.pipeline} | seed {u.seed}: shard {g['shard_id']} of {g['num_shards']} "
                            f"({g['file'].name}) {what} {g['missing']} question(s)")
    if not problems:
        return
    if cfg.merge_fill_missing:
        for p in problems:
            print(f"rcn_fast.eval: merge: answering here what {p}", file=sys.stderr, flush=True)
        return
    raise EvalError("merge: the shards are incomplete (a merge makes no model call):\n  " + "\n  ".join(problems)
                    + "\nrun those shards again (the same command with --num-shards N --shard-id I), or pass "
                    "--merge-fill-missing to answer their questions in this run")


__all__ = ["shard_of", "shard_file", "sibling_files", "assignment_file", "record_assignment", "shard_gaps",
           "merge_guard", "ShardFileWarning", "MAX_SHARDS", "MAX_ASSIGNMENT_BYTES"]
