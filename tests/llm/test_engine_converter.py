"""Parity anchored outside the project: tiny random models converted to GGUF
by llama.cpp's own converter (llama-cpp-python 0.3.36's
``convert_hf_to_gguf.py --outtype f32``; the files and the script that
made them: tests/llm/converter_cases.py, tests/llm/data/converter/) run on
the engine as transformers runs the ORIGINAL Hugging Face folder: the same
token ids, the same greedy text, label log-probs within 1e-4.

Cases: Llama with the default rope (untied head, as many key/value heads as
heads); Llama with Llama 3.1/3.2's ``llama3`` rope (factor 8: the converter
writes a ``rope_freqs.weight`` tensor and no scaling key; tied embeddings,
grouped-query attention); Qwen2 (q/k/v biases, NEOX rope, tied, GQA).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("safetensors")

import converter_cases as cc  # noqa: E402
from llm_helpers import mcq_chat  # noqa: E402

from rcn_fast.llm import load_llm  # noqa: E402
from rcn_fast.llm.backends.engine import GGUFLLM  # noqa: E402

MANIFEST = json.loads((cc.DATA / "manifest.json").read_text(encoding="utf-8"))
_LONG = ("Question: Where would you put a plate after washing it? A. cupboard B. table C. floor. "
         "The quick brown fox jumps over the lazy dog. Knowledge connects concepts. ") * 3
CHATS = [
    [{"role": "user", "content": _LONG + "Answer with one letter."}],  # well past the llama3 rope's 64-token context
    [{"role": "system", "content": "Pick the best answer."}, {"role": "user", "content": "Answer: A B C D E"}],
]
MCQ = [mcq_chat(_LONG + q) for q in ("Which is true? A. fox B. dog", "Where? A. cupboard B. table C. floor D. car")]


@pytest.fixture(scope="module", params=list(cc.CASES))
def case(request, tmp_path_factory):
    """(name, the engine on the converter's GGUF, transformers on the original folder, that folder)."""
    name = request.param
    gguf = cc.DATA / f"{name}.gguf"
    want = MANIFEST["cases"][name]
    assert hashlib.sha256(gguf.read_bytes()).hexdigest() == want["gguf_sha256"], "the committed GGUF was changed"
    assert cc.weights_digest(name) == want["weights_sha256"], "the rebuilt folder is not the one converted"
    folder = cc.write_folder(name, tmp_path_factory.mktemp(name))
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RCN_FAST_CACHE", str(folder / "cache"))
        native = load_llm(str(gguf), engine="native", num_threads=2)
    hf = load_llm(str(folder), device="cpu", dtype="float32")
    assert isinstance(native, GGUFLLM)
    return name, native, hf, folder


def test_the_converter_wrote_what_each_case_needs(case):
    name, native, hf, _ = case
    cfg = cc.config(name)
    assert native.model.tied == cfg["tie_word_embeddings"]
    assert native.model.hp.n_head_kv == cfg["num_key_value_heads"] and native.model.hp.arch == cfg["model_type"]
    assert (native.model.rope_freqs is not None) == ("rope_scaling" in cfg)
    if "rope_scaling" in cfg:  # what llama.cpp's converter computed from rope_scaling, applied by the engine
        half = native.model.hp.head_dim // 2
        assert native.model.rope_freqs.shape == (half,) and native.model.rope_freqs[0] == 1.0
        assert native.model.rope_freqs[-1] == 8.0 and 1.0 < native.model.rope_freqs[1:].max() <= 8.0


def test_token_ids_equal_transformers_on_the_original_folder(case):
    _, native, hf, _ = case
    assert native.encode_chats(CHATS + MCQ) == hf.encode_chats(CHATS + MCQ)
    assert len(native.encode_chats(CHATS)[0]) > 100


def test_greedy_text_equals_transformers_on_the_original_folder(case):
    _, native, hf, _ = case
    got = native.generate(CHATS, max_new_tokens=24)
    want = hf.generate(CHATS, max_new_tokens=24)
    assert [r[0].text for r in got] == [r[0].text for r in want]
    assert [r[0].generated_tokens for r in got] == [r[0].generated_tokens for r in want]
    assert all(r[0].generated_tokens >= 8 for r in got)  # text to compare, not an early end of turn


def test_label_logprobs_within_1e_4_of_transformers(case):
    _, native, hf, _ = case
    labels = ["A", "B", "C", "D"]
    got, want = native.label_logprobs(MCQ, labels), hf.label_logprobs(MCQ, labels)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-4)
    assert np.ptp(want, axis=1).min() > 1e-3  # the labels differ: a wrong model would show


def test_the_llama3_rope_changes_the_text(case, tmp_path):
    """The Llama 3.1 case can fail: transformers on the same weights with
    the default rope gives other text, so an engine that ignored
    ``rope_freqs`` (as it did) would not pass the greedy test."""
    name, native, hf, _ = case
    if name != "llama31_rope":
        pytest.skip("the llama3 rope case only")
    folder = cc.write_folder(name, tmp_path / "default-rope")
    cfg = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    del cfg["rope_scaling"]
    (folder / "config.json").write_text(json.dumps(cfg), encoding="utf-8")
    default_rope = load_llm(str(folder), device="cpu", dtype="float32").generate(CHATS[:1], max_new_tokens=24)
    assert default_rope[0][0].text != native.generate(CHATS[:1], max_new_tokens=24)[0][0].text
