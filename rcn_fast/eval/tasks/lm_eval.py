"""Task YAMLs in lm-evaluation-harness's own format (``--include_path``).

The multiple-choice subset of that format is read::

    task: my_arc
    dataset_path: allenai/ai2_arc      # a hub dataset (the hub loader of rcn_fast.eval.tasks.sources),
    dataset_name: ARC-Easy             #   or a local .jsonl file (relative to the YAML)
    dataset_kwargs: {}                 # more load_dataset arguments (data_files for dataset_path: json)
    output_type: multiple_choice
    test_split: test                   # test_split if given, else validation_split (as lm-eval)
    validation_split: validation
    doc_to_text: "Question: {{question}}\\nAnswer:"
    doc_to_choice: "{{choices.text}}"
    doc_to_target: "{{choices.label.index(answerKey)}}"

``doc_to_text``, ``doc_to_choice`` and ``doc_to_target`` are what lm-eval
takes: the name of a record field, or a Jinja template over the record's
fields (rendered through the template door :mod:`rcn_fast._templates`:
only what real lm-eval and chat templates use, undefined names an error,
budgets of steps, time and sizes, in a worker process under kernel limits; the bounded YAML loader of :mod:`rcn_fast.eval.tasks.limits`
reads the files; a ``doc_to_choice`` template renders a Python list literal, read
with :func:`ast.literal_eval`), ``doc_to_choice`` also a list of the
choices, ``doc_to_target`` also the answer's index. A target that renders
to digits is the answer's index, another string must be one of the
choices. ``include:`` merges another YAML under this one, as lm-eval does.

The rendered ``doc_to_text`` is the question; a leading ``Question:`` /
``Q:`` and a trailing ``Answer:`` / ``A:`` label are dropped, because the
pipelines write their own prompts (as their papers do) and lm-eval's
prompt keys (``target_delimiter``, ``fewshot_*``, ``description``,
``metric_list`` ...) are not used. A record's ``id`` field is its id when
it has one (else ``<task>-<split>-<row>``).

Files this subset cannot read are skipped with a
:class:`TaskSkippedWarning` naming the file and why: another
``output_type`` (``generate_until``, ``loglikelihood`` ...), group files
(``task:`` a list, or ``group:`` without ``task:``), or a ``!function``
value (Python code, which rcn_fast never runs from a file).
"""

from __future__ import annotations

import ast
import re
import warnings
from pathlib import Path
from typing import Any, Iterable

import yaml

from rcn_fast._file_data import confined
from rcn_fast._files import read_text
from rcn_fast._jsonl import parse_json_lines
from rcn_fast._templates import TemplateRenderError, render_task_template
from rcn_fast.eval.tasks.limits import BoundedLoader, TaskLimitError, load_yaml
from rcn_fast.eval.tasks.sources import dataset_rows, take_n
from rcn_fast.eval.tasks.spec import (
    MAX_TASK_FILE_BYTES,
    TaskCountWarning,
    TaskError,
    TaskSpec,
    own_data_files,
    own_file,
    read_task_yaml,
    task_root,
    written_path,
)

#: Keys of lm-eval's format that change which questions are read: a file using them is skipped.
_UNSUPPORTED = ("process_docs", "doc_to_image", "doc_to_audio", "custom_dataset", "class")
_QUESTION_LABEL = re.compile(r"^\s*(?:Question|Q)\s*:\s*", re.IGNORECASE)
_ANSWER_LABEL = re.compile(r"\s*(?:Answer|A)\s*:\s*$", re.IGNORECASE)


class TaskSkippedWarning(TaskCountWarning):
    """A task file in ``--include_path`` that is not read (the message says
    which and why)."""


class _Function:
    """A ``!function module.name`` value: recorded, never imported."""

    def __init__(self, target: str) -> None:
        self.target = target


class _Loader(BoundedLoader):
    """The bounded ``yaml.SafeLoader`` (:mod:`rcn_fast.eval.tasks.limits`) reading lm-eval's ``!function`` tag as a
    marker."""


_Loader.add_constructor("!function", lambda loader, node: _Function(str(loader.construct_scalar(node))))


def _load(path: Path, seen: tuple[Path, ...] = ()) -> dict[str, Any]:
    if path in seen or len(seen) > 16:
        raise TaskError(f"task file {path}: include cycle ({' -> '.join(map(str, seen + (path,)))})")
    data = read_task_yaml(path, _Loader, seen[-1] if seen else None)
    inc = data.pop("include", None)
    if isinstance(inc, str):
        data = {**_load(Path(written_path(path, "include", inc)), seen + (path,)), **data}
    return data


