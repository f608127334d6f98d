"""Launchers of the Triton choice-scoring kernels
(``rcn_fast.kernels.choice_scoring``): when each kernel can serve a call
(:func:`check_triton_logits`, :func:`check_triton_hidden`: Triton present,
CUDA tensors or the interpreter asked for by name, the label tile within
the kernel's limit) and the launches themselves (:func:`run_triton_logits`,
:func:`run_triton_hidden`), every kernel argument passed by name, each
launch under its inputs' device (Triton launches on the current device). The
dispatch between these and the torch references is in
:mod:`rcn_fast.llm.scoring.choice`."""

from __future__ import annotations

import os
from typing import Any, Mapping

from rcn_fast import _arrays as A
from rcn_fast.llm.scoring.labels import TORCH_HINT

TRITON_HINT = "pip install 'rcn_fast[triton]'"


# Largest label tile (next_pow2(C) * next_pow2(S)) each kernel takes. One
# program holds the whole tile in registers: the logits kernel a
# [BLOCK_C, BLOCK_S] tile of fp32 scores and int64 ids (4096 entries: 32 of
# each per thread at 4 warps); the hidden kernel also a
# [BLOCK_C, BLOCK_S, BLOCK_H] fp32 tile of LM-head values with
# BLOCK_H = 4096 // tile >= 16, so its tile is capped at 256 (<= 4096 fp32
# values per H step). Larger cases (hundreds of labels or spellings) go to
# torch.
MAX_TILE_LOGITS = 4096
MAX_TILE_HIDDEN = 256


def check_triton_common(ctx: Mapping[str, Any]) -> str | None:
    if not A.optional_available("triton"):
        return f"triton is not installed ({TRITON_HINT})"
    if ctx.get("device", "cpu") != "cuda":
        if os.environ.get("TRITON_INTERPRET") != "1":
            return f"inputs are on {ctx.get('device', 'cpu')}; the Triton kernels need CUDA tensors (or TRITON_INTERPRET=1)"
        if not ctx.get("forced"):
            return f"inputs are on {ctx.get('device', 'cpu')}; the Triton interpreter runs only when asked for by name"
    return None


def tile_reason(ctx: Mapping[str, Any], limit: int, kernel: str) -> str | None:
    C, S = int(ctx.get("C", 1)), int(ctx.get("S", 1))
    tile = next_pow2(C) * next_pow2(S)
    if tile > limit:
        return (
            f"C={C} labels x S={S} spellings pad to a {tile}-entry tile; the {kernel} kernel "
            f"takes at most {limit} (next_pow2(C) * next_pow2(S))"
        )
    return None


def check_triton_logits(ctx: Mapping[str, Any]) -> str | None:
    return check_triton_common(ctx) or tile_reason(ctx, MAX_TILE_LOGITS, "logits")


def check_triton_hidden(ctx: Mapping[str, Any]) -> str | None:
    return check_triton_common(ctx) or tile_reason(ctx, MAX_TILE_HIDDEN, "hidden-state")


def kernels() -> Any:
    import importlib

    return importlib.import_module("rcn_fast.kernels.choice_scoring")


def next_pow2(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())


def run_triton_logits(logits: Any, label_ids: Any) -> tuple[Any, Any]:
    torch = A.require("torch", TORCH_HINT)
    K = kernels()
    B, C, S = label_ids.shape
    if next_pow2(C) * next_pow2(S) > MAX_TILE_LOGITS:  # the dispatch never sends these here
        raise ValueError(f"label_ids: C={C}, S={S} exceed the logits kernel's tile ({MAX_TILE_LOGITS})")
    out = torch.empty((B, C), dtype=torch.float32, device=logits.device)
    arg = torch.empty((B,), dtype=torch.int64, device=logits.device)
    if B == 0:
        return out, arg
    with A.on_device(logits):  # Triton launches on the current device and its stream (issue 55, C4)
        K.choice_logprobs_logits_kernel[(B,)](
            logits_ptr=logits, stride_lb=logits.stride(0), stride_lv=logits.stride(1),
            ids_ptr=label_ids, stride_ib=label_ids.stride(0), stride_ic=label_ids.stride(1),
            stride_is=label_ids.stride(2),
            out_ptr=out, stride_ob=out.stride(0), stride_oc=out.stride(1),
            arg_ptr=arg, C=C, S=S,
            BLOCK_C=next_pow2(C), BLOCK_S=next_pow2(S),
        )
    return out, arg


def run_triton_hidden(hidden: Any, weight: Any, label_ids: Any, bias: Any = None) -> tuple[Any, Any]:
    torch = A.require("torch", TORCH_HINT)
    K = kernels()
    B, C, S = label_ids.shape
    H = hidden.shape[1]
    out = torch.empty((B, C), dtype=torch.float32, device=hidden.device)
    arg = torch.empty((B,), dtype=torch.int64, device=hidden.device)
    if B == 0:
        return out, arg
    cs = next_pow2(C) * next_pow2(S)
    if cs > MAX_TILE_HIDDEN:  # the dispatch never sends these here
        raise ValueError(f"label_ids: C={C}, S={S} exceed the hidden kernel's tile ({cs} > {MAX_TILE_HIDDEN})")
    block_h = max(16, min(next_pow2(H), 4096 // cs))
    with A.on_device(hidden):  # Triton launches on the current device and its stream (issue 55, C4)
        K.choice_logprobs_hidden_kernel[(B,)](
            hidden_ptr=hidden, stride_hb=hidden.stride(0), stride_hh=hidden.stride(1),
            weight_ptr=weight, stride_wv=weight.stride(0), stride_wh=weight.stride(1),
            bias_ptr=bias if bias is not None else hidden,  # never read without HAS_BIAS
            ids_ptr=label_ids, stride_ib=label_ids.stride(0), stride_ic=label_ids.stride(1),
            stride_is=label_ids.stride(2),
            out_ptr=out, stride_ob=out.stride(0), stride_oc=out.stride(1),
            arg_ptr=arg, C=C, S=S, H=H,
            HAS_BIAS=bias is not None,
            BLOCK_C=next_pow2(C), BLOCK_S=next_pow2(S), BLOCK_H=block_h,
        )
    return out, arg


__all__ = ["MAX_TILE_LOGITS", "MAX_TILE_HIDDEN", "check_triton_logits", "check_triton_hidden", "run_triton_logits",
           "run_triton_hidden", "next_pow2", "kernels", "TRITON_HINT"]
