"""``python -m rcn_fast.eval show RUN_DIR --id Q``: one question's records,
readably, in the terminal.

It reads the run's latest ``results_<timestamp>.json`` in ``RUN_DIR`` (or
the results file given), finds the question in the checkpoints of every
task x pipeline x seed that file lists, and prints the question with its
choices and gold, then each pipeline's answer, whether it is right and its
per-choice probabilities side by side, then each pipeline's trace stage by
stage (prompts, outputs and why they stopped, retrieved passages with their
scores, the sampler's relevance and probability for each pooled passage and
the subsets it drew, the answer's label scores). The fields are documented
in docs/evaluation.md ("Per-question records and their trace"). Records of
earlier versions (``label`` / ``answer``) are read as they are.

Nothing is run and nothing is written; the question text comes from a
samples file of the run when there is one, else from the task's own data
read offline (cached hub data only).
"""

from __future__ import annotations

import argparse
import io
import json
import math
import os
import sys
import warnings
from pathlib import Path
from typing import Any, Sequence

from rcn_fast._files import is_file, open_read, read_text
from rcn_fast.eval.run.checkpoint import read_records
from rcn_fast.eval.trace import generation_finishes


class ShowError(ValueError):
    """A run folder, results file or question id that cannot be shown (the message says why)."""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m rcn_fast.eval show",
                                description="Print one question's answers and traces of a finished run.")
    p.add_argument("run", metavar="RUN_DIR", help="the run's output folder (--output-path), or one of its "
                   "results_<timestamp>.json files (default: the folder's latest)")
    p.add_argument("--id", required=True, dest="qid", metavar="Q", help="the question id")
    p.add_argument("--task", help="only this task (default: every task with the question)")
    p.add_argument("--pipelines", nargs="+", metavar="NAME", help="only these pipelines")
    p.add_argument("--seed", type=int, help="only this seed")
    p.add_argument("--full", action="store_true", help="every prompt turn and whole texts (default: the system "
                   "turn, the question turn and the pre-fill of each prompt; long texts cut)")
    return p


# ------------------------------------------------------------------ reading
def find_results(run: str | os.PathLike[str]) -> tuple[Path, Path, dict[str, Any]]:
    """(output folder, results file, its document) of ``run``: a folder
    (its latest ``results_*.json``) or a results file."""
    path = Path(run).expanduser()
    if path.is_file():
        folder, res = path.parent, path
    elif path.is_dir():
        found = sorted(path.glob("results_*.json"))
        if not found:
            raise ShowError(f"{path}: no results_<timestamp>.json in this folder (run python -m rcn_fast.eval "
                            f"--output-path {path} first, or name the run's folder)")
        folder, res = path, found[-1]
    else:
        raise ShowError(f"{path}: no such file or folder")
    try:
        doc = json.loads(read_text(folder, res.name, what="results", links=False))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ShowError(f"{res}: not a results file rcn_fast wrote ({exc})") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("pipelines"), dict):
        raise ShowError(f"{res}: not a results file rcn_fast wrote (no 'pipelines')")
    return folder, res, doc


def find_records(folder: Path, doc: dict[str, Any], qid: str, *, task: str | None = None,
                 pipelines: Sequence[str] | None = None, seed: int | None = None
                 ) -> list[tuple[str, str, dict[str, Any]]]:
    """``(task, pipeline, record)`` of question ``qid`` in every checkpoint
    the results document lists (filtered), in the document's order."""
    out, some_ids = [], []
    for t, by_pipe in doc["pipelines"].items():
        if task is not None and t != task:
            continue
        for p, info in (by_pipe or {}).items():
            if pipelines and p not in pipelines:
                continue
            for rel in (info or {}).get("checkpoints") or []:
                if not is_file(folder, rel, what="checkpoint"):
                    continue
                recs = read_records(folder, rel)
                rec = recs.get(qid)
                some_ids += list(recs)[:3]
                if rec is not None and (seed is None or rec.get("seed") == seed):
                    out.append((t, p, rec))
    if not out:
        where = f" of task {task!r}" if task else ""
        hint = f" (ids there look like {', '.join(sorted(set(some_ids))[:3])})" if some_ids else ""
        raise ShowError(f"question {qid!r}: no record{where} in this run's checkpoints{hint}")
    return out


