"""The LLM protocol, its data records and cost accounting."""

from __future__ import annotations

import math
import threading
import warnings
from dataclasses import asdict, dataclass, field
from typing import Any, Iterable, Protocol, Sequence, runtime_checkable

import numpy as np

from rcn_fast._validate import is_int, is_number
from rcn_fast.llm.chat import Chat


@dataclass
class Generation:
    """One generated continuation.

    ``finish_reason`` is ``"stop"`` (end-of-turn/EOS token or a stop string)
    or ``"length"`` (``max_new_tokens`` reached). ``text`` excludes the
    pre-fill and the stop string.
    """

    text: str
    prompt_tokens: int
    generated_tokens: int
    finish_reason: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Generation":
        return cls(**d)


@dataclass
class GenerationParams:
    """Decoding parameters (plain data, JSON-serialisable)."""

    max_new_tokens: int = 256
    temperature: float = 0.0
    top_p: float = 1.0
    num_samples: int = 1
    seed: int = 0
    stop: list[str] | None = None

    def __post_init__(self) -> None:
        if not is_int(self.max_new_tokens) or self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens: expected an int >= 1, got {self.max_new_tokens!r}")
        if not is_number(self.temperature) or not math.isfinite(self.temperature) or self.temperature < 0:
            raise ValueError(f"temperature: expected a finite number >= 0, got {self.temperature!r}")
        if not is_number(self.top_p) or not math.isfinite(self.top_p) or not 0 < self.top_p <= 1:
            raise ValueError(f"top_p: expected a finite number in (0, 1], got {self.top_p!r}")
        if not is_int(self.num_samples) or self.num_samples < 1:
            raise ValueError(f"num_samples: expected an int >= 1, got {self.num_samples!r}")
        if not is_int(self.seed):
            raise TypeError(f"seed: expected an int, got {type(self.seed).__name__}")
        if self.stop is not None:
            if isinstance(self.stop, str):
                self.stop = [self.stop]
            if not all(isinstance(s, str) and s for s in self.stop):
                raise ValueError(f"stop: expected a list of non-empty strings, got {self.stop!r}")
            self.stop = list(self.stop)
        if self.temperature == 0 and self.num_samples > 1:
            raise ValueError("num_samples: greedy decoding (temperature=0) gives one sample; set temperature > 0")
        self.temperature = float(self.temperature)
        self.top_p = float(self.top_p)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Cost:
    """LLM usage: calls (one per chat row and sample set), prompt and
    generated tokens, and how many of the calls were answered by the cache
    (cached calls still count their tokens, so a rerun reports the same
    cost as the first run)."""

    calls: int = 0
    prompt_tokens: int = 0
    generated_tokens: int = 0
    cached_calls: int = 0

    def add(self, other: "Cost") -> None:
        self.calls += other.calls
        self.prompt_tokens += other.prompt_tokens
        self.generated_tokens += other.generated_tokens
        self.cached_calls += other.cached_calls

    def to_dict(self) -> dict[str, int]:
        return asdict(self)


@dataclass
class CostTracker:
    """Totals and per-tag (e.g. per question id) cost. Recording is
    thread-safe; ``last`` is only meaningful without concurrent calls."""

    total: Cost = field(default_factory=Cost)
    by_tag: dict[str, Cost] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self.last: list[Cost] = []

    def record(self, cost: Cost, tag: str | None = None) -> None:
        with self._lock:
            self.total.add(cost)
            if tag is not None:
                self.by_tag.setdefault(str(tag), Cost()).add(cost)

    def record_rows(self, costs: Sequence[Cost], tags: Sequence[str] | None) -> None:
        """Record one cost per row of a call; ``last`` keeps them (the rows
        of the most recent call, read by wrappers such as the call cache)."""
        for i, c in enumerate(costs):
            self.record(c, None if tags is None else tags[i])
        self.last = list(costs)

    def reset(self) -> None:
        with self._lock:
            self.total = Cost()
            self.by_tag = {}
            self.last = []

    def to_dict(self) -> dict[str, Any]:
        return {"total": self.total.to_dict(), "by_tag": {k: v.to_dict() for k, v in self.by_tag.items()}}


