"""The results page's data: what each question's row shows, and every
record's trace, packed so that a page of 10,000 questions stays small.

How it stays small (measured in docs/evaluation.md):

* **one summary blob**: per task, per question its id, text, choices,
  gold and, per pipeline and seed, ``[pred, probabilities, trace ref]``
  as arrays (no repeated keys), probabilities rounded to 4 decimals;
* **passages once per page**: every passage text is kept once, by id
  (``passages``); the records' passage lists and the traces' retrieve
  entries keep the id and score (``"~p": 1`` marks a text moved there);
* **traces deduplicated by line**: in each chunk of traces, every string
  longer than :data:`INTERN_MIN` characters becomes a list of indices into
  the chunk's table of lines (``{"~": [i, j, ...]}``), so the instruction
  lines every prompt repeats, the question every stage repeats and the
  knowledge the answer prompt repeats are stored once; a line that quotes
  one of the record's passages is stored as ``[before, passage id, after]``;
* **numbers rounded**: floats keep :data:`FLOAT_DECIMALS` decimals (the
  page shows 4);
* **compressed and lazy**: every blob is gzip-compressed JSON in base64
  (the browser's ``DecompressionStream`` opens it); the traces are split
  into chunks of :data:`CHUNK_RECORDS` records, each opened only when one
  of its questions is expanded, and rendered only then.
"""

from __future__ import annotations

import base64
import gzip
import json
import math
from typing import Any

from rcn_fast.eval.report.diagnostics import TaskRecords, gold_index, prediction_of
from rcn_fast.eval.run.permute import original_index, shifts_of

#: Strings at least this long are stored as lines of the chunk's line table.
INTERN_MIN = 48
#: Passage texts at least this long are referred to by id where a prompt line quotes them.
ATOM_MIN = 40
#: Decimals a float of a trace keeps on the page (scores, probabilities; 4 are shown).
FLOAT_DECIMALS = 6
_PLAIN = frozenset({str, int, bool, type(None)})
#: Records whose traces share one compressed chunk.
CHUNK_RECORDS = 120
#: Decimals of the probabilities shown.
PROB_DECIMALS = 4


def probabilities(logprobs: Any) -> list[float] | None:
    """``exp`` of per-choice log-probabilities, normalised to sum 1 and
    rounded to :data:`PROB_DECIMALS` (None: none given or not finite)."""
    if not isinstance(logprobs, list) or not logprobs:
        return None
    try:
        vals = [float(x) for x in logprobs]
    except (TypeError, ValueError):
        return None
    top = max(vals)
    if not math.isfinite(top):
        return None
    ex = [math.exp(v - top) if math.isfinite(v) else 0.0 for v in vals]
    s = sum(ex)
    return [round(e / s, PROB_DECIMALS) for e in ex]


def pack(obj: Any) -> str:
    """``obj`` as gzip-compressed JSON in base64 (deterministic: no timestamp)."""
    raw = json.dumps(obj, ensure_ascii=False, separators=(",", ":"), default=str).encode("utf-8")
    return base64.b64encode(gzip.compress(raw, compresslevel=6, mtime=0)).decode("ascii")


def unpack(text: str) -> Any:
    """The inverse of :func:`pack`."""
    return json.loads(gzip.decompress(base64.b64decode(text)).decode("utf-8"))


class TraceStore:
    """The page's traces in chunks (see the module docstring).

    ``add(record)`` returns the record's reference ``[chunk, index]``;
    :meth:`blobs` gives the packed passages and chunks.
    """

    def __init__(self, chunk_records: int = CHUNK_RECORDS) -> None:
        self.chunk_records = int(chunk_records)
        self.passages: dict[str, str] = {}
        self.chunks: list[dict[str, Any]] = []
        self._lines: dict[str, int] = {}

    def _chunk(self) -> dict[str, Any]:
        if not self.chunks or len(self.chunks[-1]["records"]) >= self.chunk_records:
            self.chunks.append({"lines": [], "records": []})
            self._lines = {}
        return self.chunks[-1]

    def _line(self, chunk: dict[str, Any], line: str, atoms: dict[str, str]) -> int:
        i = self._lines.get(line)
        if i is None:
            entry: Any = line
            if len(line) >= ATOM_MIN:
                for text, pid in atoms.items():  # a line that quotes a passage: [before, passage id, after]
                    at = line.find(text)
                    if at >= 0:
                        entry = [line[:at], pid, line[at + len(text):]]
                        break
            i = self._lines[line] = len(chunk["lines"])
            chunk["lines"].append(entry)
        return i

    def _passage(self, d: dict[str, Any]) -> dict[str, Any] | None:
        """``d`` without its text when the text moves to the page's passages."""
        pid, text = d.get("id"), d.get("text")
        if not isinstance(pid, str) or not isinstance(text, str):
            return None
        known = self.passages.setdefault(pid, text)
        if known != text:  # another text under the same id (another kind of record): kept in place
            return None
        return {**{k: v for k, v in d.items() if k != "text"}, "~p": 1}

    def compact(self, value: Any, chunk: dict[str, Any], atoms: dict[str, str] | None = None) -> Any:
        """``value`` with long strings as line indices (lines quoting one of
        ``atoms`` -- ``{passage text: id}`` -- refer to it), passage texts
        moved to the page's passages and floats rounded to :data:`FLOAT_DECIMALS`."""
        atoms = atoms if atoms is not None else {}
        t = type(value)
        if t is str:
            if len(value) < INTERN_MIN:
                return value
            return {"~": [self._line(chunk, ln, atoms) for ln in value.split("\n")]}
        if t is float:
            if not math.isfinite(value):
                return None if math.isnan(value) else ("inf" if value > 0 else "-inf")
            return round(value, FLOAT_DECIMALS)
        if t is list:
            kinds = {type(v) for v in value}
            if kinds <= _PLAIN and not (str in kinds and any(len(v) >= INTERN_MIN for v in value if type(v) is str)):
                return value  # ids, counts: as they are
            if kinds == {float}:
                return [round(v, FLOAT_DECIMALS) if math.isfinite(v) else self.compact(v, chunk) for v in value]
            return [self.compact(v, chunk, atoms) for v in value]
        if t is dict:
            moved = self._passage(value)
            src = moved if moved is not None else value
            return {str(k): self.compact(v, chunk, atoms) for k, v in src.items()}
        return value

    def add(self, record: dict[str, Any]) -> list[int]:
        """Keep one record's trace, knowledge, passages and cost; its reference."""
        p = prediction_of(record)
        body = {k: p[k] for k in ("trace", "knowledge", "passages", "cost", "output", "meta") if p.get(k)}
        if record.get("elapsed_s") is not None:
            body["elapsed_s"] = record["elapsed_s"]
        atoms = {}
        for ps in p.get("passages") or []:
            if isinstance(ps, dict) and self._passage(ps) is not None and len(ps["text"]) >= ATOM_MIN:
                atoms[ps["text"]] = ps["id"]
        chunk = self._chunk()
        chunk["records"].append(self.compact(body, chunk, atoms))
        return [len(self.chunks) - 1, len(chunk["records"]) - 1]

    def blobs(self) -> tuple[str, list[str]]:
        """``(packed passages, [packed chunk, ...])``."""
        return pack(self.passages), [pack(c) for c in self.chunks]


