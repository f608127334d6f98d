"""The task registry: small YAML files in package data, one per benchmark.

A task file names where the questions come from and how to read them::

    name: arc-easy
    group: in-domain            # in-domain | out-of-domain | yes-no | open-domain | demo
    kind: multiple_choice       # multiple_choice | yes_no | open
    dataset: allenai/ai2_arc    # a Hugging Face dataset id (or a save_to_disk folder)
    config: ARC-Easy
    split: validation
    fields: {question: question, choices: choices, answer: answerKey, id: id}   # a FieldMap

or, instead of ``dataset``, ``local: demo/questions.jsonl`` (a file in the
CommonsenseQA JSON-lines layout, relative to this package or absolute).
Optional keys: ``question_template`` (a Python format string over the
record's fields, e.g. WSC's pronoun question), ``choices_in_question``
(options written inside the question as ``(A) ... (B) ...``, QuaRel),
``shuffle_choices`` (a fixed per-question permutation, for datasets that
store the answer first), ``dataset_kwargs`` (passed to
``datasets.load_dataset``), ``corpus`` (a default knowledge corpus, package
relative) and ``pipeline_args`` (per-pipeline default settings, e.g. short
generations for the demo). ``include: other.yaml`` merges another task file
under this one.

Any local file can be a task (``--tasks path/to/file.jsonl``), and a
registry task can read its data from elsewhere (``--tasks name=PATH``).
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

PACKAGE_DIR = Path(__file__).resolve().parent
TASKS_DIR = PACKAGE_DIR / "tasks"
KINDS = ("multiple_choice", "yes_no", "open")
_KNOWN_KEYS = {"name", "group", "kind", "dataset", "config", "split", "fields", "local", "question_template",
               "choices_in_question", "shuffle_choices", "dataset_kwargs", "corpus", "pipeline_args", "description",
               "include", "metrics"}


class TaskError(ValueError):
    """A task that cannot be resolved or read (the message says why)."""


@dataclass
class TaskSpec:
    """One evaluation task (plain data, recorded in every results file).

    Attributes
    ----------
    name : str
    kind : {"multiple_choice", "yes_no", "open"}
    group : str
    dataset, config, split : Hugging Face source (``dataset`` may be a
        ``save_to_disk`` folder).
    local : str or None
        A local question file (used instead of ``dataset``).
    fields : dict or None
        :class:`rcn_fast.data.FieldMap` fields (multiple choice, Hugging Face).
    question_template, choices_in_question, shuffle_choices, dataset_kwargs :
        see the module docstring.
    corpus : str or None
        Default knowledge corpus of the task (a file or a store folder).
    pipeline_args : dict
        ``{pipeline: {setting: value}}`` defaults (user settings win).
    source : str
        The file the spec was read from (or ``"<path>"``).
    """

    name: str
    kind: str = "multiple_choice"
    group: str = "custom"
    dataset: str | None = None
    config: str | None = None
    split: str | None = None
    local: str | None = None
    fields: dict[str, Any] | None = None
    question_template: str | None = None
    choices_in_question: bool = False
    shuffle_choices: bool = False
    dataset_kwargs: dict[str, Any] = field(default_factory=dict)
    corpus: str | None = None
    pipeline_args: dict[str, dict[str, Any]] = field(default_factory=dict)
    description: str = ""
    source: str = ""

    @property
    def metrics(self) -> tuple[str, ...]:
        """Metric names: ``("acc",)`` for choice tasks, StringEM and exact
        match for open-domain ones."""
        return ("string_em", "exact_match") if self.kind == "open" else ("acc",)

    @property
    def main_metric(self) -> str:
        return self.metrics[0]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# --------------------------------------------------------------- registry
def _read_yaml(path: Path, seen: tuple[Path, ...] = ()) -> dict[str, Any]:
    if path in seen:
        raise TaskError(f"task file {path}: include cycle ({' -> '.join(map(str, seen + (path,)))})")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
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
    unknown = set(data) - _KNOWN_KEYS
    if unknown:
        raise TaskError(f"task file {source}: unknown key(s) {sorted(unknown)}; known: {sorted(_KNOWN_KEYS)}")
    if not isinstance(data.get("name"), str) or not data["name"]:
        raise TaskError(f"task file {source}: missing 'name'")
    kind = data.get("kind", "multiple_choice")
    if kind not in KINDS:
        raise TaskError(f"task file {source}: kind must be one of {list(KINDS)}, got {kind!r}")
    if not data.get("dataset") and not data.get("local"):
        raise TaskError(f"task file {source}: needs 'dataset' (a Hugging Face id) or 'local' (a question file)")
    if kind == "multiple_choice" and data.get("dataset") and not isinstance(data.get("fields"), dict):
        raise TaskError(f"task file {source}: a multiple-choice Hugging Face task needs 'fields' (a FieldMap)")
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
    data["dataset_kwargs"] = dict(data.get("dataset_kwargs") or {})
    if data.get("config") is not None:
        data["config"] = str(data["config"])
    return TaskSpec(**data, source=source)


def available_tasks() -> list[str]:
    """Names of the tasks shipped in package data."""
    return sorted(p.stem for p in TASKS_DIR.glob("*.yaml"))


def registry() -> dict[str, TaskSpec]:
    """Every packaged task by name."""
    return {name: get_task(name) for name in available_tasks()}


def get_task(name: str) -> TaskSpec:
    """A packaged task by name (its file ``tasks/<name>.yaml``)."""
    path = TASKS_DIR / f"{name}.yaml"
    if not path.is_file():
        raise TaskError(f"unknown task {name!r}; available tasks: {', '.join(available_tasks())} "
                        f"(or a path to a question file in the CommonsenseQA JSON-lines layout)")
    spec = spec_from_dict(_read_yaml(path), str(path))
    if spec.name != name:
        raise TaskError(f"task file {path}: name {spec.name!r} differs from the file name {name!r}")
    return spec


def _safe_name(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("_") or "task"


def _sniff_kind(path: Path) -> str:
    """multiple_choice / yes_no / open from the first record of a JSON-lines file."""
    try:
        with open(path, encoding="utf-8") as f:
            for line in f:
                if line.strip():
                    rec = json.loads(line)
                    break
            else:
                return "multiple_choice"
    except (OSError, json.JSONDecodeError, UnicodeDecodeError):
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


def resolve_task(arg: str) -> TaskSpec:
    """A ``--tasks`` entry -> TaskSpec.

    * ``name`` -- a packaged task;
    * ``path/to/file.jsonl`` (or ``.json``) -- a local question file
      (CommonsenseQA layout; yes/no and open-domain records are recognised);
    * ``name=PATH`` -- the packaged task ``name`` reading its data from
      PATH (a local question file, a ``save_to_disk`` folder or a folder of
      ``*<split>*.jsonl`` files).
    """
    if not isinstance(arg, str) or not arg.strip():
        raise TaskError(f"tasks: expected a task name or a file path, got {arg!r}")
    if "=" in arg and not Path(arg).exists():
        name, _, where = arg.partition("=")
        spec = get_task(name)
        p = Path(where).expanduser()
        if not p.exists():
            raise TaskError(f"task {name!r}: {where} does not exist")
        if p.is_file():
            spec.local, spec.dataset = str(p.resolve()), None
        else:
            spec.dataset = str(p.resolve())
        spec.source = f"{spec.source} with data from {p}"
        return spec
    p = Path(arg).expanduser()
    if p.suffix in (".jsonl", ".json") or p.is_file():
        if not p.is_file():
            raise TaskError(f"task file {arg} does not exist")
        return TaskSpec(name=_safe_name(p.stem), kind=_sniff_kind(p), group="local", local=str(p.resolve()),
                        source=str(p.resolve()))
    return get_task(arg)


# ------------------------------------------------------------------ loading
def _package_path(path: str) -> Path:
    p = Path(path).expanduser()
    return p if p.is_absolute() else PACKAGE_DIR / p


def task_corpus(spec: TaskSpec) -> str | None:
    """The task's default corpus as an absolute path (None when it has none)."""
    return None if spec.corpus is None else str(_package_path(spec.corpus))


