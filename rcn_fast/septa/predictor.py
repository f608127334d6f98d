"""The SEPTA predictor (sec. 4.3, eqs. 10-13) and its training.

Per (question, choice i): the enhanced query vector ``t_i`` attends over the
top-k retrieved subgraph vectors ``G`` (multi-head, eq. 10) giving ``r_i``;
``p^_i = W1 (t_i + r_i) + b1`` (eq. 11); the plain question-choice embedding
``v_i`` gives ``p~_i = W2 v_i + b2`` (eq. 12); ``p_i = lambda p^_i +
(1 - lambda) p~_i`` (eq. 13); softmax over the choices, cross-entropy.

By default (``finetune_encoder=False``, CPU-friendly) rcn_fast keeps the
text encoder frozen here too, so ``t``, ``G`` and ``v`` are computed once
per question and only the predictor trains (RAdam). The paper fine-tunes
the language model in this stage (sec. 5.3: RoBERTa-large, learning rate
in {2e-5, 1e-5, 5e-6, 2e-6, 1e-6}, RAdam): ``finetune_encoder=True``
trains a copy of the text encoder (and the alignment's text projection
``W_T``, which maps its output into the aligned space) with the
predictor, ``encoder_lr`` for those weights and ``lr`` for the predictor
heads; ``t`` and ``v`` are then recomputed by that copy for every batch.
The subgraph vectors ``G`` stay the ones retrieved with the frozen aligned
encoder (the database lives in that space). The fine-tuned weights are
saved in ``predictor.safetensors`` and used at inference.

Features are z-scored per dimension with training-set statistics of the
initial (frozen) features before the heads (stored as buffers; a
reparametrisation of the same linear model that makes it trainable when a
frozen encoder embeds the choices of a question almost alike).
"""

from __future__ import annotations

import functools
import logging
import math
import os
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, ClassVar, Callable

import numpy as np

from rcn_fast._validate import Settings, is_int, is_number
from rcn_fast.septa.checkpoint import load_checkpoint, save_checkpoint
from rcn_fast.septa.gnn import torch_module

logger = logging.getLogger("rcn_fast.septa")


@dataclass
class PredictorConfig(Settings):
    """Predictor and fine-tuning settings.

    Attributes
    ----------
    top_k : int
        Subgraph vectors retrieved per (question, choice) (paper: 10-100).
    heads : int
        Attention heads (each with full-width d x d projections, as eq. 10).
    lam : float
        ``lambda`` of eq. 13, in [0, 1].
    num_triples : int
        Triples appended by query enhancement (paper: 10).
    lr : float
        RAdam learning rate of the predictor (attention and heads). The
        default 1e-3 suits the frozen-encoder setting where only these
        train; the paper used one rate from {2e-5, 1e-5, 5e-6, 2e-6, 1e-6}
        for everything, as it fine-tuned the language model too.
    finetune_encoder : bool
        Train the text encoder (and the text projection) together with the
        predictor, as the paper does (sec. 5.3). Default False: frozen, the
        features are computed once (CPU-friendly). Needs an rcn_fast
        ``Encoder`` of a transformers model.
    encoder_lr : float
        RAdam learning rate of the encoder and projection when
        ``finetune_encoder`` (paper grid: 2e-5, 1e-5, 5e-6, 2e-6, 1e-6).
    weight_decay : float
    batch_size : int
        Questions per step.
    epochs : int
    patience : int
        Stop when dev accuracy has not improved for this many epochs (paper: 3).
    dropout : float
    seed : int
    """

    settings_name: ClassVar[str] = "predictor"

    top_k: int = 10
    heads: int = 2
    lam: float = 0.5
    num_triples: int = 10
    lr: float = 1e-3
    finetune_encoder: bool = False
    encoder_lr: float = 1e-5
    weight_decay: float = 0.0
    batch_size: int = 16
    epochs: int = 10
    patience: int = 3
    dropout: float = 0.1
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("top_k", "heads", "batch_size", "epochs", "patience"):
            v = getattr(self, name)
            if not is_int(v) or v < 1:
                raise ValueError(f"{name}: expected a positive int, got {v!r}")
        if not is_int(self.num_triples) or self.num_triples < 0:
            raise ValueError(f"num_triples: expected an int >= 0, got {self.num_triples!r}")
        if not 0.0 <= float(self.lam) <= 1.0:
            raise ValueError(f"lam: expected a value in [0, 1], got {self.lam!r}")
        for name in ("lr", "encoder_lr"):
            v = getattr(self, name)
            if not is_number(v) or not v > 0:
                raise ValueError(f"{name}: expected a number > 0, got {v!r}")
        if not isinstance(self.finetune_encoder, bool):
            raise ValueError(f"finetune_encoder: expected true or false, got {self.finetune_encoder!r}")
        if not 0.0 <= float(self.dropout) < 1.0:
            raise ValueError(f"dropout: expected a value in [0, 1), got {self.dropout!r}")