def find_question(folder: Path, doc: dict[str, Any], task: str, qid: str) -> tuple[Any, str]:
    """The question (an object with ``question``, ``choices``, ``labels``)
    and where it was read; (None, why) when it cannot be read."""
    for name in (doc.get("files") or {}).get("samples") or []:
        if not str(name).startswith(f"samples_{task}_"):
            continue
        try:
            with io.TextIOWrapper(open_read(folder, name, what="samples", links=False), encoding="utf-8") as f:
                for line in f:
                    if f'"doc_id": {json.dumps(qid)}' in line:
                        d = json.loads(line).get("doc") or {}
                        return _Question(d.get("question", ""), d.get("choices") or [], d.get("labels") or []), name
        except (OSError, ValueError):
            continue
    conf = (doc.get("configs") or {}).get(task)
    if not isinstance(conf, dict):
        return None, "the results file has no spec of this task"
    try:
        from rcn_fast.eval.tasks.loading import load_task_questions
        from rcn_fast.eval.tasks.spec import TaskSpec

        spec = TaskSpec(**{k: v for k, v in conf.items() if k in TaskSpec.__dataclass_fields__})
        before = os.environ.get("HF_HUB_OFFLINE")
        os.environ["HF_HUB_OFFLINE"] = "1"  # a viewer downloads nothing
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                qs = load_task_questions(spec, limit=(doc.get("config") or {}).get("limit"))
        finally:
            if before is None:
                os.environ.pop("HF_HUB_OFFLINE", None)
            else:
                os.environ["HF_HUB_OFFLINE"] = before
    except Exception as exc:  # noqa: BLE001 - the question text is a nicety: say why it is missing
        return None, f"the task's data cannot be read offline ({type(exc).__name__}: {str(exc)[:120]})"
    for q in qs:
        if q.id == qid:
            return q, spec.where
    return None, f"not among the task's questions in {spec.where}"


class _Question:
    def __init__(self, question: str, choices: list[str], labels: list[str]) -> None:
        self.question, self.choices, self.labels = question, list(choices), list(labels)


# ------------------------------------------------------------------ printing
def _cut(text: Any, full: bool, n: int = 400) -> str:
    s = str(text)
    return s if full or len(s) <= n else s[:n] + f" ... [{len(s) - n} more characters; --full shows them]"


def _block(text: Any, indent: str, full: bool, n: int = 1200) -> list[str]:
    return [indent + line for line in _cut(text, full, n).splitlines() or [""]]


def _fmt(x: Any, nd: int = 3) -> str:
    return "-" if x is None else f"{float(x):.{nd}f}"


def summary_lines(q: Any, records: list[tuple[str, str, dict[str, Any]]]) -> list[str]:
    """The question, its choices and gold, then one row per pipeline and
    seed: its answer, the gold, whether right, each choice's probability."""
    pred0 = records[0][2].get("prediction") or {}
    labels = list(getattr(q, "labels", None) or []) or _labels_of(pred0)
    gold_i = pred0.get("gold")
    lines = []
    if q is not None:
        lines.append(q.question)
        for i, (lab, text) in enumerate(zip(q.labels, q.choices)):
            lines.append(f"  {'>' if i == gold_i else ' '} {lab}. {text}" + ("   <- gold" if i == gold_i else ""))
        lines.append("")
    head = f"{'pipeline':20s} {'seed':>4s}  answer  gold  right  " + "  ".join(f"P({lab})".rjust(6) for lab in labels)
    lines += [head, "-" * len(head)]
    for _, p, rec in records:
        pr = rec.get("prediction") or {}
        gold = pr.get("gold_label") or (labels[pr["gold"]] if isinstance(pr.get("gold"), int)
                                        and pr["gold"] < len(labels) else None)
        acc = (rec.get("metrics") or {}).get("acc")
        right = "-" if acc is None else ("yes" if acc == 1.0 else "no")
        probs = [math.exp(x) for x in pr.get("choice_logprobs") or []]
        if "answer_text" in pr:  # an open-domain prediction
            lines.append(f"{p:20s} {rec.get('seed', ''):>4}  {_cut(pr['answer_text'], False, 60)!r}  "
                         f"gold {pr.get('answers')}  string_em {(rec.get('metrics') or {}).get('string_em')}")
            continue
        lines.append(f"{p:20s} {rec.get('seed', ''):>4}  {str(pr.get('pred_label')):6s}  {str(gold or '-'):4s}  "
                     f"{right:5s}  " + "  ".join(_fmt(x).rjust(6) for x in probs))
    return lines