def check_tags(tags: Sequence[str] | None, n: int) -> list[str] | None:
    if tags is None:
        return None
    if isinstance(tags, str) or len(tags) != n:
        raise ValueError(f"tags: expected a list of {n} tags (one per chat), got {tags!r:.80}")
    return [str(t) for t in tags]


def check_sample_ids(sample_ids: Any, n: int, greedy: bool) -> list[list[int]]:
    """Validate per-row sample indices: ``n`` non-empty lists of distinct
    ints >= 0 (only ``[0]`` when decoding is greedy)."""
    if isinstance(sample_ids, (str, bytes)) or not isinstance(sample_ids, Sequence) or len(sample_ids) != n:
        raise ValueError(f"sample_ids: expected {n} lists of sample indices (one per chat), got {sample_ids!r:.80}")
    out: list[list[int]] = []
    for i, row in enumerate(sample_ids):
        if isinstance(row, (str, bytes)) or not isinstance(row, Sequence) or not row:
            raise ValueError(f"sample_ids[{i}]: expected a non-empty list of sample indices, got {row!r:.80}")
        if not all(isinstance(s, (int, np.integer)) and not isinstance(s, bool) and s >= 0 for s in row):
            raise ValueError(f"sample_ids[{i}]: expected ints >= 0, got {row!r:.80}")
        if len(set(row)) != len(row):
            raise ValueError(f"sample_ids[{i}]: expected distinct indices, got {row!r:.80}")
        if greedy and list(row) != [0]:
            raise ValueError(f"sample_ids[{i}]: greedy decoding (temperature=0) has only sample 0, got {row!r:.80}")
        out.append([int(s) for s in row])
    return out


def sample_request(chats: Sequence[Any], sample_ids: Any, *, max_new_tokens: int, temperature: float,
                   top_p: float, seed: int, stop: Sequence[str] | None,
                   tags: Sequence[str] | None) -> tuple[list[Any], GenerationParams, list[list[int]], list[str] | None]:
    """The checked inputs of a backend's ``generate_samples``: the valid
    chats, the decoding parameters, the sample indices per chat and the
    tags."""
    from rcn_fast.llm import chat as chatlib

    valid = chatlib.validate_chats(chats)
    params = GenerationParams(max_new_tokens, temperature, top_p, 1, seed, list(stop) if stop else None)
    return valid, params, check_sample_ids(sample_ids, len(valid), params.greedy), check_tags(tags, len(valid))


def sample_costs(rows: Sequence[Sequence[Generation]]) -> list[Cost]:
    """Cost of each chat's samples: one call, its prompt counted once, the
    generated tokens of all its samples."""
    return [Cost(1, r[0].prompt_tokens, sum(g.generated_tokens for g in r)) for r in rows]


def generate_by_samples(backend: Any, chats: Sequence[Any], *, max_new_tokens: int, temperature: float,
                        top_p: float, num_samples: int, seed: int, stop: Sequence[str] | None,
                        tags: Sequence[str] | None) -> list[list[Generation]]:
    """``LLM.generate`` for a backend with ``generate_samples``: samples
    ``0 .. num_samples - 1`` of every chat (checks the parameters and the
    chats first)."""
    from rcn_fast.llm import chat as chatlib

    params = GenerationParams(max_new_tokens, temperature, top_p, num_samples, seed, list(stop) if stop else None)
    valid = chatlib.validate_chats(chats)
    return backend.generate_samples(
        valid, [list(range(params.num_samples))] * len(valid), max_new_tokens=max_new_tokens,
        temperature=temperature, top_p=top_p, seed=seed, stop=stop, tags=tags,
    )


