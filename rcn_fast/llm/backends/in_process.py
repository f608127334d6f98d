"""What the two in-process GGUF backends share: the native engine
(:class:`~rcn_fast.llm.backends.engine.GGUFLLM`) and llama.cpp
(:class:`~rcn_fast.llm.backends.llamacpp.LlamaCppLLM`) differ only in how a
forward pass is computed; everything around it is written once here.

- prompts: rendering through the template door, encoding with the context
  length check, the end-of-turn ids, the system-role probe;
- generation: :meth:`InProcessGGUFBackend.generate_ids`, one step rule for
  both (NaN/inf logits an error, the float64 log-softmax reported before
  ``logit_bias`` is added, then the greedy argmax or the seeded draw of
  :mod:`rcn_fast.llm.seeded`, every chosen token reported through
  ``on_token``);
- serving: the prompt log-probs and the per-thread step checks of
  :class:`rcn_fast.llm.server.protocol.ServedModel`;
- the model file is compared with the one loaded before every forward pass.

A subclass sets, in ``__init__``: ``gguf`` (a
:class:`~rcn_fast.llm.backends.engine.GGUFFile`, for ``check_unchanged``),
``tokenizer``, ``runner`` (``warm(rows)``, ``run(rows, mode=..., ...)`` and
``positions(row, chunk, check)``, built with ``before_step=self._before_step``),
``context_length``, ``long_prompts = 0``, ``_lock`` (an ``RLock``),
``_step_checks = {}`` and ``_system_role = None``, plus the attributes
:class:`~rcn_fast.llm.base.LocalBackend` names; and implements
:attr:`vocab_size`, ``score_ids``, ``top_logprobs_ids`` and ``identity``.
"""

from __future__ import annotations

import contextlib
import threading
from functools import cached_property
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from rcn_fast._validate import check_token_ids
from rcn_fast.llm import chat as chatlib
from rcn_fast.llm.base import Generation, GenerationParams, LocalBackend
from rcn_fast.llm.base import check_prompt_ids, finish_generation, stop_token_ids
from rcn_fast.llm.backends.logits import NonFiniteLogitsError, check_logit_bias, log_softmax_rows, row_ended, top_logprobs


