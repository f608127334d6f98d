"""Run tasks x pipelines x seeds, durably, and collect the records.

:func:`evaluate` is the whole command without the argument parsing, in
three steps, none of which calls it again:

1. **plan** (:func:`rcn_fast.eval.run.plan.plan`): resolve tasks (registry
   names, local files) and pipelines (looked up in
   :data:`rcn_fast.pipelines.PIPELINES` at run time), check every setting
   before anything heavy loads (including a pipeline class's own
   ``check_config(config)``), load each task's questions, resolve each
   unit's corpus, KB and needs once, and open every task x pipeline x seed
   checkpoint (:mod:`rcn_fast.eval.run.checkpoint`) to find the questions not
   done yet;
2. **execute**: with ``executor="ray"`` the :class:`~rcn_fast.eval.run.ray_executor.RayExecutor`
   runs the pending units on a cluster first; then the
   :class:`~rcn_fast.eval.run.executors.LocalExecutor` answers whatever is left
   here, batch by batch (models load only when some question is left, each
   once; pipelines get the questions without gold; the task scores each
   prediction, :mod:`rcn_fast.eval.metrics`);
3. **report** (:mod:`rcn_fast.eval.report.results`), or, for one shard of a
   sharded run, a summary.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from rcn_fast.eval.config import DEFAULT_ENCODER, EvalConfig, encoder_defaults
from rcn_fast.eval.run.executors import (
    LocalExecutor,
    THROTTLE_ENV,
    choose_threads,
    given_llm,
    output_folder,
    run_unit,
    shard_summary,
)
from rcn_fast.eval.run.loading import Components, check_model_path, log
from rcn_fast.eval.pipeline_needs import needs_llm, pipeline_registry, split_pipeline_args
from rcn_fast.eval.run.plan import Unit, plan
from rcn_fast.eval.report.progress import StageBars
from rcn_fast.eval.metrics import make_task
from rcn_fast.eval.tasks.catalog import TaskSpec

# settings of the default encoder (all-MiniLM-L6-v2 takes no E5 prefixes); see encoder_defaults
DEFAULT_ENCODER_ARGS = encoder_defaults(DEFAULT_ENCODER)


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
    torch_threads: int | None = None  # the threads the questions ran with (None: none ran)
    usage_before: Any = None  # the LLM's cost total before this run (a model shared with earlier runs)
    encoders: dict[str, Any] = field(default_factory=dict)  # corpus -> what its retriever encoded with (loaded ones)


def score_prediction(pred: Any, question: Any, task: TaskSpec) -> dict[str, float | None]:
    """Per-question metric values (1.0 / 0.0; None without a gold answer): the task's
    :meth:`~rcn_fast.eval.metrics.Task.process_results`."""
    return make_task(task).process_results(question, pred)


def encoders_used(comps: Components) -> dict[str, Any]:
    """``{corpus: the encoder's description}`` of the retrievers this run
    loaded (its ``describe()``, else its class name), and under ``"*"`` the
    encoder it was given or loaded for corpora embedded here; empty when
    none was."""
    def describe(enc: Any) -> dict[str, Any]:
        try:
            d = enc.describe() if hasattr(enc, "describe") else {}
        except Exception:  # noqa: BLE001 - never lose the reports over a description
            d = {}
        d = d if isinstance(d, dict) else {}
        d.setdefault("model", type(enc).__name__)
        return {k: d.get(k) for k in ("model", "backend", "pooling", "normalize", "query_prefix", "dim")
                if d.get(k) is not None}

    out = {corpus: describe(r.encoder) for corpus, r in getattr(comps, "_retrievers", {}).items()
           if getattr(r, "encoder", None) is not None}
    if getattr(comps, "_encoder", None) is not None:
        out["*"] = describe(comps._encoder)
    return out


def evaluate(config: EvalConfig | dict[str, Any] | None = None, *, llm: Any = None, encoder: Any = None,
             retriever: Any = None, kb_retriever: Any = None, print_table: bool = True,
             on_batch: Callable[[Unit, int], None] | None = None, components: Components | None = None,
             labels: dict[str, str] | None = None) -> dict[str, Any]:
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
    components : Components, optional
        The models an earlier run loaded, used again (each is loaded once
        across the runs): a :class:`~rcn_fast.eval.run.loading.Components` made
        with the same model, encoder, device and output settings (the
        ``--paper`` runner shares one across a table's rows). ``llm`` ...
        are then ignored. The results' ``llm_usage`` counts this run's calls.
    labels : dict, optional
        ``{pipeline: name}``: what progress lines call a pipeline's runs
        (the ``--paper`` runner names each by its row, ``RECONNECT (N=5)``).

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
    started = time.time()
    remote = None
    if cfg.executor == "ray":
        from rcn_fast.eval.run.ray_executor import RayExecutor, local_config

        remote = RayExecutor(cfg)
        remote.check(llm=llm, encoder=encoder, retriever=retriever, kb_retriever=kb_retriever)
        cfg = local_config(cfg)  # the driver plans, merges and reports as a local run
    out = output_folder(cfg)
    planned = plan(cfg, out)
    # a misspelt model path is said now, before any corpus is embedded (here or by the Ray driver)
    given = components.provided()["llm"] if components is not None else given_llm(cfg, llm)
    check_model_path(cfg.model, given is None and any(u.needs.llm for u in planned.todo))
    for u in planned.units:
        u.label = (labels or {}).get(u.pipeline, "")
    if remote is not None:  # the pending units on the cluster; what is left (nothing, normally) runs here
        remote.run(planned.units, out)
    local = LocalExecutor(cfg, out, llm=llm, encoder=encoder, retriever=retriever, kb_retriever=kb_retriever,
                          on_batch=on_batch, components=components)
    usage_before = local.components.usage()  # a shared loader's model has answered earlier runs
    local.run(planned)
    if cfg.sharded:  # one shard of many: its checkpoints are written; the merging run writes the reports
        summary = shard_summary(cfg, planned.units)
        log(f"shard {cfg.shard_id} of {cfg.num_shards}: {sum(u['answered'] for u in summary['units'])} of "
            f"{sum(u['questions'] for u in summary['units'])} questions answered in {out}; run without "
            "--shard-id/--num-shards to merge the shards and write the reports")
        return summary
    from rcn_fast.eval.report import results as reports

    comps = local.components
    state = RunState(config=cfg, out=out, units=planned.units, tasks=planned.tasks, questions=planned.questions,
                     llm=comps._llm, llm_identity=getattr(comps._llm, "identity", None), started=started,
                     corpora=comps.corpora, torch_threads=local.threads_used, usage_before=usage_before,
                     encoders=encoders_used(comps))
    return reports.write_reports(state, print_table=print_table)


__all__ = ["evaluate", "plan", "run_unit", "Unit", "RunState", "Components", "split_pipeline_args",
           "score_prediction", "pipeline_registry", "needs_llm", "StageBars", "DEFAULT_ENCODER_ARGS",
           "choose_threads", "shard_summary", "THROTTLE_ENV"]
