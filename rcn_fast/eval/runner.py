"""Run tasks x pipelines x seeds, durably, and collect the records.

:func:`evaluate` is the whole command without the argument parsing:

1. resolve tasks (registry names, local files) and pipelines (looked up in
   :data:`rcn_fast.pipelines.PIPELINES` at run time) and check every
   setting before anything heavy loads (including a pipeline class's own
   ``check_config(config)``, e.g. SEPTA's checkpoint files);
2. for each task x pipeline x seed, open its checkpoint (see
   :mod:`rcn_fast.eval.checkpoint`) and find the questions not done yet;
   the key covers the task, the settings, the LLM (unless the class says
   ``needs_llm = False``), the corpus / KB contents and whatever the class's
   ``result_key(config)`` adds (SEPTA: a fingerprint of its checkpoint);
3. only when some are left, load the LLM (behind the sqlite call cache in
   the output folder), the encoder, the corpus retriever and the ZEBRA KB
   -- each once, and only when a pending run needs it (a pipeline with
   ``needs_llm = False`` loads no LLM);
4. run the pending questions batch by batch, appending each batch to its
   checkpoint (a failing question is recorded as a failure and reported,
   or stops the run with ``strict``), with a progress bar per stage
   (:class:`StageBars`);
5. write the reports (:mod:`rcn_fast.eval.reports`).

Beside it: :mod:`rcn_fast.eval.loading` (the models, encoder, corpora and
KB, each loaded once), :mod:`rcn_fast.eval.progress` (the bars),
:mod:`rcn_fast.eval.pipeline_needs` (what a pipeline class needs),
:mod:`rcn_fast.eval.shards` and :mod:`rcn_fast.eval.ray_executor`
(past one machine).
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from rcn_fast._paths import child_path
from rcn_fast.eval.checkpoint import Checkpoint, run_key
from rcn_fast.eval.config import DEFAULT_ENCODER, DEFAULT_MODEL, EvalConfig, EvalError, encoder_defaults
from rcn_fast.eval.loading import Components, check_model_packages, corpus_key, is_store, sha_file, log, model_key
from rcn_fast.eval.pipeline_needs import (
    is_open_capable,
    may_use_retriever,
    needs_example_kb,
    needs_llm,
    pipeline_config_class,
    pipeline_registry,
    retriever_kind,
    split_pipeline_args,
)
from rcn_fast.eval.progress import StageBars
from rcn_fast.eval.shards import merge_guard, shard_of
from rcn_fast.eval.tasks import TaskError, TaskSpec, load_task_questions, resolve_task, spec_key, task_corpus

# Testing/debug hook: seconds to sleep after each checkpointed batch (lets a
# test kill a run mid-way on tiny models). Never set in normal use.
THROTTLE_ENV = "RCN_FAST_EVAL_THROTTLE"

# settings of the default encoder (all-MiniLM-L6-v2 takes no E5 prefixes); see encoder_defaults
DEFAULT_ENCODER_ARGS = encoder_defaults(DEFAULT_ENCODER)


# -------------------------------------------------------------------- units
@dataclass
class Unit:
    """One task x pipeline x seed."""

    task: TaskSpec
    pipeline: str
    seed: int
    settings: dict[str, Any]
    config: dict[str, Any]
    checkpoint: Checkpoint
    questions: list[Any]
    pending: list[Any] = field(default_factory=list)
    failures: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class RunState:
    """What :func:`evaluate` hands to the reports."""

    config: EvalConfig
    out: Path
    units: list[Unit]
    tasks: list[TaskSpec]
    questions: dict[str, list[Any]]
    llm: Any = None
    llm_identity: str | None = None
    started: float = 0.0
    corpora: dict[str, str] = field(default_factory=dict)


# -------------------------------------------------------------------- records
def score_prediction(pred: Any, question: Any, task: TaskSpec) -> dict[str, float | None]:
    """Per-question metric values (1.0 / 0.0; None without a gold answer)."""
    if task.kind == "open":
        return {"string_em": None if pred.string_em is None else float(bool(pred.string_em)),
                "exact_match": None if pred.exact_match is None else float(bool(pred.exact_match))}
    if question.answer is None:
        return {"acc": None}
    return {"acc": float(int(pred.pred) == int(question.answer))}


def make_record(pred: Any, question: Any, unit: Unit, elapsed: float) -> dict[str, Any]:
    d = pred.to_dict() if hasattr(pred, "to_dict") else dict(pred)
    return {"id": question.id, "seed": unit.seed, "status": "ok",
            "metrics": score_prediction(pred, question, unit.task), "elapsed_s": elapsed, "prediction": d}


# --------------------------------------------------------------------- main
def plan(cfg: EvalConfig, out: Path) -> tuple[list[TaskSpec], dict[str, list[Any]], list[Unit]]:
    """Resolve and check everything; open the checkpoints (nothing heavy loads)."""
    registry = pipeline_registry()
    unknown = [p for p in cfg.pipelines if p not in registry]
    if unknown:
        raise EvalError(f"unknown pipeline(s) {unknown}; available pipelines: {', '.join(sorted(registry))}")
    try:
        specs = [resolve_task(t, split=cfg.split, include_paths=cfg.include_path) for t in cfg.tasks]
    except TaskError as exc:
        raise EvalError(str(exc)) from None
    names = [s.name for s in specs]
    if len(set(names)) != len(names):
        raise EvalError(f"tasks: two tasks share a name ({names}); rename a local file")
    user_args = split_pipeline_args(cfg.pipeline_args, cfg.pipelines)
    llm_key = model_key(cfg.model, cfg.model_args) if any(needs_llm(registry[p]) for p in cfg.pipelines) else None
    questions: dict[str, list[Any]] = {}
    units: list[Unit] = []
    for spec in specs:
        for p in cfg.pipelines:
            cls = registry[p]
            if spec.kind == "open" and not is_open_capable(cls):
                able = sorted(n for n, c in registry.items() if is_open_capable(c))
                raise EvalError(f"pipeline {p!r} answers multiple-choice questions only; task {spec.name!r} is "
                                f"open-domain (pipelines that answer open questions: {', '.join(able) or 'none'})")
            corpus = cfg.corpus or task_corpus(spec)
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
            if corpus is not None and may_use_retriever(cls) and not Path(corpus).exists():
                raise EvalError(f"corpus: {corpus} does not exist (give a corpus store folder built with "
                                f"`python -m rcn_fast.corpus build`, or a .jsonl file of {{id, text}} passages)")
        try:
            qs = load_task_questions(spec, limit=cfg.limit)
        except (ValueError, TypeError, FileNotFoundError, KeyError) as exc:
            raise EvalError(f"task {spec.name!r}: {exc}") from None
        except Exception as exc:  # e.g. the hub cannot be reached
            raise EvalError(f"task {spec.name!r}: cannot load {spec.where}: "
                            f"{type(exc).__name__}: {exc}") from None
        if not qs:
            raise EvalError(f"task {spec.name!r}: no questions")
        ids = [q.id for q in qs]
        if len(set(ids)) != len(ids):
            dup = sorted({i for i in ids if ids.count(i) > 1})[:5]
            raise EvalError(f"task {spec.name!r}: duplicate question ids {dup} (ids key the cache and checkpoints)")
        questions[spec.name] = qs
        tkey = spec_key(spec)
        for p in cfg.pipelines:
            ccls = pipeline_config_class(p)
            settings = {**spec.pipeline_args.get(p, {}), **user_args[p]}
            corpus = cfg.corpus or task_corpus(spec)
            cls = registry[p]
            with_llm = needs_llm(cls)
            for seed in cfg.seeds:
                try:
                    conf = ccls.from_dict({**settings, "seed": seed})
                except (TypeError, ValueError) as exc:
                    raise EvalError(f"pipeline {p!r} settings: {exc}") from None
                from rcn_fast.pipelines.config import config_to_dict

                cdict = config_to_dict(conf)
                # the pipeline's own checks (e.g. a trained checkpoint's files) and what else keys its answers
                _pipeline_hook(cls, "check_config", p, conf)
                extra = _pipeline_hook(cls, "result_key", p, conf)
                uses_corpus = may_use_retriever(cls)
                uses_kb = needs_example_kb(cls)
                key = run_key({
                    "task": tkey, "pipeline": p, "config": cdict,
                    "model": llm_key if with_llm else None, "model_args": cfg.model_args if with_llm else None,
                    "corpus": corpus_key(corpus) if uses_corpus else None,
                    "encoder": [cfg.encoder, cfg.encoder_args] if (uses_corpus or uses_kb) else None,
                    "kb": {"file": sha_file(Path(cfg.kb))} if uses_kb and cfg.kb else None,
                    **({"pipeline_key": extra} if extra is not None else {}),
                })
                path = child_path(out, "checkpoints", spec.name, p, f"seed{seed}-{key}.jsonl")
                ck = Checkpoint(path, shard=(cfg.shard_id, cfg.num_shards) if cfg.sharded else None, meta={
                                "task": spec.name, "pipeline": p, "seed": seed, "key": key, "config": cdict,
                                "model": llm_key if with_llm else None,
                                **({"pipeline_key": extra} if extra is not None else {})})
                done = ck.done()
                mine = qs if not cfg.sharded else [q for q in qs if shard_of(q.id, cfg.num_shards) == cfg.shard_id]
                unit = Unit(task=spec, pipeline=p, seed=seed, settings={**settings, "seed": seed}, config=cdict,
                            checkpoint=ck, questions=mine, pending=[q for q in mine if q.id not in done])
                units.append(unit)
    return specs, questions, units


def _pipeline_hook(cls: Any, name: str, pipeline: str, conf: Any) -> Any:
    """Call the optional class hook ``cls.<name>(config)``; its user-facing
    failures (a missing checkpoint, a bad setting) become one EvalError."""
    hook = getattr(cls, name, None)
    if not callable(hook):
        return None
    try:
        return hook(conf)
    except (ValueError, TypeError, OSError, ImportError) as exc:
        raise EvalError(f"pipeline {pipeline!r}: {exc}") from None


def run_unit(unit: Unit, comps: Components, cfg: EvalConfig, on_batch: Callable[[Unit, int], None] | None = None,
             ) -> None:
    """Answer a unit's pending questions, checkpointing every batch."""
    from rcn_fast.llm.cache import CacheError
    from rcn_fast.pipelines import build

    registry = pipeline_registry()
    cls = registry[unit.pipeline]
    corpus = cfg.corpus or task_corpus(unit.task)
    # retrieval first: an encoder or corpus that cannot load fails before the (slower) LLM loads
    if needs_example_kb(cls):
        retriever = comps.kb_retriever(unit.pipeline)
    elif may_use_retriever(cls) and corpus is not None:
        retriever = comps.retriever(corpus)
    else:
        retriever = None
    llm = comps.llm() if needs_llm(cls) else None  # a trained pipeline (SEPTA) loads no LLM
    try:
        pipe = build(unit.pipeline, llm=llm, retriever=retriever, **unit.settings)
    except EvalError:
        raise
    except (TypeError, ValueError) as exc:
        if retriever is None and "retriever" in str(exc):
            raise EvalError(f"pipeline {unit.pipeline!r} needs a knowledge corpus for task {unit.task.name!r} with "
                            f"these settings: pass --corpus ({exc})") from None
        raise EvalError(f"pipeline {unit.pipeline!r}: {exc}") from None
    except (OSError, ImportError) as exc:  # a checkpoint or model file that is missing or cannot be read
        raise EvalError(f"pipeline {unit.pipeline!r}: {exc}") from None
    except Exception as exc:  # e.g. a corrupt checkpoint file
        raise EvalError(f"pipeline {unit.pipeline!r}: cannot build it: {type(exc).__name__}: {exc}") from None
    unit.checkpoint.write_meta({"llm_identity": getattr(llm, "identity", None),
                                "pipeline_describe": _safe_describe(pipe)})
    bars = StageBars(unit, pipe) if cfg.progress else None
    throttle = float(os.environ.get(THROTTLE_ENV, "0") or 0)
    try:
        bs = cfg.batch_size
        for s in range(0, len(unit.pending), bs):
            chunk = unit.pending[s : s + bs]
            t0 = time.perf_counter()
            if bars is not None:
                bars.batch_start()
            try:
                preds: list[Any] = list(pipe.run_batch(chunk))
                errors: list[str | None] = [None] * len(chunk)
            except EvalError:
                raise
            except CacheError as exc:  # the call cache itself failed: no question can be answered
                raise EvalError(str(exc)) from None
            except Exception as exc:
                if cfg.strict:
                    raise
                log(f"{unit.task.name} | {unit.pipeline}: a batch failed ({type(exc).__name__}: {exc}); "
                    f"retrying its questions one at a time")
                preds, errors = [], []
                for q in chunk:
                    try:
                        preds.append(pipe.run_batch([q])[0])
                        errors.append(None)
                    except CacheError as e1:
                        raise EvalError(str(e1)) from None
                    except Exception as e1:
                        preds.append(None)
                        errors.append(f"{type(e1).__name__}: {e1}")
            per_q = (time.perf_counter() - t0) / max(len(chunk), 1)
            recs = []
            for q, pred, err in zip(chunk, preds, errors):
                if err is None:
                    recs.append(make_record(pred, q, unit, per_q))
                else:
                    unit.failures.append({"task": unit.task.name, "pipeline": unit.pipeline, "seed": unit.seed,
                                          "question_id": q.id, "error": err})
            unit.checkpoint.append(recs)
            if bars is not None:
                bars.update(len(chunk))
            if on_batch is not None:
                on_batch(unit, len(chunk))
            if throttle:
                time.sleep(throttle)
    finally:
        if bars is not None:
            bars.close()


