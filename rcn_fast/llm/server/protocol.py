"""What the HTTP server (:mod:`rcn_fast.llm.server.app`) needs from a model:
the serving protocol both local backends implement (transformers'
:class:`~rcn_fast.llm.backends.hf.HFLLM` and the native engine's
:class:`~rcn_fast.llm.backends.engine.GGUFLLM`). The server reaches nothing
else of a backend.
"""

from __future__ import annotations

from typing import Any, Callable, ContextManager, Protocol, Sequence, runtime_checkable

from rcn_fast.llm.base import Generation, GenerationParams

#: per prompt: None for its first token, then (log-prob of the prompt token,
#: the top-k [(token id, log-prob)]) of each later position
PromptLogprobs = list[Any]


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
    """

    name: str
    tokenizer: Any
    system_role: bool
    context_length: int | None

    def generate_ids(self, prompt_ids: Sequence[Sequence[int]], params: GenerationParams,
                     sample_ids: Sequence[Sequence[int]] | None = None, *,
                     logit_bias: dict[int, float] | None = None) -> list[list[Generation]]:
        """Generations per prompt (:meth:`rcn_fast.llm.base.LocalBackend.generate_ids`),
        ``logit_bias`` added to the logits before sampling or the greedy argmax."""
        ...

    def top_logprobs_ids(self, prompt_ids: Sequence[Sequence[int]], k: int) -> list[list[tuple[int, float]]]:
        """The ``k`` most likely next tokens after each prompt with their log-probs."""
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


__all__ = ["ServedModel", "PromptLogprobs", "is_served_model"]
