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

import math
import os
from typing import Any, Mapping, Sequence

from rcn_fast import _arrays as A
from rcn_fast import _dispatch

_TORCH_HINT = "pip install 'rcn_fast[llm]' (torch==2.13.0)"
_TRITON_HINT = "pip install 'rcn_fast[triton]'"


def _torch() -> Any:
    return A.require("torch", _TORCH_HINT)


# ------------------------------------------------------------ label checks

#: A log-probability above this is "positive" (room for float rounding of 0).
LOGPROB_TOLERANCE = 1e-3


class LabelScoreError(ValueError):
    """A label's log-probability is NaN, ``+inf`` or positive (or every
    label of a row is ``-inf``): the model or server gave no usable score,
    so the question has no answer (the eval counts it as failed)."""


def _bad_logprob(v: float) -> str | None:
    if math.isnan(v):
        return "NaN"
    if v == math.inf:
        return "+inf"
    if v > LOGPROB_TOLERANCE:
        return "positive (a log-probability is <= 0)"
    return None


def check_label_scores(rows: Sequence[Sequence[float]], labels: Sequence[Sequence[str]], backend: str,
                       tags: Sequence[str] | None = None) -> None:
    """Refuse unusable label log-probabilities.

    Parameters
    ----------
    rows : list (length B) of list of float
        Per row, one score per label: a label's log-probability (before or
        after the log-softmax over the labels).
    labels : list (length B) of list of str
        The labels of each row (aligned with ``rows``).
    backend : str
        Names the model or server in the message (e.g. its identity).
    tags : list of str, optional
        Question ids of the rows, named in the message.

    Raises
    ------
    LabelScoreError
        A score is NaN, ``+inf`` or above :data:`LOGPROB_TOLERANCE`, or
        every label of a row is ``-inf``. ``-inf`` alone is a score
        (probability 0).
    """
    for i, (row, labs) in enumerate(zip(rows, labels)):
        where = f"question {tags[i]!r} (chats[{i}])" if tags is not None else f"chats[{i}]"
        for v, lab in zip(row, labs):
            why = _bad_logprob(float(v))
            if why is not None:
                raise LabelScoreError(f"{backend}: {where}: label {lab!r} has log-probability {float(v)!r}, which is "
                                      f"{why}: the model's or server's numbers are broken (NaN logits, an overflow), "
                                      f"so this question has no answer and nothing is cached")
        if row and all(float(v) == -math.inf for v in row):
            raise LabelScoreError(f"{backend}: {where}: every label ({', '.join(map(repr, labs))}) has "
                                  f"log-probability -inf, so this question has no answer and nothing is cached")


# ------------------------------------------------------------ reference


def combine_reference(scores: Any, valid: Any) -> tuple[Any, Any]:
    """Spelling scores ``float32 [B, C, S]`` (only ``valid`` entries count)
    -> (log-probabilities ``float32 [B, C]``, argmax ``int64 [B]``)."""
    torch = _torch()
    x = scores.float()
    bad = ((torch.isnan(x) | torch.isposinf(x)) & valid).flatten(1).any(dim=1)  # [B]
    x = x.masked_fill(~valid | bad[:, None, None], float("-inf"))
    lab = torch.logsumexp(x, dim=2)  # all -inf -> -inf
    lse = torch.logsumexp(lab, dim=1, keepdim=True)
    dead = torch.isneginf(lse)
    out = torch.where(dead, torch.full_like(lab, float("-inf")), lab - lse)
    arg = torch.argmax(lab, dim=1)  # first maximum on ties
    arg = torch.where(dead[:, 0], torch.full_like(arg, -1), arg)
    out = out.masked_fill(bad[:, None], float("nan"))
    return out, arg


def choice_logprobs_reference(logits: Any, label_ids: Any) -> tuple[Any, Any]:
    """Plain torch reference of :func:`choice_logprobs` (the specification)."""
    B, C, S = label_ids.shape
    valid = label_ids >= 0
    safe = label_ids.clamp(min=0).reshape(B, C * S)
    scores = logits.float().gather(1, safe).reshape(B, C, S)
    return combine_reference(scores, valid)


