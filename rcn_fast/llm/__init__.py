"""The LLM layer: one protocol, several backends, label scoring and a cache.

* :func:`load_llm` -- a model directory, ``.gguf`` file, installed model
  package, hub id, ``"openai:<url>#<model>"`` server, ``"vllm:<model>"``,
  any ``"<prefix>:..."`` registered with :func:`register_backend`
  (:mod:`rcn_fast.llm.registry`) or ``(model, tokenizer)`` pair -> an
  :class:`LLM`.
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
  server over the local backend (:mod:`rcn_fast.llm.serve`).

Everything heavy (torch, transformers, triton) is imported lazily.
"""

from __future__ import annotations

from typing import Any

from rcn_fast.llm.base import LLM, ContextLengthWarning, Cost, CostTracker, Generation, GenerationParams
from rcn_fast.llm.chat import render_chat, validate_chats

_LAZY = {
    "load_llm": ("rcn_fast.llm.load", "load_llm"),
    "register_backend": ("rcn_fast.llm.registry", "register_backend"),
    "HFLLM": ("rcn_fast.llm.hf", "HFLLM"),
    "HFConfig": ("rcn_fast.llm.hf", "HFConfig"),
    "OpenAILLM": ("rcn_fast.llm.openai", "OpenAILLM"),
    "OpenAIConfig": ("rcn_fast.llm.openai", "OpenAIConfig"),
    "VLLMEngine": ("rcn_fast.llm.vllm_engine", "VLLMEngine"),
    "CallCache": ("rcn_fast.llm.cache", "CallCache"),
    "CachedLLM": ("rcn_fast.llm.cache", "CachedLLM"),
    "choice_logprobs": ("rcn_fast.llm.scoring", "choice_logprobs"),
    "choice_logprobs_from_hidden": ("rcn_fast.llm.scoring", "choice_logprobs_from_hidden"),
    "label_token_ids": ("rcn_fast.llm.scoring", "label_token_ids"),
    "LabelScoreError": ("rcn_fast.llm.scoring", "LabelScoreError"),
    "preflight": ("rcn_fast.llm.preflight", "preflight"),
    "PreflightError": ("rcn_fast.llm.preflight", "PreflightError"),
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        mod, attr = _LAZY[name]
        return getattr(importlib.import_module(mod), attr)
    raise AttributeError(f"module 'rcn_fast.llm' has no attribute {name!r}")


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
