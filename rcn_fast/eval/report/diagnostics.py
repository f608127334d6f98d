"""What distorts the numbers of a run: the predicted-label histogram of each
pipeline beside gold's, the majority-label baseline, a warning when one
label takes most predictions, generations stopped by the token limit per
stage, repeated ReConnect subsets, and accuracy over cyclic permutations of
the choices (``--permute-choices K``).

Everything here reads the checkpoint records of a run (both field
spellings: ``pred_label``/``gold`` and the older ``label``/``answer``) and
the questions with their gold answers, and returns plain data for the
results JSON (``diagnostics``), the markdown report and the results page.

Warning thresholds (documented in docs/evaluation.md):

* **label bias**: with at least :data:`WARN_MIN_PREDICTIONS` predictions,
  one label takes more than :data:`WARN_SHARE` of a pipeline's
  predictions on a task whose questions have 4 or more choices (more than
  :data:`WARN_SHARE_FEW` with 2 or 3 choices), or more than
  :data:`WARN_GOLD_RATIO` times gold's share of that label;
* **truncation**: more than :data:`WARN_TRUNCATED` of a stage's
  generations stopped at the token limit (``finish_reason == "length"``).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from rcn_fast.eval.trace import truncation_counts
from rcn_fast.pipelines.records import upgrade_prediction

#: A label's share of a pipeline's predictions above which it is named (tasks with 4+ choices).
WARN_SHARE = 0.5
#: The same for tasks with 2 or 3 choices.
WARN_SHARE_FEW = 0.8
#: A label predicted more than this many times as often as gold has it is named too.
WARN_GOLD_RATIO = 2.0
#: Fewer predictions than this warn of nothing (too few to tell a bias).
WARN_MIN_PREDICTIONS = 10
#: A stage whose share of generations cut at the token limit is above this is named.
WARN_TRUNCATED = 0.25


@dataclass
class TaskRecords:
    """The records of one task, as the reports read them.

    Attributes
    ----------
    name : str
    kind : str
        The task's kind (``multiple_choice``, ``yes_no``, ``open``).
    questions : list
        The questions with their gold answers, in run order.
    records : dict
        ``{pipeline: {seed: {question id: checkpoint record}}}`` (the plain order).
    permuted : dict
        ``{pipeline: {seed: {shift: {question id: record}}}}``: the records of
        the questions with their choices rotated by ``shift`` (``--permute-choices``).
    permute_k : int
        The number of orders asked for (0: off).
    permute_skipped : str or None
        Why this task was not permuted (open domain, choices written into the question).
    """

    name: str
    kind: str
    questions: list[Any]
    records: dict[str, dict[int, dict[str, dict[str, Any]]]]
    permuted: dict[str, dict[int, dict[int, dict[str, dict[str, Any]]]]] = field(default_factory=dict)
    permute_k: int = 0
    permute_skipped: str | None = None

    @property
    def choice(self) -> bool:
        return self.kind != "open"

    @property
    def pipelines(self) -> list[str]:
        return list(self.records)

    @property
    def seeds(self) -> list[int]:
        return sorted({s for by_seed in self.records.values() for s in by_seed})


def collect(state: Any) -> dict[str, TaskRecords]:
    """``{task: TaskRecords}`` of a run's state (:class:`rcn_fast.eval.run.runner.RunState`)."""
    out: dict[str, TaskRecords] = {}
    k = int(getattr(state.config, "permute_choices", 0) or 0)
    for spec in state.tasks:
        tr = TaskRecords(spec.name, spec.kind, list(state.questions[spec.name]), {}, permute_k=k)
        for u in state.units:
            if u.task.name != spec.name:
                continue
            ids = {q.id for q in u.questions}
            recs = {i: r for i, r in u.checkpoint.records.items() if i in ids}
            shift = int(getattr(u, "permutation", 0) or 0)
            if shift:
                tr.permuted.setdefault(u.pipeline, {}).setdefault(u.seed, {})[shift] = recs
            else:
                tr.records.setdefault(u.pipeline, {})[u.seed] = recs
        if k > 1:
            from rcn_fast.eval.run.permute import skip_reason

            tr.permute_skipped = skip_reason(spec)
        out[spec.name] = tr
    return out


# ------------------------------------------------------------------ reading records
def prediction_of(record: dict[str, Any]) -> dict[str, Any]:
    """A record's prediction with today's field names (former files' ``label``/``answer`` mapped by
    :func:`rcn_fast.pipelines.records.upgrade_prediction`, the one place that maps them)."""
    p = record.get("prediction")
    return upgrade_prediction(p) if isinstance(p, dict) else {}


def predicted_label(record: dict[str, Any], question: Any) -> str | None:
    """The predicted choice's label (``pred`` through the question's
    labels; else the record's ``pred_label``)."""
    p = prediction_of(record)
    i = p.get("pred")
    labels = list(getattr(question, "labels", None) or [])
    if isinstance(i, int) and 0 <= i < len(labels):
        return labels[i]
    lab = p.get("pred_label")
    return lab if isinstance(lab, str) else None


