"""OpenAI-compatible HTTP backend (vLLM, SGLang, llama.cpp server,
``python -m rcn_fast.serve``): the way to scale past one machine.

Stdlib only (``urllib``). Each chat row (and each sample) is one request;
up to ``concurrency`` requests are in flight, and each is retried with
exponential backoff on timeouts, dropped connections, HTTP 429 and 5xx
(``Retry-After`` is honoured, capped at ``max_backoff``). Other HTTP errors
raise at once with the server's message.

Pre-filled assistant turns
--------------------------
``mode="chat"`` (default) sends the chat to ``/chat/completions``; a final
assistant turn is sent with ``continue_final_message=true,
add_generation_prompt=false``. These are vLLM/SGLang extensions: OpenAI's
own API, and any server that ignores unknown fields, would instead close the
pre-filled turn and open a *new* assistant turn, so generations would not
continue the pre-fill and label scores would be read at the wrong position
-- silently. **Recommended:** ``mode="completions"`` with ``tokenizer=`` (a
directory, ``.gguf`` file or ``package:<module>`` of the served model): the
chat is rendered here exactly as the local backend renders it and the text
is sent to ``/completions``, so no server extension is involved. In chat
mode with ``tokenizer=`` set, every pre-filled request is checked: when the
server reports more prompt tokens than the locally rendered pre-fill has
(beyond one, for a BOS token), it opened a new turn and the call raises
:class:`ServerError`. Without a tokenizer chat mode cannot check this.

Label scoring
-------------
One request per row with ``max_tokens=1`` and the next-token
``top_logprobs`` (``top_logprobs`` entries, default 20, OpenAI's maximum;
vLLM allows more with ``--max-logprobs``). Each label's spellings (``"A"``,
``" A"``) are matched against the returned token strings and combined by
logsumexp, then log-softmaxed over the labels: the same rule as the local
backend. A label absent from the top entries scores ``-inf``; a row where
no label appears is a ValueError naming the row (raise ``top_logprobs``).
A server that returns no logprobs is a RuntimeError.

Samples: each sample of each row is its own request (``n=1``), sample ``s``
with the seed :func:`rcn_fast.llm.seeded.sample_seed` ``(seed, s)`` (``seed``
itself for sample 0, a hash for the others, so the samples of ``seed`` and
``seed + 1`` do not overlap). A sample therefore depends only on (prompt,
parameters, seed, sample index) wherever the server seeds per request
(vLLM, SGLang, ``rcn_fast.llm.serve``), not on the other rows of the call
or on ``num_samples``.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import math
import os
import socket
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

from rcn_fast.llm import chat as chatlib
from rcn_fast.llm.base import (
    Cost,
    CostTracker,
    Generation,
    check_tags,
    generate_by_samples,
    normalise_labels,
    pad_rows,
    sample_costs,
    sample_request,
)
from rcn_fast.llm.seeded import sample_seed


class ServerError(RuntimeError):
    """The server answered with an error that retrying does not fix."""


@dataclass
class OpenAIConfig:
    """Client settings (plain data). ``api_key`` defaults to the
    ``OPENAI_API_KEY`` environment variable (sent only when set)."""

    api_key: str | None = None
    timeout: float = 120.0
    max_retries: int = 6
    backoff: float = 0.5
    max_backoff: float = 20.0
    concurrency: int = 8
    top_logprobs: int = 20
    mode: str = "chat"
    tokenizer: str | None = None
    label_spellings: tuple[str, ...] = ("{}", " {}")
    extra_body: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.mode not in ("chat", "completions"):
            raise ValueError(f"mode: expected 'chat' or 'completions', got {self.mode!r}")
        if self.mode == "completions" and not self.tokenizer:
            raise ValueError("tokenizer: mode='completions' renders chats here and needs a tokenizer path")
        for name in ("max_retries", "concurrency", "top_logprobs"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < (0 if name == "max_retries" else 1):
                raise ValueError(f"{name}: expected a positive int, got {v!r}")
        self.label_spellings = tuple(self.label_spellings)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("api_key")
        return d


_RETRY_EXC = (urllib.error.URLError, http.client.HTTPException, ConnectionError, socket.timeout, TimeoutError)


class OpenAILLM:
    """An LLM behind an OpenAI-compatible server.

    Parameters
    ----------
    base_url : str
        E.g. ``"http://127.0.0.1:8000/v1"`` (a trailing ``/v1`` is added
        when missing).
    model : str
        The model name the server expects.
    config : OpenAIConfig, optional
    """

    def __init__(self, base_url: str, model: str, config: OpenAIConfig | None = None) -> None:
        if not isinstance(base_url, str) or not base_url.startswith(("http://", "https://")):
            raise ValueError(f"base_url: expected an http(s) URL, got {base_url!r}")
        if not isinstance(model, str) or not model:
            raise ValueError(f"model: expected a model name, got {model!r}")
        base = base_url.rstrip("/")
        self.base_url = base if base.endswith("/v1") else base + "/v1"
        self.model = model
        self.config = config or OpenAIConfig()
        self.cost = CostTracker()
        self.retries = 0
        self._tokenizer: Any = None

    @property
    def identity(self) -> str:
        """``openai:<base_url>#<model>:<mode>:<spellings>:top<k>:<digest>``;
        the digest covers ``extra_body`` (sent with every request) and the
        ``tokenizer`` that renders chats in completions mode."""
        extra = json.dumps({"extra_body": self.config.extra_body, "tokenizer": self.config.tokenizer},
                           sort_keys=True, default=str)
        digest = hashlib.sha256(extra.encode()).hexdigest()[:12]
        return (f"openai:{self.base_url}#{self.model}:{self.config.mode}:{','.join(self.config.label_spellings)}"
                f":top{self.config.top_logprobs}:{digest}")

    # ------------------------------------------------------------ transport

    def _post(self, route: str, body: dict[str, Any]) -> dict[str, Any]:
        data = json.dumps({**body, **self.config.extra_body}).encode()
        headers = {"Content-Type": "application/json"}
        key = self.config.api_key or os.environ.get("OPENAI_API_KEY")
        if key:
            headers["Authorization"] = f"Bearer {key}"
        last: str = ""
        for attempt in range(self.config.max_retries + 1):
            wait = min(self.config.max_backoff, self.config.backoff * (2**attempt))
            req = urllib.request.Request(self.base_url + route, data=data, headers=headers, method="POST")
            try:
                with urllib.request.urlopen(req, timeout=self.config.timeout) as resp:
                    return json.loads(resp.read())
            except urllib.error.HTTPError as exc:
                detail = _error_message(exc)
                if exc.code == 429 or exc.code >= 500:
                    last = f"HTTP {exc.code}: {detail}"
                    ra = exc.headers.get("Retry-After") if exc.headers else None
                    if ra:
                        try:
                            wait = min(self.config.max_backoff, float(ra))
                        except ValueError:
                            pass
                else:
                    raise ServerError(f"{self.base_url}{route}: HTTP {exc.code}: {detail}") from None
            except _RETRY_EXC as exc:
                last = f"{type(exc).__name__}: {exc}"
            if attempt < self.config.max_retries:
                self.retries += 1
                time.sleep(wait)
        raise ServerError(f"{self.base_url}{route}: gave up after {self.config.max_retries + 1} attempts; last error: {last}")

    def _map(self, fn: Callable[[Any], Any], items: Sequence[Any]) -> list[Any]:
        if len(items) <= 1 or self.config.concurrency == 1:
            return [fn(x) for x in items]
        with ThreadPoolExecutor(min(self.config.concurrency, len(items))) as pool:
            return list(pool.map(fn, items))

    # ------------------------------------------------------------ requests

    def _tok(self) -> Any:
        if self._tokenizer is None:
            from rcn_fast.llm.load import load_tokenizer

            self._tokenizer = load_tokenizer(self.config.tokenizer)
        return self._tokenizer

    def _request(self, chat: list[dict[str, str]], fields: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        if self.config.mode == "completions":
            prompt = chatlib.render_chat(self._tok(), chat)
            return "/completions", {"model": self.model, "prompt": prompt, **fields}
        body = {"model": self.model, "messages": chat, **fields}
        if chat[-1]["role"] == "assistant":
            body.update(continue_final_message=True, add_generation_prompt=False)
        return "/chat/completions", body

    def _ask(self, chat: list[dict[str, str]], fields: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        """Send one row; in chat mode with a tokenizer, check that a
        pre-filled turn was continued (see the module notes)."""
        route, body = self._request(chat, fields)
        out = self._post(route, body)
        if route == "/chat/completions" and self.config.tokenizer and chat[-1]["role"] == "assistant":
            got = (out.get("usage") or {}).get("prompt_tokens") if isinstance(out, dict) else None
            if isinstance(got, int):
                tok = self._tok()
                special = not chatlib.has_chat_template(tok)
                want = len(tok.encode(chatlib.render_chat(tok, chat), add_special_tokens=special))
                if got > want + 1:
                    raise ServerError(
                        f"{self.base_url}{route}: the server counted {got} prompt tokens where the pre-filled chat "
                        f"has {want}: it did not continue the final assistant turn (it ignores "
                        f"continue_final_message) and answered in a new turn; use mode='completions' with "
                        f"tokenizer={self.config.tokenizer!r}"
                    )
        return route, out

    def generate(
        self,
        chats: Sequence[Any],
        *,
        max_new_tokens: int = 256,
        temperature: float = 0.0,
        top_p: float = 1.0,
        num_samples: int = 1,
        seed: int = 0,
        stop: Sequence[str] | None = None,
        tags: Sequence[str] | None = None,
    ) -> list[list[Generation]]:
        """As :meth:`rcn_fast.llm.LLM.generate` (one request per row and sample)."""
        return generate_by_samples(self, chats, max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p,
                                   num_samples=num_samples, seed=seed, stop=stop, tags=tags)

    def generate_samples(
        self,
        chats: Sequence[Any],
        sample_ids: Sequence[Sequence[int]],
        *,
        max_new_tokens: int = 256,
        temperature: float = 0.0,
        top_p: float = 1.0,
        seed: int = 0,
        stop: Sequence[str] | None = None,
        tags: Sequence[str] | None = None,
    ) -> list[list[Generation]]:
        """Draw chosen sample indices of each chat, as
        :meth:`rcn_fast.llm.hf.HFLLM.generate_samples` (sample ``s`` is
        requested with ``sample_seed(seed, s)``).

        Returns
        -------
        list (length B) of list of Generation, aligned with ``sample_ids``.
        """
        valid, params, sids, tags = sample_request(chats, sample_ids, max_new_tokens=max_new_tokens,
                                                   temperature=temperature, top_p=top_p, seed=seed, stop=stop,
                                                   tags=tags)
        jobs = [(i, s) for i in range(len(valid)) for s in sids[i]]

        def one(job: tuple[int, int]) -> Generation:
            i, s = job
            fields: dict[str, Any] = {"max_tokens": params.max_new_tokens, "temperature": params.temperature,
                                      "top_p": params.top_p, "n": 1, "seed": sample_seed(params.seed, s)}
            if params.stop:
                fields["stop"] = params.stop
            route, out = self._ask(valid[i], fields)
            try:
                choice = out["choices"][0]
                text = choice["message"]["content"] if route == "/chat/completions" else choice["text"]
                usage = out.get("usage") or {}
                return Generation(text=text or "", prompt_tokens=int(usage.get("prompt_tokens", 0)),
                                  generated_tokens=int(usage.get("completion_tokens", 0)),
                                  finish_reason=str(choice.get("finish_reason") or "stop"))
            except (KeyError, IndexError, TypeError) as exc:
                raise ServerError(f"{self.base_url}{route}: unexpected response shape ({exc!r}): {str(out)[:200]}") from None

        flat = self._map(one, jobs)
        res: list[list[Generation]] = [[] for _ in valid]
        for (i, _), g in zip(jobs, flat):
            res[i].append(g)
        self.cost.record_rows(sample_costs(res), tags)
        return res

    def label_logprobs(self, chats: Sequence[Any], labels: Any, *, tags: Sequence[str] | None = None) -> np.ndarray:
        """As :meth:`rcn_fast.llm.LLM.label_logprobs`, from the server's
        next-token ``top_logprobs`` (see the module notes)."""
        valid = chatlib.validate_chats(chats)
        rows = normalise_labels(labels, len(valid))
        tags = check_tags(tags, len(valid))
        k = self.config.top_logprobs

        def one(i: int) -> tuple[list[float], int]:
            if self.config.mode == "completions":
                fields = {"max_tokens": 1, "temperature": 0.0, "logprobs": k}
            else:
                fields = {"max_tokens": 1, "temperature": 0.0, "logprobs": True, "top_logprobs": k}
            route, out = self._ask(valid[i], fields)
            top = _top_logprobs(out, route)
            if top is None:
                raise RuntimeError(
                    f"{self.base_url}{route}: the server returned no next-token logprobs; label scoring needs "
                    f"a server that supports logprobs/top_logprobs (vLLM, SGLang, llama.cpp server, rcn_fast.llm.serve)"
                )
            scores = []
            for lab in rows[i]:
                found = [top[sp.format(lab)] for sp in dict.fromkeys(self.config.label_spellings) if sp.format(lab) in top]
                scores.append(_logsumexp(found))
            if all(s == -math.inf for s in scores):
                raise ValueError(
                    f"chats[{i}]: none of the labels {rows[i]} is among the server's top {k} next tokens; "
                    f"raise top_logprobs (OpenAIConfig) or check the pre-filled answer turn"
                )
            z = _logsumexp(scores)
            return [s - z for s in scores], int((out.get("usage") or {}).get("prompt_tokens", 0))

        res = self._map(one, list(range(len(valid))))
        self.cost.record_rows([Cost(1, pt, 0) for _, pt in res], tags)
        return pad_rows([lp for lp, _ in res])


def _logsumexp(xs: Sequence[float]) -> float:
    xs = [x for x in xs if x != -math.inf]
    if not xs:
        return -math.inf
    m = max(xs)
    return m + math.log(sum(math.exp(x - m) for x in xs))


def _top_logprobs(out: dict[str, Any], route: str) -> dict[str, float] | None:
    """token string -> logprob (tokens spelled alike are combined by logsumexp)."""
    try:
        lp = out["choices"][0].get("logprobs")
    except (KeyError, IndexError, TypeError, AttributeError):
        return None
    if not lp:
        return None
    pairs: list[tuple[str, float]] = []
    if route == "/chat/completions":
        content = lp.get("content") or []
        if not content:
            return None
        pairs = [(e["token"], float(e["logprob"])) for e in content[0].get("top_logprobs") or []]
    else:
        tops = lp.get("top_logprobs") or []
        if not tops or not tops[0]:
            return None
        pairs = [(t, float(v)) for t, v in tops[0].items()]
    if not pairs:
        return None
    merged: dict[str, list[float]] = {}
    for t, v in pairs:
        merged.setdefault(t, []).append(v)
    return {t: _logsumexp(v) for t, v in merged.items()}


def _error_message(exc: urllib.error.HTTPError) -> str:
    try:
        body = json.loads(exc.read() or b"{}")
        return str(body.get("error", {}).get("message") or body)[:300]
    except Exception:
        return str(exc.reason)
