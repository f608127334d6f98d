"""What each route of :mod:`rcn_fast.llm.server.app` asks of the model:
a request's fields, each checked (HTTP 400 naming it) before any model
work, turned into a :class:`~rcn_fast.llm.server.completion.Ask`.

``srv`` is the :class:`~rcn_fast.llm.server.app.OpenAIServer` (its model,
limits, context window and test switches).
"""

from __future__ import annotations

from typing import Any

from rcn_fast._templates import chat_prompt
from rcn_fast.llm import chat as chatlib
from rcn_fast.llm.server.completion import Ask
from rcn_fast.llm.server.limits import APIError, check_k, logit_bias, sampling_params, stream_options


def template_error(exc: BaseException) -> bool:
    """Whether what a chat template raised on a request's messages is the
    request's fault, HTTP 400 (vLLM's rule: ValueError, TypeError,
    RuntimeError and jinja2's errors; also SyntaxError and LookupError): the
    template door's TemplateLimitError and TemplateRenderError are
    ValueErrors, ``{% include %}`` without a loader is a TypeError, a
    template nested past Python's compiler a SyntaxError, deep recursion a
    RecursionError (a RuntimeError); the door turns jinja2's errors into
    TemplateRenderError, and one that came through would still be known by
    its base class's name, ``TemplateError`` (only the door imports
    jinja2). A MemoryError is not the request's fault (HTTP 503)."""
    return isinstance(exc, (ValueError, TypeError, RuntimeError, SyntaxError, LookupError)) or any(
        c.__name__ == "TemplateError" for c in type(exc).__mro__)


def chat_ask(srv: Any, body: dict[str, Any]) -> tuple[Ask, str]:
    """A chat request -> what it asks of the model and its prompt text."""
    messages = body.get("messages")
    try:
        (chat,) = chatlib.validate_chats([messages], "messages")
    except (TypeError, ValueError) as exc:
        raise APIError(400, str(exc).replace("messages[0]", "messages")) from None
    tok = srv.llm.tokenizer
    cont = bool(body.get("continue_final_message", False)) and srv.extensions
    if cont and chat[-1]["role"] != "assistant":
        raise APIError(400, "continue_final_message needs a final assistant message")
    try:
        if cont or not chatlib.has_chat_template(tok):
            text = chatlib.render_chat(tok, chat, system_role=srv.llm.system_role)
        else:
            folded = chat if srv.llm.system_role else chatlib.fold_system(chat)
            gen_prompt = bool(body.get("add_generation_prompt", True)) if srv.extensions else True
            # rendered in the template door's worker, within the request's time (the door caps a render at 2 s)
            text = chat_prompt(tok, folded, add_generation_prompt=gen_prompt, timeout=srv.limits.request_timeout)
    except Exception as exc:  # the chat is the client's: 400, as vLLM
        if not template_error(exc):
            raise
        raise APIError(400, f"messages: {exc}" if isinstance(exc, ValueError) else
                       f"messages: the chat template failed on them: {type(exc).__name__}: {exc}") from None
    ids = list(tok.encode(text, add_special_tokens=not chatlib.has_chat_template(tok)))
    if not ids:
        raise APIError(400, "messages: the chat encodes to no tokens")
    want = body.get("logprobs", False)
    if want is not None and not isinstance(want, bool):
        raise APIError(400, f"logprobs: expected a bool, got {want!r}"[:200])
    k = check_k(body, "top_logprobs", _cap(srv))
    if k is not None and not want:
        raise APIError(400, "top_logprobs: needs logprobs=true (as OpenAI and vLLM)")
    return _ask(srv, [ids], body, chat=True, k=(k or 0) if want else None, echo=False, prompt_k=None), text

def completion_ask(srv: Any, body: dict[str, Any]) -> tuple[Ask, Any]:
    """A completions request -> what it asks of the model and its ``prompt``."""
    prompt = body.get("prompt")
    prompts = _prompt_ids(srv, prompt, body.get("add_special_tokens", True))
    k = check_k(body, "logprobs", _cap(srv))
    echo = bool(body.get("echo", False)) and srv.prompt_logprobs
    pk = check_k(body, "prompt_logprobs", _cap(srv)) if srv.prompt_logprobs else None
    srv.count_prompts(len(prompts))
    return _ask(srv, prompts, body, chat=False, k=k, echo=echo, prompt_k=pk), prompt

def _cap(srv: Any) -> int:
    return len(srv.llm.tokenizer) if srv.limits.max_logprobs is None else srv.limits.max_logprobs

def _prompt_ids(srv: Any, prompt: Any, add_special: Any) -> list[list[int]]:
    """``prompt`` (string, strings, token ids, lists of token ids) -> token ids per prompt."""
    tok = srv.llm.tokenizer
    if not isinstance(add_special, bool):
        raise APIError(400, f"add_special_tokens: expected a bool, got {add_special!r}")
    if isinstance(prompt, str):
        items: list[Any] = [prompt]
    elif isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        items = [prompt]
    elif isinstance(prompt, list) and prompt:
        items = prompt
    else:
        raise APIError(400, "prompt: expected a non-empty string, list of strings, token ids or lists of token ids")
    if not srv.token_prompts and not (len(items) == 1 and isinstance(items[0], str)):
        raise APIError(422, "prompt: this server takes one string prompt (token_prompts=False)")
    out = []
    V = len(tok)
    for i, p in enumerate(items):
        if isinstance(p, str) and p:
            out.append(list(tok.encode(p, add_special_tokens=add_special)))
        elif isinstance(p, list) and p and all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < V for t in p):
            out.append(list(p))
        else:
            raise APIError(400, f"prompt[{i}]: expected a non-empty string or a non-empty list of token ids < {V}")
    return out

def _ask(srv: Any, prompts: list[list[int]], body: dict[str, Any], *, chat: bool, k: int | None, echo: bool,
         prompt_k: int | None) -> Ask:
    params = sampling_params(body, [len(p) for p in prompts], srv.limits, srv.context)
    bias = logit_bias(body, len(srv.llm.tokenizer))
    stream, include_usage, continuous = stream_options(body)
    if stream and prompt_k is not None:
        raise APIError(400, "prompt_logprobs: not available with stream=true (as vLLM)")
    echo_lp = echo and k is not None
    plp_k = max(k or 0, prompt_k or 0) if echo_lp or prompt_k is not None else None
    if plp_k is not None:
        entries = sum(len(p) for p in prompts) * params.num_samples * (plp_k + 1)
        if entries > srv.limits.max_logprob_entries:
            raise APIError(400, f"{'prompt_logprobs' if prompt_k is not None else 'echo'}: the answer would hold "
                                f"{entries} prompt log-probs (prompt tokens x n x (top-k + 1)), more than the "
                                f"server's max_logprob_entries ({srv.limits.max_logprob_entries}); send fewer or "
                                f"shorter prompts per request")
    return Ask(prompts, params, bias, chat, k=k, echo=echo, echo_logprobs=echo_lp, plp_k=plp_k, prompt_k=prompt_k,
               stream=stream, include_usage=include_usage, continuous_usage=continuous)


__all__ = ["chat_ask", "completion_ask", "template_error"]
