"""RR (rethinking with retrieval) and self-consistency.

Both sample N chain-of-thought reasoning paths per question (one
generation call for the whole batch, ``num_samples=N``), few-shot: the
prompt shows ``num_examples`` worked examples (user/assistant turns of the
``rr_reasoning`` / ``rr_reasoning_yes_no`` stage; 0 = zero-shot). A path
is its explanation (the sentences before its answer sentence) and its
predicted choice, read by :func:`parse_answer` from the path's final
answer statement.

* Self-consistency: majority vote of the paths' answers.
* RR: every non-conclusion sentence of every path is checked against
  evidence: BM25 top ``bm25_candidates`` paragraphs of the knowledge corpus,
  reranked by the cosine of a sentence-similarity model of their own
  (``similarity_model``, the paper's MPNet by default; not the retriever's
  encoder), top paragraph kept (one BM25 call and one similarity-model
  call per side for all sentences of the batch); an NLI model (one call for
  all sentences) gives entailment E and contradiction C with that paragraph
  as premise and the sentence as hypothesis; M is that cosine. A path's
  faithfulness is the sum of a per-sentence function of (M, E, C)
  (:func:`faithfulness_terms`, RR App. A.2); the answer with the largest
  summed faithfulness over the paths predicting it wins (RR eq. 1).

Ties: equal summed faithfulness (within 1e-9) -> more paths; still equal ->
the lower choice index (self-consistency: more paths, then the lower choice
index). No path with a readable answer -> the config's ``fallback``.

``Prediction.choice_logprobs``: self-consistency ``log(votes_c / answered)``;
RR ``log_softmax`` of the summed faithfulness over the choices some path
predicts. Choices no path predicts get ``-inf``. With the ``"score"``
fallback the values are the scoring pass's log-probabilities. Tied choices
have equal ``choice_logprobs``; ``pred`` then follows the tie rules above
(so on a tie it need not be the first argmax). The RR vote's trace also
holds ``majority_pred``: self-consistency on the same paths.

Sampling is seeded (``config.seed``). With the local Hugging Face backend a
sampled path depends only on (seed, prompt, sample index), not on the
other questions of the batch, so a question gets the same paths -- and the
same prediction -- alone or inside any batch. A backend without that
guarantee (a remote server's sampler) gives batch-dependent paths unless
its generations are cached.

The package's modules: :mod:`~rcn_fast.pipelines.rr.config` (the two
configs), :mod:`~rcn_fast.pipelines.rr.answers` (sentences and answer
parsing), :mod:`~rcn_fast.pipelines.rr.faithfulness` (similarity model,
faithfulness functions, voting), :mod:`~rcn_fast.pipelines.rr.pipeline`
(the two pipelines). Every name is importable from here.
"""

from __future__ import annotations

from rcn_fast.pipelines.rr.answers import (
    PYSBD_HINT,
    ParsedAnswer,
    ReasoningPath,
    is_conclusion,
    make_path,
    parse_answer,
    split_sentences,
)
from rcn_fast.pipelines.rr.config import (
    BM25_METHODS,
    CONCLUSION_WORDS,
    FAITHFULNESS_FUNCTIONS,
    PAPER_SIMILARITY_MODEL,
    RRConfig,
    SelfConsistencyConfig,
)
from rcn_fast.pipelines.rr.faithfulness import (
    SIMILARITY_KEYS,
    TIE_TOLERANCE,
    Vote,
    faithful_vote,
    faithfulness_terms,
    load_similarity_model,
    vote_logprobs,
)
from rcn_fast.pipelines.rr.pipeline import RR, SelfConsistency


__all__ = [
    "RR", "SelfConsistency", "split_sentences", "is_conclusion", "parse_answer", "ParsedAnswer", "ReasoningPath",
    "make_path", "faithfulness_terms", "faithful_vote", "vote_logprobs", "Vote", "load_similarity_model",
    "PAPER_SIMILARITY_MODEL", "RRConfig", "SelfConsistencyConfig", "CONCLUSION_WORDS", "FAITHFULNESS_FUNCTIONS",
    "BM25_METHODS",
]
