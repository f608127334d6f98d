"""A BERT encoder in plain PyTorch, loaded from the folder's safetensors:
what the torch encoder runs for BERT models (E5, BGE, GTE, MiniLM...)
instead of transformers' ``BertModel``.

Why: importing transformers' modelling code imports its model registry,
torch.distributed's FSDP and tensor parallelism, torch._dynamo and scipy,
seconds before the first batch; this module imports torch and safetensors
only. Its padded forward runs the same operations as transformers'
``BertModel`` with SDPA attention in the same order (embeddings summed,
LayerNorm; per layer the query, key and value projections, SDPA with the
padding mask -- none when no row is padded, as transformers does --, the
output projection, residual and LayerNorm, the feed-forward), so on the
CPU its float32 output equals ``BertModel``'s to the bit (tested), and a
store built with it has the same bytes. Unlike ``BertModel`` it never reads
a device value (transformers checks ``mask.all()`` on every batch, a host
wait on a GPU): the caller says whether a batch has padding.

The packed forward runs the tokens of a batch back to back (no padding
computed) with a variable-length attention kernel
(:mod:`~rcn_fast.retrieval.encoders.unpadded`).

Supported (:func:`bert_unsupported` says why not otherwise): ``model_type``
``"bert"``, absolute positions, not a decoder, activation ``gelu`` or
``relu``, weights in safetensors. Other folders run transformers' model
class (:func:`~rcn_fast.retrieval.encoders.torch.load_hf_model`).
"""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import Any, Callable

from rcn_fast._arrays import require
from rcn_fast.retrieval.encoders.base import TORCH_HINT
from rcn_fast.retrieval.encoders.loading import ModelConfig, load_weights, weight_files

#: ``hidden_act`` values run here, as transformers' ACT2FN runs them
ACTIVATIONS = ("gelu", "relu")
# checkpoint names transformers renames when loading ("legacy" conversions)
_LEGACY = (("LayerNorm.gamma", "LayerNorm.weight"), ("LayerNorm.beta", "LayerNorm.bias"))


def bert_unsupported(config: ModelConfig, model_dir: str | os.PathLike[str] | None = None) -> str | None:
    """None when :class:`NativeBert` runs this model, else why not."""
    if config.model_type != "bert":
        return f"model_type {config.model_type!r} (only 'bert' is supported)"
    if config.get("is_decoder") or config.get("add_cross_attention"):
        return "a decoder BERT"
    pos = config.get("position_embedding_type", "absolute")
    if pos not in (None, "absolute"):
        return f"position_embedding_type {pos!r} (only 'absolute')"
    act = config.get("hidden_act", "gelu")
    if act not in ACTIVATIONS:
        return f"hidden_act {act!r} (only {', '.join(ACTIVATIONS)})"
    if config.hidden_size % config.num_attention_heads:
        return f"hidden_size {config.hidden_size} is not a multiple of {config.num_attention_heads} heads"
    for key in ("vocab_size",):
        v = config.get(key)
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            return f"config {key}={v!r}"
    if config.max_position_embeddings is None:
        return "config.json has no max_position_embeddings"
    if model_dir is not None and weight_files(model_dir) is None:
        return "no safetensors weights (model.safetensors)"
    return None


