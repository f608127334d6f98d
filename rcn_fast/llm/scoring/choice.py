"""Choice-label scoring: from the final position to log-probabilities over
the answer labels (ReConnect eq. 9, ZEBRA eq. 5).

Two public ops, each dispatched (:mod:`rcn_fast._dispatch`) over the
backends ``triton`` (CUDA tensors) and ``torch`` (the plain reference, any
device). CPU tensors go to the Triton kernels only in Triton's interpreter
(``TRITON_INTERPRET=1`` set before triton is imported) and only when the
backend is asked for by name (``backend="triton"`` or ``RCN_FAST_BACKEND``):
the interpreter is for testing and is never picked automatically.

* :func:`choice_logprobs` -- from final-position logits ``[B, V]``.
* :func:`choice_logprobs_from_hidden` -- from the final hidden state
  ``[B, H]`` and the LM-head weight ``[V, H]``: only the label rows are
  multiplied, so ``[B, V]`` logits are never formed.

This module holds the input checks and the dispatch; the parts live in
:mod:`rcn_fast.llm.scoring.labels` (label token ids, :func:`check_label_scores`),
:mod:`rcn_fast.llm.scoring.reference` (the torch references) and
:mod:`rcn_fast.llm.scoring.triton_launch` (the kernels' launchers). Their public
names are importable from here too.

Label spellings and how they combine
------------------------------------
``label_ids`` is ``int [B, C, S]``: for row ``b`` and label ``c`` up to ``S``
token ids (the spellings, e.g. ``"A"`` and ``" A"``), ``-1`` where absent. A
label's score is the **logsumexp** of its spellings' logits, i.e. the label
gets the probability mass of all its spellings together (taking the max
would ignore the mass of the weaker spelling). A label whose spellings are
all absent (``-1``; use this to pad rows with fewer choices) scores ``-inf``
and gets log-probability ``-inf``. Repeated ids within one label count
once per occurrence, so :func:`label_token_ids` removes duplicates. Which
ids spell a label is decided by :func:`label_token_ids` (the label encoded
bare and with a leading space, plus the vocabulary pieces ``"A"``, ``"ĠA"``,
``"▁A"``).

The result is the log-softmax over the labels of each row (float32) and the
argmax (int64, lowest label index on ties, ``-1`` when every label of the
row scores ``-inf``).

Non-finite scores
-----------------
``-inf`` is an ordinary score (probability 0). NaN and ``+inf`` are not: a
row where any *present* spelling scores NaN or ``+inf`` (a NaN logit, a NaN
in the hidden state or in a label's LM-head row, an fp16 overflow) is not
scored -- every one of its ``C`` log-probabilities is NaN (padded labels
included) and its argmax is ``-1``. Other rows are unaffected, and scores of
absent spellings (``-1`` ids) are never read. Both backends follow this
rule.

The backends do not pass such a row on as an answer: a NaN, ``+inf`` or
positive label log-probability (and a row whose labels all score ``-inf``)
is a :class:`LabelScoreError` naming the question, the label and the
backend (:func:`check_label_scores`, called by every backend and by the
call cache before it stores a row), so the question fails instead of
taking label A.
"""

from __future__ import annotations

from typing import Any, Mapping

from rcn_fast import _arrays as A
from rcn_fast import _dispatch
from rcn_fast.llm.scoring.labels import (
    LOGPROB_TOLERANCE,
    TORCH_HINT,
    LabelScoreError,
    check_label_scores,
    label_token_ids,
    pack_label_ids,
)
from rcn_fast.llm.scoring.reference import (
    choice_logprobs_hidden_reference,
    choice_logprobs_reference,
    combine_reference,
)
from rcn_fast.llm.scoring.triton_launch import (
    MAX_TILE_HIDDEN,
    MAX_TILE_LOGITS,
    check_triton_hidden,
    check_triton_logits,
    run_triton_hidden,
    run_triton_logits,
)


def _torch() -> Any:
    return A.require("torch", TORCH_HINT)


# ------------------------------------------------------------ checks


