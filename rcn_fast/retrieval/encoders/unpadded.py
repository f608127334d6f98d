"""Unpadded (packed) forward pass of a BERT encoder: the tokens of a batch
back to back, no padding computed, attention restricted to each text
through variable-length attention.

The kernel is flash-attn's ``flash_attn_varlen_func`` where that package is
installed (CUDA, float16/bfloat16; imported lazily), else
:func:`varlen_attention_reference`, a plain per-text
``scaled_dot_product_attention`` loop (the reference the tests hold the
packed path to, and what runs it on the CPU). The layers are the Hugging
Face model's own modules (its weights, layer norms and activation), run in
the order its ``forward`` runs them; only the attention's input layout
differs (Q, K and V projections are one matrix product over the three
weights stacked).

Supported: ``BertModel`` with absolute position embeddings (E5, BGE, GTE,
MiniLM...), not a decoder; :func:`unpadded_supported` says why not
otherwise.
"""

from __future__ import annotations

from typing import Any, Callable

from rcn_fast._arrays import require
from rcn_fast.retrieval.encoders.base import TORCH_HINT


def flash_varlen() -> Callable[..., Any] | None:
    """flash-attn's ``flash_attn_varlen_func``, or None when flash-attn is
    not installed (or does not import)."""
    try:
        from flash_attn import flash_attn_varlen_func
    except Exception:  # noqa: BLE001 - not installed, or built for another torch/CUDA
        return None
    return flash_attn_varlen_func


def varlen_attention_reference(q: Any, k: Any, v: Any, cu_seqlens_q: Any, cu_seqlens_k: Any, max_seqlen_q: int,
                               max_seqlen_k: int, dropout_p: float = 0.0, softmax_scale: float | None = None,
                               causal: bool = False) -> Any:
    """Variable-length attention, one text at a time (flash-attn's
    ``flash_attn_varlen_func`` signature and layout).

    Parameters
    ----------
    q, k, v : float [T, heads, head_dim]
        The packed tokens of every text.
    cu_seqlens_q, cu_seqlens_k : int32 [b + 1]
        Text ``j`` holds tokens ``[cu[j], cu[j + 1])`` (the same for q and k).
    max_seqlen_q, max_seqlen_k : int
        Unused (flash-attn sizes its grid with them).
    softmax_scale : float or None
        None: ``head_dim ** -0.5``.

    Returns
    -------
    float [T, heads, head_dim]
    """
    torch = require("torch", TORCH_HINT)
    F = torch.nn.functional
    if dropout_p or causal:
        raise ValueError("varlen_attention_reference: dropout and causal masks are not supported")
    out = torch.empty_like(q)
    bounds = cu_seqlens_q.tolist()
    for s, e in zip(bounds[:-1], bounds[1:]):
        if e > s:
            qs, ks, vs = (t[s:e].transpose(0, 1).unsqueeze(0) for t in (q, k, v))  # [1, heads, l, hd]
            out[s:e] = F.scaled_dot_product_attention(qs, ks, vs, scale=softmax_scale)[0].transpose(0, 1)
    return out


def unpadded_supported(model: Any) -> str | None:
    """None when :class:`UnpaddedBert` can run ``model``, else why not."""
    cfg = getattr(model, "config", None)
    kind = getattr(cfg, "model_type", None)
    if kind != "bert":
        return f"model_type {kind!r} (only 'bert' is supported)"
    if getattr(cfg, "is_decoder", False) or getattr(cfg, "add_cross_attention", False):
        return "a decoder BERT"
    if getattr(cfg, "position_embedding_type", "absolute") not in (None, "absolute"):
        return f"position_embedding_type {cfg.position_embedding_type!r} (only 'absolute')"
    needed = ("embeddings.word_embeddings", "embeddings.position_embeddings", "embeddings.LayerNorm", "encoder.layer")
    have = {name for name, _ in model.named_modules()}
    missing = [n for n in needed if n not in have]
    return f"modules {missing} missing" if missing else None


