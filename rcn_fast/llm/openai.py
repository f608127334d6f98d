"""OpenAI-compatible HTTP backend (vLLM, SGLang, llama.cpp's servers,
``python -m rcn_fast.serve``): the way to scale past one machine.

Stdlib only (``http.client``). Up to ``concurrency`` (64) requests are in
flight, over kept-alive connections reused across requests and calls; each
request is retried with exponential backoff on timeouts, dropped
connections, HTTP 429 and 5xx (``Retry-After`` is honoured, capped at
``max_backoff``). Other HTTP errors raise :class:`ServerError` at once with
the server's message.

Prompts: rendered here or by the server
---------------------------------------
With a tokenizer -- ``tokenizer=`` (a directory, ``.gguf`` file,
``package:<module>`` or hub id), or else the served model name when it is a
local path or a hub id the tokenizer loads from -- ``mode="auto"`` (the
default) renders every chat here exactly as the local backend does and
sends its **token ids** to ``/completions`` (``add_special_tokens=false``):
no server-side template, no second BOS, no pre-fill extension. A server
that takes only text prompts (llama-cpp-python) gets the rendered text
instead, and each answer's ``usage.prompt_tokens`` must equal the local
token count, else :class:`ServerError` (the server added a BOS or tokenised
differently). The tokenizer is loaded once, under a lock, before requests
fan out.

Without a tokenizer, ``mode="auto"`` uses ``/chat/completions``: a final
assistant turn (a pre-fill) is sent with ``continue_final_message=true,
add_generation_prompt=false`` (vLLM/SGLang extensions). Before the first
pre-filled request the client **probes** the server once: the same
pre-filled chat with and without the extension must differ in
``usage.prompt_tokens`` (a server that ignores the fields -- OpenAI's API,
llama-cpp-python -- closes the pre-fill and opens a new assistant turn,
and would score labels at the wrong position); when they do not, every
call raises :class:`ServerError` naming the fix (``tokenizer=``). With a
tokenizer, ``mode="chat"`` also checks every pre-filled answer's prompt
token count against the local rendering.

Label scoring
-------------
Exact (``label_scoring="auto"`` or ``"prompt_logprobs"``, with a
tokenizer): each label spelling token ``t`` (``"A"``, ``" A"`` ...;
:func:`rcn_fast.llm.scoring.label_token_ids`) is scored ``log p(t |
prefix)``. First the prefix of every row is sent once (token ids, up to
``prompts_per_request`` prompts a request) for its next-token
``top_logprobs`` (20); a spelling found there under a string that only it
decodes to takes that value. Every other spelling gets the prompt
``prefix + [t]``, sent as token ids with prompt log-probs asked for
(``echo=true, logprobs=1`` by default; vLLM's ``prompt_logprobs=0`` with
``prompt_logprobs_field="vllm"``), and takes the prompt log-prob at the last
position. (Reading the top log-probs first keeps most rows to one prompt:
vLLM ignores its prefix cache for requests with prompt log-probs and
recomputes their whole prefill.) Spellings combine by logsumexp and labels
by log-softmax, as in the local backend, so every label gets a finite
score equal to the local one up to the server's numerics. The server's
prompt token count must equal the prompts' (a BOS added by the server is a
:class:`ServerError`).

Fallback (a server without token-id prompts or prompt log-probs, no
tokenizer, or ``label_scoring="top_logprobs"``): the next-token
``top_logprobs`` after the prefix, starting at ``top_logprobs`` entries
(20) and asking again with 8 times as many for rows where a spelling is
missing, until all are found or the server's cap (an HTTP 4xx) or
``max_top_logprobs`` is reached. ``"auto"`` logs a warning when it falls
back. A label none of whose spellings is found is a ``ValueError`` naming
the row and label (never a silent ``-inf``); a label with some spellings
found is scored from those (a lower bound, with a warning).

Costs are counted as the local backend counts them: one call per row,
the prefix's tokens.

A NaN, ``+inf`` or positive label score (before the log-softmax over the
labels) is a :class:`~rcn_fast.llm.scoring.LabelScoreError` naming the
question, the label and the server; an answer of the wrong shape is a
:class:`ServerError` naming the field (:mod:`rcn_fast.llm.openai_responses`).
``identity`` (the call cache's key) covers what the server says about the
model behind the name (:mod:`rcn_fast.llm.openai_identity`); a dead or
misconfigured server is best found before a run by
:func:`rcn_fast.llm.preflight.preflight`.

Samples: each sample of each row is its own request (``n=1``), sample ``s``
with the seed :func:`rcn_fast.llm.seeded.sample_seed` ``(seed, s)``, so a
sample depends only on (prompt, parameters, seed, sample index) wherever
the server seeds per request (vLLM, SGLang, ``rcn_fast.llm.serve``).
"""

