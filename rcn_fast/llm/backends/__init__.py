"""The LLM backends that run a model (every one implements :class:`rcn_fast.llm.LLM`).

* :mod:`~rcn_fast.llm.backends.engine` -- rcn_fast's native GGUF engine on
  the CPU (:class:`~rcn_fast.llm.backends.engine.GGUFLLM`), the default for
  ``.gguf`` files and model packages;
* :mod:`~rcn_fast.llm.backends.hf` -- Hugging Face transformers
  (:class:`~rcn_fast.llm.backends.hf.HFLLM`), any device, GGUF files
  dequantised through :mod:`~rcn_fast.llm.backends.gguf_cache`;
* :mod:`~rcn_fast.llm.backends.vllm_engine` -- vLLM's offline engine in this
  process (GPU);
* :mod:`~rcn_fast.llm.backends.logits` -- the logits processors of the local
  backends' generation.

The OpenAI-compatible client (a model behind a server) is
:mod:`rcn_fast.llm.openai`; :func:`rcn_fast.llm.load_llm` picks a backend
from a model spec.
"""
