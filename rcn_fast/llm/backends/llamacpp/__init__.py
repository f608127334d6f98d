"""llama.cpp as an in-process backend: ``load_llm(path, engine="llamacpp")``.

Needs ``pip install 'rcn_fast[llamacpp]'`` (llama-cpp-python, imported
only when a model is loaded here).

* :mod:`~rcn_fast.llm.backends.llamacpp.lib` -- llama.cpp's C API as used
  here: model, context, batches with sequence ids, key/value sequence copy;
* :mod:`~rcn_fast.llm.backends.llamacpp.tokenizer` -- llama.cpp's vocabulary
  behind the tokenizer API rcn_fast uses (the template: rcn_fast's door);
* :mod:`~rcn_fast.llm.backends.llamacpp.runner` -- continuous batching over
  sequences, prefix reuse;
* :mod:`~rcn_fast.llm.backends.llamacpp.backend` -- the :class:`~rcn_fast.llm.LLM`.
"""

from __future__ import annotations

from rcn_fast.llm.backends.llamacpp.backend import LlamaCppConfig, LlamaCppLLM
from rcn_fast.llm.backends.llamacpp.lib import HINT, installed

__all__ = ["LlamaCppLLM", "LlamaCppConfig", "HINT", "installed"]
