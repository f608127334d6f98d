"""The task registry: small YAML files in package data, one per benchmark.

A task file names where the questions come from and how to read them::

    name: arc-easy
    group: in-domain            # in-domain | out-of-domain | yes-no | open-domain | demo
    kind: multiple_choice       # multiple_choice | yes_no | open
    dataset: allenai/ai2_arc    # a Hugging Face dataset id
    config: ARC-Easy
    split: test
    expected_count: 2376        # questions in that split (a load that gives another count warns)
    paper_table: ReConnect Table 1 (in-domain)
    fields: {question: question, choices: choices, answer: answerKey, id: id}   # a FieldMap

The source is exactly one of

* ``dataset`` -- a Hugging Face dataset id, read with
  ``datasets.load_dataset(dataset, config, split=split, revision=revision,
  **dataset_kwargs)``. ``revision: refs/convert/parquet`` reads the hub's
  parquet conversion of a repository that only has a loading script
  (``datasets`` >= 4 no longer runs scripts); at that revision each config
  is a folder, so ``config`` is passed as ``data_dir``.
* ``url`` with ``sha256`` -- a file pinned by content (e.g. the ReConnect
  authors' evaluation files), downloaded once into the cache of
  :mod:`rcn_fast.data.fetch`, verified, and read offline afterwards; the
  file is in the CommonsenseQA JSON-lines layout (or the yes/no and
  open-domain layouts for those kinds).
* ``local`` -- a question file, relative to this package or absolute.

Optional keys: ``question_template`` (a Python format string over the
record's fields, e.g. a pronoun question), ``choices_in_question``
(options written inside the question as ``(A) ... (B) ...``, QuaRel),
``shuffle_choices`` (a fixed per-question permutation of the rows of a
dataset that stores the answer first; files given as ``local``/``url`` or
``name=FILE`` are read in their own order), ``dataset_kwargs`` (more
``load_dataset`` arguments), ``expected_count``, ``paper_table``,
``corpus`` (a default knowledge corpus, package relative),
``pipeline_args`` (per-pipeline default settings, e.g. short generations
for the demo) and ``description``. ``include: other.yaml`` merges another
task file under this one. Yes/no and open-domain dataset tasks name their
fields too (``{id, question, answer}`` and :class:`rcn_fast.data.OpenFieldMap`
fields).

On the command line a task is ``name`` (hyphens or underscores:
``arc_easy``), ``name:split`` (another split), ``name=PATH`` (the task
reading its data from PATH: a question file, a folder of ``*<split>*.jsonl``
files, a ``save_to_disk`` folder, or a copy of the hub repository's files),
or the path of a question file. Folders given with ``--include_path``
add the user's own task YAMLs (their ``name`` keys; they win over packaged
tasks of the same name).
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

import yaml

PACKAGE_DIR = Path(__file__).resolve().parent
TASKS_DIR = PACKAGE_DIR / "tasks"
KINDS = ("multiple_choice", "yes_no", "open")
#: The hub branch holding the parquet conversion of every dataset repository.
PARQUET_REVISION = "refs/convert/parquet"
_KNOWN_KEYS = {"name", "group", "kind", "dataset", "config", "split", "fields", "local", "question_template",
               "choices_in_question", "shuffle_choices", "dataset_kwargs", "corpus", "pipeline_args", "description",
               "include", "metrics", "revision", "url", "sha256", "size", "expected_count", "paper_table"}
_YES_NO_FIELDS = {"id": "qid", "question": "question", "answer": "answer"}


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
        from lm-evaluation-harness's format (:mod:`rcn_fast.eval.lm_eval_tasks`).
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
        match for open-domain ones."""
        return ("string_em", "exact_match") if self.kind == "open" else ("acc",)

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


