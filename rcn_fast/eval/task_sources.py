"""Where a task's rows come from: the ``--limit`` reading, the hub's
``load_dataset`` call, a ``save_to_disk`` folder or a copy of a dataset
repository (shared by rcn_fast's task files and lm-evaluation-harness's,
:mod:`rcn_fast.eval.lm_eval_tasks`)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from rcn_fast.eval.task_spec import PARQUET_REVISION, TaskError, TaskSpec


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
    want = split or "dev"
    want = {"validation": "dev", "valid": "dev", "val": "dev"}.get(want, want)
    return sorted(p for p in folder.glob("*.jsonl") if want in p.stem)


def dataset_rows(spec: TaskSpec, split: str) -> tuple[Any, str]:
    """The rows of a dataset task: a ``datasets.Dataset`` and a name for messages."""
    from rcn_fast._arrays import require

    datasets = require("datasets", 'pip install datasets  (or pip install "rcn_fast[eval]")')
    p = Path(str(spec.dataset)).expanduser()
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


__all__ = ["check_limit", "take_n", "hub_load_args", "is_saved", "split_files", "dataset_rows"]