def segment_pool(h: Any, cu_seqlens: Any, pooling: str) -> Any:
    """Pool packed token states per text.

    Parameters
    ----------
    h : float [T, d]
    cu_seqlens : int [b + 1] (on h's device)
    pooling : {"mean", "cls", "max", "lasttoken"}

    Returns
    -------
    float32 [b, d]
    """
    torch = require("torch", TORCH_HINT)
    h = h.float()
    cu = cu_seqlens.long()
    lens = cu[1:] - cu[:-1]
    if pooling == "cls":
        return h[cu[:-1]]
    if pooling == "lasttoken":
        return h[(cu[1:] - 1).clamp(min=0)]
    seg = torch.repeat_interleave(torch.arange(len(lens), device=h.device), lens, output_size=h.shape[0])
    if pooling == "max":
        out = torch.full((len(lens), h.shape[1]), float("-inf"), dtype=h.dtype, device=h.device)
        return out.scatter_reduce_(0, seg.unsqueeze(1).expand_as(h), h, "amax")
    out = torch.zeros((len(lens), h.shape[1]), dtype=h.dtype, device=h.device).index_add_(0, seg, h)
    return out / lens.clamp(min=1).unsqueeze(1).to(h.dtype)


class UnpaddedBert:
    """A Hugging Face ``BertModel`` run on packed tokens.

    Parameters
    ----------
    model : transformers BertModel (eval mode, on its device and dtype)
    attention : callable or None
        A ``flash_attn_varlen_func``-compatible function; None: flash-attn's
        when installed, else :func:`varlen_attention_reference`.
    """

    def __init__(self, model: Any, attention: Callable[..., Any] | None = None) -> None:
        why = unpadded_supported(model)
        if why is not None:
            raise ValueError(f"unpadded: this model cannot run unpadded: {why}")
        torch = require("torch", TORCH_HINT)
        self.model = model
        self.attention = attention or flash_varlen() or varlen_attention_reference
        cfg = model.config
        self.heads = int(cfg.num_attention_heads)
        self.head_dim = int(cfg.hidden_size) // self.heads
        self.scale = self.head_dim ** -0.5
        self.qkv = []
        for layer in model.encoder.layer:
            sa = layer.attention.self
            w = torch.cat([sa.query.weight, sa.key.weight, sa.value.weight], 0).detach()
            b = torch.cat([sa.query.bias, sa.key.bias, sa.value.bias], 0).detach()
            self.qkv.append((w, b))

    def __call__(self, input_ids: Any, position_ids: Any, cu_seqlens: Any, max_seqlen: int) -> Any:
        """Last hidden states of packed texts.

        Parameters
        ----------
        input_ids, position_ids : int64 [T]
        cu_seqlens : int32 [b + 1]
        max_seqlen : int

        Returns
        -------
        [T, hidden] in the model's dtype
        """
        torch = require("torch", TORCH_HINT)
        F = torch.nn.functional
        emb = self.model.embeddings
        h = emb.word_embeddings(input_ids)
        if getattr(emb, "token_type_embeddings", None) is not None:  # every token of type 0
            h = h + emb.token_type_embeddings.weight[0]
        h = emb.LayerNorm(h + emb.position_embeddings(position_ids))
        T = h.shape[0]
        for layer, (w, b) in zip(self.model.encoder.layer, self.qkv):
            q, k, v = F.linear(h, w, b).view(T, 3, self.heads, self.head_dim).unbind(1)
            a = self.attention(q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen, 0.0,
                               softmax_scale=self.scale, causal=False)
            h = layer.attention.output(a.reshape(T, -1), h)
            h = layer.output(layer.intermediate(h), h)
        return h


__all__ = ["UnpaddedBert", "flash_varlen", "segment_pool", "unpadded_supported", "varlen_attention_reference"]