def finish_generation(tokenizer: Any, toks: Sequence[int], n_prompt: int, params: GenerationParams,
                      stop_ids: set[int], eos_ids: Sequence[int]) -> Generation:
    """One row's new tokens -> :class:`Generation` (the local backends).

    The text is cut at the first token in ``stop_ids`` (end of turn, EOS,
    padding) and then at the first stop string. ``generated_tokens`` counts
    the tokens the row generated: an end-of-turn token counts, padding after
    a row that a stop string ended does not (the pad id may also be an
    end-of-turn id, so the stop string decides).
    """
    cut = next((k for k, t in enumerate(toks) if t in stop_ids), None)
    body = list(toks) if cut is None else list(toks[:cut])
    text = tokenizer.decode(body, skip_special_tokens=True)
    hits = [p for p in (text.find(s) for s in params.stop or ()) if p >= 0]
    if hits:  # generation ends at the token that completes a stop string
        return Generation(text=text[: min(hits)], prompt_tokens=n_prompt, generated_tokens=len(body),
                          finish_reason="stop")
    if cut is not None:
        return Generation(text=text, prompt_tokens=n_prompt, generated_tokens=cut + (1 if toks[cut] in eos_ids else 0),
                          finish_reason="stop")
    return Generation(text=text, prompt_tokens=n_prompt, generated_tokens=len(toks), finish_reason="length")


def logsumexp(xs: Sequence[float]) -> float:
    """log(sum(exp(x))) of plain floats (-inf for none, or all -inf)."""
    xs = [x for x in xs if x != -math.inf]
    if not xs:
        return -math.inf
    m = max(xs)
    return m + math.log(sum(math.exp(x - m) for x in xs))


def cached_label_ids(cache: dict[tuple[str, ...], list[list[int]]], tokenizer: Any, labels: Sequence[str],
                     spellings: Sequence[str]) -> list[list[int]]:
    """Spelling token ids of each label (:func:`rcn_fast.llm.scoring.choice.label_token_ids`),
    kept in ``cache`` by label tuple."""
    key = tuple(labels)
    if key not in cache:
        from rcn_fast.llm.scoring import choice as scoring

        cache[key] = scoring.label_token_ids(tokenizer, labels, spellings)
    return cache[key]


#: end-of-turn tokens of common chat templates: generation stops at those a vocabulary holds
END_OF_TURN_TOKENS = ("<|im_end|>", "<|eot_id|>", "<end_of_turn>", "<|end|>", "<|endoftext|>", "<|eom_id|>")


def stop_token_ids(tokenizer: Any, extra: Iterable[int] = ()) -> list[int]:
    """The ids that end a generation (the local backends), sorted: ``extra``
    (a generation config's EOS ids), the tokenizer's EOS id and those of
    the :data:`END_OF_TURN_TOKENS` that are its special or added tokens."""
    ids = {int(e) for e in extra}
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    added = set(getattr(tokenizer, "all_special_tokens", [])) | set(tokenizer.get_added_vocab())
    for tok in END_OF_TURN_TOKENS:
        if tok in added:
            ids.add(int(tokenizer.convert_tokens_to_ids(tok)))
    return sorted(ids)