def choice_logprobs_hidden_reference(
    hidden: Any, weight: Any, label_ids: Any, bias: Any = None
) -> tuple[Any, Any]:
    """Plain torch reference of :func:`choice_logprobs_from_hidden`:
    gathers the label rows of ``weight`` and multiplies in float32."""
    torch = _torch()
    valid = label_ids >= 0
    safe = label_ids.clamp(min=0)
    rows = weight[safe].float()  # [B, C, S, H]
    scores = torch.einsum("bcsh,bh->bcs", rows, hidden.float())
    if bias is not None:
        scores = scores + bias.float()[safe]
    return combine_reference(scores, valid)


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


_SPACE_MARKERS = ("\u0120", "\u2581")  # byte-level BPE "Ġ", SentencePiece "▁"


def label_token_ids(
    tokenizer: Any,
    labels: Sequence[str],
    spellings: Sequence[str] = ("{}", " {}"),
    vocab_pieces: bool = True,
) -> list[list[int]]:
    """Token ids of every spelling of every label.

    Parameters
    ----------
    tokenizer : transformers tokenizer
    labels : list of str
        E.g. ``["A", "B", "C"]``.
    spellings : list of str
        Format strings encoded on their own; by default the label itself
        and with a leading space.
    vocab_pieces : bool
        Also take the vocabulary entries that spell each spelling as one
        piece, a leading space written as a space marker (``"A"``,
        ``"ĠA"``, ``"▁A"``). Encoding alone misses
        some: a SentencePiece tokenizer encodes both ``"A"`` and ``" A"`` as
        ``"▁A"`` and never yields the bare ``"A"`` a model may put after
        ``"Answer: "``.

    Returns
    -------
    list of list of int
        Per label, the distinct ids that spell it as one token (spellings
        that need several tokens are skipped).

    Raises
    ------
    ValueError
        When no spelling of a label is a single token (multi-token labels
        are not scored: rename them, e.g. to letters).
    """
    vocab = tokenizer.get_vocab() if vocab_pieces else {}
    out: list[list[int]] = []
    for label in labels:
        if not isinstance(label, str) or not label:
            raise ValueError(f"labels: expected non-empty strings, got {label!r}")
        ids: list[int] = []
        tried = []
        for fmt in spellings:
            text = fmt.format(label)
            toks = tokenizer.encode(text, add_special_tokens=False)
            tried.append(f"{text!r} -> {toks}")
            if len(toks) == 1 and toks[0] not in ids:
                ids.append(int(toks[0]))
            pieces = [m + text[1:] for m in _SPACE_MARKERS] if text.startswith(" ") else [text]
            for piece in pieces if vocab else ():
                tid = vocab.get(piece)
                if tid is not None and int(tid) not in ids:
                    ids.append(int(tid))
        if not ids:
            raise ValueError(
                f"labels: {label!r} is not a single token in any spelling ({'; '.join(tried)}); "
                f"label scoring needs single-token labels such as letters"
            )
        out.append(ids)
    return out


def pack_label_ids(per_row: Sequence[Sequence[Sequence[int]]]) -> Any:
    """Rows of labels of spellings (ragged) -> int64 tensor [B, C, S], -1 padded."""
    torch = _torch()
    B = len(per_row)
    C = max((len(r) for r in per_row), default=0)
    S = max((len(sp) for r in per_row for sp in r), default=0)
    out = torch.full((B, max(C, 1), max(S, 1)), -1, dtype=torch.int64)
    for b, row in enumerate(per_row):
        for c, sp in enumerate(row):
            if sp:
                out[b, c, : len(sp)] = torch.tensor(list(sp), dtype=torch.int64)
    return out


# ------------------------------------------------------------ backends


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


def _check_triton_common(ctx: Mapping[str, Any]) -> str | None:
    if not A.optional_available("triton"):
        return f"triton is not installed ({_TRITON_HINT})"
    if ctx.get("device", "cpu") != "cuda":
        if os.environ.get("TRITON_INTERPRET") != "1":
            return f"inputs are on {ctx.get('device', 'cpu')}; the Triton kernels need CUDA tensors (or TRITON_INTERPRET=1)"
        if not ctx.get("forced"):
            return f"inputs are on {ctx.get('device', 'cpu')}; the Triton interpreter runs only when asked for by name"
    return None