def _read_yaml(path: Path, seen: tuple[Path, ...] = ()) -> dict[str, Any]:
    from rcn_fast.data.loaders import DataFormatError, read_text

    if path in seen:
        raise TaskError(f"task file {path}: include cycle ({' -> '.join(map(str, seen + (path,)))})")
    if not path.is_file():
        raise TaskError(f"task file {path} does not exist" + (f" (included from {seen[-1]})" if seen else ""))
    try:
        data = yaml.safe_load(read_text(path))
    except DataFormatError as exc:
        raise TaskError(f"task file {exc}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark is not None else str(path)
        raise TaskError(f"task file {where}: not valid YAML ({getattr(exc, 'problem', exc)})") from None
    if not isinstance(data, dict):
        raise TaskError(f"task file {path}: expected a mapping of settings, got {type(data).__name__}")
    inc = data.pop("include", None)
    if inc is not None:
        base = _read_yaml((path.parent / str(inc)).resolve(), seen + (path,))
        data = {**base, **data}
    return data


def spec_from_dict(data: dict[str, Any], source: str) -> TaskSpec:
    """Validate a task mapping (read from YAML) into a :class:`TaskSpec`."""
    from rcn_fast.data.fetch import check_sha256, check_size

    unknown = set(data) - _KNOWN_KEYS
    if unknown:
        raise TaskError(f"task file {source}: unknown key(s) {sorted(unknown)}; known: {sorted(_KNOWN_KEYS)}")
    if not isinstance(data.get("name"), str) or not data["name"]:
        raise TaskError(f"task file {source}: missing 'name'")
    from rcn_fast._paths import UnsafePathError, check_name

    try:  # the name becomes folder and file names of the output (checkpoints, samples)
        check_name(data["name"], "name")
    except UnsafePathError as exc:
        raise TaskError(f"task file {source}: {exc}") from None
    kind = data.get("kind", "multiple_choice")
    if kind not in KINDS:
        raise TaskError(f"task file {source}: kind must be one of {list(KINDS)}, got {kind!r}")
    given = [k for k in ("dataset", "url", "local") if data.get(k)]
    if len(given) != 1:
        raise TaskError(f"task file {source}: needs exactly one source: 'dataset' (a Hugging Face id), 'url' "
                        f"(with 'sha256') or 'local' (a question file); got {given or 'none'}")
    if data.get("url") or data.get("sha256"):
        if not data.get("url"):
            raise TaskError(f"task file {source}: 'sha256' pins a 'url'; give the url too")
        try:
            data = {**data, "sha256": check_sha256(data.get("sha256"), "sha256")}
        except ValueError as exc:
            raise TaskError(f"task file {source}: {exc} (a 'url' must be pinned by its checksum)") from None
    if data.get("size") is not None:
        try:
            data = {**data, "size": check_size(data["size"])}
        except ValueError as exc:
            raise TaskError(f"task file {source}: {exc} (the pinned file's size)") from None
        if not data.get("url"):
            raise TaskError(f"task file {source}: 'size' is the size of a 'url' file; give the url too")
    n = data.get("expected_count")
    if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
        raise TaskError(f"task file {source}: expected_count must be a positive integer, got {n!r}")
    if data.get("fields") is not None and not isinstance(data["fields"], dict):
        raise TaskError(f"task file {source}: fields must be a mapping, got {type(data['fields']).__name__}")
    if data.get("dataset") and kind in ("multiple_choice", "open") and not isinstance(data.get("fields"), dict):
        what = "a FieldMap" if kind == "multiple_choice" else "OpenFieldMap fields: question, answers, ..."
        raise TaskError(f"task file {source}: a {kind} Hugging Face task needs 'fields' ({what})")
    dk = data.get("dataset_kwargs") or {}
    if not isinstance(dk, dict):
        raise TaskError(f"task file {source}: dataset_kwargs must be a mapping, got {type(dk).__name__}")
    pa = data.get("pipeline_args") or {}
    if not isinstance(pa, dict) or not all(isinstance(v, dict) for v in pa.values()):
        raise TaskError(f"task file {source}: pipeline_args must map pipeline names to settings")
    data = dict(data)
    data.pop("metrics", None)
    data["pipeline_args"] = {str(k): dict(v) for k, v in pa.items()}
    for settings in data["pipeline_args"].values():  # package-relative prompt files (the demo's)
        pr = settings.get("prompts")
        if isinstance(pr, str) and not Path(pr).is_absolute() and (PACKAGE_DIR / pr).is_file():
            settings["prompts"] = str(PACKAGE_DIR / pr)
    data["dataset_kwargs"] = dict(dk)
    for k in ("config", "revision", "split"):
        if data.get(k) is not None:
            data[k] = str(data[k])
    data["paper_table"] = str(data.get("paper_table") or "")
    return TaskSpec(**data, source=source)


def _task_files(include_paths: Sequence[str] = ()) -> dict[str, Path]:
    """Task name -> YAML file: the user's folders first (in order), then the package's."""
    files: dict[str, Path] = {}
    for d in include_paths or ():
        folder = Path(d).expanduser()
        if not folder.is_dir():
            raise TaskError(f"include_path: {d} is not a folder (expected a folder of task YAML files)")
        for f in sorted([*folder.rglob("*.yaml"), *folder.rglob("*.yml")]):
            name = lm_eval_tasks.scan(f) if lm_eval_tasks.is_lm_eval_file(f) else _read_yaml(f).get("name")
            if isinstance(name, str) and name:  # files without a name are include fragments
                files.setdefault(normalize_name(name), f)
    for f in sorted(TASKS_DIR.glob("*.yaml")):
        files.setdefault(f.stem, f)
    return files


def available_tasks(include_paths: Sequence[str] = ()) -> list[str]:
    """Names of the packaged tasks (and those of ``include_paths`` folders)."""
    return sorted(_task_files(include_paths))


def registry(include_paths: Sequence[str] = ()) -> dict[str, TaskSpec]:
    """Every task by name (packaged, and those of ``include_paths`` folders)."""
    return {name: get_task(name, include_paths) for name in available_tasks(include_paths)}


def get_task(name: str, include_paths: Sequence[str] = ()) -> TaskSpec:
    """A task by name: a packaged ``tasks/<name>.yaml`` or a YAML file with
    that ``name`` in one of ``include_paths`` (its relative ``local`` and
    ``corpus`` paths are relative to that file). Underscores match hyphens."""
    files = _task_files(include_paths)
    key = normalize_name(name)
    path = files.get(key)
    if path is None:
        raise TaskError(f"unknown task {name!r}; available tasks: {', '.join(sorted(files))} "
                        f"(or a path to a question file in the CommonsenseQA JSON-lines layout)")
    if path.parent != TASKS_DIR and lm_eval_tasks.is_lm_eval_file(path):  # lm-evaluation-harness's format
        spec = lm_eval_tasks.spec_from_file(path)
    else:
        spec = spec_from_dict(_read_yaml(path), str(path))
    if normalize_name(spec.name) != key:
        raise TaskError(f"task file {path}: name {spec.name!r} differs from the file name {key!r}")
    if path.parent != TASKS_DIR:  # a user's task file: its relative paths are relative to it
        for k in ("local", "corpus"):
            v = getattr(spec, k)
            if v and not Path(v).expanduser().is_absolute():
                setattr(spec, k, str((path.parent / v).resolve()))
    return spec


def _safe_name(text: str) -> str:
    """A task name made from a file name (one safe path component)."""
    from rcn_fast._paths import safe_component

    return safe_component(text, "task")


def _sniff_kind(path: Path) -> str:
    """multiple_choice / yes_no / open from the first record of a JSON-lines file."""
    from rcn_fast.data.loaders import DataFormatError, iter_lines

    try:
        for _, line in iter_lines(path):
            if line.strip():
                rec = json.loads(line)
                break
        else:
            return "multiple_choice"
    except (OSError, json.JSONDecodeError, DataFormatError):
        return "multiple_choice"  # the loader reports the problem with its line number
    if not isinstance(rec, dict):
        return "multiple_choice"
    q = rec.get("question")
    has_choices = isinstance(q, dict) or "choices" in rec
    if not has_choices and isinstance(rec.get("answers"), list):
        return "open"
    if not has_choices and isinstance(rec.get("answer"), (bool, str, int)) and "answers" not in rec:
        return "yes_no"
    return "multiple_choice"


def _name_and_split(text: str, arg: str) -> tuple[str, str | None]:
    name, sep, split = text.partition(":")
    if sep and not split.strip():
        raise TaskError(f"tasks: {arg!r}: expected NAME:SPLIT with a split after the colon")
    return name.strip(), (split.strip() or None)


def resolve_task(arg: str, *, split: str | None = None, include_paths: Sequence[str] = ()) -> TaskSpec:
    """A ``--tasks`` entry -> TaskSpec.

    * ``name`` -- a packaged task (``arc_easy`` and ``arc-easy`` are the
      same), or one in an ``include_paths`` folder;
    * ``name:split`` -- the task on another split;
    * ``path/to/file.jsonl`` (or ``.json``) -- a local question file
      (CommonsenseQA layout; yes/no and open-domain records are recognised);
    * ``name=PATH`` (or ``name:split=PATH``) -- the task ``name`` reading
      its data from PATH: a question file, a folder of ``*<split>*.jsonl``
      files, a ``save_to_disk`` folder, or a local copy of the dataset
      repository's files (parquet, JSON lines ...), read with the task's
      fields and settings.

    Parameters
    ----------
    split : str, optional
        The split for every task that names none itself (``--split``);
        tasks that read one file (``url``, ``local``, ``name=FILE``) keep it.
    include_paths : sequence of str
        Folders of the user's task YAMLs (``--include_path``).
    """
    if not isinstance(arg, str) or not arg.strip():
        raise TaskError(f"tasks: expected a task name or a file path, got {arg!r}")
    arg = arg.strip()
    if "=" in arg and not Path(arg).exists():
        head, _, where = arg.partition("=")
        name, own_split = _name_and_split(head, arg)
        spec = get_task(name, include_paths)
        p = Path(where).expanduser()
        if not p.exists():
            raise TaskError(f"task {name!r}: {where} does not exist")
        if p.is_file():
            spec.local, spec.dataset = str(p.resolve()), None
        else:
            spec.dataset, spec.local = str(p.resolve()), None
        spec.url = spec.sha256 = spec.revision = spec.size = None
        spec.source = f"{spec.source} with data from {p}"
    else:
        p = Path(arg).expanduser()
        if p.suffix in (".jsonl", ".json") or p.is_file():
            if not p.is_file():
                raise TaskError(f"task file {arg} does not exist")
            return TaskSpec(name=_safe_name(p.stem), kind=_sniff_kind(p), group="local", local=str(p.resolve()),
                            source=str(p.resolve()))
        name, own_split = _name_and_split(arg, arg)
        spec = get_task(name, include_paths)
    chosen = own_split or split
    if chosen and chosen != spec.split:
        if spec.url or spec.local:  # one file, one set: --split leaves it be, name:split is a mistake
            if own_split:
                raise TaskError(f"task {spec.name!r} reads one file ({spec.where}), which has no split "
                                f"{own_split!r}; give the file of that split with {spec.name}=PATH")
            return spec
        spec.split, spec.expected_count = chosen, None  # the count is the paper's split's
    return spec


# ------------------------------------------------------------------ loading
def _package_path(path: str) -> Path:
    p = Path(path).expanduser()
    return p if p.is_absolute() else PACKAGE_DIR / p


def task_corpus(spec: TaskSpec) -> str | None:
    """The task's default corpus as an absolute path (None when it has none)."""
    return None if spec.corpus is None else str(_package_path(spec.corpus))


_OPTION = re.compile(r"\(([A-Z])\)\s*")
# the end of the last inline option: a sentence end followed by a new sentence
_TRAILER = re.compile(r"(?<=[^\s])([.?!])\s+(?=[A-Z0-9\"'(])")
_ABBREVIATION = re.compile(r"(?:\b(?:Mr|Mrs|Ms|Dr|St|Jr|Sr|Mt|Prof|vs|etc|No)|\b[A-Z])$")


def split_inline_choices(text: str) -> tuple[str, list[str], list[str]]:
    """``"stem (A) first (B) second"`` -> (stem, choices, labels).

    Text after the last option's sentence (``"... (B) ice. Why?"``) is not
    part of that option: it is appended to the stem. A final ``.``/``?``/``!``
    after an option is dropped.

    Raises
    ------
    ValueError
        Fewer than two options written as ``(A) ... (B) ...``.
    """
    parts = _OPTION.split(text)
    if len(parts) < 5:
        raise ValueError("expected options written as '(A) ... (B) ...' inside the question")
    stem = parts[0].strip()
    labels = parts[1::2]
    choices = [c.strip() for c in parts[2::2]]
    m = next((m for m in _TRAILER.finditer(choices[-1])
              if m.group(1) != "." or not _ABBREVIATION.search(choices[-1][:m.start()])), None)
    if m is not None:
        trailer = choices[-1][m.end():].strip()
        choices[-1] = choices[-1][:m.start()].strip()
        stem = f"{stem} {trailer}".strip()
    choices = [c[:-1].rstrip() if len(c) > 1 and c[-1] in ".?!" else c for c in choices]
    if any(not c for c in choices):
        raise ValueError(f"an empty option in {text!r}")
    return stem, choices, labels


def _permute(q: Any, key: str) -> Any:
    from rcn_fast.data import MCQuestion

    import numpy as np

    seed = int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "little")
    order = np.random.default_rng(seed).permutation(len(q.choices)).tolist()
    choices = [q.choices[i] for i in order]
    answer = None if q.answer is None else order.index(q.answer)
    return MCQuestion(id=q.id, question=q.question, choices=choices, answer=answer, meta=q.meta)