@functools.lru_cache(maxsize=None)
def _predictor_class() -> Any:
    torch = torch_module()
    nn = torch.nn

    class SeptaPredictor(nn.Module):
        """Scores [B, C] from t [B, C, d], G [B, C, k, d], v [B, C, d_text].

        Parameters
        ----------
        dim : int
            Width of ``t`` and ``G`` (the aligned space).
        text_dim : int
            Width of ``v``.
        heads : int
        lam : float
        dropout : float
        """

        def __init__(self, dim: int, text_dim: int, heads: int = 2, lam: float = 0.5, dropout: float = 0.1) -> None:
            super().__init__()
            self.dim, self.text_dim, self.heads, self.lam = int(dim), int(text_dim), int(heads), float(lam)
            self.wq = nn.Linear(dim, heads * dim, bias=False)  # W_Q^(h) in R^{d x d}, stacked over heads
            self.wk = nn.Linear(dim, heads * dim, bias=False)
            self.wv = nn.Linear(dim, heads * dim, bias=False)
            self.wo = nn.Linear(heads * dim, dim, bias=False)
            self.w1 = nn.Linear(dim, 1)
            self.w2 = nn.Linear(text_dim, 1)
            self.drop = nn.Dropout(dropout)
            # feature standardisation (identity until set_feature_stats): the
            # encoder is frozen, so its embeddings' offset and scale are fixed;
            # z-scoring them conditions the linear heads (a reparametrisation)
            for name, width in (("t", dim), ("g", dim), ("v", text_dim)):
                self.register_buffer(f"{name}_mean", torch.zeros(width))
                self.register_buffer(f"{name}_std", torch.ones(width))

        @torch.no_grad()
        def set_feature_stats(self, t, G, v, G_mask=None, choice_mask=None) -> None:
            """Per-dimension mean/std of the training features (float tensors as
            in :meth:`forward`); padded choices and slots are ignored."""
            cm = choice_mask if choice_mask is not None else torch.ones(t.shape[:-1], dtype=torch.bool)
            gm = G_mask if G_mask is not None else torch.ones(G.shape[:-1], dtype=torch.bool)
            gm = gm & cm.unsqueeze(-1)
            for name, x, m in (("t", t, cm), ("g", G, gm), ("v", v, cm)):
                rows = x[m].double()
                if rows.shape[0] < 2:
                    continue
                getattr(self, f"{name}_mean").copy_(rows.mean(0))
                getattr(self, f"{name}_std").copy_(rows.std(0).clamp_min(1e-6))

        def attend(self, t, G, G_mask=None):
            """Eq. 10: ``r`` [..., d] and attention weights [..., H, k]."""
            t = (t - self.t_mean) / self.t_std
            G = (G - self.g_mean) / self.g_std
            *lead, k, d = G.shape
            H = self.heads
            q = self.wq(t).view(*lead, H, 1, d)
            kk = self.wk(G).view(*lead, k, H, d).transpose(-2, -3)  # [..., H, k, d]
            vv = self.wv(G).view(*lead, k, H, d).transpose(-2, -3)
            alpha = (q @ kk.transpose(-1, -2)).squeeze(-2) / math.sqrt(d)  # [..., H, k]
            if G_mask is not None:
                alpha = alpha.masked_fill(~G_mask.unsqueeze(-2), float("-inf"))
            w = torch.softmax(alpha, dim=-1)
            w = torch.nan_to_num(w, nan=0.0)  # no retrieved vector: r = 0
            r = (w.unsqueeze(-2) @ vv).squeeze(-2)  # [..., H, d]
            return self.wo(r.reshape(*lead, H * d)), w

        def forward(self, t, G, v, G_mask=None, choice_mask=None):
            """Scores ``p`` [B, C] (eq. 13); padded choices get -inf."""
            r, _ = self.attend(t, G, G_mask)
            t = (t - self.t_mean) / self.t_std
            v = (v - self.v_mean) / self.v_std
            p_hat = self.w1(self.drop(t + r)).squeeze(-1)
            p_tilde = self.w2(self.drop(v)).squeeze(-1)
            p = self.lam * p_hat + (1 - self.lam) * p_tilde
            if choice_mask is not None:
                p = p.masked_fill(~choice_mask, float("-inf"))
            return p

    return SeptaPredictor


