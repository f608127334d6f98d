"""Reading the small JSON file that stamps a saved directory with its format
(``index.json`` of a FlatIndex, ``manifest.json`` of a corpus store,
``rcn_fast_bm25.json`` of a BM25 index, ``graph.json`` of a knowledge
graph, ``db.json`` of a SEPTA subgraph database, ``septa.json`` of a SEPTA
directory, ``int8.json`` of an int8 copy): one set of checks and messages
for all of them; and writing one in place atomically.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from rcn_fast._files import open_write


def write_stamped_json(file: Path, obj: dict[str, Any]) -> None:
    """``obj`` as indented JSON in ``file``, written to a temporary name,
    flushed to disk and renamed into place (a reader sees the old file or
    the whole new one)."""
    file = Path(file)
    tmp = f".{file.name}.{os.getpid()}.tmp"
    with open_write(file.parent, tmp, "w") as f:  # never through a link planted in the folder
        f.write(json.dumps(obj, indent=2) + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(file.parent / tmp, file)


def read_stamped_json(file: Path, expected_format: str, *, what: str, fix: str = "",
                      arg: str = "path") -> dict[str, Any]:
    """The parsed JSON object in ``file``, checked to carry ``"format":
    expected_format``.

    Parameters
    ----------
    file : Path
        The stamp file inside the saved directory (``file.parent``).
    expected_format : str
        The ``"format"`` value this reader understands.
    what : str
        What the directory is, for the missing-file message ("a FlatIndex
        directory").
    fix : str
        Appended to the invalid-JSON message ("; restore it or save the
        index again").
    arg : str
        The argument the messages name.

    Returns
    -------
    dict

    Raises
    ------
    FileNotFoundError
        ``file`` does not exist: "<arg>: <dir> has no <name> (not <what>)".
    ValueError
        ``file`` is a directory, is not UTF-8 JSON, holds no JSON object, or
        holds another format; the message names the file (the directory for
        the format).
    """
    try:
        text = file.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise FileNotFoundError(f"{arg}: {file.parent} has no {file.name} (not {what})") from None
    except IsADirectoryError:
        raise ValueError(f"{arg}: {file} is a directory, expected a JSON file") from None
    except UnicodeDecodeError as exc:
        raise ValueError(f"{arg}: {file} is not valid JSON ({exc}){fix}") from None
    try:
        meta = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{arg}: {file} is not valid JSON ({exc}){fix}") from None
    if not isinstance(meta, dict):
        raise ValueError(f"{arg}: {file} holds a JSON {type(meta).__name__}, expected an object")
    if meta.get("format") != expected_format:
        raise ValueError(f"{arg}: {file.parent} holds format {meta.get('format')!r}, expected {expected_format!r}")
    return meta


__all__ = ["read_stamped_json"]