from __future__ import annotations

import hashlib
import http.client
import json
import logging
import os
import queue
import socket
import threading
import time
import urllib.parse
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from rcn_fast._validate import is_int, is_number
from rcn_fast.llm import chat as chatlib
from rcn_fast.llm.base import (
    Cost,
    CostTracker,
    Generation,
    GenerationParams,
    SampleBackend,
    cached_label_ids,
    check_tags,
    logsumexp,
    normalise_labels,
    pad_rows,
    sample_costs,
)
from rcn_fast.llm.openai_responses import NoPromptLogprobs as _NoPromptLogprobs
from rcn_fast.llm.openai_responses import ServerError, answer_object, choices as _choices, error_message
from rcn_fast.llm.openai_responses import prompt_lps as _prompt_lps, retry_after, top_chat as _top_chat
from rcn_fast.llm.openai_responses import top_completion as _top_completion, usage_tokens
from rcn_fast.llm.scoring import check_label_scores
from rcn_fast.llm.seeded import sample_seed

log = logging.getLogger("rcn_fast.llm.openai")

_MODES = ("auto", "completions", "chat")
_SCORING = ("auto", "prompt_logprobs", "top_logprobs")
_PROMPT_FIELDS = ("echo", "vllm")


@dataclass
class OpenAIConfig:
    """Client settings (plain data; see the module notes).

    api_key : defaults to the ``OPENAI_API_KEY`` environment variable (sent
        only when set).
    timeout, max_retries, backoff, max_backoff : per-request transport.
    concurrency : requests in flight (threads over reused connections).
    prompts_per_request : token-id prompts sent in one ``/completions``
        request (label scoring; 1 sends one prompt per request).
    mode : ``"auto"`` (token ids with a tokenizer, else chat with the
        pre-fill probe), ``"completions"`` (token ids; needs a tokenizer)
        or ``"chat"``.
    label_scoring : ``"auto"`` (prompt log-probs, else top log-probs with
        a warning), ``"prompt_logprobs"`` (exact or an error) or
        ``"top_logprobs"``.
    prompt_logprobs_field : ``"echo"`` (``echo`` + ``logprobs``, OpenAI's
        legacy fields: vLLM, SGLang, rcn_fast.llm.serve) or ``"vllm"``
        (vLLM's ``prompt_logprobs``).
    top_logprobs : top log-probs asked for (exact scoring reads the
        spellings found there first; the fallback starts there).
    top_logprobs_first : exact scoring reads spellings from the
        next-token top log-probs where they are, and asks prompt log-probs
        only for the others (False: prompt log-probs for every spelling).
    max_top_logprobs : where its escalation stops (None: the vocabulary,
        or the server's cap).
    tokenizer : the served model's tokenizer (None: the model name when it
        resolves to one).
    label_spellings : format strings for the spellings of a label.
    extra_body : fields added to every request.
    """

    api_key: str | None = None
    timeout: float = 120.0
    max_retries: int = 6
    backoff: float = 0.5
    max_backoff: float = 20.0
    concurrency: int = 64
    prompts_per_request: int = 32
    mode: str = "auto"
    label_scoring: str = "auto"
    prompt_logprobs_field: str = "echo"
    top_logprobs: int = 20
    max_top_logprobs: int | None = None
    top_logprobs_first: bool = True
    tokenizer: str | None = None
    label_spellings: tuple[str, ...] = ("{}", " {}")
    extra_body: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name, allowed in (("mode", _MODES), ("label_scoring", _SCORING), ("prompt_logprobs_field", _PROMPT_FIELDS)):
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name}: expected one of {list(allowed)}, got {getattr(self, name)!r}")
        for name in ("max_retries", "concurrency", "prompts_per_request", "top_logprobs"):
            v = getattr(self, name)
            lo = 0 if name == "max_retries" else 1
            if not is_int(v) or v < lo:
                raise ValueError(f"{name}: expected an int >= {lo}, got {v!r}")
        m = self.max_top_logprobs
        if m is not None and (not is_int(m) or m < self.top_logprobs):
            raise ValueError(f"max_top_logprobs: expected None or an int >= top_logprobs ({self.top_logprobs}), got {m!r}")
        for name in ("timeout", "backoff", "max_backoff"):
            v = getattr(self, name)
            if not is_number(v) or v < 0 or (name == "timeout" and v == 0):
                raise ValueError(f"{name}: expected seconds {'> 0' if name == 'timeout' else '>= 0'}, got {v!r}")
        if self.tokenizer is not None and (not isinstance(self.tokenizer, str) or not self.tokenizer):
            raise ValueError(f"tokenizer: expected a path, 'package:<module>' or hub id, got {self.tokenizer!r}")
        if not isinstance(self.extra_body, dict):
            raise TypeError(f"extra_body: expected a dict, got {type(self.extra_body).__name__}")
        self.label_spellings = tuple(self.label_spellings)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("api_key")
        return d


