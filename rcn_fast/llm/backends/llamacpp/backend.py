"""llama.cpp in this process as an :class:`~rcn_fast.llm.LLM`
(``load_llm(path, engine="llamacpp")``): the same interface, checks and
semantics as the native engine (:class:`~rcn_fast.llm.backends.engine.GGUFLLM`),
with llama.cpp's kernels under it.

Prompts, chat rendering (rcn_fast's template door), label spellings, stop
rules, sampling draws (:mod:`rcn_fast.llm.seeded`) and costs are those of
the other local backends; label scores are the exact log-softmax over the
labels' spellings of llama.cpp's next-token logits
(:func:`rcn_fast.llm.scoring.choice.choice_logprobs`), with the same
NaN/inf checks. Many rows run at once as sequences of one context
(:mod:`~rcn_fast.llm.backends.llamacpp.runner`), prompt prefixes computed
once and shared by copying key/value cells between sequences.

Numbers: llama.cpp computes with its own kernels (quantized weights are
multiplied against activations it quantizes to 8 bits, as llama.cpp
always does), so on a quantized file its log-probabilities differ from the
native engine's and transformers' (float32 activations on the dequantised
weights) by what that rounding makes; on an F32 file they agree to float
rounding. The key/value cache is float32 by default (``kv_type="f16"`` is
llama.cpp's own default: half the memory, scores off by ~1e-3).
"""

from __future__ import annotations

import hashlib
import json
import threading
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from rcn_fast._validate import check_token_ids, is_int
from rcn_fast.llm.base import CostTracker
from rcn_fast.llm.backends.in_process import InProcessGGUFBackend
from rcn_fast.llm.backends.logits import log_softmax_rows, top_logprobs
from rcn_fast.llm.backends.llamacpp import lib
from rcn_fast.llm.backends.llamacpp.runner import Runner
from rcn_fast.llm.backends.llamacpp.tokenizer import LlamaCppTokenizer

#: bumped when this backend's numbers change (part of the identity)
NUMERICS_VERSION = 1


