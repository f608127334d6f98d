"""A Llama-family decoder read from a GGUF file, run by the native forward
pass (``rcn_fast._C.LlamaModel``, csrc/llm/cpu/decoder.cpp) on weights kept in
the file's own formats (F32, F16, Q4_0, Q4_1, Q8_0, Q4_K, Q5_K, Q6_K),
memory-mapped in place.

Architectures: ``llama`` (Llama 1-3, with Llama 3.1/3.2's ``rope_freqs``;
Mistral without a sliding window in use; SmolLM) and ``qwen2`` (q/k/v
biases, NEOX rope); what a file must hold and what is refused is
:mod:`~rcn_fast.llm.backends.engine.architecture`.
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

from typing import Any

import numpy as np

from rcn_fast.llm.backends.engine.architecture import UnsupportedModel, claim_tensors, read_hparams
from rcn_fast.llm.backends.engine.gguf_file import GGUFError, GGUFFile


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
        ``""`` (the variant chosen at load time), ``"generic"``, ``"avx2"``,
        ``"avx512"``, ``"avx512vnni"``.
    activations : str
        ``"f32"``: float32 activations against the dequantised weights
        (transformers' numbers for the file); ``"q8"``: llama.cpp's
        arithmetic for the block formats (activations quantised to 8 bits
        per block, integer block sums; csrc/llm/quant_blocks.h).
    pack : bool, optional
        Make interleaved copies of the Q4_0, Q4_1, Q8_0 and Q4_K matrices
        for the 8-bit products (the same numbers, faster; as much memory
        again as those matrices). Default: with ``activations="q8"``.
    """

    def __init__(self, g: GGUFFile, *, num_threads: int = 0, isa: str = "", activations: str = "f32",
                 pack: bool | None = None) -> None:
        if activations not in ("f32", "q8"):
            raise ValueError(f"activations: expected 'f32' or 'q8', got {activations!r}")
        self.hp = hp = read_hparams(g)
        self.num_threads = int(num_threads)
        self.isa = isa or str(_native().quant_info()["isa"])
        self.activations = activations
        claimed = claim_tensors(g, hp)
        self.tied = claimed["output.weight"] is None

        def entry(name: str) -> tuple[np.ndarray, int, int, int] | None:
            t = claimed[name]
            if t is None:
                return None
            n, k = t.shape if len(t.shape) == 2 else (1, t.shape[0])
            return g.data(name), t.ggml_type, n, k

        names = ["token_embd.weight", "output_norm.weight", "token_embd.weight" if self.tied else "output.weight"]
        for i in range(hp.n_layer):
            names += [f"blk.{i}.{n}" for n in ("attn_norm.weight", "attn_q.weight", "attn_k.weight", "attn_v.weight",
                                               "attn_q.bias", "attn_k.bias", "attn_v.bias", "attn_output.weight",
                                               "ffn_norm.weight", "ffn_gate.weight", "ffn_up.weight", "ffn_down.weight")]
        tensors = [entry(n) for n in names]
        freqs = claimed.get("rope_freqs.weight")
        #: rope frequency divisors (float32 [rope_dim / 2], Llama 3.1's rope_freqs) or None
        self.rope_freqs = g.float32("rope_freqs.weight") if freqs is not None else None
        if self.rope_freqs is not None and not (np.isfinite(self.rope_freqs).all() and (self.rope_freqs > 0).all()):
            raise GGUFError(f"{g.path}: rope_freqs.weight holds values that are not finite and > 0")
        # llama.cpp's arithmetic reads interleaved copies of the matrices (the same numbers, faster)
        self._model = _native().LlamaModel(hp.native(), tensors, self.rope_freqs,
                                           activations == "q8" if pack is None else bool(pack))
        #: bytes of the interleaved copies (0 without them)
        self.packed_bytes = int(self._model.packed_bytes)
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
                            self.isa, self.activations)
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
                               k, out, num_threads=1, isa=self.isa, activations=self.activations)
        return out


__all__ = ["NativeLlama", "KVCache", "UnsupportedModel"]  # UnsupportedModel: its old home, re-exported for old import paths