class SampleBackend:
    """Base of the backends that draw samples by index (HF and the native
    engine, through :class:`LocalBackend`; OpenAI server, vLLM) and of the
    call cache's :class:`~rcn_fast.llm.cache.CachedLLM`: :meth:`generate`
    and :meth:`generate_samples` check their arguments here; a subclass
    implements :meth:`_draw`."""

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
        """Continue each chat.

        Parameters
        ----------
        chats : list of chats, length B
            A final assistant turn is a pre-fill (the output continues it
            and does not repeat it).
        max_new_tokens, temperature, top_p, num_samples, seed, stop
            Decoding; temperature 0 is greedy. Sample ``s`` of a chat
            depends only on (model, prompt, parameters, ``seed``, ``s``):
            not on the other chats of the call, the batch size or
            ``num_samples`` (see :mod:`rcn_fast.llm.seeded`).
        tags : list of str, optional
            One per chat (e.g. question ids) for per-tag cost.

        Returns
        -------
        list (length B) of list (length num_samples) of Generation
        """
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
        """Draw chosen sample indices of each chat (the call cache uses this
        to draw only the samples it lacks).

        Parameters
        ----------
        chats : list of chats, length B
        sample_ids : list (length B) of non-empty lists of distinct int >= 0
            ``sample_ids[b]`` are the sample indices to draw for chat b;
            sample ``s`` equals sample ``s`` of :meth:`generate` with the
            same parameters.
        max_new_tokens, temperature, top_p, seed, stop, tags
            As in :meth:`generate`.

        Returns
        -------
        list (length B) of list of Generation, aligned with ``sample_ids``.
        """
        valid, params, sids, tags = sample_request(chats, sample_ids, max_new_tokens=max_new_tokens,
                                                   temperature=temperature, top_p=top_p, seed=seed, stop=stop,
                                                   tags=tags)
        if not valid:
            return []
        return self._draw(valid, params, sids, tags)

    def _draw(self, chats: list[Any], params: GenerationParams, sample_ids: list[list[int]],
              tags: list[str] | None) -> list[list[Generation]]:
        """The samples ``sample_ids[b]`` of each (checked, non-empty) chat
        list, with the backend's cost recorded."""
        raise NotImplementedError


