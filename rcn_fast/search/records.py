"""Where the size and sha256 of a directory's ``embeddings.npy`` are
recorded: ``index.json`` of a FlatIndex, else the ``manifest.json`` of a
corpus store sharing the directory (read by FlatIndex.load and by the int8
copy, which is tied to the embeddings it was built from)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rcn_fast._files import inside


def embeddings_record(path: Path) -> dict[str, Any] | None:
    """The size/sha256 record of ``path/embeddings.npy``: from ``index.json``,
    else from the manifest of a corpus store in the directory; None when
    neither records it."""
    head = inside(Path(path), "index.json")
    try:
        meta = json.loads(head.read_text()) if head.is_file() else {}
    except ValueError:
        meta = {}
    return file_record(Path(path), meta if isinstance(meta, dict) else {})


def file_record(path: Path, meta: dict[str, Any]) -> dict[str, Any] | None:
    """The size/sha256 record of embeddings.npy: from index.json, or from the
    manifest of a corpus store that shares the directory."""
    files = meta.get("files")
    if isinstance(files, dict) and isinstance(files.get("embeddings.npy"), dict):
        return files["embeddings.npy"]
    manifest = inside(path, "manifest.json")
    if manifest.is_file():
        try:
            rec = json.loads(manifest.read_text(encoding="utf-8"))["files"]["embeddings.npy"]
        except (ValueError, KeyError, TypeError):
            return None  # the store's own checks name a broken manifest
        return rec if isinstance(rec, dict) else None
    return None
