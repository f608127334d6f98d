"""Attention over packed texts (the tokens of a batch back to back, no
padding computed) for the native BERT's packed forward
(:meth:`NativeBert.packed <rcn_fast.retrieval.encoders.bert>`), and
pooling of packed token states.

The kernels, in the order :func:`choose_kernel` prefers them:

* ``"flash-attn"``: flash-attn's ``flash_attn_varlen_func`` (CUDA,
  float16/bfloat16; imported lazily where installed);
* ``"sdpa-varlen"``: PyTorch's own variable-length flash kernel (CUDA,
  float16/bfloat16, compute capability 8.0 or more, head width a multiple
  of 8 up to 256): the kernel ``scaled_dot_product_attention`` runs for
  jagged nested tensors, called on the packed tensors directly (no
  nested-tensor wrapper: no import of torch._dynamo, no Python dispatch,
  no host wait);
* ``"jagged"``: ``scaled_dot_product_attention`` on jagged nested tensors
  (``torch.nested.nested_tensor_from_jagged``), any device and dtype (on
  CUDA it selects one of the kernels above, or the memory-efficient one
  for float32); the first use imports torch's nested-tensor machinery
  (torch._dynamo, sympy), about a second, so the encoder warms it in a
  background thread when it will use it;
* ``"reference"``: a plain per-text ``scaled_dot_product_attention`` loop
  (reads the text bounds on the host): what the tests hold the others to.

Every kernel takes the lengths' bounds from the host (``max_seqlen``,
``min_seqlen``), computed when the batch was packed, so none reads a
device value.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import warnings
from typing import Any, Callable, Iterator

from rcn_fast._arrays import require
from rcn_fast.retrieval.encoders.base import TORCH_HINT

KERNELS = ("flash-attn", "sdpa-varlen", "jagged", "reference")
#: the schema of torch's variable-length flash kernel this module calls (checked before use)
_SDPA_VARLEN_SCHEMA = ("aten::_flash_attention_forward(Tensor query, Tensor key, Tensor value, Tensor? cum_seq_q, "
                       "Tensor? cum_seq_k, SymInt max_q, SymInt max_k, float dropout_p, bool is_causal, "
                       "bool return_debug_mask, *, float? scale=None")
Attention = Callable[[Any, Any, Any], Any]


def flash_varlen() -> Callable[..., Any] | None:
    """flash-attn's ``flash_attn_varlen_func``, or None when flash-attn is
    not installed (or does not import)."""
    try:
        from flash_attn import flash_attn_varlen_func
    except Exception:  # noqa: BLE001 - not installed, or built for another torch/CUDA
        return None
    return flash_attn_varlen_func


def sdpa_varlen_available(device: Any, dtype: Any, head_dim: int) -> bool:
    """Whether torch's variable-length flash kernel runs here (see the
    module docstring)."""
    torch = require("torch", TORCH_HINT)
    device = torch.device(device)
    if device.type != "cuda" or dtype not in (torch.float16, torch.bfloat16) or head_dim % 8 or head_dim > 256:
        return False
    op = getattr(torch.ops.aten, "_flash_attention_forward", None)
    if op is None or not str(op.default._schema).startswith(_SDPA_VARLEN_SCHEMA):
        return False
    return torch.cuda.get_device_capability(device) >= (8, 0) and torch.backends.cuda.flash_sdp_enabled()


def choose_kernel(device: Any, dtype: Any, head_dim: int) -> str:
    """The packed-attention kernel for a device and dtype: flash-attn's
    where installed (CUDA, half precision), else torch's variable-length
    flash kernel where it runs, else SDPA on jagged tensors."""
    torch = require("torch", TORCH_HINT)
    half = dtype in (torch.float16, torch.bfloat16)
    if torch.device(device).type == "cuda" and half and flash_varlen() is not None:
        return "flash-attn"
    if sdpa_varlen_available(device, dtype, head_dim):
        return "sdpa-varlen"
    return "jagged"


def packed_attention(kernel: str, cu_seqlens: Any, max_seqlen: int, min_seqlen: int, scale: float) -> Attention:
    """``attention(q, k, v)`` over packed texts: q, k, v [T, heads,
    head_dim] -> [T, heads, head_dim], each text attending to its own
    tokens only.

    Parameters
    ----------
    kernel : one of :data:`KERNELS`
    cu_seqlens : int32 [b + 1] on the device
        Text ``j`` is tokens ``[cu_seqlens[j], cu_seqlens[j + 1])``.
    max_seqlen, min_seqlen : int
        The longest and shortest text (host values).
    scale : float
        The softmax scale (``head_dim ** -0.5`` for BERT).
    """
    torch = require("torch", TORCH_HINT)
    F = torch.nn.functional
    if kernel == "flash-attn":
        fn = flash_varlen()
        if fn is None:
            raise ValueError("kernel: 'flash-attn' needs the flash-attn package (pip install flash-attn)")
        return lambda q, k, v: fn(q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen, 0.0,
                                  softmax_scale=scale, causal=False)
    if kernel == "sdpa-varlen":
        op = torch.ops.aten._flash_attention_forward
        return lambda q, k, v: op(q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen, 0.0, False, False,
                                  scale=scale)[0]
    if kernel == "jagged":
        offsets = cu_seqlens.long()  # one offsets tensor: q, k and v share their ragged dimension

        def jagged(x: Any) -> Any:
            # contiguous: SDPA finds no kernel for jagged views of strided packed tensors (a no-op for the model's)
            return torch.nested.nested_tensor_from_jagged(x.contiguous(), offsets, max_seqlen=max_seqlen,
                                                          min_seqlen=min_seqlen).transpose(1, 2)

        def attend(q: Any, k: Any, v: Any) -> Any:
            with quiet_nested():
                out = F.scaled_dot_product_attention(jagged(q), jagged(k), jagged(v), scale=scale)
                return out.transpose(1, 2).values()

        return attend
    if kernel == "reference":
        return lambda q, k, v: reference_attention(q, k, v, cu_seqlens, scale)
    raise ValueError(f"kernel: expected one of {list(KERNELS)}, got {kernel!r}")


def reference_attention(q: Any, k: Any, v: Any, cu_seqlens: Any, scale: float | None = None) -> Any:
    """Attention of packed texts, one text at a time (the bounds read on
    the host): the reference of the other kernels.

    Parameters
    ----------
    q, k, v : float [T, heads, head_dim]
    cu_seqlens : int [b + 1]
    scale : float or None (``head_dim ** -0.5``)

    Returns
    -------
    float [T, heads, head_dim]
    """
    torch = require("torch", TORCH_HINT)
    F = torch.nn.functional
    out = torch.empty_like(q)
    bounds = cu_seqlens.tolist()
    for s, e in zip(bounds[:-1], bounds[1:]):
        if e > s:
            qs, ks, vs = (t[s:e].transpose(0, 1).unsqueeze(0) for t in (q, k, v))  # [1, heads, l, hd]
            out[s:e] = F.scaled_dot_product_attention(qs, ks, vs, scale=scale)[0].transpose(0, 1)
    return out


@contextlib.contextmanager
def quiet_nested() -> Iterator[None]:
    """Silence the notices torch prints on the first nested-tensor use (its
    "prototype" warning, torch.fx's tracing notice): they concern torch's
    internals, not the caller."""
    log = logging.getLogger("torch.fx._symbolic_trace")
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            yield
    finally:
        log.setLevel(level)


def warm_jagged() -> threading.Thread:
    """Import what the ``"jagged"`` kernel needs, in a background thread
    (started and returned), so that the first batch does not wait for it."""
    def run() -> None:
        torch = require("torch", TORCH_HINT)
        x = torch.zeros(3, 1, 8)
        try:
            packed_attention("jagged", torch.tensor([0, 1, 3], dtype=torch.int32), 2, 1, 1.0)(x, x, x)
        except Exception:  # noqa: BLE001 - only a warm-up: the real call reports its own error
            pass

    thread = threading.Thread(target=run, name="rcn_fast-warm-jagged", daemon=True)
    thread.start()
    return thread


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


__all__ = ["KERNELS", "choose_kernel", "flash_varlen", "packed_attention", "reference_attention",
           "sdpa_varlen_available", "segment_pool", "warm_jagged", "quiet_nested"]
