"""The local engine as an :class:`~rcn_fast.llm.LLM`: generation with the
greedy and seeded-sampling semantics of :mod:`rcn_fast.llm.seeded`, label
scoring from the final hidden state, costs and a model identity, on a GGUF
file run by the native decoder (:mod:`rcn_fast.llm.backends.engine.model`).

What differs from the transformers backend (:class:`rcn_fast.llm.backends.hf.HFLLM`)
is only how the numbers are computed: weights stay in the file's
quantisation and are unpacked inside the matrix products (float32
activations and accumulation, so results equal a float32 model with the
dequantised weights up to summation order); the key/value cache is laid
out for decoding; rows are scheduled continuously; shared prompt prefixes
are computed once (the prefix cache). Prompts, chat rendering, token ids,
label spellings, stop rules, sampling draws and costs are the same.
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
from rcn_fast.llm.backends.engine.gguf_file import GGUFError, GGUFFile
from rcn_fast.llm.backends.engine.model import NativeLlama
from rcn_fast.llm.backends.engine.prefix_cache import PrefixCache
from rcn_fast.llm.backends.engine.runner import Runner
from rcn_fast.llm.backends.engine.tokenizer import GGUFTokenizer
from rcn_fast.llm.backends.in_process import InProcessGGUFBackend
from rcn_fast.llm.backends.logits import NonFiniteLogitsError, log_softmax_rows, top_logprobs

#: bumped when the engine's numbers change (part of the identity)
NUMERICS_VERSION = 1


@dataclass
class EngineConfig:
    """Settings of the local engine (plain data, JSON-serialisable).

    batch_size : rows (prompt x sample) decoded at once: the key/value
        cache's slots.
    num_threads : threads of the forward pass; 0: the CPUs this process may
        run on (or ``RCN_FAST_NUM_THREADS``).
    prefix_cache_mb : budget of the prefix cache in MiB (0 turns it off).
    max_batch_tokens : tokens per forward pass (longer prompts are prefilled
        in chunks).
    min_prefix : shorter shared prefixes are not cached.
    label_spellings : format strings for the spellings of a label.
    scoring_backend : force the dispatch backend of the scoring op.
    isa : the kernel variant (``""``: chosen at load time; ``"generic"``,
        ``"avx2"``, ``"avx512"``, ``"avx512vnni"``).
    activations : how activations meet block-quantised weights. ``"f32"``
        (the default): float32 activations against the dequantised weights,
        the numbers transformers computes for the file. ``"q8"``: llama.cpp's
        arithmetic, each product's input quantised to 8 bits per block
        (q8_0 / q8_K) and the block sums taken in integers: about twice the
        decoding speed on AVX2, logits within about 1% of the float32 ones
        and equal to llama.cpp's up to summation order (docs/llms.md).
    """

    batch_size: int = 16
    num_threads: int = 0
    prefix_cache_mb: float = 512.0
    max_batch_tokens: int = 1024
    min_prefix: int = 16
    label_spellings: tuple[str, ...] = ("{}", " {}")
    scoring_backend: str | None = None
    isa: str = ""
    activations: str = "f32"

    def __post_init__(self) -> None:
        for name in ("batch_size", "max_batch_tokens", "min_prefix"):
            v = getattr(self, name)
            if not is_int(v) or v < 1:
                raise ValueError(f"{name}: expected an int >= 1, got {v!r}")
        if not is_int(self.num_threads) or self.num_threads < 0:
            raise ValueError(f"num_threads: expected an int >= 0 (0: the available cores), got {self.num_threads!r}")
        if not isinstance(self.prefix_cache_mb, (int, float)) or isinstance(self.prefix_cache_mb, bool) \
                or not 0 <= self.prefix_cache_mb < 1 << 30:
            raise ValueError(f"prefix_cache_mb: expected a number of MiB >= 0, got {self.prefix_cache_mb!r}")
        if self.isa not in ("", "auto", "generic", "avx2", "avx512", "avx512vnni"):
            raise ValueError(f"isa: expected '', 'generic', 'avx2', 'avx512' or 'avx512vnni', got {self.isa!r}")
        if self.activations not in ("f32", "q8"):
            raise ValueError(f"activations: expected 'f32' (float32) or 'q8' (llama.cpp's 8-bit arithmetic), "
                             f"got {self.activations!r}")
        self.label_spellings = tuple(self.label_spellings)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class GGUFLLM(InProcessGGUFBackend):
    """A Llama-family GGUF model served in this process by the native engine.

    Parameters
    ----------
    path : str or Path
        The ``.gguf`` file.
    name : str, optional
        Where the model came from (part of ``identity``).
    config : EngineConfig, optional

    Raises
    ------
    rcn_fast.llm.backends.engine.UnsupportedModel
        An architecture, tensor format, tensor, rope scaling or tokenizer the
        engine does not run (load it with ``engine="transformers"``).
    rcn_fast.llm.backends.engine.GGUFError
        A malformed or self-contradicting file (the format, the sizes, the
        tensors or the vocabulary): every check runs here, at load, and the
        tokenizer is built before this returns.

    Notes
    -----
    The weights are read from the file through a memory map. Before every
    forward pass the file's size, modification time, inode and device are
    compared with those at load (:meth:`GGUFFile.check_unchanged`): a
    file changed or replaced under a running process is an error, never
    other weights under the old identity. What no check can catch: a file
    truncated between two checks kills the process with SIGBUS at the next
    read of a lost page (as in any mmap-based engine, llama.cpp's too), so
    replace model files by writing a new file and renaming it over the old
    one (the old inode stays whole for the running process).
    """

    prefix = "native"

    def __init__(self, path: str | Path, *, name: str | None = None, config: EngineConfig | None = None) -> None:
        self.config = config or EngineConfig()
        self.path = Path(path)
        self.name = name or str(self.path)
        self.gguf = GGUFFile(self.path)
        self.model = NativeLlama(self.gguf, num_threads=self.config.num_threads,
                                 isa="" if self.config.isa == "auto" else self.config.isa,
                                 activations=self.config.activations)
        self.tokenizer = GGUFTokenizer(self.gguf)
        if self.tokenizer.n_tokens > self.model.hp.n_vocab:
            raise GGUFError(f"{self.path}: {self.tokenizer.n_tokens} tokens for a model of {self.model.hp.n_vocab} "
                            f"embedding rows")
        self.prefix_cache = PrefixCache(int(self.config.prefix_cache_mb * (1 << 20)))
        self.runner = Runner(self.model, self.prefix_cache, max_slots=self.config.batch_size,
                             max_batch_tokens=self.config.max_batch_tokens, min_prefix=self.config.min_prefix,
                             before_step=self._before_step)
        self._step_checks: dict[int, Callable[[], None]] = {}
        self.tokenizer.wait()  # a vocabulary that cannot be built fails the load, not the first question
        self.cost = CostTracker()
        #: The model's context window in tokens (None when the file declares none).
        self.context_length = self.model.hp.context_length
        #: Prompts seen that were longer than ``context_length`` (each also warned about).
        self.long_prompts = 0
        #: label scoring reads the final hidden state (the LM head is a plain linear map)
        self.scoring_mode = "hidden"
        self._label_cache: dict[tuple[str, ...], list[list[int]]] = {}
        self._lock = threading.RLock()
        self._identity: str | None = None
        self._system_role: bool | None = None

    # ---------------------------------------------------------------- info

    @property
    def vocab_size(self) -> int:
        """Rows of the model's logits (the token ids it takes and scores)."""
        return self.model.hp.n_vocab

    @property
    def identity(self) -> str:
        """``native:<name>:<isa>[:q8]:<digest>``: the digest covers the
        sha256 of the GGUF file (weights, tokenizer, template), the label
        spellings and the engine's numerics version; the kernel variant is
        named (their summation orders differ in the last bits), and so is
        llama.cpp's 8-bit arithmetic when it is on. Computed once (hashing
        the file)."""
        if self._identity is None:
            from rcn_fast.model_files import file_fingerprint

            self.gguf.check_unchanged()  # the digest is of the file that was loaded

            blob = json.dumps({"file": file_fingerprint(self.path)["sha256"], "spellings": list(self.config.label_spellings),
                               "numerics": NUMERICS_VERSION}, sort_keys=True)
            digest = hashlib.sha256(blob.encode()).hexdigest()[:16]
            arith = ":q8" if self.config.activations == "q8" else ""
            self._identity = f"native:{self.name}:{self.model.isa}{arith}:{digest}"
        return self._identity

    # ---------------------------------------------------------------- forward

    def final_hidden(self, rows: Sequence[Sequence[int]]) -> np.ndarray:
        """Final hidden state (after the final norm) at each prompt's last
        token: float32 [B, H]; shared prefixes come from the prefix cache."""
        with self._lock:
            self.runner.warm(rows)
            return np.stack(self.runner.run(rows, mode="hidden")) if rows else np.zeros((0, self.model.hp.n_embd),
                                                                                        np.float32)

    def score_ids(self, prompt_ids: Sequence[Sequence[int]], label_ids: Sequence[Sequence[Sequence[int]]]) -> list[list[float]]:
        """Label log-probs for tokenised prompts; ``label_ids[b][c]`` are the
        spelling ids of label c of row b. Returns ragged rows.

        Only the LM-head rows of the labels' tokens are multiplied (by the
        engine's batch-invariant product, so a row scores the same bits in
        any batch), then :func:`rcn_fast.llm.scoring.choice.choice_logprobs`."""
        from rcn_fast.llm.scoring import choice as scoring
        from rcn_fast.llm.scoring.labels import TORCH_HINT

        from rcn_fast import _arrays as A

        torch = A.require("torch", TORCH_HINT)
        check_token_ids(prompt_ids, self.vocab_size, "prompt_ids")
        check_token_ids(label_ids, self.vocab_size, "label_ids", depth=2)
        hidden = self.final_hidden(prompt_ids)
        used = sorted({t for row in label_ids for sp in row for t in sp})
        where = {t: j for j, t in enumerate(used)}
        logits = self.model.head_logits(hidden, np.asarray(used, dtype=np.int64))  # [B, labels' ids]
        packed = scoring.pack_label_ids([[[where[t] for t in sp] for sp in row] for row in label_ids])
        lp, _ = scoring.choice_logprobs(torch.from_numpy(logits), packed, backend=self.config.scoring_backend)
        lp = lp.float().numpy()
        return [lp[b, : len(label_ids[b])].tolist() for b in range(len(prompt_ids))]

    def top_logprobs_ids(self, prompt_ids: Sequence[Sequence[int]], k: int) -> list[list[tuple[int, float]]]:
        """The ``k`` most likely next tokens with their log-probabilities
        (full-vocabulary log-softmax of the last position), per prompt."""
        check_token_ids(prompt_ids, self.vocab_size, "prompt_ids")
        with self._lock:
            self.runner.warm(prompt_ids)
            logits = self.runner.run(prompt_ids, mode="logits")
        return [top_logprobs(log_softmax_rows(lg[None])[0], k) for lg in logits]


__all__ = ["GGUFLLM", "EngineConfig", "NonFiniteLogitsError", "NUMERICS_VERSION"]
