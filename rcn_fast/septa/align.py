"""Graph-text alignment (SEPTA eqs. 3-8) and subgraph vectors (eq. 9).

The text encoder is frozen, so its embeddings of the textualised subgraphs
(``h~``) are computed once; only the graph encoder and the two projections
train, with a symmetric InfoNCE loss over in-batch negatives.
"""

from __future__ import annotations

import logging
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Callable

import numpy as np

from rcn_fast._validate import Settings, is_int
from rcn_fast.septa.checkpoint import load_checkpoint, save_checkpoint
from rcn_fast.septa.gnn import GNNConfig, SubgraphEncoder, SubgraphTable, torch_module

logger = logging.getLogger("rcn_fast.septa")


@dataclass
class AlignConfig(Settings):
    """Alignment training settings.

    Attributes
    ----------
    dim : int
        Width of the aligned space (paper: 1024).
    temperature : float
        InfoNCE temperature ``tau``.
    lr : float
        AdamW learning rate (paper: 1e-3).
    weight_decay : float
    batch_size : int
        Pairs per step; the other pairs of the batch are the negatives.
    epochs : int
    max_steps : int or None
        Stop after this many steps in total (None: ``epochs`` full passes).
    checkpoint_every : int
        Steps between checkpoints (one is also written at the end).
    seed : int
        Initialisation and data order.
    """

    settings_name: ClassVar[str] = "alignment"

    dim: int = 256
    temperature: float = 0.07
    lr: float = 1e-3
    weight_decay: float = 0.01
    batch_size: int = 64
    epochs: int = 3
    max_steps: int | None = None
    checkpoint_every: int = 200
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("dim", "batch_size", "epochs", "checkpoint_every"):
            v = getattr(self, name)
            if not is_int(v) or v < 1:
                raise ValueError(f"{name}: expected a positive int, got {v!r}")
        if self.batch_size < 2:
            raise ValueError(f"batch_size: in-batch negatives need at least 2 pairs, got {self.batch_size}")
        if self.max_steps is not None and (not isinstance(self.max_steps, int) or self.max_steps < 1):
            raise ValueError(f"max_steps: expected a positive int or None, got {self.max_steps!r}")
        if not self.temperature > 0:
            raise ValueError(f"temperature: expected > 0, got {self.temperature!r}")
        if not self.lr > 0:
            raise ValueError(f"lr: expected > 0, got {self.lr!r}")


def info_nce(e: Any, h: Any, temperature: float) -> tuple[Any, Any, Any]:
    """Symmetric InfoNCE over in-batch negatives (eqs. 5-8).

    Parameters
    ----------
    e, h : float tensors [N, d]
        Graph and text embeddings of N matching pairs (row i with row i).
    temperature : float

    Returns
    -------
    (loss, loss_g2t, loss_t2g) : scalar tensors; loss = (g2t + t2g) / 2
    """
    torch = torch_module()
    F = torch.nn.functional
    if e.shape != h.shape or e.dim() != 2:
        raise ValueError(f"e, h: expected equal [N, d] shapes, got {tuple(e.shape)} and {tuple(h.shape)}")
    sim = F.normalize(e, dim=-1) @ F.normalize(h, dim=-1).T / temperature  # cosine (eq. 6)
    target = torch.arange(e.shape[0], device=e.device)
    g2t = F.cross_entropy(sim, target)
    t2g = F.cross_entropy(sim.T, target)
    return (g2t + t2g) / 2, g2t, t2g


def subgraph_vectors(e: Any, h: Any) -> Any:
    """Eq. 9: ``g = (||h|| / ||e|| * e + h) / 2`` row by row.

    Parameters
    ----------
    e, h : float arrays or tensors [S, d] (numpy in -> numpy out)

    Returns
    -------
    g : same type, [S, d]
    """
    if isinstance(e, np.ndarray):
        ne = np.linalg.norm(e, axis=-1, keepdims=True)
        nh = np.linalg.norm(h, axis=-1, keepdims=True)
        return (nh / np.where(ne > 0, ne, 1.0) * e + h) / 2
    ne = e.norm(dim=-1, keepdim=True)
    nh = h.norm(dim=-1, keepdim=True)
    return (nh / ne.clamp_min(1e-12) * e + h) / 2