def gold_index(question: Any, record: dict[str, Any] | None = None) -> int | None:
    """The gold choice index: the question's, else the record's ``gold``."""
    g = getattr(question, "answer", None)
    if g is None and record is not None:
        p = prediction_of(record)
        g = p.get("gold")
    return g if isinstance(g, int) and not isinstance(g, bool) else None


def gold_label(question: Any) -> str | None:
    g = gold_index(question)
    labels = list(getattr(question, "labels", None) or [])
    return labels[g] if g is not None and g < len(labels) else None


def subsets_repeat(entry: dict[str, Any]) -> bool | None:
    """Whether a ``sample`` entry drew the same set of passages twice (None: not a sample entry)."""
    subs = entry.get("subsets") if entry.get("type") == "sample" else None
    if not isinstance(subs, list) or len(subs) < 2:
        return None
    sets = [frozenset(map(str, s)) for s in subs if isinstance(s, list)]
    return len(set(sets)) < len(sets)


# ------------------------------------------------------------------ diagnostics
def label_order(questions: list[Any]) -> list[str]:
    """Every label of the task's questions, in first-seen order."""
    seen: dict[str, None] = {}
    for q in questions:
        for lab in getattr(q, "labels", None) or []:
            seen.setdefault(lab, None)
    return list(seen)


def _share(n: int, of: int) -> float:
    return n / of if of else 0.0


def bias_warning(task: str, pipeline: str, hist: dict[str, int], gold: dict[str, int], n_choices: int,
                 always_top: float | None) -> str | None:
    """The warning of one pipeline's label histogram, or None (see the module docstring)."""
    n = sum(hist.values())
    if n < WARN_MIN_PREDICTIONS or not hist:
        return None
    top, count = max(hist.items(), key=lambda kv: kv[1])
    share = count / n
    n_gold = sum(gold.values())
    gshare = _share(gold.get(top, 0), n_gold) if n_gold else None
    limit = WARN_SHARE if n_choices >= 4 else WARN_SHARE_FEW
    over_gold = gshare is not None and share > WARN_GOLD_RATIO * gshare
    if share <= limit and not over_gold:
        return None
    g = f"; gold has {top} on {gold.get(top, 0)} of {n_gold} ({gshare:.0%})" if gshare is not None else ""
    a = f"; always answering {top} would score {always_top:.3f}" if always_top is not None else ""
    return f"{task} / {pipeline}: answered {top} on {count} of {n} predictions ({share:.0%}){g}{a}"


def task_diagnostics(tr: TaskRecords) -> dict[str, Any]:
    """The diagnostics of one task (see the module docstring): ``labels``,
    ``gold`` histogram, ``majority_baseline``, and per pipeline its
    ``histogram``, ``top_label``, ``top_share``, ``always_top_acc``,
    ``warning``, ``truncation`` ``{stage: {"generations", "truncated"}}``,
    ``repeated_subsets`` and, with permutations, ``permutations``."""
    qs = tr.questions
    labels = label_order(qs) if tr.choice else []
    gold = Counter(lab for q in qs if (lab := gold_label(q)) is not None) if tr.choice else Counter()
    n_gold = sum(gold.values())
    sizes = Counter(len(q.choices) for q in qs if hasattr(q, "choices"))
    n_choices = sizes.most_common(1)[0][0] if sizes else 0
    out: dict[str, Any] = {"kind": tr.kind, "labels": labels, "n_questions": len(qs), "n_choices": n_choices,
                           "gold": {lab: gold.get(lab, 0) for lab in labels}, "majority_baseline": None,
                           "pipelines": {}}
    if n_gold:
        lab, c = max(((lab, gold.get(lab, 0)) for lab in labels), key=lambda kv: kv[1])
        out["majority_baseline"] = {"label": lab, "acc": c / n_gold, "n": n_gold}
    by_id = {q.id: q for q in qs}
    for p, by_seed in tr.records.items():
        hist: Counter[str] = Counter()
        preds: list[dict[str, Any]] = []
        repeated = sampled = 0
        for recs in by_seed.values():
            for qid, rec in recs.items():
                q = by_id.get(qid)
                if q is None:
                    continue
                if tr.choice and (lab := predicted_label(rec, q)) is not None:
                    hist[lab] += 1
                preds.append(prediction_of(rec))
                for e in preds[-1].get("trace") or []:
                    rep = subsets_repeat(e) if isinstance(e, dict) else None
                    if rep is not None:
                        sampled += 1
                        repeated += int(rep)
        stages = {s: {"generations": t, "truncated": c} for s, (c, t) in truncation_counts(preds).items()}
        d: dict[str, Any] = {"n_predictions": sum(hist.values()), "truncation": stages}
        if tr.choice:
            d["histogram"] = {lab: hist.get(lab, 0) for lab in labels}
            top = max(labels, key=lambda lab: hist.get(lab, 0)) if hist else None
            d["top_label"] = top
            d["top_share"] = _share(hist.get(top, 0), sum(hist.values())) if top else None
            d["always_top_acc"] = _share(gold.get(top, 0), n_gold) if top and n_gold else None
            d["warning"] = bias_warning(tr.name, p, dict(hist), dict(gold), n_choices, d["always_top_acc"])
        if sampled:
            d["repeated_subsets"] = {"questions": repeated, "of": sampled}
        if tr.permute_k > 1 and tr.choice and not tr.permute_skipped:
            from rcn_fast.eval.run.permute import permutation_summary

            d["permutations"] = permutation_summary(tr, p)
        out["pipelines"][p] = d
    return out