def _as_tensor(x: Any, name: str) -> Any:
    torch = _torch()
    if isinstance(x, torch.Tensor):
        return x
    if hasattr(x, "__array__") or isinstance(x, (list, tuple)):
        return torch.as_tensor(A.to_numpy(x) if hasattr(x, "__array__") else x)
    raise TypeError(f"{name}: expected a torch tensor or numpy array, got {type(x).__name__}")


def _check_ids(label_ids: Any, B: int, V: int) -> Any:
    torch = _torch()
    ids = _as_tensor(label_ids, "label_ids")
    if ids.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"label_ids: expected int32 or int64 token ids, got {ids.dtype}")
    if ids.ndim == 2:
        ids = ids.unsqueeze(2)
    if ids.ndim != 3:
        raise ValueError(f"label_ids: expected shape [B, C, S] or [B, C], got {tuple(ids.shape)}")
    if ids.shape[0] != B:
        raise ValueError(f"label_ids: expected {B} rows to match the batch, got shape {tuple(ids.shape)}")
    if ids.shape[1] < 1 or ids.shape[2] < 1:
        raise ValueError(f"label_ids: expected at least one label and one spelling, got shape {tuple(ids.shape)}")
    if ids.numel() and int(ids.max()) >= V:
        raise ValueError(f"label_ids: expected token ids < vocabulary size {V}, got {int(ids.max())}")
    if ids.numel() and int(ids.min()) < -1:
        raise ValueError(f"label_ids: expected ids >= 0 or -1 (absent), got {int(ids.min())}")
    return ids


def _check_float(x: Any, name: str, shape: str) -> Any:
    torch = _torch()
    x = _as_tensor(x, name)
    if x.ndim != 2:
        raise ValueError(f"{name}: expected a 2-d tensor of shape {shape}, got shape {tuple(x.shape)}")
    if x.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise TypeError(f"{name}: expected float32, float16 or bfloat16, got {x.dtype}")
    return x


def _dispatch_ctx(op: _dispatch.Op, backend: str | None, x: Any, ids: Any, **dims: int) -> dict[str, Any]:
    """The dispatch context of a choice-scoring call: the device and dtype
    of the float tensor ``x``, the label grid ``B, C, S`` of ``ids`` (int
    [B, C, S]), the other ``dims``, and whether a backend of ``op`` is
    forced (by ``backend`` or the environment)."""
    return {
        "device": x.device.type,
        "dtype": str(x.dtype).removeprefix("torch."),
        "B": int(ids.shape[0]),
        "C": int(ids.shape[1]),
        "S": int(ids.shape[2]),
        **dims,
        "forced": op.requested(backend) is not None,
    }


# ------------------------------------------------------------ public ops


def choice_logprobs(logits: Any, label_ids: Any, *, backend: str | None = None) -> tuple[Any, Any]:
    """Log-probabilities over choice labels from final-position logits.

    Parameters
    ----------
    logits : tensor [B, V]
        float32, float16 or bfloat16; any strides.
    label_ids : int tensor [B, C, S] or [B, C]
        Token ids of each label's spellings, ``-1`` where absent (see the
        module notes: spellings combine by logsumexp).
    backend : str, optional
        ``"triton"`` or ``"torch"``; default: the first that can serve.

    Returns
    -------
    logprobs : float32 [B, C]
        Log-softmax over the labels of each row; ``-inf`` for absent labels;
        all NaN for a row with a NaN or ``+inf`` spelling score (module notes).
    argmax : int64 [B]
        Best label (lowest index on ties; ``-1`` if no label is scored or
        the row is NaN).

    Notes
    -----
    The Triton kernel holds a row's ``next_pow2(C) x next_pow2(S)`` label
    tile in registers and takes tiles up to ``MAX_TILE_LOGITS`` (4096);
    larger cases are dispatched to torch.

    Examples
    --------
    >>> import torch
    >>> lp, best = choice_logprobs(torch.tensor([[0.0, 1.0, 2.0]]), torch.tensor([[[1], [2]]]))
    >>> best.tolist()
    [1]
    """
    logits = _check_float(logits, "logits", "[B, V]")
    ids = _check_ids(label_ids, logits.shape[0], logits.shape[1]).to(logits.device)
    ctx = _dispatch_ctx(CHOICE_LOGPROBS, backend, logits, ids, V=int(logits.shape[1]))
    return CHOICE_LOGPROBS(ctx, backend, logits=logits, label_ids=ids)


