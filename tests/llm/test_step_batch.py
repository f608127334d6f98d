"""The step packing both in-process runners use (rcn_fast.llm.backends.step_batch)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from rcn_fast.llm.backends.step_batch import advance, pack_step, take_chosen


@dataclass
class Row:
    index: int
    prompt: list[int]
    slot: int
    pos: int
    generated: list[int] = field(default_factory=list)
    take: int = 0


def test_decoding_rows_come_first_then_prompt_tokens_as_the_budget_allows():
    dec = Row(0, [1, 2], slot=3, pos=2, generated=[9])
    long = Row(1, list(range(10, 20)), slot=0, pos=4)
    short = Row(2, [5, 6], slot=1, pos=0)
    b = pack_step([long, dec, short], budget=5)
    assert b.tokens == [9, 14, 15, 16, 17]  # the decoding row's token, then 4 of the long prompt's 6
    assert b.slots == [3, 0, 0, 0, 0]
    assert b.positions == [2, 4, 5, 6, 7]
    assert (long.take, dec.take, short.take) == (4, 0, 0)
    assert b.outputs == [0] and b.out_rows == [dec]  # the long prompt is not finished: no output
    advance(b, [long, dec, short])
    assert (long.pos, dec.pos, short.pos) == (8, 3, 0)
    b = pack_step([long, dec, short], budget=8)
    assert b.tokens == [9, 18, 19, 5, 6] and b.outputs == [0, 2, 4] and b.out_rows == [dec, long, short]


def test_decoding_rows_are_all_in_even_past_the_budget_and_keep_prompts_out():
    rows = [Row(i, [1], slot=i, pos=1, generated=[7]) for i in range(3)]
    waiting = Row(3, [1, 2, 3], slot=3, pos=0)
    b = pack_step([*rows, waiting], budget=2)
    assert b.tokens == [7, 7, 7] and waiting.take == 0 and b.out_rows == rows


def test_a_store_step_keeps_no_prompt_end_output():
    r = Row(0, [1, 2, 3], slot=0, pos=0)
    b = pack_step([r], budget=16, prompt_end_outputs=False)
    assert b.tokens == [1, 2, 3] and b.outputs == [] and r.take == 3


def test_take_chosen_appends_and_ends_rows_at_the_limit_or_the_stop_rule():
    a, b = Row(0, [1], 0, 1, [4]), Row(1, [1], 1, 1, [5])
    out: list = [None, None]
    seen = []

    def choose(idx, steps, logits):
        seen.append((idx, steps, logits.shape))
        return np.argmax(logits, axis=1)

    logits = np.zeros((2, 8), np.float32)
    logits[0, 3] = logits[1, 2] = 1.0
    ended = take_chosen([a, b], logits, choose, lambda i, toks: toks[-1] == 2, max_new_tokens=5, out=out)
    assert seen == [([0, 1], [1, 1], (2, 8))]
    assert ended == [b] and out == [None, [5, 2]] and a.generated == [4, 3]
    ended = take_chosen([a], logits[:1], choose, lambda i, toks: False, max_new_tokens=3, out=out)
    assert ended == [a] and out[0] == [4, 3, 3]
