"""The native engine on the files llama.cpp's users have: a tiny Llama made
by llama.cpp's own converter (tests/llm/kquant_cases.py) quantized by
llama.cpp's own quantizer to Q4_K_M, Q5_K_M, Q6_K and a plain Q4_0 (whose
tied token_embd llama.cpp writes as Q6_K), plus the token embedding forced
to Q4_K and to Q5_K (llama-quantize's ``--token-embedding-type``): every
K-quant as a matrix, an embedding row and the tied output head.

Anchors outside the project: the engine's dequantisation equals gguf-py's
(llama.cpp's own Python) bit for bit; with ``activations="q8"`` its logits
are llama.cpp's own (``llama_cpp.Llama(logits_all=True)``, float32 key/value
cache) up to summation order, and its greedy text is llama.cpp's; with
``activations="f32"`` its logits are transformers' on the same file.
"""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest

pytest.importorskip("llama_cpp")
gguf = pytest.importorskip("gguf")

import kquant_cases as kc  # noqa: E402
from llm_helpers import mcq_chat  # noqa: E402

from rcn_fast.llm.backends.engine import EngineConfig, GGUFLLM, ggml_types  # noqa: E402
from rcn_fast.llm.backends.engine.gguf_file import GGUFFile  # noqa: E402

#: (file name, quantisation, token embedding type override)
FILES = [("Q4_K_M", "Q4_K_M", None), ("Q5_K_M", "Q5_K_M", None), ("Q6_K", "Q6_K", None), ("Q4_0", "Q4_0", None),
         ("Q4_K_M-embd-Q4_K", "Q4_K_M", "Q4_K"), ("Q5_K_M-embd-Q5_K", "Q5_K_M", "Q5_K")]
TOKENS = [list(range(5, 60)), [7, 300 - 1, 12, 12, 12, 250, 3, 99, 140, 141, 142, 143, 0, 1, 2, 280]]
CHATS = [[{"role": "user", "content": "Where would you put a plate after washing it? Answer with one letter."}],
         [{"role": "system", "content": "Pick the best answer."}, {"role": "user", "content": "A B C D E"}]]


def test_the_committed_file_is_the_converters():
    manifest = json.loads((kc.DATA / "manifest.json").read_text(encoding="utf-8"))
    assert hashlib.sha256(kc.GGUF.read_bytes()).hexdigest() == manifest["gguf_sha256"], "the committed GGUF was changed"
    pytest.importorskip("safetensors")
    import converter_cases as cc

    assert cc.digest_of(kc.weights()) == manifest["weights_sha256"], "the rebuilt weights are not the ones converted"


@pytest.fixture(scope="module", params=FILES, ids=[f[0] for f in FILES])
def quantized(request, tmp_path_factory):
    """(name, path, the GGML type name of every matrix kind) of one file made by llama.cpp's quantizer."""
    name, quant, embd = request.param
    path = tmp_path_factory.mktemp("kquant") / f"{name}.gguf"
    from rcn_fast.testing import llamacpp_tools as lt

    lt.quantize(kc.GGUF, path, quant, allow_requantize=True,
                token_embedding_type=None if embd is None else ggml_types.by_name()[embd])
    want = dict(kc.MIXES[quant], **({"token_embd": embd} if embd else {}))
    return name, path, want


def _engine(path, activations: str) -> GGUFLLM:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RCN_FAST_CACHE", str(path.parent / "cache"))
        return GGUFLLM(path, config=EngineConfig(num_threads=2, activations=activations, batch_size=2))


def _logits(llm: GGUFLLM, ids: list[int]) -> np.ndarray:
    m = llm.model
    n = len(ids)
    return m.forward(np.array(ids), np.zeros(n), np.arange(n), m.new_cache(1, n), np.arange(n))


def _llamacpp(path):
    import llama_cpp

    # float32 keys and values and no flash attention: llama.cpp's attention in float32, as the engine's
    return llama_cpp.Llama(str(path), n_ctx=256, logits_all=True, n_threads=2, n_threads_batch=2, type_k=0, type_v=0,
                           flash_attn=False, verbose=False)


def test_llamacpp_wrote_the_k_quants(quantized):
    _, path, want = quantized
    g = GGUFFile(path)
    got = {n.split(".")[-2] if n.startswith("blk.") else n.split(".")[0]: ggml_types.type_name(t.ggml_type)
           for n, t in g.tensors.items() if len(t.shape) == 2}
    assert got == want
    assert "output.weight" not in g.tensors  # tied: the head is token_embd


def test_dequantisation_equals_gguf_py_bit_for_bit(quantized):
    from gguf import quants

    from rcn_fast import _native

    _, path, _ = quantized
    g = GGUFFile(path)
    C = _native.cpu_module()[0]
    for name, t in g.tensors.items():
        if len(t.shape) != 2:
            continue
        n, k = t.shape
        raw = np.asarray(g.data(name)).reshape(n, -1)
        ours = np.empty((n, k), np.float32)
        C.quant_dequantize(raw, t.ggml_type, k, ours)
        theirs = quants.dequantize(raw, gguf.GGMLQuantizationType(t.ggml_type)).astype(np.float32)
        np.testing.assert_array_equal(ours.view(np.uint32), theirs.view(np.uint32), err_msg=name)


