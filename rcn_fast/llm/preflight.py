"""Check a model once, before a run asks it anything.

:func:`preflight` turns the faults that would otherwise fail every question
of a run, one retry loop at a time, into one :class:`PreflightError` in
seconds. For an OpenAI-compatible server (``openai:<url>#<model>``):

1. the server answers at all (``GET /v1/models``, one attempt, at most
   ``timeout`` seconds): a refused connection, an unknown host or a
   timeout is reported at once (the check's other requests retry at most
   :data:`PREFLIGHT_RETRIES` times);
2. it serves the named model: the name is among those ``/v1/models``
   lists, or the server answers a request with it (llama-cpp-python
   ignores the name); a name it rejects is reported with the names it
   serves;
3. the tokenizer (``tokenizer=``, or the model name when it resolves to
   one) loads;
4. it honours what label scoring needs: token-id prompts and prompt
   log-probs where ``label_scoring="prompt_logprobs"`` asks for them, the
   pre-fill probe in chat mode without a tokenizer (a server that ignores
   ``continue_final_message`` -- llama-cpp-python -- is refused with the
   fix), and next-token log-probs at all;
5. its served-model identity (:mod:`rcn_fast.llm.openai.identity`) is
   computed, so the call cache's key is fixed before the run starts.

Other backends load in this process and need no check (a model whose
numbers are broken fails its questions with
:class:`~rcn_fast.llm.scoring.choice.LabelScoreError`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from rcn_fast.llm.openai.responses import ServerError

#: Seconds the reachability check waits for the server.
DEFAULT_TIMEOUT = 10.0
#: Retries of each of the check's requests (backoff capped at 2 s).
PREFLIGHT_RETRIES = 2


class PreflightError(RuntimeError):
    """The model cannot serve the run; the message says why and what to do."""


def _unwrap(llm: Any) -> Any:
    """The backend inside wrappers such as the call cache's ``CachedLLM``."""
    seen = 0
    while hasattr(llm, "llm") and hasattr(llm, "cache") and seen < 8:
        llm = llm.llm
        seen += 1
    return llm


def preflight(llm: Any, *, label_scoring: bool = True, timeout: float = DEFAULT_TIMEOUT) -> None:
    """Check that ``llm`` can answer before a run starts.

    Parameters
    ----------
    llm : LLM
        Any backend, possibly behind the call cache; only OpenAI-compatible
        servers are checked (see the module notes).
    label_scoring : bool
        Also check what ``label_logprobs`` needs (log-probs, pre-fills).
    timeout : float
        Seconds the first request waits for the server.

    Raises
    ------
    PreflightError
        One message naming the server, what is wrong and the fix.
    """
    from rcn_fast.llm.openai.client import OpenAILLM

    inner = _unwrap(llm)
    if not isinstance(inner, OpenAILLM):
        return
    config = inner.config
    # the check's own requests give up sooner than a run's: a failing server is reported in seconds
    inner.config = dataclasses.replace(config, max_retries=min(config.max_retries, PREFLIGHT_RETRIES),
                                       max_backoff=min(config.max_backoff, 2.0))
    try:
        _check_server(inner, label_scoring, min(float(timeout), config.timeout))
    except PreflightError:
        raise
    except ServerError as exc:
        raise PreflightError(f"model {inner.base_url}#{inner.model}: {exc}") from None
    except (OSError, ValueError, TypeError, ImportError, RuntimeError) as exc:
        raise PreflightError(f"model {inner.base_url}#{inner.model}: {type(exc).__name__}: {exc}") from None
    finally:
        inner.config = config


def _check_server(llm: Any, label_scoring: bool, timeout: float) -> None:
    from rcn_fast.llm.openai.identity import models_entry

    where = f"model {llm.base_url}#{llm.model}"
    try:
        models = models_entry(llm, timeout)
    except ServerError as exc:
        hint = "; is the server running, and are the address and port right?" if exc.status is None else ""
        raise PreflightError(f"{where}: {exc}{hint}") from None
    _check_name(llm, models)
    try:
        llm.prepare()
    except Exception as exc:
        tok = llm.config.tokenizer or llm.model
        raise PreflightError(f"{where}: the tokenizer {tok!r} cannot be loaded ({type(exc).__name__}: {exc}); "
                             f"pass tokenizer=<the served model's tokenizer: a folder, .gguf file or hub id>, or "
                             f"leave it out to use the server's chat endpoint") from None
    if label_scoring:
        _check_scoring(llm)
    llm.identity  # noqa: B018 - asks the server once (then kept); the call cache keys on it
    if label_scoring and (llm.served_info or {}).get("probe") is None:
        raise PreflightError(f"{where}: the server returns no next-token log-probs (asked with logprobs / "
                             f"top_logprobs), which label scoring needs; use a server that returns them (vLLM, "
                             f"SGLang, llama.cpp, rcn_fast.serve)")


def _check_name(llm: Any, models: dict[str, Any]) -> None:
    """The server serves ``llm.model``: listed, or accepted in a request."""
    if "listed" not in models:
        return
    listed = models["listed"]
    try:
        llm.transport.post("/chat/completions", {"model": llm.model, "messages": [{"role": "user", "content": "Hi"}],
                                                 "max_tokens": 1, "temperature": 0.0}, probe=True)
    except ServerError as exc:
        if exc.status is not None and 400 <= exc.status < 500 and exc.status not in (401, 403, 429):
            raise PreflightError(f"model {llm.base_url}#{llm.model}: the server does not serve {llm.model!r} "
                                 f"(it lists {listed}; it answered: {exc}); use one of those names after '#'") from None
        raise
    llm.warn_once("name", f"{llm.base_url}: {llm.model!r} is not among the models the server lists ({listed}), "
                           f"but it answers requests with that name (it ignores the name)")


def _check_scoring(llm: Any) -> None:
    """What ``label_logprobs`` needs from the server, probed once."""
    chat = [{"role": "user", "content": "Name a letter."}, {"role": "assistant", "content": "Letter: "}]
    if llm.uses_tokens:
        prefix = llm.encode_chat(chat)
        token = llm.label_ids_for(["A"])[0][0]
        if llm.config.label_scoring != "top_logprobs":
            if not llm.prober.exact(prefix, token) and llm.config.label_scoring == "prompt_logprobs":
                why = llm.capabilities.exact_why
                raise PreflightError(f"model {llm.base_url}#{llm.model}: label_scoring='prompt_logprobs' but the "
                                     f"server returns no prompt log-probs for token-id prompts ({why}); "
                                     f"use label_scoring='auto' or a server with prompt log-probs (vLLM, SGLang, "
                                     f"rcn_fast.serve)")
        else:
            llm.prober.token_prompts(prefix)
        return
    if llm.config.label_scoring == "prompt_logprobs":
        raise PreflightError(f"model {llm.base_url}#{llm.model}: label_scoring='prompt_logprobs' needs token-id "
                             f"prompts, so a tokenizer (tokenizer=) and mode 'auto' or 'completions'; got "
                             f"mode={llm.config.mode!r}")
    if llm.tokenizer is None:
        llm.prober.prefill()


__all__ = ["PreflightError", "preflight", "DEFAULT_TIMEOUT"]
