"""The converted-weights cache of GGUF models.

transformers reads a ``.gguf`` by parsing the file three times (tokenizer,
config, tensors) and dequantising every tensor to float32: tens of seconds
for SmolLM2-135M on a CPU, on every load. The first load of a GGUF file
saves what it produced -- ``config.json``, the tokenizer files and the
float32 weights as ``model.safetensors`` -- under
``<cache root>/gguf/<sha256 of the .gguf>/`` (:func:`rcn_fast._cache_dirs.cache_root`:
``$RCN_FAST_CACHE``, else ``~/.cache/rcn_fast``); later loads read that
folder like any model directory.

Safety and staleness:

* the folder is keyed by the sha256 of the GGUF's bytes
  (:func:`rcn_fast.model_files.file_fingerprint`:
  :func:`rcn_fast._hashing.content_fingerprint`, memoised on the file's
  stats within and across processes), so a changed file gets a new entry;
* ``rcn_fast_gguf.json`` lists every file of the entry with its size and
  sha256, the source file's fingerprint and the transformers version that
  converted it. Before a load every file is checked against it; a missing,
  damaged, extended or differently converted entry is deleted and rebuilt
  (with a warning);
* an entry (or a folder above it) owned by another user or writable by
  group or others is neither read nor written, with one warning
  (:func:`rcn_fast._cache_dirs.trusted_cache`): the file is converted;
* only data is read: safetensors weights, JSON config and tokenizer files
  (``trust_remote_code`` off); an entry holding a pickle or any other file
  the manifest does not list is rejected;
* the tokenizer is read back as it was converted: transformers'
  ``AutoTokenizer`` would pick the class of the entry's model type
  (``Qwen2Tokenizer``...), and such a class rebuilds its own normalizer and
  pre-tokenizer in place of the ones the GGUF reader built from the file's
  ``tokenizer.ggml.pre`` (a Qwen2 file read fresh split text with GPT-2's
  regex when it names no split, read back with Qwen2's regex and NFC: other
  ids). Entries are read with the generic fast tokenizer class, which takes
  ``tokenizer.json`` as written (:func:`read_tokenizer`), and a saved
  tokenizer is read back and compared with the converted one (pipeline,
  special tokens, chat template, the ids of a probe text) before the entry
  is kept, so the first load of a file and every later load give the same
  ids;
* entries are written to a temporary folder and renamed into place, so a
  concurrent or interrupted load never sees half an entry. When the cache
  cannot be written (read-only, disk full) the converted model is used as
  is.

``RCN_FAST_GGUF_CACHE=0`` turns the cache off (every load converts).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import shutil
import uuid
from pathlib import Path
from typing import Any, Callable

from rcn_fast import _arrays as A
from rcn_fast._cache_dirs import trusted_cache
from rcn_fast._hashing import sha256_fd, sha256_file

logger = logging.getLogger(__name__)

#: 2: the tokenizer reloads as converted (format-1 entries named the architecture's class: rebuilt)
CACHE_FORMAT = "rcn_fast-gguf-cache-2"
MANIFEST = "rcn_fast_gguf.json"
ENV = "RCN_FAST_GGUF_CACHE"
# the only files an entry may hold: weights as safetensors, config and tokenizer as JSON/text
_DATA_SUFFIXES = (".safetensors", ".json", ".txt", ".jinja", ".model")

Converter = Callable[[Path, Any], tuple[Any, Any]]


class StaleEntry(Exception):
    """A cache entry that must be rebuilt (the message says why)."""


def cache_enabled() -> bool:
    """False when ``RCN_FAST_GGUF_CACHE`` is 0/false/no/off."""
    return os.environ.get(ENV, "").strip().lower() not in ("0", "false", "no", "off")


def cache_dir_for(sha256: str) -> Path:
    """The entry folder of a GGUF file whose bytes hash to ``sha256``."""
    from rcn_fast._cache_dirs import cache_dir

    if len(sha256) != 64 or any(c not in "0123456789abcdef" for c in sha256):
        raise ValueError(f"sha256: expected 64 lowercase hex digits, got {sha256!r}")
    return cache_dir("gguf") / sha256


def _transformers_version() -> str:
    return str(A.require("transformers", "pip install 'transformers>=5.17'").__version__)


def verify_entry(entry: Path, source_sha256: str) -> dict[str, Any]:
    """Check a cache entry against its manifest.

    Parameters
    ----------
    entry : Path
        The entry folder.
    source_sha256 : str
        sha256 of the GGUF file the entry must come from.

    Returns
    -------
    dict
        The manifest.

    Raises
    ------
    StaleEntry
        The manifest is missing or damaged, names another source file or
        transformers version, or a file is missing, unlisted, of another
        size or checksum, or not a data file.
    """
    from rcn_fast._cache_dirs import stat_problem
    from rcn_fast._files import Folder
    from rcn_fast._stamped_json import read_stamped_json

    try:
        root = Folder(entry, what="cache")
    except OSError as exc:
        raise StaleEntry(f"{entry} cannot be opened ({exc})") from None
    with root:  # every file opened beneath the entry's descriptor, no link followed, judged by its own fstat
        try:
            meta = read_stamped_json(entry / MANIFEST, CACHE_FORMAT, what="a GGUF cache entry", arg="cache", root=root)
        except (OSError, ValueError) as exc:
            raise StaleEntry(str(exc)) from None
        files = meta.get("files")
        source = meta.get("source")
        if not isinstance(files, dict) or not isinstance(source, dict) or not files:
            raise StaleEntry(f"{entry / MANIFEST} lists no files or no source")
        if source.get("sha256") != source_sha256:
            raise StaleEntry(f"{entry} was converted from another file")
        if meta.get("transformers") != _transformers_version():
            raise StaleEntry(f"{entry} was converted by another transformers version, this is "
                             f"{_transformers_version()}")
        present = set(root.listdir()) - {MANIFEST}
        if present != set(files):
            raise StaleEntry(f"{entry} holds {len(present ^ set(files))} file(s) beyond or short of its manifest")
        for name, want in files.items():
            f = entry / name
            if not name.endswith(_DATA_SUFFIXES):
                raise StaleEntry(f"{f} is not a plain data file")
            try:
                fd = root.open_fd(name, links=False)
            except OSError:
                raise StaleEntry(f"{f} is not a plain data file") from None
            try:
                st = os.fstat(fd)
                why = stat_problem(st)
                if why is not None:  # the opened file itself: another user's file in a private entry (issue 53, N7)
                    raise StaleEntry(f"{f} {why}")
                if not isinstance(want, dict) or st.st_size != want.get("size"):
                    raise StaleEntry(f"{f} has another size than its manifest records")
                if sha256_fd(fd) != want.get("sha256"):
                    raise StaleEntry(f"{f} does not match its checksum")
            finally:
                os.close(fd)
    if not any(n.endswith(".safetensors") for n in files) or "config.json" not in files:
        raise StaleEntry(f"{entry} has no config.json or no safetensors weights")
    return meta


def _write_entry(entry: Path, model: Any, tok: Any, source: dict[str, Any], gguf: Path) -> None:
    """Save ``model`` (float32, CPU) and ``tok`` as a verified entry at ``entry``."""
    entry.parent.mkdir(parents=True, exist_ok=True)
    tmp = entry.parent / f".{entry.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        model.save_pretrained(str(tmp), safe_serialization=True)
        _save_tokenizer(tok, tmp)
        bad = [p.name for p in tmp.iterdir() if not p.is_file() or not p.name.endswith(_DATA_SUFFIXES)]
        if bad:
            raise OSError(f"transformers wrote files the cache does not keep: {bad}")
        files = {p.name: {"size": p.stat().st_size, "sha256": sha256_file(p)} for p in sorted(tmp.iterdir())}
        meta = {"format": CACHE_FORMAT, "source": {"file": str(gguf), **source},
                "transformers": _transformers_version(), "files": files}
        (tmp / MANIFEST).write_text(json.dumps(meta, indent=1, sort_keys=True) + "\n", encoding="utf-8")
        try:
            os.rename(tmp, entry)
        except OSError:
            if not (entry / MANIFEST).is_file():  # not a concurrent writer's finished entry
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# a text for the round-trip check of a saved tokenizer: digits, contractions, a decomposed accent (NFC
# would compose it), whitespace runs, CJK and an emoji
_PROBE = "It's 2 + 2 = 4, DON'T 12345!\n\n  cafe\u0301 caf\u00e9\t\t\u4f60\u597d \U0001f600  "


def _save_tokenizer(tok: Any, folder: Path) -> None:
    """Save ``tok`` in ``folder`` so that loading the folder gives the same tokenizer.

    Raises
    ------
    OSError
        The saved tokenizer loads back different from ``tok`` (the message
        says what differs; the entry is not kept).
    """
    tf = A.require("transformers", "pip install 'transformers>=5.17'")
    tok.save_pretrained(str(folder))
    config = folder / "tokenizer_config.json"
    if config.is_file():  # the class the entry is read with (read_tokenizer), not the architecture's
        meta = json.loads(config.read_text(encoding="utf-8"))
        meta["tokenizer_class"] = tf.PreTrainedTokenizerFast.__name__
        config.write_text(json.dumps(meta, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    back = read_tokenizer(folder)
    problem = tokenizer_difference(tok, back)
    if problem is not None:
        raise OSError(f"the converted tokenizer does not load back the same from {folder} ({problem})")


def read_tokenizer(folder: Path) -> Any:
    """The tokenizer saved in ``folder`` (a cache entry) as it was saved:
    transformers' generic fast tokenizer class reading ``tokenizer.json``
    and ``tokenizer_config.json`` (never the class of the model type)."""
    tf = A.require("transformers", "pip install 'transformers>=5.17'")
    return tf.PreTrainedTokenizerFast.from_pretrained(str(folder), trust_remote_code=False)


def tokenizer_difference(a: Any, b: Any) -> str | None:
    """What differs between transformers tokenizers ``a`` and ``b``, or None.

    Compared: the ``tokenizers`` pipeline (``tokenizer.json``: normalizer,
    pre-tokenizer, model, added tokens, post-processor, decoder), the
    special tokens and their ids, the chat template, and the ids of a probe
    text holding every special token, with and without ``add_special_tokens``.
    """
    pipelines = [getattr(t, "backend_tokenizer", None) for t in (a, b)]
    if None not in pipelines:
        texts = [p.to_str() for p in pipelines]  # ~1.5 MB for a 50k vocabulary: parsed only when the texts differ
        if texts[0] != texts[1] and json.loads(texts[0]) != json.loads(texts[1]):
            return "the tokenizer.json pipelines differ"
    for name in ("special_tokens_map", "all_special_tokens", "chat_template", "bos_token_id", "eos_token_id",
                 "pad_token_id", "unk_token_id"):
        if getattr(a, name, None) != getattr(b, name, None):
            return f"{name}: {getattr(a, name, None)!r} != {getattr(b, name, None)!r}"
    probe = _PROBE + "".join(a.all_special_tokens) + _PROBE
    for special in (False, True):
        ids = [t.encode(probe, add_special_tokens=special) for t in (a, b)]
        if ids[0] != ids[1]:
            return f"the ids of a probe text (add_special_tokens={special}): {ids[0]} != {ids[1]}"
    return None


def _load_entry(entry: Path, cfg: Any) -> tuple[Any, Any]:
    tf = A.require("transformers", "pip install 'transformers>=5.17'")
    tok = read_tokenizer(entry)
    model = tf.AutoModelForCausalLM.from_pretrained(
        str(entry), dtype=cfg.resolved_dtype(), attn_implementation=cfg.resolved_attn(),
        use_safetensors=True, trust_remote_code=False,
    )
    return model.to(cfg.resolved_device()).eval(), tok


def load_gguf_cached(path: Path, cfg: Any, convert: Converter) -> tuple[Any, Any]:
    """Model and tokenizer of a GGUF file, from the cache when a verified
    entry exists, else converted by ``convert`` and saved to the cache.

    Parameters
    ----------
    path : Path
        The ``.gguf`` file.
    cfg : rcn_fast.llm.backends.hf.HFConfig
        dtype, device and attention of the returned model.
    convert : callable
        ``convert(path, cfg) -> (model, tokenizer)``: the GGUF reader. It is
        called with ``cfg``'s float32 CPU variant, so the cache keeps exact
        dequantised weights whatever dtype this load asks for.

    Returns
    -------
    (transformers model in eval mode, tokenizer)
    """
    if not cache_enabled():
        return convert(path, cfg)
    from rcn_fast.model_files import file_fingerprint

    source = file_fingerprint(path)
    entry = cache_dir_for(str(source["sha256"]))
    if not trusted_cache(entry, what="GGUF cache"):  # another user could have written it: convert, keep nothing
        return convert(path, cfg)
    if entry.exists():
        try:
            verify_entry(entry, str(source["sha256"]))
            logger.info("GGUF %s: converted weights read from the cache %s", path, entry)
            return _load_entry(entry, cfg)
        except StaleEntry as exc:
            logger.warning("GGUF cache entry %s is stale or damaged (%s); converting %s again", entry, exc, path)
            shutil.rmtree(entry, ignore_errors=True)
    model, tok = convert(path, dataclasses.replace(cfg, dtype="float32", device="cpu"))
    try:
        _write_entry(entry, model, tok, source, path)
        logger.info("GGUF %s: converted weights cached in %s (later loads read them)", path, entry)
    except OSError as exc:
        logger.warning("GGUF %s: converted weights not cached in %s (%s); the next load converts again",
                       path, entry, exc)
    return model.to(cfg.resolved_dtype()).to(cfg.resolved_device()).eval(), tok


def cached_tokenizer(path: Path) -> Any | None:
    """The tokenizer of a GGUF file from a verified cache entry, or None
    (no entry, cache off): saves parsing the GGUF for a tokenizer alone."""
    if not cache_enabled():
        return None
    from rcn_fast.model_files import file_fingerprint

    sha = str(file_fingerprint(path)["sha256"])
    entry = cache_dir_for(sha)
    if not entry.exists() or not trusted_cache(entry, what="GGUF cache"):
        return None
    try:
        verify_entry(entry, sha)
    except StaleEntry:
        return None
    return read_tokenizer(entry)


__all__ = ["load_gguf_cached", "cached_tokenizer", "read_tokenizer", "tokenizer_difference", "verify_entry",
           "cache_dir_for", "cache_enabled", "StaleEntry", "CACHE_FORMAT", "MANIFEST", "ENV"]
