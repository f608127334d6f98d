"""The tokenizer of a model llama.cpp runs: llama.cpp's own vocabulary
(``llama_tokenize`` / ``llama_detokenize``: the ids its model was built
for, SentencePiece and byte-level BPE alike), offering the part of the
transformers tokenizer API rcn_fast uses, as
:class:`~rcn_fast.llm.backends.engine.tokenizer.GGUFTokenizer` does.

The chat template and the special ids come from the file's metadata read
by rcn_fast's strict reader (:class:`~rcn_fast.llm.backends.engine.gguf_file.GGUFFile`),
not from llama.cpp: the template is rendered by rcn_fast's template door
(:mod:`rcn_fast._templates`, through :mod:`rcn_fast.llm.chat`), never by
llama.cpp's or llama-cpp-python's Jinja; the end-of-sequence and padding
ids are the file's (llama.cpp puts defaults in place of absent ones,
which the checks at load refuse instead).
"""

from __future__ import annotations

import ctypes
from functools import cached_property
from typing import Sequence

from rcn_fast.llm.backends.engine.gguf_file import GGUFFile
from rcn_fast.llm.backends.engine.tokenizer import SpecialTokens, special_ids
from rcn_fast.llm.backends.llamacpp.lib import Model


class LlamaCppTokenizer(SpecialTokens):
    """llama.cpp's vocabulary of ``model`` with the metadata of ``g``.

    Parameters
    ----------
    model : Model
        Loaded by llama.cpp (a ``vocab_only`` load is enough).
    g : GGUFFile
        The same file, read by rcn_fast's reader (template, special ids).
    """

    def __init__(self, model: Model, g: GGUFFile) -> None:
        self._model = model
        self._lib = model.lib
        self._vocab = model.vocab
        self.path = g.path
        self.name_or_path = str(g.path)
        self.n_tokens = model.n_vocab
        self.chat_template: str | None = g.meta("tokenizer.chat_template", "str", None)
        self._ids = special_ids(g)

    # ------------------------------------------------------------ special tokens

    def _v(self) -> object:
        """The vocabulary's pointer (a RuntimeError once the model is closed)."""
        self._model.live()
        return self._vocab

    def _token(self, name: str) -> str | None:
        i = self._ids[name]
        return None if i is None else self._lib.llama_vocab_get_text(self._v(), int(i)).decode("utf-8", "replace")

    @cached_property
    def _attrs(self) -> list[tuple[str, int]]:
        get_text, get_attr, vocab = self._lib.llama_vocab_get_text, self._lib.llama_vocab_get_attr, self._v()
        return [(get_text(vocab, i).decode("utf-8", "replace"), int(get_attr(vocab, i))) for i in range(self.n_tokens)]

    @property
    def all_special_tokens(self) -> list[str]:
        control = self._lib.LLAMA_TOKEN_ATTR_CONTROL
        return [t for t, a in self._attrs if a & control]

    def get_added_vocab(self) -> dict[str, int]:
        added = self._lib.LLAMA_TOKEN_ATTR_CONTROL | self._lib.LLAMA_TOKEN_ATTR_USER_DEFINED
        return {t: i for i, (t, a) in enumerate(self._attrs) if a & added}

    # ------------------------------------------------------------ vocabulary

    def __len__(self) -> int:
        return self.n_tokens

    @cached_property
    def _vocab_map(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for i, (t, _) in enumerate(self._attrs):
            out.setdefault(t, i)
        return out

    def get_vocab(self) -> dict[str, int]:
        """Token text (as the file spells it: ``"ĠA"``, ``"▁A"``) -> id."""
        return dict(self._vocab_map)

    def convert_tokens_to_ids(self, token: str) -> int | None:
        return self._vocab_map.get(token)

    def convert_ids_to_tokens(self, ids: Sequence[int]) -> list[str | None]:
        return [self._attrs[int(i)][0] if 0 <= int(i) < self.n_tokens else None for i in ids]

    # ------------------------------------------------------------ text

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of ``text`` (special tokens written in it are matched
        whole; ``add_special_tokens``: the BOS llama.cpp adds for this vocabulary)."""
        raw = text.encode("utf-8")
        cap = len(raw) + 8
        while True:
            buf = (ctypes.c_int32 * cap)()
            n = self._lib.llama_tokenize(self._v(), raw, len(raw), buf, cap, bool(add_special_tokens), True)
            if n >= 0:
                return list(buf[:n])
            cap = -n

    def encode_batch(self, texts: Sequence[str], add_special_tokens: bool = True) -> list[list[int]]:
        return [self.encode(t, add_special_tokens) for t in texts]

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        """The text of ``ids`` (control tokens left out with ``skip_special_tokens``)."""
        n = len(ids)
        if n == 0:
            return ""
        toks = (ctypes.c_int32 * n)(*[int(i) for i in ids])
        cap = 16 * n + 16
        while True:
            buf = ctypes.create_string_buffer(cap)
            got = self._lib.llama_detokenize(self._v(), toks, n, buf, cap, False, not skip_special_tokens)
            if got >= 0:
                return buf.raw[:got].decode("utf-8", "replace")
            cap = -got + 1


__all__ = ["LlamaCppTokenizer"]
