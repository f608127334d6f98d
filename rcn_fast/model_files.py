"""Where a model's files are: one resolver for every component that loads
a Hugging Face model folder (encoders, the NLI model, the retriever
trainer, RR's similarity model).

A model is named by a local directory, an installed model package (its
``model/`` folder or ``get_model_path()``; ``"package:<name>"`` as
:func:`rcn_fast.llm.load_llm` spells it) or a Hugging Face hub id, read
from the local cache, or downloaded into it unless ``HF_HUB_OFFLINE`` /
``TRANSFORMERS_OFFLINE`` is set. :func:`model_fingerprint` identifies a
folder's contents (it keys caches and result files).
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import os
from pathlib import Path

from rcn_fast._arrays import require

# the settings file the retriever trainer writes into a model folder (not part of the fingerprint)
SETTINGS_FILE = "rcn_fast_encoder.json"

_TRUTHY = ("1", "true", "yes", "on")
# files a BERT-family encoder needs from a hub repository (not its ONNX,
# OpenVINO, TF or Flax copies); pytorch_model*.bin only without safetensors
_HUB_PATTERNS = ["*.json", "*.txt", "*.model", "*.safetensors"]
_HUB_BIN_PATTERNS = ["pytorch_model*.bin"]
_HUB_DIRS: dict[str, Path] = {}


def hub_offline() -> bool:
    """True when ``HF_HUB_OFFLINE`` or ``TRANSFORMERS_OFFLINE`` is set (to
    1/true/yes/on): hub ids then resolve from the local cache only."""
    return any(os.environ.get(k, "").strip().lower() in _TRUTHY for k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))


def _hub_snapshot(model: str, local_files_only: bool) -> Path:
    """The local snapshot of hub repo ``model``, downloaded if need be."""
    if model in _HUB_DIRS:
        return _HUB_DIRS[model]
    hub = require("huggingface_hub", "pip install huggingface_hub")
    offline = local_files_only or hub_offline()
    why = ("local_files_only=True" if local_files_only else
           "HF_HUB_OFFLINE/TRANSFORMERS_OFFLINE is set") if offline else ""
    try:
        d = Path(hub.snapshot_download(model, local_files_only=offline, allow_patterns=_HUB_PATTERNS))
        if not any(d.glob("*.safetensors")) and not offline:
            d = Path(hub.snapshot_download(model, allow_patterns=_HUB_PATTERNS + _HUB_BIN_PATTERNS))
    except Exception as exc:
        if offline:
            raise ValueError(
                f"model: {model!r} is not a local directory or an installed model package, and the Hugging Face "
                f"id is not in the local cache while downloads are off ({why}); download it on a machine with "
                f"internet (`huggingface-cli download {model}`), unset the offline variable, or pass a local "
                f"model directory"
            ) from exc
        raise ValueError(
            f"model: {model!r} is not a local directory or an installed model package, and downloading it from "
            f"the Hugging Face hub failed ({type(exc).__name__}: {exc}); check the id and the network, or pass a "
            f"local model directory"
        ) from exc
    if not (d / "config.json").is_file():
        raise ValueError(f"model: the Hugging Face snapshot of {model!r} at {d} has no config.json "
                         "(not a transformers model repository)")
    _HUB_DIRS[model] = d
    return d


def resolve_model_dir(model: str, *, local_files_only: bool = False) -> Path:
    """A local directory holding ``config.json`` for ``model``.

    Parameters
    ----------
    model : str
        A directory; an installed model package (its ``model/`` folder or
        ``get_model_path()``; by distribution or module name, optionally
        written ``"package:<name>"`` as :func:`rcn_fast.llm.load_llm` spells
        it); or a Hugging Face hub id (``"owner/name"``), taken from the
        local cache or downloaded into it (config, tokenizer and weight
        files only).
    local_files_only : bool
        Never download. Also implied by ``HF_HUB_OFFLINE=1`` or
        ``TRANSFORMERS_OFFLINE=1``; then an uncached hub id is an error
        saying so.

    Returns
    -------
    pathlib.Path
        The resolved model directory.
    """
    model = str(model)
    if model.startswith("package:"):
        model = model[len("package:"):]
        if not model.replace("-", "_").isidentifier():
            raise ValueError(f"model: 'package:' must be followed by a package name, got {model!r}")
    p = Path(model).expanduser()
    if p.is_dir():
        if not (p / "config.json").is_file():
            raise ValueError(f"model: directory {p} has no config.json (not a Hugging Face model directory)")
        return p.resolve()
    mod_name = model.replace("-", "_")
    if mod_name.isidentifier() and importlib.util.find_spec(mod_name) is not None:
        mod = importlib.import_module(mod_name)
        if hasattr(mod, "get_model_path"):
            d = Path(mod.get_model_path())
        else:
            d = Path(mod.__file__).parent / "model"
        if (d / "config.json").is_file():
            return d.resolve()
        raise ValueError(f"model: package {mod_name} is installed but holds no model directory with config.json")
    if model.count("/") == 1 and not p.exists() and all(model.split("/")):
        return _hub_snapshot(model, local_files_only)
    raise ValueError(f"model: {model!r} is not a directory, an installed model package, or a Hugging Face id "
                     "('owner/name')")


_FP_CACHE: dict[tuple, str] = {}


def model_fingerprint(model_dir: str | os.PathLike[str]) -> str:
    """sha256 over the model's config, tokenizer files and weights (hex).

    Memoised per process on (path, size, mtime) of the files.
    """
    d = Path(model_dir)
    names = sorted(
        f.name for f in d.iterdir()
        if f.is_file() and (f.suffix in (".json", ".txt", ".model", ".safetensors", ".bin")
                            and not f.name.startswith(".") and f.name != SETTINGS_FILE)
    )
    stat_key = tuple((n, (d / n).stat().st_size, (d / n).stat().st_mtime_ns) for n in names)
    key = (str(d.resolve()), stat_key)
    if key in _FP_CACHE:
        return _FP_CACHE[key]
    h = hashlib.sha256()
    for n in names:
        h.update(n.encode() + b"\0")
        with open(d / n, "rb") as f:
            for block in iter(lambda: f.read(1 << 22), b""):
                h.update(block)
    _FP_CACHE[key] = h.hexdigest()
    return _FP_CACHE[key]


__all__ = ["resolve_model_dir", "model_fingerprint", "hub_offline", "SETTINGS_FILE"]