_RETRY_EXC = (http.client.HTTPException, ConnectionError, socket.timeout, TimeoutError, OSError)


class OpenAILLM(SampleBackend):
    """An LLM behind an OpenAI-compatible server.

    Parameters
    ----------
    base_url : str
        E.g. ``"http://127.0.0.1:8000/v1"`` (a trailing ``/v1`` is added
        when missing).
    model : str
        The model name the server expects (also tried as the tokenizer
        when ``config.tokenizer`` is None and it is a local path or hub id).
    config : OpenAIConfig, optional
    """

    def __init__(self, base_url: str, model: str, config: OpenAIConfig | None = None) -> None:
        if not isinstance(base_url, str) or not base_url.startswith(("http://", "https://")):
            raise ValueError(f"base_url: expected an http(s) URL, got {base_url!r}")
        if not isinstance(model, str) or not model:
            raise ValueError(f"model: expected a model name, got {model!r}")
        base = base_url.rstrip("/")
        self.base_url = base if base.endswith("/v1") else base + "/v1"
        url = urllib.parse.urlsplit(self.base_url)
        if not url.hostname:
            raise ValueError(f"base_url: expected an http(s) URL with a host, got {base_url!r}")
        self._https = url.scheme == "https"
        self._host, self._port, self._path = url.hostname, url.port, url.path
        self.model = model
        self.config = config or OpenAIConfig()
        if self.config.mode == "completions" and self.config.tokenizer is None and not _resolvable(model):
            raise ValueError(f"tokenizer: mode='completions' renders chats here and needs the served model's tokenizer; "
                             f"the model name {model!r} is not a local path or hub id")
        self.cost = CostTracker()
        self.retries = 0
        self._lock = threading.Lock()
        self._identity_lock = threading.Lock()
        self._pool: queue.LifoQueue[http.client.HTTPConnection] = queue.LifoQueue()
        self._executor: ThreadPoolExecutor | None = None
        self._prepared = False
        self._tokenizer: Any = None
        self._system_role = True
        self._text_prompts = False  # the server takes no token-id prompts
        self._token_checked = False
        self._exact: bool | None = None  # prompt log-probs usable (None: not probed)
        self._prefill_ok: bool | None = None
        self._top_cap: int | None = None  # the server's cap on top log-probs, once met
        self._warned: set[str] = set()
        self._label_cache: dict[tuple[str, ...], list[list[int]]] = {}

    @property
    def identity(self) -> str:
        """The model identity (the call cache keys on it, as on every
        backend's ``identity``): :attr:`config_identity` ``+ ":served-" +``
        a digest of what the server says about the model behind the name
        (:func:`rcn_fast.llm.openai_identity.served_identity`: its
        ``/v1/models`` entry and a fixed probe's top log-probs), asked once
        per client. Raises :class:`ServerError` when the server cannot be
        reached."""
        from rcn_fast.llm.openai_identity import served_digest

        return f"{self.config_identity}:served-{served_digest(self)}"

    @property
    def config_identity(self) -> str:
        """``openai:<base_url>#<model>:<mode>:<label_scoring>:<spellings>:top<k>:<digest>``
        (no request): the digest covers ``extra_body`` (sent with every
        request), the ``tokenizer`` and the prompt log-probs field."""
        c = self.config
        extra = json.dumps({"extra_body": c.extra_body, "tokenizer": c.tokenizer, "field": c.prompt_logprobs_field,
                            "max_top": c.max_top_logprobs, "first": c.top_logprobs_first}, sort_keys=True, default=str)
        digest = hashlib.sha256(extra.encode()).hexdigest()[:12]
        return (f"openai:{self.base_url}#{self.model}:{c.mode}:{c.label_scoring}:{','.join(c.label_spellings)}"
                f":top{c.top_logprobs}:{digest}")

    @property
    def tokenizer(self) -> Any:
        """The tokenizer prompts are rendered with (None: chat mode); loads it."""
        self.prepare()
        return self._tokenizer

    @property
    def uses_tokens(self) -> bool:
        """Whether chats are rendered here (token-id or text prompts to
        ``/completions``) rather than by the server's chat endpoint."""
        self.prepare()
        return self._tokenizer is not None and self.config.mode != "chat"

    # ------------------------------------------------------------ setup

    def prepare(self) -> None:
        """Load the tokenizer (once, under a lock; idempotent). Called by
        every public method before its requests fan out."""
        if self._prepared:
            return
        with self._lock:
            if self._prepared:
                return
            spec = self.config.tokenizer
            tok = None
            if spec is not None:
                from rcn_fast.llm.load import load_tokenizer

                tok = load_tokenizer(spec)
            elif self.config.mode != "chat" and _resolvable(self.model):
                try:
                    from rcn_fast.llm.load import load_tokenizer

                    tok = load_tokenizer(self.model)
                except Exception as exc:  # a name that only looks like a hub id
                    if self.config.mode == "completions":
                        raise ValueError(f"tokenizer: mode='completions' could not load the tokenizer of "
                                         f"{self.model!r}: {exc}") from exc
                    log.info("%s: no tokenizer for %r (%s); chat mode with the pre-fill probe", self.base_url, self.model, exc)
            if tok is not None:
                self._system_role = chatlib.template_supports_system(tok) if chatlib.has_chat_template(tok) else True
            self._tokenizer = tok
            self._prepared = True

    def close(self) -> None:
        """Close the kept-alive connections and the worker threads."""
        ex, self._executor = self._executor, None
        if ex is not None:
            ex.shutdown(wait=True)
        while True:
            try:
                self._pool.get_nowait().close()
            except queue.Empty:
                break

    def __del__(self) -> None:  # pragma: no cover - best effort
        try:
            ex = self._executor
            if ex is not None:
                ex.shutdown(wait=False)
        except Exception:
            pass

    def _warn_once(self, key: str, msg: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            log.warning(msg)

    # ------------------------------------------------------------ transport

    def _connection(self) -> tuple[http.client.HTTPConnection, bool]:
        try:
            return self._pool.get_nowait(), True
        except queue.Empty:
            cls = http.client.HTTPSConnection if self._https else http.client.HTTPConnection
            return cls(self._host, self._port, timeout=self.config.timeout), False

    def _post(self, route: str, body: dict[str, Any], probe: bool = False) -> dict[str, Any]:
        """POST with retries; ``probe``: a 5xx that names the prompt (a
        validation error answered as 500, as llama-cpp-python does) is
        raised at once, as a 4xx is."""
        data = json.dumps({**body, **self.config.extra_body}).encode()
        headers = {"Content-Type": "application/json", "Connection": "keep-alive"}
        key = self.config.api_key or os.environ.get("OPENAI_API_KEY")
        if key:
            headers["Authorization"] = f"Bearer {key}"
        last = ""
        url = self.base_url + route
        for attempt in range(self.config.max_retries + 1):
            wait = min(self.config.max_backoff, self.config.backoff * (2**attempt))
            conn, reused = self._connection()
            try:
                conn.request("POST", self._path + route, body=data, headers=headers)
                resp = conn.getresponse()
                raw = resp.read()
                status = resp.status
                if resp.will_close:
                    conn.close()
                else:
                    self._pool.put(conn)
            except _RETRY_EXC as exc:
                conn.close()
                last = f"{type(exc).__name__}: {exc}"
                if reused and not isinstance(exc, (socket.timeout, TimeoutError)):
                    wait = 0.0  # a kept-alive connection the server had closed: retry at once
            else:
                if status < 400:
                    return answer_object(raw, url, status)
                detail = error_message(raw)
                if status == 429 or (status >= 500 and not (probe and "prompt" in detail)):
                    last = f"HTTP {status}: {detail}"
                    ra = retry_after(resp.getheader("Retry-After"))  # None: no usable hint
                    if ra is not None:
                        wait = min(self.config.max_backoff, ra)
                else:
                    raise ServerError(f"{url}: HTTP {status}: {detail}", status)
            if attempt < self.config.max_retries:
                self.retries += 1
                if wait:
                    time.sleep(wait)
        raise ServerError(f"{url}: gave up after {self.config.max_retries + 1} attempts; last error: {last}")

    def _map(self, fn: Callable[[Any], Any], items: Sequence[Any]) -> list[Any]:
        if len(items) <= 1 or self.config.concurrency == 1:
            return [fn(x) for x in items]
        if self._executor is None:
            with self._lock:
                if self._executor is None:
                    self._executor = ThreadPoolExecutor(self.config.concurrency, thread_name_prefix="rcn-openai")
        return list(self._executor.map(fn, items))

    # ------------------------------------------------------------ prompts

    def _ids(self, chat: list[dict[str, str]]) -> list[int]:
        """Token ids of a chat rendered exactly as the local backend renders it."""
        tok = self._tokenizer
        text = chatlib.render_chat(tok, chat, system_role=self._system_role)
        ids = list(tok.encode(text, add_special_tokens=not chatlib.has_chat_template(tok)))
        if not ids:
            raise ValueError("chats: a prompt encodes to no tokens")
        return ids

    def _completions_body(self, prompts: list[list[int]], fields: dict[str, Any]) -> dict[str, Any]:
        if self._text_prompts:
            if len(prompts) != 1:
                raise AssertionError("text prompts go one per request")
            prompt: Any = self._tokenizer.decode(prompts[0])
        else:
            prompt = prompts if len(prompts) > 1 else prompts[0]
        return {"model": self.model, "prompt": prompt, "add_special_tokens": False, **fields}

    def _post_prompts(self, prompts: list[list[int]], fields: dict[str, Any]) -> dict[str, Any]:
        """POST token-id prompts (or, to a server without them, their text)
        to ``/completions`` and check the server's prompt token count."""
        out = self._post("/completions", self._completions_body(prompts, fields))
        got = usage_tokens(out, "prompt_tokens")
        want = sum(len(p) for p in prompts)
        if isinstance(got, int) and got != want:
            how = "tokenised the rendered text" if self._text_prompts else "received the token ids"
            raise ServerError(
                f"{self.base_url}/completions: the server counted {got} prompt tokens where the prompt has {want} "
                f"(it {how} differently: a BOS or other special tokens added by the server, or a tokenizer that "
                f"is not the served model's); tokenizer={self.config.tokenizer or self.model!r}"
            )
        return out

    def _check_token_prompts(self, sample: list[int]) -> None:
        """Once: does the server take token-id prompts (else send text)?"""
        if self._token_checked:
            return
        self._token_checked = True
        try:
            self._post("/completions", {"model": self.model, "prompt": [sample, sample], "max_tokens": 1,
                                        "temperature": 0.0, "add_special_tokens": False}, probe=True)
        except ServerError as exc:
            if exc.status is None or exc.status in (401, 403, 429):
                raise
            self._text_prompts = True
            self._warn_once("text", f"{self.base_url}: the server takes no token-id prompts ({exc}); sending the "
                                    f"rendered text, one prompt per request, checking its token counts")

    # ------------------------------------------------------------ chat mode

    def _chat_body(self, chat: list[dict[str, str]], fields: dict[str, Any]) -> dict[str, Any]:
        body = {"model": self.model, "messages": chat, **fields}
        if chat[-1]["role"] == "assistant":
            body.update(continue_final_message=True, add_generation_prompt=False)
        return body

    def _probe_prefill(self) -> None:
        """Once per client (chat mode): the server must render a pre-filled
        chat differently with ``continue_final_message`` than without it."""
        if self._prefill_ok is not None:
            if not self._prefill_ok:
                raise self._prefill_error
            return
        with self._lock:
            if self._prefill_ok is not None:
                return self._probe_prefill()
            chat = [{"role": "user", "content": "Name a letter."}, {"role": "assistant", "content": "Letter: "}]
            fields = {"max_tokens": 1, "temperature": 0.0}
            cont = self._post("/chat/completions", self._chat_body(chat, fields))
            plain = self._post("/chat/completions", {"model": self.model, "messages": chat, **fields})
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
            self._prefill_ok = why is None
            if why:
                self._prefill_error = ServerError(
                    f"{self.base_url}/chat/completions: {why}; pass tokenizer=<the served model's tokenizer> "
                    f"so chats are rendered here and sent to /completions"
                )
                raise self._prefill_error

    def _ask_chat(self, chat: list[dict[str, str]], fields: dict[str, Any]) -> dict[str, Any]:
        """One chat-mode request; with a tokenizer, a pre-filled answer's
        prompt token count is checked against the local rendering."""
        out = self._post("/chat/completions", self._chat_body(chat, fields))
        if self._tokenizer is not None and chat[-1]["role"] == "assistant":
            got = usage_tokens(out, "prompt_tokens")
            if isinstance(got, int):
                want = len(self._ids(chat))
                if got > want + 1:  # one more for a BOS the template does not write
                    raise ServerError(
                        f"{self.base_url}/chat/completions: the server counted {got} prompt tokens where the "
                        f"pre-filled chat has {want}: it did not continue the final assistant turn (it ignores "
                        f"continue_final_message) and answered in a new turn; use mode='auto' or 'completions' "
                        f"with tokenizer={self.config.tokenizer or self.model!r}"
                    )
        return out

    # ------------------------------------------------------------ generation

    def _draw(self, valid: list[Any], params: GenerationParams, sids: list[list[int]],
              tags: list[str] | None) -> list[list[Generation]]:
        """Samples ``sample_ids[b]`` of each chat: sample ``s`` is requested
        with ``sample_seed(seed, s)``, one request per row and sample."""
        self.prepare()
        tokens = self.uses_tokens
        ids = [self._ids(c) for c in valid] if tokens else None
        if tokens:
            with self._lock:
                self._check_token_prompts(ids[0])
        elif self._tokenizer is None and any(c[-1]["role"] == "assistant" for c in valid):
            self._probe_prefill()
        jobs = [(i, s) for i in range(len(valid)) for s in sids[i]]

        def one(job: tuple[int, int]) -> Generation:
            i, s = job
            fields: dict[str, Any] = {"max_tokens": params.max_new_tokens, "temperature": params.temperature,
                                      "top_p": params.top_p, "n": 1, "seed": sample_seed(params.seed, s)}
            if params.stop:
                fields["stop"] = params.stop
            if tokens:
                assert ids is not None
                out = self._post_prompts([ids[i]], fields)
            else:
                out = self._ask_chat(valid[i], fields)
            try:
                choice = out["choices"][0]
                text = choice["text"] if tokens else choice["message"]["content"]
                return Generation(text=text or "", prompt_tokens=usage_tokens(out, "prompt_tokens") or 0,
                                  generated_tokens=usage_tokens(out, "completion_tokens") or 0,
                                  finish_reason="length" if choice.get("finish_reason") == "length" else "stop")
            except (KeyError, IndexError, TypeError, ValueError) as exc:
                raise ServerError(f"{self.base_url}: unexpected response shape ({exc!r}): {str(out)[:200]}") from None

        flat = self._map(one, jobs)
        res: list[list[Generation]] = [[] for _ in valid]
        for (i, _), g in zip(jobs, flat):
            res[i].append(g)
        self.cost.record_rows(sample_costs(res), tags)
        return res

    # ------------------------------------------------------------ label scoring

    def label_ids_for(self, labels: Sequence[str]) -> list[list[int]]:
        """Spelling token ids of each label (as the local backend's)."""
        return cached_label_ids(self._label_cache, self._tokenizer, labels, self.config.label_spellings)

    def label_logprobs(self, chats: Sequence[Any], labels: Any, *, tags: Sequence[str] | None = None) -> np.ndarray:
        """As :meth:`rcn_fast.llm.LLM.label_logprobs` (see the module notes:
        exact from prompt log-probs, else from top log-probs).

        Returns
        -------
        float32 ndarray [B, C]
            Log-softmax over each row's labels (rows with fewer labels are
            padded with ``-inf``).
        """
        valid = chatlib.validate_chats(chats)
        rows = normalise_labels(labels, len(valid))
        tags = check_tags(tags, len(valid))
        if not valid:
            return np.zeros((0, 0), dtype=np.float32)
        self.prepare()
        if self.uses_tokens:
            prefixes = [self._ids(c) for c in valid]
            spell = [self.label_ids_for(r) for r in rows]
            res = self._score_tokens(prefixes, spell, rows)
            lens = [len(p) for p in prefixes]
        else:
            if self.config.label_scoring == "prompt_logprobs":
                raise ValueError(f"label_scoring: 'prompt_logprobs' needs token-id prompts, so a tokenizer "
                                 f"(tokenizer=) and mode 'auto' or 'completions'; got mode={self.config.mode!r}")
            if self._tokenizer is None and any(c[-1]["role"] == "assistant" for c in valid):
                self._probe_prefill()
            self._warn_once("chat-top", f"{self.base_url}: label scoring in chat mode reads the next-token top "
                                        f"log-probs (no prompt log-probs there); pass tokenizer= for exact scores")
            res, lens = self._score_top_chat(valid, rows)
        check_label_scores(res, rows, self.config_identity, tags)  # NaN, +inf, positive: the question fails
        res = [_normalise(r) for r in res]
        self.cost.record_rows([Cost(1, n, 0) for n in lens], tags)
        return pad_rows(res)

    def _score_tokens(self, prefixes: list[list[int]], spell: list[list[list[int]]], rows: list[list[str]]) -> list[list[float]]:
        mode = self.config.label_scoring
        if mode != "top_logprobs":
            self._probe_exact(prefixes[0], spell[0][0][0])
            if self._exact:
                return self._score_exact(prefixes, spell)
            if mode == "prompt_logprobs":
                raise ServerError(f"{self.base_url}/completions: label_scoring='prompt_logprobs' but the server "
                                  f"returns no prompt log-probs for token-id prompts: {self._exact_why}")
            self._warn_once("top", f"{self.base_url}: no prompt log-probs ({self._exact_why}); label scores come from "
                                   f"the next-token top log-probs (exact only where every spelling is among them)")
        return self._score_top_tokens(prefixes, spell, rows)

    def _exact_fields(self) -> dict[str, Any]:
        if self.config.prompt_logprobs_field == "vllm":
            return {"max_tokens": 1, "temperature": 0.0, "prompt_logprobs": 0}
        return {"max_tokens": 1, "temperature": 0.0, "echo": True, "logprobs": 1}

    def _probe_exact(self, prefix: list[int], token: int) -> None:
        """Once, before requests fan out: token-id prompts with prompt log-probs?"""
        if self._exact is not None:
            return
        with self._lock:
            if self._exact is not None:
                return
            self._exact_why = ""
            try:
                self._check_token_prompts(prefix)
                if self._text_prompts:
                    self._exact_why = "the server takes no token-id prompts"
                    self._exact = False
                    return
                prompts = [prefix + [token], prefix + [token]]
                out = self._post_prompts(prompts, self._exact_fields())
                _prompt_lps(out, prompts, self.config.prompt_logprobs_field)
                self._exact = True
            except _NoPromptLogprobs as exc:
                self._exact_why = str(exc)
                self._exact = False
            except ServerError as exc:
                if exc.status not in (400, 404, 415, 422):
                    raise
                self._exact_why = str(exc)
                self._exact = False

    def _unique_strings(self) -> set[str]:
        """Token strings that exactly one vocabulary entry decodes to (a
        top-log-probs entry keyed by such a string names its token)."""
        if getattr(self, "_unique", None) is None:
            tok = self._tokenizer
            from collections import Counter

            counts = Counter(tok.batch_decode([[i] for i in range(len(tok))]))
            self._unique = {t for t, n in counts.items() if n == 1}
        return self._unique

    def _fetch_top(self, prefixes: list[list[int]], rows: list[int], k: int) -> list[tuple[dict[str, float], int]]:
        """Next-token top-``k`` log-probs after each of ``prefixes[rows]``."""
        per = 1 if self._text_prompts else self.config.prompts_per_request
        chunks = [rows[i : i + per] for i in range(0, len(rows), per)]

        def one(chunk: list[int]) -> list[tuple[dict[str, float], int]]:
            out = self._post_prompts([prefixes[i] for i in chunk], {"max_tokens": 1, "temperature": 0.0, "logprobs": k})
            res = []
            for c in _choices(out, len(chunk)):
                top = _top_completion(c)
                if top is None:
                    raise RuntimeError(f"{self.base_url}/completions: the server returned no next-token "
                                       f"logprobs; label scoring needs logprobs")
                res.append(top)
            return res

        return [t for part in self._map(one, chunks) for t in part]

    def _score_exact(self, prefixes: list[list[int]], spell: list[list[list[int]]]) -> list[list[float]]:
        """Exact label scores (logsumexp of the spellings, before the
        log-softmax over the labels): each spelling's ``log p(t | prefix)`` read from the
        next-token top log-probs where it is there under a string only it
        decodes to (``top_logprobs_first``; one prompt per row, so the
        server's prefix cache serves it), else from the prompt log-probs
        of ``prefix + [t]`` (vLLM recomputes the whole prefill of a
        request with prompt log-probs)."""
        vals: dict[tuple[int, int, int], float] = {}
        k = min(self.config.top_logprobs, self._top_cap if self._top_cap is not None else self.config.top_logprobs)
        if self.config.top_logprobs_first and k > 0:
            try:
                tops = self._fetch_top(prefixes, list(range(len(prefixes))), k)
            except ServerError as exc:
                if exc.status not in (400, 422):
                    raise
                self._top_cap, tops = 0, None  # the server refuses k top log-probs
            if tops is not None:
                tok, uniq = self._tokenizer, self._unique_strings()
                for b, row in enumerate(spell):
                    for c, ts in enumerate(row):
                        for t in ts:
                            key = tok.decode([t])
                            if key in uniq and key in tops[b][0]:
                                vals[(b, c, t)] = tops[b][0][key]
        jobs = [(b, c, t) for b, row in enumerate(spell) for c, ts in enumerate(row) for t in ts if (b, c, t) not in vals]
        n = self.config.prompts_per_request
        chunks = [jobs[i : i + n] for i in range(0, len(jobs), n)]
        fields = self._exact_fields()

        def one(chunk: list[tuple[int, int, int]]) -> list[float]:
            prompts = [prefixes[b] + [t] for b, _, t in chunk]
            out = self._post_prompts(prompts, fields)
            try:
                return _prompt_lps(out, prompts, self.config.prompt_logprobs_field)
            except _NoPromptLogprobs as exc:
                raise ServerError(f"{self.base_url}/completions: {exc}") from None

        for job, v in zip(jobs, [v for part in self._map(one, chunks) for v in part]):
            vals[job] = v
        return [[logsumexp([vals[(b, c, t)] for t in ts]) for c, ts in enumerate(row)] for b, row in enumerate(spell)]

    def _escalate(self, fetch: Callable[[list[int], int], list[tuple[dict[str, float], int]]], spell_strs: list[list[list[str]]],
                  rows: list[list[str]], vocab: int | None) -> list[list[float]]:
        """The top-log-probs fallback over all rows: ask with ``k`` entries,
        again with 8k for rows missing a spelling, up to the cap; label
        scores before the log-softmax over the labels."""
        cap = self.config.max_top_logprobs or vocab or (1 << 17)
        if self._top_cap is not None:
            cap = min(cap, self._top_cap)
        k = min(self.config.top_logprobs, cap)
        tops: list[dict[str, float]] = [{} for _ in rows]
        asked = [0] * len(rows)
        sizes = [0] * len(rows)
        todo = list(range(len(rows)))
        while todo:
            try:
                got = fetch(todo, k)
            except ServerError as exc:
                if exc.status not in (400, 422) or k == min(self.config.top_logprobs, cap):
                    raise
                self._top_cap = k // 8  # the server refuses k: its cap is below
                break
            grew = set()
            for i, (t, n) in zip(todo, got):
                if n > sizes[i]:  # no more entries for a larger k: the server sent all it has
                    grew.add(i)
                tops[i], asked[i], sizes[i] = t, k, n
            todo = [i for i in todo if i in grew and any(s not in tops[i] for lab in spell_strs[i] for s in lab)]
            if k >= cap:
                break
            k = min(cap, k * 8)
        out = []
        for i, row in enumerate(rows):
            scores = []
            for c, lab in enumerate(row):
                found = [tops[i][s] for s in spell_strs[i][c] if s in tops[i]]
                if not found:
                    raise ValueError(
                        f"labels[{i}]: label {lab!r} is not among the server's top {asked[i]} next tokens after "
                        f"chats[{i}], so it cannot be scored; use a server with prompt log-probs for token-id prompts "
                        f"(vLLM, SGLang, rcn_fast.llm.serve) with tokenizer=, or raise the server's cap on log-probs "
                        f"(vLLM: --max-logprobs) and max_top_logprobs"
                    )
                if len(found) < len(spell_strs[i][c]):
                    self._warn_once("partial", f"{self.base_url}: some label spellings are outside the server's top "
                                               f"log-probs (e.g. {lab!r} of row {i}); those labels are scored from "
                                               f"the spellings found (a lower bound)")
                scores.append(logsumexp(found))
            out.append(scores)
        return out

    def _score_top_tokens(self, prefixes: list[list[int]], spell: list[list[list[int]]], rows: list[list[str]]) -> list[list[float]]:
        tok = self._tokenizer
        spell_strs = [[list(dict.fromkeys(tok.decode([t]) for t in ts)) for ts in row] for row in spell]
        with self._lock:
            self._check_token_prompts(prefixes[0])
        def fetch(todo: list[int], k: int) -> list[tuple[dict[str, float], int]]:
            return self._fetch_top(prefixes, todo, k)

        return self._escalate(fetch, spell_strs, rows, len(tok))

    def _score_top_chat(self, valid: list[Any], rows: list[list[str]]) -> tuple[list[list[float]], list[int]]:
        spell_strs = [[list(dict.fromkeys(sp.format(lab) for sp in self.config.label_spellings)) for lab in row]
                      for row in rows]
        lens = [0] * len(valid)

        def fetch(todo: list[int], k: int) -> list[tuple[dict[str, float], int]]:
            def one(i: int) -> tuple[dict[str, float], int]:
                out = self._ask_chat(valid[i], {"max_tokens": 1, "temperature": 0.0, "logprobs": True,
                                                "top_logprobs": k})
                lens[i] = usage_tokens(out, "prompt_tokens") or 0
                top = _top_chat(out)
                if top is None:
                    raise RuntimeError(f"{self.base_url}/chat/completions: the server returned no next-token "
                                       f"logprobs; label scoring needs logprobs/top_logprobs")
                return top

            return self._map(one, todo)

        return self._escalate(fetch, spell_strs, rows, None), lens


def _resolvable(name: str) -> bool:
    """A local model directory or file, ``package:<module>``, or a hub id."""
    if name.startswith("package:"):
        return True
    p = Path(name).expanduser()
    if p.exists():
        return True
    parts = name.split("/")
    return len(parts) == 2 and all(parts) and not name.startswith((".", "/", "~"))


def _normalise(scores: list[float]) -> list[float]:
    z = logsumexp(scores)
    return [s - z for s in scores]
