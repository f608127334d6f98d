"""``python -m rcn_fast.corpus assemble``: one statements file from named public sources.

ReConnect (App. A.2, Table 5) retrieves from RACo's statements, COCONUT's and
ZEBRA-KB's explanations, with RACo's commonsense benchmark datasets part
(CBD) left out for the in-domain tasks and no dev or test set in the corpus.
:func:`assemble_corpus` turns such sources (see :mod:`rcn_fast.corpus.sources`)
into one JSON-lines statements file that ``corpus build`` embeds::

    {"id": "0", "text": "...", "source": "raco/cbd/anli", "orig_id": "17"}

* **Streaming.** Documents are read one at a time and written at once; what
  stays in memory is one 8-byte hash per distinct document written (about
  190 MB for 23.5M documents), never the texts.
* **Deduplication.** Exact duplicates (same text after stripping outer
  white space) are dropped by default, the first occurrence kept, counted
  per source; ``dedup="near"`` also drops texts equal after normalisation
  (case, punctuation and spacing ignored: :func:`rcn_fast.corpus.leakage.normalise_text`),
  a cheap stand-in for the SimHash near-duplicate pass of RACo's scripts;
  ``dedup="none"`` keeps every document. Duplicates are found by a 64-bit
  BLAKE2b hash of the (normalised) text: two different texts share one with
  probability below 1e-5 over 23.5M documents.
* **Exclusion.** ``exclude=("cbd",)`` drops every document whose source label
  (``NAME`` or ``NAME/sub/folder/file``) has a component ``cbd``; excluded
  files are not read.
* **Leakage.** With ``tasks`` given, every document that holds an evaluated
  question (:mod:`rcn_fast.corpus.leakage`) is counted per task, source and
  kind, written to ``<out>.leaks.json``, and dropped with ``drop_leaks=True``.
* **Resume.** Progress is committed every ``chunk_size`` documents read
  (``<out>.assemble.json``: the bytes of the output that are final and how
  far each source was read); rerunning the same command after an interrupt
  truncates the output to the last commit, rebuilds the duplicate hashes
  from it and reads on from there. A finished run is not redone; other
  arguments than those of the interrupted run are refused (``overwrite=True``
  starts over).
* **Empty sources.** A source that holds no record, or records without a
  text in the field searched (:data:`rcn_fast.corpus.sources.STATEMENT_FIELDS`,
  or ``text_field``), is a warning naming the fields its records have and
  ``--text-field``; when no source gave a single document the run is a
  :class:`ValueError` with those warnings (``corpus assemble`` exits 2), and
  its state is discarded, so the next run (say, with ``--text-field``) starts
  over without ``--overwrite``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import time
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from rcn_fast.corpus.leakage import LeakChecker, LeakReport, normalise_text
from rcn_fast.corpus.sources import SourceSpec, SourceStats, describe_location, is_excluded, iter_source

log = logging.getLogger("rcn_fast.corpus.assemble")
STATE_FORMAT = "rcn_fast.corpus.assemble/1"
DEDUP_MODES = ("exact", "near", "none")


@dataclass
class AssembleConfig:
    """Arguments of :func:`assemble_corpus` (serialisable; a resumed run must match them)."""

    sources: list[str]  # "NAME=PATH_OR_HUB_ID"
    out: str
    exclude: list[str] = field(default_factory=list)
    dedup: str = "exact"
    text_field: str | None = None
    drop_leaks: bool = False
    chunk_size: int = 100_000
    overwrite: bool = False

    def check(self) -> list[SourceSpec]:
        if not self.sources:
            raise ValueError("--source: give at least one NAME=PATH_OR_HUB_ID")
        specs = [SourceSpec.parse(s) for s in self.sources]
        names = [s.name for s in specs]
        if len(set(names)) != len(names):
            raise ValueError(f"--source: each NAME must be unique, got {names}")
        if self.dedup not in DEDUP_MODES:
            raise ValueError(f"dedup: expected one of {DEDUP_MODES}, got {self.dedup!r}")
        if not isinstance(self.chunk_size, int) or isinstance(self.chunk_size, bool) or self.chunk_size < 1:
            raise ValueError(f"chunk_size: expected a positive int, got {self.chunk_size!r}")
        unknown = [e for e in self.exclude if not isinstance(e, str) or not e or "/" in e]
        if unknown:
            raise ValueError(f"--exclude: expected source or folder names without '/', got {unknown}")
        return specs


@dataclass
class AssembleResult:
    """What a run wrote: counts per source, duplicates and leaks dropped, the leak report."""

    out: str
    documents: int
    read: Counter
    written: Counter
    duplicates: Counter
    leaks_dropped: Counter
    leaks: dict[str, Any] | None
    seconds: float

    def summary(self) -> dict[str, Any]:
        counts = {k: dict(sorted(getattr(self, k).items())) for k in ("read", "written", "duplicates", "leaks_dropped")}
        return {"out": self.out, "documents": self.documents, **counts, "leaks": self.leaks,
                "seconds": round(self.seconds, 3)}


class _SeenHashes:
    """A growing set of uint64 hashes kept as one sorted array (8 bytes a document)."""

    def __init__(self) -> None:
        self._sorted = np.empty(0, dtype=np.uint64)
        self._pending: list[int] = []
        self._pending_set: set[int] = set()

    def add_if_new(self, h: int) -> bool:
        if h in self._pending_set:
            return False
        if self._sorted.size:
            i = int(np.searchsorted(self._sorted, np.uint64(h)))
            if i < self._sorted.size and int(self._sorted[i]) == h:
                return False
        self._pending.append(h)
        self._pending_set.add(h)
        if len(self._pending) >= 65536:
            self.flush()
        return True

    def flush(self) -> None:
        if self._pending:
            merged = np.concatenate([self._sorted, np.asarray(self._pending, dtype=np.uint64)])
            self._sorted = np.sort(merged, kind="stable")  # two sorted runs: a linear merge
            self._pending, self._pending_set = [], set()


def _hash(text: str, dedup: str) -> int:
    key = normalise_text(text) if dedup == "near" else text
    return int.from_bytes(hashlib.blake2b(key.encode("utf-8"), digest_size=8).digest(), "little")


def _state_path(out: Path) -> Path:
    return out.with_name(out.name + ".assemble.json")


def _fingerprint(cfg: AssembleConfig, specs: Sequence[SourceSpec], tasks_fp: Any) -> dict[str, Any]:
    return {"sources": [describe_location(s) for s in specs], "exclude": sorted(cfg.exclude), "dedup": cfg.dedup,
            "text_field": cfg.text_field, "drop_leaks": cfg.drop_leaks, "tasks": tasks_fp}


def _write_json_atomic(path: Path, obj: Any) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(obj, fh, indent=1, sort_keys=True)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def assemble_corpus(cfg: AssembleConfig, tasks: Mapping[str, Sequence[Any]] | None = None,
                    *, show_progress: bool = False) -> AssembleResult:
    """Assemble ``cfg.sources`` into the statements file ``cfg.out`` (see the module docstring).

    Parameters
    ----------
    cfg : AssembleConfig
    tasks : mapping of task name -> list of MCQuestion, optional
        Evaluated questions for the leakage check (off when None or empty).
    show_progress : bool
        A tqdm bar of documents read.

    Returns
    -------
    AssembleResult

    Raises
    ------
    ValueError
        Bad arguments, a malformed source record, or a resume with other arguments.
    FileNotFoundError
        A source that does not exist.
    """
    specs = cfg.check()
    out = Path(cfg.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    exclude = frozenset(cfg.exclude)
    tasks = dict(tasks or {})
    checker = LeakChecker(tasks) if tasks else None
    tasks_fp = {name: [str(q.id) for q in qs] for name, qs in sorted(tasks.items())}
    fingerprint = _fingerprint(cfg, specs, tasks_fp)
    state_file = _state_path(out)
    state = _load_state(state_file, fingerprint, cfg.overwrite, out)
    if state.get("done"):
        log.info("%s is already complete (%d documents); nothing to do", out, state["documents"])
        return _result_from_state(out, state, 0.0)

    t0 = time.perf_counter()
    seen = _SeenHashes()
    committed = int(state.get("bytes", 0))
    with open(out, "ab") as fh:
        fh.truncate(committed)
    documents = _rehash_output(out, seen, cfg.dedup) if committed else 0
    if documents != state.get("documents", 0):
        raise ValueError(f"{out}: holds {documents} documents where {state_file} recorded "
                         f"{state.get('documents', 0)}; rerun with --overwrite")
    counters = {k: Counter(state.get(k, {})) for k in ("read", "written", "duplicates", "leaks_dropped")}
    report = LeakReport()
    _restore_report(report, state.get("leaks"))
    position = dict(state.get("position", {}))  # source name -> documents of it consumed
    saved = state.get("sources", {})  # what finished sources held; the others are read (and counted) again
    stats = {s.name: SourceStats.from_dict(saved.get(s.name)) if position.get(s.name) == -1 else SourceStats()
             for s in specs}

    bar = None
    if show_progress:
        from tqdm import tqdm

        bar = tqdm(desc="assemble", unit=" docs", initial=sum(position.values()))
    fh = open(out, "ab")
    try:
        since_commit = 0
        for spec in specs:
            if is_excluded(spec.name, exclude):
                continue
            skip = int(position.get(spec.name, 0))
            if skip < 0:  # finished source
                continue
            consumed = 0
            for doc in iter_source(spec, text_field=cfg.text_field, exclude=exclude, stats=stats[spec.name]):
                consumed += 1
                if consumed <= skip:
                    continue
                counters["read"][doc.source] += 1
                if cfg.dedup != "none" and not seen.add_if_new(_hash(doc.text, cfg.dedup)):
                    counters["duplicates"][doc.source] += 1
                else:
                    leak_hits = checker.match(doc.text) if checker is not None else []
                    for pat in leak_hits:
                        report.add(pat.task, doc.source, pat.kind, pat.question_id, f"{doc.source}:{doc.orig_id}", doc.text)
                    if leak_hits and cfg.drop_leaks:
                        counters["leaks_dropped"][doc.source] += 1
                    else:
                        rec = {"id": str(documents), "text": doc.text, "source": doc.source, "orig_id": doc.orig_id}
                        fh.write((json.dumps(rec, ensure_ascii=False) + "\n").encode("utf-8"))
                        counters["written"][doc.source] += 1
                        documents += 1
                position[spec.name] = consumed
                since_commit += 1
                if bar is not None:
                    bar.update(1)
                if since_commit >= cfg.chunk_size:
                    _commit(fh, state_file, fingerprint, documents, position, counters, report, stats, done=False)
                    since_commit = 0
            position[spec.name] = -1
            why = stats[spec.name].explain(spec.name, spec.location, cfg.text_field)
            if why:
                log.warning(why)
            _commit(fh, state_file, fingerprint, documents, position, counters, report, stats, done=False)
        _commit(fh, state_file, fingerprint, documents, position, counters, report, stats, done=True)
    finally:
        fh.close()
        if bar is not None:
            bar.close()
    if not sum(counters["read"].values()):
        whys = [stats[s.name].explain(s.name, s.location, cfg.text_field) for s in specs
                if not is_excluded(s.name, exclude)]
        raise ValueError("no document was read from any source, so nothing was written to "
                         f"{out}:\n  " + "\n  ".join(w for w in whys if w))
    leaks = report.to_dict() if checker is not None else None
    if leaks is not None:
        _write_json_atomic(out.with_name(out.name + ".leaks.json"), leaks)
        for line in report.lines():
            log.warning(line) if report.total else log.info(line)
    dups = sum(counters["duplicates"].values())
    log.info("%s: %d documents written, %d duplicates dropped%s", out, documents, dups,
             f", {sum(counters['leaks_dropped'].values())} leaking documents dropped" if cfg.drop_leaks else "")
    return AssembleResult(str(out), documents, counters["read"], counters["written"], counters["duplicates"],
                          counters["leaks_dropped"], leaks, time.perf_counter() - t0)


def _commit(fh: Any, state_file: Path, fingerprint: dict[str, Any], documents: int, position: dict[str, int],
            counters: dict[str, Counter], report: LeakReport, stats: dict[str, SourceStats], *, done: bool) -> None:
    fh.flush()
    os.fsync(fh.fileno())
    state = {"format": STATE_FORMAT, "fingerprint": fingerprint, "bytes": fh.tell(), "documents": documents,
             "position": position, "done": done, "leaks": _dump_report(report),
             "sources": {name: st.to_dict() for name, st in stats.items()},
             **{k: dict(v) for k, v in counters.items()}}
    _write_json_atomic(state_file, state)


def _dump_report(report: LeakReport) -> dict[str, Any]:
    return {"counts": [[t, s, k, n] for (t, s, k), n in report.counts.items()],
            "documents": sorted(report.leaking_documents),
            "questions": {t: sorted(ids) for t, ids in report.questions.items()}, "examples": report.examples}


def _restore_report(report: LeakReport, saved: dict[str, Any] | None) -> None:
    if not saved:
        return
    for t, s, k, n in saved.get("counts", []):
        report.counts[(t, s, k)] = n
    for t, ids in saved.get("questions", {}).items():
        report.questions[t].update(ids)
    report.examples = list(saved.get("examples", []))
    report.leaking_documents.update(saved.get("documents", []))


def _load_state(state_file: Path, fingerprint: dict[str, Any], overwrite: bool, out: Path) -> dict[str, Any]:
    if overwrite:
        for p in (state_file, out):
            p.unlink(missing_ok=True)
        return {}
    if not state_file.exists():
        if out.exists() and out.stat().st_size:
            raise ValueError(f"--out: {out} exists and was not written by an interrupted assemble; "
                             f"choose another path or pass --overwrite")
        return {}
    from rcn_fast._stamped_json import read_stamped_json

    state = read_stamped_json(state_file, STATE_FORMAT, what="an assemble state", arg="--out",
                              fix="; rerun with --overwrite to start over")
    if state.get("done") and not sum((state.get("read") or {}).values()):
        log.info("%s: the last run read no document; starting over", out)  # nothing to keep, nothing to resume
        for p in (state_file, out):
            p.unlink(missing_ok=True)
        return {}
    if state.get("fingerprint") != json.loads(json.dumps(fingerprint)):
        raise ValueError(f"--out: {out} was assembled (or partly) with other sources, options or tasks; "
                         f"rerun with the same arguments to resume, or pass --overwrite to start over")
    return state


def _rehash_output(out: Path, seen: _SeenHashes, dedup: str) -> int:
    n = 0
    with open(out, encoding="utf-8") as fh:
        for line in fh:
            if dedup != "none":
                seen.add_if_new(_hash(json.loads(line)["text"], dedup))
            n += 1
    seen.flush()
    return n


def _result_from_state(out: Path, state: dict[str, Any], seconds: float) -> AssembleResult:
    leaks_file = out.with_name(out.name + ".leaks.json")
    leaks = json.loads(leaks_file.read_text(encoding="utf-8")) if leaks_file.exists() else None
    return AssembleResult(str(out), int(state["documents"]), Counter(state.get("read", {})),
                          Counter(state.get("written", {})), Counter(state.get("duplicates", {})),
                          Counter(state.get("leaks_dropped", {})), leaks, seconds)


def explain_empty(path: str | os.PathLike[str]) -> str | None:
    """Why the statements file ``path`` is empty, when ``assemble`` wrote it
    (its state file ``<path>.assemble.json`` says what each source held);
    None otherwise."""
    out = Path(path)
    state_file = _state_path(out)
    if not state_file.is_file():
        return None
    try:
        state = json.loads(state_file.read_text(encoding="utf-8"))
        fp = state["fingerprint"]
        sources = {s["name"]: s.get("location", s["name"]) for s in fp["sources"]}
        whys = [SourceStats.from_dict(st).explain(name, sources.get(name, name), fp.get("text_field"))
                for name, st in (state.get("sources") or {}).items()]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    whys = [w for w in whys if w]
    return ("it was written by `python -m rcn_fast.corpus assemble`, which read no document"
            + (":\n  " + "\n  ".join(whys) if whys else "")
            + "\nRerun assemble with what its sources hold (e.g. --text-field FIELD), then build again")


def iter_statements(path: str | os.PathLike[str], text_field: str = "text") -> Iterator[tuple[str, str, str]]:
    """``(id, source, text)`` of a statements file (JSON lines) for :func:`check_documents`."""
    with open(path, encoding="utf-8") as fh:
        for row, line in enumerate(fh, 1):
            if line.strip():
                rec = json.loads(line)
                yield str(rec.get("id", row)), str(rec.get("source", "corpus")), str(rec.get(text_field, ""))


# ------------------------------------------------------------------ command line
def add_parser(sub: Any) -> argparse.ArgumentParser:
    """Add the ``assemble`` subcommand to ``python -m rcn_fast.corpus``."""
    a = sub.add_parser("assemble", help="one statements file from named sources (dedup, exclusion, leakage check)")
    a.add_argument("--source", action="append", required=True, metavar="NAME=PATH_OR_HUB_ID",
                   help="a RACo folder, a DPR-style TSV, a JSON-lines/Parquet file, or hub:OWNER/NAME[:CONFIG][@SPLIT]")
    a.add_argument("--out", required=True, help="output statements file (JSON lines)")
    a.add_argument("--exclude", action="append", default=[], metavar="NAME",
                   help="drop sources (or source sub-folders/files) of this name, e.g. cbd")
    a.add_argument("--task", action="append", default=[], metavar="TASK=FILE_OR_NAME",
                   help="evaluated questions to check the corpus against (leakage report)")
    a.add_argument("--split", default=None, help="split of the --task datasets/folders (default: each loader's)")
    a.add_argument("--drop-leaks", action="store_true", help="drop documents that hold an evaluated question")
    a.add_argument("--dedup", choices=DEDUP_MODES, default="exact",
                   help="exact (default): drop identical texts; near: also case/punctuation/spacing variants")
    a.add_argument("--text-field", default=None, help="field of JSON/Parquet records to read (default: auto)")
    a.add_argument("--chunk-size", type=int, default=100_000, help="documents read between resumable commits")
    a.add_argument("--overwrite", action="store_true", help="start over instead of resuming")
    a.add_argument("--no-progress", action="store_true")
    return a


def load_tasks(specs: Sequence[str], split: str | None = None) -> dict[str, list[Any]]:
    """``["obqa=path/obqa-test.jsonl", ...]`` -> {task: questions} (any source load_questions reads)."""
    from rcn_fast.data import load_questions

    tasks: dict[str, list[Any]] = {}
    for spec in specs:
        if "=" not in spec:
            raise ValueError(f"--task: expected TASK=FILE_OR_NAME, got {spec!r}")
        name, where = (s.strip() for s in spec.split("=", 1))
        if not name or not where:
            raise ValueError(f"--task: expected TASK=FILE_OR_NAME, got {spec!r}")
        if name in tasks:
            raise ValueError(f"--task: {name!r} is given twice")
        tasks[name] = load_questions(where, split=split)
    return tasks


def run(args: argparse.Namespace) -> int:
    """Run the ``assemble`` subcommand; prints the summary JSON."""
    cfg = AssembleConfig(sources=args.source, out=args.out, exclude=args.exclude, dedup=args.dedup,
                         text_field=args.text_field, drop_leaks=args.drop_leaks, chunk_size=args.chunk_size,
                         overwrite=args.overwrite)
    if args.drop_leaks and not args.task:
        raise ValueError("--drop-leaks: name the evaluated questions with --task TASK=FILE_OR_NAME")
    result = assemble_corpus(cfg, load_tasks(args.task, args.split), show_progress=not args.no_progress)
    print(json.dumps(result.summary(), indent=2))
    return 0
