"""Scheduling rows through a llama.cpp context: continuous batching over
sequence ids and prefix reuse by copying key/value cells between sequences.

The context's sequences are of two kinds. ``slots`` sequences (ids
``0 .. slots-1``) hold the rows being computed; each step is one
``llama_decode`` of a batch whose tokens each name their row's sequence:
every decoding row's next token and as many waiting prompt tokens as fit
in ``n_batch`` (a long prompt is prefilled over several steps), logits kept
only where a token is chosen (as llama.cpp's ``examples/batched`` and its
server do). A row that ends frees its slot for the next waiting row.

The other ``prefix_seqs`` sequences hold prefixes already computed: the
shared prefixes of a call's prompts (:meth:`Runner.warm`: a stage's
instructions or a question's context, run once for every row that starts
with them) and each prompt once prefilled (kept speculatively, first to
go). A row admitted to a slot starts from the longest one that its prompt
shares (at least ``min_prefix`` tokens, at most all but its last token):
``llama_memory_seq_cp`` gives the slot those cells (in llama.cpp's unified
memory the cells are shared, nothing is copied) and only the rest is
prefilled.

Room: ``n_ctx`` cells hold every row and kept prefix. A row is admitted
only when its prompt (less what it reuses) and its new tokens fit beside
what is held (kept prefixes are dropped, least recently used first, to
make room; a prefix a running row started from is kept until that row
ends), so a decode never runs out of cells; a prompt that cannot fit even
alone is a ValueError naming ``n_ctx``.

Unlike the native engine, llama.cpp's sums depend on the batch a token is
computed in (its kernels for one row and for many differ), so a row's
numbers match those of the row alone to rounding, not bit for bit.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

from rcn_fast.llm.backends.engine.prefix_cache import shared_prefixes
from rcn_fast.llm.backends.llamacpp.lib import Context
from rcn_fast.llm.backends.step_batch import Chooser, Finisher, advance, pack_step, take_chosen


class ContextFullError(ValueError):
    """A prompt does not fit in the context's ``n_ctx`` cells."""


@dataclass
class _Row:
    index: int
    prompt: Sequence[int]
    slot: int
    pos: int  # tokens of this row already in its sequence
    need: int  # cells this row may add (prompt beyond the reused prefix, new tokens)
    extra: int  # new tokens it may add
    source: int | None = None  # the kept prefix it started from
    generated: list[int] = field(default_factory=list)
    take: int = 0  # prompt tokens in the current step


@dataclass
class _Kept:
    tokens: tuple[int, ...]
    users: int = 0  # running rows that started from it


