"""Running planned units (:mod:`rcn_fast.eval.run.plan`) in this process.

:class:`LocalExecutor` answers every pending question of the planned units
batch by batch, appending each batch to its unit's checkpoint (a failing
question is recorded as a failure and reported, or stops the run with
``strict``), with a progress bar per stage (:class:`StageBars`). Models load
lazily and once (:class:`~rcn_fast.eval.run.loading.Components`): only when some
unit has questions left, and only what a pending unit needs.

Pipelines receive the questions without their gold answers
(:meth:`rcn_fast.eval.metrics.Task.unlabeled`); the unit's task scores each
prediction and writes the gold beside it in the record
(:func:`make_record`).

:func:`run_slice` is the body of one Ray task (:mod:`rcn_fast.eval.run.ray_executor`):
plan one shard of one unit, run it here, return its summary.
"""

from __future__ import annotations

import importlib.util
import json
import os
import time
from pathlib import Path
from typing import Any, Callable

from rcn_fast.eval.config import EvalConfig, EvalError
from rcn_fast.eval.run.loading import Components, check_model_packages, log
from rcn_fast.eval.run.plan import Plan, Unit, default_models_needed, plan, warn_corpus_leaks
from rcn_fast.eval.report.progress import StageBars
from rcn_fast.eval.metrics import RecordError, make_task
from rcn_fast.eval.run.shards import merge_guard

# Testing/debug hook: seconds to sleep after each checkpointed batch (lets a
# test kill a run mid-way on tiny models). Never set in normal use.
THROTTLE_ENV = "RCN_FAST_EVAL_THROTTLE"


def make_record(pred: Any, question: Any, unit: Unit, elapsed: float) -> dict[str, Any]:
    """The checkpoint record of one answered question: the task's metrics
    and the prediction with the gold written beside it, checked as every
    record read back is (:meth:`rcn_fast.eval.metrics.Task.check_record`).

    Raises
    ------
    rcn_fast.eval.metrics.RecordError
        The prediction is not a valid answer (its question fails, uncounted).
    """
    task = unit.scorer or make_task(unit.task)
    rec = {"id": question.id, "seed": unit.seed, "status": "ok", "metrics": task.process_results(question, pred),
           "elapsed_s": elapsed, "prediction": task.record_prediction(question, pred)}
    task.check_record(question, rec, unit.seed, scores=unit.needs.scores)
    return rec


def output_folder(cfg: EvalConfig) -> Path:
    """The output folder, created and checked writable."""
    out = Path(cfg.output_path).expanduser()
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise EvalError(f"output-path: cannot create {out}: {exc}") from None
    if not os.access(out, os.W_OK | os.X_OK):
        raise EvalError(f"output-path: {out} is not writable (checkpoints, the call cache and the reports go "
                        "there); make it writable or choose another --output-path")
    return out


def given_llm(cfg: EvalConfig, llm: Any) -> Any:
    """The already-built LLM a run was given: ``llm``, else ``cfg.model``
    when it is a model object rather than a spec (None: load ``cfg.model``)."""
    if llm is not None:
        return llm
    return None if isinstance(cfg.model, str) else cfg.model