def _tile_reason(ctx: Mapping[str, Any], limit: int, kernel: str) -> str | None:
    C, S = int(ctx.get("C", 1)), int(ctx.get("S", 1))
    tile = _next_pow2(C) * _next_pow2(S)
    if tile > limit:
        return (
            f"C={C} labels x S={S} spellings pad to a {tile}-entry tile; the {kernel} kernel "
            f"takes at most {limit} (next_pow2(C) * next_pow2(S))"
        )
    return None


def _check_triton_logits(ctx: Mapping[str, Any]) -> str | None:
    return _check_triton_common(ctx) or _tile_reason(ctx, MAX_TILE_LOGITS, "logits")


def _check_triton_hidden(ctx: Mapping[str, Any]) -> str | None:
    return _check_triton_common(ctx) or _tile_reason(ctx, MAX_TILE_HIDDEN, "hidden-state")


def _kernels() -> Any:
    import importlib

    return importlib.import_module("rcn_fast.kernels.choice_scoring")


def _next_pow2(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())


def _run_triton_logits(logits: Any, label_ids: Any) -> tuple[Any, Any]:
    torch = _torch()
    K = _kernels()
    B, C, S = label_ids.shape
    if _next_pow2(C) * _next_pow2(S) > MAX_TILE_LOGITS:  # the dispatch never sends these here
        raise ValueError(f"label_ids: C={C}, S={S} exceed the logits kernel's tile ({MAX_TILE_LOGITS})")
    out = torch.empty((B, C), dtype=torch.float32, device=logits.device)
    arg = torch.empty((B,), dtype=torch.int64, device=logits.device)
    if B == 0:
        return out, arg
    K.choice_logprobs_logits_kernel[(B,)](
        logits, logits.stride(0), logits.stride(1),
        label_ids, label_ids.stride(0), label_ids.stride(1), label_ids.stride(2),
        out, out.stride(0), out.stride(1),
        arg, C, S,
        BLOCK_C=_next_pow2(C), BLOCK_S=_next_pow2(S),
    )
    return out, arg


def _run_triton_hidden(hidden: Any, weight: Any, label_ids: Any, bias: Any = None) -> tuple[Any, Any]:
    torch = _torch()
    K = _kernels()
    B, C, S = label_ids.shape
    H = hidden.shape[1]
    out = torch.empty((B, C), dtype=torch.float32, device=hidden.device)
    arg = torch.empty((B,), dtype=torch.int64, device=hidden.device)
    if B == 0:
        return out, arg
    cs = _next_pow2(C) * _next_pow2(S)
    if cs > MAX_TILE_HIDDEN:  # the dispatch never sends these here
        raise ValueError(f"label_ids: C={C}, S={S} exceed the hidden kernel's tile ({cs} > {MAX_TILE_HIDDEN})")
    block_h = max(16, min(_next_pow2(H), 4096 // cs))
    K.choice_logprobs_hidden_kernel[(B,)](
        hidden, hidden.stride(0), hidden.stride(1),
        weight, weight.stride(0), weight.stride(1),
        bias if bias is not None else hidden,
        label_ids, label_ids.stride(0), label_ids.stride(1), label_ids.stride(2),
        out, out.stride(0), out.stride(1),
        arg, C, S, H,
        HAS_BIAS=bias is not None,
        BLOCK_C=_next_pow2(C), BLOCK_S=_next_pow2(S), BLOCK_H=block_h,
    )
    return out, arg


def _check_torch(ctx: Mapping[str, Any]) -> str | None:
    return None


CHOICE_LOGPROBS = _dispatch.register(
    _dispatch.Op(
        "choice_logprobs",
        [
            _dispatch.Backend("triton", _check_triton_logits, _run_triton_logits, "fused gather + logsumexp + log-softmax (Triton)"),
            _dispatch.Backend("torch", _check_torch, choice_logprobs_reference, "plain torch reference"),
        ],
    )
)

CHOICE_LOGPROBS_HIDDEN = _dispatch.register(
    _dispatch.Op(
        "choice_logprobs_hidden",
        [
            _dispatch.Backend("triton", _check_triton_hidden, _run_triton_hidden, "label rows of the LM head only (Triton)"),
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
]
