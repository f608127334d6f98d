"""A model folder's parts with the fewest imports: its shape (read from
``config.json`` as plain JSON), its tokenizer (the tokenizer class the
folder names, imported on its own) and its safetensors weights.

transformers' ``AutoConfig`` and ``AutoTokenizer`` import the model
registry, which imports torch and the modelling code of every
architecture (torch.distributed, torch._dynamo, scipy...): seconds before
the first text is embedded. A BERT folder (E5, BGE, MiniLM, ...) needs
none of it: its config is a JSON object, and ``AutoTokenizer`` returns
the ``BertTokenizer`` class for it, which imports alone. Any other folder
goes through transformers' Auto classes as before (the same objects,
only a slower start). Nothing here runs code from the folder: it reads
JSON and safetensors only, and every transformers loader gets
``trust_remote_code=False`` (the folder itself was checked by
:func:`rcn_fast.model_files.resolve_model_dir`).
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rcn_fast._arrays import require
from rcn_fast._files import LinkError, Folder, read_bytes, read_text
from rcn_fast.model_files import model_folder_root

logger = logging.getLogger("rcn_fast.retrieval")
TRANSFORMERS_HINT = "pip install 'rcn_fast[torch]' transformers"
#: model_type -> the tokenizer class ``AutoTokenizer`` returns for it (without its "Fast" alias)
DIRECT_TOKENIZERS = {"bert": "BertTokenizer"}
_SHAPE_KEYS = ("hidden_size", "num_hidden_layers", "num_attention_heads")


@dataclass(frozen=True)
class ModelConfig:
    """The shape of a Hugging Face encoder, from its ``config.json``.

    Attributes
    ----------
    model_type : str
        ``"bert"``, ``"xlm-roberta"``, ... (``""`` when the file has none).
    hidden_size, num_hidden_layers, num_attention_heads : int
    intermediate_size : int
        The feed-forward width (4 x hidden_size when the file has none).
    max_position_embeddings : int or None
    raw : dict
        Every key of the file (or of transformers' config, for a folder
        whose file lacks the keys above).
    """

    model_type: str
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    intermediate_size: int
    max_position_embeddings: int | None
    raw: dict[str, Any] = field(repr=False, compare=False)

    def get(self, key: str, default: Any = None) -> Any:
        """A key of ``config.json`` (``default`` when absent)."""
        return self.raw.get(key, default)


def _json_object(model_dir: Path, name: str) -> dict[str, Any]:
    """The JSON object in the file ``name`` of a model folder, read through
    the files door (:mod:`rcn_fast._files`: beneath the folder's
    descriptor, a link leading out of the folder refused)."""
    path = model_dir / name
    try:
        data = json.loads(read_text(model_folder_root(model_dir), path, what="model", limit=64 << 20))
    except LinkError:  # a ValueError naming the link: as it is
        raise
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"model: {path} is not readable JSON ({exc})") from None
    if not isinstance(data, dict):
        raise ValueError(f"model: {path} holds {type(data).__name__}, expected a JSON object")
    return data


def read_model_config(model_dir: str | os.PathLike[str]) -> ModelConfig:
    """The encoder shape in ``model_dir/config.json``.

    Read as JSON; a file that names its sizes otherwise (DistilBERT's
    ``dim``, ``n_layers``...) is read through transformers' ``AutoConfig``
    (``trust_remote_code=False``), which maps those names.

    Raises
    ------
    ValueError
        The file is missing, not a JSON object, or a size is not a
        positive int.
    """
    d = Path(model_dir)
    raw = _json_object(d, "config.json")
    if not all(k in raw for k in _SHAPE_KEYS):
        transformers = require("transformers", TRANSFORMERS_HINT)
        hf = transformers.AutoConfig.from_pretrained(str(d), trust_remote_code=False)
        mapped = {k: getattr(hf, k, None) for k in (*_SHAPE_KEYS, "intermediate_size", "max_position_embeddings")}
        raw = {**raw, **hf.to_dict(), **{k: v for k, v in mapped.items() if v is not None}}
    sizes = {}
    for k in (*_SHAPE_KEYS, "intermediate_size", "max_position_embeddings"):
        v = raw.get(k)
        if v is None and k in ("intermediate_size", "max_position_embeddings"):
            continue
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"model: {d / 'config.json'} has {k}={v!r}, expected a positive int")
        sizes[k] = v
    return ModelConfig(model_type=str(raw.get("model_type") or ""), hidden_size=sizes["hidden_size"],
                       num_hidden_layers=sizes["num_hidden_layers"], num_attention_heads=sizes["num_attention_heads"],
                       intermediate_size=sizes.get("intermediate_size", 4 * sizes["hidden_size"]),
                       max_position_embeddings=sizes.get("max_position_embeddings"), raw=raw)


def _names_direct_class(model_dir: str | os.PathLike[str], config: ModelConfig) -> str | None:
    """The class name of :data:`DIRECT_TOKENIZERS` for this folder where its
    ``tokenizer_config.json`` and ``config.json`` name that class (or no
    class), else None."""
    name = DIRECT_TOKENIZERS.get(config.model_type)
    if name is None:
        return None
    tok_cfg = Path(model_dir) / "tokenizer_config.json"
    named = [_json_object(Path(model_dir), tok_cfg.name).get("tokenizer_class") if tok_cfg.is_file() else None,
             config.get("tokenizer_class")]
    return None if any(n not in (None, name, name + "Fast") for n in named) else name


def direct_tokenizer_class(model_dir: str | os.PathLike[str], config: ModelConfig) -> type | None:
    """The tokenizer class ``AutoTokenizer`` would return for this folder,
    imported alone, or None where only ``AutoTokenizer`` can tell.

    Known for the model types of :data:`DIRECT_TOKENIZERS` whose
    ``tokenizer_config.json`` and ``config.json`` name that class (or no
    class): ``AutoTokenizer`` then returns it (its "Fast" name is an alias
    in transformers 5, the fast class itself in 4).
    """
    name = _names_direct_class(model_dir, config)
    if name is None:
        return None
    import importlib

    package = importlib.import_module(f"transformers.models.{config.model_type.replace('-', '_')}")
    return getattr(package, name + "Fast", None) or getattr(package, name, None)


def load_tokenizer(model_dir: str | os.PathLike[str], config: ModelConfig) -> Any:
    """The folder's tokenizer.

    A BERT-family folder with a ``tokenizer.json`` the direct path
    reproduces: :class:`~rcn_fast.retrieval.encoders.wordpiece_tokenizer.WordPieceTokenizer`
    (the ``tokenizers`` library only: no transformers import; the same ids).
    Else :func:`direct_tokenizer_class` where it is known (no torch, no
    model registry imported), else ``AutoTokenizer.from_pretrained(model_dir,
    trust_remote_code=False)``; the reason for leaving the direct path is
    logged at debug level.
    """
    if _names_direct_class(model_dir, config) is not None:
        from rcn_fast.retrieval.encoders.wordpiece_tokenizer import load_wordpiece_tokenizer

        tok, reason = load_wordpiece_tokenizer(model_dir)
        if tok is not None:
            return tok
        logger.debug("tokenizer: %s is loaded through transformers: %s", model_dir, reason)
    transformers = require("transformers", TRANSFORMERS_HINT)
    cls = direct_tokenizer_class(model_dir, config)
    if cls is not None:
        tok = cls.from_pretrained(str(model_dir))
        if getattr(tok, "is_fast", False):
            return tok
    return transformers.AutoTokenizer.from_pretrained(str(model_dir), trust_remote_code=False)


def weight_files(model_dir: str | os.PathLike[str]) -> list[Path] | None:
    """The folder's safetensors weight files (``model.safetensors``, or
    the shards its ``model.safetensors.index.json`` lists), or None when it
    has none (weights only as ``pytorch_model.bin``: transformers loads
    those)."""
    d = Path(model_dir)
    index = d / "model.safetensors.index.json"
    if index.is_file():
        files = sorted({str(v) for v in (_json_object(d, index.name).get("weight_map") or {}).values()})
        if not files or any(Path(f).name != f for f in files):
            raise ValueError(f"model: {index} lists no weight files, or names outside the folder")
        with Folder(model_folder_root(d), what="model") as root:
            missing = [f for f in files if not root.is_file(d / f)]  # a link out of the folder raises here
        if missing:
            raise ValueError(f"model: {index} lists {missing} which are not in {d}")
        return [d / f for f in files]
    single = d / "model.safetensors"
    with Folder(model_folder_root(d), what="model") as root:
        return [single] if root.is_file(single) else None


def load_weights(files: list[Path], device: Any = "cpu") -> dict[str, Any]:
    """Every tensor of the safetensors ``files`` (of one model folder, as
    :func:`weight_files` lists them; torch tensors on ``device``), by name,
    each read through the files door beneath the model folder (a link out
    of it refused) and parsed from those bytes. safetensors holds tensors
    only: nothing in it executes."""
    st = require("safetensors.torch", "pip install safetensors")
    out: dict[str, Any] = {}
    for f in files:
        f = Path(f)
        for name, t in st.load(read_bytes(model_folder_root(f.parent), f, what="model")).items():
            out[name] = t.to(device) if str(device) != "cpu" else t
    return out


__all__ = ["ModelConfig", "read_model_config", "direct_tokenizer_class", "load_tokenizer", "weight_files",
           "load_weights", "DIRECT_TOKENIZERS"]