#: Keys only lm-eval's format has (a file with one of them and no rcn_fast ``name`` is read as lm-eval's).
_LM_EVAL_KEYS = ("task", "group", "tag", "dataset_path", "output_type", "doc_to_text", "doc_to_choice",
                 "doc_to_target", "test_split", "validation_split")


def is_lm_eval_file(path: Path) -> bool:
    """Whether a YAML file is in lm-eval's format (one of its keys, or a
    ``!function`` value, and no rcn_fast ``name``; template fragments
    included); read leniently (``!function`` tags are markers)."""
    try:
        text = read_text(path.parent, path.name, what=f"task file {path}", limit=MAX_TASK_FILE_BYTES)
        data = load_yaml(text, _Loader)
    except (OSError, ValueError, yaml.YAMLError):  # the task file reader reports it, naming the file
        return False
    return isinstance(data, dict) and "name" not in data and (
        any(k in data for k in _LM_EVAL_KEYS) or any(isinstance(v, _Function) for v in data.values()))


def skip_reason(data: dict[str, Any]) -> str | None:
    """Why a (merged) lm-eval task mapping cannot be read, or None."""
    task = data.get("task")
    if not isinstance(task, str) or not task:
        return "a group file (its 'task' is a list or missing); list its tasks' own files instead"
    funcs = sorted(k for k, v in data.items() if isinstance(v, _Function))
    if funcs:
        return f"{funcs} use !function (Python code, which rcn_fast never runs from a file)"
    used = [k for k in _UNSUPPORTED if data.get(k) is not None]
    if used:
        return f"{used} are not supported (only the multiple-choice subset of lm-eval's format is read)"
    out = data.get("output_type", "multiple_choice" if "doc_to_choice" in data else "generate_until")
    if out != "multiple_choice":
        return f"output_type {out!r} (only multiple_choice tasks are read)"
    missing = [k for k in ("dataset_path", "doc_to_text", "doc_to_choice", "doc_to_target") if data.get(k) is None]
    if missing:
        return f"missing {missing}"
    if not (data.get("test_split") or data.get("validation_split")):
        return "no test_split or validation_split"
    return None


def scan(path: Path) -> str | None:
    """The task name of an lm-eval YAML, or None (with a
    :class:`TaskSkippedWarning`) for a file that cannot be read."""
    data = _load(path)
    if "task" not in data and "group" not in data:
        return None  # a template fragment (included by others)
    why = skip_reason(data)
    if why is not None:
        warnings.warn(TaskSkippedWarning(f"include_path: skipped {path}: {why}"), stacklevel=2)
        return None
    return str(data["task"])


def spec_from_file(path: Path) -> TaskSpec:
    """The :class:`TaskSpec` of an lm-eval multiple-choice YAML."""
    from rcn_fast._paths import UnsafePathError, check_name

    data = _load(path)
    why = skip_reason(data)
    if why is not None:
        raise TaskError(f"task file {path}: cannot be read: {why}")
    try:
        name = check_name(str(data["task"]), "task")
    except UnsafePathError as exc:
        raise TaskError(f"task file {path}: {exc}") from None
    dk = data.get("dataset_kwargs") or {}
    if not isinstance(dk, dict):
        raise TaskError(f"task file {path}: dataset_kwargs must be a mapping, got {type(dk).__name__}")
    dk = dict(dk)
    revision = dk.pop("revision", None)
    if dk.get("data_files") is not None:  # its data lies in its own folder (issue 53): checked, made absolute
        dk["data_files"] = own_data_files(path.parent, dk["data_files"], f"task file {path}")
    src = str(data["dataset_path"])
    local = Path(own_file(path.parent, src, f"task file {path}: dataset_path")) \
        if src.endswith((".jsonl", ".json")) else None
    if local is not None and not local.is_file():
        raise TaskError(f"task file {path}: dataset_path {src} does not exist (looked for {local})")
    templates = {k: data[k] for k in ("doc_to_text", "doc_to_choice", "doc_to_target")}
    return TaskSpec(name=name, kind="multiple_choice", group="lm-eval", dataset=None if local else src,
                    local=str(local) if local else None,
                    config=None if data.get("dataset_name") is None else str(data["dataset_name"]),
                    split=str(data.get("test_split") or data.get("validation_split")),
                    revision=None if revision is None else str(revision), dataset_kwargs=dk,
                    description=str(data.get("description") or ""), lm_eval=templates, source=str(path))


# ------------------------------------------------------------------ records
def _value(spec: Any, doc: dict[str, Any], key: str) -> Any:
    """lm-eval's reading of a doc_to_* setting: a field name, else a template
    (rendered through the bounded template door, :mod:`rcn_fast._templates`)."""
    if isinstance(spec, str):
        if spec in doc:
            return doc[spec]
        try:
            return render_task_template(spec, doc)
        except TaskLimitError as exc:
            raise TaskLimitError(f"{key}: {exc}") from None
    return spec


