"""Evaluation shards: which questions a shard answers, and its file names.

A question belongs to shard ``sha256(question id) mod S``: the split depends
on the id alone, so it is the same for every task, pipeline and seed, does
not depend on the order of the questions, and a rerun with more questions
(a larger ``--limit``) leaves every old question in its shard.

Each shard appends to its own checkpoint file beside the unsharded one
(``seed0-<key>.shard-0002-of-0008.jsonl`` next to ``seed0-<key>.jsonl``), so
shards never write one file (no file locking across machines is needed on a
shared output folder); a run with other shard settings, or none, reads all
of them (see :class:`rcn_fast.eval.checkpoint.Checkpoint`).
"""

from __future__ import annotations

import hashlib
from pathlib import Path


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


__all__ = ["shard_of", "shard_file", "sibling_files"]