def test_q8_logits_are_llamacpps(quantized):
    """llama.cpp's arithmetic: the same numbers as llama.cpp up to summation
    order (a position may differ by a rounding step of one 8-bit activation:
    at most a few percent, at a few positions)."""
    _, path, _ = quantized
    native = _engine(path, "q8")
    llm = _llamacpp(path)
    for ids in TOKENS:
        llm.reset()
        llm.eval(ids)
        ref = np.array(llm.scores[: len(ids)], dtype=np.float64)
        got = _logits(native, ids)
        err = np.abs(got - ref).max(1) / np.abs(ref).max()
        assert err.max() < 0.05, err.max()
        assert np.mean(err < 1e-5) >= 0.9, err
        assert np.mean(got.argmax(1) == ref.argmax(1)) >= 0.9


def _llamacpp_greedy(llm, prompt: list[int], n: int, eos: set[int]) -> list[int]:
    llm.reset()
    llm.eval(prompt)
    out: list[int] = []
    while len(out) < n:
        tok = int(np.argmax(llm.scores[llm.n_tokens - 1]))
        out.append(tok)
        if tok in eos:
            break
        llm.eval([tok])
    return out


def test_q8_greedy_text_is_llamacpps(quantized):
    _, path, _ = quantized
    native = _engine(path, "q8")
    llm = _llamacpp(path)
    prompts = native.encode_chats(CHATS)
    got = native.generate(CHATS, max_new_tokens=16)
    for p, r in zip(prompts, got):
        want = _llamacpp_greedy(llm, p, 16, set(native.eos_ids))
        assert r[0].generated_tokens == len(want) and r[0].generated_tokens >= 8
        assert r[0].text == native.tokenizer.decode([t for t in want if t not in native.eos_ids],
                                                    skip_special_tokens=True)


def test_f32_logits_are_transformers(quantized):
    """float32 activations: transformers' numbers for the same file
    (its GGUF reader dequantises with gguf-py)."""
    pytest.importorskip("transformers")
    torch = pytest.importorskip("torch")
    from rcn_fast.llm import load_llm

    _, path, _ = quantized
    native = _engine(path, "f32")
    hf = load_llm(str(path), engine="transformers", device="cpu")
    for chat in CHATS:
        ids = hf.encode_chats([chat])[0]
        assert native.encode_chats([chat])[0] == ids
        with torch.no_grad():
            ref = hf.model(torch.tensor([ids])).logits[0].double().numpy()
        np.testing.assert_allclose(_logits(native, ids), ref, rtol=0, atol=2e-5 * np.abs(ref).max() + 1e-5)
    labels = ["A", "B", "C", "D"]
    chats = [mcq_chat("Which is true? A. fox B. dog C. cat D. owl")]
    np.testing.assert_allclose(native.label_logprobs(chats, labels), hf.label_logprobs(chats, labels), rtol=1e-5,
                               atol=2e-5)


def test_interleaved_copies_change_nothing_but_memory(quantized):
    from rcn_fast.llm.backends.engine.model import NativeLlama

    _, path, want = quantized
    g = GGUFFile(path)
    packed = NativeLlama(g, num_threads=2, activations="q8")
    plain = NativeLlama(g, num_threads=2, activations="q8", pack=False)
    packs = {"Q4_0", "Q4_K"} & set(want.values())
    assert (packed.packed_bytes > 0) == bool(packs) and plain.packed_bytes == 0
    ids = TOKENS[0]
    n = len(ids)
    a = packed.forward(np.array(ids), np.zeros(n), np.arange(n), packed.new_cache(1, n), np.arange(n))
    b = plain.forward(np.array(ids), np.zeros(n), np.arange(n), plain.new_cache(1, n), np.arange(n))
    np.testing.assert_array_equal(a, b)


def test_the_arithmetics_are_batch_invariant_and_named(quantized):
    _, path, _ = quantized
    for act in ("q8", "f32"):
        native = _engine(path, act)
        m = native.model
        ids = TOKENS[1]
        full = _logits(native, ids)
        c = m.new_cache(1, len(ids))
        steps = [m.forward(np.array([t]), np.zeros(1), np.array([j]), c, np.array([0]))[0] for j, t in enumerate(ids)]
        np.testing.assert_array_equal(np.stack(steps), full)
        hidden = m.forward(np.array(ids), np.zeros(len(ids)), np.arange(len(ids)), m.new_cache(1, len(ids)),
                           np.array([len(ids) - 1]), logits=False)
        np.testing.assert_array_equal(m.head_logits(hidden, np.array([3, 17, 299]))[0], full[-1, [3, 17, 299]])
        assert (":q8:" in native.identity) == (act == "q8")


def test_the_arithmetic_setting_is_checked():
    from rcn_fast.llm.backends.engine.model import NativeLlama

    with pytest.raises(ValueError, match="activations: expected 'f32'"):
        EngineConfig(activations="int8")
    with pytest.raises(ValueError, match="isa: expected"):
        EngineConfig(isa="avx9")
    assert EngineConfig(isa="avx512vnni").isa == "avx512vnni"  # a name, checked against the CPU at load
    with pytest.raises(ValueError, match="activations"):
        NativeLlama(GGUFFile(kc.GGUF), activations="f16")
