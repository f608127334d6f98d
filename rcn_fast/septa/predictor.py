"""The SEPTA predictor (sec. 4.3, eqs. 10-13) and its training.

Per (question, choice i): the enhanced query vector ``t_i`` attends over the
top-k retrieved subgraph vectors ``G`` (multi-head, eq. 10) giving ``r_i``;
``p^_i = W1 (t_i + r_i) + b1`` (eq. 11); the plain question-choice embedding
``v_i`` gives ``p~_i = W2 v_i + b2`` (eq. 12); ``p_i = lambda p^_i +
(1 - lambda) p~_i`` (eq. 13); softmax over the choices, cross-entropy.

rcn_fast keeps the text encoder frozen here too, so ``t``, ``G`` and ``v``
are computed once per question and only the predictor trains (RAdam). The
frozen features are z-scored per dimension with training-set statistics
before the heads (stored as buffers; a reparametrisation of the same
linear model that makes it trainable when a frozen encoder embeds the
choices of a question almost alike).
"""

from __future__ import annotations

import functools
import logging
import math
import os
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, Callable

import numpy as np

from rcn_fast.septa.gnn import _torch

logger = logging.getLogger("rcn_fast.septa")


@dataclass
class PredictorConfig:
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
        RAdam learning rate. Higher than the paper's (2e-5...1e-6, which
        fine-tuned the whole language model): only the head trains here.
    weight_decay : float
    batch_size : int
        Questions per step.
    epochs : int
    patience : int
        Stop when dev accuracy has not improved for this many epochs (paper: 3).
    dropout : float
    seed : int
    """

    top_k: int = 10
    heads: int = 2
    lam: float = 0.5
    num_triples: int = 10
    lr: float = 1e-3
    weight_decay: float = 0.0
    batch_size: int = 16
    epochs: int = 10
    patience: int = 3
    dropout: float = 0.1
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("top_k", "heads", "batch_size", "epochs", "patience"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name}: expected a positive int, got {v!r}")
        if isinstance(self.num_triples, bool) or not isinstance(self.num_triples, int) or self.num_triples < 0:
            raise ValueError(f"num_triples: expected an int >= 0, got {self.num_triples!r}")
        if not 0.0 <= float(self.lam) <= 1.0:
            raise ValueError(f"lam: expected a value in [0, 1], got {self.lam!r}")
        if not self.lr > 0:
            raise ValueError(f"lr: expected > 0, got {self.lr!r}")
        if not 0.0 <= float(self.dropout) < 1.0:
            raise ValueError(f"dropout: expected a value in [0, 1), got {self.dropout!r}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "PredictorConfig":
        unknown = set(d) - {f.name for f in fields(cls)}
        if unknown:
            raise ValueError(f"config: unknown predictor settings {sorted(unknown)}")
        return cls(**d)


@functools.lru_cache(maxsize=None)
def _predictor_class() -> Any:
    torch = _torch()
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
        torch = _torch()
        return {"t": torch.from_numpy(self.t[idx]), "G": torch.from_numpy(self.G[idx]),
                "v": torch.from_numpy(self.v[idx]), "G_mask": torch.from_numpy(self.G_ids[idx] >= 0),
                "choice_mask": torch.from_numpy(self.choice_mask[idx])}

    def save(self, path: str | os.PathLike[str]) -> None:
        np.savez(path, **asdict(self))

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> "QuestionFeatures":
        z = np.load(path)
        return cls(**{f.name: z[f.name] for f in fields(cls)})


def accuracy(model: Any, feats: QuestionFeatures, batch_size: int = 256) -> float:
    """Share of questions with a known answer that the predictor gets right."""
    torch = _torch()
    model.eval()
    known = np.nonzero(feats.answers >= 0)[0]
    if not len(known):
        return float("nan")
    right = 0
    with torch.no_grad():
        for s in range(0, len(known), batch_size):
            idx = known[s:s + batch_size]
            p = model(**feats.tensors(idx))
            right += int((p.argmax(-1).numpy() == feats.answers[idx]).sum())
    return right / len(known)


def train_predictor(model: Any, train: QuestionFeatures, config: PredictorConfig, *,
                    dev: QuestionFeatures | None = None, checkpoint: str | os.PathLike[str] | None = None,
                    progress: bool = False, on_epoch: Callable[[dict], None] | None = None) -> list[dict]:
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
        Training state (rewritten every epoch; resumed when present).
    progress : bool
    on_epoch : callable(record), optional

    Returns
    -------
    history : list of {"epoch", "loss", "first_loss", "dev_acc"} per epoch
    """
    torch = _torch()
    if (train.answers < 0).any():
        raise ValueError("train: every training question needs an answer")
    opt = torch.optim.RAdam(model.parameters(), lr=config.lr, weight_decay=config.weight_decay)
    ck = Path(checkpoint) if checkpoint is not None else None
    epoch, history, best, best_state, stale = 0, [], -1.0, None, 0
    if ck is not None and ck.is_file():
        st = torch.load(ck, map_location="cpu", weights_only=False)
        if st.get("config") != config.to_dict():
            raise ValueError(f"checkpoint: {ck} was written with other settings; remove it ({st.get('config')})")
        model.load_state_dict(st["model"])
        opt.load_state_dict(st["optim"])
        torch.set_rng_state(st["torch_rng"])
        epoch, history, best, best_state, stale = st["epoch"], st["history"], st["best"], st["best_state"], st["stale"]
        logger.info("predictor: resumed from %s after epoch %d", ck, epoch)
    else:
        model.set_feature_stats(**train.tensors(slice(None)))
    torch.manual_seed(config.seed + epoch)
    n = len(train)
    bs = min(config.batch_size, n)
    while epoch < config.epochs and stale < config.patience:
        model.train()
        order = np.random.default_rng([config.seed, epoch]).permutation(n)
        losses = []
        it = range(0, n, bs)
        if progress:
            from tqdm.auto import tqdm

            it = tqdm(it, desc=f"train epoch {epoch + 1}/{config.epochs}", unit="batch")
        for s in it:
            idx = order[s:s + bs]
            p = model(**train.tensors(idx))
            loss = torch.nn.functional.cross_entropy(p, torch.from_numpy(train.answers[idx]))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            losses.append(float(loss.detach()))
        epoch += 1
        rec = {"epoch": epoch, "loss": float(np.mean(losses)), "first_loss": losses[0],
               "dev_acc": accuracy(model, dev) if dev is not None else None}
        history.append(rec)
        score = rec["dev_acc"] if rec["dev_acc"] is not None else -rec["loss"]
        if score > best:
            best, stale = score, 0
            best_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
        else:
            stale += 1
        if ck is not None:
            ck.parent.mkdir(parents=True, exist_ok=True)
            tmp = ck.with_name(ck.name + ".tmp")
            torch.save({"config": config.to_dict(), "model": model.state_dict(), "optim": opt.state_dict(),
                        "torch_rng": torch.get_rng_state(), "epoch": epoch, "history": history, "best": best,
                        "best_state": best_state, "stale": stale}, tmp)
            os.replace(tmp, ck)
        logger.info("predictor: epoch %d loss %.4f dev acc %s", epoch, rec["loss"], rec["dev_acc"])
        if on_epoch is not None:
            on_epoch(rec)
    if best_state is not None:
        model.load_state_dict(best_state)
    model.eval()
    return history
