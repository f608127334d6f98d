"""What the HTTP server (:mod:`rcn_fast.llm.server.app`) needs from a model:
the serving protocol both local backends implement (transformers'
:class:`~rcn_fast.llm.backends.hf.HFLLM` and the native engine's
:class:`~rcn_fast.llm.backends.engine.GGUFLLM`). The server reaches nothing
else of a backend.

Generation reports its tokens one at a time (:data:`OnToken`), in the
order the model makes them, each with its log-probability under the
model's own full-vocabulary log-softmax; the callback may raise to stop
the generation at once (a client gone: the server's
:class:`~rcn_fast.llm.server.limits.Cancelled`).
"""

from __future__ import annotations

from typing import Any, Callable, ContextManager, Protocol, Sequence, runtime_checkable

from rcn_fast.llm.base import Generation, GenerationParams

#: per prompt: None for its first token, then (log-prob of the prompt token,
#: the top-k [(token id, log-prob)]) of each later position
PromptLogprobs = list[Any]

#: ``on_token(prompt, sample, token, logprob, top)``: one generated token of
#: row (prompt index, sample index); ``logprob`` (float, the model's own
#: log-softmax of the token, before ``logit_bias`` and sampling) and ``top``
#: (the ``logprobs`` most likely [(token id, log-prob)], largest first) when
#: the call asked for log-probs, else None and []. Every token a row
#: generates is reported (its end-of-turn token too), none after the row
#: ended; raising stops the generation.
OnToken = Callable[[int, int, int, "float | None", "list[tuple[int, float]]"], None]


@runtime_checkable
class ServedModel(Protocol):
    """A model the server can serve.

    Attributes
    ----------
    name : str
        Where the model came from (messages).
    tokenizer
        The transformers tokenizer API subset rcn_fast uses (``encode``,
        ``decode``, ``apply_chat_template``, ``len``, the special tokens).
    system_role : bool
        Whether the chat template takes a system turn.
    context_length : int or None
        The context window the model declares.
    eos_ids : list of int
        The tokens that end a generation and count as generated (end of
        sequence, end of turn).
    pad_id : int
        The padding token (it ends a generation too, uncounted unless it
        is also in ``eos_ids``).
    """

    name: str
    tokenizer: Any
    system_role: bool
    context_length: int | None
    eos_ids: list[int]
    pad_id: int

    def generate_ids(self, prompt_ids: Sequence[Sequence[int]], params: GenerationParams,
                     sample_ids: Sequence[Sequence[int]] | None = None, *,
                     logit_bias: dict[int, float] | None = None, logprobs: int | None = None,
                     on_token: OnToken | None = None) -> list[list[Generation]]:
        """Generations per prompt (:meth:`rcn_fast.llm.base.LocalBackend.generate_ids`),
        ``logit_bias`` added to the logits before sampling or the greedy
        argmax; with ``on_token``, every token is reported as it is made
        (with its log-prob and top ``logprobs`` when ``logprobs`` is not
        None, see :data:`OnToken`)."""
        ...

    def prompt_logprobs_ids(self, prompt_ids: Sequence[Sequence[int]], k: int, *, chunk: int,
                            check: Callable[[], None]) -> list[PromptLogprobs]:
        """Per prompt, per position: None at 0, then (log-prob of the prompt
        token, the top ``k`` (id, log-prob)) under the full-vocabulary
        log-softmax of the previous position, computed ``chunk`` positions
        at a time (never a ``[T, vocab]`` array of one prompt at once);
        ``check()`` is called between chunks (it raises to stop)."""
        ...

    def checked_steps(self, check: Callable[[], None]) -> ContextManager[None]:
        """While entered, ``check()`` runs before every forward pass the
        entering thread makes (every generated token); it raises to stop
        the request (a client gone, a time budget spent)."""
        ...


def is_served_model(llm: Any) -> bool:
    """Whether ``llm`` implements :class:`ServedModel`."""
    return isinstance(llm, ServedModel)


__all__ = ["ServedModel", "PromptLogprobs", "OnToken", "is_served_model"]
