"""One step of continuous batching, shared by the in-process runners (the
native engine's :mod:`~rcn_fast.llm.backends.engine.runner` and llama.cpp's
:mod:`~rcn_fast.llm.backends.llamacpp.runner`).

A step's batch holds every decoding row's last token, then as many waiting
prompt tokens as fit in the token budget (a long prompt is prefilled over
several steps); an output is kept where a token is chosen (a decoding row)
and where a prompt's last token is computed. After the forward pass,
:func:`take_chosen` appends each generating row's chosen token and ends the
rows that hit the token limit or their stop rule.

The rows are the runners' own records; what is read and written here:
``index`` (the row's place in the call), ``prompt``, ``slot`` (its cache
slot or sequence id), ``pos`` (tokens already computed), ``generated`` and
``take`` (prompt tokens in the current step, set here).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

#: choose(rows, steps, logits [m, V]) -> next token per output row
Chooser = Callable[[list[int], list[int], np.ndarray], Sequence[int]]
#: done(row, generated tokens) -> whether the row has ended
Finisher = Callable[[int, list[int]], bool]


@dataclass
class StepBatch:
    """The tokens of one forward pass.

    Attributes
    ----------
    tokens, slots, positions : list of int, length T
        Each token, the slot (sequence) it belongs to and its position.
    outputs : list of int, length M
        Indices into ``tokens`` whose output (logits or hidden state) is kept.
    out_rows : list, length M
        The row of each output.
    decoding : list
        The rows that add their last generated token in this step.
    """

    tokens: list[int] = field(default_factory=list)
    slots: list[int] = field(default_factory=list)
    positions: list[int] = field(default_factory=list)
    outputs: list[int] = field(default_factory=list)
    out_rows: list[Any] = field(default_factory=list)
    decoding: list[Any] = field(default_factory=list)


def pack_step(active: Sequence[Any], budget: int, *, prompt_end_outputs: bool = True) -> StepBatch:
    """The batch of one step over the ``active`` rows.

    Parameters
    ----------
    active : sequence of rows
        The rows holding a slot, in admission order.
    budget : int
        Tokens the step may hold (>= 1). Every decoding row is in the batch
        even past it; prompt tokens only while some budget is left.
    prompt_end_outputs : bool
        Keep the output at the last token of each prompt finished in this
        step (off for a step that only stores key/values).

    Returns
    -------
    StepBatch
        Each row's ``take`` is set to the prompt tokens it adds.
    """
    b = StepBatch()
    b.decoding = [r for r in active if r.pos >= len(r.prompt)]
    for r in b.decoding:  # each decoding row's last token
        b.tokens.append(r.generated[-1])
        b.slots.append(r.slot)
        b.positions.append(r.pos)
        b.outputs.append(len(b.tokens) - 1)
        b.out_rows.append(r)
        budget -= 1
    for r in active:  # prompt tokens, as many as fit
        r.take = 0
        if r.pos >= len(r.prompt) or budget <= 0:
            continue
        take = r.take = min(budget, len(r.prompt) - r.pos)
        b.tokens.extend(r.prompt[r.pos : r.pos + take])
        b.slots.extend([r.slot] * take)
        b.positions.extend(range(r.pos, r.pos + take))
        budget -= take
        if prompt_end_outputs and r.pos + take == len(r.prompt):
            b.outputs.append(len(b.tokens) - 1)
            b.out_rows.append(r)
    return b


def advance(batch: StepBatch, active: Sequence[Any]) -> None:
    """After the forward pass: every row's ``pos`` moves past what the step computed."""
    for r in batch.decoding:
        r.pos += 1
    for r in active:
        r.pos += r.take


def take_chosen(out_rows: Sequence[Any], logits: np.ndarray, choose: Chooser, done: Finisher,
                max_new_tokens: int, out: list) -> list[Any]:
    """Append each output row's chosen next token; return the rows that ended.

    Parameters
    ----------
    out_rows : sequence of rows, length M
    logits : float32 [M, V]
        The step's logits at those rows.
    choose, done : Chooser, Finisher
    max_new_tokens : int
    out : list
        ``out[row.index]`` receives the generated tokens of a row that ends.
    """
    steps = [len(r.generated) for r in out_rows]
    new = choose([r.index for r in out_rows], steps, logits)
    ended = []
    for r, t in zip(out_rows, new):
        r.generated.append(int(t))
        if len(r.generated) >= max_new_tokens or done(r.index, r.generated):
            out[r.index] = r.generated
            ended.append(r)
    return ended


__all__ = ["StepBatch", "pack_step", "advance", "take_chosen", "Chooser", "Finisher"]
