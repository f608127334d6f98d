"""Settings of the OpenAI-compatible client (:class:`rcn_fast.llm.openai.client.OpenAILLM`):
plain data, checked when built, shared by its transport, dialect and
capability probes."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rcn_fast._validate import is_int, is_number

_MODES = ("auto", "completions", "chat")
_SCORING = ("auto", "prompt_logprobs", "top_logprobs")
_PROMPT_FIELDS = ("echo", "vllm")


@dataclass
class OpenAIConfig:
    """Client settings (plain data; see :mod:`rcn_fast.llm.openai.client`).

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
        legacy fields: vLLM, SGLang, rcn_fast.llm.server.app) or ``"vllm"``
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


def resolvable(name: str) -> bool:
    """A local model directory or file, ``package:<module>``, or a hub id."""
    if name.startswith("package:"):
        return True
    p = Path(name).expanduser()
    if p.exists():
        return True
    parts = name.split("/")
    return len(parts) == 2 and all(parts) and not name.startswith((".", "/", "~"))


__all__ = ["OpenAIConfig", "resolvable"]