@functools.lru_cache(maxsize=None)
def _classes() -> Any:
    torch = require("torch", TORCH_HINT)
    nn = torch.nn
    F = nn.functional

    def node(**children: Any) -> Any:
        m = nn.Module()
        for name, child in children.items():
            m.add_module(name, child)
        return m

    def layer(c: ModelConfig, eps: float) -> Any:
        H, I = c.hidden_size, c.intermediate_size
        return node(
            attention=node(self=node(query=nn.Linear(H, H), key=nn.Linear(H, H), value=nn.Linear(H, H)),
                           output=node(dense=nn.Linear(H, H), LayerNorm=nn.LayerNorm(H, eps=eps))),
            intermediate=node(dense=nn.Linear(H, I)),
            output=node(dense=nn.Linear(I, H), LayerNorm=nn.LayerNorm(H, eps=eps)))

    class NativeBert(nn.Module):
        """transformers' ``BertModel`` without its pooler: the same
        parameter names, so its checkpoints load as they are."""

        def __init__(self, config: ModelConfig) -> None:
            super().__init__()
            c = config
            eps = float(c.get("layer_norm_eps", 1e-12))
            H = c.hidden_size
            self.config = c
            self.heads = c.num_attention_heads
            self.head_dim = H // self.heads
            self.scale = self.head_dim ** -0.5
            self.act = F.gelu if c.get("hidden_act", "gelu") == "gelu" else F.relu
            def embedding(n: int) -> Any:  # no random init: it is overwritten (and on meta it imports torch._dynamo)
                return nn.Embedding(n, H, _weight=torch.empty(n, H))

            self.embeddings = node(
                word_embeddings=embedding(int(c.get("vocab_size"))),
                position_embeddings=embedding(int(c.max_position_embeddings)),
                token_type_embeddings=embedding(int(c.get("type_vocab_size", 2))),
                LayerNorm=nn.LayerNorm(H, eps=eps))
            self.encoder = node(layer=nn.ModuleList(layer(c, eps) for _ in range(c.num_hidden_layers)))

        def embed(self, input_ids: Any, position_ids: Any, token_type_ids: Any = None) -> Any:
            e = self.embeddings
            h = e.word_embeddings(input_ids)
            # type 0 for every token unless given: the same sum as transformers' zeros buffer
            h = h + (e.token_type_embeddings(token_type_ids) if token_type_ids is not None
                     else e.token_type_embeddings.weight[0])
            h = h + e.position_embeddings(position_ids)
            return e.LayerNorm(h)

        def block(self, lay: Any, h: Any, attend: Callable[[Any, Any, Any], Any], split: Callable[[Any], Any],
                  merge: Callable[[Any], Any]) -> Any:
            sa = lay.attention.self
            a = attend(split(sa.query(h)), split(sa.key(h)), split(sa.value(h)))
            h = lay.attention.output.LayerNorm(lay.attention.output.dense(merge(a)) + h)
            return lay.output.LayerNorm(lay.output.dense(self.act(lay.intermediate.dense(h))) + h)

        def forward(self, input_ids: Any, attention_mask: Any, token_type_ids: Any = None, *,
                    padded: bool | None = None) -> Any:
            """Last hidden states [b, L, hidden] of right-padded rows.

            ``padded``: whether any row has padding (None: read from the
            mask, a host wait on a GPU); no mask is applied when none has,
            as transformers does.
            """
            b, L = input_ids.shape
            pos = torch.arange(L, device=input_ids.device)[None, :]
            h = self.embed(input_ids, pos, token_type_ids)
            if padded is None:
                padded = not bool(attention_mask.all())
            mask = attention_mask.bool()[:, None, None, :].expand(b, 1, L, L) if padded else None

            def attend(q: Any, k: Any, v: Any) -> Any:
                return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=0.0, scale=self.scale,
                                                      is_causal=False)

            def split(x: Any) -> Any:
                return x.view(b, L, -1, self.head_dim).transpose(1, 2)

            def merge(a: Any) -> Any:
                return a.transpose(1, 2).contiguous().reshape(b, L, -1).contiguous()

            for lay in self.encoder.layer:
                h = self.block(lay, h, attend, split, merge)
            return h

        def packed(self, input_ids: Any, position_ids: Any, attention: Callable[[Any, Any, Any], Any]) -> Any:
            """Last hidden states [T, hidden] of texts packed back to back.

            ``attention(q, k, v)``: q, k, v [T, heads, head_dim] ->
            [T, heads, head_dim], each text attending to itself only.
            """
            T = input_ids.shape[0]
            h = self.embed(input_ids, position_ids)
            for lay in self.encoder.layer:
                h = self.block(lay, h, attention, lambda x: x.view(T, self.heads, self.head_dim),
                               lambda a: a.reshape(T, -1))
            return h

    return NativeBert


def checkpoint_state(weights: dict[str, Any]) -> dict[str, Any]:
    """A checkpoint's tensors under :class:`NativeBert`'s names: the
    ``bert.`` prefix of task models dropped, legacy LayerNorm names
    renamed (as transformers loads them); other tensors (pooler, heads,
    buffers) are left out by the caller."""
    out = {}
    for name, t in weights.items():
        name = name.removeprefix("bert.")
        for old, new in _LEGACY:
            if name.endswith(old):
                name = name[: -len(old)] + new
        out[name] = t
    return out


def load_native_bert(model_dir: str | os.PathLike[str], config: ModelConfig, *, device: Any = "cpu",
                     dtype: Any = None) -> Any:
    """:class:`NativeBert` with the folder's weights, in eval mode, on
    ``device`` in ``dtype`` (None: the checkpoint's).

    Raises
    ------
    ValueError
        The model is not supported (:func:`bert_unsupported`), or its
        checkpoint lacks a weight or holds one of another shape (named).
    """
    torch = require("torch", TORCH_HINT)
    why = bert_unsupported(config, model_dir)
    if why is not None:
        raise ValueError(f"model: {model_dir} cannot run as a native BERT: {why}")
    files = weight_files(model_dir) or []
    with torch.device("meta"):
        model = _classes()(config)
    state = checkpoint_state(load_weights(files))
    want = model.state_dict()
    missing = sorted(set(want) - set(state))
    if missing:
        raise ValueError(f"model: the weights in {Path(model_dir)} lack {missing[:5]}"
                         + (f" and {len(missing) - 5} more" if len(missing) > 5 else ""))
    bad = [n for n in want if tuple(state[n].shape) != tuple(want[n].shape)]
    if bad:
        raise ValueError(f"model: weight {bad[0]} in {Path(model_dir)} has shape {tuple(state[bad[0]].shape)}, "
                         f"config.json implies {tuple(want[bad[0]].shape)}")
    model.load_state_dict({n: state[n] for n in want}, assign=True)
    return model.to(device=device, dtype=dtype).eval()


__all__ = ["ACTIVATIONS", "bert_unsupported", "checkpoint_state", "load_native_bert"]