def check_limit(limit: Any) -> int | float | None:
    """``limit``: None, a positive int (first N questions) or a float in
    (0, 1) (that fraction of the split, rounded up; a whole float >= 1 counts
    as an int). Anything else raises ValueError naming ``limit``."""
    if limit is None:
        return None
    if isinstance(limit, bool) or not isinstance(limit, (int, float)):
        raise ValueError(f"limit: expected a positive integer or a fraction in (0, 1), got {limit!r}")
    if isinstance(limit, float):
        if 0.0 < limit < 1.0:
            return limit
        if limit >= 1.0 and limit.is_integer():
            return int(limit)
        raise ValueError(f"limit: expected a positive integer or a fraction in (0, 1), got {limit!r}")
    if limit < 1:
        raise ValueError(f"limit: expected a positive integer or a fraction in (0, 1), got {limit!r}")
    return limit


def _take_n(total: int, limit: int | float | None) -> int:
    if limit is None:
        return total
    if isinstance(limit, float):
        return min(total, math.ceil(total * limit))
    return min(total, limit)


def hub_load_args(spec: TaskSpec, split: str | None = None) -> tuple[str, dict[str, Any]]:
    """The ``datasets.load_dataset`` call of a hub task: ``(path, kwargs)``.

    ``config`` goes in as the configuration name, except at the parquet
    conversion revision (:data:`PARQUET_REVISION`), where each config is a
    folder (``data_dir``); ``revision`` and ``dataset_kwargs`` are passed on.
    """
    kwargs: dict[str, Any] = dict(spec.dataset_kwargs)
    kwargs["split"] = split or spec.split or "validation"
    if spec.revision:
        kwargs["revision"] = spec.revision
    if spec.config is not None:
        if spec.revision == PARQUET_REVISION:
            kwargs.setdefault("data_dir", spec.config)
        else:
            kwargs["name"] = spec.config
    return str(spec.dataset), kwargs


