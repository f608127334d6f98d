"""A task's plain data: :class:`TaskSpec` (what one evaluation task is,
recorded in every results file), its errors and warnings, and the keys
derived from it (:func:`spec_key`, :func:`task_corpus`). The registry that
reads task YAMLs is :mod:`rcn_fast.eval.tasks.catalog`; reading the questions is
:mod:`rcn_fast.eval.tasks.loading`; scoring them is :mod:`rcn_fast.eval.metrics`.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

#: rcn_fast/eval/: packaged tasks write their ``local`` and ``corpus`` paths relative to it.
PACKAGE_DIR = Path(__file__).resolve().parents[1]
#: The packaged task YAMLs (beside this module).
TASKS_DIR = Path(__file__).resolve().parent
#: Task kind -> its metric names, main one first (scored by the kind's task class,
#: :data:`rcn_fast.eval.metrics.TASK_TYPES`).
METRICS: dict[str, tuple[str, ...]] = {"multiple_choice": ("acc",), "yes_no": ("acc",),
                                       "open": ("string_em", "exact_match")}
KINDS = tuple(METRICS)
#: Bytes a task YAML may hold (lm-eval's largest are a few KB).
MAX_TASK_FILE_BYTES = 4 << 20
#: The hub branch holding the parquet conversion of every dataset repository.
PARQUET_REVISION = "refs/convert/parquet"


class TaskError(ValueError):
    """A task that cannot be resolved or read (the message says why)."""


class TaskCountWarning(UserWarning):
    """A task's split loaded with another number of questions than the
    paper's set (the task's ``expected_count``)."""


@dataclass
class TaskSpec:
    """One evaluation task (plain data, recorded in every results file).

    Attributes
    ----------
    name : str
    kind : {"multiple_choice", "yes_no", "open"}
    group : str
    dataset, config, split, revision : Hugging Face source (``dataset`` may
        also be a local folder: see :func:`resolve_task`).
    url, sha256 : str or None
        A file pinned by content (used instead of ``dataset``).
    size : int or None
        The pinned file's size in bytes (optional; the download stops past it).
    local : str or None
        A local question file (used instead of ``dataset``).
    fields : dict or None
        How to read a dataset row: :class:`rcn_fast.data.FieldMap` fields
        (multiple choice), ``{id, question, answer}`` (yes/no) or
        :class:`rcn_fast.data.OpenFieldMap` fields (open).
    question_template, choices_in_question, shuffle_choices, dataset_kwargs :
        see the module docstring.
    expected_count : int or None
        Questions in ``split`` (the paper's set); None when unknown or when
        another split was chosen.
    paper_table : str
        Which table of which paper the task belongs to.
    corpus : str or None
        Default knowledge corpus of the task (a file or a store folder).
    pipeline_args : dict
        ``{pipeline: {setting: value}}`` defaults (user settings win).
    lm_eval : dict or None
        ``doc_to_text``/``doc_to_choice``/``doc_to_target`` of a task read
        from lm-evaluation-harness's format (:mod:`rcn_fast.eval.tasks.lm_eval`).
    source : str
        The file the spec was read from (or ``"<path>"``).
    """

    name: str
    kind: str = "multiple_choice"
    group: str = "custom"
    dataset: str | None = None
    config: str | None = None
    split: str | None = None
    revision: str | None = None
    url: str | None = None
    sha256: str | None = None
    size: int | None = None
    local: str | None = None
    fields: dict[str, Any] | None = None
    question_template: str | None = None
    choices_in_question: bool = False
    shuffle_choices: bool = False
    dataset_kwargs: dict[str, Any] = field(default_factory=dict)
    expected_count: int | None = None
    paper_table: str = ""
    corpus: str | None = None
    pipeline_args: dict[str, dict[str, Any]] = field(default_factory=dict)
    description: str = ""
    lm_eval: dict[str, Any] | None = None
    source: str = ""

    @property
    def metrics(self) -> tuple[str, ...]:
        """Metric names: ``("acc",)`` for choice tasks, StringEM and exact
        match for open-domain ones (:data:`METRICS`)."""
        return METRICS[self.kind]

    @property
    def main_metric(self) -> str:
        return self.metrics[0]

    @property
    def where(self) -> str:
        """The data source in words: ``hf:ID[/config]@revision``, ``url:URL``
        or the local path."""
        if self.url:
            return f"url:{self.url}"
        if self.local:
            return self.local
        if self.dataset and Path(self.dataset).is_dir():
            return self.dataset
        src = f"hf:{self.dataset}" + (f"/{self.config}" if self.config else "")
        return src + (f"@{self.revision}" if self.revision else "")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# --------------------------------------------------------------- registry
def normalize_name(name: str) -> str:
    """A task name as the registry keys it: lower case, ``_`` read as ``-``
    (``ARC_Easy`` -> ``arc-easy``)."""
    return name.strip().lower().replace("_", "-")



def package_path(path: str) -> Path:
    """A task's ``local`` path: absolute (a user's task file made it so, a
    file given on the command line was resolved), or relative to the
    package (a packaged task's). ``~`` is not expanded: a task file's data
    lies in its own folder."""
    p = Path(path)
    return p if p.is_absolute() else PACKAGE_DIR / p


def task_corpus(spec: TaskSpec) -> str | None:
    """The task's default corpus as an absolute path (None when it has none)."""
    return None if spec.corpus is None else str(package_path(spec.corpus))



def _data_file_values(v: Any) -> list[Any]:
    """The leaves of a ``data_files`` value (a path, a list, a ``{split: ...}`` mapping of them)."""
    if isinstance(v, dict):
        return [x for y in v.values() for x in _data_file_values(y)]
    if isinstance(v, (list, tuple)):
        return [x for y in v for x in _data_file_values(y)]
    return [v]


def own_data_files(folder: Path, value: Any, where: str) -> Any:
    """A task file's ``dataset_kwargs.data_files`` (a path, a glob, a list or
    a ``{split: ...}`` mapping of them), each checked to lie in the task
    file's own ``folder`` and made absolute there, globs expanded there by
    a bounded walk of the files door (links not followed into; a link out
    of the folder refused): the same structure, paths of existing files.

    Raises
    ------
    TaskError
        A path starting with ``~``, an absolute path outside ``folder``, a
        ``..`` climbing out of it, a URL, a value that is not a string, a
        file that does not exist or a glob that matches none; the message
        names the field (``where``) and what is allowed.
        (:class:`rcn_fast._files.LinkError`: a link leading out of the folder.)
    """
    from rcn_fast._files import Folder, MAX_WALK_ENTRIES, WalkLimitError

    field_ = f"{where}: dataset_kwargs.data_files"
    allowed = (f"a task file's data_files must lie in its own folder ({folder}): paths relative to it (globs match "
               "inside it), without ~, .. above it or absolute paths out of it")

    def one(v: Any, f: Folder) -> Any:
        if not isinstance(v, str) or not v:
            raise TaskError(f"{field_}: expected a path (a string), got {type(v).__name__}; {allowed}")
        why = None
        if v.startswith("~"):
            why = "starts with ~ (a home folder)"
        elif "://" in v or v.startswith(("hf:", "s3:", "gs:")):
            why = "is a URL"
        else:
            try:
                rel = f.rel(v) if os.path.isabs(v) else v
            except ValueError:
                rel, why = "", "is an absolute path outside the task file's folder"
            if why is None and (".." in rel.split("/") or os.path.isabs(rel)):
                why = "climbs out of the task file's folder with .."
        if why is not None:
            raise TaskError(f"{field_}: {v!r} {why}; {allowed}")
        try:
            if any(c in rel for c in "*?["):
                found = f.glob(rel, limit=MAX_WALK_ENTRIES)
                if not found:
                    raise TaskError(f"{field_}: {v!r} matches no file in {folder}; {allowed}")
                for m in found:
                    f.stat(m)  # a link matched is followed only inside the folder
                return [str(f.path / m) for m in found]
            if not f.is_file(rel):
                raise TaskError(f"{field_}: {v!r} is not a file in {folder}; {allowed}")
        except WalkLimitError as exc:
            raise TaskError(f"{field_}: {v!r}: {exc}") from None
        return str(f.path / rel)

    def convert(v: Any, f: Folder) -> Any:
        if isinstance(v, dict):
            return {k: convert(x, f) for k, x in v.items()}
        if isinstance(v, (list, tuple)):
            out: list[Any] = []
            for x in v:
                got = convert(x, f)
                out.extend(got if isinstance(got, list) and not isinstance(x, (list, tuple, dict)) else [got])
            return out
        return one(v, f)

    with Folder(folder, what=field_) as f:
        return convert(value, f)


def own_file(folder: Path, value: str, where: str) -> str:
    """A data path a task file in ``folder`` writes (``local``, lm-eval's
    ``dataset_path``), checked to lie in that folder and made absolute
    there; a link in it is followed only inside the folder (checked through
    the files door; the path need not exist yet: its reader says so).

    Raises
    ------
    TaskError
        ``~``, an absolute path outside ``folder``, ``..`` above it (the
        message names ``where`` and what is allowed).
    rcn_fast._files.LinkError
        A link on the way leads out of the folder.
    """
    from rcn_fast._files import Folder

    allowed = (f"a task file's data must lie in its own folder ({folder}): a path relative to it, without ~, "
               ".. above it or an absolute path out of it")
    with Folder(folder, what=where) as f:
        if value.startswith("~"):
            raise TaskError(f"{where}: {value!r} starts with ~ (a home folder); {allowed}")
        try:
            rel = f.rel(value) if os.path.isabs(value) else value
        except ValueError:
            raise TaskError(f"{where}: {value!r} is an absolute path outside the task file's folder; {allowed}") \
                from None
        norm = os.path.normpath(rel) if rel else "."
        if norm == ".." or norm.startswith("../"):
            raise TaskError(f"{where}: {value!r} climbs out of the task file's folder with ..; {allowed}")
        f.exists(rel)  # a link leading out of the folder: LinkError naming it
        return str(f.path / norm) if norm != "." else str(f.path)


def written_path(path: Path, key: str, value: str) -> str:
    """A path the task file ``path`` writes where any folder may be named
    (``include``, ``corpus``: the author's choice), absolute (relative to
    the file's folder); a link on the way inside that folder is followed
    only within it (checked through the files door: a
    :class:`rcn_fast._files.LinkError` names one leading out)."""
    from rcn_fast._files import Folder

    full = os.path.normpath(os.path.join(path.parent, value))
    if full.startswith(str(path.parent).rstrip(os.sep) + os.sep):
        with Folder(path.parent, what=f"task file {path}: {key}") as f:
            f.exists(full)
    return full


def local_data_files(spec: TaskSpec) -> list[Path]:
    """The local files a task's ``dataset_kwargs.data_files`` name (a path,
    a glob, a list or a ``{split: ...}`` mapping of them), sorted. A task
    file's were checked and made absolute as it was read
    (:func:`own_data_files`); a spec built in code may hold paths relative
    to the working folder and globs, expanded by a bounded walk of the
    files door (never ``~``, never following links into folders)."""
    from rcn_fast._files import glob as door_glob

    found: set[Path] = set()
    for v in _data_file_values((spec.dataset_kwargs or {}).get("data_files")):
        if not isinstance(v, str) or not v or "://" in v or v.startswith("~"):
            continue
        parts = v.split("/")
        if any(c in v for c in "*?["):
            fixed = next((i for i, p in enumerate(parts) if any(c in p for c in "*?[")), len(parts))
            base = "/".join(parts[:fixed]) or ("/" if v.startswith("/") else ".")
            if ".." in parts[fixed:] or not os.path.isdir(base):
                continue
            found.update(Path(os.path.abspath(os.path.join(base, m))) for m in
                         door_glob(base, "/".join(parts[fixed:]), what="dataset_kwargs.data_files"))
        elif os.path.isfile(v):
            found.add(Path(os.path.abspath(v)))
    return sorted(found)


def task_root(spec: TaskSpec, path: str | os.PathLike[str]) -> Path | None:
    """The folder a task's file ``path`` is read beneath (through the files
    door): for a task read from a YAML file, that file's folder when
    ``path`` lies in it (the package for a packaged task), else the file's
    own folder (an included file's data); None for a file the user names
    (``--tasks FILE``, ``NAME=PATH``: opened as named)."""
    src = spec.source or ""
    if not src.endswith((".yaml", ".yml")):
        return None
    folder = Path(src).parent
    folder = PACKAGE_DIR if folder == TASKS_DIR else folder
    p = os.path.abspath(os.fspath(path))
    if p.startswith(str(folder).rstrip(os.sep) + os.sep):
        return folder
    return Path(p).parent


def local_dataset_folder(spec: TaskSpec) -> Path | None:
    """The local folder a task's ``dataset`` names (a JSON-lines split
    folder, a ``save_to_disk`` folder, a copy of a hub repository); None for
    a hub id, or when the task reads a ``url`` or ``local`` file instead."""
    if not spec.dataset or spec.url or spec.local:
        return None
    p = Path(str(spec.dataset))  # a folder named on the command line was resolved there; ~ is never expanded
    return p if p.is_dir() else None


def spec_key(spec: TaskSpec) -> str:
    """A short hash of what decides a task's questions (checkpoints key on it).

    It covers the spec's fields and the content of every local file the
    task reads: a ``local`` file (its sha256) or folder, and a ``dataset``
    that is a local folder (a JSON-lines split folder, a ``save_to_disk``
    folder, a copy of a hub repository) or local ``data_files`` in
    ``dataset_kwargs`` (:func:`local_data_files`), by
    :func:`rcn_fast._hashing.content_fingerprint` -- sizes and mtimes first,
    hashes only of files that changed. Hub datasets are keyed by id, config
    and ``revision``; ``url`` files by their pinned ``sha256``.
    """
    from rcn_fast._hashing import content_fingerprint

    d = {k: v for k, v in spec.to_dict().items() if k not in ("description", "source", "group", "corpus",
                                                             "pipeline_args", "expected_count", "paper_table")}
    for k in ("revision", "url", "sha256", "lm_eval"):  # keys of tasks without them stay what they were
        if d.get(k) is None:
            d.pop(k, None)
    d.pop("url", None)  # the checksum pins the content wherever it is served
    d.pop("size", None)  # and its size with it: adding size: keeps the checkpoints
    if spec.local:
        p = package_path(spec.local)
        root = task_root(spec, p)  # a task file's data: beneath its folder, through the files door
        d["local_sha"] = content_fingerprint(p, root=root) if p.exists() else None  # a file's: its sha256, as before
    folder = local_dataset_folder(spec)
    if folder is not None:
        d["data_sha"] = content_fingerprint(folder)  # a local folder's files (a bounded walk, no link followed)
    files = local_data_files(spec)
    if files:  # dataset_kwargs' local data_files (``dataset: json``)
        d["data_files_sha"] = {str(f): content_fingerprint(f, root=task_root(spec, f)) for f in files}
    return hashlib.sha256(json.dumps(d, sort_keys=True, default=str).encode()).hexdigest()[:16]



__all__ = ["TaskSpec", "TaskError", "TaskCountWarning", "normalize_name", "package_path", "task_corpus", "spec_key",
           "local_data_files", "own_data_files", "own_file", "written_path", "task_root", "local_dataset_folder", "KINDS", "METRICS", "PACKAGE_DIR", "TASKS_DIR",
           "PARQUET_REVISION"]


def read_task_yaml(path: Path, loader: Any = None, included_from: Path | None = None) -> dict[str, Any]:
    """One task YAML file as a mapping (``include:`` left to the caller).

    ``loader``: a :class:`rcn_fast.eval.tasks.limits.BoundedLoader` subclass
    (default that class: ``yaml.SafeLoader`` with an alias budget and a
    depth limit). A missing file, bytes that are not text, invalid YAML
    (with its line), a file over those limits (an alias bomb) or a top
    level that is not a mapping is a :class:`TaskError` naming the file
    (and the file that included it).
    """
    import yaml

    from rcn_fast.data.loaders import DataFormatError, decode_utf8
    from rcn_fast.eval.tasks.limits import BoundedLoader, BoundedYAMLError, load_yaml

    from rcn_fast._files import read_bytes

    try:  # beneath the descriptor of its own folder: the file itself cannot be a link out of it
        raw = read_bytes(path.parent, path.name, what=f"task file {path}", limit=MAX_TASK_FILE_BYTES)
    except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
        raise TaskError(f"task file {path} does not exist"
                        + (f" (included from {included_from})" if included_from is not None else "")) from None
    except ValueError as exc:
        raise TaskError(str(exc)) from None
    try:
        text = decode_utf8(raw, path)
        data = load_yaml(text[1:] if text.startswith("\ufeff") else text, loader or BoundedLoader)
    except DataFormatError as exc:
        raise TaskError(f"task file {exc}") from None
    except yaml.YAMLError as exc:  # a BoundedYAMLError's problem says which limit the file exceeds
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark is not None else str(path)
        what = exc.problem if isinstance(exc, BoundedYAMLError) else f"not valid YAML ({getattr(exc, 'problem', exc)})"
        raise TaskError(f"task file {where}: {what}") from None
    if not isinstance(data, dict):
        raise TaskError(f"task file {path}: expected a mapping of settings, got {type(data).__name__}")
    return data