def _labels_of(pred: dict[str, Any]) -> list[str]:
    for e in pred.get("trace") or []:
        if isinstance(e, dict) and isinstance(e.get("labels"), list):
            return [str(x) for x in e["labels"]]
    n = len(pred.get("choice_logprobs") or [])
    return [chr(ord("A") + i) for i in range(n)]


def _prompt_lines(prompt: Any, full: bool) -> list[str]:
    if not isinstance(prompt, list) or not prompt:
        return []
    system = [t for t in prompt[:1] if t.get("role") == "system"]
    turns = prompt if full else system + [t for t in prompt[:-1] if t.get("role") == "user"][-1:] + prompt[-1:]
    shown = "" if full or len(turns) == len(prompt) else "; the system turn, the question turn and the pre-fill shown"
    out = [f"      prompt ({len(prompt)} turns{shown}):"]
    for t in turns:
        cut = f" [rendered complete, cut at the end-of-turn token]" if t.get("cut") else ""
        out.append(f"        {t.get('role')}:{cut}")
        out += _block(repr(t.get("content")) if t is prompt[-1] else t.get("content"), "          ", full, 600)
    return out


def entry_lines(i: int, e: dict[str, Any], passages: dict[str, dict[str, Any]], full: bool) -> list[str]:
    """One trace entry as lines (see docs/evaluation.md for every field)."""
    kind, stage = e.get("type"), e.get("stage")
    agent = f", agent {e['agent']}" if e.get("agent") else ""
    out: list[str] = []
    if kind == "generate":
        reasons = generation_finishes(e)
        cut = sum(r == "length" for r in reasons)
        why = "stopped at the token limit" if cut and len(reasons) == 1 else (
            f"{cut} of {len(reasons)} stopped at the token limit" if cut else "finished")
        dec = f", decoding {e['decoding']}" if e.get("decoding") else ""
        out.append(f"  [{i}] {stage} (generate{agent}): {why}; {e.get('prompt_tokens')} prompt tokens, "
                   f"{e.get('generated_tokens')} generated{dec}")
        out += _prompt_lines(e.get("prompt"), full)
        if "outputs" in e:
            for j, (o, r) in enumerate(zip(e["outputs"], reasons)):
                out.append(f"      output {j + 1} ({r}):")
                out += _block(o, "        ", full)
        else:
            out.append("      output:")
            out += _block(e.get("output", ""), "        ", full)
        if e.get("parsed") is not None:
            out.append("      parsed:")
            out += [f"        - {x}" for x in e["parsed"]] or ["        (nothing)"]
        if e.get("answer") is not None:
            out.append(f"      answer: {e['answer']!r}")
    elif kind == "score":
        out.append(f"  [{i}] {stage} (score{agent})")
        out += _prompt_lines(e.get("prompt"), full)
        lps = e.get("logprobs") or []
        out.append("      " + "  ".join(f"{lab} {float(lp):.3f} ({math.exp(float(lp)):.3f})"
                                          for lab, lp in zip(e.get("labels") or [], lps)) + "   [log-prob (prob)]")
    elif kind == "retrieve":
        src = f", {e['source']}" if e.get("source") else ""
        out.append(f"  [{i}] {stage} (retrieve{src})")
        queries, results, scores = e.get("queries"), e.get("results"), e.get("scores")
        if isinstance(queries, list) and isinstance(results, list):
            for j, (qtext, ids) in enumerate(zip(queries, results)):
                out.append(f"      query {j + 1}: {_cut(qtext, full, 200)!r}")
                row = scores[j] if isinstance(scores, list) and j < len(scores) else [None] * len(ids)
                for pid, s in zip(ids, row):
                    out.append(f"        {pid}  {_fmt(s)}  {_cut((passages.get(pid) or {}).get('text', ''), full, 100)}")
        else:
            if e.get("query") is not None:
                out.append(f"      query: {_cut(e['query'], full, 200)!r}")
            for r in e.get("passages") or []:
                r = r if isinstance(r, dict) else {"id": r}
                text = r.get("text") or (passages.get(str(r.get("id"))) or {}).get("text", "")
                out.append(f"        {r.get('id')}  {_fmt(r.get('score'))}  {_cut(text, full, 100)}")
                for x in r.get("explanations") or []:
                    out.append(f"            - {_cut(x, full, 100)}")
        if isinstance(queries, list) and e.get("pool") is not None:
            out.append(f"      pool ({len(e['pool'])}): {', '.join(map(str, e['pool']))}")
        rest = {k: v for k, v in e.items() if k not in ("stage", "type", "queries", "results", "scores", "passages",
                                                       "pool", "source", "query", "top_n", "given")}
        if rest:
            out += _block(json.dumps(rest, ensure_ascii=False, default=str), "      ", full, 600)
    elif kind == "sample":
        out += _sample_lines(i, e, passages, full)
    else:
        out.append(f"  [{i}] {stage} ({kind}{agent})")
        rest = {k: v for k, v in e.items() if k not in ("stage", "type", "agent")}
        out += _block(json.dumps(rest, ensure_ascii=False, indent=1, default=str), "      ", full, 1500)
    return out