def _is_saved(p: Path) -> bool:
    return (p / "dataset_info.json").is_file() or (p / "dataset_dict.json").is_file()


def _split_files(folder: Path, split: str | None) -> list[Path]:
    want = split or "dev"
    want = {"validation": "dev", "valid": "dev", "val": "dev"}.get(want, want)
    return sorted(p for p in folder.glob("*.jsonl") if want in p.stem)


def _dataset_rows(spec: TaskSpec, split: str) -> tuple[Any, str]:
    """The rows of a dataset task: a ``datasets.Dataset`` and a name for messages."""
    from rcn_fast._arrays import require

    datasets = require("datasets", 'pip install datasets  (or pip install "rcn_fast[eval]")')
    p = Path(str(spec.dataset)).expanduser()
    if p.is_dir() and _is_saved(p):  # a save_to_disk folder
        ds = datasets.load_from_disk(str(p))
        if isinstance(ds, datasets.DatasetDict):
            if split not in ds:
                raise TaskError(f"task {spec.name!r}: {p} has the splits {sorted(ds)}, not {split!r} (choose one "
                                f"with --split or {spec.name}:SPLIT)")
            ds = ds[split]
        return ds, f"{p}[{split}]"
    if p.is_dir():  # a copy of the repository's files: the hub call on the folder
        _, kwargs = hub_load_args(spec, split)
        kwargs.pop("revision", None)
        cfg = kwargs.pop("name", None)
        card = p / "README.md"
        listed = card.is_file() and f"config_name: {cfg}" in card.read_text(encoding="utf-8", errors="replace")
        if cfg is not None and (p / cfg).is_dir() and not listed:
            kwargs.setdefault("data_dir", cfg)  # a config folder (the parquet conversion's layout)
            cfg = None
        return datasets.load_dataset(str(p), cfg, **kwargs), f"{p}[{split}]"
    path, kwargs = hub_load_args(spec, split)
    return datasets.load_dataset(path, **kwargs), f"{spec.name}[{split}]"


