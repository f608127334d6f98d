"""``python -m rcn_fast.eval --paper TABLE``: run a table's rows and write its report.

Each distinct row (pipeline + settings) is one ordinary evaluation into the
same output folder, so the call cache and the checkpoints make an
interrupted preset resume where it stopped (a rerun asks the model nothing
it already answered), and a corpus file is embedded once. The rows share
one loader (:class:`rcn_fast.eval.run.loading.Components`): the LLM, the
encoder and each corpus's retriever are loaded once for the whole table.

The table's tasks load as their task files say (the hub, a pinned URL),
or from the user's files: ``--tasks NAME=FILE``, ``NAME=DIR`` or ``DIR``, a
folder in the commonsense layout (``<task>/<task>-{train,dev,test}.jsonl``,
the split each task evaluates: :func:`task_entries`). Whether the hub can be
reached is asked once (:func:`rcn_fast.eval.tasks.sources.hub_access`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from rcn_fast.eval.run.loading import corpus_problem, log
from rcn_fast.paper.presets import (DEFAULT_SEEDS, ID_TASKS, NOT_IMPLEMENTED, OOD_TASKS, TABLE6_RETRIEVERS, Preset,
                                    RowRun, get_preset)
from rcn_fast.paper.report import PaperReport, fill_cells

#: The end of a task's reason when it loads from the hub and the hub cannot be reached.
HUB_UNREACHABLE = "is on the Hugging Face hub, which cannot be reached"


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


def task_entries(preset: Preset, given: Sequence[str], include_paths: Sequence[str] = ()) -> dict[str, str]:
    """The ``--tasks`` entries of a table's tasks: ``{task: entry}`` for
    :func:`rcn_fast.eval.tasks.catalog.resolve_task` (a task not named loads as its
    task file says).

    ``given`` holds ``NAME=FILE`` (the task on that question file),
    ``NAME=DIR`` (the task's file of the split it evaluates in a folder of
    the commonsense layout, :func:`rcn_fast.eval.tasks.sources.layout_file`;
    any other folder as ``resolve_task`` reads it), ``DIR`` (every task of
    the table found in that commonsense-layout folder) or ``NAME``.

    Raises
    ------
    ValueError
        A name the table does not use (the message lists the table's
        tasks), a folder holding none of them, or a question file given
        without the task it is for.
    """
    from rcn_fast.eval.tasks.sources import layout_file, layout_hint, layout_tasks
    from rcn_fast.eval.tasks.catalog import get_task, normalize_name

    table = preset.tasks()
    listed = ", ".join(table)
    out: dict[str, str] = {}

    def split_of(task: str) -> str | None:
        return get_task(task, include_paths).split

    for entry in given:
        entry = entry.strip()
        path = Path(entry).expanduser()
        if "=" not in entry and path.is_dir():
            found = layout_tasks(path, table, split_of)
            if not found:
                raise ValueError(f"--tasks {entry}: holds no question file of {preset.name}'s tasks ({listed}); "
                                 f"expected the commonsense layout, e.g. {layout_hint(path, table[0], split_of(table[0]))}")
            for t, f in found.items():
                out.setdefault(t, f"{t}={f}")
            log(f"--paper {preset.name}: tasks from {path}: " + ", ".join(f"{t} ({f.name})" for t, f in found.items())
                + (f"; not there (loaded as their task files say): {', '.join(t for t in table if t not in found)}"
                   if len(found) < len(table) else ""))
            continue
        head, sep, where = entry.partition("=")
        name = normalize_name(head.partition(":")[0])
        if not sep and path.suffix in (".jsonl", ".json"):
            raise ValueError(f"--tasks {entry}: under --paper name the task a question file is for: "
                             f"NAME={entry} (the table's tasks: {listed})")
        if name not in table:
            raise ValueError(f"--tasks {entry}: {preset.name} does not use the task {head!r}; its tasks are: "
                             f"{listed} (give them as NAME=FILE, NAME=DIR or a folder DIR in the commonsense "
                             f"layout)")
        if sep and Path(where).expanduser().is_dir():
            f = layout_file(where, name, split_of(name))
            if f is not None:
                entry = f"{head}={f}"
        out[name] = entry
    return out


def check_tasks(tasks: Sequence[str], cfg: Any, entries: Mapping[str, str] | None = None,
                ) -> tuple[dict[str, dict[str, Any]], dict[str, str]]:
    """Resolve and load each task once: ``({task: what it is}, {task: why it cannot be evaluated})``.

    What a task is: ``questions`` (loaded, after ``--limit``), ``paper_questions``
    (the paper's set, when its task file says), ``split`` and ``source``. Tasks
    on the Hugging Face hub are not tried when the hub cannot be reached (asked
    once for all of them); their reason says how to give local files.
    """
    from rcn_fast.eval.tasks.sources import LOCAL_DATA_HINT, hub_access, needs_hub
    from rcn_fast.eval.tasks.catalog import load_task_questions, resolve_task

    entries = dict(entries or {})
    info: dict[str, dict[str, Any]] = {}
    reasons: dict[str, str] = {}
    specs: dict[str, Any] = {}
    for t in tasks:
        try:
            specs[t] = resolve_task(entries.get(t, t), split=cfg.split, include_paths=cfg.include_path)
        except Exception as exc:  # noqa: BLE001  (reported in the cell, not raised)
            reasons[t] = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
    on_hub = [t for t, s in specs.items() if needs_hub(s)]
    status, why = hub_access() if on_hub else ("online", "")
    if status == "unreachable":
        log(f"rcn_fast.eval: warning: the Hugging Face hub cannot be reached ({why}); the tasks "
            f"{', '.join(on_hub)} load from it and are not run: {LOCAL_DATA_HINT}")
    for t, spec in specs.items():
        info[t] = {"source": spec.where, "split": spec.split, "paper_questions": spec.expected_count,
                   "questions": None, "on_hub": t in on_hub}
        if status == "unreachable" and t in on_hub:
            reasons[t] = f"{spec.where} {HUB_UNREACHABLE}"
            continue
        try:
            info[t]["questions"] = len(load_task_questions(spec, limit=cfg.limit, split=cfg.split))
        except Exception as exc:  # noqa: BLE001  (any load failure is reported in the cell, not raised)
            reasons[t] = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
    return info, reasons


def run_preset(name: str, cfg: Any, *, corpora: Mapping[str, str] | None = None, seeds: Sequence[int] | None = None,
               tasks: Sequence[str] | None = None, evaluate: Callable[..., dict[str, Any]] | None = None,
               llm: Any = None, encoder: Any = None) -> tuple[PaperReport, dict[str, str]]:
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
    tasks : sequence of str, optional
        ``--tasks`` entries giving the table's tasks local data
        (:func:`task_entries`: ``NAME=FILE``, ``NAME=DIR``, ``DIR``).
    evaluate : callable, optional
        :func:`rcn_fast.eval.evaluate` (a stand-in in tests).
    llm, encoder : optional
        An already-built LLM and retrieval encoder used by every row
        (default: ``cfg.model`` and the encoder, each loaded once).

    Returns
    -------
    (PaperReport, dict of written file paths)

    Raises
    ------
    ValueError
        An unknown table or a ``--tasks`` entry the table does not use.
    EvalError
        A model that cannot load (before any row runs).
    """
    from rcn_fast.eval.config import EvalError
    from rcn_fast.eval.tasks.sources import LOCAL_DATA_HINT

    if evaluate is None:
        from rcn_fast.eval.run.runner import evaluate
    preset: Preset = get_preset(name)
    corpora = dict(corpora or {})
    seeds = list(seeds) if seeds else list(DEFAULT_SEEDS)
    entries = task_entries(preset, tasks or (), cfg.include_path)
    for key, corpus in [("corpus", cfg.corpus), *((f"paper-corpus {k}", v) for k, v in corpora.items())]:
        if corpus is not None and (why := corpus_problem(str(corpus), cfg.corpus_text_field)) is not None:
            raise EvalError(f"--{key}: {why}")  # before any row runs, as a plain eval
    task_info, task_reasons = check_tasks(preset.tasks(), cfg, entries)
    tasks_ok = [t for t in preset.tasks() if t not in task_reasons]
    for t, why in task_reasons.items():
        if not why.endswith(HUB_UNREACHABLE):  # those are named once, with the fix, by check_tasks
            log(f"--paper {preset.name}: task {t} is not evaluated: {why}")
    hub_failed = [t for t in task_reasons if task_info.get(t, {}).get("on_hub")]
    if any(not task_reasons[t].endswith(HUB_UNREACHABLE) for t in hub_failed):
        log(f"--paper {preset.name}: the tasks {', '.join(hub_failed)} load from the Hugging Face hub: "
            f"{LOCAL_DATA_HINT}")
    if not tasks_ok:
        log(f"--paper {preset.name}: error: none of its tasks ({', '.join(preset.tasks())}) can be evaluated; "
            "no row is run")
    row_reasons: dict[str, str] = {}
    runs: dict[str, RowRun] = {}
    for row in preset.rows:
        run = preset.run_of(row)
        why = row_reason(run, cfg, corpora)
        if why is not None:
            row_reasons[row] = why
            log(f"--paper {preset.name}: row {row} is not run: {why}")
        elif tasks_ok:  # with no task, each cell gives its tasks' reasons
            runs[row] = run  # type: ignore[assignment]
    shared = _shared_loader(cfg, llm, encoder, runs.values() if tasks_ok else ())
    measured: dict[str, dict[str, dict[str, Any]]] = {}
    done: dict[str, dict[str, Any]] = {}  # run slug -> {"results": {task: result}, "files": [...], "config": {...}}
    for i, (row, run) in enumerate(runs.items(), 1):
        slug = run.slug()
        if slug not in done:
            log(f"--paper {preset.name}: row {i} of {len(runs)}: {row} ({slug}) on {', '.join(tasks_ok) or 'no task'}")
            by_corpus: dict[str | None, list[str]] = {}
            for t in tasks_ok:
                by_corpus.setdefault(corpus_of(t, run, cfg, corpora), []).append(t)
            entry = {"results": {}, "files": [], "config": None}
            try:
                for corpus, group in by_corpus.items():
                    row_cfg = replace(cfg, pipelines=[run.pipeline], tasks=[entries.get(t, t) for t in group],
                                      seeds=seeds, corpus=corpus, plot=False,
                                      pipeline_args={**cfg.pipeline_args, **run.pipeline_args})
                    doc = evaluate(row_cfg, llm=llm, encoder=encoder, print_table=False, components=shared,
                                   labels={run.pipeline: row})
                    for t in group:
                        r = doc.get("results", {}).get(t, {}).get(run.pipeline)
                        entry["results"][t] = r
                        if r is not None and entry["config"] is None:
                            entry["config"] = r.get("config")
                    if doc.get("files", {}).get("results"):
                        entry["files"].append(doc["files"]["results"])
            except EvalError as exc:
                row_reasons[row] = f"could not run: {exc}"
                log(f"--paper {preset.name}: row {row} could not run: {exc}")
                continue
            done[slug] = entry
        measured[row] = {t: r for t, r in done[slug]["results"].items() if r is not None}
    report = PaperReport(preset, fill_cells(preset, measured, row_reasons, task_reasons), model=str(cfg.model),
                         seeds=seeds, settings=_settings(cfg, corpora, seeds, tasks or (), llm, encoder),
                         tasks=task_info, runs={row: {"run": slug, "pipeline": run.pipeline,
                                                      "results": done[slug]["files"], "config": done[slug]["config"]}
                                                for row, run in runs.items() if (slug := run.slug()) in done})
    if hub_failed:
        report.notes.append(f"{', '.join(hub_failed)}: not evaluated, loading from the Hugging Face hub failed (the "
                            f"reasons are under the table); {LOCAL_DATA_HINT}.")
    if preset.kind == "cost":
        report.notes.append("#Tokens is measured as generated tokens per question; rcn_fast scores the answer "
                            "labels without generating, where the paper's Single RAG counts its one answer token")
    return report, report.write(Path(cfg.output_path).expanduser())


def _shared_loader(cfg: Any, llm: Any, encoder: Any, runs: Any) -> Any:
    """One loader for every row (:class:`~rcn_fast.eval.run.loading.Components`): each model loads once. The
    user's LLM is loaded now when a row needs it (a model that cannot load stops the table before any
    row runs); the encoder and the retrievers when a row first needs them."""
    from rcn_fast.eval.run.executors import given_llm, output_folder
    from rcn_fast.eval.run.loading import Components
    from rcn_fast.eval.pipeline_needs import needs_llm, pipeline_registry

    given = given_llm(cfg, llm)
    shared = Components(cfg, output_folder(cfg), llm=given, encoder=encoder)
    reg = pipeline_registry()
    if given is None and any(needs_llm(reg[r.pipeline]) for r in runs):
        shared.llm()
    return shared


def _settings(cfg: Any, corpora: Mapping[str, str], seeds: list[int], tasks: Sequence[str], llm: Any,
              encoder: Any) -> dict[str, Any]:
    """What the run was given, for the report (the settings that explain a difference from the paper)."""
    from rcn_fast.eval.config import DEFAULT_ENCODER
    from rcn_fast.model_files import describe_model

    model = describe_model(llm if llm is not None else cfg.model)
    if llm is not None and isinstance(cfg.model, str):
        model = {**describe_model(cfg.model), "identity": getattr(llm, "identity", None)}
    given = (encoder.describe() if hasattr(encoder, "describe") else {}).get("model_dir") if encoder is not None else None
    encoder = given or cfg.encoder or _store_encoder(cfg.corpus, *corpora.values()) or DEFAULT_ENCODER
    return {"model": model, "encoder": describe_model(str(encoder)),
            "corpus": cfg.corpus, "paper_corpus": dict(corpora), "kb": cfg.kb, "limit": cfg.limit, "seeds": seeds,
            "tasks": list(tasks), "pipeline_args": dict(cfg.pipeline_args), "model_args": dict(cfg.model_args),
            "batch_size": cfg.batch_size, "device": cfg.device, "output_path": str(cfg.output_path)}


def _store_encoder(*corpora: str | None) -> str | None:
    """The encoder the first corpus store names in its manifest (None: no store)."""
    for c in corpora:
        manifest = Path(str(c)) / "manifest.json" if c else None
        if manifest is not None and manifest.is_file():
            try:
                model = json.loads(manifest.read_text(encoding="utf-8")).get("encoder", {}).get("model")
            except (OSError, ValueError, AttributeError):
                continue
            if isinstance(model, str):
                return model
    return None
