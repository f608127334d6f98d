"""A BERT-family (WordPiece) folder's tokenizer read with the ``tokenizers``
library alone: no ``transformers`` import.

Why: ``import transformers`` (5.x) scans every model file to build its lazy
import table, and its tokenizer base imports more: seconds before a corpus
build's first batch, for a tokenizer that is a ``tokenizer.json`` run by
the Rust ``tokenizers`` library anyway. For a BERT folder transformers'
``BertTokenizer`` runs that file's pipeline as it is (normaliser with its
lower-casing, pre-tokeniser, WordPiece model, the ``[CLS] ... [SEP]``
post-processor); this module does the same and adds what the wrapper adds
at call time: truncation to the caller's ``max_length`` (right side),
no padding, the pad token from ``tokenizer_config.json`` /
``special_tokens_map.json`` and ``model_max_length``.

Only folders whose files say nothing the direct path cannot reproduce
take it (:func:`direct_wordpiece_reason` names what sends a folder back
to transformers): a ``tokenizer.json`` with a WordPiece model, a
``tokenizer_config.json`` with only known keys, whose lower-casing,
accent and CJK settings agree with the file's normaliser, right
truncation and padding sides, and special tokens present in the
vocabulary. Every file is read through the files door
(:func:`rcn_fast._files.read_bytes`, by handle); nothing here runs code from the folder.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from rcn_fast._files import LinkError, read_bytes
from rcn_fast.model_files import model_folder_root

#: tokenizer_config.json keys the direct path reproduces (others send the folder to transformers)
KNOWN_CONFIG_KEYS = frozenset({
    "do_lower_case", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token", "tokenize_chinese_chars",
    "strip_accents", "name_or_path", "do_basic_tokenize", "never_split", "tokenizer_class", "model_max_length",
    "backend", "added_tokens_decoder", "clean_up_tokenization_spaces", "extra_special_tokens",
    "special_tokens_map_file", "truncation_side", "padding_side", "model_input_names", "max_length", "stride",
    "truncation_strategy", "pad_to_multiple_of", "pad_token_type_id", "additional_special_tokens", "full_tokenizer_file",
})
#: BertTokenizer's special tokens where the folder names none
BERT_DEFAULTS = {"unk_token": "[UNK]", "sep_token": "[SEP]", "pad_token": "[PAD]", "cls_token": "[CLS]",
                 "mask_token": "[MASK]"}
#: transformers' "no limit" model_max_length (int(1e30))
VERY_LARGE_INTEGER = int(1e30)


def _read(model_dir: Path, name: str) -> bytes | None:
    """The bytes of ``model_dir/name`` through the files door, None where
    the file is absent (a link out of the folder raises)."""
    path = model_dir / name
    try:
        return read_bytes(model_folder_root(model_dir), path, what="model", limit=256 << 20)
    except LinkError:
        raise
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as exc:
        raise ValueError(f"model: {path} is not readable ({exc})") from None


def _json_object(raw: bytes, path: Path) -> dict[str, Any]:
    """The JSON object in the bytes ``raw`` of the file ``path``."""
    try:
        data = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"model: {path} is not readable JSON ({exc})") from None
    if not isinstance(data, dict):
        raise ValueError(f"model: {path} holds {type(data).__name__}, expected a JSON object")
    return data


def _json(model_dir: Path, name: str) -> dict[str, Any] | None:
    raw = _read(model_dir, name)
    return None if raw is None else _json_object(raw, model_dir / name)


def _token_text(value: Any) -> str | None:
    """A special token as tokenizer_config.json writes it (a string or an
    AddedToken object)."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def _bert_normalizer(spec: Any) -> dict[str, Any] | None:
    """The file's BertNormalizer (alone or the only one in a Sequence)."""
    if isinstance(spec, dict) and spec.get("type") == "Sequence":
        found = [n for n in spec.get("normalizers") or [] if isinstance(n, dict) and n.get("type") == "BertNormalizer"]
        return found[0] if len(found) == 1 else None
    return spec if isinstance(spec, dict) and spec.get("type") == "BertNormalizer" else None


def direct_wordpiece_reason(file: dict[str, Any], config: dict[str, Any], specials: dict[str, Any]) -> str | None:
    """Why this folder's tokenizer cannot be read directly (None: it can).

    Parameters
    ----------
    file : dict
        ``tokenizer.json``.
    config : dict
        ``tokenizer_config.json`` (``{}`` where absent).
    specials : dict
        ``special_tokens_map.json`` (``{}`` where absent).
    """
    model = file.get("model") or {}
    if not isinstance(model, dict) or model.get("type") != "WordPiece":
        return f"tokenizer.json has a {model.get('type') if isinstance(model, dict) else model!r} model, not WordPiece"
    unknown = sorted(set(config) - KNOWN_CONFIG_KEYS)
    if unknown:
        return f"tokenizer_config.json sets {unknown}, which only transformers applies"
    for side in ("truncation_side", "padding_side"):
        if config.get(side, "right") != "right":
            return f"tokenizer_config.json sets {side}={config[side]!r}"
    if config.get("additional_special_tokens") or specials.get("additional_special_tokens"):
        return "the folder names additional special tokens"
    if config.get("do_basic_tokenize") is False or config.get("never_split"):
        return "tokenizer_config.json changes BERT's basic tokenisation (do_basic_tokenize/never_split)"
    norm = _bert_normalizer(file.get("normalizer"))
    if norm is None:
        return "tokenizer.json has no single BertNormalizer"
    # transformers 5 BertTokenizer rebuilds nothing from these keys, but a disagreement means the folder's
    # files were written by different tokenizers: let transformers decide
    for key, nkey in (("do_lower_case", "lowercase"), ("tokenize_chinese_chars", "handle_chinese_chars"),
                      ("strip_accents", "strip_accents")):
        if key in config and config[key] != norm.get(nkey):
            return f"tokenizer_config.json has {key}={config[key]!r} but tokenizer.json's normalizer {nkey}={norm.get(nkey)!r}"
    vocab = model.get("vocab") or {}
    for key, default in BERT_DEFAULTS.items():
        text = _token_text(config.get(key, specials.get(key, default)))
        if text is None or text not in vocab:
            return f"the special token {key}={text!r} is not in the vocabulary"
    return None


