"""Planning an evaluation: tasks x pipelines x seeds -> :class:`Unit` s.

:func:`plan` resolves and checks everything before anything heavy loads
(tasks, pipelines and their settings, including a pipeline class's own
``check_config(config)``), loads each task's questions once through its
task object (:mod:`rcn_fast.eval.metrics`) and opens every unit's
checkpoint (:mod:`rcn_fast.eval.run.checkpoint`). What a unit needs is resolved
here once -- the corpus (``--corpus`` or the task's own), the example KB,
whether its pipeline needs an LLM and what it retrieves from
(:class:`Needs`) -- and the executors (:mod:`rcn_fast.eval.run.executors`,
:mod:`rcn_fast.eval.run.ray_executor`) and the reports read it from the unit.

The checkpoint key covers the task (its data files' content too), the
settings, the LLM (unless the class's spec says ``needs_llm=False``), the
corpus / KB contents and whatever the spec's ``result_key(config)`` adds
(SEPTA: a fingerprint of its checkpoint). Every record read back is held to
the check of a fresh one (:func:`record_check`).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rcn_fast._paths import child_path
from rcn_fast.eval.run.checkpoint import Checkpoint, run_key
from rcn_fast.eval.config import EvalConfig, EvalError
from rcn_fast.eval.run.loading import corpus_key, corpus_problem, is_store, log, model_key, sha_file
from rcn_fast.eval.pipeline_needs import (
    is_open_capable,
    may_use_retriever,
    needs_llm,
    pipeline_config_class,
    pipeline_registry,
    retriever_kind,
    scores_choices,
    spec_of,
    split_pipeline_args,
)
from rcn_fast.eval.metrics import Task, make_task
from rcn_fast.eval.run.permute import permuted_questions, skip_reason
from rcn_fast.eval.run.shards import shard_of
from rcn_fast.eval.tasks.sources import LOCAL_DATA_HINT, hub_access, needs_hub
from rcn_fast.eval.tasks.catalog import (TaskError, TaskSpec, expand_task_folders, resolve_task, spec_key,
                                         task_corpus)


@dataclass(frozen=True)
class Needs:
    """What a unit's pipeline needs, read once from its class.

    Attributes
    ----------
    llm : bool
        It answers with the LLM (False: a trained pipeline such as SEPTA).
    retriever : {"none", "corpus", "optional_corpus", "example_kb"}
        What it retrieves from (see :func:`rcn_fast.eval.pipeline_needs.retriever_kind`).
    scores : bool
        Its choice predictions carry their log-probs (``spec.scores_choices``):
        a record without them is refused, fresh or read back.
    """

    llm: bool
    retriever: str
    scores: bool = True

    @property
    def corpus(self) -> bool:
        """It may use the corpus retriever."""
        return self.retriever in ("corpus", "optional_corpus")

    @property
    def example_kb(self) -> bool:
        """It retrieves from an example knowledge base (``--kb``)."""
        return self.retriever == "example_kb"

    @classmethod
    def of(cls, pipeline_cls: Any) -> "Needs":
        return cls(llm=needs_llm(pipeline_cls), retriever=retriever_kind(pipeline_cls),
                   scores=scores_choices(pipeline_cls))


@dataclass
class Unit:
    """One task x pipeline x seed, planned: everything it needs is resolved.

    ``corpus`` is the corpus its pipeline retrieves from (None: none is
    used), ``kb`` the example KB file, ``scorer`` the task object that
    scores its predictions, ``entry`` the ``--tasks`` entry as given, ``label`` its name in progress lines
    (:attr:`display`); ``questions`` carry the gold answers (the executor hands the pipeline
    :meth:`Task.unlabeled` copies).
    """

    task: TaskSpec
    pipeline: str
    seed: int
    settings: dict[str, Any]
    config: dict[str, Any]
    checkpoint: Checkpoint
    questions: list[Any]
    pending: list[Any] = field(default_factory=list)
    failures: list[dict[str, Any]] = field(default_factory=list)
    needs: Needs = Needs(llm=True, retriever="none")
    corpus: str | None = None
    kb: str | None = None
    scorer: Task | None = None
    entry: str = ""
    label: str = ""  # what progress lines call the run (a --paper row: "RECONNECT (N=5)"); "" = the pipeline
    permutation: int = 0  # --permute-choices: the shift of its questions' choices (0: the plain order)

    @property
    def display(self) -> str:
        """The run's name in progress lines: its ``label``, else its pipeline
        (and the shift of a permuted unit's choices)."""
        return (self.label or self.pipeline) + (f" (choices shifted {self.permutation})" if self.permutation else "")

    def reopen(self) -> None:
        """Read the checkpoint again (after other processes appended to it:
        Ray workers, shards) and recompute the pending questions."""
        ck = self.checkpoint
        self.checkpoint = Checkpoint(ck.base_path, ck.meta, check=ck.check, root=ck.root)
        done = self.checkpoint.done()
        self.pending = [q for q in self.questions if q.id not in done]


@dataclass
class Plan:
    """What :func:`plan` returns: the tasks (in the order given), their
    questions (gold included) and the units."""

    tasks: list[TaskSpec]
    questions: dict[str, list[Any]]
    units: list[Unit]

    def __iter__(self) -> Any:  # specs, questions, units = plan(cfg, out)
        return iter((self.tasks, self.questions, self.units))

    @property
    def todo(self) -> list[Unit]:
        return [u for u in self.units if u.pending]


def _check_resources(cfg: EvalConfig, spec: TaskSpec, p: str, cls: Any, corpus: str | None) -> None:
    kind = retriever_kind(cls)
    if kind == "example_kb":
        if cfg.kb is None:
            raise EvalError(f"pipeline {p!r} needs an example knowledge base: pass --kb FILE (build one "
                            "with `python -m rcn_fast.kb build-silver --train FILE --llm SPEC --out FILE`)")
        if not Path(cfg.kb).is_file():
            raise EvalError(f"kb: {cfg.kb} does not exist")
    elif kind == "corpus" and corpus is None:
        raise EvalError(f"pipeline {p!r} needs a knowledge corpus for task {spec.name!r}: pass --corpus "
                        f"(a store folder from `python -m rcn_fast.corpus build`, or a .jsonl of passages)")
    if corpus is not None and may_use_retriever(cls) and (
            why := corpus_problem(corpus, cfg.corpus_text_field)) is not None:
        raise EvalError(f"corpus: {why}")



def plan(cfg: EvalConfig, out: Path) -> Plan:
    """Resolve and check everything; open the checkpoints (nothing heavy loads).

    Returns
    -------
    Plan
        Unpacks as ``specs, questions, units``.

    Raises
    ------
    EvalError
        An unknown task or pipeline, a missing corpus or KB, bad settings,
        unreadable or duplicate questions.
    """
    registry = pipeline_registry()
    unknown = [p for p in cfg.pipelines if p not in registry]
    if unknown:
        raise EvalError(f"unknown pipeline(s) {unknown}; available pipelines: {', '.join(sorted(registry))}")
    try:
        entries = expand_task_folders(cfg.tasks, split=cfg.split, include_paths=cfg.include_path)
        specs = [resolve_task(t, split=cfg.split, include_paths=cfg.include_path) for t in entries]
    except TaskError as exc:
        raise EvalError(str(exc)) from None
    names = [s.name for s in specs]
    if len(set(names)) != len(names):
        raise EvalError(f"tasks: two tasks share a name ({names}); rename a local file")
    user_args = split_pipeline_args(cfg.pipeline_args, cfg.pipelines)
    llm_key = model_key(cfg.model, cfg.model_args) if any(needs_llm(registry[p]) for p in cfg.pipelines) else None
    questions: dict[str, list[Any]] = {}
    units: list[Unit] = []
    for spec, entry in zip(specs, entries):
        corpus = cfg.corpus or task_corpus(spec)  # resolved once per task; each unit keeps it
        task = make_task(spec)
        for p in cfg.pipelines:
            cls = registry[p]
            if task.open_domain and not is_open_capable(cls):
                able = sorted(n for n, c in registry.items() if is_open_capable(c))
                raise EvalError(f"pipeline {p!r} answers multiple-choice questions only; task {spec.name!r} is "
                                f"open-domain (pipelines that answer open questions: {', '.join(able) or 'none'})")
            _check_resources(cfg, spec, p, cls, corpus)
        hub = needs_hub(spec)
        if hub and hub_access()[0] == "unreachable":  # one probe per run, not the hub client's retries per task
            raise EvalError(f"task {spec.name!r}: {spec.where} is on the Hugging Face hub, which cannot be reached "
                            f"({hub_access()[1]}); {LOCAL_DATA_HINT}")
        try:
            qs = task.load_questions(limit=cfg.limit)
        except (ValueError, TypeError, FileNotFoundError, KeyError) as exc:
            raise EvalError(f"task {spec.name!r}: {exc}") from None
        except Exception as exc:  # e.g. the hub cannot be reached
            raise EvalError(f"task {spec.name!r}: cannot load {spec.where}: "
                            f"{type(exc).__name__}: {exc}" + (f"; {LOCAL_DATA_HINT}" if hub else "")) from None
        if not qs:
            raise EvalError(f"task {spec.name!r}: no questions")
        ids = [q.id for q in qs]
        if len(set(ids)) != len(ids):
            dup = sorted({i for i in ids if ids.count(i) > 1})[:5]
            raise EvalError(f"task {spec.name!r}: duplicate question ids {dup} (ids key the cache and checkpoints)")
        questions[spec.name] = qs
        tkey = spec_key(spec)
        orders = {0: qs}
        if cfg.permute_choices > 1 and skip_reason(spec) is None:  # a diagnostic: each order is a unit of its own
            orders.update(permuted_questions(qs, cfg.permute_choices))
        for p in cfg.pipelines:
            for shift, oqs in orders.items():
                units.extend(_units_of(cfg, out, spec, task, p, registry[p], oqs, tkey, corpus,
                                       {**spec.pipeline_args.get(p, {}), **user_args[p]}, llm_key, entry, shift))
    return Plan(specs, questions, units)


def _units_of(cfg: EvalConfig, out: Path, spec: TaskSpec, task: Task, p: str, cls: Any, qs: list[Any], tkey: str,
              corpus: str | None, settings: dict[str, Any], llm_key: Any, entry: str,
              permutation: int = 0) -> list[Unit]:
    """The units of one task x pipeline, one per seed, with their checkpoints open
    (``permutation``: the shift of ``qs``' choices, keyed and named apart)."""
    from rcn_fast.pipelines.config import config_to_dict

    ccls = pipeline_config_class(p)
    needs = Needs.of(cls)
    uses_corpus, uses_kb = needs.corpus, needs.example_kb
    units = []
    for seed in cfg.seeds:
        try:
            conf = ccls.from_dict({**settings, "seed": seed})
        except (TypeError, ValueError) as exc:
            raise EvalError(f"pipeline {p!r} settings: {exc}") from None
        cdict = config_to_dict(conf)
        # the pipeline's own checks (e.g. a trained checkpoint's files) and what else keys its answers
        pipeline_hook(cls, "check_config", p, conf)
        extra = pipeline_hook(cls, "result_key", p, conf)
        key = run_key({
            "task": tkey, "pipeline": p, "config": cdict,
            "model": llm_key if needs.llm else None, "model_args": cfg.model_args if needs.llm else None,
            "corpus": corpus_key(corpus) if uses_corpus else None,
            "encoder": [cfg.encoder, cfg.encoder_args] if (uses_corpus or uses_kb) else None,
            "kb": {"file": sha_file(Path(cfg.kb))} if uses_kb and cfg.kb else None,
            **({"pipeline_key": extra} if extra is not None else {}),
            **({"permutation": permutation} if permutation else {}),
        })
        perm = f"perm{permutation}-" if permutation else ""
        path = child_path(out, "checkpoints", spec.name, p, f"seed{seed}-{perm}{key}.jsonl")
        ck = Checkpoint(path, shard=(cfg.shard_id, cfg.num_shards) if cfg.sharded else None, root=out,
                        check=record_check(task, qs, seed, scores=needs.scores), meta={
                        "task": spec.name, "pipeline": p, "seed": seed, "key": key, "config": cdict,
                        "model": llm_key if needs.llm else None,
                        **({"pipeline_key": extra} if extra is not None else {}),
                        **({"permutation": permutation} if permutation else {})})
        done = ck.done()
        mine = qs if not cfg.sharded else [q for q in qs if shard_of(q.id, cfg.num_shards) == cfg.shard_id]
        units.append(Unit(task=spec, pipeline=p, seed=seed, settings={**settings, "seed": seed}, config=cdict,
                          checkpoint=ck, questions=mine, pending=[q for q in mine if q.id not in done],
                          needs=needs, corpus=corpus if uses_corpus else None,
                          kb=cfg.kb if uses_kb else None, scorer=task, entry=entry, permutation=permutation))
    return units


def record_check(task: Task, questions: list[Any], seed: int, *, scores: bool = True) -> Any:
    """The check of every record read back from a unit's checkpoint: the
    task's own check of a fresh record (:meth:`Task.check_record`) against
    the question it answers (``scores``: the pipeline scores its choices,
    so empty log-probs are refused); records of questions not in this run
    (another ``--limit``) are left as they are."""
    by_id = {q.id: q for q in questions}

    def check(record: dict[str, Any]) -> None:
        q = by_id.get(str(record.get("id")))
        if q is not None:
            task.check_record(q, record, seed, scores=scores)

    return check


def pipeline_hook(cls: Any, name: str, pipeline: str, conf: Any) -> Any:
    """Call the class's declared ``spec.<name>(config)`` (``check_config`` or
    ``result_key``) when it has one; its user-facing failures (a missing
    checkpoint, a bad setting) become one EvalError."""
    hook = getattr(spec_of(cls), name)
    if hook is None:
        return None
    try:
        return hook(conf)
    except (ValueError, TypeError, OSError, ImportError) as exc:
        raise EvalError(f"pipeline {pipeline!r}: {exc}") from None


def warn_corpus_leaks(cfg: EvalConfig, out: Path, questions: dict[str, list[Any]], units: list[Unit]) -> None:
    """Warn when the user's corpus holds evaluated questions (report only; cached per corpus and questions)."""
    if not cfg.corpus or not cfg.leak_check or not Path(cfg.corpus).exists():
        return
    used = {u.task.name for u in units if u.needs.corpus}
    mc = {t: qs for t, qs in questions.items() if t in used and qs and hasattr(qs[0], "choices")}
    if not mc:
        return
    from rcn_fast.corpus.leakage import cached_corpus_leak_summary, leak_warning

    try:
        summary = cached_corpus_leak_summary(cfg.corpus, mc, out / "leakage")
    except (OSError, ValueError) as exc:
        log(f"leakage check skipped: {exc}")
        return
    msg = leak_warning(cfg.corpus, summary)
    if msg:
        print(f"rcn_fast.eval: warning: {msg}", file=sys.stderr)


def default_models_needed(cfg: EvalConfig, todo: list[Unit], *, llm: Any, encoder: Any, retriever: Any,
                          kb_retriever: Any) -> tuple[bool, bool]:
    """Whether the pending units will load the default LLM / the default encoder (not given as objects)."""
    from rcn_fast.eval.config import DEFAULT_MODEL

    default_llm = llm is None and isinstance(cfg.model, str) and cfg.model == DEFAULT_MODEL and any(
        u.needs.llm for u in todo)
    default_encoder = encoder is None and retriever is None and cfg.encoder is None and any(
        (u.needs.example_kb and kb_retriever is None) or (u.corpus is not None and not is_store(u.corpus))
        for u in todo)
    return default_llm, default_encoder


__all__ = ["plan", "Plan", "Unit", "Needs", "pipeline_hook", "record_check", "warn_corpus_leaks",
           "default_models_needed"]