def run_unit(unit: Unit, comps: Components, cfg: EvalConfig, on_batch: Callable[[Unit, int], None] | None = None,
             ) -> None:
    """Answer a unit's pending questions, checkpointing every batch."""
    from rcn_fast.llm.cache import CacheError
    from rcn_fast.pipelines import build

    # retrieval first: an encoder or corpus that cannot load fails before the (slower) LLM loads
    if unit.needs.example_kb:
        retriever = comps.kb_retriever(unit.pipeline)
    elif unit.corpus is not None:
        retriever = comps.retriever(unit.corpus)
    else:
        retriever = None
    llm = comps.llm() if unit.needs.llm else None  # a trained pipeline (SEPTA) loads no LLM
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
    task = unit.scorer or make_task(unit.task)
    bars = StageBars(unit, pipe) if cfg.progress else None
    throttle = float(os.environ.get(THROTTLE_ENV, "0") or 0)
    try:
        bs = cfg.batch_size
        for s in range(0, len(unit.pending), bs):
            chunk = unit.pending[s : s + bs]
            given = [task.unlabeled(q) for q in chunk]  # the pipeline never sees the gold answers
            t0 = time.perf_counter()
            if bars is not None:
                bars.batch_start()
            preds, errors = _answer(pipe, given, cfg, unit, CacheError)
            per_q = (time.perf_counter() - t0) / max(len(chunk), 1)
            recs = []
            for q, pred, err in zip(chunk, preds, errors):
                if err is None:
                    try:
                        recs.append(make_record(pred, q, unit, per_q))
                    except RecordError as exc:  # never counted, as a damaged record read back
                        if cfg.strict:
                            raise
                        err = f"RecordError: {exc}"
                if err is not None:
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


def _answer(pipe: Any, chunk: list[Any], cfg: EvalConfig, unit: Unit, cache_error: type[Exception],
            ) -> tuple[list[Any], list[str | None]]:
    """The pipeline's predictions for a batch; when the batch fails (and not
    ``strict``), its questions one at a time, a failing one recorded as its error."""
    try:
        return list(pipe.run_batch(chunk)), [None] * len(chunk)
    except EvalError:
        raise
    except cache_error as exc:  # the call cache itself failed: no question can be answered
        raise EvalError(str(exc)) from None
    except Exception as exc:
        if cfg.strict:
            raise
        log(f"{unit.task.name} | {unit.display}: a batch failed ({type(exc).__name__}: {exc}); "
            f"retrying its questions one at a time")
    preds: list[Any] = []
    errors: list[str | None] = []
    for q in chunk:
        try:
            preds.append(pipe.run_batch([q])[0])
            errors.append(None)
        except cache_error as e1:
            raise EvalError(str(e1)) from None
        except Exception as e1:
            preds.append(None)
            errors.append(f"{type(e1).__name__}: {e1}")
    return preds, errors


def _safe_describe(pipe: Any) -> Any:
    try:
        return json.loads(json.dumps(pipe.describe(), default=str))
    except Exception:
        return None


