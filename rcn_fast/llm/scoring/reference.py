"""Plain torch references of the choice-scoring ops (the specification the
Triton kernels are tested against, and the ``torch`` backend of
:mod:`rcn_fast.llm.scoring.choice`'s dispatch)."""

from __future__ import annotations

from typing import Any

from rcn_fast import _arrays as A
from rcn_fast.llm.scoring.labels import TORCH_HINT


def combine_reference(scores: Any, valid: Any) -> tuple[Any, Any]:
    """Spelling scores ``float32 [B, C, S]`` (only ``valid`` entries count)
    -> (log-probabilities ``float32 [B, C]``, argmax ``int64 [B]``)."""
    torch = A.require("torch", TORCH_HINT)
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
    torch = A.require("torch", TORCH_HINT)
    valid = label_ids >= 0
    safe = label_ids.clamp(min=0)
    rows = weight[safe].float()  # [B, C, S, H]
    scores = torch.einsum("bcsh,bh->bcs", rows, hidden.float())
    if bias is not None:
        scores = scores + bias.float()[safe]
    return combine_reference(scores, valid)


__all__ = ["combine_reference", "choice_logprobs_reference", "choice_logprobs_hidden_reference"]