def task_data(tr: TaskRecords, store: TraceStore) -> dict[str, Any]:
    """One task of the summary blob.

    Returns
    -------
    dict
        ``name``, ``kind``, ``pipelines``, ``seeds``, ``k`` (orders of
        ``--permute-choices``, 0: off) and ``questions``: per question
        ``[id, text, choices, gold, labels or null, per pipeline [per seed
        answer or null], per pipeline [per seed [original index per order]] or null]``.
        A multiple-choice answer is ``[pred, probabilities or null, trace ref]``,
        an open one ``[answer text, 1 | 0 | null (string_em), trace ref]``.
    """
    pipes, seeds = tr.pipelines, tr.seeds
    k = tr.permute_k if tr.permute_k > 1 and tr.choice and not tr.permute_skipped else 0
    rows = []
    for q in tr.questions:
        answers = []
        for p in pipes:
            per_seed = []
            for s in seeds:
                rec = tr.records.get(p, {}).get(s, {}).get(q.id)
                if rec is None:
                    per_seed.append(None)
                    continue
                pred = prediction_of(rec)
                ref = store.add(rec)
                if tr.choice:
                    per_seed.append([pred.get("pred"), probabilities(pred.get("choice_logprobs")), ref])
                else:
                    em = (rec.get("metrics") or {}).get("string_em")
                    per_seed.append([pred.get("answer_text"), None if em is None else int(em), ref])
            answers.append(per_seed)
        if tr.choice:
            labels = list(q.labels)
            default = [chr(65 + i) for i in range(len(q.choices))]
            row = [q.id, q.question, list(q.choices), gold_index(q), None if labels == default else labels, answers]
        else:
            row = [q.id, q.question, [], list(getattr(q, "answers", [])), None, answers]
        row.append(_orders(tr, q, pipes, seeds, k) if k else None)
        rows.append(row)
    return {"name": tr.name, "kind": tr.kind, "pipelines": pipes, "seeds": seeds, "k": k, "questions": rows}


def _orders(tr: TaskRecords, q: Any, pipes: list[str], seeds: list[int], k: int) -> list[Any]:
    """Per pipeline, per seed: the original index of the choice picked in each order (null: not answered)."""
    out = []
    for p in pipes:
        per_seed = []
        for s in seeds:
            got = []
            for shift in shifts_of(q, k):
                rec = (tr.records.get(p, {}).get(s, {}) if shift == 0 else
                       tr.permuted.get(p, {}).get(s, {}).get(shift, {})).get(q.id)
                pred = prediction_of(rec).get("pred") if rec else None
                got.append(original_index(pred, shift, len(q.choices)) if isinstance(pred, int) else None)
            per_seed.append(got)
        out.append(per_seed)
    return out


def page_blobs(tasks: dict[str, TaskRecords], chunk_records: int = CHUNK_RECORDS) -> dict[str, Any]:
    """``{"summary": packed tasks, "passages": packed passages, "chunks": [packed chunk, ...]}``."""
    store = TraceStore(chunk_records)
    summary = {"tasks": [task_data(tr, store) for tr in tasks.values()]}
    passages, chunks = store.blobs()
    return {"summary": pack(summary), "passages": passages, "chunks": chunks}


__all__ = ["TraceStore", "task_data", "page_blobs", "probabilities", "pack", "unpack", "INTERN_MIN",
           "CHUNK_RECORDS"]