def choice_logprobs_from_hidden(
    hidden: Any, weight: Any, label_ids: Any, bias: Any = None, *, backend: str | None = None
) -> tuple[Any, Any]:
    """Log-probabilities over choice labels from the final hidden state,
    multiplying only the LM-head rows of the label tokens.

    Parameters
    ----------
    hidden : tensor [B, H]
        Final hidden state (after the model's final norm); float32, float16
        or bfloat16.
    weight : tensor [V, H]
        LM-head weight (``lm_head.weight``); same device as ``hidden``.
    label_ids : int tensor [B, C, S] or [B, C]
        As in :func:`choice_logprobs`.
    bias : tensor [V], optional
        LM-head bias.
    backend : str, optional
        ``"triton"`` or ``"torch"``.

    Returns
    -------
    logprobs : float32 [B, C]
    argmax : int64 [B]

    Notes
    -----
    Dot products accumulate in float32, so bf16/fp16 results can differ
    from a model's own bf16 logits by the rounding of those logits. Only
    valid for plain linear LM heads (no logit soft-capping or scaling).
    NaN/``+inf`` rows follow the rule of the module notes. The Triton
    kernel takes label tiles ``next_pow2(C) x next_pow2(S)`` up to
    ``MAX_TILE_HIDDEN`` (256, times an H block of 4096 // tile >= 16 fp32
    values); larger cases are dispatched to torch.
    """
    hidden = _check_float(hidden, "hidden", "[B, H]")
    weight = _check_float(weight, "weight", "[V, H]")
    if weight.shape[1] != hidden.shape[1]:
        raise ValueError(
            f"weight: expected {hidden.shape[1]} columns to match hidden [B, H], got shape {tuple(weight.shape)}"
        )
    if weight.device != hidden.device:
        raise ValueError(f"weight: expected the device of hidden ({hidden.device}), got {weight.device}")
    if bias is not None:
        bias = _as_tensor(bias, "bias")
        if bias.ndim != 1 or bias.shape[0] != weight.shape[0]:
            raise ValueError(f"bias: expected shape [{weight.shape[0]}], got {tuple(bias.shape)}")
    ids = _check_ids(label_ids, hidden.shape[0], weight.shape[0]).to(hidden.device)
    ctx = _dispatch_ctx(CHOICE_LOGPROBS_HIDDEN, backend, hidden, ids, H=int(hidden.shape[1]), V=int(weight.shape[0]))
    return CHOICE_LOGPROBS_HIDDEN(ctx, backend, hidden=hidden, weight=weight, label_ids=ids, bias=bias)


def _check_torch(ctx: Mapping[str, Any]) -> str | None:
    return None


CHOICE_LOGPROBS = _dispatch.register(
    _dispatch.Op(
        "choice_logprobs",
        [
            _dispatch.Backend("triton", check_triton_logits, run_triton_logits, "fused gather + logsumexp + log-softmax (Triton)"),
            _dispatch.Backend("torch", _check_torch, choice_logprobs_reference, "plain torch reference"),
        ],
    )
)

CHOICE_LOGPROBS_HIDDEN = _dispatch.register(
    _dispatch.Op(
        "choice_logprobs_hidden",
        [
            _dispatch.Backend("triton", check_triton_hidden, run_triton_hidden, "label rows of the LM head only (Triton)"),
            _dispatch.Backend("torch", _check_torch, choice_logprobs_hidden_reference, "plain torch reference"),
        ],
    )
)

__all__ = [
    "LabelScoreError",
    "check_label_scores",
    "LOGPROB_TOLERANCE",
    "choice_logprobs",
    "choice_logprobs_from_hidden",
    "choice_logprobs_reference",
    "choice_logprobs_hidden_reference",
    "label_token_ids",
    "pack_label_ids",
    "CHOICE_LOGPROBS",
    "CHOICE_LOGPROBS_HIDDEN",
    "MAX_TILE_LOGITS",
    "MAX_TILE_HIDDEN",
    "combine_reference",
]