class LocalBackend(SampleBackend):
    """Base of the backends that run a model in this process on its own
    tokenizer (transformers' :class:`~rcn_fast.llm.backends.hf.HFLLM`; the native
    engine's :class:`~rcn_fast.llm.backends.engine.GGUFLLM` and llama.cpp's
    :class:`~rcn_fast.llm.backends.llamacpp.LlamaCppLLM` through
    :class:`~rcn_fast.llm.backends.in_process.InProcessGGUFBackend`): chat
    rendering, label ids, label scoring and drawing samples, the same for all.

    A subclass sets ``tokenizer``, ``system_role``, ``name``, ``cost``,
    ``config.label_spellings`` and ``_label_cache`` (a dict), and
    implements ``encode_texts``, ``score_ids`` and ``generate_ids``;
    :attr:`prefix` names the backend in error messages.
    """

    #: the backend in messages: ``"<prefix>:<name>"``
    prefix = ""
    tokenizer: Any
    system_role: bool
    name: str
    cost: CostTracker
    config: Any
    _label_cache: dict[tuple[str, ...], list[list[int]]]

    def render(self, chats: Sequence[Any]) -> list[str]:
        """Prompt texts of validated chats (see :mod:`rcn_fast.llm.chat`)."""
        from rcn_fast.llm import chat as chatlib

        return [chatlib.render_chat(self.tokenizer, c, system_role=self.system_role) for c in chats]

    def encode_texts(self, texts: Sequence[str]) -> list[list[int]]:
        raise NotImplementedError

    def encode_chats(self, chats: Sequence[Any]) -> list[list[int]]:
        from rcn_fast.llm import chat as chatlib

        return self.encode_texts(self.render(chatlib.validate_chats(chats)))

    def label_ids_for(self, labels: Sequence[str]) -> list[list[int]]:
        return cached_label_ids(self._label_cache, self.tokenizer, labels, self.config.label_spellings)

    def score_ids(self, prompt_ids: Sequence[Sequence[int]],
                  label_ids: Sequence[Sequence[Sequence[int]]]) -> list[list[float]]:
        raise NotImplementedError

    def generate_ids(self, prompt_ids: Sequence[Sequence[int]], params: GenerationParams,
                     sample_ids: Sequence[Sequence[int]] | None = None) -> list[list[Generation]]:
        """Generate from tokenised prompts (rows in the caller's order).

        Parameters
        ----------
        prompt_ids : list (length B) of list of int
        params : GenerationParams
        sample_ids : list (length B) of list of int, optional
            Which sample indices to draw per prompt; default
            ``range(params.num_samples)`` for every prompt.

        Returns
        -------
        list (length B) of list of Generation, one per requested sample index.

        Every (prompt, sample) pair is one row; a sample depends only on
        (model, prompt, parameters, seed, sample index) (the uniforms of
        :mod:`rcn_fast.llm.seeded`).

        Raises
        ------
        rcn_fast.llm.backends.logits.NonFiniteLogitsError
            A NaN or ``+inf`` next-token logit (or a row of ``-inf`` only):
            broken numbers are an error, never text.
        """
        raise NotImplementedError

    def _draw(self, valid: list[Any], params: GenerationParams, sids: list[list[int]],
              tags: list[str] | None) -> list[list[Generation]]:
        """Samples ``sample_ids[b]`` of each chat, generated on the model
        (:meth:`generate_ids`)."""
        res = self.generate_ids(self.encode_texts(self.render(valid)), params, sids)
        self.cost.record_rows(sample_costs(res), tags)
        return res

    def label_logprobs(self, chats: Sequence[Any], labels: Any, *, tags: Sequence[str] | None = None) -> np.ndarray:
        """Log-probabilities over choice labels after each chat.

        Parameters
        ----------
        chats : list of chats, length B
            Normally ending in a pre-filled assistant turn ``"Answer: "``.
        labels : list of str, or list (length B) of list of str
            The same labels for every row, or per row (ragged rows are
            padded with ``-inf``).
        tags : list of str, optional

        Returns
        -------
        float32 ndarray [B, C]
            Log-softmax over the labels of each row. Each label is scored
            by the logsumexp of its single-token spellings (``"A"`` and
            ``" A"`` by default); a label with no single-token spelling is
            a ValueError.

        Raises
        ------
        LabelScoreError
            A row the model scores NaN or ``+inf`` (NaN logits, an
            overflow): :func:`rcn_fast.llm.scoring.choice.check_label_scores`.
        """
        from rcn_fast.llm import chat as chatlib
        from rcn_fast.llm.scoring import choice as scoring

        valid = chatlib.validate_chats(chats)
        rows = normalise_labels(labels, len(valid))
        tags = check_tags(tags, len(valid))
        if not valid:
            return np.zeros((0, 0), dtype=np.float32)
        prompt_ids = self.encode_texts(self.render(valid))
        res = self.score_ids(prompt_ids, [self.label_ids_for(r) for r in rows])
        scoring.check_label_scores(res, rows, f"{self.prefix}:{self.name}", tags)  # a NaN row fails its question
        self.cost.record_rows([Cost(1, len(p), 0) for p in prompt_ids], tags)
        return pad_rows(res)


def normalise_labels(labels: Any, n: int) -> list[list[str]]:
    """``labels``: one list for every row, or one list per row -> per row."""
    if isinstance(labels, str) or not isinstance(labels, Sequence) or len(labels) == 0:
        raise TypeError(f"labels: expected a list of label strings or a list of such lists, got {labels!r:.80}")
    if all(isinstance(x, str) for x in labels):
        rows = [list(labels)] * n
    elif all(isinstance(x, Sequence) and not isinstance(x, str) for x in labels):
        if len(labels) != n:
            raise ValueError(f"labels: expected {n} lists (one per chat), got {len(labels)}")
        rows = [list(x) for x in labels]
    else:
        raise TypeError("labels: expected a list of strings or a list of lists of strings")
    for i, row in enumerate(rows):
        if not row or not all(isinstance(x, str) and x for x in row):
            raise ValueError(f"labels[{i}]: expected a non-empty list of non-empty strings, got {row!r}")
        if len(set(row)) != len(row):
            raise ValueError(f"labels[{i}]: expected distinct labels, got {row!r}")
    return rows


class ContextLengthWarning(UserWarning):
    """A prompt is longer than the model's context window.

    The prompt runs as given (nothing is truncated: which part of a question
    to drop is not the backend's decision), but a model's outputs past its
    trained context are unreliable. Shorten the input, or use a model with a
    longer context.
    """


