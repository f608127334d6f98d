"""The data side of retriever training (:mod:`rcn_fast.retrieval.train`):
reading the training file into groups of queries and positives, the
train/validation split, deterministic batches with their positive and
excluded masks, and the multi-positive NCE loss (see that module's
docstring for the modes and the loss)."""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from rcn_fast._arrays import require
from rcn_fast.retrieval.encoders.base import TORCH_HINT

if TYPE_CHECKING:
    from rcn_fast.retrieval.train import TrainConfig

MODES = ("explanation", "concept")
LOSSES = ("per_positive", "marginal")


@dataclass
class Group:
    """One question (explanation mode) or concept (concept mode).

    ``passages`` are candidate positives; ``queries`` are (text, indices of
    its positives in ``passages``, index of the query itself in
    ``passages`` or -1).
    """

    passages: list[str]
    queries: list[tuple[str, list[int], int]]


def _question_text(q: Any) -> str:
    if isinstance(q, dict):
        q = q.get("stem", "")
    if not isinstance(q, str):
        raise ValueError(f"question: expected a str or a {{'stem': ...}} object, got {type(q).__name__}")
    return q


def _choices(rec: dict[str, Any]) -> list[str]:
    ch = rec.get("choices")
    if ch is None and isinstance(rec.get("question"), dict):
        ch = rec["question"].get("choices")
    if not isinstance(ch, list) or not ch:
        raise ValueError("choices: expected a non-empty list of str or {'label', 'text'} objects")
    return [c["text"] if isinstance(c, dict) else str(c) for c in ch]


def format_mc(question: str, choices: list[str]) -> str:
    """ZEBRA's item text: ``"Q [SEP] A. c1 [SEP] B. c2 ..."``."""
    labels = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
    return " [SEP] ".join([question] + [f"{labels[i]}. {c}" for i, c in enumerate(choices)])


def read_records(path: str, arg: str = "train") -> list[tuple[int, dict[str, Any]]]:
    """(line number, record) of every non-blank line of a JSON lines file;
    ``arg`` names the setting in error messages."""
    records = []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if line.strip():
                try:
                    records.append((lineno, json.loads(line)))
                except json.JSONDecodeError as exc:
                    raise ValueError(f"{arg}: {path} line {lineno} is not valid JSON ({exc.msg})") from None
    return records


def split_records(records: list[Any], fraction: float, seed: int) -> tuple[list[Any], list[Any]]:
    """Random (training, validation) split holding out ``fraction`` of the
    records (at least one, at most all but one), drawn with ``seed``; both
    keep the file order."""
    if fraction <= 0:
        return list(records), []
    if len(records) < 2:
        raise ValueError(f"val_fraction: {fraction} needs at least 2 training records, got {len(records)}; "
                         "set val_fraction=0 or pass val_file")
    n_val = min(len(records) - 1, max(1, int(round(fraction * len(records)))))
    held = set(np.random.default_rng([seed, 90_10]).permutation(len(records))[:n_val].tolist())
    return ([r for i, r in enumerate(records) if i not in held], [r for i, r in enumerate(records) if i in held])


def load_groups(path: str, mode: str, *, choice_permutations: int = 2, seed: int = 0,
                records: list[tuple[int, dict[str, Any]]] | None = None) -> list[Group]:
    """Read the training file (or the given ``records`` of it, as
    :func:`read_records` returns them) into groups (see the module
    docstring)."""
    if records is None:
        records = read_records(path)
    groups: list[Group] = []
    if mode == "explanation":
        for lineno, r in records:
            ex = r.get("explanations")
            if not isinstance(ex, list) or not all(isinstance(e, str) for e in ex):
                raise ValueError(f"train: {path} line {lineno} needs an 'explanations' list of str")
            ex = [e for e in dict.fromkeys(e.strip() for e in ex) if e]
            if not ex:
                continue
            q = _question_text(r.get("question"))
            queries = [(q, list(range(len(ex))), -1)]
            if len(ex) > 1:
                queries += [(e, [j for j in range(len(ex)) if j != i], i) for i, e in enumerate(ex)]
            groups.append(Group(passages=ex, queries=queries))
    elif mode == "concept":
        rng = random.Random(seed)
        by_concept: dict[str, list[tuple[str, list[str]]]] = {}
        for lineno, r in records:
            concept = r.get("concept") or r.get("question_concept") or \
                (r.get("question", {}).get("question_concept") if isinstance(r.get("question"), dict) else None)
            if not isinstance(concept, str):
                raise ValueError(f"train: {path} line {lineno} needs a 'concept' string in concept mode")
            by_concept.setdefault(concept, []).append((_question_text(r.get("question")), _choices(r)))
        for items in by_concept.values():
            passages: list[str] = []
            owner: list[int] = []
            for k, (q, ch) in enumerate(items):
                passages.append(format_mc(q, ch))
                owner.append(k)
                for _ in range(choice_permutations):
                    perm = ch[:]
                    rng.shuffle(perm)
                    sub = perm[:max(2, len(perm) - rng.randrange(0, max(1, len(perm) - 1)))]
                    text = format_mc(q, sub)
                    if text not in passages:
                        passages.append(text)
                        owner.append(k)
            queries = []
            for k in range(len(items)):
                self_idx = owner.index(k)
                pos = [j for j in range(len(passages)) if j != self_idx]
                if pos:
                    queries.append((passages[self_idx], pos, self_idx))
            if queries:
                groups.append(Group(passages=passages, queries=queries))
    else:
        raise ValueError(f"mode: expected one of {list(MODES)}, got {mode!r}")
    if not groups:
        raise ValueError(f"train: {path} yields no training groups in {mode} mode")
    return groups