def _convert_mc(spec: TaskSpec, rows: Iterable[Any], split: str, where: str) -> list[Any]:
    from rcn_fast.data import DataFormatError, FieldMap, MCQuestion
    from rcn_fast.data.loaders import convert_record

    f = dict(spec.fields or {})
    f.setdefault("choices", None)
    for k in ("question", "choices", "fixed_choices"):
        if isinstance(f.get(k), list):
            f[k] = tuple(f[k])
    try:
        fmap = FieldMap(**f)
    except TypeError as exc:
        raise TaskError(f"task {spec.name!r}: bad fields ({exc})") from None
    out = []
    for row, rec in enumerate(rows):
        rec = dict(rec)
        if spec.question_template:
            try:
                rec["_question"] = spec.question_template.format(**rec)
            except (KeyError, IndexError) as exc:
                raise DataFormatError(f"{where}: row {row}: question_template needs field {exc}") from None
            fm = FieldMap(**{**fmap.to_dict(), "question": "_question"})
        else:
            fm = fmap
        if spec.choices_in_question:
            qf = fmap.question if isinstance(fmap.question, str) else fmap.question[0]
            try:
                stem, choices, labels = split_inline_choices(str(rec.get(qf, "")))
            except ValueError as exc:
                raise DataFormatError(f"{where}: row {row}: {exc}") from None
            rec["_question"], rec["_choices"], rec["_labels"] = stem, choices, labels
            fm = FieldMap(**{**fm.to_dict(), "question": "_question", "choices": "_choices", "labels": "_labels"})
        q = convert_record(rec, fm, row, where)
        if fmap.id is None:
            q = MCQuestion(id=f"{spec.name}-{split}-{row}", question=q.question, choices=q.choices, labels=q.labels,
                           answer=q.answer, meta=q.meta)
        if spec.shuffle_choices:  # the dataset stores the answer first
            q = _permute(q, f"{spec.name}/{q.id}")
        out.append(q)
    return out


