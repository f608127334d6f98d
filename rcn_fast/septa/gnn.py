"""The graph encoder of SEPTA in plain PyTorch: GraphGPS-style layers over a
batch of subgraphs of different sizes (padding masks), mean pooling and a
linear projection (eqs. 3-4, graph side).

A layer runs, in parallel, local message passing along the subgraph's
edges (GINE-style: neighbour state + relation embedding, summed, then an
MLP; each edge carries messages both ways, the reverse direction with its
own relation embedding) and multi-head self-attention over all nodes of the
same subgraph; the two are added and followed by a feed-forward block.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, ClassVar, Sequence

import numpy as np

from rcn_fast._validate import Settings, is_int
from rcn_fast._arrays import require

TORCH_HINT = 'pip install "rcn_fast[septa]"  (torch, numba)'


def torch_module() -> Any:
    """The torch module (ImportError with the install hint when missing)."""
    return require("torch", TORCH_HINT)


@dataclass
class GNNConfig(Settings):
    """Graph encoder settings.

    Attributes
    ----------
    hidden : int
        Width of the node states (paper: 1024).
    layers : int
        GraphGPS layers (paper: 2).
    heads : int
        Attention heads of the global attention (``hidden % heads == 0``).
    dropout : float
    node_features : {"text", "learned"}
        ``"text"``: each node starts from the frozen text encoder's
        embedding of its name (so unseen nodes and graphs work);
        ``"learned"``: a trainable embedding table over the graph's nodes.
    """

    settings_name: ClassVar[str] = "GNN"

    hidden: int = 256
    layers: int = 2
    heads: int = 4
    dropout: float = 0.1
    node_features: str = "text"

    def __post_init__(self) -> None:
        for name in ("hidden", "layers", "heads"):
            v = getattr(self, name)
            if not is_int(v) or v < 1:
                raise ValueError(f"{name}: expected a positive int, got {v!r}")
        if self.hidden % self.heads:
            raise ValueError(f"heads: hidden={self.hidden} must be divisible by heads={self.heads}")
        if not 0.0 <= float(self.dropout) < 1.0:
            raise ValueError(f"dropout: expected a value in [0, 1), got {self.dropout!r}")
        if self.node_features not in ("text", "learned"):
            raise ValueError(f"node_features: expected 'text' or 'learned', got {self.node_features!r}")


# ------------------------------------------------------------------ batching
@dataclass
class SubgraphTable:
    """Subgraphs in local numbering, ready to batch (built once).

    Attributes
    ----------
    node_ptr : int64 [S + 1]; nodes : int64 [sum n_i] (graph node ids)
    edge_ptr : int64 [S + 1]; src, dst, rel : int64 [sum e_i]
        Local endpoints (positions inside the subgraph) and relation ids.
    """

    node_ptr: np.ndarray
    nodes: np.ndarray
    edge_ptr: np.ndarray
    src: np.ndarray
    dst: np.ndarray
    rel: np.ndarray

    def __len__(self) -> int:
        return int(self.node_ptr.shape[0] - 1)

    @classmethod
    def from_subgraphs(cls, sg: Any, graph: Any) -> "SubgraphTable":
        """Vectorised conversion of :class:`rcn_fast.kg.Subgraphs` to local numbering."""
        S = len(sg)
        N = graph.num_nodes
        sizes, esizes = np.diff(sg.node_ptr), np.diff(sg.edge_ptr)
        seg = np.repeat(np.arange(S, dtype=np.int64), sizes)
        pos = np.arange(len(sg.nodes), dtype=np.int64) - sg.node_ptr[seg]
        keys = seg * N + sg.nodes
        order = np.argsort(keys, kind="stable")
        skeys = keys[order]
        eseg = np.repeat(np.arange(S, dtype=np.int64), esizes)

        def local(ids: np.ndarray) -> np.ndarray:
            k = eseg * N + ids.astype(np.int64)
            j = np.searchsorted(skeys, k)
            if len(k) and (j.max() >= len(skeys) or not np.array_equal(skeys[j], k)):
                raise ValueError("sg: an edge endpoint is not a node of its subgraph")
            return pos[order[j]]

        return cls(sg.node_ptr.astype(np.int64), sg.nodes.astype(np.int64), sg.edge_ptr.astype(np.int64),
                   local(graph.heads[sg.edges]), local(graph.tails[sg.edges]),
                   graph.relations[sg.edges].astype(np.int64))

    def batch(self, idx: Sequence[int] | np.ndarray) -> dict[str, Any]:
        """Padded tensors for subgraphs ``idx``.

        Returns
        -------
        dict with ``nodes`` int64 [B, L] (graph ids, 0 where padded),
        ``mask`` bool [B, L], ``src``/``dst``/``rel`` int64 [M] (flat
        positions ``b * L + local``).
        """
        torch = torch_module()
        idx = np.asarray(idx, dtype=np.int64)
        sizes = self.node_ptr[idx + 1] - self.node_ptr[idx]
        L = int(sizes.max()) if len(idx) else 1
        B = len(idx)
        nodes = np.zeros((B, L), dtype=np.int64)
        mask = np.zeros((B, L), dtype=bool)
        srcs, dsts, rels = [], [], []
        for b, i in enumerate(idx):
            n0, n1 = self.node_ptr[i], self.node_ptr[i + 1]
            nodes[b, : n1 - n0] = self.nodes[n0:n1]
            mask[b, : n1 - n0] = True
            e0, e1 = self.edge_ptr[i], self.edge_ptr[i + 1]
            srcs.append(self.src[e0:e1] + b * L)
            dsts.append(self.dst[e0:e1] + b * L)
            rels.append(self.rel[e0:e1])
        cat = (lambda xs: torch.from_numpy(np.concatenate(xs)) if xs else torch.zeros(0, dtype=torch.int64))
        return {"nodes": torch.from_numpy(nodes), "mask": torch.from_numpy(mask), "src": cat(srcs),
                "dst": cat(dsts), "rel": cat(rels)}


# ------------------------------------------------------------------ modules
@functools.lru_cache(maxsize=None)
def _modules() -> Any:
    torch = torch_module()
    nn = torch.nn

    class GPSLayer(nn.Module):
        """Local message passing + global attention + feed-forward (one GraphGPS layer)."""

        def __init__(self, dim: int, heads: int, num_relations: int, dropout: float) -> None:
            super().__init__()
            self.rel = nn.Embedding(2 * max(num_relations, 1), dim)
            self.eps = nn.Parameter(torch.zeros(1))
            self.local_mlp = nn.Sequential(nn.Linear(dim, dim), nn.GELU(), nn.Linear(dim, dim))
            self.attn = nn.MultiheadAttention(dim, heads, dropout=dropout, batch_first=True)
            self.norm_local = nn.LayerNorm(dim)
            self.norm_attn = nn.LayerNorm(dim)
            self.norm_ffn = nn.LayerNorm(dim)
            self.ffn = nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Dropout(dropout), nn.Linear(2 * dim, dim))
            self.drop = nn.Dropout(dropout)
            self.num_relations = max(num_relations, 1)

        def forward(self, x, mask, src, dst, rel):  # x [B, L, D]
            B, L, D = x.shape
            flat = x.reshape(B * L, D)
            # both directions: src -> dst with rel, dst -> src with rel + R
            s = torch.cat([src, dst])
            t = torch.cat([dst, src])
            r = torch.cat([rel, rel + self.num_relations])
            msg = torch.relu(flat[s] + self.rel(r))
            agg = torch.zeros_like(flat).index_add_(0, t, msg)
            local = self.local_mlp((1 + self.eps) * flat + agg).view(B, L, D)
            local = self.norm_local(x + self.drop(local))
            glob, _ = self.attn(x, x, x, key_padding_mask=~mask, need_weights=False)
            glob = self.norm_attn(x + self.drop(glob))
            h = local + glob
            h = self.norm_ffn(h + self.ffn(h))
            return h * mask.unsqueeze(-1).to(h.dtype)

    class SubgraphEncoder(nn.Module):
        """Node features -> GPS layers -> masked mean pooling -> projection.

        Parameters
        ----------
        config : GNNConfig
        in_dim : int
            Width of the text node features (``node_features="text"``).
        out_dim : int
            Width of the aligned space (eq. 4).
        num_relations : int
        num_nodes : int
            Size of the learned table (``node_features="learned"``).
        """

        def __init__(self, config: GNNConfig, in_dim: int, out_dim: int, num_relations: int,
                     num_nodes: int = 0) -> None:
            super().__init__()
            self.config = config
            if config.node_features == "learned":
                if num_nodes < 1:
                    raise ValueError("num_nodes: a learned node table needs num_nodes >= 1")
                self.table = nn.Embedding(num_nodes, config.hidden)
                self.inp = None
            else:
                self.table = None
                self.inp = nn.Linear(in_dim, config.hidden)
            self.layers = nn.ModuleList(GPSLayer(config.hidden, config.heads, num_relations, config.dropout)
                                        for _ in range(config.layers))
            self.proj = nn.Linear(config.hidden, out_dim)

        def forward(self, batch: dict, node_features=None):
            """Graph embeddings ``e`` [B, out_dim] (eq. 3 mean pooling, eq. 4 projection).

            ``node_features``: float [B, L, in_dim] (text features) or None (learned table).
            """
            mask = batch["mask"]
            if self.table is not None:
                x = self.table(batch["nodes"])
            else:
                if node_features is None:
                    raise ValueError("node_features: this encoder uses text node features; pass [B, L, in_dim]")
                x = self.inp(node_features)
            x = x * mask.unsqueeze(-1).to(x.dtype)
            for layer in self.layers:
                x = layer(x, mask, batch["src"], batch["dst"], batch["rel"])
            m = mask.unsqueeze(-1).to(x.dtype)
            pooled = (x * m).sum(1) / m.sum(1).clamp_min(1.0)
            return self.proj(pooled)

    return GPSLayer, SubgraphEncoder


def GPSLayer(*args: Any, **kwargs: Any) -> Any:
    """A GraphGPS layer (``torch.nn.Module``); see :func:`SubgraphEncoder`."""
    return _modules()[0](*args, **kwargs)


def SubgraphEncoder(*args: Any, **kwargs: Any) -> Any:
    """The SEPTA graph encoder (``torch.nn.Module``): ``(config, in_dim,
    out_dim, num_relations, num_nodes=0)``; ``forward(batch, node_features)``
    -> float [B, out_dim]."""
    return _modules()[1](*args, **kwargs)
