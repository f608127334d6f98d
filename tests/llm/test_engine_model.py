"""The native engine on tiny random-weight GGUF models written in code
(Llama with llama.cpp's q/k permutation, Qwen2 with q/k/v biases and a tied
head; every GGML format): the same numbers as transformers reading the same
file, batch and schedule invariance (bitwise), the prefix cache's exactness,
and the checks of the forward pass's inputs."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
tf = pytest.importorskip("transformers")
pytest.importorskip("gguf")

from llm_helpers import mcq_chat, write_tiny_gguf  # noqa: E402

from rcn_fast.llm import load_llm  # noqa: E402
from rcn_fast.llm.backends.engine import GGUFLLM  # noqa: E402

QUESTIONS = [
    "Where would you put a plate after washing it? A. cupboard B. table C. floor D. oven E. car",
    "What is 2 + 2? A. 4 B. 5 C. 22",
    "Name a colour: A. blue B. dog",
    "The quick brown fox jumps over the lazy dog. Which animal is lazy? A. fox B. dog",
]


def _model(arch: str, vocab: int, eos: int, pad: int):
    common = dict(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=512, eos_token_id=eos, pad_token_id=pad,
                  bos_token_id=None, rms_norm_eps=1e-5)
    torch.manual_seed(1)
    if arch == "llama":
        model = tf.LlamaForCausalLM(tf.LlamaConfig(tie_word_embeddings=False, **common))
    else:
        model = tf.Qwen2ForCausalLM(tf.Qwen2Config(tie_word_embeddings=True, **common))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim == 2:
                p.mul_(8.0)
            elif name.endswith("bias"):
                p.normal_(0.0, 0.5)
            else:  # norms: away from 1 so a missed weight shows
                p.uniform_(0.5, 1.5)
    return model.eval()


@pytest.fixture(scope="module", params=[("llama", "F32"), ("llama", "F16"), ("llama", "Q8_0"), ("llama", "Q4_1"),
                                        ("llama", "Q4_0"), ("qwen2", "Q8_0"), ("qwen2", "F32")],
                ids=lambda p: "-".join(p))
def pair(request, tmp_path_factory):
    """(native engine, transformers model) on one tiny GGUF file."""
    arch, qtype = request.param
    path = write_tiny_gguf(tmp_path_factory.mktemp(f"gguf-{arch}-{qtype}"), arch, build=_model, qtype=qtype)
    with pytest.MonkeyPatch.context() as mp:  # the tokenizer cache of these files stays in the test's folder
        mp.setenv("RCN_FAST_CACHE", str(path.parent / "cache"))
        native = load_llm(str(path), batch_size=3, num_threads=2)
    hf = load_llm(str(path), engine="transformers", device="cpu")
    assert isinstance(native, GGUFLLM)
    return native, hf


def _full_logits_native(llm: GGUFLLM, ids: list[int]) -> np.ndarray:
    m = llm.model
    cache = m.new_cache(1, len(ids))
    n = len(ids)
    return m.forward(np.array(ids), np.zeros(n), np.arange(n), cache, np.arange(n))


def test_logits_equal_transformers_on_the_same_file(pair):
    native, hf = pair
    for q in QUESTIONS:
        ids = hf.encode_chats([mcq_chat(q)])[0]
        assert native.encode_chats([mcq_chat(q)])[0] == ids
        with torch.no_grad():
            ref = hf.model(torch.tensor([ids])).logits[0].double().numpy()
        got = _full_logits_native(native, ids)
        scale = np.abs(ref).max()
        np.testing.assert_allclose(got, ref, rtol=0, atol=2e-5 * scale + 1e-5)


def test_every_kernel_variant_runs_the_same_model(pair):
    """generic, AVX2 and AVX-512 (those this CPU runs): each close to
    transformers, each batch invariant on its own."""
    from rcn_fast import _native

    native, hf = pair
    ids = hf.encode_chats([mcq_chat(QUESTIONS[0])])[0]
    with torch.no_grad():
        ref = hf.model(torch.tensor([ids])).logits[0].double().numpy()
    m = native.model
    chosen = m.isa
    compiled = _native.cpu_module()[0].quant_info()["compiled"].split(",")
    try:
        for isa in compiled:
            m.isa = isa
            try:
                got = _full_logits_native(native, ids)
            except ValueError as exc:  # compiled in, but this CPU lacks it
                assert "not supported" in str(exc)
                continue
            np.testing.assert_allclose(got, ref, rtol=0, atol=2e-5 * np.abs(ref).max() + 1e-5)
            c = m.new_cache(1, len(ids))
            last = m.forward(np.array(ids[:-1]), np.zeros(len(ids) - 1), np.arange(len(ids) - 1), c, np.array([0]))
            step = m.forward(np.array(ids[-1:]), np.zeros(1), np.array([len(ids) - 1]), c, np.array([0]))
            np.testing.assert_array_equal(step[0], got[-1])
            assert last.shape == (1, got.shape[1])
    finally:
        m.isa = chosen


def test_label_logprobs_and_greedy_text_equal_transformers(pair):
    native, hf = pair
    chats = [mcq_chat(q) for q in QUESTIONS]
    labels = [["A", "B", "C", "D", "E"], ["A", "B", "C"], ["A", "B"], ["A", "B"]]
    np.testing.assert_allclose(native.label_logprobs(chats, labels), hf.label_logprobs(chats, labels),
                               rtol=1e-5, atol=2e-5)
    gen = [[{"role": "user", "content": q}] for q in QUESTIONS]
    a = native.generate(gen, max_new_tokens=8)
    b = hf.generate(gen, max_new_tokens=8)
    assert [r[0].text for r in a] == [r[0].text for r in b]
    assert [r[0].generated_tokens for r in a] == [r[0].generated_tokens for r in b]
    assert [r[0].finish_reason for r in a] == [r[0].finish_reason for r in b]


def test_ragged_batches_and_incremental_decoding_are_bitwise_equal(pair):
    native, _ = pair
    m = native.model
    prompts = native.encode_chats([mcq_chat(q) for q in QUESTIONS])
    alone = [_full_logits_native(native, p)[-1] for p in prompts]
    # all prompts in one ragged pass, in slots of a shared cache
    cache = m.new_cache(len(prompts), max(map(len, prompts)) + 3)
    toks = np.concatenate(prompts)
    slots = np.concatenate([[i] * len(p) for i, p in enumerate(prompts)])
    pos = np.concatenate([np.arange(len(p)) for p in prompts])
    last = np.cumsum([len(p) for p in prompts]) - 1
    together = m.forward(toks, slots, pos, cache, last)
    for i in range(len(prompts)):
        np.testing.assert_array_equal(together[i], alone[i])
    # one token at a time equals the one-shot prefill
    p = prompts[1]
    c = m.new_cache(1, len(p))
    steps = [m.forward(np.array([t]), np.zeros(1), np.array([j]), c, np.array([0]))[0] for j, t in enumerate(p)]
    np.testing.assert_array_equal(np.stack(steps), _full_logits_native(native, p))


def test_prefix_cache_is_exact_and_used(pair):
    native, _ = pair
    shared = "You will read a question with answer options. " * 6
    chats = [mcq_chat(shared + q) for q in QUESTIONS]
    labels = ["A", "B"]
    gen_chats = [[{"role": "user", "content": shared + q}] for q in QUESTIONS]
    native.prefix_cache.clear()
    cfg = native.prefix_cache.max_bytes
    try:
        native.prefix_cache.max_bytes = 0
        off_lp = native.label_logprobs(chats, labels)
        off_gen = native.generate(gen_chats, max_new_tokens=6)
        off_sample = native.generate(gen_chats, max_new_tokens=6, temperature=0.9, num_samples=2, seed=3)
    finally:
        native.prefix_cache.max_bytes = cfg
    before = native.prefix_cache.stats.reused_tokens
    on_lp = native.label_logprobs(chats, labels)
    assert native.prefix_cache.stats.reused_tokens - before >= len(QUESTIONS) * 40  # the shared text ran once
    assert len(native.prefix_cache) >= 1
    np.testing.assert_array_equal(on_lp, off_lp)
    assert native.generate(gen_chats, max_new_tokens=6) == off_gen
    assert native.generate(gen_chats, max_new_tokens=6, temperature=0.9, num_samples=2, seed=3) == off_sample
    # and a later call reuses the stored prefix
    again = native.label_logprobs(chats[:1], labels)
    np.testing.assert_array_equal(again, off_lp[:1])


def test_samples_do_not_depend_on_the_batch(pair):
    native, _ = pair
    chats = [[{"role": "user", "content": q}] for q in QUESTIONS]
    both = native.generate(chats, max_new_tokens=6, temperature=1.0, num_samples=3, seed=7)
    alone = native.generate(chats[2:3], max_new_tokens=6, temperature=1.0, num_samples=3, seed=7)
    assert both[2] == alone[0]
    some = native.generate_samples(chats[2:3], [[2]], max_new_tokens=6, temperature=1.0, seed=7)
    assert some[0][0] == both[2][2]


def test_forward_checks_its_inputs(pair):
    native, _ = pair
    m = native.model
    c = m.new_cache(2, 8)
    ok = dict(tokens=np.array([1, 2]), slots=np.array([0, 0]), positions=np.array([0, 1]))

    def run(**kw):
        a = {**ok, **kw}
        m.forward(a["tokens"], a["slots"], a["positions"], c, np.array([1]))

    run()
    with pytest.raises(ValueError, match=r"tokens\[1\]"):
        run(tokens=np.array([1, 10**6]))
    with pytest.raises(ValueError, match=r"slots\[0\]"):
        run(slots=np.array([2, 0]))
    with pytest.raises(ValueError, match=r"positions\[1\]"):
        run(positions=np.array([0, 8]))
    with pytest.raises(ValueError, match="same"):
        run(positions=np.array([1, 1]))
    with pytest.raises(ValueError, match="out_rows"):
        m.forward(ok["tokens"], ok["slots"], ok["positions"], c, np.array([5]))