class WordPieceTokenizer:
    """A WordPiece folder's ``tokenizer.json``, run as transformers'
    ``BertTokenizer`` runs it (the subset the encoders use).

    Attributes
    ----------
    backend_tokenizer : tokenizers.Tokenizer
        The file's pipeline, truncation and padding off.
    pad_token_id : int
    model_max_length : int
        From ``tokenizer_config.json`` (int(1e30) where absent, as transformers).
    truncation_side, padding_side : str
        ``"right"``.
    is_fast : bool
        True (the Rust tokenizer runs it).
    name_or_path : str
    """

    is_fast = True
    truncation_side = "right"
    padding_side = "right"

    def __init__(self, backend: Any, *, pad_token: str, model_max_length: int, name_or_path: str) -> None:
        self.backend_tokenizer = backend
        self.pad_token = pad_token
        self.pad_token_id = backend.token_to_id(pad_token)
        self.model_max_length = model_max_length
        self.name_or_path = name_or_path

    def __repr__(self) -> str:
        return f"WordPieceTokenizer({self.name_or_path!r}, model_max_length={self.model_max_length})"

    def __call__(self, texts: str | list[str], *, truncation: bool = False, max_length: int | None = None,
                 padding: bool = False, add_special_tokens: bool = True, return_attention_mask: bool = True,
                 return_token_type_ids: bool = True) -> dict[str, Any]:
        """Token ids of ``texts`` as ``BertTokenizer(texts, ...)`` gives them
        (unpadded lists; ``padding`` must be False).

        Parameters
        ----------
        texts : str or list of str
        truncation : bool
            Truncate (right side) to ``max_length`` (``model_max_length``
            where None).
        max_length : int, optional
        padding : bool
            Only False.
        add_special_tokens, return_attention_mask, return_token_type_ids : bool

        Returns
        -------
        dict
            ``input_ids`` (and ``attention_mask``, ``token_type_ids``): a
            list of int lists for a list of texts, an int list for one text.
        """
        if padding:
            raise ValueError("padding: the direct WordPiece tokenizer returns unpadded lists; pass padding=False")
        one = isinstance(texts, str)
        batch = [texts] if one else list(texts)
        if not all(isinstance(t, str) for t in batch):
            raise TypeError("texts: expected a str or a list of str")
        tok = self.backend_tokenizer
        if truncation:
            limit = self.model_max_length if max_length is None else max_length
            if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
                raise ValueError(f"max_length: expected a positive int, got {limit!r}")
            tok = _truncating(tok, limit)
        enc = tok.encode_batch(batch, add_special_tokens=add_special_tokens)
        out: dict[str, Any] = {"input_ids": [e.ids for e in enc]}
        if return_token_type_ids:
            out["token_type_ids"] = [e.type_ids for e in enc]
        if return_attention_mask:
            out["attention_mask"] = [e.attention_mask for e in enc]
        return {k: v[0] for k, v in out.items()} if one else out

    def decode(self, ids: list[int], *, skip_special_tokens: bool = False) -> str:
        """The text of ``ids`` (the file's decoder)."""
        return self.backend_tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens)


def _truncating(backend: Any, max_length: int) -> Any:
    """A copy of ``backend`` that truncates on the right at ``max_length``
    (a copy: the shared one stays untouched across threads)."""
    from tokenizers import Tokenizer

    copy = Tokenizer.from_str(backend.to_str())
    copy.enable_truncation(max_length, stride=0, strategy="longest_first", direction="right")
    return copy


def load_wordpiece_tokenizer(model_dir: str | os.PathLike[str]) -> tuple[WordPieceTokenizer | None, str]:
    """The folder's tokenizer read directly, or ``(None, reason)`` where
    transformers must load it (:func:`direct_wordpiece_reason`, or no
    ``tokenizer.json``, or no ``tokenizers`` library)."""
    d = Path(model_dir)
    raw = _read(d, "tokenizer.json")
    if raw is None:
        return None, "the folder has no tokenizer.json (a slow-only tokenizer)"
    try:
        from tokenizers import Tokenizer
    except ImportError:
        return None, "the tokenizers library is not installed"
    file = _json_object(raw, d / "tokenizer.json")
    config = _json(d, "tokenizer_config.json") or {}
    specials = _json(d, "special_tokens_map.json") or {}
    reason = direct_wordpiece_reason(file, config, specials)
    if reason is not None:
        return None, reason
    backend = Tokenizer.from_str(raw.decode("utf-8"))
    backend.no_truncation()
    backend.no_padding()
    limit = config.get("model_max_length", VERY_LARGE_INTEGER)
    if isinstance(limit, float) and limit >= VERY_LARGE_INTEGER:
        limit = VERY_LARGE_INTEGER
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        return None, f"tokenizer_config.json has model_max_length={limit!r}"
    pad = _token_text(config.get("pad_token", specials.get("pad_token", BERT_DEFAULTS["pad_token"])))
    return WordPieceTokenizer(backend, pad_token=str(pad), model_max_length=limit, name_or_path=str(d)), ""


__all__ = ["WordPieceTokenizer", "load_wordpiece_tokenizer", "direct_wordpiece_reason", "KNOWN_CONFIG_KEYS"]
