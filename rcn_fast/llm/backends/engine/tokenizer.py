"""The tokenizer and chat template of a GGUF file, without transformers.

:class:`GGUFTokenizer` builds a `tokenizers` (Rust) BPE tokenizer from the
file's ``tokenizer.ggml.*`` arrays the way transformers' GGUF reader does
(so both give the same ids: tests/llm/test_engine_smollm2.py checks it on
the chat templates and texts the pipelines use), and renders the chat
template through the bounded template door (:mod:`rcn_fast._templates`,
configured as transformers configures chat templates). It offers the part of the transformers tokenizer API that rcn_fast
uses (``encode``, ``decode``, ``apply_chat_template``, ``get_vocab``,
``convert_tokens_to_ids``, the special tokens), so chat rendering
(:mod:`rcn_fast.llm.chat`) and label ids (:mod:`rcn_fast.llm.scoring.labels`) work
on it unchanged.

Supported: byte-level BPE vocabularies (``tokenizer.ggml.model == "gpt2"``:
Llama 3, SmolLM, Qwen2, Mistral-Nemo, ...), with the pre-tokenizer split
of the file's ``tokenizer.ggml.pre`` where transformers knows one, else
GPT-2's whatever the architecture, as transformers' GGUF reader does
(``gpt-2`` names GPT-2's split in llama.cpp too; a file without
``tokenizer.ggml.pre`` is one llama.cpp reads with its own "default" split
and a warning that generation quality will be degraded). Other
vocabularies (SentencePiece ``"llama"``) raise
:class:`~rcn_fast.llm.backends.engine.UnsupportedModel` when the
:class:`GGUFTokenizer` is made (``load_llm`` names a backend that runs
them). A malformed vocabulary is a
:class:`~rcn_fast.llm.backends.engine.GGUFError` naming the file, for
every backend (:func:`check_vocabulary_format`, which the llama.cpp
backend runs too): no tokens; special ids outside the vocabulary or not
ints; no end-of-sequence id (a generation could never end); token types of
another length; a byte-level BPE vocabulary without merges (absent, as
llama.cpp refuses it, or empty: every text would be split into bytes), with
more merges than its tokens can form distinct ones (refused from the
array's length, before a merge is parsed), or with a merge listed twice
(:func:`check_merges`: ``tokenizers`` would rank it by its second place,
llama.cpp by its first); and, when the vocabulary is built, a merge that is
not two tokens of the vocabulary joined by one space.

Building from the GGUF arrays takes ~0.3 s for a 50k vocabulary, reading
a ``tokenizer.json`` ~0.15 s: the built tokenizer is cached as
``<cache root>/gguf-tokenizers/<sha256 of the file's header>/tokenizer.json``
(the header holds the whole vocabulary, merges, special tokens and
template, so the key is exact), with a manifest recording the tokenizers
version, the builder's version and the file's size and checksum; an entry that fails these checks
is rebuilt, one that cannot be written is skipped, one in a cache another
user owns or could write is neither read nor replaced (one warning:
:func:`rcn_fast._cache_dirs.trusted_cache`) (``RCN_FAST_GGUF_CACHE=0``
turns the cache off). :class:`GGUFTokenizer` builds or reads it on a
background thread; the engine waits for it (:meth:`GGUFTokenizer.wait`) at
the end of its load, so a vocabulary that cannot be built fails the load,
not the first question.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import threading
import uuid
from functools import lru_cache
from pathlib import Path
from typing import Any, Sequence

from rcn_fast import _arrays as A
from rcn_fast.llm.backends.engine.architecture import UnsupportedModel, unsupported
from rcn_fast.llm.backends.engine.gguf_file import GGUFError, GGUFFile

HINT = "pip install 'rcn_fast[llm]' (tokenizers, jinja2)"
CACHE_FORMAT = "rcn_fast-gguf-tokenizer-1"
#: bumped when build_backend builds or checks differently (an entry of another version is rebuilt, and so checked:
#: 4 refuses repeated merges, which entries of 3 were built from)
BUILD_VERSION = 4
logger = logging.getLogger(__name__)

# GGUF token types
_CONTROL, _USER_DEFINED = 3, 4

_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
#: tokenizer.ggml.pre -> the split regex (as transformers' GGUF reader maps them; others: GPT-2's byte-level regex)
PRE_TOKENIZER_SPLITS = {
    "llama3": _LLAMA3_SPLIT, "llama-v3": _LLAMA3_SPLIT, "llama-bpe": _LLAMA3_SPLIT, "falcon3": _LLAMA3_SPLIT,
    "smaug-bpe": _LLAMA3_SPLIT, "dbrx": _LLAMA3_SPLIT, "pixtral": _LLAMA3_SPLIT,
    "qwen2": _QWEN2_SPLIT, "deepseek-r1-qwen": _QWEN2_SPLIT,
}


@lru_cache(maxsize=1)
def _byte_alphabet() -> dict[int, str]:
    """GPT-2's byte -> printable character map (bytes_to_unicode)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


