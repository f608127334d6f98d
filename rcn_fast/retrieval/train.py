"""Retriever training: multi-positive noise-contrastive estimation with
in-batch negatives (ReConnect eq. 3, sec. 3.1 / App. A.3; ZEBRA eq. 2).

    python -m rcn_fast.retrieval.train --train FILE --base MODEL --out DIR
        [--mode explanation|concept] [--loss per_positive|marginal]
        [--similarity dot|cosine] [--temperature T] [--lr 1e-5]
        [--weight-decay 1e-2] [--max-length 256] [--max-positives 64]
        [--passages-per-batch 200] [--max-steps 25000] [--epochs N]
        [--warmup-steps 0] [--lr-schedule linear|constant]
        [--val-fraction 0.1] [--val-file FILE] [--gradient-checkpointing]
        [--checkpoint-every 100] [--config FILE.yaml]

Training data (JSON lines):

* ``explanation`` mode (ReConnect): ``{"question": str | {"stem": ...},
  "explanations": [str, ...]}``. Queries are the question and each
  explanation; the positives of a query are the question's explanations
  (other than the query itself).
* ``concept`` mode (ZEBRA): ``{"question": ..., "choices": [str, ...] |
  [{"label", "text"}], "concept": str}``. Items are written as
  ``"Q [SEP] A. c1 [SEP] B. c2 ..."`` (ZEBRA's released data script; the
  paper's eq. 1 writes the choices without their letters); the positives
  of an item are the other items with the same concept plus permutations
  of its own choices.

For a query q with positives P and negatives N (the other passages of the
batch: in-batch negatives; the query's own text is left out), the default
``loss="per_positive"`` normalises each positive against itself plus the
negatives only (ZEBRA eq. 2, ReConnect eq. 3; ZEBRA's released trainer,
goldenretriever's ``MultiLabelNCELoss``):

    L(q) = sum_{p in P} -log( e^{s(q,p)} / (e^{s(q,p)} + sum_{n in N} e^{s(q,n)}) )

summed over the positives and averaged over the queries of the batch.
``loss="marginal"`` is the marginal likelihood of the positives with all
positives in one denominator, ``-log(sum_P e^s / sum_{P+N} e^s)``.

``s`` is the dot product of the pooled encoder outputs (``similarity="dot"``,
eq. 2 of both papers; temperature 1) or their cosine divided by a
temperature (``similarity="cosine"``, default temperature 0.05).

The paper's recipe is the default: RAdam (lr 1e-5, weight decay 1e-2),
``max_steps=25000`` optimiser steps with linear decay to 0 (optional linear
warm-up, ``warmup_steps``), gradients clipped to norm 1 (the reference
trainer's setting), a random 90/10 split of the training file's records
into training and validation (ReConnect App. A.3; ``val_file`` gives a
separate validation file instead, as ZEBRA validated on the CSQA dev set)
and the checkpoint with the lowest validation loss kept as the result
(validation runs every ``checkpoint_every`` steps and at the end).
Checkpoints (model, optimizer, scheduler, RNG, position, best so far)
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
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from rcn_fast._validate import Settings, is_int, is_number
from rcn_fast._arrays import require
from rcn_fast.model_files import SETTINGS_FILE, refuse_remote_code, resolve_model_dir
from rcn_fast.retrieval.encoders.base import TORCH_HINT, saved_settings
from rcn_fast.retrieval.encoders.torch import model_inputs, pooled_module
from rcn_fast.retrieval.train_data import (
    LOSSES, MODES, Group, batch_tensors, load_groups, make_batches, multi_positive_nce, read_records, split_records,
)

logger = logging.getLogger("rcn_fast.retrieval")
SIMILARITIES = ("dot", "cosine")
LR_SCHEDULES = ("linear", "constant")
DEFAULT_TEMPERATURE = {"dot": 1.0, "cosine": 0.05}
# settings a checkpoint must share with the command that resumes it
_RESUME_KEYS = ("train", "base", "mode", "lr", "weight_decay", "max_length", "max_positives",
                "passages_per_batch", "temperature", "seed", "pooling", "normalize", "query_prefix",
                "passage_prefix", "choice_permutations", "loss", "similarity", "max_steps", "epochs",
                "warmup_steps", "lr_schedule", "max_grad_norm", "val_fraction", "val_file")


@dataclass
class TrainConfig(Settings):
    """Retriever training settings (plain data; JSON/YAML serialisable).

    Defaults follow the papers (ReConnect App. A.3, ZEBRA sec. 4.2) unless
    stated.

    Attributes
    ----------
    train : str
        JSON lines training file (see the module docstring).
    base : str
        Starting encoder (model directory, package or cached HF id).
    out : str
        Output directory: the trained model, ``checkpoint/`` and ``best/``
        while running.
    mode : {"explanation", "concept"}
    loss : {"per_positive", "marginal"}
        ``"per_positive"`` (default, the papers' eq.): each positive
        normalised against itself plus the negatives, summed over the
        positives, averaged over queries. ``"marginal"``: all positives in
        one denominator (a different objective; kept as an option).
    similarity : {"dot", "cosine"}
        ``"dot"`` (default, eq. 2): dot product of the pooled outputs.
        ``"cosine"``: L2-normalised outputs, ``s = cos / temperature``.
    temperature : float or None
        Divides the similarities. None: 1.0 for ``"dot"`` (the papers have
        no temperature), 0.05 for ``"cosine"``.
    lr, weight_decay : float
        RAdam settings (paper: 1e-5, 1e-2).
    max_length : int
        Token limit (paper: 256).
    max_positives : int
        Positives (and queries) kept per question/concept group (paper: 64).
    passages_per_batch : int
        Passages per batch, all groups together (paper: up to 200).
    max_steps : int or None
        Optimiser steps in total (paper: 25,000). None: ``epochs`` decides.
    epochs : int or None
        Passes over the training groups. None: as many as ``max_steps``
        needs. With both set, training stops at whichever comes first.
    warmup_steps : int
        Linear warm-up from 0 to ``lr`` (default 0: the papers name none,
        and the reference trainer's default is 0).
    lr_schedule : {"linear", "constant"}
        ``"linear"`` (paper): after warm-up, decay linearly to 0 at the
        last step. ``"constant"``: keep ``lr``.
    max_grad_norm : float or None
        Gradient norm clipping (1.0: the reference trainer's default; the
        papers do not say). None: no clipping.
    val_fraction : float
        Fraction of the training file's records (questions) held out for
        validation, drawn with ``seed`` (paper: 0.1). 0: no validation, the
        last step's model is the result. Ignored when ``val_file`` is set.
    val_file : str or None
        Validation records in the training file's format, instead of a
        split (ZEBRA validated on the CSQA dev set).
    seed : int
    pooling, normalize, query_prefix, passage_prefix : optional
        The trained model's inference settings, saved beside it. None: from
        the base model's ``rcn_fast_encoder.json``, else the E5 defaults
        (mean, True, ``"query: "``, ``"passage: "``). ``normalize`` does
        not affect the training loss (``similarity`` does).
    gradient_checkpointing : bool
    checkpoint_every : int
        Steps between checkpoints and validation passes.
    choice_permutations : int
        Concept mode: shuffled-choice copies added per item.
    device : str or None
    """

    settings_name: ClassVar[str] = "training"

    train: str
    base: str
    out: str
    mode: str = "explanation"
    loss: str = "per_positive"
    similarity: str = "dot"
    temperature: float | None = None
    lr: float = 1e-5
    weight_decay: float = 1e-2
    max_length: int = 256
    max_positives: int = 64
    passages_per_batch: int = 200
    max_steps: int | None = 25000
    epochs: int | None = None
    warmup_steps: int = 0
    lr_schedule: str = "linear"
    max_grad_norm: float | None = 1.0
    val_fraction: float = 0.1
    val_file: str | None = None
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
        if self.loss not in LOSSES:
            raise ValueError(f"loss: expected one of {list(LOSSES)}, got {self.loss!r}")
        if self.similarity not in SIMILARITIES:
            raise ValueError(f"similarity: expected one of {list(SIMILARITIES)}, got {self.similarity!r}")
        if self.lr_schedule not in LR_SCHEDULES:
            raise ValueError(f"lr_schedule: expected one of {list(LR_SCHEDULES)}, got {self.lr_schedule!r}")
        for name in ("max_length", "max_positives", "passages_per_batch", "checkpoint_every"):
            v = getattr(self, name)
            if not is_int(v) or v < 1:
                raise ValueError(f"{name}: expected a positive int, got {v!r}")
        for name in ("max_steps", "epochs"):
            v = getattr(self, name)
            if v is not None and (not is_int(v) or v < 1):
                raise ValueError(f"{name}: expected a positive int or None, got {v!r}")
        if self.max_steps is None and self.epochs is None:
            raise ValueError("max_steps, epochs: set at least one (paper: max_steps=25000)")
        if not is_int(self.warmup_steps) or self.warmup_steps < 0:
            raise ValueError(f"warmup_steps: expected an int >= 0, got {self.warmup_steps!r}")
        if self.temperature is None:
            self.temperature = DEFAULT_TEMPERATURE[self.similarity]
        for name in ("lr", "temperature"):
            v = getattr(self, name)
            if isinstance(v, bool) or not (isinstance(v, (int, float)) and v > 0):
                raise ValueError(f"{name}: expected a positive number, got {v!r}")
        if self.max_grad_norm is not None and (isinstance(self.max_grad_norm, bool) or not (
                isinstance(self.max_grad_norm, (int, float)) and self.max_grad_norm > 0)):
            raise ValueError(f"max_grad_norm: expected a positive number or None, got {self.max_grad_norm!r}")
        v = self.val_fraction
        if not is_number(v) or not 0 <= v < 1:
            raise ValueError(f"val_fraction: expected a number in [0, 1), got {v!r}")
        if self.val_file is not None:
            self.val_file = str(self.val_file)
        if self.pooling not in (None, "mean", "cls"):
            raise ValueError(f"pooling: expected 'mean' or 'cls', got {self.pooling!r}")


# ---------------------------------------------------------------------- train
def _resolve_settings(cfg: TrainConfig, base_dir: Path) -> TrainConfig:
    stored = saved_settings(base_dir)
    defaults = {"pooling": "mean", "normalize": True, "query_prefix": "query: ", "passage_prefix": "passage: "}
    d = cfg.to_dict()
    for k, v in defaults.items():
        if d[k] is None:
            d[k] = stored.get(k, v)
    return TrainConfig.from_dict(d)


def _encode(tok: Any, module: Any, texts: list[str], prefix: str, cfg: TrainConfig, names: tuple, device: Any) -> Any:
    torch = require("torch", TORCH_HINT)
    b = tok([prefix + t for t in texts], truncation=True, max_length=cfg.max_length, padding=True,
            return_tensors="pt")
    args = [b[n].to(device) if n in b else torch.zeros_like(b["input_ids"]).to(device) for n in names]
    e = module(*args)
    if cfg.similarity == "cosine":
        e = torch.nn.functional.normalize(e, dim=-1)
    return e


def _batch_loss(groups: list[Group], batch: Any, tok: Any, module: Any, cfg: TrainConfig, names: tuple,
                device: Any) -> tuple[Any, int]:
    """(mean loss tensor or None, number of queries) of one batch."""
    torch = require("torch", TORCH_HINT)
    qt, pt, pos, excl = batch_tensors(groups, batch)
    if not qt:
        return None, 0
    q = _encode(tok, module, qt, cfg.query_prefix, cfg, names, device)
    p = _encode(tok, module, pt, cfg.passage_prefix, cfg, names, device)
    loss = multi_positive_nce(q, p, torch.from_numpy(pos).to(device), torch.from_numpy(excl).to(device),
                              float(cfg.temperature), form=cfg.loss)
    return loss, len(qt)


def validation_loss(groups: list[Group], tok: Any, module: Any, cfg: TrainConfig, names: tuple,
                    device: Any) -> float:
    """Mean per-query loss over the validation groups (fixed batches, no
    gradient, dropout off)."""
    torch = require("torch", TORCH_HINT)
    was_training = module.training
    module.eval()
    total, n = 0.0, 0
    try:
        with torch.no_grad():
            for batch in make_batches(groups, 0, cfg):
                loss, nq = _batch_loss(groups, batch, tok, module, cfg, names, device)
                if nq:
                    total += float(loss) * nq
                    n += nq
    finally:
        module.train(was_training)
    return total / n if n else float("nan")


def lr_factor(step: int, total: int, warmup: int, schedule: str) -> float:
    """Multiplier of ``lr`` for optimiser step ``step`` (0-based) of
    ``total``: linear warm-up over ``warmup`` steps, then constant or
    linear decay reaching 0 at ``total``."""
    if warmup and step < warmup:
        return (step + 1) / warmup
    if schedule == "constant":
        return 1.0
    return max(0.0, (total - step) / max(1, total - warmup))


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
    call), ``val_losses`` (list of [step, loss], whole run), ``best_step``
    (the step whose model is the result; None without validation),
    ``out``.
    """
    torch = require("torch", TORCH_HINT)
    transformers = require("transformers", TORCH_HINT)
    base_dir = resolve_model_dir(config.base)
    cfg = _resolve_settings(config, base_dir)
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    ckpt, best_dir = out / "checkpoint", out / "best"
    state_file = out / "train_state.json"
    if state_file.is_file() and json.loads(state_file.read_text()).get("done"):
        prev = json.loads(state_file.read_text())
        _check_same(prev["config"], cfg, out)
        logger.warning("%s: training already finished at step %d", out, prev["step"])
        return {"step": prev["step"], "done": True, "losses": [], "val_losses": prev.get("val_losses", []),
                "best_step": prev.get("best_step"), "out": str(out)}

    records = read_records(cfg.train)
    if cfg.val_file is not None:
        train_records, val_records = records, read_records(cfg.val_file, "val_file")
    else:
        train_records, val_records = split_records(records, cfg.val_fraction, cfg.seed)
    groups = load_groups(cfg.train, cfg.mode, choice_permutations=cfg.choice_permutations, seed=cfg.seed,
                         records=train_records)
    val_groups = load_groups(cfg.val_file or cfg.train, cfg.mode, choice_permutations=cfg.choice_permutations,
                             seed=cfg.seed, records=val_records) if val_records else []
    torch.manual_seed(cfg.seed)
    start_dir, step, epoch, batch_pos = base_dir, 0, 0, 0
    best = {"loss": math.inf, "step": None}
    val_losses: list[list[float]] = []
    if (ckpt / "trainer_state.json").is_file():
        st = json.loads((ckpt / "trainer_state.json").read_text())
        _check_same(st["config"], cfg, out)
        start_dir, step, epoch, batch_pos = ckpt, st["step"], st["epoch"], st["batch_pos"]
        best = {"loss": math.inf if st.get("best_loss") is None else st["best_loss"], "step": st.get("best_step")}
        val_losses = st.get("val_losses", [])
        logger.warning("resuming %s from step %d (epoch %d, batch %d)", out, step, epoch, batch_pos)
    device = torch.device(cfg.device or "cpu")
    refuse_remote_code(start_dir)  # a resumed checkpoint folder too
    tok = transformers.AutoTokenizer.from_pretrained(str(start_dir), trust_remote_code=False)
    model = transformers.AutoModel.from_pretrained(str(start_dir), trust_remote_code=False).to(device)
    if cfg.gradient_checkpointing:  # renamed in transformers 5
        (getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable)()
    model.train()

    names = model_inputs(model)
    module = pooled_module(model, cfg.pooling, names)
    module.train()
    per_epoch = [len(make_batches(groups, e, cfg)) for e in range(cfg.epochs)] if cfg.epochs else []
    total = min(x for x in (cfg.max_steps, sum(per_epoch) if cfg.epochs else None) if x is not None)
    opt = torch.optim.RAdam(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda i: lr_factor(i, total, cfg.warmup_steps, cfg.lr_schedule))
    if start_dir == ckpt:
        # weights_only: plain tensors and containers, never arbitrary pickled objects
        opt.load_state_dict(torch.load(ckpt / "optimizer.pt", map_location=device, weights_only=True))
        sched.load_state_dict(torch.load(ckpt / "scheduler.pt", weights_only=True))
        torch.set_rng_state(torch.load(ckpt / "rng.pt", weights_only=True))

    def validate() -> None:
        if not val_groups or (val_losses and val_losses[-1][0] == step):
            return
        v = validation_loss(val_groups, tok, module, cfg, names, device)
        val_losses.append([step, v])
        logger.info("step %d: validation loss %.4f", step, v)
        if v < best["loss"]:
            best.update(loss=v, step=step)
            _save_model(best_dir, model, tok)

    bar = None
    if show_progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=total, initial=step, desc="train retriever", unit="step", file=sys.stderr)
    losses: list[float] = []
    done_this_call = 0
    t0 = time.perf_counter()
    stopped = False
    while step < total and (cfg.epochs is None or epoch < cfg.epochs):
        batches = make_batches(groups, epoch, cfg)
        while batch_pos < len(batches):
            if step >= total:
                break
            if stop_after is not None and done_this_call >= stop_after:
                stopped = True
                break
            loss, nq = _batch_loss(groups, batches[batch_pos], tok, module, cfg, names, device)
            batch_pos += 1
            if not nq:
                continue
            opt.zero_grad(set_to_none=True)
            loss.backward()
            if cfg.max_grad_norm is not None:
                torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.max_grad_norm)
            opt.step()
            sched.step()
            step += 1
            done_this_call += 1
            lv = float(loss.detach())
            if not math.isfinite(lv):
                raise FloatingPointError(f"loss became {lv} at step {step}; lower lr or temperature settings")
            losses.append(lv)
            if bar is not None:
                bar.update(1)
                bar.set_postfix(loss=f"{lv:.4f}")
            if step % cfg.checkpoint_every == 0:
                validate()
                _save_checkpoint(ckpt, model, tok, opt, sched, cfg, step, epoch, batch_pos, best, val_losses)
        if stopped:
            break
        epoch, batch_pos = epoch + 1, 0
    if bar is not None:
        bar.close()
    finished = step >= total or (cfg.epochs is not None and epoch >= cfg.epochs)
    logger.info("%d steps in %.1f s, last loss %s", done_this_call, time.perf_counter() - t0,
                f"{losses[-1]:.4f}" if losses else "n/a")
    if not finished:
        _save_checkpoint(ckpt, model, tok, opt, sched, cfg, step, epoch, batch_pos, best, val_losses)
        return {"step": step, "done": False, "losses": losses, "val_losses": val_losses,
                "best_step": best["step"], "out": str(out)}
    validate()
    model.eval()
    if best["step"] is not None and best["step"] != step:
        for f in best_dir.iterdir():  # the best model by validation loss is the result
            shutil.copy2(f, out / f.name)
        logger.info("kept the model of step %d (validation loss %.4f)", best["step"], best["loss"])
    else:
        _save_model(out, model, tok)
    (out / SETTINGS_FILE).write_text(json.dumps(
        {"pooling": cfg.pooling, "normalize": cfg.normalize, "query_prefix": cfg.query_prefix,
         "passage_prefix": cfg.passage_prefix, "max_length": cfg.max_length}, indent=2) + "\n")
    state_file.write_text(json.dumps({"done": True, "step": step, "best_step": best["step"],
                                      "best_val_loss": None if best["step"] is None else best["loss"],
                                      "val_losses": val_losses, "config": cfg.to_dict()}, indent=2) + "\n")
    shutil.rmtree(ckpt, ignore_errors=True)
    shutil.rmtree(best_dir, ignore_errors=True)
    return {"step": step, "done": True, "losses": losses, "val_losses": val_losses, "best_step": best["step"],
            "out": str(out)}