@dataclass
class LlamaCppConfig:
    """Settings of the llama.cpp backend (plain data, JSON-serialisable).

    batch_size : rows (prompt x sample) computed at once (sequences of the context).
    num_threads : llama.cpp's threads; 0: the CPUs this process may run on
        (or ``RCN_FAST_NUM_THREADS``).
    n_ctx : key/value cells of the context, shared by the running rows and
        the kept prefixes (a prompt and its new tokens must fit).
    max_batch_tokens : tokens per ``llama_decode`` (longer prompts are
        prefilled in chunks).
    prefix_seqs : sequences that keep computed prompt prefixes for reuse (0: none).
    min_prefix : shorter shared prefixes are not kept.
    kv_type : ``"f32"`` (default: scores as exact as the weights allow) or
        ``"f16"`` (llama.cpp's default; half the memory).
    flash_attn : llama.cpp's fused attention (off by default).
    label_spellings, scoring_backend : as the native engine's.
    """

    batch_size: int = 16
    num_threads: int = 0
    n_ctx: int = 8192
    max_batch_tokens: int = 1024
    prefix_seqs: int = 32
    min_prefix: int = 16
    kv_type: str = "f32"
    flash_attn: bool = False
    label_spellings: tuple[str, ...] = ("{}", " {}")
    scoring_backend: str | None = None

    def __post_init__(self) -> None:
        for name in ("batch_size", "max_batch_tokens", "min_prefix", "n_ctx"):
            v = getattr(self, name)
            if not is_int(v) or v < 1:
                raise ValueError(f"{name}: expected an int >= 1, got {v!r}")
        for name in ("num_threads", "prefix_seqs"):
            v = getattr(self, name)
            if not is_int(v) or v < 0:
                raise ValueError(f"{name}: expected an int >= 0, got {v!r}")
        if self.max_batch_tokens < self.batch_size:
            raise ValueError(f"max_batch_tokens: expected at least batch_size ({self.batch_size}) tokens a decode (each "
                             f"decoding row adds one), got {self.max_batch_tokens}")
        if self.batch_size + self.prefix_seqs > 256:
            raise ValueError(f"batch_size + prefix_seqs: at most 256 sequences (llama.cpp's limit), got "
                             f"{self.batch_size + self.prefix_seqs}")
        if self.kv_type not in lib.KV_TYPES:
            raise ValueError(f"kv_type: expected one of {sorted(lib.KV_TYPES)}, got {self.kv_type!r}")
        if not isinstance(self.flash_attn, bool):
            raise ValueError(f"flash_attn: expected a bool, got {self.flash_attn!r}")
        self.label_spellings = tuple(self.label_spellings)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class LlamaCppLLM(InProcessGGUFBackend):
    """A GGUF model run in this process by llama.cpp (llama-cpp-python's C API).

    Parameters
    ----------
    path : str or Path
        The ``.gguf`` file.
    name : str, optional
        Where the model came from (part of ``identity``).
    config : LlamaCppConfig, optional

    Raises
    ------
    ImportError
        llama-cpp-python is not installed (the message says how).
    rcn_fast.llm.backends.engine.GGUFError
        A malformed file: rcn_fast's format, size and vocabulary checks
        (:func:`rcn_fast.llm.backends.probe.check_for_llamacpp`) run before
        llama.cpp reads it.
    rcn_fast.llm.backends.engine.UnsupportedModel
        A file llama.cpp does not load (its reason, from its log).

    Notes
    -----
    As with the native engine, the file's size, mtime, ctime, inode and
    device are compared with those at load before every decode: a file
    changed under a running process is an error, never other weights under
    the old identity (llama.cpp maps the file too).
    """

    prefix = "llamacpp"

    def __init__(self, path: str | Path, *, name: str | None = None, config: LlamaCppConfig | None = None) -> None:
        from rcn_fast.llm.backends.engine import UnsupportedModel
        from rcn_fast.llm.backends.probe import check_for_llamacpp

        self.config = config or LlamaCppConfig()
        self.path = Path(path)
        self.name = name or str(self.path)
        self.gguf = check_for_llamacpp(self.path)  # rcn_fast's checks first: llama.cpp reads only a checked file
        cfg = self.config
        try:
            self.model = lib.Model(self.path)
        except lib.LoadError as exc:
            raise UnsupportedModel(f"{self.path}: llama.cpp {lib.version()} does not load it ({exc})") from None
        self.gguf.check_unchanged()  # what llama.cpp opened is the file checked
        self.tokenizer = LlamaCppTokenizer(self.model, self.gguf)
        self.ctx = lib.Context(self.model, n_ctx=cfg.n_ctx, n_batch=cfg.max_batch_tokens,
                               n_seq=cfg.batch_size + cfg.prefix_seqs, n_threads=lib.threads(cfg.num_threads),
                               kv_type=cfg.kv_type, flash_attn=cfg.flash_attn)
        self.runner = Runner(self.ctx, slots=cfg.batch_size, prefix_seqs=cfg.prefix_seqs, min_prefix=cfg.min_prefix,
                             before_step=self._before_step)
        self._step_checks: dict[int, Callable[[], None]] = {}
        self.cost = CostTracker()
        #: The model's context window in tokens (None when the file declares none).
        self.context_length = self.model.n_ctx_train or None
        #: Prompts seen that were longer than ``context_length`` (each also warned about).
        self.long_prompts = 0
        #: label scoring reads the next-token logits
        self.scoring_mode = "logits"
        self._label_cache: dict[tuple[str, ...], list[list[int]]] = {}
        self._lock = threading.RLock()
        self._identity: str | None = None
        self._system_role: bool | None = None

    # ---------------------------------------------------------------- info

    @property
    def vocab_size(self) -> int:
        """Rows of the model's logits (the token ids it takes and scores)."""
        return self.model.n_vocab

    @property
    def identity(self) -> str:
        """``llamacpp:<name>:<llama-cpp-python version>:<digest>``: the digest
        covers the sha256 of the GGUF file, the label spellings, the key/value
        type, the attention kernel, llama.cpp's build (its CPU features) and
        this backend's numerics version. Computed once (hashing the file)."""
        if self._identity is None:
            from rcn_fast.model_files import file_fingerprint

            self.gguf.check_unchanged()
            blob = json.dumps({"file": file_fingerprint(self.path)["sha256"], "spellings": list(self.config.label_spellings),
                               "kv_type": self.config.kv_type, "flash_attn": self.config.flash_attn,
                               "build": lib.system_info(), "numerics": NUMERICS_VERSION}, sort_keys=True)
            digest = hashlib.sha256(blob.encode()).hexdigest()[:16]
            self._identity = f"llamacpp:{self.name}:{lib.version()}:{digest}"
        return self._identity

    def close(self) -> None:
        """Free llama.cpp's context and model (the object is unusable after)."""
        with self._lock:
            self.ctx.close()
            self.model.close()

    # ---------------------------------------------------------------- forward

    def next_logits(self, rows: Sequence[Sequence[int]]) -> np.ndarray:
        """float32 [B, V]: the next-token logits after each prompt."""
        check_token_ids(rows, self.vocab_size, "prompt_ids")
        with self._lock:
            self.runner.warm(rows)
            got = self.runner.run(rows, mode="logits")
        return np.stack(got) if rows else np.zeros((0, self.vocab_size), np.float32)

    def score_ids(self, prompt_ids: Sequence[Sequence[int]], label_ids: Sequence[Sequence[Sequence[int]]]) -> list[list[float]]:
        """Label log-probs for tokenised prompts (ragged rows): the log-softmax
        over the labels' spellings of llama.cpp's next-token logits."""
        from rcn_fast import _arrays as A
        from rcn_fast.llm.scoring import choice as scoring
        from rcn_fast.llm.scoring.labels import TORCH_HINT

        torch = A.require("torch", TORCH_HINT)
        check_token_ids(label_ids, self.vocab_size, "label_ids", depth=2)
        logits = self.next_logits(prompt_ids)
        used = sorted({t for row in label_ids for sp in row for t in sp})
        where = {t: j for j, t in enumerate(used)}
        packed = scoring.pack_label_ids([[[where[t] for t in sp] for sp in row] for row in label_ids])
        picked = np.ascontiguousarray(logits[:, np.asarray(used, dtype=np.int64)])
        lp, _ = scoring.choice_logprobs(torch.from_numpy(picked), packed, backend=self.config.scoring_backend)
        lp = lp.float().numpy()
        return [lp[b, : len(label_ids[b])].tolist() for b in range(len(prompt_ids))]

    def top_logprobs_ids(self, prompt_ids: Sequence[Sequence[int]], k: int) -> list[list[tuple[int, float]]]:
        """The ``k`` most likely next tokens with their log-probabilities, per prompt."""
        logits = self.next_logits(prompt_ids)
        return [top_logprobs(row, k) for row in log_softmax_rows(logits)]


__all__ = ["LlamaCppLLM", "LlamaCppConfig", "NUMERICS_VERSION"]
