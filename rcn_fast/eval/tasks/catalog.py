"""The task catalog: small YAML files in package data, one per benchmark.

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
* ``local`` -- a question file: absolute, or relative to the folder of
  the YAML file that writes it (a packaged task's: to this package).

Optional keys: ``question_template`` (the question written from the
record's fields by plain ``{field}`` substitution, e.g. a pronoun question;
no format specs, conversions, attributes or indexes -- ``{{`` and ``}}``
write braces -- so a task file cannot reach Python objects or size a
result: :func:`rcn_fast._templates.fill_fields`; for Jinja, write an
lm-eval task's ``doc_to_text``), ``choices_in_question``
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

import json
from pathlib import Path
from typing import Any, Sequence

from rcn_fast._files import Folder
from rcn_fast.eval.tasks import lm_eval as lm_eval_tasks
from rcn_fast.eval.tasks.loading import load_task_questions, split_inline_choices
from rcn_fast.eval.tasks.sources import check_limit, hub_load_args, is_layout_root, layout_file, layout_hint, layout_tasks
from rcn_fast.eval.tasks.spec import (
    KINDS,
    PACKAGE_DIR,
    PARQUET_REVISION,
    TASKS_DIR,
    TaskCountWarning,
    TaskError,
    TaskSpec,
    normalize_name,
    own_data_files,
    own_file,
    read_task_yaml,
    written_path,
    spec_key,
    task_corpus,
)

_KNOWN_KEYS = {"name", "group", "kind", "dataset", "config", "split", "fields", "local", "question_template",
               "choices_in_question", "shuffle_choices", "dataset_kwargs", "corpus", "pipeline_args", "description",
               "include", "metrics", "revision", "url", "sha256", "size", "expected_count", "paper_table"}


def _read_yaml(path: Path, seen: tuple[Path, ...] = ()) -> dict[str, Any]:
    if path in seen:
        raise TaskError(f"task file {path}: include cycle ({' -> '.join(map(str, seen + (path,)))})")
    data = read_task_yaml(path, included_from=seen[-1] if seen else None)
    if path.parent != TASKS_DIR:  # a user's file: its paths are relative to it, included or not
        v = data.get("local")
        if isinstance(v, str) and v:  # its data lies in its own folder (checked through the files door)
            data["local"] = own_file(path.parent, v, f"task file {path}: local")
        v = data.get("corpus")
        if isinstance(v, str) and v and not Path(v).expanduser().is_absolute():
            data["corpus"] = written_path(path, "corpus", v)
        dk = data.get("dataset_kwargs")
        if isinstance(dk, dict) and dk.get("data_files") is not None:
            data["dataset_kwargs"] = {**dk, "data_files": own_data_files(path.parent, dk["data_files"],
                                                                         f"task file {path}")}
    inc = data.pop("include", None)
    if inc is not None:
        base = _read_yaml(Path(written_path(path, "include", str(inc))), seen + (path,))
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
    if data.get("question_template") is not None:
        from rcn_fast._templates import TemplateLimitError, TemplateRenderError, check_fields_template

        try:  # {field} substitutions only: refused here, before any record is read
            check_fields_template(data["question_template"])
        except (TemplateRenderError, TemplateLimitError) as exc:
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
        with Folder(folder, what="include_path") as root:  # a bounded walk, links not followed into folders
            found = sorted({*root.glob("**/*.yaml"), *root.glob("**/*.yml")})
        for f in (folder / rel for rel in found):
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
    ``corpus`` paths are relative to the file that writes them, an
    ``include:``d one too; a packaged task's to the package). Underscores
    match hyphens."""
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
    return spec  # a user file's relative paths were made absolute as it was read (_read_yaml, spec_from_file)


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


def expand_task_folders(entries: Sequence[str], *, split: str | None = None,
                        include_paths: Sequence[str] = ()) -> list[str]:
    """``--tasks`` entries with each folder given alone (no ``NAME=``)
    replaced by ``NAME=FILE`` for every known task whose question file of its
    split (or ``split``) the folder holds in the commonsense layout
    (``<task>/<task>-<split>.jsonl``), in the catalog's order; other entries
    are kept as given.

    Raises
    ------
    TaskError
        A folder that holds no known task's file (the message names the
        layout it expected).
    """
    out: list[str] = []
    for entry in entries:
        p = Path(entry).expanduser()
        if "=" in entry or not p.is_dir():
            out.append(entry)
            continue
        names = available_tasks(include_paths)
        found = layout_tasks(p, names, lambda t: split or get_task(t, include_paths).split)
        if not found:
            raise TaskError(f"tasks: the folder {entry} holds no question file of a known task; expected the "
                            f"commonsense layout, e.g. {layout_hint(p, 'obqa', split or 'test')}, or give "
                            f"NAME={entry} for a folder of one task's files")
        out += [f"{t}={f}" for t, f in found.items()]
    return out


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
        if p.is_dir() and is_layout_root(p):  # the top of the commonsense layout: the task's own file in it
            want = own_split or split or spec.split
            found = layout_file(p, spec.name, want)
            if found is None:
                raise TaskError(f"task {name!r}: {where} is a folder in the commonsense layout without "
                                f"{spec.name}'s file of the split {want!r}; expected {layout_hint(p, spec.name, want)}")
            p = found
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



__all__ = ["TaskSpec", "TaskError", "TaskCountWarning", "available_tasks", "registry", "get_task", "resolve_task",
           "expand_task_folders",
           "load_task_questions", "task_corpus", "split_inline_choices", "spec_from_dict", "spec_key",
           "hub_load_args", "check_limit", "normalize_name", "PACKAGE_DIR", "TASKS_DIR", "PARQUET_REVISION", "KINDS"]