def convert_doc(doc: dict[str, Any], templates: dict[str, Any], qid: str, where: str) -> Any:
    """One record -> :class:`~rcn_fast.data.MCQuestion` (``where`` names it in errors).

    Raises
    ------
    rcn_fast.data.DataFormatError
        A template error or a value that is not a question (naming ``where``).
    rcn_fast.eval.tasks.limits.TaskLimitError
        A template over the render limits (the caller names the task file).
    """
    from rcn_fast.data import DataFormatError, MCQuestion

    try:
        raw = _value(templates["doc_to_text"], doc, "doc_to_text")
        choices = _value(templates["doc_to_choice"], doc, "doc_to_choice")
        if isinstance(templates["doc_to_choice"], str) and templates["doc_to_choice"] not in doc:
            choices = ast.literal_eval(choices)
        elif isinstance(choices, dict):
            choices = list(choices.values())
        target = _value(templates["doc_to_target"], doc, "doc_to_target")
    except TaskLimitError:
        raise
    except TemplateRenderError as exc:
        raise DataFormatError(f"{where}: template error: {exc}") from None
    except (ValueError, SyntaxError, RecursionError, MemoryError):
        raise DataFormatError(f"{where}: doc_to_choice did not render a list literal") from None
    if not isinstance(choices, (list, tuple)) or len(choices) < 2 or not all(
            isinstance(c, (str, int, float)) and not isinstance(c, bool) for c in choices):
        raise DataFormatError(f"{where}: doc_to_choice gave {choices!r}; expected a list of at least two choices")
    choices = [str(c) for c in choices]
    if isinstance(target, str) and target.strip().isdigit():
        target = int(target.strip())
    if isinstance(target, str):
        if target not in choices:
            raise DataFormatError(f"{where}: doc_to_target gave {target!r}, which is not one of the choices {choices}")
        target = choices.index(target)
    if isinstance(target, bool) or not isinstance(target, int) or not 0 <= target < len(choices):
        raise DataFormatError(f"{where}: doc_to_target gave {target!r}; expected a choice or its index "
                              f"0..{len(choices) - 1} (several gold answers are not supported)")
    text = _ANSWER_LABEL.sub("", _QUESTION_LABEL.sub("", str(raw))).strip()
    return MCQuestion(id=qid, question=text, choices=choices, answer=target, meta={"prompt": str(raw)})


def _jsonl_rows(path: Path) -> Iterable[tuple[str, dict[str, Any]]]:
    from rcn_fast.data import DataFormatError
    from rcn_fast.data.loaders import iter_lines

    rows = parse_json_lines(iter_lines(path), lambda n, why: f"{path}:{n}: not valid JSON ({why})",
                            error=DataFormatError,
                            not_object=lambda n, kind: f"{path}:{n}: expected a JSON object, got {kind}")
    for n, rec in rows:
        yield f"{path}:{n}", rec


def load_questions(spec: TaskSpec, limit: int | float | None, split: str) -> tuple[list[Any], int, str]:
    """The questions of an lm-eval task: (questions, records in the split, where).

    A local JSON-lines file is read whole (its ``split`` is the file); a
    hub dataset, ``save_to_disk`` folder or repository copy goes through
    the hub loader of :mod:`rcn_fast.eval.tasks.sources`.
    """
    templates = dict(spec.lm_eval or {})
    if spec.local:
        path = Path(spec.local)
        with confined(task_root(spec, path)):  # beneath the task file's folder (files door)
            rows = list(_jsonl_rows(path))
        total = len(rows)
        rows = rows[:take_n(total, limit)]
        where = str(path)
    else:
        ds, where = dataset_rows(spec, split)
        total = len(ds)
        n = take_n(total, limit)
        picked = ds.select(range(n)) if n < total else ds
        rows = [(f"{where} row {i}", dict(rec)) for i, rec in enumerate(picked)]
    out = []
    for row, (at, doc) in enumerate(rows):
        rid = doc.get("id")
        qid = str(rid) if isinstance(rid, (str, int)) and not isinstance(rid, bool) and str(rid) else \
            f"{spec.name}-{split}-{row}"
        try:
            out.append(convert_doc(doc, templates, qid, at))
        except TaskLimitError as exc:  # one message naming the task file (and the record)
            raise TaskError(f"task file {spec.source}: {exc} (rendering {at})") from None
    return out, total, where


__all__ = ["TaskSkippedWarning", "is_lm_eval_file", "scan", "spec_from_file", "convert_doc", "load_questions",
           "skip_reason"]
