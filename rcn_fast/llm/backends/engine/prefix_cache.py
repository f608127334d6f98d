"""The prefix cache: keys and values of token prefixes already computed,
keyed by their token ids, bounded in bytes (least recently used first out).

Exact by construction: the engine's forward pass is batch invariant (a
token's keys and values depend only on the tokens before it in its own
sequence, never on the rows batched with it), so a prefix's cached keys
and values are the very numbers a fresh prefill would write, and a prompt
continued from them gives the same log-probabilities and the same greedy
tokens, bit for bit (tests/llm/test_engine_smollm2.py checks it).

What is stored: the shared prefixes of a call's prompts (the longest common
prefix of each prompt with its neighbours in sorted order: a stage's
instructions and few-shot examples, a question's shared context), each
computed once and reused by every prompt that starts with it, in this call
and in later ones; and each prompt once prefilled, stored *speculatively*:
at the least-recently-used end, so it is the first to go when the budget
is short and never pushes out a shared prefix, and moved up when a later
prompt reuses it.

A lookup takes the longest common prefix of the prompt with any stored
entry (an entry's first n positions are the keys and values of its first n
tokens), so a prompt reuses what it shares with an earlier one even where
that one goes on differently.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Sequence

import numpy as np


@dataclass
class PrefixEntry:
    """Keys and values of one token prefix: float32 ``[n_layer, n, D]`` each."""

    tokens: tuple[int, ...]
    k: np.ndarray
    v: np.ndarray
    ids: np.ndarray  # the tokens as int64, for prefix comparisons

    @property
    def nbytes(self) -> int:
        return int(self.k.nbytes + self.v.nbytes)


@dataclass
class PrefixCacheStats:
    """Lookups, hits, tokens reused, entries stored and evicted."""

    lookups: int = 0
    hits: int = 0
    reused_tokens: int = 0
    stored: int = 0
    evicted: int = 0


class PrefixCache:
    """Token prefix -> keys/values, at most ``max_bytes`` in all.

    Parameters
    ----------
    max_bytes : int
        Budget of the stored keys and values; 0 disables the cache.
    """

    def __init__(self, max_bytes: int) -> None:
        if not isinstance(max_bytes, int) or isinstance(max_bytes, bool) or max_bytes < 0:
            raise ValueError(f"max_bytes: expected an int >= 0, got {max_bytes!r}")
        self.max_bytes = max_bytes
        self._entries: OrderedDict[tuple[int, ...], PrefixEntry] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self.stats = PrefixCacheStats()

    @property
    def nbytes(self) -> int:
        return self._bytes

    def __len__(self) -> int:
        return len(self._entries)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._bytes = 0

    def lookup(self, tokens: Sequence[int], max_len: int, min_len: int = 1, *,
               touch: bool = True) -> tuple[PrefixEntry, int] | None:
        """The stored entry sharing the longest prefix with ``tokens`` and
        that length, cut to ``max_len``; None when no entry shares
        ``min_len`` tokens. With ``touch`` (a use) the entry becomes the most
        recently used and the statistics count it."""
        q = np.asarray(tokens, dtype=np.int64)
        with self._lock:
            if touch:
                self.stats.lookups += 1
            best, best_n = None, 0
            for e in reversed(self._entries.values()):  # most recent first: it wins ties
                m = min(len(e.ids), len(q), max_len)
                if m <= best_n:
                    continue
                diff = np.flatnonzero(e.ids[:m] != q[:m])
                n = int(diff[0]) if len(diff) else m
                if n > best_n:
                    best, best_n = e, n
            if best is None or best_n < max(1, min_len):
                return None
            if touch:
                self._entries.move_to_end(best.tokens)
                self.stats.hits += 1
                self.stats.reused_tokens += best_n
            return best, best_n

    def __contains__(self, tokens: Sequence[int]) -> bool:
        return tuple(tokens) in self._entries

    def store(self, tokens: Sequence[int], k: np.ndarray, v: np.ndarray, *, speculative: bool = False) -> bool:
        """Keep the keys/values of prefix ``tokens`` (``[n_layer, len(tokens), D]``
        each; the arrays are kept, not copied), as the most recently used
        entry, or with ``speculative`` as the least (first out). Returns
        False when it is not stored: alone over the budget, or speculative
        and already held."""
        t = tuple(int(x) for x in tokens)
        if k.shape[1] != len(t) or v.shape != k.shape:
            raise ValueError(f"k, v: expected [n_layer, {len(t)}, D] arrays of one shape, got {k.shape}, {v.shape}")
        e = PrefixEntry(t, k, v, np.asarray(t, dtype=np.int64))
        if e.nbytes > self.max_bytes:
            return False
        with self._lock:
            if speculative and t in self._entries:
                return False
            old = self._entries.pop(t, None)
            if old is not None:
                self._forget(old)
            self._entries[t] = e
            if speculative:
                self._entries.move_to_end(t, last=False)
            self._bytes += e.nbytes
            self.stats.stored += 1
            while self._bytes > self.max_bytes:
                _, victim = self._entries.popitem(last=False)
                self._forget(victim)
                self.stats.evicted += 1
        return t in self._entries

    def _forget(self, e: PrefixEntry) -> None:
        self._bytes -= e.nbytes


def shared_prefixes(prompts: Sequence[Sequence[int]], min_len: int) -> list[tuple[int, ...]]:
    """The prefixes worth computing once for a set of prompts.

    For each prompt, its longest common prefix with its neighbours in sorted
    order (the longest it shares with any other prompt), cut to leave at
    least one token of the prompt to run; those of at least ``min_len``
    tokens, distinct, shortest first (a longer one may extend a shorter).
    """
    order = sorted(range(len(prompts)), key=lambda i: tuple(prompts[i]))
    lcp = [0] * len(prompts)
    for a, b in zip(order, order[1:]):
        pa, pb = prompts[a], prompts[b]
        n = 0
        m = min(len(pa), len(pb))
        while n < m and pa[n] == pb[n]:
            n += 1
        lcp[a] = max(lcp[a], n)
        lcp[b] = max(lcp[b], n)
    out = {tuple(prompts[i][: min(lcp[i], len(prompts[i]) - 1)]) for i in range(len(prompts))}
    return sorted((p for p in out if len(p) >= min_len), key=len)


__all__ = ["PrefixCache", "PrefixEntry", "PrefixCacheStats", "shared_prefixes"]
