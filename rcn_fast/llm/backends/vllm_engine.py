"""vLLM's offline engine in this process (GPU), behind the LLM protocol.

Optional: ``pip install vllm`` (not part of any rcn_fast extra: it pulls a
CUDA build of torch). Chats are rendered here with the model's tokenizer
(the same rendering as the local backend: pre-fill kept open, system-role
fallback) and sent as **token ids** (``{"prompt_token_ids": ...}``), so
prompts are identical across backends and vLLM never adds special tokens
to them (``LLM.generate`` on rendered *text* would add a second BOS to
Llama-3 prompts).

Label scoring is exact (:mod:`rcn_fast.llm.scoring.served`, shared with the
OpenAI-compatible client): each label spelling ``t`` scores ``log p(t |
prefix)``, read from the next-token top-``top_logprobs`` log-probs (keyed
by token id) where ``t`` is among them, else from the prompt log-prob of
``prefix + [t]`` (``prompt_logprobs=0``, which returns the prompt token's
own log-prob at every position). Spellings combine by logsumexp and labels
by log-softmax, as the other backends do; no label is ever ``-inf``. A
NaN, ``+inf`` or positive label log-prob is a
:class:`~rcn_fast.llm.scoring.choice.LabelScoreError` naming the question.

Not exercised by the test suite on machines without vLLM and a GPU (a fake
``vllm`` module checks what is passed to it).
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from rcn_fast import _arrays as A
from rcn_fast.llm import chat as chatlib
from rcn_fast.llm.scoring import labels as labels_mod
from rcn_fast.llm.scoring import served as label_scoring
from rcn_fast.llm.base import (
    Cost,
    CostTracker,
    Generation,
    GenerationParams,
    SampleBackend,
    check_tags,
    normalise_labels,
    sample_costs,
)
from rcn_fast.llm.seeded import sample_seed

HINT = "pip install vllm (needs a CUDA GPU; it installs its own torch build)"


class VLLMEngine(SampleBackend):
    """An LLM run by ``vllm.LLM``.

    Parameters
    ----------
    model : str
        A model directory or hub id vLLM can load.
    top_logprobs : int
        Next-token entries read first in label scoring (at most the
        engine's ``max_logprobs``, 20 unless raised).
    label_spellings : tuple of str
        As in :class:`rcn_fast.llm.backends.hf.HFConfig`.
    **engine_kwargs
        Passed to ``vllm.LLM`` (``dtype``, ``tensor_parallel_size``,
        ``gpu_memory_utilization``, ``max_model_len``, ``max_logprobs`` ...).
    """

    def __init__(self, model: str, *, top_logprobs: int = 20, label_spellings: Sequence[str] = ("{}", " {}"), **engine_kwargs: Any) -> None:
        vllm = A.require("vllm", HINT)
        if not isinstance(model, str) or not model:
            raise ValueError(f"model: expected a model path or hub id, got {model!r}")
        self._vllm = vllm
        self.name = model
        if engine_kwargs.get("trust_remote_code"):
            raise ValueError("trust_remote_code: rcn_fast never runs a model's own Python code; use a model vLLM "
                             "supports natively")
        self.engine = vllm.LLM(model=model, **{**engine_kwargs, "trust_remote_code": False})
        self.tokenizer = self.engine.get_tokenizer()
        self.top_logprobs = int(top_logprobs)
        self.label_spellings = tuple(label_spellings)
        self.engine_kwargs = dict(engine_kwargs)
        self.cost = CostTracker()
        self._weights: str | None = None  # the weights' fingerprint, hashed on first use
        self.system_role = chatlib.template_supports_system(self.tokenizer) if chatlib.has_chat_template(self.tokenizer) else True

    @property
    def identity(self) -> str:
        """``vllm:<model>:<engine kwargs>:<spellings>:<weights>``: the model
        identity the call cache keys on. ``<weights>`` is 16 hex digits of
        :func:`rcn_fast.model_files.model_fingerprint` over the model
        folder's config, tokenizer and weight files (the folder the name
        resolves to: a path, ``package:<module>`` or a hub id in the local
        cache; hashed once per process), or ``unresolved`` when the name
        resolves to no local folder."""
        kw = ",".join(f"{k}={v}" for k, v in sorted(self.engine_kwargs.items()))
        if self._weights is None:
            self._weights = _weights_fingerprint(self.name)
        return f"vllm:{self.name}:{kw}:{','.join(self.label_spellings)}:{self._weights}"

    def _prompts(self, chats: Sequence[Any]) -> list[list[int]]:
        special = not chatlib.has_chat_template(self.tokenizer)
        texts = [chatlib.render_chat(self.tokenizer, c, system_role=self.system_role) for c in chats]
        return [list(self.tokenizer.encode(t, add_special_tokens=special)) for t in texts]

    def _draw(self, valid: list[Any], params: GenerationParams, sids: list[list[int]],
              tags: list[str] | None) -> list[list[Generation]]:
        """Samples ``sample_ids[b]`` of each chat: one vLLM request per
        sample (``n=1``) seeded with ``sample_seed(seed, s)``, so a sample
        does not depend on the other requests or on ``num_samples``."""
        ids = self._prompts(valid)
        jobs = [(i, s) for i in range(len(valid)) for s in sids[i]]
        sps = [
            self._vllm.SamplingParams(
                n=1, temperature=params.temperature, top_p=params.top_p, max_tokens=params.max_new_tokens,
                seed=None if params.greedy else sample_seed(params.seed, s), stop=params.stop,
            )
            for _, s in jobs
        ]
        outs = self.engine.generate([{"prompt_token_ids": ids[i]} for i, _ in jobs], sps, use_tqdm=False)
        res: list[list[Generation]] = [[] for _ in valid]
        for (i, _), out in zip(jobs, outs):
            o = out.outputs[0]
            res[i].append(Generation(o.text, len(ids[i]), len(o.token_ids), "length" if o.finish_reason == "length" else "stop"))
        self.cost.record_rows(sample_costs(res), tags)
        return res

    def label_logprobs(self, chats: Sequence[Any], labels: Any, *, tags: Sequence[str] | None = None) -> np.ndarray:
        """As :meth:`rcn_fast.llm.LLM.label_logprobs` (exact; see the module notes).

        Returns
        -------
        float32 ndarray [B, C]
        """
        valid = chatlib.validate_chats(chats)
        rows = normalise_labels(labels, len(valid))
        tags = check_tags(tags, len(valid))
        if not valid:
            return np.zeros((0, 0), dtype=np.float32)
        ids = self._prompts(valid)
        spell = [labels_mod.label_token_ids(self.tokenizer, row, self.label_spellings) for row in rows]
        sp = self._vllm.SamplingParams(max_tokens=1, temperature=0.0, logprobs=self.top_logprobs)
        outs = self.engine.generate([{"prompt_token_ids": p} for p in ids], sp, use_tqdm=False)
        tops = [{t: float(v.logprob) for t, v in out.outputs[0].logprobs[0].items()} for out in outs]

        def prompt_logprobs(missing: list[tuple[int, int]]) -> list[float]:
            sp = self._vllm.SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=0)
            outs = self.engine.generate([{"prompt_token_ids": ids[b] + [t]} for b, t in missing], sp, use_tqdm=False)
            return [float(out.prompt_logprobs[-1][t].logprob) for (_, t), out in zip(missing, outs)]

        raw = label_scoring.exact_label_scores(spell, tops, prompt_logprobs)
        res = label_scoring.finish_label_scores(raw, rows, self.identity, tags)
        self.cost.record_rows([Cost(1, len(p), 0) for p in ids], tags)
        return res


def load_spec(rest: str, **options: Any) -> VLLMEngine:
    """The ``vllm:<model>`` backend of :func:`rcn_fast.llm.load_llm`
    (``options``: :class:`VLLMEngine`'s keyword arguments)."""
    return VLLMEngine(rest, **options)


def _weights_fingerprint(name: str) -> str:
    """16 hex digits of the model folder's fingerprint, or ``unresolved``."""
    from rcn_fast.model_files import model_fingerprint, resolve_model_path

    try:
        path = resolve_model_path(name, local_files_only=True)
    except (ValueError, OSError):
        return "unresolved"
    return model_fingerprint(path)[:16] if path.is_dir() else "unresolved"