#: the special-token ids a file may name: name -> its key (as llama.cpp's converter writes and its loader reads them)
SPECIAL_IDS = {"bos": "tokenizer.ggml.bos_token_id", "eos": "tokenizer.ggml.eos_token_id",
               "unk": "tokenizer.ggml.unknown_token_id", "pad": "tokenizer.ggml.padding_token_id"}


def special_ids(g: GGUFFile) -> dict[str, int | None]:
    """The special-token ids the file names (:data:`SPECIAL_IDS`), None where absent."""
    return {name: g.meta(key, "int", None) for name, key in SPECIAL_IDS.items()}


def check_vocabulary_format(g: GGUFFile) -> int:
    """What every backend requires of a vocabulary, checked at load from the
    metadata's types and lengths alone (no long array is parsed; module
    notes). Returns the number of tokens.

    Raises
    ------
    GGUFError
        No tokens, a key of the wrong type, a special id outside the
        vocabulary, no end-of-sequence id, token types of another length, a
        byte-level BPE vocabulary without merges or with more than its
        tokens can form.
    """
    n = g.array_length("tokenizer.ggml.tokens", "str[]")
    if not n:
        raise GGUFError(f"{g.path}: holds no tokenizer (tokenizer.ggml.tokens is {'empty' if n == 0 else 'missing'})")
    for name, i in special_ids(g).items():
        if i is not None and not 0 <= i < n:
            raise GGUFError(f"{g.path}: {SPECIAL_IDS[name]} is {i}, outside the vocabulary of {n} tokens")
    if g.meta("tokenizer.ggml.eos_token_id", "int", None) is None:
        raise GGUFError(f"{g.path}: tokenizer.ggml.eos_token_id is missing: the vocabulary names no end-of-sequence "
                        f"token, so a generation could never end (and nothing could pad a batch)")
    types = g.array_length("tokenizer.ggml.token_type", "int[]")
    if types is not None and types != n:
        raise GGUFError(f"{g.path}: tokenizer.ggml.token_type has {types} entries for {n} tokens")
    g.meta("tokenizer.ggml.add_bos_token", "bool", None)
    g.meta("tokenizer.ggml.pre", "str", None)
    g.meta("tokenizer.chat_template", "str", None)
    if g.meta("tokenizer.ggml.model", "str", None) == "gpt2":
        merges = g.array_length("tokenizer.ggml.merges", "str[]")
        if not merges:
            raise GGUFError(f"{g.path}: a byte-level BPE vocabulary without merges (tokenizer.ggml.merges is "
                            f"{'empty' if merges == 0 else 'missing'}): every text would be split into single bytes")
        # a merge joins two tokens into a third; a token of c characters is the result of at most c - 1
        # distinct merges, and c <= its UTF-8 bytes: bytes of the token array - 8 per length - 1 per token
        most = max(0, (g.array_nbytes("tokenizer.ggml.tokens", "str[]") or 0) - 9 * n)
        if merges > most:
            raise GGUFError(f"{g.path}: tokenizer.ggml.merges has {merges} entries, more than the {most} distinct "
                            f"merges {n} tokens can form (merges repeated, or of no token)")
    return n


def check_vocabulary(g: GGUFFile) -> int:
    """:func:`check_vocabulary_format`, and a vocabulary the native engine
    builds (byte-level BPE). Returns the number of tokens.

    Raises
    ------
    GGUFError
        As :func:`check_vocabulary_format`.
    UnsupportedModel
        Not a byte-level BPE vocabulary (the native engine does not build
        those; llama.cpp and transformers may).
    """
    n = check_vocabulary_format(g)
    kind = g.meta("tokenizer.ggml.model", "str", None)
    if kind != "gpt2":
        raise unsupported(g, f"tokenizer.ggml.model {kind!r} (the native engine builds byte-level BPE 'gpt2' "
                             f"vocabularies only)")
    return n