class InProcessGGUFBackend(LocalBackend):
    """Base of the GGUF backends that run a model in this process through a
    row scheduler (``runner``); see the module docstring for what a subclass
    provides."""

    gguf: Any
    runner: Any
    context_length: int | None
    long_prompts: int
    _lock: Any
    _step_checks: dict[int, Callable[[], None]]
    _system_role: bool | None

    # ---------------------------------------------------------------- info

    @property
    def vocab_size(self) -> int:
        """Rows of the model's logits (the token ids it takes and scores)."""
        raise NotImplementedError

    @property
    def system_role(self) -> bool:
        """Whether the chat template renders a system turn (probed once)."""
        if self._system_role is None:
            tok = self.tokenizer
            self._system_role = chatlib.template_supports_system(tok) if chatlib.has_chat_template(tok) else True
        return self._system_role

    @property
    def pad_id(self) -> int:
        return int(self.tokenizer.pad_token_id)  # pad, else eos (eos is required at load)

    @cached_property
    def eos_ids(self) -> list[int]:
        """The end-of-sequence id and the end-of-turn tokens the vocabulary
        has (:func:`~rcn_fast.llm.base.stop_token_ids`; computed at first
        use, when the tokenizer is built)."""
        return stop_token_ids(self.tokenizer)

    def _before_step(self) -> None:
        """Before every forward pass: the model file is still the one loaded,
        and the serving checks of this thread (:meth:`checked_steps`) pass."""
        self.gguf.check_unchanged()
        check = self._step_checks.get(threading.get_ident())
        if check is not None:
            check()

    # ---------------------------------------------------------------- prompts

    def encode_texts(self, texts: Sequence[str]) -> list[list[int]]:
        """Token ids of prompt texts (long prompts run untruncated with a
        :class:`~rcn_fast.llm.base.ContextLengthWarning`)."""
        special = not chatlib.has_chat_template(self.tokenizer)
        out = self.tokenizer.encode_batch(list(texts), add_special_tokens=special)
        self.long_prompts += check_prompt_ids(out, self.context_length, self.name)
        return out

    # ---------------------------------------------------------------- generation

    def generate_ids(self, prompt_ids: Sequence[Sequence[int]], params: GenerationParams,
                     sample_ids: Sequence[Sequence[int]] | None = None, *,
                     logit_bias: dict[int, float] | None = None, logprobs: int | None = None,
                     on_token: Callable[..., None] | None = None) -> list[list[Generation]]:
        """:meth:`LocalBackend.generate_ids <rcn_fast.llm.base.LocalBackend.generate_ids>`
        through the runner: rows run together with prefix reuse; greedy
        argmax or the seeded draws of :mod:`rcn_fast.llm.seeded` (uniforms
        from :func:`~rcn_fast.llm.seeded.row_key` / ``step_uniform``) on the
        step's logits.

        ``logit_bias``: ``{token id: bias}`` added to those logits before
        sampling or the argmax (checked by
        :func:`rcn_fast.llm.backends.logits.check_logit_bias`), as
        transformers does. ``on_token``: each chosen token reported at once,
        with its float64 log-softmax of the step's logits (before the bias)
        and the top ``logprobs`` when ``logprobs`` is not None
        (:data:`rcn_fast.llm.server.protocol.OnToken`); it may raise to stop.

        Raises
        ------
        NonFiniteLogitsError
            A step's logits hold NaN or inf (no text comes of broken numbers).
        """
        from rcn_fast.llm import seeded

        check_token_ids(prompt_ids, self.vocab_size, "prompt_ids")
        bias = check_logit_bias(logit_bias, self.vocab_size) if logit_bias else {}
        bias_ids = np.fromiter(bias.keys(), dtype=np.int64, count=len(bias))
        bias_values = np.fromiter(bias.values(), dtype=np.float32, count=len(bias))
        if sample_ids is None:
            sample_ids = [range(params.num_samples)] * len(prompt_ids)
        elif len(sample_ids) != len(prompt_ids):
            raise ValueError(f"sample_ids: expected {len(prompt_ids)} lists (one per prompt), got {len(sample_ids)}")
        jobs = [(i, int(s)) for i, ss in enumerate(sample_ids) for s in ss]
        rows = [list(prompt_ids[i]) for i, _ in jobs]
        keys = None if params.greedy else [seeded.row_key(params.seed, s, rows[j]) for j, (_, s) in enumerate(jobs)]
        stop_ids = set(self.eos_ids) | {self.pad_id}
        tok = self.tokenizer
        where = f"{self.prefix}:{self.name}"

        def choose(idx: list[int], steps: list[int], logits: np.ndarray) -> Sequence[int]:
            bad = ~np.isfinite(logits).all(axis=1)
            if bad.any():
                j = idx[int(np.argmax(bad))]
                raise NonFiniteLogitsError(f"{where}: prompt {jobs[j][0]} (sample {jobs[j][1]}): the model's logits "
                                           f"hold NaN or inf at step {steps[int(np.argmax(bad))]}; no text is "
                                           f"generated from broken numbers")
            lp = log_softmax_rows(logits) if on_token is not None and logprobs is not None else None
            if len(bias_ids):
                logits = logits.copy()  # the runner's buffer stays as the model computed it
                logits[:, bias_ids] += bias_values
            if keys is None:
                picked = np.argmax(logits, axis=1).tolist()
            else:
                import torch

                u = torch.tensor([seeded.step_uniform(keys[j], s) for j, s in zip(idx, steps)], dtype=torch.float64)
                picked = seeded.draw(torch.from_numpy(logits), u, params.temperature, params.top_p).tolist()
            if on_token is not None:
                for r, (j, t) in enumerate(zip(idx, picked)):
                    on_token(*jobs[j], int(t), None if lp is None else float(lp[r, t]),
                             top_logprobs(lp[r], logprobs) if lp is not None and logprobs else [])
            return picked

        def done(j: int, toks: list[int]) -> bool:
            return row_ended(tok, toks, params.stop, stop_ids)

        with self._lock:
            self.runner.warm(rows)  # duplicates too: one prompt's samples share all of it but the last token
            new = self.runner.run(rows, mode="generate", max_new_tokens=params.max_new_tokens, choose=choose, done=done)
        results = {job: finish_generation(tok, new[j], len(rows[j]), params, stop_ids, self.eos_ids)
                   for j, job in enumerate(jobs)}
        return [[results[(i, int(s))] for s in ss] for i, ss in enumerate(sample_ids)]

    # ---------------------------------------------------------------- serving (rcn_fast.llm.server.protocol)

    def prompt_logprobs_ids(self, prompt_ids: Sequence[Sequence[int]], k: int, *, chunk: int,
                            check: Callable[[], None]) -> list[list[Any]]:
        """:meth:`ServedModel.prompt_logprobs_ids <rcn_fast.llm.server.protocol.ServedModel.prompt_logprobs_ids>`:
        each prompt is run ``chunk`` tokens per forward pass, the logits of
        every position of the chunk kept (float32 ``[chunk, vocab]`` at
        most) and turned into float64 log-softmax rows."""
        check_token_ids(prompt_ids, self.vocab_size, "prompt_ids")
        out: list[list[Any]] = []
        with self._lock:
            for row in prompt_ids:
                got: list[float] = []
                tops: list[list[tuple[int, float]]] = []
                for start, logits in self.runner.positions(row, chunk, check):
                    lp = log_softmax_rows(logits)
                    for j in range(len(lp)):  # position start + j predicts token start + j + 1
                        q = start + j + 1
                        if q >= len(row):
                            break
                        got.append(float(lp[j, row[q]]))
                        tops.append(top_logprobs(lp[j], k))
                out.append([None, *zip(got, tops)])
        return out

    def checked_steps(self, check: Callable[[], None]) -> Any:
        """:meth:`ServedModel.checked_steps <rcn_fast.llm.server.protocol.ServedModel.checked_steps>`:
        ``check`` runs before every forward pass the entering thread makes."""
        thread = threading.get_ident()

        @contextlib.contextmanager
        def installed() -> Iterator[None]:
            self._step_checks[thread] = check
            try:
                yield
            finally:
                self._step_checks.pop(thread, None)

        return installed()


__all__ = ["InProcessGGUFBackend"]
