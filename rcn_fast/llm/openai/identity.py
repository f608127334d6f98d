"""What an OpenAI-compatible server says about the model behind a name.

The URL and the served name do not identify a model: the same name on the
same port can serve other weights after a restart. :func:`served_identity`
adds what the server itself tells:

* its ``GET /v1/models`` entry for the name: the fields that describe the
  model (``root``: vLLM's model path, ``parent``, ``owned_by``,
  ``max_model_len``, llama.cpp's ``meta``: vocabulary, context, parameter
  count and file size), or the names it lists when the name is not among
  them; ``created`` and permissions change on every answer and are left
  out;
* the next-token top-5 log-probs of a fixed probe prompt at temperature 0
  (``/completions`` with a text prompt, else ``/chat/completions``), tokens
  in rank order with their log-probs rounded to 0.1, so another model
  almost always gives another probe while run-to-run noise of one model
  (batching on vLLM) almost never does.

Both are asked once per client (then kept), and
:attr:`rcn_fast.llm.openai.client.OpenAILLM.identity` -- the key of the call
cache -- ends with their digest. What this cannot see is listed in
docs/llms.md (the call cache): a model swapped while a client runs, a
server that lists nothing and returns no log-probs, and two models that
agree on the probe to 0.1 and report the same ``/v1/models`` fields.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from rcn_fast.llm.openai.responses import ServerError, top_chat, top_completion

#: The fixed probe prompt and how many top log-probs it reads.
PROBE_PROMPT = "The capital of France is"
PROBE_TOP = 5
#: ``/v1/models`` fields that describe the served model.
MODEL_FIELDS = ("id", "root", "parent", "owned_by", "max_model_len", "meta")


def models_entry(llm: Any, timeout: float) -> dict[str, Any]:
    """What ``GET /v1/models`` says about ``llm.model``.

    Returns
    -------
    dict
        ``{"entry": {field: value}}`` for a listed name (only
        :data:`MODEL_FIELDS`), ``{"listed": [names]}`` when the name is not
        among those listed, ``{"status": N}`` when the route answers an
        HTTP error, ``{"unreadable": True}`` for an answer of another shape.
    """
    status, body = llm.transport.get_json("/models", timeout)
    if status >= 400:
        if status in (401, 403):
            raise ServerError(f"{llm.base_url}/models: HTTP {status}: {body['error']} (check api_key / "
                              f"OPENAI_API_KEY)", status)
        return {"status": status}
    data = body.get("data") if isinstance(body, dict) else None
    if not isinstance(data, list):
        return {"unreadable": True}
    entries = [e for e in data if isinstance(e, dict)]
    for e in entries:
        if e.get("id") == llm.model:
            return {"entry": {k: e[k] for k in MODEL_FIELDS if k in e}}
    return {"listed": sorted(str(e.get("id")) for e in entries)}


def probe_logprobs(llm: Any) -> list[list[Any]] | None:
    """Next-token top-:data:`PROBE_TOP` log-probs after :data:`PROBE_PROMPT`
    (temperature 0), as ``[[token, logprob rounded to 0.1], ...]`` in rank
    order; None when the server gives no log-probs on either route."""
    fields = {"max_tokens": 1, "temperature": 0.0}
    top = None
    try:
        out = llm.transport.post("/completions", {"model": llm.model, "prompt": PROBE_PROMPT, "logprobs": PROBE_TOP, **fields})
        ch = out.get("choices")
        if isinstance(ch, list) and ch and isinstance(ch[0], dict):
            top = top_completion(ch[0])
    except ServerError as exc:
        if exc.status is None or exc.status in (401, 403, 429) or exc.status >= 500:
            raise
    if top is None:
        try:
            out = llm.transport.post("/chat/completions", {"model": llm.model, "messages": [
                {"role": "user", "content": PROBE_PROMPT}], "logprobs": True, "top_logprobs": PROBE_TOP, **fields})
            top = top_chat(out)
        except ServerError as exc:
            if exc.status is None or exc.status in (401, 403, 429) or exc.status >= 500:
                raise
    if top is None:
        return None
    ranked = sorted(top[0].items(), key=lambda kv: (-kv[1] if kv[1] == kv[1] else 0.0, kv[0]))[:PROBE_TOP]
    return [[t, f"{v:.1f}"] for t, v in ranked]


def served_identity(llm: Any, timeout: float | None = None) -> dict[str, Any]:
    """The server's description of ``llm.model``: ``{"models": ...,
    "probe": ...}`` (:func:`models_entry`, :func:`probe_logprobs`)."""
    t = llm.config.timeout if timeout is None else timeout
    return {"models": models_entry(llm, t), "probe": probe_logprobs(llm)}


def served_digest(info: dict[str, Any]) -> str:
    """12 hex digits of :func:`served_identity`'s answer (the client asks
    it once and keeps both, :attr:`rcn_fast.llm.openai.client.OpenAILLM.identity`)."""
    return hashlib.sha256(json.dumps(info, sort_keys=True, default=str).encode()).hexdigest()[:12]


__all__ = ["PROBE_PROMPT", "PROBE_TOP", "MODEL_FIELDS", "models_entry", "probe_logprobs",
           "served_identity", "served_digest"]
