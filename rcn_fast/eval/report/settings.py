"""Every setting that tells two runs apart, for the results JSON (``run``),
the markdown report and the results page: the model's full spec, the
encoder, each task's corpus, source and question count, ``--limit``, the
seeds, the command line's ``--pipeline-args`` (and the task files' own
settings), ``--permute-choices``, the batch size and each cell's
questions/s."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def encoder_of(cfg: Any, corpus: str | None, loaded: dict[str, Any]) -> str | None:
    """What a task's retrieval encoded with: the loaded retriever's encoder
    (its model; ``loaded["*"]``: the encoder given or loaded for corpus
    files), else ``--encoder``, else the default (a corpus file) or the
    store's own (a store folder); None without a corpus."""
    from rcn_fast.eval.config import DEFAULT_ENCODER

    if corpus is None:
        return None
    store = Path(corpus).is_dir()
    d = loaded.get(corpus) or (None if store else loaded.get("*"))
    if isinstance(d, dict) and d.get("model"):
        return str(d["model"])
    if cfg.encoder:
        return str(cfg.encoder)
    return "the store's own (see its manifest.json)" if store else f"{DEFAULT_ENCODER} (default)"


def run_settings(state: Any, results: dict[str, Any]) -> dict[str, Any]:
    """The ``run`` block of the results JSON.

    Returns
    -------
    dict
        ``model`` (the full spec, never shortened), ``model_name``,
        ``model_identity``; ``tasks`` ``{task: {"source", "split", "file",
        "n_questions", "corpus", "corpus_store", "encoder"}}``; ``limit``,
        ``seeds``, ``n_seeds``, ``pipeline_args`` (the command line's),
        ``task_pipeline_args`` (the task files' own), ``permute_choices``,
        ``batch_size``, ``questions_per_s`` ``{task: {pipeline: q/s}}``.
    """
    cfg = state.config
    d = cfg.to_dict()
    model = results.get("model", {})
    tasks: dict[str, Any] = {}
    for spec in state.tasks:
        corpus = next((u.corpus for u in state.units if u.task.name == spec.name and u.corpus), None)
        tasks[spec.name] = {
            "source": spec.where, "split": spec.split, "file": spec.source or None,
            "n_questions": len(state.questions[spec.name]), "corpus": corpus,
            "corpus_store": (state.corpora or {}).get(corpus) if corpus else None,
            "encoder": encoder_of(cfg, corpus, getattr(state, "encoders", {}) or {}),
        }
    return {
        "model": d["model"], "model_name": model.get("name"), "model_identity": model.get("identity"),
        "tasks": tasks, "limit": cfg.limit, "seeds": list(cfg.seeds), "n_seeds": len(cfg.seeds),
        "pipeline_args": dict(cfg.pipeline_args), "model_args": dict(cfg.model_args),
        "task_pipeline_args": {s.name: s.pipeline_args for s in state.tasks if s.pipeline_args},
        "permute_choices": getattr(cfg, "permute_choices", 0), "batch_size": cfg.batch_size,
        "questions_per_s": {t: {p: r.get("questions_per_s") for p, r in by_p.items()}
                            for t, by_p in results["results"].items()},
    }


def _kv(d: dict[str, Any]) -> str:
    return " ".join(f"{k}={v}" for k, v in d.items()) or "none"


def settings_markdown(run: dict[str, Any]) -> str:
    """The report's "Run settings" section (a two-column table)."""
    rows = [("model", f"`{run['model']}`" + (f" ({run['model_name']})" if run.get("model_name") else ""))]
    if run.get("model_args"):
        rows.append(("--model-args", _kv(run["model_args"])))
    for t, s in run["tasks"].items():
        src = f"{s['source']}" + (f" ({s['split']})" if s.get("split") else "")
        rows.append((f"task {t}", f"{src}, {s['n_questions']} questions" + (f"; task file {s['file']}"
                                                                         if s.get("file") else "")))
        if s.get("corpus"):
            store = f" (store {s['corpus_store']})" if s.get("corpus_store") and s["corpus_store"] != s["corpus"] else ""
            rows.append((f"corpus {t}", f"{s['corpus']}{store}"))
            rows.append((f"encoder {t}", str(s.get("encoder"))))
    rows += [("--limit", "none (every question)" if run["limit"] is None else str(run["limit"])),
             ("seeds", f"{' '.join(map(str, run['seeds']))} (n = {run['n_seeds']})"),
             ("--pipeline-args", _kv(run["pipeline_args"])),
             ("--permute-choices", str(run["permute_choices"]) if run.get("permute_choices") else "off"),
             ("--batch-size", str(run["batch_size"]))]
    for t, by_p in run["task_pipeline_args"].items():
        for p, args in by_p.items():
            rows.append((f"task file settings {t} / {p}", _kv(args)))
    qps = [f"{t} / {p} {v:.2f}" for t, by_p in run["questions_per_s"].items() for p, v in by_p.items() if v]
    if qps:
        rows.append(("questions/s", "; ".join(qps)))
    cell = (lambda x: str(x).replace("|", "\\|").replace("\n", " "))
    return "\n".join(["", "## Run settings", "", "| Setting | Value |", "|---|---|"]
                     + [f"| {cell(k)} | {cell(v)} |" for k, v in rows]) + "\n"


__all__ = ["run_settings", "settings_markdown", "encoder_of"]
