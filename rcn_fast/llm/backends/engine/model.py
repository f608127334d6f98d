"""A Llama-family decoder read from a GGUF file, run by the native forward
pass (``rcn_fast._C.LlamaModel``, csrc/llm/cpu/decoder.cpp) on weights kept in
the file's own formats (F32, F16, Q4_0, Q4_1, Q8_0), memory-mapped in place.

Architectures: ``llama`` (Llama 1-3 without rope scaling, Mistral without
a sliding window in use, SmolLM) and ``qwen2`` (q/k/v biases, NEOX rope).
llama.cpp's converter permutes the q/k rows of ``llama`` models for its
pair-interleaved rope, and the native pass rotates interleaved pairs for
them, so the numbers equal transformers' (which undoes the permutation and
rotates half-split pairs) up to float rounding.

The key/value cache (:class:`KVCache`) is preallocated per call: float32
``[n_layer, slots, ctx, n_head_kv * head_dim]`` for keys and for values; a
sequence owns a slot, each token writes its position, nothing is ever
concatenated.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from rcn_fast.llm.backends.engine.gguf_file import GGML_TYPES, GGUFFile, type_name

#: architecture -> whether its rope rotates half-split (NEOX) pairs
ARCHITECTURES = {"llama": False, "qwen2": True}
_MATMUL_TYPES = frozenset(GGML_TYPES.values())


class UnsupportedModel(NotImplementedError):
    """A GGUF model the local engine does not run (the message says why and
    names ``engine="transformers"``)."""


@dataclass(frozen=True)
class HParams:
    """The sizes of a Llama-family decoder (from the GGUF metadata)."""

    arch: str
    n_layer: int
    n_embd: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_ff: int
    n_vocab: int
    rope_dim: int
    eps: float
    rope_base: float
    rope_neox: bool
    context_length: int | None

    def native(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("arch")
        d.pop("context_length")
        return d


def _unsupported(g: GGUFFile, why: str) -> UnsupportedModel:
    return UnsupportedModel(f"{g.path}: {why}; the local engine does not run it, load it with engine='transformers'")


def read_hparams(g: GGUFFile) -> HParams:
    """The model's sizes; :class:`UnsupportedModel` for what the engine does not run."""
    arch = g.get("general.architecture")
    if arch not in ARCHITECTURES:
        raise _unsupported(g, f"architecture {arch!r} (supported: {sorted(ARCHITECTURES)})")

    def key(name: str, default: Any = None) -> Any:
        v = g.get(f"{arch}.{name}", default)
        if v is None:
            raise _unsupported(g, f"metadata {arch}.{name} is missing")
        return v

    scaling = g.get(f"{arch}.rope.scaling.type")
    if scaling not in (None, "none") or g.get(f"{arch}.rope.scaling.factor") not in (None, 1.0):
        raise _unsupported(g, f"rope scaling {scaling!r}")
    n_head = int(key("attention.head_count"))
    n_embd = int(key("embedding_length"))
    head_dim = int(g.get(f"{arch}.attention.key_length", n_embd // n_head))
    if g.get(f"{arch}.attention.value_length", head_dim) != head_dim:
        raise _unsupported(g, "keys and values of different lengths")
    tokens = g.metadata.get("tokenizer.ggml.tokens")
    n_vocab = int(g.get(f"{arch}.vocab_size", getattr(tokens, "count", None) or g.tensors["token_embd.weight"].shape[0]))
    ctx = g.get(f"{arch}.context_length")
    return HParams(
        arch=arch, n_layer=int(key("block_count")), n_embd=n_embd, n_head=n_head,
        n_head_kv=int(g.get(f"{arch}.attention.head_count_kv", n_head)), head_dim=head_dim,
        n_ff=int(key("feed_forward_length")), n_vocab=n_vocab,
        rope_dim=int(g.get(f"{arch}.rope.dimension_count", head_dim)),
        eps=float(key("attention.layer_norm_rms_epsilon")), rope_base=float(g.get(f"{arch}.rope.freq_base", 10000.0)),
        rope_neox=ARCHITECTURES[arch], context_length=int(ctx) if isinstance(ctx, int) and ctx > 0 else None,
    )


def _native() -> Any:
    from rcn_fast import _native

    mod, err = _native.cpu_module()
    if mod is None or not hasattr(mod, "LlamaModel"):
        raise ImportError(f"the local engine needs rcn_fast's native module: {err or 'it lacks LlamaModel (rebuild)'}")
    return mod


class KVCache:
    """Keys and values of ``slots`` sequences of up to ``ctx`` positions:
    float32 ``[n_layer, slots, ctx, n_head_kv * head_dim]`` each."""

    def __init__(self, hp: HParams, slots: int, ctx: int) -> None:
        shape = (hp.n_layer, slots, ctx, hp.n_head_kv * hp.head_dim)
        self.k = np.empty(shape, dtype=np.float32)
        self.v = np.empty(shape, dtype=np.float32)

    def read(self, slot: int, n: int) -> tuple[np.ndarray, np.ndarray]:
        """Copies of the first ``n`` positions of ``slot``: ``[n_layer, n, D]`` each."""
        return self.k[:, slot, :n].copy(), self.v[:, slot, :n].copy()

    def write(self, slot: int, k: np.ndarray, v: np.ndarray, n: int) -> None:
        """Positions ``[0, n)`` of ``slot`` from ``k``, ``v`` (``[n_layer, >= n, D]``)."""
        self.k[:, slot, :n] = k[:, :n]
        self.v[:, slot, :n] = v[:, :n]


class NativeLlama:
    """The decoder of GGUF file ``g``, its weights viewed in the file.

    Parameters
    ----------
    g : GGUFFile
    num_threads : int
        Threads of the forward pass; 0: the CPUs this process may run on
        (``sched_getaffinity``) or ``RCN_FAST_NUM_THREADS``.
    isa : str
        ``""`` (the variant chosen at load time), ``"generic"``, ``"avx2"``, ``"avx512"``.
    """

    def __init__(self, g: GGUFFile, *, num_threads: int = 0, isa: str = "") -> None:
        self.hp = hp = read_hparams(g)
        self.num_threads = int(num_threads)
        self.isa = isa or str(_native().quant_info()["isa"])
        self.tied = "output.weight" not in g.tensors

        def mat(name: str, n: int, k: int) -> tuple[np.ndarray, int, int, int]:
            t = g.tensors.get(name)
            if t is None:
                raise _unsupported(g, f"tensor {name!r} is missing")
            if t.ggml_type not in _MATMUL_TYPES:
                raise _unsupported(g, f"tensor {name!r} is {type_name(t.ggml_type)} (the engine multiplies "
                                      f"{', '.join(GGML_TYPES)})")
            if t.shape != (n, k):
                raise _unsupported(g, f"tensor {name!r} has shape {t.shape}, expected {(n, k)}")
            return g.data(name), t.ggml_type, n, k

        def vec(name: str, n: int, optional: bool = False) -> tuple[np.ndarray, int, int, int] | None:
            t = g.tensors.get(name)
            if t is None and optional:
                return None
            if t is None or t.ggml_type != 0 or int(np.prod(t.shape)) != n:
                raise _unsupported(g, f"tensor {name!r} is missing or not F32 [{n}]")
            return g.data(name), 0, 1, n

        H, Q, D = hp.n_embd, hp.n_head * hp.head_dim, hp.n_head_kv * hp.head_dim
        tensors: list[Any] = [mat("token_embd.weight", hp.n_vocab, H), vec("output_norm.weight", H),
                              mat("token_embd.weight" if self.tied else "output.weight", hp.n_vocab, H)]
        for i in range(hp.n_layer):
            p = f"blk.{i}."
            tensors += [vec(p + "attn_norm.weight", H), mat(p + "attn_q.weight", Q, H), mat(p + "attn_k.weight", D, H),
                        mat(p + "attn_v.weight", D, H), vec(p + "attn_q.bias", Q, True), vec(p + "attn_k.bias", D, True),
                        vec(p + "attn_v.bias", D, True), mat(p + "attn_output.weight", H, Q), vec(p + "ffn_norm.weight", H),
                        mat(p + "ffn_gate.weight", hp.n_ff, H), mat(p + "ffn_up.weight", hp.n_ff, H),
                        mat(p + "ffn_down.weight", H, hp.n_ff)]
        self._model = _native().LlamaModel(hp.native(), tensors)
        self._head = tensors[2]

    def new_cache(self, slots: int, ctx: int) -> KVCache:
        return KVCache(self.hp, slots, ctx)

    def forward(self, tokens: np.ndarray, slots: np.ndarray, positions: np.ndarray, cache: KVCache,
                out_rows: np.ndarray, logits: bool = True, out: np.ndarray | None = None) -> np.ndarray:
        """Run a ragged batch (see csrc/llm/cpu/decoder.h).

        Parameters
        ----------
        tokens, slots, positions : int32 [n]
            Each token, its sequence's cache slot and its position there.
        cache : KVCache
        out_rows : int64 [m]
            Indices (into ``tokens``) of the tokens whose output is wanted.
        logits : bool
            True: logits float32 [m, n_vocab]; False: the final normed
            hidden state float32 [m, n_embd].
        out : float32 array, optional
            Written instead of a new array (C-contiguous, that shape).
        """
        width = self.hp.n_vocab if logits else self.hp.n_embd
        if out is None:
            out = np.empty((len(out_rows), width), dtype=np.float32)
        self._model.forward(np.ascontiguousarray(tokens, dtype=np.int32), np.ascontiguousarray(slots, dtype=np.int32),
                            np.ascontiguousarray(positions, dtype=np.int32), cache.k, cache.v,
                            np.ascontiguousarray(out_rows, dtype=np.int64), bool(logits), out, self.num_threads,
                            self.isa)
        return out

    def head_logits(self, hidden: np.ndarray, ids: np.ndarray) -> np.ndarray:
        """Logits of tokens ``ids`` for final hidden states ``hidden`` [B,
        n_embd]: float32 ``[B, len(ids)]``, computed from the LM head's rows
        in their own format by the batch-invariant product (each entry the
        same bits as the full logits of the forward pass, in any batch)."""
        data, qtype, _, k = self._head
        ids = np.asarray(ids, dtype=np.int64)
        out = np.empty((hidden.shape[0], len(ids)), dtype=np.float32)
        _native().quant_matmul(np.ascontiguousarray(hidden, dtype=np.float32), np.ascontiguousarray(data[ids]), qtype,
                               k, out, num_threads=1, isa=self.isa)
        return out


__all__ = ["NativeLlama", "KVCache", "HParams", "read_hparams", "UnsupportedModel", "ARCHITECTURES"]
