"""The OpenAI-compatible HTTP client (vLLM, SGLang, llama.cpp's servers,
``python -m rcn_fast.serve``): the way to scale past one machine.

* :mod:`~rcn_fast.llm.openai.client` -- :class:`OpenAILLM`, the
  :class:`rcn_fast.llm.LLM` over a server;
* :mod:`~rcn_fast.llm.openai.config` -- its settings (:class:`OpenAIConfig`);
* :mod:`~rcn_fast.llm.openai.transport` -- kept-alive connections, retries;
* :mod:`~rcn_fast.llm.openai.dialect` -- request bodies per server family;
* :mod:`~rcn_fast.llm.openai.responses` -- reading the answers;
* :mod:`~rcn_fast.llm.openai.identity` -- what the server says the model is;
* :mod:`~rcn_fast.llm.openai.capabilities` -- what the server can do;
* :mod:`~rcn_fast.llm.openai.scoring` -- label scoring over the wire.
"""

from __future__ import annotations

from rcn_fast._lazy import lazy_exports

_EXPORTS = {
    "OpenAILLM": "rcn_fast.llm.openai.client",
    "ServerError": "rcn_fast.llm.openai.client",
    "load_spec": "rcn_fast.llm.openai.client",
    "OpenAIConfig": "rcn_fast.llm.openai.config",
}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
__all__ = list(_EXPORTS)