def SeptaPredictor(*args: Any, **kwargs: Any) -> Any:
    """The predictor ``torch.nn.Module``: ``(dim, text_dim, heads=2, lam=0.5,
    dropout=0.1)``; ``forward(t, G, v, G_mask=None, choice_mask=None)`` ->
    scores [B, C]; ``attend(t, G, G_mask)`` -> (r, weights)."""
    return _predictor_class()(*args, **kwargs)


@functools.lru_cache(maxsize=None)
def _text_model_class() -> Any:
    torch = torch_module()
    nn = torch.nn

    class FinetunedText(nn.Module):
        """A trainable copy of an rcn_fast text encoder plus the alignment's
        text projection: ``embed(texts)`` -> encoder outputs [n, text_dim]
        (``v``), ``project(texts)`` -> ``W_T embed + b_T`` [n, dim] (``t``).
        Tokenisation, pooling, normalisation and the passage prefix follow
        the encoder's settings, as :func:`rcn_fast.septa.system.encode`."""

        def __init__(self, encoder: Any, text_proj: Any) -> None:
            super().__init__()
            import copy

            transformers = _require_transformers()
            from rcn_fast.retrieval.encoders.torch import model_inputs, pooled_module

            cfg, model_dir = getattr(encoder, "config", None), getattr(encoder, "model_dir", None)
            if cfg is None or model_dir is None or not hasattr(cfg, "pooling"):
                raise ValueError("finetune_encoder: needs an rcn_fast Encoder loaded from a transformers model "
                                 f"(Encoder.from_pretrained), got {type(encoder).__name__}")
            self.tokenizer = transformers.AutoTokenizer.from_pretrained(str(model_dir), trust_remote_code=False)
            self.lm = transformers.AutoModel.from_pretrained(str(model_dir), trust_remote_code=False)
            self.names = model_inputs(self.lm)
            self.pooled = pooled_module(self.lm, cfg.pooling, self.names)
            self.prefix, self.normalize = cfg.passage_prefix or "", bool(cfg.normalize)
            self.max_length = int(getattr(encoder, "max_length", None) or cfg.max_length)
            self.proj = copy.deepcopy(text_proj)
            for prm in self.proj.parameters():
                prm.requires_grad_(True)

        def embed(self, texts: list[str]) -> Any:
            b = self.tokenizer([self.prefix + t for t in texts], truncation=True, max_length=self.max_length,
                               padding=True, return_tensors="pt")
            args = [b[n] if n in b else torch.zeros_like(b["input_ids"]) for n in self.names]
            e = self.pooled(*args)
            return torch.nn.functional.normalize(e, dim=-1) if self.normalize else e

        def project(self, texts: list[str]) -> Any:
            return self.proj(self.embed(texts))

    return FinetunedText


def _require_transformers() -> Any:
    from rcn_fast._arrays import require

    return require("transformers", 'pip install "rcn_fast[septa]"  (transformers)')


def FinetunedText(encoder: Any, text_proj: Any) -> Any:
    """The trainable text encoder of ``finetune_encoder``: a copy of
    ``encoder`` (an rcn_fast Encoder of a transformers model) and of the
    alignment's text projection ``text_proj`` (a torch module)."""
    return _text_model_class()(encoder, text_proj)


QuestionTexts = list  # per question, per choice: (enhanced query text s_i, plain question-choice text)


