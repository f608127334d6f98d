"""Local transformers backend on tiny random-weight Llama/Qwen2 models,
loaded from disk through load_llm."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from llm_helpers import NO_SYSTEM, build_tokenizer, mcq_chat  # noqa: E402

from rcn_fast.llm import load_llm  # noqa: E402
from rcn_fast.llm.backends.hf import HFLLM  # noqa: E402

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


def test_sampling_does_not_depend_on_batching(tiny_llm):
    """A sample depends on (prompt, parameters, seed, sample index) only:
    not on the other rows, batch size, position in the batch or num_samples."""
    from rcn_fast.llm.backends.hf import HFConfig

    chats = [mcq_chat(q, prefill="") for q in QUESTIONS]
    kw = dict(max_new_tokens=6, temperature=1.3, top_p=0.95, seed=11)
    texts = lambda rows: [[g.text for g in r] for r in rows]  # noqa: E731
    alone = [tiny_llm.generate([c], num_samples=3, **kw)[0] for c in chats]
    for bs in (2, 4, 16):
        other = HFLLM(tiny_llm.model, tiny_llm.tokenizer, config=HFConfig(batch_size=bs))
        batched = other.generate(chats, num_samples=3, **kw)
        assert texts(batched) == texts(alone), bs
        assert [[g.to_dict() for g in r] for r in batched] == [[g.to_dict() for g in r] for r in alone]
    # token counts too, when stop strings end rows at different steps of a batch
    stops = {**kw, "stop": ["e", "o"]}
    alone_s = [tiny_llm.generate([c], num_samples=3, **stops)[0] for c in chats]
    assert tiny_llm.generate(chats, num_samples=3, **stops) == alone_s
    assert any(g.finish_reason == "stop" for r in alone_s for g in r)
    # another order and other neighbours
    rev = tiny_llm.generate(chats[::-1] + [mcq_chat("An unrelated question?", prefill="")], num_samples=3, **kw)
    assert texts(rev[:5][::-1]) == texts(alone)
    # the first samples of num_samples=n are those of num_samples=k
    two = tiny_llm.generate(chats, num_samples=2, **kw)
    assert texts(two) == [t[:2] for t in texts(alone)]
    picked = tiny_llm.generate_samples(chats[:2], [[2, 0], [1]], **kw)
    assert texts(picked) == [[alone[0][2].text, alone[0][0].text], [alone[1][1].text]]
    # not degenerate: samples of one prompt differ, and so do seeds
    assert any(len(set(t)) > 1 for t in texts(alone))
    other_seed = tiny_llm.generate(chats, num_samples=3, **{**kw, "seed": 12})
    assert texts(other_seed) != texts(alone)
    with pytest.raises(ValueError, match="sample_ids\\[0\\]: expected distinct"):
        tiny_llm.generate_samples(chats[:1], [[1, 1]], **kw)
    with pytest.raises(ValueError, match="greedy decoding"):
        tiny_llm.generate_samples(chats[:1], [[1]], max_new_tokens=2)


def test_token_counts_do_not_depend_on_padding(tiny_llm):
    """A row a stop string ended counts its own tokens, whether the batch
    went on (padding after it, and the pad id is also an end-of-turn id
    here) or not; a generated end-of-turn token counts."""
    from rcn_fast.llm.base import GenerationParams

    tok, pad = tiny_llm.tokenizer, tiny_llm.pad_id
    assert pad in tiny_llm.eos_ids
    with_e = next(i for i in range(len(tok)) if "e" in tok.decode([i]) and i not in tiny_llm.eos_ids)
    plain = next(i for i in range(len(tok)) if tok.decode([i]).isalpha() and "e" not in tok.decode([i]))
    stop_ids = set(tiny_llm.eos_ids) | {pad}
    p = GenerationParams(max_new_tokens=4, stop=["e"])
    a = tiny_llm._finish([plain, with_e, pad, pad], 5, p, stop_ids)
    b = tiny_llm._finish([plain, with_e], 5, p, stop_ids)
    assert a == b and a.generated_tokens == 2 and a.finish_reason == "stop" and "e" not in a.text
    eos = tiny_llm._finish([plain, tok.eos_token_id, pad, pad], 5, GenerationParams(max_new_tokens=4), stop_ids)
    assert eos.generated_tokens == 2 and eos.text == tok.decode([plain]) and eos.finish_reason == "stop"
    full = tiny_llm._finish([plain] * 4, 5, GenerationParams(max_new_tokens=4), stop_ids)
    assert full.generated_tokens == 4 and full.finish_reason == "length"


@pytest.mark.parametrize("mode", ["hidden", "logits"])
@pytest.mark.parametrize("dtype,ulps", [("bfloat16", 10), ("float16", 16)])
def test_half_precision_close_to_float32(tiny_llama_dir, dtype, ulps, mode):
    """bf16/fp16 on CPU: label log-probs within a few units of the dtype's
    rounding (2**-8 for bf16, 2**-11 for fp16) of float32. An error in a
    log-probability is the relative error of the probability."""
    chats = [mcq_chat(q) for q in QUESTIONS]
    labels = list("ABCD")
    ref = load_llm(tiny_llama_dir, device="cpu", dtype="float32", scoring=mode).label_logprobs(chats, labels)
    llm = load_llm(tiny_llama_dir, device="cpu", dtype=dtype, scoring=mode)
    assert next(llm.model.parameters()).dtype == getattr(torch, dtype)
    assert f":{dtype}:" in llm.identity
    got = llm.label_logprobs(chats, labels)
    assert got.dtype == np.float32 and np.isfinite(got).all()
    eps = {"bfloat16": 2.0**-8, "float16": 2.0**-11}[dtype]
    err = np.abs(got - ref).max()
    assert err <= ulps * eps, err
    # far below the differences between questions, so a mixed-up row would fail
    assert np.ptp(ref, axis=0).min() > 10 * ulps * eps
    np.testing.assert_allclose(np.exp(got).sum(1), 1.0, rtol=1e-5)
    g = llm.generate(chats[:2], max_new_tokens=3)
    assert all(1 <= r[0].generated_tokens <= 3 for r in g)


def test_identity_covers_the_weights(tiny_llama_dir):
    import transformers as tf

    tok = build_tokenizer()
    a = tf.AutoModelForCausalLM.from_pretrained(tiny_llama_dir)
    b = tf.AutoModelForCausalLM.from_pretrained(tiny_llama_dir)
    la, lb = load_llm((a, tok)), load_llm((b, tok))
    assert la.name == lb.name and la.identity == lb.identity
    with torch.no_grad():  # one row of one matrix: another model, same name
        b.model.layers[1].mlp.down_proj.weight[7].mul_(1.01)
    lc = load_llm((b, tok))
    assert lc.identity != la.identity
    # an in-place change is seen after refresh_identity()
    before = lb.identity
    assert lb.refresh_identity() == lc.identity != before


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
    with pytest.raises(ValueError, match="missing': no such file or directory"):
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
    g = load_llm(str(path), engine="transformers")
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


def test_load_tokenizer_takes_a_tokenizer_only_folder_and_resolves_the_rest(tmp_path):
    """A folder of tokenizer files alone (no config.json) is a tokenizer; a
    model folder, a .gguf or a package resolve as load_llm resolves them."""
    from rcn_fast.llm.tokenizer import load_tokenizer

    tok = build_tokenizer()
    tok.save_pretrained(tmp_path / "tok")
    assert not (tmp_path / "tok" / "config.json").exists()
    again = load_tokenizer(str(tmp_path / "tok"))
    assert again("hello world")["input_ids"] == tok("hello world")["input_ids"]
    with pytest.raises(ValueError, match="missing': no such file or directory"):
        load_tokenizer(str(tmp_path / "missing"))