def _safe_describe(pipe: Any) -> Any:
    try:
        return json.loads(json.dumps(pipe.describe(), default=str))
    except Exception:
        return None


def evaluate(config: EvalConfig | dict[str, Any] | None = None, *, llm: Any = None, encoder: Any = None,
             retriever: Any = None, kb_retriever: Any = None, print_table: bool = True,
             on_batch: Callable[[Unit, int], None] | None = None) -> dict[str, Any]:
    """Run an evaluation and write its reports.

    Parameters
    ----------
    config : EvalConfig or dict, optional
        Default: the embedded demo (vanilla, single retrieval and ReConnect
        on the built-in demo task with SmolLM2-135M-Instruct and
        all-MiniLM-L6-v2).
    llm, encoder, retriever, kb_retriever : optional
        Already-built components, used instead of loading ``config.model``,
        ``config.encoder``, the corpus and the KB (the LLM is still wrapped
        in the output folder's call cache).
    print_table : bool
        Print the markdown table to stdout.
    on_batch : callable, optional
        Called as ``on_batch(unit, n)`` after each checkpointed batch.

    Returns
    -------
    dict
        The results document (also written to ``results_<timestamp>.json``);
        for one shard of a sharded run (``config.shard_id`` set), which
        writes no report, a summary: ``{"shard": {...}, "units": [...]}``
        with the questions answered per task x pipeline x seed.

    Raises
    ------
    EvalError
        Unknown task or pipeline, missing corpus or KB, a model or encoder
        that cannot load, malformed question files (with line numbers).
    """
    if config is None:
        cfg = EvalConfig()
    elif isinstance(config, dict):
        cfg = EvalConfig.from_dict(config)
    elif isinstance(config, EvalConfig):
        cfg = config
    else:
        raise TypeError(f"config: expected EvalConfig or dict, got {type(config).__name__}")
    if cfg.executor == "ray":
        from rcn_fast.eval.ray_executor import evaluate_on_ray

        return evaluate_on_ray(cfg, llm=llm, encoder=encoder, retriever=retriever, kb_retriever=kb_retriever,
                               print_table=print_table)
    started = time.time()
    out = Path(cfg.output_path).expanduser()
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise EvalError(f"output-path: cannot create {out}: {exc}") from None
    if not os.access(out, os.W_OK | os.X_OK):
        raise EvalError(f"output-path: {out} is not writable (checkpoints, the call cache and the reports go "
                        "there); make it writable or choose another --output-path")
    specs, questions, units = plan(cfg, out)
    merge_guard(cfg, units)  # a shard records what it was given; a merge refuses incomplete shards
    _warn_corpus_leaks(cfg, out, questions, units)
    todo = [u for u in units if u.pending]
    if todo:  # say which model packages are missing before any work starts
        reg = pipeline_registry()
        default_llm = llm is None and isinstance(cfg.model, str) and cfg.model == DEFAULT_MODEL and any(
            needs_llm(reg[u.pipeline]) for u in todo)
        default_encoder = encoder is None and retriever is None and cfg.encoder is None and any(
            (needs_example_kb(reg[u.pipeline]) and kb_retriever is None)
            or (may_use_retriever(reg[u.pipeline])
                and (cfg.corpus or task_corpus(u.task)) is not None and not is_store(cfg.corpus or task_corpus(u.task)))
            for u in todo)
        check_model_packages(default_llm, default_encoder)
    prev_threads = None
    if todo and cfg.device in ("cpu", "auto") and importlib.util.find_spec("torch") is not None:
        n, why = choose_threads(cfg.threads)
        if n is not None:
            import torch

            prev_threads = torch.get_num_threads()
            torch.set_num_threads(n)
            if why:
                log(f"using {n} torch thread(s): {why}; set --threads to choose")
    try:
        return _run(cfg, out, specs, questions, units, todo, started, llm=llm, encoder=encoder, retriever=retriever,
                    kb_retriever=kb_retriever, print_table=print_table, on_batch=on_batch)
    finally:
        if prev_threads is not None:
            import torch

            torch.set_num_threads(prev_threads)


