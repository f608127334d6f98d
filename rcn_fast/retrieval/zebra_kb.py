"""The retriever's training file from ZEBRA-KB's public releases (ReConnect App. A.3).

ReConnect trains its explanation-based retriever on ZEBRA-KB's questions and
their explanations. They are released apart:

* explanations: the Hugging Face dataset ``sapienzanlp/zebra-kb-explanations``
  (configs ``all``, ``csqa-train-gemini``, ``obqa-train-gemini``, ...,
  ``csqa-train-ecqa``), one record per question: ``id``, ``positives``
  (the explanations), ``negatives`` (null, or strings in the ECQA configs),
  and in the ECQA configs an ``explanation`` string;
* questions: the document index ZEBRA's README loads
  (``sapienzanlp/zebra-kb`` and the per-task ``sapienzanlp/zebra-kb-<task>-train``
  repositories): a ``documents.jsonl`` of ``{"text": "Q [SEP] A. c1 [SEP] B. c2 ...",
  "id": ..., "metadata": {"answerKey": ...}}`` records, as ZEBRA's
  ``scripts/retriever/create_index.py`` writes them. Question files in the
  CommonsenseQA layout (``question.stem``) are read too.

:func:`prepare_explanation_training` joins the two by ``id`` into the
``{"id", "question", "choices", "explanations"}`` lines that
``python -m rcn_fast.train_retriever --mode explanation`` reads (the
trainer does the paper's sampling: up to 64 positives per explanation, up
to 200 passages per batch, the 90/10 split). Explanations whose id has no
question, and questions with no explanation, are counted and reported;
explanation lists are merged when several explanation sources hold the same id.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rcn_fast.corpus.sources import iter_records, record_texts

log = logging.getLogger("rcn_fast.retrieval")
KB_SEP = " [SEP] "
KB_FILE = "documents.jsonl"


@dataclass
class JoinStats:
    """What :func:`prepare_explanation_training` joined and what it could not."""

    records: int = 0  # training records written
    explanations: int = 0  # explanation texts written
    unmatched_explanation_ids: int = 0  # explanation records whose id has no question
    questions_without_explanations: int = 0
    unmatched_examples: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def parse_kb_document(rec: Any, where: str) -> tuple[str, str, list[str]]:
    """``(id, question, choices)`` of one ZEBRA-KB document (or CommonsenseQA-layout) record.

    Raises
    ------
    ValueError
        The record has no id or no question text.
    """
    if not isinstance(rec, dict):
        raise ValueError(f"{where}: expected a JSON object, got {type(rec).__name__}")
    qid = rec.get("id")
    if qid is None or not str(qid).strip():
        raise ValueError(f"{where}: the record has no 'id'")
    q = rec.get("question")
    if isinstance(q, dict):  # CommonsenseQA layout
        stem = q.get("stem")
        choices = [c.get("text", "") for c in q.get("choices", []) if isinstance(c, dict)]
    elif isinstance(q, str):
        stem, choices = q, [str(c) for c in rec.get("choices", []) if isinstance(c, str)]
    elif isinstance(rec.get("text"), str):  # ZEBRA-KB document: "Q [SEP] A. c1 [SEP] B. c2"
        stem, *parts = rec["text"].split(KB_SEP)
        choices = [_strip_label(p) for p in parts]
    else:
        stem, choices = None, []
    if not isinstance(stem, str) or not stem.strip():
        raise ValueError(f"{where}: no question text (expected 'text' \"Q [SEP] A. ...\" or 'question')")
    return str(qid), stem.strip(), choices


def _strip_label(part: str) -> str:
    head, sep, rest = part.partition(". ")
    return rest.strip() if sep and len(head) <= 2 and head.isalnum() else part.strip()


def iter_kb_questions(location: str | os.PathLike[str]) -> Iterator[tuple[str, str, list[str]]]:
    """``(id, question, choices)`` of a ZEBRA-KB question source: a ``documents.jsonl``
    file, a folder holding one, a question file in the CommonsenseQA layout, or
    ``hub:OWNER/NAME`` (a hub repository holding ``documents.jsonl``, as
    ``sapienzanlp/zebra-kb-csqa-train``; else read as a dataset)."""
    loc = os.fspath(location)
    if loc.startswith("hub:"):
        loc = _hub_documents(loc[4:]) or loc
    elif Path(loc).is_dir():
        loc = os.fspath(Path(loc) / KB_FILE)
    for _, where, rec in iter_records(loc, what="--questions"):
        yield parse_kb_document(rec, where)


def _hub_documents(repo: str) -> str | None:
    """The local path of ``documents.jsonl`` in a hub repository, or None when it has none."""
    from rcn_fast._arrays import require

    hub = require("huggingface_hub", "pip install huggingface_hub")
    for repo_type in ("model", "dataset"):
        try:
            return hub.hf_hub_download(repo.split(":", 1)[0], KB_FILE, repo_type=repo_type)
        except Exception:  # noqa: BLE001  (not there: try the next kind, then the datasets loader)
            continue
    return None


def prepare_explanation_training(explanations: Sequence[str], questions: Sequence[str], out: str | os.PathLike[str],
                                 *, max_unmatched_examples: int = 5) -> JoinStats:
    """Join explanation records with their questions by id into a training file.

    Parameters
    ----------
    explanations : sequence of str
        Explanation sources: ``hub:sapienzanlp/zebra-kb-explanations:all`` or
        local JSON-lines / Parquet files with the dataset's fields.
    questions : sequence of str
        Question sources (see :func:`iter_kb_questions`).
    out : path
        The training file to write (JSON lines; written to ``out.tmp`` and renamed).

    Returns
    -------
    JoinStats
    """
    if not explanations:
        raise ValueError("--train: give at least one explanation source")
    if not questions:
        raise ValueError("--questions: give at least one question source")
    kb: dict[str, tuple[str, list[str]]] = {}
    for src in questions:
        for qid, question, choices in iter_kb_questions(src):
            kb.setdefault(qid, (question, choices))
    by_id: dict[str, list[str]] = {}
    order: list[str] = []
    stats = JoinStats()
    for src in explanations:
        for _, where, rec in iter_records(src, what="--train"):
            if not isinstance(rec, dict) or rec.get("id") is None:
                raise ValueError(f"{where}: expected an explanation record with an 'id'")
            qid = str(rec["id"])
            texts = [t for _, t in record_texts(rec)]
            if qid not in kb:
                stats.unmatched_explanation_ids += 1
                if len(stats.unmatched_examples) < max_unmatched_examples:
                    stats.unmatched_examples.append(qid)
                continue
            if qid not in by_id:
                by_id[qid] = []
                order.append(qid)
            by_id[qid].extend(t for t in texts if t not in by_id[qid])
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        for qid in order:
            if not by_id[qid]:
                continue
            question, choices = kb[qid]
            fh.write(json.dumps({"id": qid, "question": question, "choices": choices,
                                 "explanations": by_id[qid]}, ensure_ascii=False) + "\n")
            stats.records += 1
            stats.explanations += len(by_id[qid])
    os.replace(tmp, out)
    stats.questions_without_explanations = sum(1 for qid in kb if not by_id.get(qid))
    if stats.unmatched_explanation_ids:
        log.warning("%d explanation record(s) have no question with their id in %s (e.g. %s)",
                    stats.unmatched_explanation_ids, ", ".join(questions), ", ".join(stats.unmatched_examples))
    log.info("%s: %d questions, %d explanations; %d KB questions without explanations", out, stats.records,
             stats.explanations, stats.questions_without_explanations)
    return stats
