"""llama-cpp-python's in-process ``Llama`` as a benchmark peer of the local
engine: greedy generation one prompt at a time (its high-level API, as a
user calls it) and many prompts at once (llama.cpp's own batching: one
context holding a sequence per prompt, every step one ``llama_decode`` of
all their tokens, through its low-level API).

Prompts are token ids (the engine's, which equal transformers' for the
file), so both sides run the same tokens.
"""

from __future__ import annotations

import ctypes
from typing import Sequence

import numpy as np


class LlamaCppPeer:
    """``llama_cpp.Llama`` on a GGUF file.

    Parameters
    ----------
    path : str
    threads : int
        Threads for prompt processing and generation (both).
    n_ctx : int
        Context of the one-prompt-at-a-time model.
    """

    def __init__(self, path: str, threads: int, n_ctx: int = 4096) -> None:
        import llama_cpp

        self.lc = llama_cpp
        self.path = path
        self.threads = threads
        self.llm = llama_cpp.Llama(path, n_ctx=n_ctx, n_threads=threads, n_threads_batch=threads, verbose=False)
        self.eos = {int(self.llm.token_eos())} | {int(t) for t in self._eog_ids()}

    def _eog_ids(self) -> list[int]:
        vocab = self.lc.llama_model_get_vocab(self.llm._model.model)
        n = self.lc.llama_vocab_n_tokens(vocab)
        return [t for t in range(n) if self.lc.llama_vocab_is_eog(vocab, t)]

    def generate(self, prompt: Sequence[int], max_new_tokens: int) -> list[int]:
        """Greedy tokens after ``prompt`` (the high-level API; it reuses the
        previous prompt's matching prefix, as it does for any caller)."""
        out = []
        for tok in self.llm.generate(list(prompt), top_k=1, top_p=1.0, temp=0.0, repeat_penalty=1.0, reset=True):
            if tok in self.eos:
                out.append(int(tok))
                break
            out.append(int(tok))
            if len(out) >= max_new_tokens:
                break
        return out

    def generate_batch(self, prompts: Sequence[Sequence[int]], max_new_tokens: int) -> list[list[int]]:
        """Greedy tokens after every prompt, all prompts in one context (one
        sequence each) and one ``llama_decode`` per step for all of them."""
        lc = self.lc
        n = len(prompts)
        total = sum(len(p) for p in prompts) + n * (max_new_tokens + 1)
        params = lc.llama_context_default_params()
        params.n_ctx = max(total, 256)
        params.n_batch = max(sum(len(p) for p in prompts), n)
        params.n_ubatch = min(params.n_batch, 512)
        params.n_seq_max = n
        params.n_threads = params.n_threads_batch = self.threads
        params.no_perf = True
        ctx = lc.llama_init_from_model(self.llm._model.model, params)
        if not ctx:
            raise RuntimeError("llama.cpp could not create the batched context")
        vocab = lc.llama_n_vocab(lc.llama_model_get_vocab(self.llm._model.model))
        batch = lc.llama_batch_init(params.n_batch, 0, 1)
        try:
            outs: list[list[int]] = [[] for _ in prompts]
            pos = [0] * n
            feed: list[list[int]] = [list(p) for p in prompts]
            live = list(range(n))
            while live:
                batch.n_tokens = 0
                last: dict[int, int] = {}
                for s in live:
                    for t in feed[s]:
                        i = batch.n_tokens
                        batch.token[i] = t
                        batch.pos[i] = pos[s]
                        batch.n_seq_id[i] = 1
                        batch.seq_id[i][0] = s
                        batch.logits[i] = False
                        pos[s] += 1
                        batch.n_tokens += 1
                    batch.logits[batch.n_tokens - 1] = True
                    last[s] = batch.n_tokens - 1
                if lc.llama_decode(ctx, batch) != 0:
                    raise RuntimeError("llama_decode failed")
                nxt = []
                for s in live:
                    ptr = lc.llama_get_logits_ith(ctx, last[s])
                    logits = np.ctypeslib.as_array(ctypes.cast(ptr, ctypes.POINTER(ctypes.c_float)), shape=(vocab,))
                    tok = int(np.argmax(logits))
                    outs[s].append(tok)
                    feed[s] = [tok]
                    if tok not in self.eos and len(outs[s]) < max_new_tokens:
                        nxt.append(s)
                live = nxt
            return outs
        finally:
            lc.llama_batch_free(batch)
            lc.llama_free(ctx)


__all__ = ["LlamaCppPeer"]
