"""``python -m rcn_fast.eval --paper TABLE``: run a table's rows and write its report.

Each distinct row (pipeline + settings) is one ordinary evaluation into the
same output folder, so the call cache and the checkpoints make an
interrupted preset resume where it stopped (a rerun asks the model nothing
it already answered), and a corpus file is embedded once. The LLM is loaded
once for all rows.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from rcn_fast.paper.presets import (DEFAULT_SEEDS, ID_TASKS, NOT_IMPLEMENTED, OOD_TASKS, TABLE6_RETRIEVERS, Preset,
                                    RowRun, get_preset)
from rcn_fast.paper.report import PaperReport, fill_cells


def row_reason(run: RowRun | None, cfg: Any, corpora: Mapping[str, str]) -> str | None:
    """Why a row cannot run with these inputs (None: it can)."""
    if run is None:
        return NOT_IMPLEMENTED
    from rcn_fast.eval.pipeline_needs import pipeline_registry, retriever_kind

    reg = pipeline_registry()
    if run.pipeline not in reg:
        return f"pipeline {run.pipeline!r} is not registered"
    kind = retriever_kind(reg[run.pipeline])
    if kind == "example_kb" and not cfg.kb:
        return "needs --kb (ZEBRA's example knowledge base, e.g. built with python -m rcn_fast.kb)"
    if run.corpus_key is not None and run.corpus_key not in corpora:
        return (f"needs --paper-corpus {run.corpus_key}=STORE, a store embedded with "
                f"{TABLE6_RETRIEVERS.get(run.corpus_key, run.corpus_key)}")
    if kind == "corpus" and run.corpus_key is None and not cfg.corpus and not ({"id", "ood"} & set(corpora)):
        return "needs --corpus (the retrieval corpus: a store or a statements file) or --paper-corpus id=... ood=..."
    return None


def corpus_of(task: str, run: RowRun, cfg: Any, corpora: Mapping[str, str]) -> str | None:
    """The corpus a row retrieves from for one task: Table 6's store of its retriever; else the
    in-domain store (``--paper-corpus id=``, RACo without its CBD part) for the ID tasks and the
    full store (``ood=``) for the OOD tasks, as App. A.2 builds them; else ``--corpus``."""
    if run.corpus_key is not None:
        return corpora[run.corpus_key]
    group = "id" if task in ID_TASKS else "ood" if task in OOD_TASKS else None
    return corpora.get(group, cfg.corpus) if group else cfg.corpus


def check_tasks(tasks: Sequence[str], cfg: Any) -> dict[str, str]:
    """{task: why it cannot be evaluated} for the tasks that do not resolve or load."""
    from rcn_fast.eval.tasks import load_task_questions, resolve_task

    reasons: dict[str, str] = {}
    for t in tasks:
        try:
            spec = resolve_task(t, split=cfg.split, include_paths=cfg.include_path)
            load_task_questions(spec, limit=cfg.limit, split=cfg.split)
        except Exception as exc:  # noqa: BLE001  (any load failure is reported in the cell, not raised)
            reasons[t] = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
    return reasons


def run_preset(name: str, cfg: Any, *, corpora: Mapping[str, str] | None = None, seeds: Sequence[int] | None = None,
               evaluate: Callable[..., dict[str, Any]] | None = None, llm: Any = None,
               encoder: Any = None) -> tuple[PaperReport, dict[str, str]]:
    """Run every runnable row of a table and write ``paper_<table>.{md,json,png}`` into ``cfg.output_path``.

    Parameters
    ----------
    name : str
        ``"table1"`` ... (see :func:`rcn_fast.paper.presets.available_presets`).
    cfg : EvalConfig
        The user's settings (model, corpus, KB, encoder, limit, output path ...);
        the preset sets the pipelines, their settings and the tasks.
    corpora : mapping, optional
        ``{"id": STORE, "ood": STORE}``: the in-domain store (RACo without
        CBD) for the ID tasks and the full store for the OOD tasks (App.
        A.2); Table 6: ``{"raco": STORE, "dpr": STORE, "zebra": STORE}``.
    seeds : sequence of int, optional
        Default (0, 1, 2), the paper's three seeds.
    evaluate : callable, optional
        :func:`rcn_fast.eval.evaluate` (a stand-in in tests).
    llm, encoder : optional
        An already-built LLM used by every row (default: ``cfg.model`` loaded
        once) and retrieval encoder (default: each row loads ``cfg.encoder``).

    Returns
    -------
    (PaperReport, dict of written file paths)
    """
    from rcn_fast.eval.config import EvalError

    if evaluate is None:
        from rcn_fast.eval.runner import evaluate
    preset: Preset = get_preset(name)
    corpora = dict(corpora or {})
    seeds = list(seeds) if seeds else list(DEFAULT_SEEDS)
    task_reasons = check_tasks(preset.tasks(), cfg)
    tasks = [t for t in preset.tasks() if t not in task_reasons]
    row_reasons: dict[str, str] = {}
    runs: dict[str, RowRun] = {}
    for row in preset.rows:
        run = preset.run_of(row)
        why = row_reason(run, cfg, corpora)
        if why is not None:
            row_reasons[row] = why
        else:
            runs[row] = run  # type: ignore[assignment]
    measured: dict[str, dict[str, dict[str, Any]]] = {}
    done: dict[str, dict[str, dict[str, Any]]] = {}  # run slug -> {task: result}
    if runs and tasks and llm is None:
        llm = _load_llm_once(cfg, runs.values())
    for row, run in runs.items():
        slug = run.slug()
        if slug not in done:
            by_corpus: dict[str | None, list[str]] = {}
            for t in tasks:
                by_corpus.setdefault(corpus_of(t, run, cfg, corpora), []).append(t)
            results: dict[str, Any] = {}
            try:
                for corpus, group in by_corpus.items():
                    row_cfg = replace(cfg, pipelines=[run.pipeline], tasks=group, seeds=seeds, corpus=corpus,
                                      pipeline_args={**cfg.pipeline_args, **run.pipeline_args}, plot=False)
                    doc = evaluate(row_cfg, llm=llm, encoder=encoder, print_table=False)
                    results.update({t: doc.get("results", {}).get(t, {}).get(run.pipeline) for t in group})
            except EvalError as exc:
                row_reasons[row] = f"could not run: {exc}"
                continue
            done[slug] = results
        measured[row] = {t: r for t, r in done[slug].items() if r is not None}
    report = PaperReport(preset, fill_cells(preset, measured, row_reasons, task_reasons), model=str(cfg.model),
                         seeds=seeds)
    if preset.kind == "cost":
        report.notes.append("#Tokens is measured as generated tokens per question; rcn_fast scores the answer "
                            "labels without generating, where the paper's Single RAG counts its one answer token")
    return report, report.write(Path(cfg.output_path).expanduser())


def _load_llm_once(cfg: Any, runs: Any) -> Any:
    """The user's model, loaded once (None when no row needs an LLM, or it is already an object)."""
    from rcn_fast.eval.pipeline_needs import needs_llm, pipeline_registry

    reg = pipeline_registry()
    if not any(needs_llm(reg[r.pipeline]) for r in runs) or not isinstance(cfg.model, str):
        return None
    from rcn_fast.eval.loading import load_model

    return load_model(cfg, cfg.model)