def _convert_yes_no(spec: TaskSpec, rows: Iterable[Any], split: str, where: str) -> list[Any]:
    from rcn_fast.data.yes_no import yes_no_record

    f = {**_YES_NO_FIELDS, **(spec.fields or {})}
    unknown = set(f) - set(_YES_NO_FIELDS)
    if unknown:
        raise TaskError(f"task {spec.name!r}: yes/no fields are {sorted(_YES_NO_FIELDS)}, got {sorted(unknown)}")
    return [yes_no_record(dict(rec), f"{where} row {row}", id_field=f["id"], question_field=f["question"],
                          answer_field=f["answer"], default_id=f"{spec.name}-{split}-{row}")
            for row, rec in enumerate(rows)]


def _convert_open(spec: TaskSpec, rows: Iterable[Any], split: str, where: str) -> list[Any]:
    from rcn_fast.data.open_domain import OpenFieldMap, convert_open_record

    f = dict(spec.fields or {})
    if isinstance(f.get("answers"), list):
        f["answers"] = tuple(f["answers"])
    try:
        fmap = OpenFieldMap(**f)
    except (TypeError, ValueError) as exc:
        raise TaskError(f"task {spec.name!r}: bad fields ({exc})") from None
    out = []
    for row, rec in enumerate(rows):
        q = convert_open_record(dict(rec), fmap, row, where)
        if fmap.id is None:  # ids that do not depend on where the rows were read from
            q.id = f"{spec.name}-{split}-{row}"
        out.append(q)
    return out


