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
import os
import re
import sys
from pathlib import Path
from typing import Any, Iterable

from rcn_fast._files import make_dirs, no_links, write_text

_ASSIGNED = re.compile(r"\.shard-(\d+)-of-(\d+)\.assigned\.json$")


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


def sibling_files(base: Path) -> list[Path]:
    """``base`` and every shard file beside it (any shard count), sorted."""
    found = [base] if base.is_file() else []
    found += sorted(p for p in base.parent.glob(f"{base.stem}.shard-*-of-*{base.suffix}") if p.is_file())
    return found


def assignment_file(base: Path, shard_id: int, num_shards: int) -> Path:
    """The file listing the question ids shard ``shard_id`` was given."""
    return base.with_name(f"{base.stem}.shard-{shard_id:04d}-of-{num_shards:04d}.assigned.json")


def _read_ids(path: Path) -> set[str]:
    try:
        data = json.loads(no_links(path.parent, path, what="checkpoint").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return set()
    return {str(i) for i in data.get("ids", [])} if isinstance(data, dict) else set()


def record_assignment(base: Path, shard_id: int, num_shards: int, ids: Iterable[str]) -> None:
    """Add ``ids`` to the questions shard ``shard_id`` of ``num_shards`` was
    given (written atomically; the union over the shard's runs)."""
    path = assignment_file(base, shard_id, num_shards)
    ids = _read_ids(path) | {str(i) for i in ids}
    root = base.parent  # its checkpoint's folder (checked by the Checkpoint for links above it)
    make_dirs(root, path.parent, what="checkpoint")
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    write_text(root, tmp, json.dumps({"shard_id": shard_id, "num_shards": num_shards, "ids": sorted(ids)}),
               what="checkpoint")
    os.replace(tmp, no_links(root, path, what="checkpoint"))


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
    for f in sorted(base.parent.glob(f"{base.stem}.shard-*-of-*.assigned.json")):
        m = _ASSIGNED.search(f.name)
        if m is None or not f.name.startswith(base.stem + "."):
            continue
        sid, n = int(m.group(1)), int(m.group(2))
        ran.setdefault(n, set()).add(sid)
        missing = len(_read_ids(f) & pending)
        if missing:
            gaps.append({"shard_id": sid, "num_shards": n, "missing": missing, "file": shard_file(base, sid, n),
                         "ran": True})
    for n, sids in ran.items():
        for sid in sorted(set(range(n)) - sids):
            missing = sum(1 for q in pending if shard_of(q, n) == sid)
            if missing:
                gaps.append({"shard_id": sid, "num_shards": n, "missing": missing, "file": shard_file(base, sid, n),
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
    from rcn_fast.eval.config import EvalError

    units = list(units)
    if cfg.shard_id is not None:
        if cfg.num_shards > 1:
            for u in units:
                record_assignment(u.checkpoint.base_path, cfg.shard_id, cfg.num_shards, (q.id for q in u.questions))
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
           "merge_guard"]