def check_merges(g: GGUFFile) -> list[str]:
    """The merges of a byte-level BPE vocabulary, each listed once (their
    count already bounded by :func:`check_vocabulary_format`).

    Raises
    ------
    GGUFError
        A merge listed twice (naming both places).
    """
    merges = g.meta("tokenizer.ggml.merges", "str[]")
    if len(set(merges)) != len(merges):
        first: dict[str, int] = {}
        for i, m in enumerate(merges):
            if m in first:
                raise GGUFError(f"{g.path}: tokenizer.ggml.merges[{i}] {m[:80]!r} repeats merges[{first[m]}] (a merge "
                                f"is listed once: its place is its rank)")
            first[m] = i
    return merges


def _check_merges(g: GGUFFile, merges: list[str], vocab: dict[str, int]) -> list[tuple[str, str]]:
    """The merges as pairs; each must be two tokens of the vocabulary joined
    by one space whose concatenation is a token too (as ``tokenizers``
    requires)."""
    pairs = []
    for i, m in enumerate(merges):
        a, sep, b = m.partition(" ")
        if not sep or not a or not b or " " in b:
            raise GGUFError(f"{g.path}: tokenizer.ggml.merges[{i}] {m[:80]!r} is not two tokens joined by one space")
        for t in (a, b, a + b):
            if t not in vocab:
                raise GGUFError(f"{g.path}: tokenizer.ggml.merges[{i}] {m[:80]!r}: {t[:80]!r} is not a token of the "
                                f"vocabulary")
        pairs.append((a, b))
    return pairs


def build_backend(g: GGUFFile) -> Any:
    """A ``tokenizers.Tokenizer`` for the vocabulary of GGUF file ``g``.

    Raises
    ------
    UnsupportedModel
        Not a byte-level BPE vocabulary (:func:`check_vocabulary`).
    GGUFError
        A vocabulary that cannot be built (malformed merges, bad ids).
    """
    tk = A.require("tokenizers", HINT)
    check_vocabulary(g)
    tokens = g.meta("tokenizer.ggml.tokens", "str[]")
    types = g.meta("tokenizer.ggml.token_type", "int[]", None)
    spelling = _byte_alphabet()
    alphabet = set(spelling.values())
    vocab = {}
    for i, t in enumerate(tokens):
        vocab[t if set(t) <= alphabet else "".join(spelling[b] for b in t.encode("utf-8"))] = i
    merges = _check_merges(g, check_merges(g), vocab)
    bpe = tk.models.BPE(vocab=vocab, merges=merges, continuing_subword_prefix="",
                        end_of_word_suffix="", fuse_unk=False, byte_fallback=False)
    tok = tk.Tokenizer(bpe)
    split = PRE_TOKENIZER_SPLITS.get(g.meta("tokenizer.ggml.pre", "str", None))
    if split is None:
        tok.pre_tokenizer = tk.pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True)
    else:
        tok.pre_tokenizer = tk.pre_tokenizers.Sequence([
            tk.pre_tokenizers.Split(tk.Regex(split), behavior="isolated"),
            tk.pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ])
    tok.decoder = tk.decoders.ByteLevel()
    bos = g.meta("tokenizer.ggml.bos_token_id", "int", None)
    if g.meta("tokenizer.ggml.add_bos_token", "bool", None) is True and bos is not None:
        tok.post_processor = tk.processors.TemplateProcessing(single=f"{tokens[bos]} $A", pair=f"{tokens[bos]} $A $B",
                                                              special_tokens=[(tokens[bos], int(bos))])
    if types is not None:
        control = [tk.AddedToken(t, normalized=False, special=True)
                   for t, ty in zip(tokens, types) if ty == _CONTROL and set(t) <= alphabet]
        if control:
            tok.add_special_tokens(control)
        user = [tk.AddedToken(t, normalized=False, special=False)
                for t, ty in zip(tokens, types) if ty == _USER_DEFINED and t in vocab]
        if user:
            tok.add_tokens(user)
    return tok


def cache_dir() -> Path | None:
    """The folder of the tokenizer cache, or None when ``RCN_FAST_GGUF_CACHE`` turns it off."""
    from rcn_fast._cache_dirs import cache_dir as folder
    from rcn_fast.llm.backends.gguf_cache import cache_enabled

    return folder("gguf-tokenizers") if cache_enabled() else None


