"""The sha256 of a file, read in 4 MiB blocks: one helper for every
checksum the package writes or checks (store files, ONNX exports, GGUF
conversions, saved indexes, corpus inputs)."""

from __future__ import annotations

import hashlib
import os


def sha256_file(path: str | os.PathLike[str]) -> str:
    """Hex sha256 of the file at ``path`` (read in 4 MiB blocks)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()
