"""Where the size and sha256 of a directory's ``embeddings.npy`` are
recorded: ``index.json`` of a FlatIndex, else the ``manifest.json`` of a
corpus store sharing the directory (read by FlatIndex.load and by the int8
copy, which is tied to the embeddings it was built from). Both are read
through the files door (:mod:`rcn_fast._files`), beneath the directory's
descriptor."""

from __future__ import annotations

import json
from typing import Any

from rcn_fast._files import Root, folder
from rcn_fast._stamped_json import MAX_STAMP_BYTES


def _json(root: Any, name: str) -> Any:
    """The JSON of ``name`` beneath ``root``, None when absent; ValueError when not JSON."""
    try:
        return json.loads(root.read_text(name, limit=MAX_STAMP_BYTES))
    except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
        return None


def embeddings_record(path: Root) -> dict[str, Any] | None:
    """The size/sha256 record of ``path/embeddings.npy``: from ``index.json``,
    else from the manifest of a corpus store in the directory; None when
    neither records it."""
    with folder(path) as root:
        try:
            meta = _json(root, "index.json") or {}
        except ValueError:
            meta = {}
        return file_record(root, meta if isinstance(meta, dict) else {})


def file_record(path: Root, meta: dict[str, Any]) -> dict[str, Any] | None:
    """The size/sha256 record of embeddings.npy: from index.json, or from the
    manifest of a corpus store that shares the directory."""
    files = meta.get("files")
    if isinstance(files, dict) and isinstance(files.get("embeddings.npy"), dict):
        return files["embeddings.npy"]
    with folder(path) as root:
        try:
            rec = (_json(root, "manifest.json") or {})["files"]["embeddings.npy"]
        except (ValueError, KeyError, TypeError):
            return None  # the store's own checks name a broken manifest
    return rec if isinstance(rec, dict) else None
