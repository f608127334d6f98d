"""Local Hugging Face transformers backend.

Batches are formed from prompts sorted by token length (longest first), so
rows of a batch have similar lengths and little padding; padding is on the
left, position ids follow the attention mask, results come back in the
caller's order.

Label scoring runs one forward pass per batch and never materialises
``[B, T, V]`` logits: for models whose LM head is a plain linear map (the
Llama/Qwen/Mistral families, see ``PLAIN_HEAD_MODEL_TYPES``) it takes the
final hidden state ``[B, H]`` and multiplies only the LM-head rows of the
label tokens (:func:`rcn_fast.llm.scoring.choice.choice_logprobs_from_hidden`);
for other models it asks the model for the last position's logits only
(``logits_to_keep=1``) and gathers from those ``[B, V]``.

Generation: greedy decoding, or seeded sampling where each (prompt, sample)
pair is its own row with its own random stream
(:mod:`rcn_fast.llm.seeded`), so a sample does not depend on how rows are
batched or on ``num_samples``. A NaN or ``+inf`` next-token logit stops a
generation with an error (:mod:`rcn_fast.llm.backends.logits`), as a NaN label score
fails its question: broken numbers never become text.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import threading
from dataclasses import asdict, dataclass
from typing import Any, Callable, Iterator, Sequence

from rcn_fast import _arrays as A
from rcn_fast._validate import check_token_ids, is_int
from rcn_fast.llm import chat as chatlib
from rcn_fast.llm import seeded
from rcn_fast.llm.scoring import choice as scoring
from rcn_fast.llm.base import CostTracker, Generation, GenerationParams, LocalBackend
from rcn_fast.llm.base import check_prompt_ids, context_length, finish_generation, stop_token_ids
from rcn_fast.llm.backends.logits import FiniteLogitsCheck, LogitBias, TokenReport

HINT = "pip install 'rcn_fast[llm]'"

# model types whose logits are exactly final_norm(hidden) @ lm_head.weight.T
PLAIN_HEAD_MODEL_TYPES = frozenset(
    {"llama", "mistral", "qwen2", "qwen3", "qwen2_moe", "qwen3_moe", "phi3", "olmo", "olmo2", "smollm3", "gemma", "mixtral"}
)


def _torch() -> Any:
    return A.require("torch", HINT)


@dataclass
class HFConfig:
    """Settings of the local backend (plain data, JSON-serialisable).

    dtype : ``"auto"`` (bfloat16 on CUDA, float32 on CPU), ``"float32"``,
        ``"float16"`` or ``"bfloat16"``.
    device : ``"auto"`` (CUDA when available), ``"cpu"``, ``"cuda"``, ``"cuda:1"``...
    batch_size : rows per forward pass / generate call (in generation a row
        is one sample of one prompt).
    attn_implementation : ``"auto"`` (flash_attention_2 when installed and on
        CUDA, else sdpa), or any value transformers accepts.
    scoring : ``"auto"``, ``"hidden"`` (label rows of the LM head only) or
        ``"logits"`` (last-position logits).
    label_spellings : format strings for the spellings of a label.
    scoring_backend : force the dispatch backend of the scoring op
        (``"triton"`` / ``"torch"``); None = automatic.
    """

    dtype: str = "auto"
    device: str = "auto"
    batch_size: int = 16
    attn_implementation: str = "auto"
    scoring: str = "auto"
    label_spellings: tuple[str, ...] = ("{}", " {}")
    scoring_backend: str | None = None

    def __post_init__(self) -> None:
        if self.dtype not in ("auto", "float32", "float16", "bfloat16"):
            raise ValueError(f"dtype: expected 'auto', 'float32', 'float16' or 'bfloat16', got {self.dtype!r}")
        if not is_int(self.batch_size) or self.batch_size < 1:
            raise ValueError(f"batch_size: expected an int >= 1, got {self.batch_size!r}")
        if self.scoring not in ("auto", "hidden", "logits"):
            raise ValueError(f"scoring: expected 'auto', 'hidden' or 'logits', got {self.scoring!r}")
        self.label_spellings = tuple(self.label_spellings)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def resolved_device(self) -> str:
        if self.device != "auto":
            return self.device
        torch = _torch()
        return "cuda" if torch.cuda.is_available() else "cpu"

    def resolved_dtype(self) -> Any:
        torch = _torch()
        if self.dtype == "auto":
            return torch.bfloat16 if self.resolved_device().startswith("cuda") else torch.float32
        return getattr(torch, self.dtype)

    def resolved_attn(self) -> str:
        if self.attn_implementation != "auto":
            return self.attn_implementation
        if self.resolved_device().startswith("cuda") and A.optional_available("flash_attn"):
            return "flash_attention_2"
        return "sdpa"


class HFLLM(LocalBackend):
    """An LLM served in this process by transformers.

    Parameters
    ----------
    model : transformers causal LM (``PreTrainedModel``)
    tokenizer : transformers tokenizer
    name : str, optional
        Where the model came from (path, hub id); part of ``identity``.
    config : HFConfig, optional
        Device/dtype are applied by :func:`rcn_fast.llm.load_llm`; a
        model passed in directly is used where it is.
    """

    prefix = "hf"

    def __init__(self, model: Any, tokenizer: Any, *, name: str | None = None, config: HFConfig | None = None) -> None:
        torch = _torch()
        if not isinstance(model, torch.nn.Module) or not hasattr(model, "generate"):
            raise TypeError(f"model: expected a transformers causal LM, got {type(model).__name__}")
        if not hasattr(tokenizer, "encode") or not hasattr(tokenizer, "decode"):
            raise TypeError(f"tokenizer: expected a transformers tokenizer, got {type(tokenizer).__name__}")
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.config = config or HFConfig()
        self.name = name or getattr(model, "name_or_path", None) or type(model).__name__
        self.cost = CostTracker()
        if tokenizer.pad_token_id is None:
            tokenizer.pad_token = tokenizer.eos_token
        self.pad_id = int(tokenizer.pad_token_id)
        self.system_role = chatlib.template_supports_system(tokenizer) if chatlib.has_chat_template(tokenizer) else True
        self.eos_ids = self._eos_ids()
        self._label_cache: dict[tuple[str, ...], list[list[int]]] = {}
        self.scoring_mode = self._scoring_mode()
        #: The model's context window in tokens (None when its config declares none).
        self.context_length = context_length(getattr(model, "config", None))
        #: Prompts seen that were longer than ``context_length`` (each also warned about).
        self.long_prompts = 0

    # ---------------------------------------------------------------- info

    @property
    def device(self) -> Any:
        return next(self.model.parameters()).device

    @property
    def vocab_size(self) -> int:
        """Rows of the model's logits (the token ids it takes and scores)."""
        head = self.model.get_output_embeddings()
        weight = getattr(head, "weight", None)
        return int(weight.shape[0]) if weight is not None else int(self.model.config.vocab_size)

    @property
    def identity(self) -> str:
        """``hf:<name>:<dtype>:<digest>``: the digest covers the model config,
        chat template, vocabulary size, label spellings and a fingerprint
        of the weights (:meth:`weights_fingerprint`), so two models with the
        same name but different weights (fine-tuned in memory, another
        checkpoint in the same directory) get different cache keys.

        Computed once (one pass over the weights); after changing weights
        in place call :meth:`refresh_identity`."""
        key = (str(next(self.model.parameters()).dtype), self.config.label_spellings, self.name)
        if getattr(self, "_identity", (None, None))[0] != key:
            self._identity = (key, self._compute_identity())
        return self._identity[1]

    def refresh_identity(self) -> str:
        """Recompute :attr:`identity` (after changing the weights in place)."""
        self._identity = (None, None)
        return self.identity

    def weights_fingerprint(self) -> str:
        """A cheap digest of the weights: per parameter its name, shape,
        dtype, 64 evenly spaced values (exact) and the float64 sum and sum
        of squares of all its values (7 significant digits, so thread
        counts and devices that round the reduction differently agree).
        One pass over the weights, in 4M-element chunks on their device.

        Returns
        -------
        str
            16 hex digits.
        """
        torch = _torch()
        h = hashlib.sha256()
        with torch.no_grad():
            for name, p in self.model.named_parameters():  # tied weights appear once
                t = p.detach().reshape(-1)
                n = t.numel()
                h.update(f"{name}:{tuple(p.shape)}:{p.dtype};".encode())
                if n == 0 or t.device.type == "meta":
                    continue
                idx = torch.arange(0, n, max(1, n // 64), device=t.device)[:64]
                h.update(t[idx].float().cpu().numpy().tobytes())
                acc = torch.zeros(2, dtype=torch.float64, device=t.device)
                for chunk in t.split(1 << 22):
                    c = chunk.double()
                    acc[0] += c.sum()
                    acc[1] += (c * c).sum()
                total, sq = acc.tolist()
                h.update(f"{total:.6e}:{sq:.6e};".encode())
        return h.hexdigest()[:16]

    def _compute_identity(self) -> str:
        cfg = self.model.config.to_dict() if hasattr(self.model.config, "to_dict") else {}
        blob = json.dumps(
            {
                "config": {k: cfg[k] for k in sorted(cfg) if k not in ("_name_or_path", "transformers_version", "dtype", "torch_dtype")},
                "template": getattr(self.tokenizer, "chat_template", None),
                "vocab": len(self.tokenizer),
                "nparams": sum(p.numel() for p in self.model.parameters()),
                "weights": self.weights_fingerprint(),
                "spellings": list(self.config.label_spellings),
            },
            sort_keys=True,
            default=str,
        )
        digest = hashlib.sha256(blob.encode()).hexdigest()[:16]
        dtype = str(next(self.model.parameters()).dtype).removeprefix("torch.")
        return f"hf:{self.name}:{dtype}:{digest}"

    def _eos_ids(self) -> list[int]:
        """:func:`~rcn_fast.llm.base.stop_token_ids` with the generation config's EOS ids."""
        eos = getattr(getattr(self.model, "generation_config", None), "eos_token_id", None)
        extra = [eos] if isinstance(eos, int) else list(eos) if isinstance(eos, (list, tuple)) else []
        return stop_token_ids(self.tokenizer, extra)

    def _scoring_mode(self) -> str:
        torch = _torch()
        if self.config.scoring != "auto":
            return self.config.scoring
        head = self.model.get_output_embeddings()
        mtype = getattr(self.model.config, "model_type", "")
        plain = (
            isinstance(head, torch.nn.Linear)
            and mtype in PLAIN_HEAD_MODEL_TYPES
            and getattr(self.model.config, "final_logit_softcapping", None) is None
            and getattr(self.model.config, "logit_scale", None) is None
        )
        return "hidden" if plain else "logits"

    # ---------------------------------------------------------------- prompts

    def encode_texts(self, texts: Sequence[str]) -> list[list[int]]:
        """Token ids of prompt texts. Prompts longer than the model's context
        run untruncated, with a :class:`~rcn_fast.llm.base.ContextLengthWarning`
        (counted in ``long_prompts``)."""
        special = not chatlib.has_chat_template(self.tokenizer)
        out = [list(self.tokenizer.encode(t, add_special_tokens=special)) for t in texts]
        self.long_prompts += check_prompt_ids(out, self.context_length, self.name)
        return out

    def _batches(self, prompt_ids: Sequence[Sequence[int]]) -> list[list[int]]:
        order = sorted(range(len(prompt_ids)), key=lambda i: -len(prompt_ids[i]))
        bs = self.config.batch_size
        return [order[i : i + bs] for i in range(0, len(order), bs)]

    def _pad_left(self, rows: Sequence[Sequence[int]]) -> tuple[Any, Any, Any]:
        torch = _torch()
        T = max(len(r) for r in rows)
        ids = torch.full((len(rows), T), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(rows), T), dtype=torch.long)
        for i, r in enumerate(rows):
            ids[i, T - len(r) :] = torch.tensor(r, dtype=torch.long)
            mask[i, T - len(r) :] = 1
        pos = (mask.cumsum(-1) - 1).clamp(min=0)
        dev = self.device
        return ids.to(dev), mask.to(dev), pos.to(dev)

    # ---------------------------------------------------------------- forward

    def final_hidden(self, rows: Sequence[Sequence[int]]) -> Any:
        """Final hidden state (after the final norm) at the last position: [B, H]."""
        torch = _torch()
        ids, mask, pos = self._pad_left(rows)
        base = getattr(self.model, self.model.base_model_prefix)
        with torch.inference_mode():
            out = base(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=False)
        return out.last_hidden_state[:, -1]

    def final_logits(self, rows: Sequence[Sequence[int]]) -> Any:
        """Last-position logits [B, V] (``logits_to_keep=1``)."""
        torch = _torch()
        ids, mask, pos = self._pad_left(rows)
        with torch.inference_mode():
            out = self.model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=False, logits_to_keep=1)
        return out.logits[:, -1]

    def score_ids(self, prompt_ids: Sequence[Sequence[int]], label_ids: Sequence[Sequence[Sequence[int]]]) -> list[list[float]]:
        """Label log-probs for tokenised prompts; ``label_ids[b][c]`` are the
        spelling ids of label c of row b. Returns ragged rows."""
        torch = _torch()
        check_token_ids(prompt_ids, self.vocab_size, "prompt_ids")
        check_token_ids(label_ids, self.vocab_size, "label_ids", depth=2)
        out: list[list[float]] = [[] for _ in prompt_ids]
        head = self.model.get_output_embeddings()
        with torch.inference_mode():
            for batch in self._batches(prompt_ids):
                self._score_batch(batch, prompt_ids, label_ids, head, out)
        return out

    def _score_batch(self, batch: list[int], prompt_ids: Any, label_ids: Any, head: Any, out: list[list[float]]) -> None:
        packed = scoring.pack_label_ids([label_ids[i] for i in batch]).to(self.device)
        rows = [prompt_ids[i] for i in batch]
        if self.scoring_mode == "hidden":
            h = self.final_hidden(rows)
            lp, _ = scoring.choice_logprobs_from_hidden(
                h, head.weight, packed, getattr(head, "bias", None), backend=self.config.scoring_backend
            )
        else:
            lp, _ = scoring.choice_logprobs(self.final_logits(rows), packed, backend=self.config.scoring_backend)
        lp = lp.float().cpu().numpy()
        for j, i in enumerate(batch):
            out[i] = lp[j, : len(label_ids[i])].tolist()

    def top_logprobs_ids(self, prompt_ids: Sequence[Sequence[int]], k: int) -> list[list[tuple[int, float]]]:
        """The ``k`` most likely next tokens with their log-probabilities (full
        vocabulary log-softmax of the last position), per prompt."""
        torch = _torch()
        check_token_ids(prompt_ids, self.vocab_size, "prompt_ids")
        out: list[list[tuple[int, float]]] = [[] for _ in prompt_ids]
        for batch in self._batches(prompt_ids):
            lg = self.final_logits([prompt_ids[i] for i in batch]).float()
            lp = torch.log_softmax(lg, dim=-1)
            top = torch.topk(lp, min(k, lp.shape[1]), dim=-1)
            for j, i in enumerate(batch):
                out[i] = list(zip(top.indices[j].tolist(), top.values[j].tolist()))
        return out

    # ---------------------------------------------------------------- generation

    def generate_ids(
        self,
        prompt_ids: Sequence[Sequence[int]],
        params: GenerationParams,
        sample_ids: Sequence[Sequence[int]] | None = None,
        *,
        logit_bias: dict[int, float] | None = None,
        logprobs: int | None = None,
        on_token: Callable[..., None] | None = None,
    ) -> list[list[Generation]]:
        """:meth:`LocalBackend.generate_ids <rcn_fast.llm.base.LocalBackend.generate_ids>`
        on transformers, with ``logit_bias``: ``{token id: bias}`` added to
        those logits before sampling or the greedy argmax (checked by
        :func:`rcn_fast.llm.backends.logits.check_logit_bias`). Rows are sorted by
        prompt length and cut into batches of ``batch_size``; sampling uses
        :class:`rcn_fast.llm.seeded.SeededSampler`. ``on_token`` /
        ``logprobs``: every token reported as it is chosen
        (:data:`rcn_fast.llm.server.protocol.OnToken`, by
        :class:`rcn_fast.llm.backends.logits.TokenReport`)."""
        torch = _torch()
        tf = A.require("transformers", HINT)
        check_token_ids(prompt_ids, self.vocab_size, "prompt_ids")
        if sample_ids is None:
            sample_ids = [range(params.num_samples)] * len(prompt_ids)
        elif len(sample_ids) != len(prompt_ids):
            raise ValueError(f"sample_ids: expected {len(prompt_ids)} lists (one per prompt), got {len(sample_ids)}")
        jobs = [(i, int(s)) for i, ss in enumerate(sample_ids) for s in ss]
        results: dict[tuple[int, int], Generation] = {}
        gcfg = tf.GenerationConfig(
            max_new_tokens=params.max_new_tokens,
            do_sample=False,  # sampling is done by SeededSampler; the argmax takes its draw
            pad_token_id=self.pad_id,
            eos_token_id=self.eos_ids or None,
            **({"stop_strings": list(params.stop)} if params.stop else {}),
        )
        stop_ids = set(self.eos_ids) | {self.pad_id}
        for batch in self._batches([prompt_ids[i] for i, _ in jobs]):
            rows = [prompt_ids[jobs[j][0]] for j in batch]
            ids, mask, _ = self._pad_left(rows)
            # NaN logits are an error, not text; the bias, then the seeded draw (the greedy argmax takes it)
            report = None if on_token is None else TokenReport([jobs[j] for j in batch], logprobs, on_token,
                                                               self.tokenizer, params.stop, stop_ids)
            procs = tf.LogitsProcessorList([FiniteLogitsCheck(f"hf:{self.name}", ids.shape[1])]
                                           + ([report.raw] if report else [])
                                           + ([LogitBias(logit_bias)] if logit_bias else []))
            if not params.greedy:
                keys = [seeded.row_key(params.seed, jobs[j][1], rows[k]) for k, j in enumerate(batch)]
                procs.append(seeded.SeededSampler(keys, ids.shape[1], params.temperature, params.top_p))
            if report:
                procs.append(report.chosen)
            with torch.inference_mode():
                seqs = self.model.generate(
                    input_ids=ids, attention_mask=mask, generation_config=gcfg, logits_processor=procs,
                    **({"tokenizer": self.tokenizer} if params.stop else {}),
                )
            new = seqs[:, ids.shape[1] :].tolist()
            for k, j in enumerate(batch):
                results[jobs[j]] = self._finish(new[k], len(rows[k]), params, stop_ids)
        return [[results[(i, int(s))] for s in ss] for i, ss in enumerate(sample_ids)]

    def _finish(self, toks: list[int], n_prompt: int, params: GenerationParams, stop_ids: set[int]) -> Generation:
        return finish_generation(self.tokenizer, toks, n_prompt, params, stop_ids, self.eos_ids)

    # ---------------------------------------------------------------- serving (rcn_fast.llm.server.protocol)

    def prompt_logprobs_ids(self, prompt_ids: Sequence[Sequence[int]], k: int, *, chunk: int,
                            check: Callable[[], None]) -> list[list[Any]]:
        """:meth:`ServedModel.prompt_logprobs_ids <rcn_fast.llm.server.protocol.ServedModel.prompt_logprobs_ids>`:
        the model runs on a batch of rows; the head (or, for models whose
        logits are not a plain head over the final hidden state, the model's
        logits of one row) is turned into log-softmax rows ``chunk``
        positions at a time, keeping only the prompt token's log-prob and
        the top ``k`` of each position."""
        torch = _torch()
        check_token_ids(prompt_ids, self.vocab_size, "prompt_ids")
        model = self.model
        hidden = self.scoring_mode == "hidden"
        out: list[list[Any]] = [[] for _ in prompt_ids]
        with torch.inference_mode():
            for batch in self._batches(prompt_ids) if hidden else [[i] for i in range(len(prompt_ids))]:
                check()
                rows = [prompt_ids[i] for i in batch]
                ids, mask, pos = self._pad_left(rows)
                if hidden:
                    base = getattr(model, model.base_model_prefix)
                    states = base(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=False).last_hidden_state
                    head = model.get_output_embeddings()
                else:
                    states = model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=False).logits
                T = ids.shape[1]
                for j, i in enumerate(batch):
                    n = len(rows[j])
                    got: list[float] = []
                    tops: list[list[tuple[int, float]]] = []
                    for a in range(T - n, T - 1, chunk):  # positions predicting tokens 1..n-1
                        check()
                        b = min(a + chunk, T - 1)
                        x = head(states[j, a:b]) if hidden else states[j, a:b]
                        lp = torch.log_softmax(x.float(), dim=-1)
                        nxt = torch.tensor(rows[j][a - (T - n) + 1 : b - (T - n) + 1], device=lp.device)
                        got += lp.gather(1, nxt[:, None])[:, 0].tolist()
                        if k > 0:
                            tv, ti = torch.topk(lp, min(k, lp.shape[1]), dim=-1)
                            tops += [list(zip(c, d)) for c, d in zip(ti.tolist(), tv.tolist())]
                        else:
                            tops += [[] for _ in range(b - a)]
                        del x, lp
                    out[i] = [None, *zip(got, tops)]
                del states
        return out

    def checked_steps(self, check: Callable[[], None]) -> Any:
        """:meth:`ServedModel.checked_steps <rcn_fast.llm.server.protocol.ServedModel.checked_steps>`:
        ``check`` as a forward pre-hook of the model (it runs before every
        forward pass, every generated token) for the entering thread."""
        model = self.model
        thread = threading.get_ident()

        def hook(module: Any, args: Any) -> None:
            if threading.get_ident() == thread:
                check()

        @contextlib.contextmanager
        def installed() -> Iterator[None]:
            handle = model.register_forward_pre_hook(hook)
            try:
                yield
            finally:
                handle.remove()

        return installed()