class Runner:
    """Rows through a llama.cpp :class:`~rcn_fast.llm.backends.llamacpp.lib.Context`.

    Parameters
    ----------
    ctx : Context
        Made for ``slots + prefix_seqs`` sequences.
    slots : int
        Rows computed at once.
    prefix_seqs : int
        Sequences that keep computed prefixes (0: no prefix reuse).
    min_prefix : int
        Shorter shared prefixes are not kept or reused.
    before_step : callable, optional
        Called before every decode (it raises to stop: the model file changed).
    """

    def __init__(self, ctx: Context, *, slots: int, prefix_seqs: int, min_prefix: int,
                 before_step: Callable[[], None] | None = None) -> None:
        if slots + prefix_seqs > ctx.n_seq:
            raise ValueError(f"slots + prefix_seqs: {slots + prefix_seqs} sequences, the context has {ctx.n_seq}")
        self.ctx = ctx
        self.slots = slots
        self.min_prefix = max(1, int(min_prefix))
        self.before_step = before_step
        self._free_kept = list(range(slots + prefix_seqs - 1, slots - 1, -1))
        self.kept: OrderedDict[int, _Kept] = OrderedDict()  # sequence id -> prefix, least recently used first
        #: decodes and tokens run (prefill + decode), for benchmarks and tests
        self.forward_calls = 0
        self.forward_tokens = 0
        self.reused_tokens = 0

    # ------------------------------------------------------------ kept prefixes

    def _held(self) -> int:
        return sum(len(k.tokens) for k in self.kept.values())

    def _lookup(self, prompt: Sequence[int], limit: int) -> tuple[int, int] | None:
        """The kept prefix sharing the most tokens with ``prompt`` (at most
        ``limit``, at least ``min_prefix``), as (sequence, tokens)."""
        best: tuple[int, int] | None = None
        arr = np.asarray(prompt[:limit], dtype=np.int64)
        for seq, k in self.kept.items():
            m = min(len(k.tokens), len(arr))
            if m < self.min_prefix or (best is not None and m <= best[1]):
                continue
            diff = np.flatnonzero(np.asarray(k.tokens[:m], dtype=np.int64) != arr[:m])
            n = int(diff[0]) if len(diff) else m
            if n >= self.min_prefix and (best is None or n > best[1]):
                best = (seq, n)
        return best

    def _drop_one(self) -> bool:
        """Drop the least recently used kept prefix no running row started from."""
        for seq, k in self.kept.items():
            if k.users == 0:
                del self.kept[seq]
                self.ctx.seq_rm(seq)
                self._free_kept.append(seq)
                return True
        return False

    def _keep(self, slot: int, tokens: tuple[int, ...], room: int, *, speculative: bool) -> None:
        """Keep the first ``len(tokens)`` cells of ``slot`` as a prefix (a
        speculative one goes first when room is short)."""
        if tokens in {k.tokens for k in self.kept.values()}:
            return
        while not self._free_kept or self._held() + len(tokens) > room:
            if not self._drop_one():
                return
        seq = self._free_kept.pop()
        self.ctx.seq_rm(seq)
        self.ctx.seq_cp(slot, seq, 0, len(tokens))
        self.kept[seq] = _Kept(tokens)
        if speculative:
            self.kept.move_to_end(seq, last=False)

    def forget(self) -> None:
        """Drop every kept prefix."""
        while self._drop_one():
            pass

    def warm(self, prompts: Sequence[Sequence[int]]) -> None:
        """Compute the shared prefixes of ``prompts`` into kept sequences
        (shortest first, each extending the longest one already kept)."""
        if not self._free_kept and not self.kept or len(prompts) < 2:
            return
        todo = []
        for p in shared_prefixes(prompts, self.min_prefix):
            hit = self._lookup(p, len(p))
            if hit is None or hit[1] < len(p):
                todo.append(p)
        level: dict[tuple[int, ...], int] = {}  # a prefix runs after the prefixes it extends
        for p in sorted(todo, key=len):
            level[p] = 1 + max((level[q] for q in level if len(q) < len(p) and p[: len(q)] == q), default=0)
        for lv in sorted(set(level.values())):
            self.run([p for p in level if level[p] == lv], mode="store")

    # ------------------------------------------------------------ the loop

    def _admit(self, index: int, prompt: Sequence[int], slot: int, extra: int, used: int) -> _Row | None:
        """A row in ``slot`` starting from its longest kept prefix, or None
        when it does not fit beside the ``used`` cells of the running rows."""
        room = self.ctx.n_ctx
        hit = self._lookup(prompt, len(prompt) - 1)
        reuse = hit[1] if hit else 0
        need = len(prompt) - reuse + extra
        while used + self._held() + need > room:
            if not self._drop_one():
                break
            hit = self._lookup(prompt, len(prompt) - 1)
            reuse = hit[1] if hit else 0
            need = len(prompt) - reuse + extra
        if used + self._held() + need > room:
            if used == 0:
                raise ContextFullError(f"a prompt of {len(prompt)} tokens and {extra} new ones does not fit in the "
                                       f"context's {room} cells: raise n_ctx")
            return None
        self.ctx.seq_rm(slot)
        row = _Row(index, prompt, slot, 0, need, extra)
        if hit is not None:
            seq, n = hit
            self.ctx.seq_cp(seq, slot, 0, n)
            self.kept.move_to_end(seq)
            self.kept[seq].users += 1
            row.pos, row.source = n, seq
            self.reused_tokens += n
        return row

    def _release(self, row: _Row) -> None:
        self.ctx.seq_rm(row.slot)
        if row.source is not None and row.source in self.kept:
            self.kept[row.source].users -= 1

    def run(self, prompts: Sequence[Sequence[int]], *, mode: str, max_new_tokens: int = 0,
            choose: Chooser | None = None, done: Finisher | None = None) -> list:
        """Run every prompt.

        Parameters
        ----------
        prompts : list of list of int
            Non-empty token ids.
        mode : {"logits", "generate", "store"}
            ``"logits"``: the logits at each prompt's last token (float32
            [n_vocab] per row); ``"generate"``: up to ``max_new_tokens``
            tokens per row chosen by ``choose`` until ``done``; ``"store"``:
            prefill each prompt and keep it as a prefix (returns Nones).

        Returns
        -------
        list, one entry per prompt: logit rows, generated token lists, or None.
        """
        if mode not in ("logits", "generate", "store"):
            raise ValueError(f"mode: expected 'logits', 'generate' or 'store', got {mode!r}")
        if mode == "generate" and (choose is None or done is None or max_new_tokens < 1):
            raise ValueError("run: generate needs choose, done and max_new_tokens >= 1")
        if any(len(p) == 0 for p in prompts):
            raise ValueError("prompts: every prompt needs at least one token")
        n = len(prompts)
        out: list = [None] * n
        extra = max_new_tokens if mode == "generate" else 0
        pending = deque(sorted(range(n), key=lambda i: -len(prompts[i])))
        free = list(range(self.slots - 1, -1, -1))
        active: list[_Row] = []
        try:
            while pending or active:
                while free and pending:
                    row = self._admit(pending[0], prompts[pending[0]], free[-1], extra, sum(r.need for r in active))
                    if row is None:
                        break
                    pending.popleft()
                    free.pop()
                    active.append(row)
                finished = self._step(active, mode, max_new_tokens, choose, done, out)
                for r in finished:
                    active.remove(r)
                    self._release(r)
                    free.append(r.slot)
        except BaseException:
            for r in active:
                self._release(r)
            raise
        return out

    def _step(self, active: list[_Row], mode: str, max_new_tokens: int, choose: Chooser | None,
              done: Finisher | None, out: list) -> list[_Row]:
        """One decode of the running rows; returns the rows that ended."""
        ctx = self.ctx
        b = pack_step(active, ctx.n_batch, prompt_end_outputs=mode != "store")
        if self.before_step is not None:
            self.before_step()
        status = ctx.decode(b.tokens, b.positions, b.slots, b.outputs)
        if status != 0:
            raise RuntimeError(f"llama_decode failed with status {status} on a batch of {len(b.tokens)} tokens "
                               f"(1: no room in the key/value memory; raise n_ctx)")
        self.forward_calls += 1
        self.forward_tokens += len(b.tokens)
        logits = ctx.logits(b.outputs) if b.outputs else None
        advance(b, active)
        finished: list[_Row] = []
        for r in active:
            if r.take and r.pos == len(r.prompt) and len(r.prompt) >= self.min_prefix and (self._free_kept or self.kept):
                room = ctx.n_ctx - sum(x.need for x in active if x is not r) - r.extra  # its prompt's cells: the prefix's
                self._keep(r.slot, tuple(r.prompt), room, speculative=mode != "store")
            if mode == "store" and r.take and r.pos == len(r.prompt):
                finished.append(r)
        if mode == "generate":
            finished += take_chosen(b.out_rows, logits, choose, done, max_new_tokens, out)  # type: ignore[arg-type]
        elif mode == "logits":
            for j, r in enumerate(b.out_rows):
                out[r.index] = logits[j].copy()  # type: ignore[index]
                finished.append(r)
        return finished

    def positions(self, prompt: Sequence[int], chunk: int,
                  check: Callable[[], None] | None = None):  # type: ignore[no-untyped-def]
        """The logits of every position of ``prompt``, ``chunk`` positions
        per decode: yields ``(first position, float32 [n, n_vocab])``.
        ``check`` runs before each decode."""
        if not prompt:
            raise ValueError("prompt: expected at least one token")
        if len(prompt) > self.ctx.n_ctx - self._held():
            self.forget()
        if len(prompt) > self.ctx.n_ctx:
            raise ContextFullError(f"a prompt of {len(prompt)} tokens does not fit in the context's "
                                   f"{self.ctx.n_ctx} cells: raise n_ctx")
        chunk = max(1, min(int(chunk), self.ctx.n_batch))
        self.ctx.seq_rm(0)
        try:
            for a in range(0, len(prompt), chunk):
                b = min(a + chunk, len(prompt))
                if check is not None:
                    check()
                if self.before_step is not None:
                    self.before_step()
                idx = list(range(b - a))
                status = self.ctx.decode(prompt[a:b], range(a, b), [0] * (b - a), idx)
                if status != 0:
                    raise RuntimeError(f"llama_decode failed with status {status}")
                self.forward_calls += 1
                self.forward_tokens += b - a
                yield a, self.ctx.logits(idx)
        finally:
            self.ctx.seq_rm(0)


__all__ = ["Runner", "Chooser", "Finisher", "ContextFullError"]
