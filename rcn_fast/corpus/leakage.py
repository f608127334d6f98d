"""Leakage check: documents of a retrieval corpus that hold an evaluated question.

ReConnect's corpus never contains a dev or test set (App. A.2). This module
finds the documents that would break that rule, for any corpus and any
multiple-choice questions:

* ``question``: the document contains the question's text;
* ``question+answer``: the document contains the question together with its
  gold answer: the question followed by the answer (``"The sun is
  responsible for plants sprouting ..."``), or, for a fill-in-the-blank
  question (WinoGrande's ``_``), the sentence with the gold answer in the blank.

A blank question's ``question`` pattern is its sentence filled with any of
its choices (a document holding the sentence with a wrong option still holds
the question). Matching is on normalised text: lower case, every run of
characters that are not letters or digits replaced by one space; a pattern
must appear as a run of whole words. Patterns shorter than
``min_tokens`` words (default 4) are not checked: a three-word question such
as "What is ice?" matches ordinary statements. Each document is reported once,
under its strongest kind (``question+answer`` over ``question``), for each
task it leaks.
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

_NON_WORD = re.compile(r"[\W_]+", re.UNICODE)
ANCHOR = 3  # words of a pattern's start used to find candidate documents
KINDS = ("question+answer", "question")


def normalise_text(text: str) -> str:
    """Lower case, runs of non-alphanumerics to one space, stripped."""
    return _NON_WORD.sub(" ", text.lower()).strip()


@dataclass(frozen=True)
class LeakPattern:
    task: str
    question_id: str
    kind: str  # "question" or "question+answer"
    words: str  # normalised pattern


@dataclass
class LeakReport:
    """Counts of leaking documents per task, source and kind, with a few examples."""

    counts: Counter = field(default_factory=Counter)  # (task, source, kind) -> documents
    questions: dict[str, set[str]] = field(default_factory=lambda: defaultdict(set))  # task -> leaked question ids
    examples: list[dict[str, str]] = field(default_factory=list)
    leaking_documents: set[str] = field(default_factory=set)  # ids of documents that hold any question
    max_examples: int = 20

    def add(self, task: str, source: str, kind: str, qid: str, doc_id: str, text: str) -> None:
        self.leaking_documents.add(doc_id)
        self.counts[(task, source, kind)] += 1
        self.questions[task].add(qid)
        if len(self.examples) < self.max_examples:
            self.examples.append({"task": task, "source": source, "kind": kind, "question_id": qid,
                                  "doc_id": doc_id, "text": text[:300]})

    @property
    def total(self) -> int:
        """Distinct documents that hold at least one evaluated question (of any task)."""
        return len(self.leaking_documents)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready summary: distinct leaking documents; per task the documents by source and kind and
        the number of its questions found in the corpus."""
        tasks: dict[str, Any] = {}
        for (task, source, kind), n in sorted(self.counts.items()):
            t = tasks.setdefault(task, {"documents": 0, "questions_leaked": len(self.questions[task]),
                                        "by_source": {}})
            t["documents"] += n
            t["by_source"].setdefault(source, {})[kind] = n
        return {"documents": self.total, "tasks": tasks, "examples": self.examples}

    def lines(self) -> list[str]:
        """Human-readable summary lines."""
        d = self.to_dict()
        if not d["tasks"]:
            return ["leakage check: no document holds an evaluated question"]
        out = [f"leakage check: {d['documents']} document(s) hold evaluated questions"]
        for task, t in d["tasks"].items():
            parts = ", ".join(f"{src}: " + ", ".join(f"{n} {k}" for k, n in kinds.items())
                              for src, kinds in t["by_source"].items())
            out.append(f"  {task}: {t['documents']} document(s), {t['questions_leaked']} question(s) ({parts})")
        return out


class LeakChecker:
    """Finds documents that hold evaluated questions (see the module docstring).

    Parameters
    ----------
    tasks : mapping of task name -> sequence of MCQuestion
    min_tokens : int
        Patterns with fewer normalised words are skipped.
    """

    def __init__(self, tasks: Mapping[str, Iterable[Any]], min_tokens: int = 4) -> None:
        if not isinstance(min_tokens, int) or isinstance(min_tokens, bool) or min_tokens < ANCHOR:
            raise ValueError(f"min_tokens: expected an int >= {ANCHOR}, got {min_tokens!r}")
        self._by_anchor: dict[tuple[str, ...], list[LeakPattern]] = defaultdict(list)
        self.n_patterns = 0
        self.n_questions = 0
        for task, questions in tasks.items():
            for q in questions:
                self.n_questions += 1
                for pat in question_patterns(task, q):
                    words = pat.words.split()
                    if len(words) < min_tokens:
                        continue
                    self._by_anchor[tuple(words[:ANCHOR])].append(pat)
                    self.n_patterns += 1
        self._anchors = frozenset(self._by_anchor)

    def match(self, text: str) -> list[LeakPattern]:
        """The strongest pattern per (task, question) that ``text`` holds; [] when none."""
        words = normalise_text(text).split()
        if len(words) < ANCHOR:
            return []
        grams = set(zip(*(words[i:] for i in range(ANCHOR))))
        hits = grams & self._anchors
        if not hits:
            return []
        padded = f" {' '.join(words)} "
        best: dict[tuple[str, str], LeakPattern] = {}
        for anchor in hits:
            for pat in self._by_anchor[anchor]:
                key = (pat.task, pat.question_id)
                if key in best and best[key].kind == "question+answer":
                    continue
                if f" {pat.words} " in padded:
                    if key not in best or pat.kind == "question+answer":
                        best[key] = pat
        return list(best.values())