def _read_cached(entry: Path, source: str) -> Any | None:
    """The cached tokenizer in ``entry``, or None when absent or failing its checks."""
    from rcn_fast._hashing import sha256_file
    from rcn_fast._stamped_json import read_stamped_json

    tk = A.require("tokenizers", HINT)
    f = entry / "tokenizer.json"
    try:
        meta = read_stamped_json(entry / "manifest.json", CACHE_FORMAT, what="a GGUF tokenizer cache entry")
        ok = (meta.get("source_header_sha256") == source and meta.get("tokenizers") == tk.__version__
              and meta.get("build") == BUILD_VERSION
              and f.is_file() and not f.is_symlink() and f.stat().st_size == meta.get("size")
              and sha256_file(f) == meta.get("sha256"))
        if ok:
            return tk.Tokenizer.from_file(str(f))
    except Exception as exc:  # noqa: BLE001 -- a damaged entry of any kind (tokenizers raises plain Exception) is rebuilt
        logger.warning("GGUF tokenizer cache entry %s is damaged (%s); rebuilding it", entry, exc)
        return None
    logger.warning("GGUF tokenizer cache entry %s is stale; rebuilding it", entry)
    return None


def _write_cached(entry: Path, source: str, tok: Any) -> None:
    """Save ``tok`` as a verified entry (written aside, then renamed into place)."""
    from rcn_fast._hashing import sha256_file

    tk = A.require("tokenizers", HINT)
    entry.parent.mkdir(parents=True, exist_ok=True)
    tmp = entry.parent / f".{entry.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        tmp.mkdir()
        f = tmp / "tokenizer.json"
        tok.save(str(f))
        meta = {"format": CACHE_FORMAT, "source_header_sha256": source, "tokenizers": tk.__version__, "build": BUILD_VERSION,
                "size": f.stat().st_size, "sha256": sha256_file(f)}
        (tmp / "manifest.json").write_text(json.dumps(meta, indent=1) + "\n", encoding="utf-8")
        shutil.rmtree(entry, ignore_errors=True)
        try:
            os.rename(tmp, entry)
        except OSError:
            if not (entry / "manifest.json").is_file():  # not a concurrent writer's finished entry
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def cached_backend(g: GGUFFile, folder: Path | None) -> Any:
    """:func:`build_backend` through the tokenizer cache in ``folder``
    (module notes; None: no cache). An entry another user owns or could
    write is neither read nor replaced
    (:func:`rcn_fast._cache_dirs.trusted_cache`)."""
    from rcn_fast._cache_dirs import trusted_cache

    if folder is None:
        return build_backend(g)
    source = hashlib.sha256(g.header_bytes()).hexdigest()
    entry = folder / source
    if not trusted_cache(entry, what="GGUF tokenizer cache"):  # another user could have written it: not read
        return build_backend(g)
    if entry.exists():
        tok = _read_cached(entry, source)
        if tok is not None:
            return tok
    tok = build_backend(g)
    try:
        _write_cached(entry, source, tok)
    except OSError as exc:
        logger.warning("GGUF tokenizer of %s not cached in %s (%s)", g.path, entry, exc)
    return tok


class SpecialTokens:
    """The special tokens of a GGUF vocabulary as transformers names them:
    a subclass sets ``_ids`` (:func:`special_ids`) and implements
    ``_token(name)``, the text of that special token or None."""

    _ids: dict[str, int | None]

    def _token(self, name: str) -> str | None:
        raise NotImplementedError

    @property
    def eos_token_id(self) -> int | None:
        return self._ids["eos"]

    @property
    def bos_token_id(self) -> int | None:
        return self._ids["bos"]

    @property
    def pad_token_id(self) -> int | None:
        return self._ids["pad"] if self._ids["pad"] is not None else self._ids["eos"]

    @property
    def eos_token(self) -> str | None:
        return self._token("eos")

    @property
    def bos_token(self) -> str | None:
        return self._token("bos")

    @property
    def special_tokens_map(self) -> dict[str, str]:
        names = {"bos": "bos_token", "eos": "eos_token", "unk": "unk_token", "pad": "pad_token"}
        return {v: t for k, v in names.items() if (t := self._token(k)) is not None}


