"""Reading the small JSON file that stamps a saved directory with its format
(``index.json`` of a FlatIndex, ``manifest.json`` of a corpus store,
``rcn_fast_bm25.json`` of a BM25 index, ``graph.json`` of a knowledge
graph, ``db.json`` of a SEPTA subgraph database, ``septa.json`` of a SEPTA
directory, ``int8.json`` of an int8 copy): one set of checks and messages
for all of them; and writing one in place atomically.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from rcn_fast._files import Root, read_text, write_atomic

#: bytes a stamp file may hold (a store's manifest is a few KB): past it, refused before it is parsed
MAX_STAMP_BYTES = 16 << 20
#: a format name as rcn_fast writes them (``rcn_fast.CorpusStore/1``): only such a value is echoed in a message
_FORMAT_NAME = re.compile(r"[\w.+-]{1,64}(/\d{1,4})?")


def write_stamped_json(file: Path, obj: dict[str, Any], *, root: Root | None = None) -> None:
    """``obj`` as indented JSON in ``file``, written to a temporary name,
    flushed to disk and renamed into place (a reader sees the old file or
    the whole new one), all from the descriptor of ``root`` (default: the
    file's folder): never through a link planted there
    (:func:`rcn_fast._files.write_atomic`)."""
    file = Path(file)
    write_atomic(file.parent if root is None else root, file.name if root is None else file,
                 json.dumps(obj, indent=2) + "\n")


def read_stamped_json(file: Path, expected_format: str, *, what: str, fix: str = "",
                      arg: str = "path", root: Root | None = None) -> dict[str, Any]:
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
    root : Root, optional
        The folder ``file`` is read beneath (default: its own folder),
        through the files door (:mod:`rcn_fast._files`): a link leading out
        is a ``LinkError``, a file over :data:`MAX_STAMP_BYTES` a
        ValueError. No message echoes what the file holds (only a format
        name spelled as rcn_fast spells them).

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
    file = Path(file)
    try:
        text = read_text(file.parent if root is None else root, file.name if root is None else file, what=arg,
                         limit=MAX_STAMP_BYTES)
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
    got = meta.get("format")
    if got != expected_format:
        said = f"format {got!r}" if got is None or isinstance(got, str) and _FORMAT_NAME.fullmatch(got) else \
            "another format"
        raise ValueError(f"{arg}: {file.parent} holds {said}, expected {expected_format!r}")
    return meta


__all__ = ["read_stamped_json", "write_stamped_json", "MAX_STAMP_BYTES"]
