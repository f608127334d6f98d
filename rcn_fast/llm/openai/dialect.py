"""The OpenAI-compatible client's dialect: every request body it sends and
how it reads the answers, per server family.

* ``/completions`` takes token-id prompts (vLLM, SGLang,
  ``rcn_fast.llm.server.app``; ``add_special_tokens=false`` so no second BOS)
  or, from a server without them (llama-cpp-python), the rendered text;
* prompt log-probs are asked for with OpenAI's legacy ``echo=true,
  logprobs=1`` (``prompt_logprobs_field="echo"``) or vLLM's
  ``prompt_logprobs=0`` (``"vllm"``);
* a pre-filled chat goes to ``/chat/completions`` with vLLM/SGLang's
  ``continue_final_message=true, add_generation_prompt=false``.

The answers' fields are checked by :mod:`rcn_fast.llm.openai.responses`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rcn_fast.llm.base import Generation, GenerationParams
from rcn_fast.llm.openai.responses import ServerError, prompt_lps, usage_tokens
from rcn_fast.llm.seeded import sample_seed

Chat = list[dict[str, str]]
#: The pre-filled chat of the pre-fill probe (:mod:`rcn_fast.llm.openai.capabilities`).
PREFILL_PROBE_CHAT: Chat = [{"role": "user", "content": "Name a letter."}, {"role": "assistant", "content": "Letter: "}]
#: Fields of a one-token greedy request.
ONE_TOKEN = {"max_tokens": 1, "temperature": 0.0}


@dataclass(frozen=True)
class Dialect:
    """Request bodies for ``model`` and readers of their answers.

    Parameters
    ----------
    model : str
        The served model name (every body's ``model``).
    prompt_logprobs_field : str
        ``"echo"`` or ``"vllm"`` (see the module notes).
    """

    model: str
    prompt_logprobs_field: str = "echo"

    # ---------------------------------------------------------------- /completions
    def completions(self, prompts: list[list[int]], fields: dict[str, Any], text: Any = None) -> dict[str, Any]:
        """A ``/completions`` body: token-id prompts (one prompt unwrapped),
        or ``text`` (the one prompt's rendered text) for a server without
        token-id prompts."""
        if text is not None:
            prompt: Any = text
        else:
            prompt = prompts if len(prompts) > 1 else prompts[0]
        return {"model": self.model, "prompt": prompt, "add_special_tokens": False, **fields}

    def token_probe(self, sample: list[int]) -> dict[str, Any]:
        """The body that asks whether the server takes (lists of) token-id prompts."""
        return {"model": self.model, "prompt": [sample, sample], "max_tokens": 1, "temperature": 0.0,
                "add_special_tokens": False}

    def exact_fields(self) -> dict[str, Any]:
        """Fields asking for the prompt log-probs of a ``/completions`` request."""
        if self.prompt_logprobs_field == "vllm":
            return {"max_tokens": 1, "temperature": 0.0, "prompt_logprobs": 0}
        return {"max_tokens": 1, "temperature": 0.0, "echo": True, "logprobs": 1}

    @staticmethod
    def top_fields(k: int) -> dict[str, Any]:
        """Fields asking ``/completions`` for the next-token top-``k`` log-probs."""
        return {"max_tokens": 1, "temperature": 0.0, "logprobs": k}

    def prompt_logprobs(self, out: Any, prompts: list[list[int]]) -> list[float]:
        """log p(last token | the rest) of each prompt, from an answer to
        :meth:`exact_fields` (raises ``NoPromptLogprobs`` without them)."""
        return prompt_lps(out, prompts, self.prompt_logprobs_field)

    # ---------------------------------------------------------------- /chat/completions
    def chat(self, chat: Chat, fields: dict[str, Any], continue_prefill: bool = True) -> dict[str, Any]:
        """A ``/chat/completions`` body; a final assistant turn is continued
        (``continue_final_message``) unless ``continue_prefill`` is False.
        A turn's ``cut`` (:data:`rcn_fast.llm.chat.CUT_END_OF_TURN`) is not
        sent: the server's template renders the continued turn (transformers'
        ``continue_final_message`` keeps its content as the template wrote
        it, which is the cut before the end-of-turn token on templates that
        close a turn right after its content)."""
        body = {"model": self.model, "messages": [{"role": t["role"], "content": t["content"]} for t in chat],
                **fields}
        if continue_prefill and chat[-1]["role"] == "assistant":
            body.update(continue_final_message=True, add_generation_prompt=False)
        return body

    @staticmethod
    def chat_top_fields(k: int) -> dict[str, Any]:
        """Fields asking ``/chat/completions`` for the next-token top-``k`` log-probs."""
        return {"max_tokens": 1, "temperature": 0.0, "logprobs": True, "top_logprobs": k}

    # ---------------------------------------------------------------- generation
    @staticmethod
    def sample_fields(params: GenerationParams, s: int) -> dict[str, Any]:
        """Fields of sample ``s`` (one request, ``n=1``, seeded with ``sample_seed(seed, s)``)."""
        fields: dict[str, Any] = {"max_tokens": params.max_new_tokens, "temperature": params.temperature,
                                  "top_p": params.top_p, "n": 1, "seed": sample_seed(params.seed, s)}
        if params.stop:
            fields["stop"] = params.stop
        return fields

    @staticmethod
    def generation(out: dict[str, Any], completions: bool, where: str) -> Generation:
        """The :class:`Generation` of a one-sample answer (``completions``:
        a ``/completions`` answer, else a chat answer)."""
        try:
            choice = out["choices"][0]
            text = choice["text"] if completions else choice["message"]["content"]
            return Generation(text=text or "", prompt_tokens=usage_tokens(out, "prompt_tokens") or 0,
                              generated_tokens=usage_tokens(out, "completion_tokens") or 0,
                              finish_reason="length" if choice.get("finish_reason") == "length" else "stop")
        except (KeyError, IndexError, TypeError, ValueError) as exc:
            raise ServerError(f"{where}: unexpected response shape ({exc!r}): {str(out)[:200]}") from None


__all__ = ["Dialect", "PREFILL_PROBE_CHAT", "ONE_TOKEN", "Chat"]