def _read_file(spec: TaskSpec, path: Path, split: str | None, limit: int | None = None) -> list[Any]:
    """The questions of a local file (or a folder of ``*<split>*.jsonl``), in
    file order: every one, or the first ``limit``."""
    if spec.kind == "yes_no":
        from rcn_fast.data.yes_no import load_yes_no_questions

        return load_yes_no_questions(str(path), split=split, limit=limit)
    if spec.kind == "open":
        from rcn_fast.data.open_domain import load_open_questions

        return load_open_questions(str(path), split=split, limit=limit)
    from rcn_fast.data import load_questions

    return load_questions(str(path), split=split, limit=limit)


def _read_limited(spec: TaskSpec, path: Path, split: str | None, limit: int | float | None) -> tuple[list[Any], int]:
    """The questions ``limit`` keeps and the number in the file. With a
    limit, a JSON-lines file's records are counted without parsing and only
    the kept ones are parsed (:func:`rcn_fast.data.loaders.count_records`);
    a JSON array is parsed whole."""
    from rcn_fast.data.loaders import count_records, split_file

    total = None if limit is None else count_records(split_file(path, split) or path)
    if total is None:
        qs = _read_file(spec, path, split)
        return qs[:_take_n(len(qs), limit)], len(qs)
    n = _take_n(total, limit)
    return _read_file(spec, path, split, limit=max(n, 1))[:n], total


