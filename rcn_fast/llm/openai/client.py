"""OpenAI-compatible HTTP backend (vLLM, SGLang, llama.cpp's servers,
``python -m rcn_fast.serve``): the way to scale past one machine.

Stdlib only (``http.client``). The client is four parts:

* the **transport** (:mod:`rcn_fast.llm.openai.transport`): up to
  ``concurrency`` (64) requests in flight, over kept-alive connections
  reused across requests and calls; each request is retried with
  exponential backoff on timeouts, dropped connections, HTTP 429 and 5xx
  (``Retry-After`` is honoured, capped at ``max_backoff``). Other HTTP
  errors raise :class:`ServerError` at once with the server's message;
* the **dialect** (:mod:`rcn_fast.llm.openai.dialect`): every request body
  and how answers are read, per server family
  (:mod:`rcn_fast.llm.openai.responses` checks the fields);
* the **capabilities** (:mod:`rcn_fast.llm.openai.capabilities`): each
  probe below run once, the findings kept in one frozen record;
* **label scoring** (:mod:`rcn_fast.llm.openai.scoring`), whose exact path
  is the algorithm the vLLM engine uses too
  (:mod:`rcn_fast.llm.scoring.served`).

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
:func:`rcn_fast.llm.scoring.choice.label_token_ids`) is scored ``log p(t |
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
labels) is a :class:`~rcn_fast.llm.scoring.choice.LabelScoreError` naming the
question, the label and the server; an answer of the wrong shape is a
:class:`ServerError` naming the field (:mod:`rcn_fast.llm.openai.responses`).
``identity`` (the call cache's key) covers what the server says about the
model behind the name (:mod:`rcn_fast.llm.openai.identity`); a dead or
misconfigured server is best found before a run by
:func:`rcn_fast.llm.preflight.preflight`.

Samples: each sample of each row is its own request (``n=1``), sample ``s``
with the seed :func:`rcn_fast.llm.seeded.sample_seed` ``(seed, s)``, so a
sample depends only on (prompt, parameters, seed, sample index) wherever
the server seeds per request (vLLM, SGLang, ``rcn_fast.llm.server.app``).
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
from typing import Any, Sequence

import numpy as np

from rcn_fast.llm import chat as chatlib
from rcn_fast.llm.scoring import served as label_scoring
from rcn_fast.llm.base import (
    Cost,
    CostTracker,
    Generation,
    GenerationParams,
    SampleBackend,
    cached_label_ids,
    check_tags,
    normalise_labels,
    sample_costs,
)
from rcn_fast.llm.openai.capabilities import Capabilities, Prober
from rcn_fast.llm.openai.config import OpenAIConfig, resolvable
from rcn_fast.llm.openai.dialect import Chat, Dialect
from rcn_fast.llm.openai.responses import ServerError, usage_tokens
from rcn_fast.llm.openai.scoring import LabelScorer
from rcn_fast.llm.openai.transport import Transport, normalise_base_url

log = logging.getLogger("rcn_fast.llm.openai.client")


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
        base = normalise_base_url(base_url)
        if not isinstance(model, str) or not model:
            raise ValueError(f"model: expected a model name, got {model!r}")
        config = config or OpenAIConfig()
        if config.mode == "completions" and config.tokenizer is None and not resolvable(model):
            raise ValueError(f"tokenizer: mode='completions' renders chats here and needs the served model's tokenizer; "
                             f"the model name {model!r} is not a local path or hub id")
        self.base_url = base
        self.model = model
        self.transport = Transport(base, config)
        self.dialect = Dialect(model, config.prompt_logprobs_field)
        self.prober = Prober(self.transport.post, self.post_prompts, self.dialect, self.warn_once, base)
        self.scorer = LabelScorer(self.transport, self.dialect, self.prober, self.post_prompts, self.ask_chat,
                                  self.warn_once)
        self.cost = CostTracker()
        self._lock = threading.Lock()  # loading the tokenizer
        self._identity_lock = threading.Lock()
        self._prepared = False
        self._tokenizer: Any = None
        self._system_role = True
        self._served: tuple[dict[str, Any], str] | None = None  # what the server says about the model, its digest
        self._warned: set[str] = set()
        self._label_cache: dict[tuple[str, ...], list[list[int]]] = {}

    @property
    def config(self) -> OpenAIConfig:
        """The client's settings (the transport reads them at every request)."""
        return self.transport.config

    @config.setter
    def config(self, value: OpenAIConfig) -> None:
        """Swap the settings (the preflight does, for quicker retries); the
        request dialect is fixed when the client is built."""
        if not isinstance(value, OpenAIConfig):
            raise TypeError(f"config: expected an OpenAIConfig, got {type(value).__name__}")
        if value.prompt_logprobs_field != self.dialect.prompt_logprobs_field:
            raise ValueError("config: prompt_logprobs_field is fixed when the client is built; build a new client")
        self.transport.config = value

    @property
    def retries(self) -> int:
        """Requests retried so far (all calls)."""
        return self.transport.retries

    @property
    def capabilities(self) -> Capabilities:
        """What the server was found to do so far (one frozen record)."""
        return self.prober.record

    @property
    def identity(self) -> str:
        """The model identity (the call cache keys on it, as on every
        backend's ``identity``): :attr:`config_identity` ``+ ":served-" +``
        a digest of what the server says about the model behind the name
        (:func:`rcn_fast.llm.openai.identity.served_identity`: its
        ``/v1/models`` entry and a fixed probe's top log-probs), asked once
        per client. Raises :class:`ServerError` when the server cannot be
        reached."""
        if self._served is None:
            from rcn_fast.llm.openai.identity import served_digest, served_identity

            with self._identity_lock:
                if self._served is None:
                    info = served_identity(self)
                    self._served = (info, served_digest(info))
        return f"{self.config_identity}:served-{self._served[1]}"

    @property
    def served_info(self) -> dict[str, Any] | None:
        """What the server said about the model (:attr:`identity`), or None before it was asked."""
        return None if self._served is None else self._served[0]

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
            from rcn_fast.llm import tokenizer as toklib

            spec = self.config.tokenizer
            tok = None
            if spec is not None:
                tok = toklib.load_tokenizer(spec)
            elif self.config.mode != "chat" and resolvable(self.model):
                try:
                    tok = toklib.load_tokenizer(self.model)
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
        self.transport.close()

    def warn_once(self, key: str, msg: str) -> None:
        """Log ``msg`` as a warning, once per ``key`` and client."""
        if key not in self._warned:
            self._warned.add(key)
            log.warning(msg)

    # ------------------------------------------------------------ prompts

    def encode_chat(self, chat: Chat) -> list[int]:
        """Token ids of a chat rendered exactly as the local backend renders it."""
        tok = self._tokenizer
        text = chatlib.render_chat(tok, chat, system_role=self._system_role)
        ids = list(tok.encode(text, add_special_tokens=not chatlib.has_chat_template(tok)))
        if not ids:
            raise ValueError("chats: a prompt encodes to no tokens")
        return ids

    def post_prompts(self, prompts: list[list[int]], fields: dict[str, Any]) -> dict[str, Any]:
        """POST token-id prompts (or, to a server without them, their text)
        to ``/completions`` and check the server's prompt token count."""
        text = self.capabilities.text_prompts
        if text and len(prompts) != 1:
            raise AssertionError("text prompts go one per request")
        body = self.dialect.completions(prompts, fields, self._tokenizer.decode(prompts[0]) if text else None)
        out = self.transport.post("/completions", body)
        got = usage_tokens(out, "prompt_tokens")
        want = sum(len(p) for p in prompts)
        if isinstance(got, int) and got != want:
            how = "tokenised the rendered text" if text else "received the token ids"
            raise ServerError(
                f"{self.base_url}/completions: the server counted {got} prompt tokens where the prompt has {want} "
                f"(it {how} differently: a BOS or other special tokens added by the server, or a tokenizer that "
                f"is not the served model's); tokenizer={self.config.tokenizer or self.model!r}"
            )
        return out

    def ask_chat(self, chat: Chat, fields: dict[str, Any]) -> dict[str, Any]:
        """One chat-mode request; with a tokenizer, a pre-filled answer's
        prompt token count is checked against the local rendering."""
        out = self.transport.post("/chat/completions", self.dialect.chat(chat, fields))
        if self._tokenizer is not None and chat[-1]["role"] == "assistant":
            got = usage_tokens(out, "prompt_tokens")
            if isinstance(got, int):
                want = len(self.encode_chat(chat))
                if got > want + 1:  # one more for a BOS the template does not write
                    raise ServerError(
                        f"{self.base_url}/chat/completions: the server counted {got} prompt tokens where the "
                        f"pre-filled chat has {want}: it did not continue the final assistant turn (it ignores "
                        f"continue_final_message) and answered in a new turn; use mode='auto' or 'completions' "
                        f"with tokenizer={self.config.tokenizer or self.model!r}"
                    )
        return out

    def _chat_prefill_probe(self, chats: Sequence[Chat]) -> None:
        """Chat mode without a tokenizer: pre-filled chats need the pre-fill probe to pass."""
        if self._tokenizer is None and any(c[-1]["role"] == "assistant" for c in chats):
            self.prober.prefill()

    # ------------------------------------------------------------ generation

    def _draw(self, valid: list[Any], params: GenerationParams, sids: list[list[int]],
              tags: list[str] | None) -> list[list[Generation]]:
        """Samples ``sample_ids[b]`` of each chat: sample ``s`` is requested
        with ``sample_seed(seed, s)``, one request per row and sample."""
        self.prepare()
        tokens = self.uses_tokens
        ids = [self.encode_chat(c) for c in valid] if tokens else None
        if ids is not None:
            self.prober.token_prompts(ids[0])
        else:
            self._chat_prefill_probe(valid)
        jobs = [(i, s) for i in range(len(valid)) for s in sids[i]]

        def one(job: tuple[int, int]) -> Generation:
            i, s = job
            fields = self.dialect.sample_fields(params, s)
            out = self.post_prompts([ids[i]], fields) if ids is not None else self.ask_chat(valid[i], fields)
            return self.dialect.generation(out, ids is not None, self.base_url)

        flat = self.transport.map(one, jobs)
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
            prefixes = [self.encode_chat(c) for c in valid]
            spell = [self.label_ids_for(r) for r in rows]
            raw = self.scorer.score_tokens(self._tokenizer, prefixes, spell, rows)
            lens = [len(p) for p in prefixes]
        else:
            if self.config.label_scoring == "prompt_logprobs":
                raise ValueError(f"label_scoring: 'prompt_logprobs' needs token-id prompts, so a tokenizer "
                                 f"(tokenizer=) and mode 'auto' or 'completions'; got mode={self.config.mode!r}")
            self._chat_prefill_probe(valid)
            self.warn_once("chat-top", f"{self.base_url}: label scoring in chat mode reads the next-token top "
                                       f"log-probs (no prompt log-probs there); pass tokenizer= for exact scores")
            raw, lens = self.scorer.score_top_chat(valid, rows)
        out = label_scoring.finish_label_scores(raw, rows, self.config_identity, tags)
        self.cost.record_rows([Cost(1, n, 0) for n in lens], tags)
        return out


def load_spec(rest: str, **options: Any) -> OpenAILLM:
    """The ``openai:<base_url>#<model>`` backend of :func:`rcn_fast.llm.load_llm`
    (``rest``: the spec after ``openai:``; ``options``: :class:`OpenAIConfig` fields)."""
    url, sep, model = rest.partition("#")
    if not url or not sep or not model:
        raise ValueError(f"spec: expected 'openai:<base_url>#<model>', got {'openai:' + rest!r}")
    return OpenAILLM(url, model, OpenAIConfig(**options))


__all__ = ["OpenAILLM", "OpenAIConfig", "ServerError", "load_spec"]
