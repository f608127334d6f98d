"""What an OpenAI-compatible server can do, probed once and kept in one
frozen record (:class:`Capabilities`).

Each probe runs at most once per client, under a lock, before the requests
that need it fan out, and only when a call needs it (so a client that only
generates never asks for prompt log-probs):

* **token-id prompts** (:meth:`Prober.token_prompts`): a list of two
  token-id prompts to ``/completions``; a server that refuses it
  (llama-cpp-python) gets the rendered text, one prompt per request;
* **prompt log-probs** (:meth:`Prober.exact`): two token-id prompts with
  prompt log-probs asked for; without them label scores come from the
  next-token top log-probs (or ``label_scoring="prompt_logprobs"`` fails);
* **pre-fills in chat mode** (:meth:`Prober.prefill`): the same pre-filled
  chat with and without ``continue_final_message`` must differ in
  ``usage.prompt_tokens``, else the server ignores the field (OpenAI's
  API, llama-cpp-python) and every chat call raises the same
  :class:`~rcn_fast.llm.openai.responses.ServerError` naming the fix;
* the server's **cap on top log-probs**, learnt from a refusal while
  scoring (:meth:`Prober.cap_top`).

After each probe the record is replaced by a new frozen one
(:func:`dataclasses.replace`), so a reader sees a consistent record.
"""

from __future__ import annotations

import dataclasses
import threading
from dataclasses import dataclass
from typing import Any, Callable

from rcn_fast.llm.openai.dialect import ONE_TOKEN, PREFILL_PROBE_CHAT, Dialect
from rcn_fast.llm.openai.responses import NoPromptLogprobs, ServerError, usage_tokens

PostPrompts = Callable[[list[list[int]], dict[str, Any]], dict[str, Any]]


@dataclass(frozen=True)
class Capabilities:
    """What the server was found to do (None: not probed yet).

    token_prompts : takes token-id prompts (False: the rendered text is sent).
    exact : returns prompt log-probs for token-id prompts; ``exact_why``
        says why not.
    prefill : continues a pre-filled final assistant turn in chat mode;
        ``prefill_why``: the error every chat call raises when not.
    top_cap : the most top log-probs it gives (learnt from a refusal).
    """

    token_prompts: bool | None = None
    exact: bool | None = None
    exact_why: str = ""
    prefill: bool | None = None
    prefill_why: str = ""
    top_cap: int | None = None

    @property
    def text_prompts(self) -> bool:
        """Prompts go to ``/completions`` as text (no token-id prompts)."""
        return self.token_prompts is False


class Prober:
    """Runs each probe once and keeps the record.

    Parameters
    ----------
    post : callable
        ``post(route, body, probe=False) -> answer`` (the transport's).
    post_prompts : callable
        ``post_prompts(prompts, fields) -> answer``: token-id prompts to
        ``/completions``, prompt token count checked (the client's).
    dialect : Dialect
    warn : callable
        ``warn(key, message)``: a warning logged once per key.
    where : str
        The server's base URL (named in messages).
    """

    def __init__(self, post: Callable[..., dict[str, Any]], post_prompts: PostPrompts, dialect: Dialect,
                 warn: Callable[[str, str], None], where: str) -> None:
        self.record = Capabilities()
        self._post = post
        self._post_prompts = post_prompts
        self._dialect = dialect
        self._warn = warn
        self._where = where
        self._lock = threading.RLock()

    def _update(self, **changes: Any) -> None:
        self.record = dataclasses.replace(self.record, **changes)

    def token_prompts(self, sample: list[int]) -> bool:
        """Once: does the server take token-id prompts (else text is sent)?"""
        with self._lock:
            if self.record.token_prompts is not None:
                return self.record.token_prompts
            self._update(token_prompts=True)  # set first: a probe that fails (unreachable, 401) is not repeated
            try:
                self._post("/completions", self._dialect.token_probe(sample), probe=True)
            except ServerError as exc:
                if exc.status is None or exc.status in (401, 403, 429):
                    raise
                self._update(token_prompts=False)
                self._warn("text", f"{self._where}: the server takes no token-id prompts ({exc}); sending the "
                                   f"rendered text, one prompt per request, checking its token counts")
            return bool(self.record.token_prompts)

    def exact(self, prefix: list[int], token: int) -> bool:
        """Once, before requests fan out: token-id prompts with prompt log-probs?"""
        if self.record.exact is not None:
            return self.record.exact
        with self._lock:
            if self.record.exact is not None:
                return self.record.exact
            try:
                if not self.token_prompts(prefix):
                    self._update(exact=False, exact_why="the server takes no token-id prompts")
                    return False
                prompts = [prefix + [token], prefix + [token]]
                out = self._post_prompts(prompts, self._dialect.exact_fields())
                self._dialect.prompt_logprobs(out, prompts)
                self._update(exact=True)
            except NoPromptLogprobs as exc:
                self._update(exact=False, exact_why=str(exc))
            except ServerError as exc:
                if exc.status not in (400, 404, 415, 422):
                    raise
                self._update(exact=False, exact_why=str(exc))
            return bool(self.record.exact)

    def prefill(self) -> None:
        """Once per client (chat mode): the server must render a pre-filled
        chat differently with ``continue_final_message`` than without it;
        raises the same message on every call when it does not."""
        if self.record.prefill is None:
            with self._lock:
                if self.record.prefill is None:
                    self._probe_prefill()
        if not self.record.prefill:
            raise ServerError(self.record.prefill_why)

    def _probe_prefill(self) -> None:
        d = self._dialect
        cont = self._post("/chat/completions", d.chat(PREFILL_PROBE_CHAT, dict(ONE_TOKEN)))
        plain = self._post("/chat/completions", d.chat(PREFILL_PROBE_CHAT, dict(ONE_TOKEN), continue_prefill=False))
        n_cont = usage_tokens(cont, "prompt_tokens")
        n_plain = usage_tokens(plain, "prompt_tokens")
        why = None
        if not isinstance(n_cont, int) or not isinstance(n_plain, int):
            why = "the server reports no usage.prompt_tokens, so a pre-filled answer turn cannot be verified"
        elif n_cont >= n_plain:
            why = (f"a pre-filled chat is {n_cont} prompt tokens with continue_final_message and {n_plain} "
                   f"without: the server ignores the field (OpenAI's API, llama-cpp-python) and answers in a "
                   f"new assistant turn, so generations would not continue the pre-fill and labels would be "
                   f"scored at the wrong position")
        if why is None:
            self._update(prefill=True)
        else:
            self._update(prefill=False, prefill_why=f"{self._where}/chat/completions: {why}; pass tokenizer=<the "
                                                    f"served model's tokenizer> so chats are rendered here and "
                                                    f"sent to /completions")

    def cap_top(self, cap: int) -> None:
        """The server refused more than ``cap`` top log-probs."""
        self._update(top_cap=cap)


__all__ = ["Capabilities", "Prober", "PostPrompts"]
