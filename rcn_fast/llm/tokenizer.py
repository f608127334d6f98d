"""Model specs to files, and the tokenizer alone: what the local backend
(:mod:`rcn_fast.llm.load`) and the OpenAI-compatible client (rendering
chats client-side, :mod:`rcn_fast.llm.openai.client`) both need."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rcn_fast import _arrays as A
from rcn_fast.llm.backends.hf import HINT


def resolve_spec(spec: str) -> Path:
    """A model directory or .gguf file for ``spec`` (a directory, .gguf
    file, ``package:<module>`` or hub id), resolved as every rcn_fast
    component resolves models (:func:`rcn_fast.model_files.resolve_model_path`)."""
    from rcn_fast.model_files import resolve_model_path

    try:
        return resolve_model_path(spec, allow_gguf=True)
    except ValueError as exc:
        raise ValueError(f"spec: {exc}".replace("spec: model: ", "spec: ")) from None


def load_tokenizer(spec: str) -> Any:
    """Only the tokenizer of a model directory, ``.gguf`` file,
    ``package:<module>`` or hub id (used to render chats client-side)."""
    from rcn_fast.model_files import refuse_remote_code

    tf = A.require("transformers", HINT)
    if not isinstance(spec, str) or not spec:
        raise TypeError(f"tokenizer: expected a path or hub id, got {spec!r}")
    given = Path(spec).expanduser()
    # a folder holding only tokenizer files (no config.json) is a tokenizer too
    path = given if given.is_dir() else resolve_spec(spec)
    if path.is_file():  # a .gguf file (its converted copy when cached), checked first by the strict reader
        from rcn_fast.llm.backends.engine.gguf_file import GGUFFile
        from rcn_fast.llm.backends.gguf_cache import cached_tokenizer

        GGUFFile(path)

        cached = cached_tokenizer(path)
        return cached if cached is not None else tf.AutoTokenizer.from_pretrained(
            str(path.parent), gguf_file=path.name, trust_remote_code=False)
    refuse_remote_code(path)  # a tokenizer-only folder is checked too
    return tf.AutoTokenizer.from_pretrained(str(path), trust_remote_code=False)


__all__ = ["resolve_spec", "load_tokenizer"]
