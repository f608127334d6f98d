"""Scheduling rows through the native decoder: prefill with prefix reuse,
continuous batching of generation, and the final hidden states of label
scoring.

One loop serves every call (:meth:`Runner.run`). Up to ``max_slots`` rows
hold a slot of a preallocated key/value cache at once; a row that ends
frees its slot for the next waiting row. Each step is one ragged forward
pass holding every decoding row's next token and as many waiting prompt
tokens as fit in ``max_batch_tokens`` (a long prompt is prefilled over
several steps). A row admitted to a slot first copies in the longest cached
prefix of its prompt (:mod:`rcn_fast.llm.backends.engine.prefix_cache`) and prefills
only the rest.

:meth:`Runner.warm` computes a call's shared prefixes into the prefix cache
first (shortest first, each extending the longest one already cached), so
a stage's instructions or a question's context run once for all its rows.

Results never depend on the schedule: the forward pass is batch invariant,
so a row's numbers are those of the row alone.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Iterator, Sequence

import numpy as np

from rcn_fast.llm.backends.engine.model import KVCache, NativeLlama
from rcn_fast.llm.backends.engine.prefix_cache import PrefixCache, shared_prefixes
from rcn_fast.llm.backends.step_batch import Chooser, Finisher, advance, pack_step, take_chosen


@dataclass
class _Row:
    index: int
    prompt: Sequence[int]
    slot: int
    pos: int  # tokens of this row already in its slot
    generated: list[int] = field(default_factory=list)
    take: int = 0  # prompt tokens in the current step


class Runner:
    """Rows through a :class:`NativeLlama`.

    Parameters
    ----------
    model : NativeLlama
    prefix_cache : PrefixCache or None
    max_slots : int
        Rows held at once (the key/value cache's slots).
    max_batch_tokens : int
        Tokens per forward pass (prompt tokens are chunked to fit).
    min_prefix : int
        Shorter shared prefixes are not cached, nor one extending another
        by fewer tokens.
    before_step : callable, optional
        Called before every forward pass (it raises to stop: the model file
        changed, a served request was cancelled).
    """

    def __init__(self, model: NativeLlama, prefix_cache: PrefixCache | None, *, max_slots: int,
                 max_batch_tokens: int, min_prefix: int = 16, before_step: Callable[[], None] | None = None) -> None:
        self.model = model
        self.before_step = before_step
        self.prefix_cache = prefix_cache
        self.max_slots = max(1, int(max_slots))
        self.max_batch_tokens = max(1, int(max_batch_tokens))
        self.min_prefix = max(1, int(min_prefix))
        #: forward passes and tokens run (prefill + decode), for benchmarks
        self.forward_calls = 0
        self.forward_tokens = 0
        self._out: dict[bool, np.ndarray] = {}  # output buffers reused between steps (fresh pages cost zeroing)

    def _out_buffer(self, rows: int, logits: bool) -> np.ndarray:
        width = self.model.hp.n_vocab if logits else self.model.hp.n_embd
        buf = self._out.get(logits)
        if buf is None or buf.shape[0] < rows:
            buf = self._out[logits] = np.empty((max(rows, 16), width), dtype=np.float32)
        return buf[:rows]

    # ------------------------------------------------------------ prefixes

    def warm(self, prompts: Sequence[Sequence[int]]) -> None:
        """Compute the shared prefixes of ``prompts`` into the prefix cache."""
        pc = self.prefix_cache
        if pc is None or pc.max_bytes == 0 or len(prompts) < 2:
            return
        kept: list[tuple[int, ...]] = []
        for p in shared_prefixes(prompts, self.min_prefix):
            parent = max((q for q in kept if p[: len(q)] == q), key=len, default=())
            hit = pc.lookup(p, len(p), self.min_prefix, touch=False)  # computed before (in full or as part of a longer entry)
            if len(p) - len(parent) >= self.min_prefix and (hit is None or hit[1] < len(p)):
                kept.append(p)
        # levels: a prefix runs after the kept prefixes it extends
        level: dict[tuple[int, ...], int] = {}
        for p in kept:
            level[p] = 1 + max((level[q] for q in level if len(q) < len(p) and p[: len(q)] == q), default=0)
        for lv in sorted(set(level.values())):
            self.run([p for p in kept if level[p] == lv], mode="store")

    def _admit(self, cache: KVCache, row: _Row) -> None:
        """Copy the longest cached prefix of the row's prompt into its slot
        (at least ``min_prefix`` tokens, at most all but the last)."""
        pc = self.prefix_cache
        if pc is None or pc.max_bytes == 0:
            return
        hit = pc.lookup(row.prompt, len(row.prompt) - 1, self.min_prefix)
        if hit is not None:
            e, n = hit
            cache.write(row.slot, e.k, e.v, n)
            row.pos = n

    # ------------------------------------------------------------ the loop

    def run(self, prompts: Sequence[Sequence[int]], *, mode: str, max_new_tokens: int = 0,
            choose: Chooser | None = None, done: Finisher | None = None) -> list:
        """Run every prompt.

        Parameters
        ----------
        prompts : list of list of int
            Non-empty token ids.
        mode : {"hidden", "logits", "generate", "store"}
            ``"hidden"``: the final normed hidden state at each prompt's last
            token (float32 [n_embd] per row); ``"logits"``: the logits there
            (float32 [n_vocab] per row); ``"generate"``: up to
            ``max_new_tokens`` tokens per row chosen by ``choose`` until
            ``done``; ``"store"``: prefill each prompt and keep its keys and
            values in the prefix cache (returns nothing useful).

        Returns
        -------
        list, one entry per prompt: hidden rows, generated token lists, or None.
        """
        n = len(prompts)
        out: list = [None] * n
        if n == 0:
            return out
        if mode == "generate" and (choose is None or done is None or max_new_tokens < 1):
            raise ValueError("run: generate needs choose, done and max_new_tokens >= 1")
        if any(len(p) == 0 for p in prompts):
            raise ValueError("prompts: every prompt needs at least one token")
        slots = min(self.max_slots, n)
        ctx = max(len(p) for p in prompts) + (max_new_tokens if mode == "generate" else 0)
        cache = self.model.new_cache(slots, ctx)
        pending = deque(sorted(range(n), key=lambda i: -len(prompts[i])))
        free = list(range(slots - 1, -1, -1))
        active: list[_Row] = []
        if mode not in ("hidden", "logits", "generate", "store"):
            raise ValueError(f"mode: expected 'hidden', 'logits', 'generate' or 'store', got {mode!r}")
        want_logits = mode in ("generate", "logits")
        while pending or active:
            while free and pending:
                i = pending.popleft()
                row = _Row(i, prompts[i], free.pop(), 0)
                self._admit(cache, row)
                active.append(row)
            b = pack_step(active, self.max_batch_tokens)
            if self.before_step is not None:
                self.before_step()
            res = self.model.forward(np.asarray(b.tokens, dtype=np.int32), np.asarray(b.slots, dtype=np.int32),
                                     np.asarray(b.positions, dtype=np.int32), cache,
                                     np.asarray(b.outputs, dtype=np.int64), logits=want_logits,
                                     out=self._out_buffer(len(b.outputs), want_logits))
            self.forward_calls += 1
            self.forward_tokens += len(b.tokens)
            advance(b, active)
            finished: list[_Row] = []
            if mode != "store" and self.prefix_cache is not None and self.prefix_cache.max_bytes:
                for r in b.out_rows:  # prompts just prefilled: kept for later calls, first out (unless held already)
                    if not r.generated and len(r.prompt) >= self.min_prefix and r.prompt not in self.prefix_cache:
                        self.prefix_cache.store(r.prompt, *cache.read(r.slot, len(r.prompt)), speculative=True)
            if mode == "generate":
                finished += take_chosen(b.out_rows, res, choose, done, max_new_tokens, out)  # type: ignore[arg-type]
            else:
                for j, r in enumerate(b.out_rows):
                    if mode in ("hidden", "logits"):
                        out[r.index] = res[j].copy()
                    elif self.prefix_cache is not None:
                        self.prefix_cache.store(r.prompt, *cache.read(r.slot, len(r.prompt)))
                    finished.append(r)
            for r in finished:
                active.remove(r)
                free.append(r.slot)
        return out


    def positions(self, prompt: Sequence[int], chunk: int,
                  check: Callable[[], None] | None = None) -> Iterator[tuple[int, np.ndarray]]:
        """The logits of every position of ``prompt``, ``chunk`` positions per
        forward pass: yields ``(first position, float32 [n, n_vocab])`` (the
        array is reused: copy what is kept). ``check`` runs before each pass."""
        if not prompt:
            raise ValueError("prompt: expected at least one token")
        cache = self.model.new_cache(1, len(prompt))
        chunk = max(1, int(chunk))
        for a in range(0, len(prompt), chunk):
            b = min(a + chunk, len(prompt))
            if check is not None:
                check()
            if self.before_step is not None:
                self.before_step()
            rows = np.arange(b - a, dtype=np.int64)
            res = self.model.forward(np.asarray(prompt[a:b], dtype=np.int32), np.zeros(b - a, dtype=np.int32),
                                     np.arange(a, b, dtype=np.int32), cache, rows, logits=True,
                                     out=self._out_buffer(b - a, True))
            self.forward_calls += 1
            self.forward_tokens += b - a
            yield a, res


__all__ = ["Runner", "Chooser", "Finisher"]
