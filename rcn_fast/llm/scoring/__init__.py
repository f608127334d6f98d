"""Choice-label scoring: answer labels as tokens, and their log-probabilities
(ReConnect eq. 9, ZEBRA eq. 5).

* :mod:`~rcn_fast.llm.scoring.choice` -- the two dispatched ops,
  :func:`choice_logprobs` (from final-position logits) and
  :func:`choice_logprobs_from_hidden` (from the hidden state and the LM-head
  rows of the labels);
* :mod:`~rcn_fast.llm.scoring.labels` -- which token ids spell a label, and
  the check that refuses unusable label scores;
* :mod:`~rcn_fast.llm.scoring.reference` -- the plain torch references;
* :mod:`~rcn_fast.llm.scoring.triton_launch` -- the Triton kernels' launchers;
* :mod:`~rcn_fast.llm.scoring.served` -- exact label scores from a serving
  engine's top log-probs (the OpenAI client, vLLM).

The public names of these modules are importable from this package.
"""

from __future__ import annotations

from rcn_fast._lazy import lazy_exports

_EXPORTS = {
    **dict.fromkeys(("LabelScoreError", "check_label_scores", "LOGPROB_TOLERANCE", "label_token_ids",
                     "pack_label_ids"), "rcn_fast.llm.scoring.labels"),
    **dict.fromkeys(("choice_logprobs_reference", "choice_logprobs_hidden_reference", "combine_reference"),
                    "rcn_fast.llm.scoring.reference"),
    **dict.fromkeys(("MAX_TILE_LOGITS", "MAX_TILE_HIDDEN"), "rcn_fast.llm.scoring.triton_launch"),
    **dict.fromkeys(("choice_logprobs", "choice_logprobs_from_hidden", "CHOICE_LOGPROBS", "CHOICE_LOGPROBS_HIDDEN"),
                    "rcn_fast.llm.scoring.choice"),
}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
__all__ = list(_EXPORTS)