_OPTION = re.compile(r"\(([A-Z])\)\s*")


def split_inline_choices(text: str) -> tuple[str, list[str], list[str]]:
    """``"stem (A) first (B) second"`` -> (stem, choices, labels)."""
    parts = _OPTION.split(text)
    if len(parts) < 5:
        raise ValueError("expected options written as '(A) ... (B) ...' inside the question")
    stem = parts[0].strip()
    labels = parts[1::2]
    choices = [c.strip() for c in parts[2::2]]
    return stem, choices, labels


def _permute(q: Any, key: str) -> Any:
    from rcn_fast.data import MCQuestion

    import numpy as np

    seed = int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "little")
    order = np.random.default_rng(seed).permutation(len(q.choices)).tolist()
    choices = [q.choices[i] for i in order]
    answer = None if q.answer is None else order.index(q.answer)
    return MCQuestion(id=q.id, question=q.question, choices=choices, answer=answer, meta=q.meta)


def _mc_from_hf(spec: TaskSpec, split: str | None, limit: int | None) -> list[Any]:
    from rcn_fast._arrays import require
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
    datasets = require("datasets", 'pip install datasets  (or pip install "rcn_fast[eval]")')
    split = split or spec.split or "validation"
    name = str(spec.dataset)
    if Path(name).is_dir() and ((Path(name) / "dataset_info.json").exists()
                                or (Path(name) / "dataset_dict.json").exists()):
        ds = datasets.load_from_disk(name)
        if isinstance(ds, datasets.DatasetDict):
            ds = ds[split]
    else:
        ds = datasets.load_dataset(name, spec.config, split=split, **spec.dataset_kwargs)
    where = f"{spec.name}[{split}]"
    out = []
    for row, rec in enumerate(ds):
        if limit is not None and row >= limit:
            break
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
            try:
                stem, choices, labels = split_inline_choices(str(rec.get(fmap.question if isinstance(fmap.question, str)
                                                                         else fmap.question[0], "")))
            except ValueError as exc:
                raise DataFormatError(f"{where}: row {row}: {exc}") from None
            rec["_question"], rec["_choices"], rec["_labels"] = stem, choices, labels
            fm = FieldMap(**{**fm.to_dict(), "question": "_question", "choices": "_choices", "labels": "_labels"})
        q = convert_record(rec, fm, row, where)
        if fmap.id is None:
            q = MCQuestion(id=f"{spec.name}-{split}-{row}", question=q.question, choices=q.choices, labels=q.labels,
                           answer=q.answer, meta=q.meta)
        if spec.shuffle_choices:
            q = _permute(q, f"{spec.name}/{q.id}")
        out.append(q)
    return out