def _check_same(prev: dict[str, Any], cfg: TrainConfig, out: Path) -> None:
    now = cfg.to_dict()
    diff = [f"{k}: {prev.get(k)!r} != {now.get(k)!r}" for k in _RESUME_KEYS if prev.get(k) != now.get(k)]
    if diff:
        raise ValueError(f"out: {out} holds a training run with other settings (" + "; ".join(diff)
                         + "); use another --out directory")


def _save_model(d: Path, model: Any, tok: Any) -> None:
    """Model + tokenizer into ``d``, replacing it atomically."""
    tmp = d.with_name(f".{d.name}.{os.getpid()}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    model.save_pretrained(str(tmp))
    tok.save_pretrained(str(tmp))
    if d.is_dir():
        old = d.with_name(f".{d.name}.{os.getpid()}.old")
        os.replace(d, old)
        os.replace(tmp, d)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, d)


def _save_checkpoint(ckpt: Path, model: Any, tok: Any, opt: Any, sched: Any, cfg: TrainConfig, step: int,
                     epoch: int, batch_pos: int, best: dict[str, Any], val_losses: list) -> None:
    torch = require("torch", TORCH_HINT)
    tmp = ckpt.with_name(f".checkpoint.{os.getpid()}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    model.save_pretrained(str(tmp))
    tok.save_pretrained(str(tmp))
    torch.save(opt.state_dict(), tmp / "optimizer.pt")
    torch.save(sched.state_dict(), tmp / "scheduler.pt")
    torch.save(torch.get_rng_state(), tmp / "rng.pt")
    (tmp / "trainer_state.json").write_text(json.dumps(
        {"step": step, "epoch": epoch, "batch_pos": batch_pos, "best_step": best["step"],
         "best_loss": best["loss"] if math.isfinite(best["loss"]) else None, "val_losses": val_losses,
         "config": cfg.to_dict()}, indent=2) + "\n")
    old = ckpt.with_name(f".checkpoint.{os.getpid()}.old")
    if ckpt.exists():
        os.replace(ckpt, old)
    os.replace(tmp, ckpt)
    shutil.rmtree(old, ignore_errors=True)


# ------------------------------------------------------------------------ CLI
def build_parser(prog: str = "python -m rcn_fast.train_retriever") -> argparse.ArgumentParser:
    """The training command's flags (:class:`TrainConfig` fields)."""
    p = argparse.ArgumentParser(prog=prog, description="Train a dense retriever with multi-positive NCE (resumable).")
    p.add_argument("--config", help="YAML/JSON file of TrainConfig fields; flags override it")
    p.add_argument("--train")
    p.add_argument("--base")
    p.add_argument("--out")
    p.add_argument("--mode", choices=MODES)
    p.add_argument("--loss", choices=LOSSES)
    p.add_argument("--similarity", choices=SIMILARITIES)
    p.add_argument("--lr-schedule", choices=LR_SCHEDULES)
    p.add_argument("--val-file")
    for name, typ in (("lr", float), ("weight-decay", float), ("max-length", int), ("max-positives", int),
                      ("passages-per-batch", int), ("temperature", float), ("epochs", int), ("max-steps", int),
                      ("warmup-steps", int), ("max-grad-norm", float), ("val-fraction", float),
                      ("seed", int), ("checkpoint-every", int), ("choice-permutations", int)):
        p.add_argument(f"--{name}", type=typ)
    p.add_argument("--pooling", choices=["mean", "cls"])
    p.add_argument("--query-prefix")
    p.add_argument("--passage-prefix")
    p.add_argument("--gradient-checkpointing", action="store_true", default=None)
    p.add_argument("--device")
    p.add_argument("--stop-after", type=int, help="stop this run after N steps, leaving a checkpoint")
    p.add_argument("--no-progress", action="store_true")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
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
    print(json.dumps({k: v for k, v in res.items() if k not in ("losses", "val_losses")}
                     | {"last_loss": res["losses"][-1] if res["losses"] else None}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