def _warn_corpus_leaks(cfg: EvalConfig, out: Path, questions: dict[str, list[Any]], units: list[Unit]) -> None:
    """Warn when the user's corpus holds evaluated questions (report only; cached per corpus and questions)."""
    if not cfg.corpus or not cfg.leak_check or not Path(cfg.corpus).exists():
        return
    reg = pipeline_registry()
    used = {u.task.name for u in units if may_use_retriever(reg[u.pipeline])}
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


def _run(cfg: EvalConfig, out: Path, specs: list[TaskSpec], questions: dict[str, list[Any]], units: list[Unit],
         todo: list[Unit], started: float, *, llm: Any, encoder: Any, retriever: Any, kb_retriever: Any,
         print_table: bool, on_batch: Callable[[Unit, int], None] | None) -> dict[str, Any]:
    from rcn_fast.eval import reports

    comps = Components(cfg, out, llm=llm if llm is not None else (None if isinstance(cfg.model, str) else cfg.model),
                       encoder=encoder, retriever=retriever, kb_retriever=kb_retriever)
    done_units = len(units) - len(todo)
    if done_units and todo:
        log(f"resuming: {done_units} of {len(units)} runs already complete in {out}")
    elif not todo:
        log(f"every run is already complete in {out}; writing the reports (no model is loaded)")
    for spec in specs:
        for u in [u for u in units if u.task.name == spec.name and u.pending]:
            if len(u.pending) < len(u.questions):
                log(f"{spec.name} | {u.pipeline} | seed {u.seed}: resuming, "
                    f"{len(u.questions) - len(u.pending)} of {len(u.questions)} questions already done")
            run_unit(u, comps, cfg, on_batch=on_batch)
        if not cfg.sharded:
            log(reports.task_summary_line(spec, [u for u in units if u.task.name == spec.name]))
    if cfg.sharded:  # one shard of many: its checkpoints are written; the merging run writes the reports
        summary = shard_summary(cfg, units)
        log(f"shard {cfg.shard_id} of {cfg.num_shards}: {sum(u['answered'] for u in summary['units'])} of "
            f"{sum(u['questions'] for u in summary['units'])} questions answered in {out}; run without "
            "--shard-id/--num-shards to merge the shards and write the reports")
        return summary
    state = RunState(config=cfg, out=out, units=units, tasks=specs, questions=questions, llm=comps._llm,
                     llm_identity=getattr(comps._llm, "identity", None), started=started, corpora=comps.corpora)
    return reports.write_reports(state, print_table=print_table)