class GGUFTokenizer(SpecialTokens):
    """The tokenizer of a GGUF file (the transformers API subset rcn_fast uses).

    Parameters
    ----------
    g : GGUFFile
    background : bool
        Build the vocabulary on a background thread (:meth:`wait`, or the first use, waits).

    Raises
    ------
    UnsupportedModel
        A vocabulary the engine cannot run (:func:`check_vocabulary`),
        refused here, before any background work.
    GGUFError
        A malformed vocabulary (:func:`check_vocabulary`); what only the
        build finds (malformed merges) is raised by :meth:`wait`.
    """

    def __init__(self, g: GGUFFile, *, background: bool = True) -> None:
        self.path = g.path
        #: tokens of the vocabulary
        self.n_tokens = check_vocabulary(g)
        self.chat_template: str | None = g.meta("tokenizer.chat_template", "str", None)
        self._ids = special_ids(g)
        self._backend: Any = None
        self._error: BaseException | None = None
        self._done = threading.Event()
        self._g = g
        self._cache = cache_dir()  # read here: the environment of the caller, not of the thread's start
        if background:
            threading.Thread(target=self._build, name="rcn_fast-gguf-tokenizer", daemon=True).start()
        else:
            self._build()

    def _build(self) -> None:
        try:
            self._backend = cached_backend(self._g, self._cache)
            self._special = {n: (self._backend.id_to_token(i) if i is not None else None) for n, i in self._ids.items()}
        except (GGUFError, UnsupportedModel, ImportError) as exc:  # re-raised on the caller's thread
            self._error = exc
        except Exception as exc:  # noqa: BLE001 -- tokenizers raises plain Exception for a vocabulary it cannot build
            self._error = GGUFError(f"{self.path}: the tokenizer cannot be built ({type(exc).__name__}: {exc})")
        except BaseException as exc:
            self._error = exc
        finally:
            self._g = None  # type: ignore[assignment]
            self._done.set()

    def wait(self) -> None:
        """Wait for the background build; raise its error here (the engine
        calls it at load, so a broken vocabulary fails the load, not the
        first question)."""
        self._done.wait()
        if self._error is not None:
            raise self._error

    @property
    def backend(self) -> Any:
        """The ``tokenizers.Tokenizer`` (waits for the background build)."""
        self.wait()
        return self._backend

    # ------------------------------------------------------------ special tokens

    def _token(self, name: str) -> str | None:
        self.backend  # noqa: B018  (built)
        return self._special[name]

    @property
    def all_special_tokens(self) -> list[str]:
        return [t.content for t in self.backend.get_added_tokens_decoder().values() if t.special]

    def get_added_vocab(self) -> dict[str, int]:
        return {t.content: i for i, t in self.backend.get_added_tokens_decoder().items()}

    # ------------------------------------------------------------ vocabulary

    def __len__(self) -> int:
        return int(self.backend.get_vocab_size(with_added_tokens=True))

    def get_vocab(self) -> dict[str, int]:
        return self.backend.get_vocab(with_added_tokens=True)

    def convert_tokens_to_ids(self, token: str) -> int | None:
        return self.backend.token_to_id(token)

    def convert_ids_to_tokens(self, ids: Sequence[int]) -> list[str | None]:
        return [self.backend.id_to_token(int(i)) for i in ids]

    # ------------------------------------------------------------ text

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of ``text`` (special tokens written in it are matched whole)."""
        return list(self.backend.encode(text, add_special_tokens=add_special_tokens).ids)

    def encode_batch(self, texts: Sequence[str], add_special_tokens: bool = True) -> list[list[int]]:
        """:meth:`encode` of many texts at once (in parallel, in Rust)."""
        return [list(e.ids) for e in self.backend.encode_batch(list(texts), add_special_tokens=add_special_tokens)]

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        return str(self.backend.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens))

    def apply_chat_template(self, conversation: Sequence[dict[str, Any]], tokenize: bool = False,
                            add_generation_prompt: bool = False, **kwargs: Any) -> Any:
        """The chat rendered by the file's template through the bounded
        template door (:func:`rcn_fast._templates.render_chat_template`:
        transformers' rendering, the special tokens as variables, within
        budgets). ``tokenize=True`` returns ids."""
        from rcn_fast._templates import render_chat_template

        if not self.chat_template:
            raise ValueError(f"{self.path} has no chat template (tokenizer.chat_template)")
        text = render_chat_template(self.chat_template, conversation, add_generation_prompt=add_generation_prompt,
                                    **{**self.special_tokens_map, **kwargs})
        return self.encode(text, add_special_tokens=False) if tokenize else text


__all__ = ["GGUFTokenizer", "SpecialTokens", "check_vocabulary", "check_vocabulary_format", "check_merges", "special_ids", "SPECIAL_IDS",
           "build_backend", "cached_backend", "cache_dir", "PRE_TOKENIZER_SPLITS", "CACHE_FORMAT"]