def load_task_questions(spec: TaskSpec, *, limit: int | float | None = None, split: str | None = None) -> list[Any]:
    """The questions of a task.

    Parameters
    ----------
    spec : TaskSpec
    limit : int or float, optional
        The first ``limit`` questions, or (a float in (0, 1)) that fraction
        of the split, rounded up. A JSON-lines file is parsed only up to
        the last question kept (the rest is counted, not parsed).
    split : str, optional
        Overrides ``spec.split``.

    Returns
    -------
    list of :class:`~rcn_fast.data.MCQuestion` (``multiple_choice`` and
    ``yes_no`` tasks) or :class:`~rcn_fast.data.OpenQuestion` (``open``).

    Warns
    -----
    TaskCountWarning
        The split has another number of questions than ``spec.expected_count``.

    Raises
    ------
    rcn_fast.data.DataFormatError
        A malformed record (file and line, or dataset row), or bytes that are not UTF-8.
    rcn_fast.data.fetch.FetchError
        A pinned URL whose file cannot be had or does not match its checksum.
    TaskError
        A split the data does not have, or bad task fields.
    FileNotFoundError
        A local file that does not exist.
    """
    limit = check_limit(limit)
    split = split or spec.split
    expected = spec.expected_count if split == spec.split else None
    if spec.lm_eval is not None:  # a task in lm-evaluation-harness's format
        qs, total, where = lm_eval_tasks.load_questions(spec, limit, split or "validation")
    elif spec.url or spec.local:
        if spec.url:
            from rcn_fast.data.fetch import fetch_pinned

            path = fetch_pinned(spec.url, str(spec.sha256), size=spec.size)
        else:
            path = _package_path(str(spec.local))
        qs, total = _read_limited(spec, path, split, limit)
        where = str(path)
    else:
        p = Path(str(spec.dataset)).expanduser()
        if p.is_dir() and not _is_saved(p) and _split_files(p, split) and _jsonl_layout_fits(spec, p, split):
            qs, total = _read_limited(spec, p, split, limit)  # a folder of JSON-lines split files in rcn_fast's layouts
            where = str(_split_files(p, split)[0])
        else:
            split = split or "validation"
            ds, where = _dataset_rows(spec, split)
            total = len(ds)
            n = _take_n(total, limit)
            rows = ds.select(range(n)) if n < total else ds
            if spec.kind == "yes_no":
                qs = _convert_yes_no(spec, rows, split, where)
            elif spec.kind == "open":
                qs = _convert_open(spec, rows, split, where)
            else:
                qs = _convert_mc(spec, rows, split, where)
    if expected is not None and total != expected:
        warnings.warn(TaskCountWarning(
            f"task {spec.name!r}: {where} has {total} questions, the paper's set has {expected} "
            f"(another file, split or version of the data?)"), stacklevel=2)
    return qs


def _jsonl_layout_fits(spec: TaskSpec, folder: Path, split: str | None) -> bool:
    """Whether a folder's ``*<split>*.jsonl`` is in rcn_fast's own layout for
    the task's kind (CommonsenseQA records for multiple choice) rather than
    a copy of the dataset's raw files."""
    return spec.kind != "multiple_choice" or _has_csqa_question(_split_files(folder, split)[0])


def _has_csqa_question(path: Path) -> bool:
    from rcn_fast.data.loaders import DataFormatError, iter_lines

    try:
        for _, line in iter_lines(path):
            if line.strip():
                rec = json.loads(line)
                return isinstance(rec, dict) and (isinstance(rec.get("question"), dict)
                                                  or isinstance(rec.get("choices"), list))
    except (OSError, json.JSONDecodeError, DataFormatError):
        return True  # the CommonsenseQA reader reports the problem with its line number
    return True


def spec_key(spec: TaskSpec) -> str:
    """A short hash of what decides a task's questions (checkpoints key on it)."""
    d = {k: v for k, v in spec.to_dict().items() if k not in ("description", "source", "group", "corpus",
                                                             "pipeline_args", "expected_count", "paper_table")}
    for k in ("revision", "url", "sha256", "lm_eval"):  # keys of tasks without them stay what they were
        if d.get(k) is None:
            d.pop(k, None)
    d.pop("url", None)  # the checksum pins the content wherever it is served
    d.pop("size", None)  # and its size with it: adding size: keeps the checkpoints
    if spec.local:
        p = _package_path(spec.local)
        d["local_sha"] = hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else None
    return hashlib.sha256(json.dumps(d, sort_keys=True, default=str).encode()).hexdigest()[:16]


from rcn_fast.eval import lm_eval_tasks  # noqa: E402 - it imports TaskSpec from here

__all__ = ["TaskSpec", "TaskError", "TaskCountWarning", "available_tasks", "registry", "get_task", "resolve_task",
           "load_task_questions", "task_corpus", "split_inline_choices", "spec_from_dict", "spec_key",
           "hub_load_args", "check_limit", "normalize_name", "PACKAGE_DIR", "TASKS_DIR", "PARQUET_REVISION"]