def batch_inputs(feats: "QuestionFeatures", idx: Any, texts: QuestionTexts | None = None,
                 text_model: Any = None) -> dict[str, Any]:
    """Predictor inputs for questions ``idx``: the stored features, with
    ``t`` and ``v`` recomputed by ``text_model`` from ``texts`` when given
    (fine-tuning; gradients flow into the text model)."""
    torch = torch_module()
    x = feats.tensors(idx)
    if text_model is None:
        return x
    rows = np.arange(len(feats))[idx]
    enhanced, base, where = [], [], []
    for bi, qi in enumerate(rows):
        for ci, (s_i, plain) in enumerate(texts[int(qi)]):
            enhanced.append(s_i)
            base.append(plain)
            where.append((bi, ci))
    B, C = x["choice_mask"].shape
    t = x["t"].new_zeros(x["t"].shape)
    v = x["v"].new_zeros(x["v"].shape)
    if where:
        tt, vv = text_model.project(enhanced), text_model.embed(base)
        bi = torch.tensor([w[0] for w in where])
        ci = torch.tensor([w[1] for w in where])
        t = t.index_put((bi, ci), tt)
        v = v.index_put((bi, ci), vv)
    x["t"], x["v"] = t, v
    return x


@dataclass
class QuestionFeatures:
    """Precomputed inputs of the predictor for Q questions (C = most choices).

    Attributes
    ----------
    t : float32 [Q, C, d]      enhanced query vectors (aligned space)
    G : float32 [Q, C, k, d]   retrieved subgraph vectors (eq. 9)
    G_ids : int64 [Q, C, k]    their database ids (-1 padded)
    G_scores : float32 [Q, C, k]
    v : float32 [Q, C, d_text] plain question-choice embeddings
    choice_mask : bool [Q, C]
    answers : int64 [Q]        -1 where unknown
    """

    t: np.ndarray
    G: np.ndarray
    G_ids: np.ndarray
    G_scores: np.ndarray
    v: np.ndarray
    choice_mask: np.ndarray
    answers: np.ndarray

    def __len__(self) -> int:
        return int(self.t.shape[0])

    def tensors(self, idx: Any) -> dict[str, Any]:
        torch = torch_module()
        return {"t": torch.from_numpy(self.t[idx]), "G": torch.from_numpy(self.G[idx]),
                "v": torch.from_numpy(self.v[idx]), "G_mask": torch.from_numpy(self.G_ids[idx] >= 0),
                "choice_mask": torch.from_numpy(self.choice_mask[idx])}

    def save(self, path: str | os.PathLike[str]) -> None:
        np.savez(path, **asdict(self))

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> "QuestionFeatures":
        z = np.load(path)
        return cls(**{f.name: z[f.name] for f in fields(cls)})


def accuracy(model: Any, feats: QuestionFeatures, batch_size: int = 256, *, texts: QuestionTexts | None = None,
             text_model: Any = None) -> float:
    """Share of questions with a known answer that the predictor gets right
    (``texts`` / ``text_model``: see :func:`batch_inputs`)."""
    torch = torch_module()
    model.eval()
    if text_model is not None:
        text_model.eval()
        batch_size = min(batch_size, 32)
    known = np.nonzero(feats.answers >= 0)[0]
    if not len(known):
        return float("nan")
    right = 0
    with torch.no_grad():
        for s in range(0, len(known), batch_size):
            idx = known[s:s + batch_size]
            p = model(**batch_inputs(feats, idx, texts, text_model))
            right += int((p.argmax(-1).numpy() == feats.answers[idx]).sum())
    return right / len(known)


