"""Where a task's rows come from: the ``--limit`` reading, the hub's
``load_dataset`` call, a ``save_to_disk`` folder or a copy of a dataset
repository (shared by rcn_fast's task files and lm-evaluation-harness's,
:mod:`rcn_fast.eval.tasks.lm_eval`); whether the Hugging Face hub can be
reached (:func:`hub_access`, one probe per process) and the benchmark files
of a folder in the commonsense layout (:func:`layout_file`)."""

from __future__ import annotations

import math
import os
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Callable, Iterable

from rcn_fast.data.loaders import file_split
from rcn_fast.eval.tasks.spec import PARQUET_REVISION, TaskError, TaskSpec, local_data_files, local_dataset_folder


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


def take_n(total: int, limit: int | float | None) -> int:
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


def is_saved(p: Path) -> bool:
    return (p / "dataset_info.json").is_file() or (p / "dataset_dict.json").is_file()


def split_files(folder: Path, split: str | None) -> list[Path]:
    """The ``*<split>*.jsonl`` files of a folder, listed from its descriptor (files door)."""
    from rcn_fast._files import listdir

    want = file_split(split)
    return [folder / n for n in listdir(folder) if n.endswith(".jsonl") and not n.startswith(".")
            and want in n[:-len(".jsonl")]]


def dataset_rows(spec: TaskSpec, split: str) -> tuple[Any, str]:
    """The rows of a dataset task: a ``datasets.Dataset`` and a name for messages."""
    from rcn_fast._arrays import require

    datasets = require("datasets", 'pip install datasets  (or pip install "rcn_fast[eval]")')
    p = Path(str(spec.dataset))  # ~ is not expanded (a task file's data lies in its own folder)
    if p.is_dir() and is_saved(p):  # a save_to_disk folder
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


def needs_hub(spec: TaskSpec) -> bool:
    """Whether the task's questions come from the Hugging Face hub (a dataset
    id, not a local folder, file or pinned URL, nor a loader such as
    ``dataset: json`` reading local ``dataset_kwargs.data_files``)."""
    return (bool(spec.dataset) and not spec.local and not spec.url and local_dataset_folder(spec) is None
            and not local_data_files(spec))


#: How to evaluate a task without the hub (the end of every message about an unreachable hub).
LOCAL_DATA_HINT = ("give the task's files instead: --tasks NAME=FILE (a question file of the split the task "
                   "evaluates, in the CommonsenseQA JSON-lines layout), or --tasks DIR / NAME=DIR (a folder "
                   "holding <task>/<task>-{train,dev,test}.jsonl, the commonsense layout); datasets already in "
                   "the Hugging Face cache load offline with HF_HUB_OFFLINE=1")
HUB_PROBE_TIMEOUT = 5.0
_HUB_STATUS: dict[str, tuple[str, str]] = {}


def hub_access(timeout: float = HUB_PROBE_TIMEOUT) -> tuple[str, str]:
    """Whether the Hugging Face hub can be reached: ``("online", "")``,
    ``("offline", why)`` under ``HF_HUB_OFFLINE=1`` (no network call; a
    dataset in the local cache still loads) or ``("unreachable", why)``.

    One HTTP request to the endpoint (``HF_ENDPOINT``, default
    ``https://huggingface.co``) with no retry, at most ``timeout``
    seconds; any HTTP answer counts as reachable. The answer is kept per
    process and endpoint, so a run asks once, not once per task (the
    hub's own loaders retry each download several times).
    """
    from rcn_fast.model_files import hub_offline

    if hub_offline():
        return "offline", "HF_HUB_OFFLINE is set"
    endpoint = (os.environ.get("HF_ENDPOINT") or "https://huggingface.co").rstrip("/")
    if endpoint not in _HUB_STATUS:
        try:
            urllib.request.urlopen(urllib.request.Request(endpoint + "/api/datasets?limit=1", method="HEAD"),
                                   timeout=timeout).close()
            _HUB_STATUS[endpoint] = ("online", "")
        except urllib.error.HTTPError:  # the server answered: reachable
            _HUB_STATUS[endpoint] = ("online", "")
        except (OSError, ValueError) as exc:  # URLError, timeouts, refused connections, a malformed endpoint
            reason = getattr(exc, "reason", exc)
            _HUB_STATUS[endpoint] = ("unreachable", f"{endpoint}: {type(reason).__name__}: {reason}")
    return _HUB_STATUS[endpoint]


#: Folder names of the commonsense layout that differ from the task's name.
LAYOUT_FOLDERS = {"winogrande": ("winogrande", "wg"), "storycloze": ("storycloze", "sct"),
                  "riddlesense": ("riddlesense", "rs"), "numersense": ("numersense", "ns")}


def layout_file(folder: str | os.PathLike[str], task: str, split: str | None) -> Path | None:
    """The question file of ``task``'s ``split`` in a folder of the
    commonsense layout: ``<folder>/<task>/<task>-<split>.jsonl`` (or the
    task's folder itself, ``<folder>/<task>-<split>.jsonl``); ``validation``
    is spelled ``dev`` there; WinoGrande's folder may be ``wg``. None when
    there is no such file."""
    root = Path(folder).expanduser()
    spellings = dict.fromkeys([file_split(split), split or "dev"])
    for name in LAYOUT_FOLDERS.get(task, (task,)):
        for where in (root / name, root):
            for sp in spellings:
                f = where / f"{name}-{sp}.jsonl"
                if f.is_file():
                    return f
    return None


def layout_tasks(folder: str | os.PathLike[str], tasks: Iterable[str],
                 split_of: Callable[[str], str | None]) -> dict[str, Path]:
    """``{task: question file}`` of each of ``tasks`` whose file of the split
    ``split_of(task)`` is in ``folder`` in the commonsense layout
    (:func:`layout_file`), in the order of ``tasks``."""
    return {t: f for t in tasks if (f := layout_file(folder, t, split_of(t))) is not None}


def is_layout_root(folder: str | os.PathLike[str]) -> bool:
    """Whether ``folder`` is the top of a commonsense layout: a sub-folder
    ``<name>/`` holding ``<name>-<split>.jsonl`` files (``obqa/obqa-test.jsonl``)."""
    root = Path(folder).expanduser()
    return root.is_dir() and any(d.is_dir() and any(d.glob(f"{d.name}-*.jsonl")) for d in root.iterdir())


def layout_hint(folder: str | os.PathLike[str], task: str, split: str | None) -> str:
    """How the commonsense layout names ``task``'s file of ``split`` under ``folder``."""
    name = LAYOUT_FOLDERS.get(task, (task,))[0]
    return f"{Path(folder) / name / name}-{file_split(split)}.jsonl (<task>/<task>-<split>.jsonl)"


__all__ = ["check_limit", "take_n", "hub_load_args", "is_saved", "split_files", "dataset_rows", "needs_hub",
           "hub_access", "layout_file", "layout_tasks", "is_layout_root", "layout_hint", "LOCAL_DATA_HINT",
           "LAYOUT_FOLDERS"]