def shard_summary(cfg: EvalConfig, units: list[Unit]) -> dict[str, Any]:
    """What a shard run returns instead of the results document."""
    return {"shard": {"shard_id": cfg.shard_id, "num_shards": cfg.num_shards},
            "units": [{"task": u.task.name, "pipeline": u.pipeline, "seed": u.seed, "questions": len(u.questions),
                       "answered": len(u.checkpoint.done() & {q.id for q in u.questions}),
                       "failures": list(u.failures)} for u in units]}


def choose_threads(requested: int | None) -> tuple[int | None, str]:
    """torch threads for a CPU run: ``requested``, or fewer than the default
    when other work already keeps the cores busy (see :class:`EvalConfig`).

    Returns
    -------
    (threads or None for torch's default, the reason when chosen here)
    """
    if requested is not None:
        return requested, ""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):  # not on this platform
        return None, ""
    if load < 0.5:
        return None, ""
    idle = max(1, min(cpus, int(cpus - load + 0.5)))
    if idle >= cpus:
        return None, ""
    return idle, f"other work keeps the CPU busy (load average {load:.1f} on {cpus} cores)"


__all__ = ["evaluate", "plan", "run_unit", "Unit", "RunState", "Components", "split_pipeline_args",
           "score_prediction", "pipeline_registry", "needs_llm", "StageBars", "DEFAULT_ENCODER_ARGS"]