def _sample_lines(i: int, e: dict[str, Any], passages: dict[str, dict[str, Any]], full: bool) -> list[str]:
    temp = f", temperature {e['temperature']:.4g} (tau {e.get('tau')} / score_scale {e.get('score_scale')})" \
        if e.get("temperature") is not None else ""
    out = [f"  [{i}] {e.get('stage')} (sample: {e.get('strategy')}, K = {e.get('subset_size')}{temp}, "
           f"seed {e.get('seed', '-')}, key {e.get('key', '-')})"]
    pool, rel, prob = e.get("pool") or [], e.get("relevance"), e.get("probability")
    out.append("      pool passage   relevance  probability")
    for j, pid in enumerate(pool):
        r = rel[j] if isinstance(rel, list) and j < len(rel) else None
        p = prob[j] if isinstance(prob, list) and j < len(prob) else None
        out.append(f"      {str(pid):14s} {_fmt(r, 4):>9s}  {_fmt(p, 4):>11s}  "
                   f"{_cut((passages.get(str(pid)) or {}).get('text', ''), full, 80)}")
    draws = e.get("draw_probability")
    for j, sub in enumerate(e.get("subsets") or []):
        ps = draws[j] if isinstance(draws, list) and j < len(draws) else [None] * len(sub)
        out.append(f"      subset {j + 1}: " + " -> ".join(f"{pid} (p {_fmt(p)})" for pid, p in zip(sub, ps)))
    return out


def record_lines(task: str, pipeline: str, rec: dict[str, Any], full: bool) -> list[str]:
    """A pipeline's trace for the question, stage by stage."""
    pr = rec.get("prediction") or {}
    cost = pr.get("cost") or {}
    lines = [f"== {pipeline} (task {task}, seed {rec.get('seed')}): {cost.get('llm_calls', 0)} LLM calls, "
             f"{cost.get('prompt_tokens', 0)} prompt + {cost.get('generated_tokens', 0)} generated tokens =="]
    passages = {str(p.get("id")): p for p in pr.get("passages") or [] if isinstance(p, dict)}
    for i, e in enumerate(pr.get("trace") or [], 1):
        if isinstance(e, dict):
            lines += entry_lines(i, e, passages, full)
    if pr.get("knowledge"):
        lines.append("  knowledge given to the answer:")
        lines += [f"    - {_cut(k, full, 300)}" for k in pr["knowledge"]]
    return lines


def show(run: str | os.PathLike[str], qid: str, *, task: str | None = None, pipelines: Sequence[str] | None = None,
         seed: int | None = None, full: bool = False) -> str:
    """The text ``python -m rcn_fast.eval show`` prints for question ``qid`` of ``run``."""
    folder, res, doc = find_results(run)
    records = find_records(folder, doc, qid, task=task, pipelines=pipelines, seed=seed)
    lines = []
    for t in dict.fromkeys(r[0] for r in records):
        mine = [r for r in records if r[0] == t]
        q, where = find_question(folder, doc, t, qid)
        lines.append(f"question {qid} -- task {t} ({res.name}; question from {where if q is not None else '-'})")
        if q is None:
            lines.append(f"(the question text is not shown: {where})")
        lines += summary_lines(q, mine) + [""]
        for _, p, rec in mine:
            lines += record_lines(t, p, rec, full) + [""]
    return "\n".join(lines).rstrip() + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    ns = build_parser().parse_args(argv)
    try:
        text = show(ns.run, ns.qid, task=ns.task, pipelines=ns.pipelines, seed=ns.seed, full=ns.full)
    except (ShowError, OSError) as exc:
        print(f"rcn_fast.eval show: error: {exc}", file=sys.stderr)
        return 2
    sys.stdout.write(text)
    return 0


__all__ = ["show", "main", "build_parser", "find_results", "find_records", "find_question", "summary_lines",
           "record_lines", "entry_lines", "ShowError"]