def load_task_questions(spec: TaskSpec, *, limit: int | None = None, split: str | None = None) -> list[Any]:
    """The questions of a task.

    Returns
    -------
    list of :class:`~rcn_fast.data.MCQuestion` (``multiple_choice`` and
    ``yes_no`` tasks) or :class:`~rcn_fast.data.OpenQuestion` (``open``).

    Raises
    ------
    rcn_fast.data.DataFormatError
        A malformed record (file and line, or dataset row).
    FileNotFoundError
        A local file that does not exist.
    """
    split = split or spec.split
    if spec.kind == "yes_no":
        from rcn_fast.data.yes_no import load_yes_no_questions

        src = str(_package_path(spec.local)) if spec.local else str(spec.dataset)
        return load_yes_no_questions(src, split=split, limit=limit, config=spec.config)
    if spec.kind == "open":
        from rcn_fast.data.open_domain import load_open_questions

        src = str(_package_path(spec.local)) if spec.local else str(spec.dataset)
        return load_open_questions(src, split=split, limit=limit, config=spec.config)
    if spec.local:
        from rcn_fast.data import load_questions

        qs = load_questions(str(_package_path(spec.local)), split=split, limit=limit)
        return [_permute(q, f"{spec.name}/{q.id}") for q in qs] if spec.shuffle_choices else qs
    return _mc_from_hf(spec, split, limit)


def spec_key(spec: TaskSpec) -> str:
    """A short hash of what decides a task's questions (checkpoints key on it)."""
    d = {k: v for k, v in spec.to_dict().items() if k not in ("description", "source", "group", "corpus",
                                                             "pipeline_args")}
    if spec.local:
        p = _package_path(spec.local)
        d["local_sha"] = hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else None
    return hashlib.sha256(json.dumps(d, sort_keys=True, default=str).encode()).hexdigest()[:16]


__all__ = ["TaskSpec", "TaskError", "available_tasks", "registry", "get_task", "resolve_task",
           "load_task_questions", "task_corpus", "split_inline_choices", "spec_from_dict", "spec_key",
           "PACKAGE_DIR", "TASKS_DIR"]
