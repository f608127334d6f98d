"""Durable per-question results: one JSON-lines file per task x pipeline x seed.

Each finished batch is appended and ``fsync``-ed before the next batch
starts, so a kill (Ctrl-C, SIGKILL, power loss) loses at most the batch in
flight, and that batch's LLM calls are already in the sqlite call cache: the
same command resumes without asking the model again. A line cut short by a
kill is dropped when the file is reopened. The file name carries a hash of
everything that decides the answers (task data, pipeline settings and seed,
model, corpus, KB), so changed settings never reuse stale answers.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any, Iterable


def run_key(parts: dict[str, Any]) -> str:
    """sha256 (hex, 16 chars) of a canonical JSON of ``parts``."""
    blob = json.dumps(parts, sort_keys=True, default=str, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


class Checkpoint:
    """Append-only store of the records of one task x pipeline x seed.

    Parameters
    ----------
    path : Path
        The ``.jsonl`` file; ``<path>.meta.json`` holds what the key hashes.
    meta : dict
        Written once, when the file is first created.
    """

    def __init__(self, path: Path, meta: dict[str, Any]) -> None:
        self.path = Path(path)
        self.meta_path = self.path.with_suffix(".meta.json")
        self.meta = meta
        self.records: dict[str, dict[str, Any]] = {}
        self._load()

    def _load(self) -> None:
        if not self.path.is_file():
            return
        data = self.path.read_bytes()
        good = data.rfind(b"\n") + 1
        if good < len(data):  # a line cut short by a kill: drop it
            with open(self.path, "r+b") as f:
                f.truncate(good)
                f.flush()
                os.fsync(f.fileno())
            data = data[:good]
        for line in data.decode("utf-8").splitlines():
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(rec, dict) and "id" in rec:
                self.records[str(rec["id"])] = rec

    def done(self) -> set[str]:
        return set(self.records)

    def stored_meta(self) -> dict[str, Any]:
        if self.meta_path.is_file():
            try:
                return json.loads(self.meta_path.read_text())
            except json.JSONDecodeError:
                return {}
        return {}

    def write_meta(self, extra: dict[str, Any]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        meta = {**self.stored_meta(), **self.meta, **extra}
        tmp = self.meta_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(meta, indent=1, default=str))
        os.replace(tmp, self.meta_path)

    def append(self, records: Iterable[dict[str, Any]]) -> None:
        """Append records and make them durable (flush + fsync)."""
        records = list(records)
        if not records:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        blob = "".join(json.dumps(r, ensure_ascii=False, default=str) + "\n" for r in records)
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(blob)
            f.flush()
            os.fsync(f.fileno())
        for r in records:
            self.records[str(r["id"])] = r


__all__ = ["Checkpoint", "run_key"]
