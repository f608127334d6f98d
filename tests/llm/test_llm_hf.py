"""Local transformers backend on tiny random-weight Llama/Qwen2 models,
loaded from disk through load_llm."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from llm_helpers import NO_SYSTEM, build_tokenizer, mcq_chat  # noqa: E402

from rcn_fast.llm import load_llm  # noqa: E402
from rcn_fast.llm.hf import HFLLM  # noqa: E402

QUESTIONS = [
    "Where would you put a plate after washing it? A. cupboard B. table C. floor",
    "What is 2 + 2? A. 4 B. 5",
    "The quick brown fox jumps over what? A. dog B. cat C. moon D. car E. tree",
    "Name a colour. A. blue B. plate",
    "Knowledge connects concepts? A. yes B. no C. maybe D. never",
]


def full_vocab_reference(llm: HFLLM, chat, labels) -> np.ndarray:
    """Independent reference: the full [T, V] logits of the unpadded prompt,
    label mass = sum over spellings of softmax probabilities, renormalised
    over the labels (float64)."""
    ids = llm.encode_chats([chat])[0]
    with torch.no_grad():
        logits = llm.model(torch.tensor([ids])).logits[0, -1].double()
    logp = torch.log_softmax(logits, -1).numpy()
    tok = llm.tokenizer
    mass = []
    for lab in labels:
        spell = {tok.encode(s, add_special_tokens=False)[0] for s in (lab, " " + lab)}
        mass.append(np.exp(logp[sorted(spell)]).sum())
    mass = np.array(mass)
    return np.log(mass / mass.sum())


def test_loads_directory_and_reports_identity(tiny_dir):
    llm = load_llm(tiny_dir, batch_size=2)
    assert isinstance(llm, HFLLM)
    assert llm.identity.startswith("hf:")
    assert llm.scoring_mode == "hidden"
    assert llm.tokenizer.eos_token_id in llm.eos_ids


@pytest.mark.parametrize("mode", ["hidden", "logits"])
def test_label_logprobs_match_full_vocab_reference(tiny_dir, mode):
    llm = load_llm(tiny_dir, batch_size=2, scoring=mode)
    chats = [mcq_chat(q) for q in QUESTIONS]
    labels = [["A", "B", "C"], ["A", "B"], list("ABCDE"), ["A", "B"], list("ABCD")]
    got = llm.label_logprobs(chats, labels)
    assert got.dtype == np.float32 and got.shape == (5, 5)
    for i, (chat, labs) in enumerate(zip(chats, labels)):
        ref = full_vocab_reference(llm, chat, labs)
        np.testing.assert_allclose(got[i, : len(labs)], ref, rtol=1e-4, atol=1e-4)
        assert np.all(np.isneginf(got[i, len(labs) :]))
    # the scores depend on the prompt (the model is not degenerate)
    assert np.ptp(got[:, 0]) > 1e-3


def test_batched_equals_one_at_a_time(tiny_llm):
    chats = [mcq_chat(q) for q in QUESTIONS]
    batched = tiny_llm.label_logprobs(chats, ["A", "B"])
    single = np.concatenate([tiny_llm.label_logprobs([c], ["A", "B"]) for c in chats])
    np.testing.assert_allclose(batched, single, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.exp(batched).sum(1), 1.0, rtol=1e-5)


def test_label_errors(tiny_llm):
    chats = [mcq_chat(QUESTIONS[0])]
    with pytest.raises(ValueError, match="not a single token"):
        tiny_llm.label_logprobs(chats, ["A", "cupboard table"])
    with pytest.raises(ValueError, match="distinct"):
        tiny_llm.label_logprobs(chats, ["A", "A"])
    with pytest.raises(ValueError, match="expected 1 lists"):
        tiny_llm.label_logprobs(chats, [["A"], ["B"]])
    with pytest.raises(ValueError, match="wrap a single chat"):
        tiny_llm.label_logprobs(chats[0], ["A"])


def test_generate_greedy_batched_equals_single_and_continues_prefill(tiny_llm):
    chats = [mcq_chat(q, prefill="Explanations:\n* ") for q in QUESTIONS[:4]]
    batched = tiny_llm.generate(chats, max_new_tokens=6)
    single = [tiny_llm.generate([c], max_new_tokens=6)[0] for c in chats]
    assert [g[0].text for g in batched] == [g[0].text for g in single]
    for chat, (g,) in zip(chats, batched):
        assert g.prompt_tokens == len(tiny_llm.encode_chats([chat])[0])
        assert 1 <= g.generated_tokens <= 6
        assert g.finish_reason in ("stop", "length")
        assert not g.text.startswith("Explanations")


def test_generate_stops_at_eos_and_stop_strings(tiny_llm):
    chat = [mcq_chat(QUESTIONS[1], prefill="Answer:")]
    first = tiny_llm.generate(chat, max_new_tokens=8)[0][0]
    ids = tiny_llm.encode_chats(chat)[0]
    # the greedy continuation, token by token
    with torch.no_grad():
        seq = tiny_llm.model.generate(torch.tensor([ids]), max_new_tokens=8, do_sample=False,
                                      eos_token_id=tiny_llm.eos_ids, pad_token_id=tiny_llm.pad_id)
    new = seq[0, len(ids):].tolist()
    if first.finish_reason == "length":
        assert first.generated_tokens == 8
    # make the 3rd greedy token an end-of-turn token: generation stops there
    third = new[2]
    model, tok = tiny_llm.model, tiny_llm.tokenizer
    old = model.generation_config.eos_token_id
    try:
        model.generation_config.eos_token_id = [tok.eos_token_id, third]
        llm = load_llm((model, tok))
        g = llm.generate(chat, max_new_tokens=8)[0][0]
    finally:
        model.generation_config.eos_token_id = old
    assert g.finish_reason == "stop" and g.generated_tokens == 3
    assert g.text == tok.decode(new[:2], skip_special_tokens=True)
    # a stop string inside the greedy text cuts it there
    text = first.text
    if len(text) >= 4:
        stop = text[2:4]
        g2 = tiny_llm.generate(chat, max_new_tokens=8, stop=[stop])[0][0]
        assert g2.text == text[: text.find(stop)]
        assert g2.finish_reason == "stop"


def test_sampling_is_seeded(tiny_llm):
    chats = [mcq_chat(q, prefill="") for q in QUESTIONS[:2]]
    a = tiny_llm.generate(chats, max_new_tokens=5, temperature=1.5, num_samples=3, seed=7)
    b = tiny_llm.generate(chats, max_new_tokens=5, temperature=1.5, num_samples=3, seed=7)
    c = tiny_llm.generate(chats, max_new_tokens=5, temperature=1.5, num_samples=3, seed=8)
    assert all(len(r) == 3 for r in a)
    texts = lambda r: [[g.text for g in row] for row in r]  # noqa: E731
    assert texts(a) == texts(b)
    assert texts(a) != texts(c)
    with pytest.raises(ValueError, match="num_samples"):
        tiny_llm.generate(chats, num_samples=2)


def test_cost_accounting_per_tag(tiny_dir):
    llm = load_llm(tiny_dir)
    chats = [mcq_chat(q) for q in QUESTIONS[:3]]
    llm.label_logprobs(chats, ["A", "B"], tags=["q1", "q2", "q1"])
    gens = llm.generate(chats[:2], max_new_tokens=3, tags=["q1", "q2"])
    lens = [len(x) for x in llm.encode_chats(chats)]
    assert llm.cost.total.calls == 5
    assert llm.cost.total.prompt_tokens == sum(lens) + lens[0] + lens[1]
    assert llm.cost.total.generated_tokens == sum(g[0].generated_tokens for g in gens)
    q1 = llm.cost.by_tag["q1"]
    assert q1.calls == 3 and q1.prompt_tokens == lens[0] + lens[2] + lens[0]
    assert q1.generated_tokens == gens[0][0].generated_tokens


def test_system_role_fallback_with_pair(tiny_llama_dir):
    import transformers as tf

    model = tf.AutoModelForCausalLM.from_pretrained(tiny_llama_dir)
    tok = build_tokenizer(NO_SYSTEM)
    llm = load_llm((model, tok))
    assert llm.system_role is False
    chat = mcq_chat("Q? A. x B. y")
    text = llm.render([chat])[0]
    assert text.startswith("<|im_start|>user\nPick the best answer.\n\nQ? A. x B. y<|im_end|>")
    assert text.endswith("<|im_start|>assistant\nAnswer: ")
    lp = llm.label_logprobs([chat], ["A", "B"])
    assert lp.shape == (1, 2) and np.isfinite(lp).all()


def test_load_errors(tmp_path):
    with pytest.raises(ValueError, match="neither a model directory"):
        load_llm(str(tmp_path / "missing"))
    (tmp_path / "weights.bin").write_bytes(b"")
    with pytest.raises(ValueError, match=".gguf"):
        load_llm(str(tmp_path / "weights.bin"))
    with pytest.raises(ValueError, match="openai:<base_url>#<model>"):
        load_llm("openai:http://127.0.0.1:1")
    with pytest.raises(TypeError, match="unknown option"):
        load_llm(("m", "t"), batch=3)
    with pytest.raises(ValueError, match="not installed"):
        load_llm("package:rcn_fast_no_such_model_pkg")
    with pytest.raises(ValueError, match="batch_size"):
        load_llm(str(tmp_path), batch_size=0)


def test_optional_vllm_engine_names_its_install():
    import importlib.util

    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vllm is installed; the missing-import path cannot be exercised")
    with pytest.raises(ImportError, match="pip install vllm"):
        load_llm("vllm:some/model")


def test_gguf_file_loads_and_matches_the_directory_model(tiny_llm, tmp_path):
    pytest.importorskip("gguf")
    from llm_helpers import write_llama_gguf

    path = tmp_path / "tiny.gguf"
    write_llama_gguf(tiny_llm.model, tiny_llm.tokenizer, path)
    g = load_llm(str(path))
    assert g.identity.startswith(f"hf:{path}:float32:")
    chats = [mcq_chat(q) for q in QUESTIONS[:3]]
    assert g.render(chats) == tiny_llm.render(chats)
    assert g.encode_chats(chats) == tiny_llm.encode_chats(chats)
    np.testing.assert_allclose(g.label_logprobs(chats, ["A", "B"]), tiny_llm.label_logprobs(chats, ["A", "B"]), rtol=1e-5, atol=1e-5)
    assert [r[0].text for r in g.generate(chats, max_new_tokens=4)] == [r[0].text for r in tiny_llm.generate(chats, max_new_tokens=4)]


@pytest.mark.parametrize("mode", ["hidden", "logits"])
def test_scoring_backend_triton_in_the_model_path(tiny_llama_dir, mode):
    import importlib.util
    import os

    if importlib.util.find_spec("triton") is None or not (torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1"):
        pytest.skip("triton missing, or neither CUDA nor TRITON_INTERPRET=1")
    chats = [mcq_chat(q) for q in QUESTIONS]
    tri = load_llm(tiny_llama_dir, scoring=mode, scoring_backend="triton").label_logprobs(chats, list("ABCD"))
    ref = load_llm(tiny_llama_dir, scoring=mode, scoring_backend="torch").label_logprobs(chats, list("ABCD"))
    np.testing.assert_allclose(tri, ref, rtol=1e-5, atol=1e-5)
