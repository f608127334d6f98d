"""Triton kernel bodies for choice-label scoring (launchers: rcn_fast.llm.scoring.triton_launch).

Both kernels run one program per batch row. A row has ``C`` labels, each
with up to ``S`` spellings (token ids, -1 = absent). The score of a spelling
is its final-position logit; the score of a label is the logsumexp of its
spellings (the probability mass of the label is the sum of the masses of its
spellings); the output is the log-softmax over the labels of the row, and
the argmax label (lowest index on ties, -1 when every label is -inf).

Non-finite scores: ``-inf`` is an ordinary score (probability 0). A row
where any present spelling scores NaN or ``+inf`` is not scored: all its
``C`` outputs are NaN and its argmax is -1 (the same rule as the torch
reference in rcn_fast.llm.scoring.reference).

* :func:`choice_logprobs_logits_kernel` gathers from logits ``[B, V]``.
* :func:`choice_logprobs_hidden_kernel` computes only the needed logits:
  the dot product of the final hidden state ``[B, H]`` with the LM-head rows
  ``weight[id]`` (``[V, H]``) of the label tokens, accumulated in fp32,
  plus an optional bias.

Importing this module imports triton; with ``TRITON_INTERPRET=1`` set before
the import the kernels run on the CPU in Triton's interpreter.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _combine_and_store(x, valid, offs_c, C, out_row_ptr, stride_oc, arg_ptr):
    """x: fp32 [BLOCK_C, BLOCK_S] spelling scores (-inf where not valid)."""
    neg_inf = float("-inf")
    # a NaN or +inf among the present spellings poisons the whole row
    bad = valid & ((x != x) | (x == float("inf")))
    row_bad = tl.max(tl.max(bad.to(tl.int32), axis=1), axis=0) > 0
    x = tl.where(valid, x, neg_inf)
    x = tl.where(bad, neg_inf, x)
    m = tl.max(x, axis=1)
    m_safe = tl.where(m == neg_inf, 0.0, m)
    se = tl.sum(tl.exp(x - m_safe[:, None]), axis=1)
    lab = tl.where(m == neg_inf, neg_inf, m_safe + tl.log(tl.where(se > 0, se, 1.0)))
    lab = tl.where(offs_c < C, lab, neg_inf)
    big = tl.max(lab, axis=0)
    big_safe = tl.where(big == neg_inf, 0.0, big)
    z = tl.sum(tl.exp(lab - big_safe), axis=0)
    lse = big_safe + tl.log(tl.where(z > 0, z, 1.0))
    out = tl.where(big == neg_inf, neg_inf, lab - lse)
    out = tl.where(row_bad, float("nan"), out)
    tl.store(out_row_ptr + offs_c * stride_oc, out, mask=offs_c < C)
    best = tl.argmax(lab, axis=0, tie_break_left=True)
    best = tl.where((big == neg_inf) | row_bad, -1, best)
    tl.store(arg_ptr, best.to(tl.int64))


@triton.jit
def _load_label_ids(ids_ptr, b, stride_ib, stride_ic, stride_is, C, S,
                    BLOCK_C: tl.constexpr, BLOCK_S: tl.constexpr):
    """Row ``b``'s spelling ids as int64 [BLOCK_C, BLOCK_S]: (valid mask,
    ids with 0 where not valid, so they can index safely)."""
    offs_c = tl.arange(0, BLOCK_C)
    offs_s = tl.arange(0, BLOCK_S)
    inb = (offs_c[:, None] < C) & (offs_s[None, :] < S)
    ids = tl.load(
        ids_ptr + b * stride_ib + offs_c[:, None] * stride_ic + offs_s[None, :] * stride_is,
        mask=inb, other=-1,
    ).to(tl.int64)
    valid = inb & (ids >= 0)
    return valid, tl.where(valid, ids, 0)


@triton.jit
def choice_logprobs_logits_kernel(
    logits_ptr, stride_lb, stride_lv,
    ids_ptr, stride_ib, stride_ic, stride_is,
    out_ptr, stride_ob, stride_oc,
    arg_ptr,
    C, S,
    BLOCK_C: tl.constexpr, BLOCK_S: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    offs_c = tl.arange(0, BLOCK_C)
    valid, safe = _load_label_ids(ids_ptr, b, stride_ib, stride_ic, stride_is, C, S, BLOCK_C, BLOCK_S)
    x = tl.load(logits_ptr + b * stride_lb + safe * stride_lv, mask=valid, other=float("-inf")).to(tl.float32)
    _combine_and_store(x, valid, offs_c, C, out_ptr + b * stride_ob, stride_oc, arg_ptr + b)


@triton.jit
def choice_logprobs_hidden_kernel(
    hidden_ptr, stride_hb, stride_hh,
    weight_ptr, stride_wv, stride_wh,
    bias_ptr,
    ids_ptr, stride_ib, stride_ic, stride_is,
    out_ptr, stride_ob, stride_oc,
    arg_ptr,
    C, S, H,
    HAS_BIAS: tl.constexpr,
    BLOCK_C: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_H: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    offs_c = tl.arange(0, BLOCK_C)
    offs_h = tl.arange(0, BLOCK_H)
    valid, safe = _load_label_ids(ids_ptr, b, stride_ib, stride_ic, stride_is, C, S, BLOCK_C, BLOCK_S)
    acc = tl.zeros((BLOCK_C, BLOCK_S), dtype=tl.float32)
    for h0 in range(0, H, BLOCK_H):
        hh = h0 + offs_h
        hmask = hh < H
        hv = tl.load(hidden_ptr + b * stride_hb + hh * stride_hh, mask=hmask, other=0.0).to(tl.float32)
        w = tl.load(
            weight_ptr + safe[:, :, None] * stride_wv + hh[None, None, :] * stride_wh,
            mask=valid[:, :, None] & hmask[None, None, :], other=0.0,
        ).to(tl.float32)
        acc += tl.sum(w * hv[None, None, :], axis=2)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + safe, mask=valid, other=0.0).to(tl.float32)
    _combine_and_store(acc, valid, offs_c, C, out_ptr + b * stride_ob, stride_oc, arg_ptr + b)