class LocalExecutor:
    """Runs planned units in this process.

    Parameters
    ----------
    cfg : EvalConfig
    out : Path
        The output folder (checkpoints, call cache).
    llm, encoder, retriever, kb_retriever : optional
        Already-built components (see :func:`rcn_fast.eval.evaluate`).
    on_batch : callable, optional
        Called as ``on_batch(unit, n)`` after each checkpointed batch.
    components : Components, optional
        The loader of an earlier run with the same model, encoder and output
        settings, whose loaded models are used (the ``--paper`` runner
        shares one across a table's rows); ``llm`` ... are then ignored.
    """

    def __init__(self, cfg: EvalConfig, out: Path, *, llm: Any = None, encoder: Any = None, retriever: Any = None,
                 kb_retriever: Any = None, on_batch: Callable[[Unit, int], None] | None = None,
                 components: Components | None = None) -> None:
        self.cfg, self.out, self.on_batch = cfg, out, on_batch
        self.given = {"llm": llm, "encoder": encoder, "retriever": retriever, "kb_retriever": kb_retriever}
        if components is not None:
            self.given = components.provided()
        self.components = components if components is not None else Components(
            cfg, out, llm=given_llm(cfg, llm), encoder=encoder, retriever=retriever, kb_retriever=kb_retriever)
        #: torch threads the questions ran with (None: none ran here); the process's own
        #: setting is restored afterwards, so the reports read this one
        self.threads_used: int | None = None

    def run(self, planned: Plan) -> None:
        """Answer every pending question of ``planned`` (a shard records what
        it was given; a merge refuses incomplete shards first)."""
        cfg, units = self.cfg, planned.units
        merge_guard(cfg, units)
        warn_corpus_leaks(cfg, self.out, planned.questions, units)
        todo = planned.todo
        if todo:  # say which model packages are missing before any work starts
            check_model_packages(*default_models_needed(cfg, todo, **self.given))
        prev_threads = None
        if todo and cfg.device in ("cpu", "auto") and importlib.util.find_spec("torch") is not None:
            n, why = choose_threads(cfg.threads)
            if n is not None:
                import torch

                prev_threads = torch.get_num_threads()
                torch.set_num_threads(n)
                if why:
                    log(f"using {n} torch thread(s): {why}; set --threads to choose")
        if todo and importlib.util.find_spec("torch") is not None:
            import torch

            self.threads_used = torch.get_num_threads()
        try:
            self._run(planned, todo)
        finally:
            if prev_threads is not None:
                import torch

                torch.set_num_threads(prev_threads)

    def _run(self, planned: Plan, todo: list[Unit]) -> None:
        from rcn_fast.eval.report.results import task_summary_line

        cfg, units = self.cfg, planned.units
        done_units = len(units) - len(todo)
        if done_units and todo:
            log(f"resuming: {done_units} of {len(units)} runs already complete in {self.out}")
        elif not todo:
            log(f"every run is already complete in {self.out}; writing the reports (no model is loaded)")
        for spec in planned.tasks:
            for u in [u for u in units if u.task.name == spec.name and u.pending]:
                if len(u.pending) < len(u.questions):
                    log(f"{spec.name} | {u.display} | seed {u.seed}: resuming, "
                        f"{len(u.questions) - len(u.pending)} of {len(u.questions)} questions already done")
                run_unit(u, self.components, cfg, on_batch=self.on_batch)
            if not cfg.sharded:
                log(task_summary_line(spec, [u for u in units if u.task.name == spec.name]))
                for line in truncation_lines(spec, [u for u in units if u.task.name == spec.name]):
                    log(line)


def truncation_lines(spec: Any, units: list[Unit]) -> list[str]:
    """Per pipeline of a task that generates, how many of its generations
    stopped at the token limit, stage by stage (:func:`rcn_fast.eval.trace.truncation_line`):
    printed before the table, so a reader knows how much knowledge was cut."""
    from rcn_fast.eval.trace import truncation_counts, truncation_line

    out = []
    for p in dict.fromkeys(u.pipeline for u in units):
        pu = [u for u in units if u.pipeline == p]
        ids = {q.id for q in pu[0].questions}
        preds = [r["prediction"] for u in pu for i, r in u.checkpoint.records.items() if i in ids]
        line = truncation_line(spec.name, pu[0].display, truncation_counts(preds), pu[0].config.get("max_new_tokens"))
        if line is not None:
            out.append(line)
    return out


def shard_summary(cfg: EvalConfig, units: list[Unit]) -> dict[str, Any]:
    """What a shard run returns instead of the results document."""
    return {"shard": {"shard_id": cfg.shard_id, "num_shards": cfg.num_shards},
            "units": [{"task": u.task.name, "pipeline": u.pipeline, "seed": u.seed, "questions": len(u.questions),
                       "answered": len(u.checkpoint.done() & {q.id for q in u.questions}),
                       "failures": list(u.failures)} for u in units]}


def run_slice(cfg_dict: dict[str, Any]) -> dict[str, Any]:
    """Body of one Ray task: plan one shard of one task x pipeline x seed
    (``cfg_dict``: an :class:`EvalConfig` with ``shard_id`` set) and run it
    with the :class:`LocalExecutor`; returns its :func:`shard_summary`."""
    cfg = EvalConfig.from_dict(cfg_dict)
    out = output_folder(cfg)
    planned = plan(cfg, out)
    LocalExecutor(cfg, out).run(planned)
    return shard_summary(cfg, planned.units)


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


__all__ = ["truncation_lines", "LocalExecutor", "run_unit", "run_slice", "make_record", "shard_summary", "output_folder", "given_llm",
           "choose_threads", "THROTTLE_ENV"]
