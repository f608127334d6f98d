"""The LLM layer: one protocol, several backends, label scoring and a cache.

* :func:`load_llm` -- a model directory, ``.gguf`` file, installed model
  package, hub id, ``"openai:<url>#<model>"`` server, ``"vllm:<model>"``,
  any ``"<prefix>:..."`` registered with :func:`register_backend`
  (:mod:`rcn_fast.llm.registry`) or ``(model, tokenizer)`` pair -> an
  :class:`LLM`; a ``.gguf`` runs on the native engine, llama.cpp in this
  process or transformers (``engine=``; ``"auto"`` picks the fastest that
  runs the file: :mod:`rcn_fast.llm.backends.speeds`).
* :class:`LLM` -- ``generate(chats, ...)`` and ``label_logprobs(chats, labels)``;
  a final assistant turn in a chat is a pre-fill the model continues.
* :func:`choice_logprobs` / :func:`choice_logprobs_from_hidden` -- the
  label-scoring op (Triton on CUDA, torch reference otherwise).
* :mod:`rcn_fast.llm.seeded` -- seeded sampling whose draws do not depend
  on batching (sample ``s`` depends on prompt, parameters, seed and ``s``).
* :class:`CallCache` / :class:`CachedLLM` -- the sqlite call cache, keyed
  on ``LLM.identity`` (every backend's one model identity);
  :class:`Cost` / :class:`CostTracker` -- usage accounting.
* :func:`preflight` -- check a model server once before a run.
* ``python -m rcn_fast.serve --model SPEC`` -- a small OpenAI-compatible
  server over the local backend (:mod:`rcn_fast.llm.server.app`).

Everything heavy (torch, transformers, triton) is imported lazily.
"""

from __future__ import annotations

from rcn_fast._lazy import lazy_exports
from rcn_fast.llm.base import LLM, ContextLengthWarning, Cost, CostTracker, Generation, GenerationParams
from rcn_fast.llm.chat import render_chat, validate_chats

#: Public name -> the module that defines it (imported on first access).
_LAZY = {
    "load_llm": "rcn_fast.llm.load",
    "register_backend": "rcn_fast.llm.registry",
    "HFLLM": "rcn_fast.llm.backends.hf",
    "HFConfig": "rcn_fast.llm.backends.hf",
    "OpenAILLM": "rcn_fast.llm.openai.client",
    "OpenAIConfig": "rcn_fast.llm.openai.config",
    "VLLMEngine": "rcn_fast.llm.backends.vllm_engine",
    "CallCache": "rcn_fast.llm.cache",
    "CachedLLM": "rcn_fast.llm.cache",
    "choice_logprobs": "rcn_fast.llm.scoring.choice",
    "choice_logprobs_from_hidden": "rcn_fast.llm.scoring.choice",
    "label_token_ids": "rcn_fast.llm.scoring.labels",
    "LabelScoreError": "rcn_fast.llm.scoring.labels",
    "preflight": "rcn_fast.llm.preflight",
    "PreflightError": "rcn_fast.llm.preflight",
}
__getattr__, __dir__ = lazy_exports(__name__, _LAZY)

__all__ = [
    "LLM",
    "ContextLengthWarning",
    "Cost",
    "CostTracker",
    "Generation",
    "GenerationParams",
    "render_chat",
    "validate_chats",
    *_LAZY,
]