def train_predictor(model: Any, train: QuestionFeatures, config: PredictorConfig, *,
                    dev: QuestionFeatures | None = None, checkpoint: str | os.PathLike[str] | None = None,
                    progress: bool = False, on_epoch: Callable[[dict], None] | None = None,
                    text_model: Any = None, train_texts: QuestionTexts | None = None,
                    dev_texts: QuestionTexts | None = None) -> list[dict]:
    """Train with softmax cross-entropy over the choices and RAdam.

    Parameters
    ----------
    model : SeptaPredictor
    train : QuestionFeatures (answers known)
    config : PredictorConfig
    dev : QuestionFeatures, optional
        Accuracy after every epoch; the best epoch's weights are kept and
        training stops after ``patience`` epochs without improvement.
    checkpoint : path, optional
        Training state (a safetensors checkpoint, see
        :mod:`rcn_fast.septa.checkpoint`; rewritten every epoch; resumed
        when present).
    progress : bool
    on_epoch : callable(record), optional
    text_model : FinetunedText, optional
        ``finetune_encoder``: trained too (``config.encoder_lr``); ``t``
        and ``v`` come from it and ``train_texts`` / ``dev_texts`` (per
        question, per choice: (enhanced text, plain text)).

    Returns
    -------
    history : list of {"epoch", "loss", "first_loss", "dev_acc"} per epoch
    """
    torch = torch_module()
    if (train.answers < 0).any():
        raise ValueError("train: every training question needs an answer")
    if config.finetune_encoder != (text_model is not None):
        raise ValueError("text_model: expected a FinetunedText exactly when config.finetune_encoder is true")
    if text_model is not None and (train_texts is None or len(train_texts) != len(train)
                                   or (dev is not None and (dev_texts is None or len(dev_texts) != len(dev)))):
        raise ValueError("train_texts, dev_texts: expected the texts of every training (and dev) question")
    groups = [{"params": list(model.parameters()), "lr": config.lr}]
    if text_model is not None:
        groups.append({"params": [q for q in text_model.parameters() if q.requires_grad], "lr": config.encoder_lr})
    opt = torch.optim.RAdam(groups, lr=config.lr, weight_decay=config.weight_decay)
    ck = Path(checkpoint) if checkpoint is not None else None
    epoch, history, best, best_state, stale = 0, [], -1.0, None, 0
    if ck is not None and ck.is_file():
        st = load_checkpoint(ck)
        if st.get("config") != config.to_dict():
            raise ValueError(f"checkpoint: {ck} was written with other settings; remove it ({st.get('config')})")
        model.load_state_dict(st["model"])
        if text_model is not None:
            text_model.load_state_dict(st["text_model"])
        opt.load_state_dict(st["optim"])
        torch.set_rng_state(st["torch_rng"])
        epoch, history, best, best_state, stale = st["epoch"], st["history"], st["best"], st["best_state"], st["stale"]
        logger.info("predictor: resumed from %s after epoch %d", ck, epoch)
    else:
        model.set_feature_stats(**train.tensors(slice(None)))

    def snapshot() -> dict[str, Any]:
        out = {"model": {k: v.detach().clone() for k, v in model.state_dict().items()}}
        if text_model is not None:
            out["text_model"] = {k: v.detach().clone() for k, v in text_model.state_dict().items()}
        return out

    torch.manual_seed(config.seed + epoch)
    n = len(train)
    bs = min(config.batch_size, n)
    while epoch < config.epochs and stale < config.patience:
        model.train()
        if text_model is not None:
            text_model.train()
        order = np.random.default_rng([config.seed, epoch]).permutation(n)
        losses = []
        it = range(0, n, bs)
        if progress:
            from tqdm.auto import tqdm

            it = tqdm(it, desc=f"train epoch {epoch + 1}/{config.epochs}", unit="batch")
        for s in it:
            idx = order[s:s + bs]
            p = model(**batch_inputs(train, idx, train_texts, text_model))
            loss = torch.nn.functional.cross_entropy(p, torch.from_numpy(train.answers[idx]))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            losses.append(float(loss.detach()))
        epoch += 1
        rec = {"epoch": epoch, "loss": float(np.mean(losses)), "first_loss": losses[0],
               "dev_acc": accuracy(model, dev, texts=dev_texts, text_model=text_model) if dev is not None else None}
        history.append(rec)
        score = rec["dev_acc"] if rec["dev_acc"] is not None else -rec["loss"]
        if score > best:
            best, stale = score, 0
            best_state = snapshot()
        else:
            stale += 1
        if ck is not None:
            ck.parent.mkdir(parents=True, exist_ok=True)
            save_checkpoint(ck, {"config": config.to_dict(), "model": model.state_dict(), "optim": opt.state_dict(),
                                 "text_model": text_model.state_dict() if text_model is not None else None,
                                 "torch_rng": torch.get_rng_state(), "epoch": epoch, "history": history,
                                 "best": best, "best_state": best_state, "stale": stale})
        logger.info("predictor: epoch %d loss %.4f dev acc %s", epoch, rec["loss"], rec["dev_acc"])
        if on_epoch is not None:
            on_epoch(rec)
    if best_state is not None:
        model.load_state_dict(best_state["model"])
        if text_model is not None:
            text_model.load_state_dict(best_state["text_model"])
    model.eval()
    if text_model is not None:
        text_model.eval()
    return history
