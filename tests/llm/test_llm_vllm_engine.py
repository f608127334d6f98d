"""The in-process vLLM engine wrapper against a fake ``vllm`` module that
answers from the local backend: what it passes to vLLM (token-id prompts,
never text with special tokens added) and exact label scores for labels
outside the top log-probs."""

from __future__ import annotations

import string
import sys
import types

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from llm_helpers import mcq_chat  # noqa: E402


class _LP:
    def __init__(self, logprob: float) -> None:
        self.logprob = logprob


def fake_vllm(local, seen: list) -> types.ModuleType:
    """A ``vllm`` module whose ``LLM`` answers from ``local`` (an HFLLM)."""
    import torch

    class SamplingParams:
        def __init__(self, **kw):
            self.kw = kw

    class LLM:
        def __init__(self, model, **kw):
            self.model = model

        def get_tokenizer(self):
            return local.tokenizer

        def generate(self, prompts, params, use_tqdm=True):
            plist = params if isinstance(params, list) else [params] * len(prompts)
            outs = []
            for p, sp in zip(prompts, plist):
                if not isinstance(p, dict) or set(p) != {"prompt_token_ids"}:
                    raise TypeError(f"expected a token-id prompt, got {p!r:.80}")
                ids = p["prompt_token_ids"]
                seen.append((ids, sp.kw))
                kw = sp.kw
                with torch.no_grad():
                    logits = local.model(torch.tensor([ids])).logits[0].double()
                lp = torch.log_softmax(logits, -1)
                k = kw.get("logprobs")
                top = None
                if k is not None:
                    v, i = torch.topk(lp[-1], k)
                    top = [{int(a): _LP(float(b)) for a, b in zip(i.tolist(), v.tolist())}]
                prompt_lps = None
                if kw.get("prompt_logprobs") is not None:
                    prompt_lps = [None] + [{ids[q]: _LP(float(lp[q - 1, ids[q]]))} for q in range(1, len(ids))]
                tok = int(lp[-1].argmax())
                out = types.SimpleNamespace(text=local.tokenizer.decode([tok]), token_ids=[tok], logprobs=top,
                                            finish_reason="length")
                outs.append(types.SimpleNamespace(outputs=[out], prompt_logprobs=prompt_lps))
            return outs

    mod = types.ModuleType("vllm")
    mod.LLM, mod.SamplingParams = LLM, SamplingParams
    return mod


def test_vllm_engine_sends_token_ids_and_scores_every_label_exactly(tiny_llm, monkeypatch):
    seen: list = []
    monkeypatch.setitem(sys.modules, "vllm", fake_vllm(tiny_llm, seen))
    from rcn_fast.llm import load_llm

    eng = load_llm("vllm:fake-model", top_logprobs=20)
    labels = list(string.ascii_uppercase)
    chats = [mcq_chat("Pick one. " + " ".join(f"{c}. thing {c}" for c in labels)), mcq_chat("2 + 2? A. 4 B. 5")]
    rows = [labels, ["A", "B"]]
    got = eng.label_logprobs(chats, rows)
    ref = tiny_llm.label_logprobs(chats, rows)
    assert np.isfinite(got[0]).all()  # 26 labels, 20 top log-probs: the rest from prompt log-probs
    np.testing.assert_allclose(got, ref, atol=1e-4)
    want = tiny_llm.encode_chats(chats)
    assert seen[0][0] == want[0] and seen[1][0] == want[1]  # the locally rendered token ids, as is
    assert any(kw.get("prompt_logprobs") == 0 for _, kw in seen)
    assert all(ids[: len(want[0])] == want[0] or ids[: len(want[1])] == want[1] for ids, _ in seen)
    seen.clear()
    gens = eng.generate(chats[:1], max_new_tokens=1)
    assert seen[0][0] == want[0] and gens[0][0].prompt_tokens == len(want[0])
