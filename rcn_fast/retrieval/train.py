"""Retriever training: multi-positive noise-contrastive estimation with
in-batch negatives (ReConnect eq. 3, sec. 3.1 / App. A.3; ZEBRA eq. 2).

    python -m rcn_fast.retrieval.train --train FILE --base MODEL --out DIR
        [--mode explanation|concept] [--lr 1e-5] [--weight-decay 1e-2]
        [--max-length 256] [--max-positives 64] [--passages-per-batch 200]
        [--epochs 1] [--max-steps N] [--temperature 0.05]
        [--gradient-checkpointing] [--checkpoint-every 100] [--config FILE.yaml]

Training data (JSON lines):

* ``explanation`` mode (ReConnect): ``{"question": str | {"stem": ...},
  "explanations": [str, ...]}``. Queries are the question and each
  explanation; the positives of a query are the question's explanations
  (other than the query itself).
* ``concept`` mode (ZEBRA): ``{"question": ..., "choices": [str, ...] |
  [{"label", "text"}], "concept": str}``. Items are written as
  ``"Q [SEP] A. c1 [SEP] B. c2 ..."``; the positives of an item are the
  other items with the same concept plus permutations of its own choices.

For a query q with positives P and the batch's passages B (its own
positives plus everyone else's, the in-batch negatives):

    L(q) = -log( sum_{p in P} exp(s(q,p)/t) / sum_{b in B} exp(s(q,b)/t) )

with s the (cosine, when ``normalize``) similarity of the pooled encoder
outputs. RAdam, weight decay; checkpoints (model, optimizer, RNG, position)
every ``checkpoint_every`` steps; rerunning the same command resumes from
the last checkpoint. The result is a model directory that
``Encoder.from_pretrained(out)`` loads with the same pooling and prefixes.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import random
import shutil
import sys
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np

from rcn_fast._arrays import require
from rcn_fast.retrieval.encoder import (
    SETTINGS_FILE, _model_settings, _pooled_module, _TORCH_HINT, resolve_model_dir,
)

logger = logging.getLogger("rcn_fast.retrieval")
MODES = ("explanation", "concept")
# settings a checkpoint must share with the command that resumes it
_RESUME_KEYS = ("train", "base", "mode", "lr", "weight_decay", "max_length", "max_positives",
                "passages_per_batch", "temperature", "seed", "pooling", "normalize", "query_prefix",
                "passage_prefix", "choice_permutations")


@dataclass
class TrainConfig:
    """Retriever training settings (plain data; JSON/YAML serialisable).

    Attributes
    ----------
    train : str
        JSON lines training file (see the module docstring).
    base : str
        Starting encoder (model directory, package or cached HF id).
    out : str
        Output directory: the trained model, ``checkpoint/`` while running.
    mode : {"explanation", "concept"}
    lr, weight_decay : float
        RAdam settings (paper: 1e-5, 1e-2).
    max_length : int
        Token limit (paper: 256).
    max_positives : int
        Positives (and queries) kept per question/concept group (paper: 64).
    passages_per_batch : int
        Passages per batch, all groups together (paper: up to 200).
    temperature : float
        Softmax temperature t on the similarities.
    epochs : int
    max_steps : int or None
        Stop after this many optimiser steps in total.
    seed : int
    pooling, normalize, query_prefix, passage_prefix : optional
        None: from the base model's ``rcn_fast_encoder.json``, else the E5
        defaults (mean, True, ``"query: "``, ``"passage: "``).
    gradient_checkpointing : bool
    checkpoint_every : int
        Steps between checkpoints.
    choice_permutations : int
        Concept mode: shuffled-choice copies added per item.
    device : str or None
    """

    train: str
    base: str
    out: str
    mode: str = "explanation"
    lr: float = 1e-5
    weight_decay: float = 1e-2
    max_length: int = 256
    max_positives: int = 64
    passages_per_batch: int = 200
    temperature: float = 0.05
    epochs: int = 1
    max_steps: int | None = None
    seed: int = 0
    pooling: str | None = None
    normalize: bool | None = None
    query_prefix: str | None = None
    passage_prefix: str | None = None
    gradient_checkpointing: bool = False
    checkpoint_every: int = 100
    choice_permutations: int = 2
    device: str | None = None

    def __post_init__(self) -> None:
        self.train, self.base, self.out = str(self.train), str(self.base), str(self.out)
        if self.mode not in MODES:
            raise ValueError(f"mode: expected one of {list(MODES)}, got {self.mode!r}")
        for name in ("max_length", "max_positives", "passages_per_batch", "epochs", "checkpoint_every"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name}: expected a positive int, got {v!r}")
        if self.max_steps is not None and self.max_steps < 1:
            raise ValueError(f"max_steps: expected a positive int or None, got {self.max_steps!r}")
        for name in ("lr", "temperature"):
            if not (isinstance(getattr(self, name), (int, float)) and getattr(self, name) > 0):
                raise ValueError(f"{name}: expected a positive number, got {getattr(self, name)!r}")
        if self.pooling not in (None, "mean", "cls"):
            raise ValueError(f"pooling: expected 'mean' or 'cls', got {self.pooling!r}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "TrainConfig":
        known = {f.name for f in fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise ValueError(f"config: unknown training settings {sorted(unknown)}")
        return cls(**d)


# ----------------------------------------------------------------------- data
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


def load_groups(path: str, mode: str, *, choice_permutations: int = 2, seed: int = 0) -> list[Group]:
    """Read the training file into groups (see the module docstring)."""
    records = []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if line.strip():
                try:
                    records.append((lineno, json.loads(line)))
                except json.JSONDecodeError as exc:
                    raise ValueError(f"train: {path} line {lineno} is not valid JSON ({exc.msg})") from None
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


def make_batches(groups: list[Group], epoch: int, cfg: TrainConfig) -> list[list[tuple[int, list[int], list[int]]]]:
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


def multi_positive_nce(q: Any, p: Any, pos: Any, excl: Any, temperature: float) -> Any:
    """The loss above, averaged over queries.

    Parameters
    ----------
    q : float tensor [nq, d]; p : float tensor [np, d]
    pos : bool tensor [nq, np]
        Positives of each query (at least one per row).
    excl : bool tensor [nq, np]
        Entries left out of the denominator (a query's own text).
    temperature : float

    Returns
    -------
    scalar tensor.
    """
    torch = require("torch", _TORCH_HINT)
    s = (q @ p.T) / temperature
    neg_inf = torch.finfo(s.dtype).min
    s = s.masked_fill(excl, neg_inf)
    num = torch.logsumexp(s.masked_fill(~pos, neg_inf), dim=1)
    den = torch.logsumexp(s, dim=1)
    return (den - num).mean()


# ---------------------------------------------------------------------- train
def _resolve_settings(cfg: TrainConfig, base_dir: Path) -> TrainConfig:
    stored = _model_settings(base_dir)
    defaults = {"pooling": "mean", "normalize": True, "query_prefix": "query: ", "passage_prefix": "passage: "}
    d = cfg.to_dict()
    for k, v in defaults.items():
        if d[k] is None:
            d[k] = stored.get(k, v)
    return TrainConfig.from_dict(d)


def _encode(tok: Any, module: Any, texts: list[str], prefix: str, cfg: TrainConfig, names: tuple, device: Any) -> Any:
    torch = require("torch", _TORCH_HINT)
    b = tok([prefix + t for t in texts], truncation=True, max_length=cfg.max_length, padding=True,
            return_tensors="pt")
    args = [b[n].to(device) if n in b else torch.zeros_like(b["input_ids"]).to(device) for n in names]
    e = module(*args)
    if cfg.normalize:
        e = torch.nn.functional.normalize(e, dim=-1)
    return e


def train(config: TrainConfig, *, stop_after: int | None = None, show_progress: bool = True) -> dict[str, Any]:
    """Train (or resume training) a retriever; returns a summary dict.

    Parameters
    ----------
    config : TrainConfig
    stop_after : int, optional
        Stop this call after that many steps, leaving a checkpoint (for job
        time limits); the next call with the same config resumes.
    show_progress : bool

    Returns
    -------
    dict with ``step``, ``done`` (bool), ``losses`` (list of float, this
    call), ``out``.
    """
    torch = require("torch", _TORCH_HINT)
    transformers = require("transformers", _TORCH_HINT)
    base_dir = resolve_model_dir(config.base)
    cfg = _resolve_settings(config, base_dir)
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    ckpt = out / "checkpoint"
    state_file = out / "train_state.json"
    if state_file.is_file() and json.loads(state_file.read_text()).get("done"):
        prev = json.loads(state_file.read_text())
        _check_same(prev["config"], cfg, out)
        logger.warning("%s: training already finished at step %d", out, prev["step"])
        return {"step": prev["step"], "done": True, "losses": [], "out": str(out)}

    groups = load_groups(cfg.train, cfg.mode, choice_permutations=cfg.choice_permutations, seed=cfg.seed)
    torch.manual_seed(cfg.seed)
    start_dir, step, epoch, batch_pos = base_dir, 0, 0, 0
    if (ckpt / "trainer_state.json").is_file():
        st = json.loads((ckpt / "trainer_state.json").read_text())
        _check_same(st["config"], cfg, out)
        start_dir, step, epoch, batch_pos = ckpt, st["step"], st["epoch"], st["batch_pos"]
        logger.warning("resuming %s from step %d (epoch %d, batch %d)", out, step, epoch, batch_pos)
    device = torch.device(cfg.device or "cpu")
    tok = transformers.AutoTokenizer.from_pretrained(str(start_dir))
    model = transformers.AutoModel.from_pretrained(str(start_dir)).to(device)
    if cfg.gradient_checkpointing:  # renamed in transformers 5
        (getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable)()
    model.train()
    from rcn_fast.retrieval.encoder import _model_inputs

    names = _model_inputs(model)
    module = _pooled_module(model, cfg.pooling, names)
    module.train()
    opt = torch.optim.RAdam(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    if start_dir == ckpt:
        opt.load_state_dict(torch.load(ckpt / "optimizer.pt", map_location=device))
        torch.set_rng_state(torch.load(ckpt / "rng.pt"))

    total = cfg.max_steps or sum(len(make_batches(groups, e, cfg)) for e in range(cfg.epochs))
    bar = None
    if show_progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=total, initial=step, desc="train retriever", unit="step", file=sys.stderr)
    losses: list[float] = []
    done_this_call = 0
    t0 = time.perf_counter()
    while epoch < cfg.epochs:
        batches = make_batches(groups, epoch, cfg)
        stopped = False
        while batch_pos < len(batches):
            if (cfg.max_steps is not None and step >= cfg.max_steps) or \
                    (stop_after is not None and done_this_call >= stop_after):
                stopped = True
                break
            qt, pt, pos, excl = batch_tensors(groups, batches[batch_pos])
            batch_pos += 1
            if not qt:
                continue
            q = _encode(tok, module, qt, cfg.query_prefix, cfg, names, device)
            p = _encode(tok, module, pt, cfg.passage_prefix, cfg, names, device)
            loss = multi_positive_nce(q, p, torch.from_numpy(pos).to(device), torch.from_numpy(excl).to(device),
                                      cfg.temperature)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            step += 1
            done_this_call += 1
            lv = float(loss.detach())
            if not math.isfinite(lv):
                raise FloatingPointError(f"loss became {lv} at step {step}; lower lr or raise temperature")
            losses.append(lv)
            if bar is not None:
                bar.update(1)
                bar.set_postfix(loss=f"{lv:.4f}")
            if step % cfg.checkpoint_every == 0:
                _save_checkpoint(ckpt, model, tok, opt, cfg, step, epoch, batch_pos)
        if stopped:
            break
        epoch, batch_pos = epoch + 1, 0
    if bar is not None:
        bar.close()
    finished = epoch >= cfg.epochs or (cfg.max_steps is not None and step >= cfg.max_steps)
    logger.info("%d steps in %.1f s, last loss %s", done_this_call, time.perf_counter() - t0,
                f"{losses[-1]:.4f}" if losses else "n/a")
    if not finished:
        _save_checkpoint(ckpt, model, tok, opt, cfg, step, epoch, batch_pos)
        return {"step": step, "done": False, "losses": losses, "out": str(out)}
    model.eval()
    model.save_pretrained(str(out))
    tok.save_pretrained(str(out))
    (out / SETTINGS_FILE).write_text(json.dumps(
        {"pooling": cfg.pooling, "normalize": cfg.normalize, "query_prefix": cfg.query_prefix,
         "passage_prefix": cfg.passage_prefix, "max_length": cfg.max_length}, indent=2) + "\n")
    state_file.write_text(json.dumps({"done": True, "step": step, "config": cfg.to_dict()}, indent=2) + "\n")
    shutil.rmtree(ckpt, ignore_errors=True)
    return {"step": step, "done": True, "losses": losses, "out": str(out)}


def _check_same(prev: dict[str, Any], cfg: TrainConfig, out: Path) -> None:
    now = cfg.to_dict()
    diff = [f"{k}: {prev.get(k)!r} != {now.get(k)!r}" for k in _RESUME_KEYS if prev.get(k) != now.get(k)]
    if diff:
        raise ValueError(f"out: {out} holds a training run with other settings (" + "; ".join(diff)
                         + "); use another --out directory")


def _save_checkpoint(ckpt: Path, model: Any, tok: Any, opt: Any, cfg: TrainConfig, step: int, epoch: int,
                     batch_pos: int) -> None:
    torch = require("torch", _TORCH_HINT)
    tmp = ckpt.with_name(f".checkpoint.{os.getpid()}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    model.save_pretrained(str(tmp))
    tok.save_pretrained(str(tmp))
    torch.save(opt.state_dict(), tmp / "optimizer.pt")
    torch.save(torch.get_rng_state(), tmp / "rng.pt")
    (tmp / "trainer_state.json").write_text(json.dumps(
        {"step": step, "epoch": epoch, "batch_pos": batch_pos, "config": cfg.to_dict()}, indent=2) + "\n")
    old = ckpt.with_name(f".checkpoint.{os.getpid()}.old")
    if ckpt.exists():
        os.replace(ckpt, old)
    os.replace(tmp, ckpt)
    shutil.rmtree(old, ignore_errors=True)


# ------------------------------------------------------------------------ CLI
def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m rcn_fast.train_retriever",
                                description="Train a dense retriever with multi-positive NCE (resumable).")
    p.add_argument("--config", help="YAML/JSON file of TrainConfig fields; flags override it")
    p.add_argument("--train")
    p.add_argument("--base")
    p.add_argument("--out")
    p.add_argument("--mode", choices=MODES)
    for name, typ in (("lr", float), ("weight-decay", float), ("max-length", int), ("max-positives", int),
                      ("passages-per-batch", int), ("temperature", float), ("epochs", int), ("max-steps", int),
                      ("seed", int), ("checkpoint-every", int), ("choice-permutations", int)):
        p.add_argument(f"--{name}", type=typ)
    p.add_argument("--pooling", choices=["mean", "cls"])
    p.add_argument("--query-prefix")
    p.add_argument("--passage-prefix")
    p.add_argument("--gradient-checkpointing", action="store_true", default=None)
    p.add_argument("--device")
    p.add_argument("--stop-after", type=int, help="stop this run after N steps, leaving a checkpoint")
    p.add_argument("--no-progress", action="store_true")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    d: dict[str, Any] = {}
    if args.config:
        yaml = require("yaml", "pip install pyyaml")
        d.update(yaml.safe_load(Path(args.config).read_text()) or {})
    skip = {"config", "stop_after", "no_progress"}
    d.update({k: v for k, v in vars(args).items() if v is not None and k not in skip})
    try:
        for k in ("train", "base", "out"):
            if k not in d:
                raise ValueError(f"--{k}: required (on the command line or in --config)")
        cfg = TrainConfig.from_dict(d)
        res = train(cfg, stop_after=args.stop_after, show_progress=not args.no_progress)
    except (ValueError, FileNotFoundError, ImportError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps({k: v for k, v in res.items() if k != "losses"}
                     | {"last_loss": res["losses"][-1] if res["losses"] else None}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