def make_batches(groups: list[Group], epoch: int, cfg: "TrainConfig") -> list[list[tuple[int, list[int], list[int]]]]:
    """Deterministic batches for ``epoch``: lists of (group index, kept
    passage indices, kept query indices), at most ``passages_per_batch``
    passages per batch (a group larger than that is cut down to it)."""
    rng = np.random.default_rng([cfg.seed, epoch])
    order = rng.permutation(len(groups))
    batches, cur, n = [], [], 0
    for g in order:
        grp = groups[int(g)]
        cap = min(cfg.max_positives, cfg.passages_per_batch)
        keep_p = sorted(rng.permutation(len(grp.passages))[:cap].tolist())
        keep_q = sorted(rng.permutation(len(grp.queries))[:cfg.max_positives].tolist())
        if cur and n + len(keep_p) > cfg.passages_per_batch:
            batches.append(cur)
            cur, n = [], 0
        cur.append((int(g), keep_p, keep_q))
        n += len(keep_p)
    if cur:
        batches.append(cur)
    return batches


def batch_tensors(groups: list[Group], batch: list[tuple[int, list[int], list[int]]]
                  ) -> tuple[list[str], list[str], np.ndarray, np.ndarray]:
    """Query texts, passage texts, positive mask bool [nq, np] and
    excluded mask bool [nq, np] (the query's own text) for one batch."""
    q_texts, p_texts, pos_rows, excl_rows = [], [], [], []
    offset = 0
    spans = []
    for g, keep_p, keep_q in batch:
        grp = groups[g]
        local = {j: offset + i for i, j in enumerate(keep_p)}
        p_texts += [grp.passages[j] for j in keep_p]
        spans.append((g, keep_q, local))
        offset += len(keep_p)
    n_p = len(p_texts)
    for g, keep_q, local in spans:
        grp = groups[g]
        for qi in keep_q:
            text, pos, self_idx = grp.queries[qi]
            cols = [local[j] for j in pos if j in local]
            if not cols:
                continue
            row = np.zeros(n_p, dtype=bool)
            row[cols] = True
            ex = np.zeros(n_p, dtype=bool)
            if self_idx in local:
                ex[local[self_idx]] = True
            q_texts.append(text)
            pos_rows.append(row)
            excl_rows.append(ex)
    if not q_texts:
        return [], p_texts, np.zeros((0, n_p), bool), np.zeros((0, n_p), bool)
    return q_texts, p_texts, np.stack(pos_rows), np.stack(excl_rows)


def multi_positive_nce(q: Any, p: Any, pos: Any, excl: Any, temperature: float, *,
                       form: str = "per_positive") -> Any:
    """The multi-positive NCE loss of a batch (see the module docstring).

    Parameters
    ----------
    q : float tensor [nq, d]
        Query vectors (already normalised for cosine similarity).
    p : float tensor [np, d]
        Passage vectors.
    pos : bool tensor [nq, np]
        Positives of each query (at least one per row).
    excl : bool tensor [nq, np]
        Entries that are neither positive nor negative (a query's own text).
    temperature : float
        ``s = (q @ p.T) / temperature``.
    form : {"per_positive", "marginal"}
        ``"per_positive"`` (the papers'): per query, the sum over its
        positives of ``-log(e^{s+} / (e^{s+} + sum_neg e^{s-}))``;
        ``"marginal"``: ``-log(sum_pos e^s / sum_{pos+neg} e^s)``.

    Returns
    -------
    scalar tensor: the mean over the queries.
    """
    torch = require("torch", TORCH_HINT)
    if form not in LOSSES:
        raise ValueError(f"form: expected one of {list(LOSSES)}, got {form!r}")
    if not (isinstance(temperature, (int, float)) and temperature > 0):
        raise ValueError(f"temperature: expected a positive number, got {temperature!r}")
    if pos.shape != excl.shape or pos.shape != (q.shape[0], p.shape[0]):
        raise ValueError(f"pos, excl: expected bool [{q.shape[0]}, {p.shape[0]}] masks, got {tuple(pos.shape)} "
                         f"and {tuple(excl.shape)}")
    pos = pos & ~excl
    s = (q @ p.T) / temperature
    neg_inf = torch.finfo(s.dtype).min
    if form == "marginal":
        s = s.masked_fill(excl, neg_inf)
        num = torch.logsumexp(s.masked_fill(~pos, neg_inf), dim=1)
        den = torch.logsumexp(s, dim=1)
        return (den - num).mean()
    neg = torch.logsumexp(s.masked_fill(pos | excl, neg_inf), dim=1, keepdim=True)  # [nq, 1]
    # a row without negatives: log(e^{s+} + 0) = s+, the term is 0
    per = torch.logaddexp(s, neg) - s  # -log(e^s / (e^s + sum_neg e^s-)) for every column
    return per.masked_fill(~pos, 0.0).sum(dim=1).mean()


__all__ = ["LOSSES", "MODES", "Group", "batch_tensors", "format_mc", "load_groups", "make_batches",
           "multi_positive_nce", "read_records", "split_records"]