def context_length(config: Any) -> int | None:
    """The context window (tokens) a model config declares, or None.

    Reads ``max_position_embeddings``, ``n_positions``, ``max_seq_len`` or
    ``seq_length`` (the first that is a positive int).
    """
    for name in ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length"):
        v = getattr(config, name, None)
        if isinstance(v, int) and not isinstance(v, bool) and v > 0:
            return v
    return None


def warn_long_prompts(lengths: Sequence[int], context: int | None, model: str, stacklevel: int = 3) -> int:
    """Warn (:class:`ContextLengthWarning`) when prompts exceed ``context``.

    Parameters
    ----------
    lengths : prompt lengths in tokens, one per row
    context : the model's context window; None skips the check
    model : the model's name, for the message

    Returns
    -------
    int : how many prompts are longer than ``context``.
    """
    if context is None:
        return 0
    over = [(i, n) for i, n in enumerate(lengths) if n > context]
    if over:
        i, n = max(over, key=lambda t: t[1])
        warnings.warn(
            f"{len(over)} of {len(lengths)} prompt(s) are longer than the {context}-token context of {model} "
            f"(the longest, row {i}, has {n} tokens); they run untruncated and the model's answers to them are "
            "unreliable: shorten the input or use a model with a longer context",
            ContextLengthWarning, stacklevel=stacklevel)
    return len(over)


def check_prompt_ids(prompt_ids: Sequence[Sequence[int]], context: int | None, model: str) -> int:
    """Refuse a prompt that encodes to no tokens (ValueError naming its row
    in ``chats``) and warn about prompts longer than ``context``
    (:func:`warn_long_prompts`); returns how many are."""
    for i, ids in enumerate(prompt_ids):
        if not ids:
            raise ValueError(f"chats[{i}]: the prompt encodes to no tokens")
    return warn_long_prompts([len(ids) for ids in prompt_ids], context, model, stacklevel=4)


def pad_rows(rows: Sequence[Sequence[float]]) -> np.ndarray:
    """Ragged per-row label log-probs -> float32 [B, C], -inf padded."""
    C = max((len(r) for r in rows), default=0)
    out = np.full((len(rows), C), -np.inf, dtype=np.float32)
    for i, r in enumerate(rows):
        out[i, : len(r)] = r
    return out


@runtime_checkable
class LLM(Protocol):
    """What pipelines need from a language model.

    ``identity`` names the model and every setting that changes its outputs
    -- the one model identity of every backend: a weights fingerprint (HF,
    vLLM), what the server says about its model (OpenAI-compatible
    servers). The call cache keys on it, and so should anything else that
    must change with the model (checkpoints); ``cost`` accumulates usage.

    Sampling: sample ``s`` of a chat should depend only on (model, prompt,
    parameters, seed, ``s``), not on the other chats of a call or on
    ``num_samples``; rcn_fast's backends guarantee it. A backend may also
    offer ``generate_samples(chats, sample_ids, **params)`` to draw chosen
    sample indices (the call cache uses it to draw only missing samples).
    """

    identity: str
    cost: CostTracker

    def generate(
        self,
        chats: Sequence[Chat],
        *,
        max_new_tokens: int = 256,
        temperature: float = 0.0,
        top_p: float = 1.0,
        num_samples: int = 1,
        seed: int = 0,
        stop: Sequence[str] | None = None,
        tags: Sequence[str] | None = None,
    ) -> list[list[Generation]]:
        """Per chat, ``num_samples`` continuations."""
        ...

    def label_logprobs(
        self, chats: Sequence[Chat], labels: Any, *, tags: Sequence[str] | None = None
    ) -> np.ndarray:
        """float32 [B, C]: log-softmax over the labels at the position after
        each chat (normally a pre-filled ``"Answer: "`` turn)."""
        ...