def recall_at_k(e: np.ndarray, h: np.ndarray, k: int = 1) -> float:
    """Graph-to-text recall@k: share of rows i whose text i is among the k
    texts most cosine-similar to graph i (ties count against)."""
    en = e / np.maximum(np.linalg.norm(e, axis=1, keepdims=True), 1e-12)
    hn = h / np.maximum(np.linalg.norm(h, axis=1, keepdims=True), 1e-12)
    sim = en @ hn.T
    own = np.diag(sim)
    rank = (sim > own[:, None]).sum(1) + ((sim == own[:, None]).sum(1) - 1)
    return float((rank < k).mean())


class AlignModel:
    """Graph encoder + text projection (``torch.nn.Module`` inside ``.module``).

    Parameters
    ----------
    gnn : GNNConfig
    text_dim : int
        Width of the frozen text encoder's embeddings.
    dim : int
        Width of the aligned space.
    num_relations, num_nodes : int
        Of the knowledge graph.
    node_features : float array [num_nodes, text_dim] or None
        Frozen text embeddings of the node names (``gnn.node_features="text"``).
    """

    def __init__(self, gnn: GNNConfig, text_dim: int, dim: int, num_relations: int, num_nodes: int,
                 node_features: np.ndarray | None = None, seed: int = 0) -> None:
        torch = torch_module()
        if gnn.node_features == "text":
            if node_features is None:
                raise ValueError("node_features: gnn.node_features='text' needs the node name embeddings")
            if node_features.shape != (num_nodes, text_dim):
                raise ValueError(f"node_features: expected shape ({num_nodes}, {text_dim}), got "
                                 f"{node_features.shape}")
        self.gnn_config, self.text_dim, self.dim = gnn, int(text_dim), int(dim)
        self.num_relations, self.num_nodes = int(num_relations), int(num_nodes)
        self.node_features = node_features
        torch.manual_seed(seed)
        self.module = torch.nn.ModuleDict({
            "graph": SubgraphEncoder(gnn, text_dim, dim, num_relations, num_nodes),
            "text": torch.nn.Linear(text_dim, dim),
        })

    def spec(self) -> dict[str, Any]:
        return {"gnn": self.gnn_config.to_dict(), "text_dim": self.text_dim, "dim": self.dim,
                "num_relations": self.num_relations, "num_nodes": self.num_nodes}

    def graph_embed(self, batch: dict) -> Any:
        """``e`` [B, dim] for a batch from :meth:`SubgraphTable.batch`."""
        torch = torch_module()
        feats = None
        if self.node_features is not None and self.gnn_config.node_features == "text":
            nodes = batch["nodes"].numpy()
            feats = torch.from_numpy(np.asarray(self.node_features[nodes.ravel()], dtype=np.float32)
                                     .reshape(*nodes.shape, -1))
        return self.module["graph"](batch, feats)

    def text_embed(self, text_emb: Any) -> Any:
        """``h = W_T h~ + b_T`` for frozen encoder embeddings [B, text_dim]."""
        torch = torch_module()
        if isinstance(text_emb, np.ndarray):
            text_emb = torch.from_numpy(np.asarray(text_emb, dtype=np.float32))
        return self.module["text"](text_emb)

    def embed_all(self, table: SubgraphTable, text_emb: np.ndarray, batch_size: int = 256,
                  progress: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """``(e, h)`` float32 [S, dim] for every subgraph of ``table`` (eval mode)."""
        torch = torch_module()
        self.module.eval()
        es, hs = [], []
        it = range(0, len(table), batch_size)
        if progress:
            from tqdm.auto import tqdm

            it = tqdm(it, desc="embed subgraphs", unit="batch")
        with torch.no_grad():
            for s in it:
                idx = np.arange(s, min(s + batch_size, len(table)))
                es.append(self.graph_embed(table.batch(idx)).numpy())
                hs.append(self.text_embed(text_emb[idx]).numpy())
        z = np.zeros((0, self.dim), dtype=np.float32)
        return (np.concatenate(es) if es else z), (np.concatenate(hs) if hs else z)

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the spec and weights to ``path`` (a safetensors checkpoint,
        :func:`rcn_fast.septa.checkpoint.save_checkpoint`)."""
        save_checkpoint(path, {"spec": self.spec(), "state": self.module.state_dict()})

    @classmethod
    def load(cls, path: str | os.PathLike[str], node_features: np.ndarray | None = None) -> "AlignModel":
        """The model :meth:`save` wrote (a pickle ``.pt`` of an older
        rcn_fast is refused with how to convert it)."""
        ck = load_checkpoint(path)
        sp = ck["spec"]
        m = cls(GNNConfig.from_dict(sp["gnn"]), sp["text_dim"], sp["dim"], sp["num_relations"], sp["num_nodes"],
                node_features)
        m.module.load_state_dict(ck["state"])
        m.module.eval()
        return m


def train_alignment(model: AlignModel, table: SubgraphTable, text_emb: np.ndarray, config: AlignConfig, *,
                    checkpoint: str | os.PathLike[str] | None = None, progress: bool = False,
                    on_step: Callable[[int, float], None] | None = None) -> list[dict[str, float]]:
    """Train the graph encoder and projections with symmetric InfoNCE.

    Parameters
    ----------
    model : AlignModel
    table : SubgraphTable
        The training subgraphs.
    text_emb : float array [S, text_dim]
        Frozen encoder embeddings of the subgraphs' texts (row i = subgraph i).
    config : AlignConfig
    checkpoint : path, optional
        Training state file (safetensors, see
        :mod:`rcn_fast.septa.checkpoint`). If it exists, training resumes from it (same
        data order, so an interrupted run ends where an uninterrupted one
        would); it is rewritten every ``checkpoint_every`` steps and at the end.
    progress : bool
        tqdm bar.
    on_step : callable(step, loss), optional
        Called after every step (and after any checkpoint of that step).

    Returns
    -------
    history : list of {"step", "epoch", "loss", "g2t", "t2g"} per step
    """
    torch = torch_module()
    S = len(table)
    if text_emb.shape[0] != S:
        raise ValueError(f"text_emb: expected {S} rows (one per subgraph), got {text_emb.shape[0]}")
    if S < 2:
        raise ValueError(f"table: need at least 2 subgraphs, got {S}")
    bs = min(config.batch_size, S)
    per_epoch = S // bs  # drop the ragged last batch: every step has bs - 1 negatives
    total = config.epochs * per_epoch if config.max_steps is None else config.max_steps
    opt = torch.optim.AdamW(model.module.parameters(), lr=config.lr, weight_decay=config.weight_decay)
    step, history = 0, []
    ck = Path(checkpoint) if checkpoint is not None else None
    if ck is not None and ck.is_file():
        state = load_checkpoint(ck)
        if state.get("config") != config.to_dict() or state.get("spec") != model.spec():
            raise ValueError(f"checkpoint: {ck} was written with other settings; remove it or use its settings "
                             f"({state.get('config')})")
        model.module.load_state_dict(state["model"])
        opt.load_state_dict(state["optim"])
        torch.set_rng_state(state["torch_rng"])
        step, history = int(state["step"]), list(state["history"])
        logger.info("alignment: resumed from %s at step %d of %d", ck, step, total)

    def save_state() -> None:
        if ck is None:
            return
        ck.parent.mkdir(parents=True, exist_ok=True)
        save_checkpoint(ck, {"config": config.to_dict(), "spec": model.spec(), "model": model.module.state_dict(),
                             "optim": opt.state_dict(), "torch_rng": torch.get_rng_state(), "step": step,
                             "history": history})

    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=total, initial=step, desc="align", unit="step")
    model.module.train()
    while step < total:
        epoch, within = divmod(step, per_epoch)
        order = np.random.default_rng([config.seed, epoch]).permutation(S)
        idx = order[within * bs:(within + 1) * bs]
        batch = table.batch(idx)
        e = model.graph_embed(batch)
        h = model.text_embed(text_emb[idx])
        loss, g2t, t2g = info_nce(e, h, config.temperature)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        step += 1
        rec = {"step": step, "epoch": epoch, "loss": float(loss.detach()), "g2t": float(g2t.detach()),
               "t2g": float(t2g.detach())}
        history.append(rec)
        if bar is not None:
            bar.update(1)
            bar.set_postfix(loss=f"{rec['loss']:.3f}")
        if step % config.checkpoint_every == 0 or step == total:
            save_state()
        if on_step is not None:
            on_step(step, rec["loss"])
    if bar is not None:
        bar.close()
    model.module.eval()
    if math.isnan(history[-1]["loss"] if history else 0.0):
        raise FloatingPointError("alignment: the loss became NaN; lower lr")
    return history