def truncation_warnings(task: str, diag: dict[str, Any]) -> list[str]:
    out = []
    for p, d in diag["pipelines"].items():
        for stage, s in d.get("truncation", {}).items():
            if s["generations"] and s["truncated"] / s["generations"] > WARN_TRUNCATED:
                out.append(f"{task} / {p}: {s['truncated']} of {s['generations']} {stage} generations stopped at the "
                           f"token limit (max_new_tokens)")
    return out


def diagnose(tasks: dict[str, TaskRecords]) -> dict[str, Any]:
    """``{"tasks": {task: task_diagnostics}, "warnings": [...], "thresholds": {...}}``."""
    per = {name: task_diagnostics(tr) for name, tr in tasks.items()}
    warnings: list[str] = []
    for name, d in per.items():
        warnings.extend(w for p in d["pipelines"].values() if (w := p.get("warning")))
        warnings.extend(truncation_warnings(name, d))
        for p, pd in d["pipelines"].items():
            r = pd.get("repeated_subsets")
            if r and r["questions"]:
                warnings.append(f"{name} / {p}: in {r['questions']} of {r['of']} questions two sampled subsets held "
                                "the same passages")
    return {"tasks": per, "warnings": warnings, "thresholds": {
        "label_share_4plus_choices": WARN_SHARE, "label_share_2_3_choices": WARN_SHARE_FEW,
        "label_over_gold_ratio": WARN_GOLD_RATIO, "min_predictions": WARN_MIN_PREDICTIONS,
        "truncated_share": WARN_TRUNCATED}}


# ------------------------------------------------------------------ markdown
def _pct(n: int, of: int) -> str:
    return f"{n} / {of} ({n / of:.0%})" if of else "0 / 0"


def markdown_sections(diag: dict[str, Any]) -> str:
    """The report's sections on what distorts the numbers: warnings, label
    histograms with the majority baseline, truncated generations, permutations."""
    lines = ["", "## What may distort these numbers", ""]
    lines += [f"* warning: {w}" for w in diag["warnings"]] or ["* no warning (thresholds in docs/evaluation.md)"]
    for task, d in diag["tasks"].items():
        pipes = d["pipelines"]
        if d["labels"] and pipes:
            labs = d["labels"]
            lines += ["", f"### Predicted labels: {task} ({d['n_questions']} questions)", "",
                      "| | " + " | ".join(labs) + " | Top label | Always-top acc |",
                      "|---|" + "---:|" * len(labs) + "---|---:|"]
            mb = d["majority_baseline"]
            if mb:
                lines.append("| gold | " + " | ".join(str(d["gold"][x]) for x in labs)
                             + f" | {mb['label']} ({mb['acc']:.0%}) | {mb['acc']:.3f} (majority baseline) |")
            for p, pd in pipes.items():
                top = f"{pd['top_label']} ({pd['top_share']:.0%})" if pd.get("top_label") else "-"
                acc = f"{pd['always_top_acc']:.3f}" if pd.get("always_top_acc") is not None else "-"
                lines.append(f"| {p} | " + " | ".join(str(pd["histogram"][x]) for x in labs) + f" | {top} | {acc} |")
        rows = [(p, st, s) for p, pd in pipes.items() for st, s in pd.get("truncation", {}).items()]
        if rows:
            lines += ["", f"### Generations stopped by the token limit: {task}", "",
                      "| Pipeline | Stage | Stopped / generations |", "|---|---|---:|"]
            lines += [f"| {p} | {st} | {_pct(s['truncated'], s['generations'])} |" for p, st, s in rows]
        perm = [(p, pd["permutations"]) for p, pd in pipes.items() if pd.get("permutations")]
        if perm:
            k = perm[0][1]["k"]
            lines += ["", f"### Accuracy over {k} cyclic permutations of the choices: {task}", "",
                      "| Pipeline | Plain acc | Acc over permutations | Same choice in every order | Questions |",
                      "|---|---:|---:|---:|---:|"]
            for p, s in perm:
                f = (lambda v: "-" if v is None else f"{v:.4f}")
                lines.append(f"| {p} | {f(s['plain_acc'])} | {f(s['acc'])} | {f(s['consistency'])} | {s['n']} |")
    return "\n".join(lines) + "\n"


__all__ = ["TaskRecords", "collect", "diagnose", "task_diagnostics", "markdown_sections", "predicted_label",
           "gold_index", "gold_label", "label_order", "bias_warning", "WARN_SHARE", "WARN_SHARE_FEW",
           "WARN_GOLD_RATIO", "WARN_MIN_PREDICTIONS", "WARN_TRUNCATED"]
