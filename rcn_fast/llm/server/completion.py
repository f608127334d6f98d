"""One request's model work for :mod:`rcn_fast.llm.server.app`: prompt
log-probs, then generation with every token reported as the model makes it
(``ServedModel.generate_ids(..., on_token=...)``), turned into a JSON
answer or, with ``"stream": true``, into server-sent events as the tokens
come (:mod:`rcn_fast.llm.server.streaming`).

A stream sends, per choice, the role first (chat), then a chunk whenever
text became final or a token's log-probs are asked for, then the rest of
the text with the ``finish_reason``; then, with
``stream_options.include_usage``, one chunk of usage and no choices; then
``data: [DONE]``. Its text, concatenated, is the text of the same request
answered whole (the same generation, cut by the same rule); its log-probs
are the same entries.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from rcn_fast.llm.base import GenerationParams
from rcn_fast.llm.server.responses import (
    Shapes, chat_logprobs, completion_logprobs, echo_logprobs, usage, vllm_prompt_logprobs,
)
from rcn_fast.llm.server.streaming import EventStream, RowStream


@dataclass
class Ask:
    """What a request asks of the model (checked by the routes).

    ``k``: top log-probs per generated token (None: no log-probs);
    ``echo``: the prompt's text first (completions); ``echo_logprobs``:
    its log-probs first too; ``plp_k``: top-k of the prompt log-probs to
    compute (None: none); ``prompt_k``: vLLM's ``prompt_logprobs`` field
    (None: not asked); ``stream`` and its options (``include_usage``,
    ``continuous_usage``: vLLM's ``continuous_usage_stats``)."""

    prompts: list[list[int]]
    params: GenerationParams
    bias: dict[int, float] | None
    chat: bool
    k: int | None = None
    echo: bool = False
    echo_logprobs: bool = False
    plp_k: int | None = None
    prompt_k: int | None = None
    stream: bool = False
    include_usage: bool = False
    continuous_usage: bool = False


class Completion:
    """Runs one :class:`Ask` on a served model (under the server's model
    lock) and shapes its answer.

    Parameters
    ----------
    llm : ServedModel
    ask : Ask
    shapes : Shapes
        The answer's envelope.
    stream : EventStream or None
        Where the events go (None: one JSON answer).
    started : float
        ``time.monotonic()`` when the request arrived (time to first token).
    logprob_chunk : int
        Prompt positions per forward pass of the prompt log-probs.
    """

    def __init__(self, llm: Any, ask: Ask, shapes: Shapes, stream: EventStream | None, started: float,
                 logprob_chunk: int) -> None:
        self.llm = llm
        self.tok = llm.tokenizer
        self.ask = ask
        self.shapes = shapes
        self.stream = stream
        self.started = started
        self.chunk = logprob_chunk
        self.ttft: float | None = None
        n = ask.params.num_samples
        stop_ids = set(llm.eos_ids) | {llm.pad_id}
        self.rows = {(p, s): RowStream(p * n + s, self.tok, ask.params.stop, stop_ids, set(llm.eos_ids),
                                       ask.params.max_new_tokens, ask.k is not None)
                     for p in range(len(ask.prompts)) for s in range(n)}
        self.offsets = {key: 0 for key in self.rows}  # completions' text_offset so far
        self.prompt_tokens = sum(len(p) for p in ask.prompts)
        self.generated = 0
        #: the choices' finish reasons once generated (the metrics)
        self.reasons: list[str] = []

    # ------------------------------------------------------------ the model work

    def run(self, check: Any) -> dict[str, Any] | None:
        """The model work; returns the JSON answer (None for a stream, whose
        events were sent). ``check`` is the request's guard (prompt
        log-probs are computed between its checks)."""
        a = self.ask
        plp = (self.llm.prompt_logprobs_ids(a.prompts, a.plp_k, chunk=self.chunk, check=check)
               if a.plp_k is not None else None)
        if self.stream is not None:
            self._open(plp)
        gens = self.llm.generate_ids(a.prompts, a.params, logit_bias=a.bias, logprobs=a.k, on_token=self._on_token)
        self.generated = sum(g.generated_tokens for row in gens for g in row)
        self.reasons = [g.finish_reason for row in gens for g in row]
        if self.stream is not None:
            self._close(gens)
            return None
        return self._answer(gens, plp)

    def _on_token(self, p: int, s: int, token: int, logprob: float | None, top: list[tuple[int, float]]) -> None:
        if self.ttft is None:
            self.ttft = time.monotonic() - self.started
        row = self.rows[(p, s)]
        text, entries = row.add(token, logprob, top)
        if self.stream is None or (not text and not entries):
            return
        lp = None
        if entries:
            lp = self._logprobs(entries, (p, s))
        self.stream.send(self.shapes.chunk([self.shapes.delta(row.index, text, lp)], self._usage_so_far()))

    def _usage_so_far(self) -> dict[str, int] | None:
        """The usage in every chunk (vLLM's ``continuous_usage_stats``), else None."""
        if not self.ask.continuous_usage:
            return None
        return usage(self.prompt_tokens, sum(r.tokens for r in self.rows.values()))

    def _logprobs(self, entries: list[Any], key: tuple[int, int]) -> dict[str, Any]:
        k = self.ask.k or 0
        if self.ask.chat:
            return chat_logprobs(self.tok, entries, k)
        block = completion_logprobs(self.tok, entries, k, self.offsets[key])
        self.offsets[key] += sum(len(t) for t in block["tokens"])
        return block

    # ------------------------------------------------------------ streams

    def _open(self, plp: list[Any] | None) -> None:
        """The first event of each choice: the role (chat) or the echoed
        prompt (completions with ``echo``)."""
        assert self.stream is not None
        self.stream.start()
        for (p, s), row in self.rows.items():
            if self.ask.chat:
                self.stream.send(self.shapes.chunk([self.shapes.delta(row.index, "", role=True)], self._usage_so_far()))
            elif self.ask.echo:
                ids = self.ask.prompts[p]
                lp = None
                if self.ask.echo_logprobs:
                    assert plp is not None
                    lp = echo_logprobs(self.tok, ids, plp[p], self.ask.k or 0, completion_logprobs(self.tok, [], 0))
                    self.offsets[(p, s)] = sum(len(t) for t in lp["tokens"])
                self.stream.send(self.shapes.chunk([self.shapes.delta(row.index, self.tok.decode(ids), lp)],
                                                   self._usage_so_far()))

    def _close(self, gens: list[list[Any]]) -> None:
        """The rest of each choice's text with its ``finish_reason``, the
        usage chunk (``include_usage``), ``[DONE]``."""
        assert self.stream is not None
        for (p, s), row in self.rows.items():
            g = gens[p][s]
            rest = row.text.finish(g.text) or None
            self.stream.send(self.shapes.chunk([self.shapes.delta(row.index, rest, None, g.finish_reason)],
                                               usage(self.prompt_tokens, self.generated) if self.ask.continuous_usage
                                               else None))
        if self.ask.include_usage:
            self.stream.send(self.shapes.chunk([], usage(self.prompt_tokens, self.generated)))
        self.stream.end()

    # ------------------------------------------------------------ whole answers

    def _answer(self, gens: list[list[Any]], plp: list[Any] | None) -> dict[str, Any]:
        a, k, choices = self.ask, self.ask.k or 0, []
        for (p, s), row in self.rows.items():
            g = gens[p][s]
            entries = row.entries[: g.generated_tokens]
            c: dict[str, Any] = {"index": row.index}
            if a.chat:
                c["message"] = {"role": "assistant", "content": g.text}
                c["logprobs"] = chat_logprobs(self.tok, entries, k) if a.k is not None else None
            else:
                ids = a.prompts[p]
                c["text"] = (self.tok.decode(ids) if a.echo else "") + g.text
                block = completion_logprobs(self.tok, entries, k) if a.k is not None else None
                if block is not None and a.echo_logprobs:
                    assert plp is not None
                    block = echo_logprobs(self.tok, ids, plp[p], k, block)
                c["logprobs"] = block
                if a.prompt_k is not None:
                    assert plp is not None
                    c["prompt_logprobs"] = vllm_prompt_logprobs(self.tok, ids, plp[p], a.prompt_k)
            c["finish_reason"] = g.finish_reason
            choices.append(c)
        choices.sort(key=lambda c: c["index"])
        return self.shapes.answer(choices, usage(self.prompt_tokens, self.generated))


__all__ = ["Ask", "Completion"]