def question_patterns(task: str, q: Any) -> list[LeakPattern]:
    """The ``question`` and ``question+answer`` patterns of one MCQuestion."""
    qid = str(q.id)
    gold = q.choices[q.answer] if q.answer is not None else None
    out: list[LeakPattern] = []
    if "_" in q.question and q.question.count("_") == 1:  # fill-in-the-blank (WinoGrande)
        for i, choice in enumerate(q.choices):
            filled = normalise_text(q.question.replace("_", f" {choice} "))
            kind = "question+answer" if i == q.answer else "question"
            out.append(LeakPattern(task, qid, kind, filled))
        return out
    question = normalise_text(q.question)
    out.append(LeakPattern(task, qid, "question", question))
    if gold is not None and normalise_text(gold):
        out.append(LeakPattern(task, qid, "question+answer", f"{question} {normalise_text(gold)}".strip()))
    return out


def check_documents(checker: LeakChecker, docs: Iterable[tuple[str, str, str]],
                    report: LeakReport | None = None) -> LeakReport:
    """Run ``checker`` over ``(doc_id, source, text)`` triples; returns the (updated) report."""
    report = report if report is not None else LeakReport()
    for doc_id, source, text in docs:
        for pat in checker.match(text):
            report.add(pat.task, source, pat.kind, pat.question_id, doc_id, text)
    return report


def iter_corpus_documents(corpus: str) -> Iterable[tuple[str, str, str]]:
    """``(id, source, text)`` of an evaluation corpus: a corpus store folder, or a
    statements file (JSON lines with ``text``/``contents``, DPR-style TSV, Parquet)."""
    path = Path(corpus)
    if path.is_dir() and (path / "manifest.json").exists():
        from rcn_fast.retrieval.store import CorpusStore

        store = CorpusStore.open(path)
        for row in range(len(store)):
            yield store.id(row), "corpus", store.text(row)
        return
    from rcn_fast.corpus.sources import SourceSpec, iter_source

    for doc in iter_source(SourceSpec("corpus", str(path))):
        yield doc.orig_id, doc.source, doc.text


def corpus_leak_report(corpus: str, tasks: Mapping[str, Iterable[Any]]) -> LeakReport:
    """The leakage report of an evaluation corpus against the evaluated questions (report only)."""
    return check_documents(LeakChecker(tasks), iter_corpus_documents(corpus))


def cached_corpus_leak_summary(corpus: str, tasks: Mapping[str, Sequence[Any]], cache_dir: Path) -> dict[str, Any]:
    """:func:`corpus_leak_report` as a dict, cached in ``cache_dir`` by the corpus's
    files (path, inode, size, mtime, ctime) and the question ids, so a rerun
    does not rescan; a cached summary of the wrong shape is scanned again."""
    import hashlib
    import json
    import os

    path = Path(corpus)
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    stats = [(f, f.stat()) for f in files]
    ident = {"corpus": os.fspath(path.resolve()),
             "files": [[os.fspath(f), st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns] for f, st in stats],
             "tasks": {t: [str(q.id) for q in qs] for t, qs in sorted(tasks.items())}}
    key = hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:16]
    cached = cache_dir / f"leaks-{key}.json"
    if cached.exists():
        try:
            got = json.loads(cached.read_text(encoding="utf-8"))
            if _summary_ok(got, tasks):
                return got
        except (OSError, ValueError, RecursionError):
            pass
    summary = corpus_leak_report(corpus, tasks).to_dict()
    cache_dir.mkdir(parents=True, exist_ok=True)
    tmp = cached.with_name(cached.name + ".tmp")
    tmp.write_text(json.dumps(summary), encoding="utf-8")
    os.replace(tmp, cached)
    return summary


def _summary_ok(d: Any, tasks: Mapping[str, Sequence[Any]]) -> bool:
    """Whether a cached summary has the shape :meth:`LeakReport.to_dict`
    writes (counts that are integers >= 0, of this run's tasks)."""
    def count(v: Any) -> bool:
        return isinstance(v, int) and not isinstance(v, bool) and v >= 0

    if not isinstance(d, dict) or not count(d.get("documents")) or not isinstance(d.get("tasks"), dict):
        return False
    return all(t in tasks and isinstance(v, dict) and count(v.get("documents")) and count(v.get("questions_leaked"))
               and v["questions_leaked"] <= len(tasks[t]) and isinstance(v.get("by_source"), dict)
               for t, v in d["tasks"].items())


def leak_warning(corpus: str, summary: dict[str, Any]) -> str | None:
    """The eval's one-line warning for a corpus that holds evaluated questions (None when clean)."""
    if not summary.get("documents"):
        return None
    per_task = ", ".join(f"{t}: {v['questions_leaked']} question(s) in {v['documents']} document(s)"
                         for t, v in summary["tasks"].items())
    return (f"corpus {corpus} holds evaluated questions ({per_task}); the paper's corpus holds no dev or test "
            f"question: drop them with `python -m rcn_fast.corpus assemble ... --task TASK=FILE --drop-leaks`")
