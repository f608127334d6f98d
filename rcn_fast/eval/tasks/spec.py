"""A task's plain data: :class:`TaskSpec` (what one evaluation task is,
recorded in every results file), its errors and warnings, and the keys
derived from it (:func:`spec_key`, :func:`task_corpus`). The registry that
reads task YAMLs is :mod:`rcn_fast.eval.tasks.catalog`; reading the questions is
:mod:`rcn_fast.eval.tasks.loading`; scoring them is :mod:`rcn_fast.eval.metrics`.
"""

from __future__ import annotations

import hashlib
import json
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
    p = Path(path).expanduser()
    return p if p.is_absolute() else PACKAGE_DIR / p


def task_corpus(spec: TaskSpec) -> str | None:
    """The task's default corpus as an absolute path (None when it has none)."""
    return None if spec.corpus is None else str(package_path(spec.corpus))



def local_data_files(spec: TaskSpec) -> list[Path]:
    """The local files and folders a task's ``dataset_kwargs.data_files``
    name (a path, a glob, a list or a ``{split: ...}`` mapping of them), as
    the ``datasets`` loader finds them (relative to the working
    directory), sorted."""
    import glob

    dk = spec.dataset_kwargs or {}
    found: set[Path] = set()

    def add(v: Any) -> None:
        if isinstance(v, str):
            for m in glob.glob(str(Path(v).expanduser()), recursive=True) if glob.has_magic(v) else [v]:
                if Path(m).expanduser().exists():
                    found.add(Path(m).expanduser().resolve())
        elif isinstance(v, dict):
            for x in v.values():
                add(x)
        elif isinstance(v, (list, tuple)):
            for x in v:
                add(x)

    add(dk.get("data_files"))
    return sorted(found)


def local_dataset_folder(spec: TaskSpec) -> Path | None:
    """The local folder a task's ``dataset`` names (a JSON-lines split
    folder, a ``save_to_disk`` folder, a copy of a hub repository); None for
    a hub id, or when the task reads a ``url`` or ``local`` file instead."""
    if not spec.dataset or spec.url or spec.local:
        return None
    p = Path(str(spec.dataset)).expanduser()
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
        d["local_sha"] = content_fingerprint(p) if p.exists() else None  # a file's: its sha256, as before
    folder = local_dataset_folder(spec)
    if folder is not None:
        d["data_sha"] = content_fingerprint(folder)  # a local folder's files
    files = local_data_files(spec)
    if files:  # dataset_kwargs' local data_files (``dataset: json``)
        d["data_files_sha"] = {str(f): content_fingerprint(f) for f in files}
    return hashlib.sha256(json.dumps(d, sort_keys=True, default=str).encode()).hexdigest()[:16]



__all__ = ["TaskSpec", "TaskError", "TaskCountWarning", "normalize_name", "package_path", "task_corpus", "spec_key",
           "local_data_files", "local_dataset_folder", "KINDS", "METRICS", "PACKAGE_DIR", "TASKS_DIR",
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

    from rcn_fast.data.loaders import DataFormatError, read_text
    from rcn_fast.eval.tasks.limits import BoundedLoader, BoundedYAMLError, load_yaml

    if not path.is_file():
        raise TaskError(f"task file {path} does not exist"
                        + (f" (included from {included_from})" if included_from is not None else ""))
    try:
        data = load_yaml(read_text(path), loader or BoundedLoader)
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
