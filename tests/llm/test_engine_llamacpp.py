"""llama.cpp in this process (``engine="llamacpp"``), against the real
llama-cpp-python and its own converter's and quantizer's files:

* parity on the converter's F32 files (tests/llm/data/converter): the same
  token ids as transformers on the ORIGINAL folder, the same greedy text,
  label log-probs within 1e-4 (the tolerance the native engine meets), and
  the same as the native engine;
* quantized files made here by llama.cpp's quantizer
  (``llama_model_quantize``: Q8_0, Q4_0, Q4_K_M of the Llama 3.1-shaped
  case with 256-wide rows): against the native engine where it runs the
  file, and against float32 arithmetic on the same dequantised weights
  (gguf-py's dequantisation, run by the native engine) where it does not;
* batched generation over sequence ids equals each row alone; prefix reuse
  (key/value sequence copies) changes no result; seeded samples are those
  drawn one by one; a small context serves many rows by waiting, and a
  prompt that cannot fit is a clear error;
* the doors: NaN logits are errors (label scores and text), the identity
  names the file's digest and the settings, the call cache keys on it, the
  chat template is rendered by rcn_fast's template door.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("llama_cpp")
torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import converter_cases as cc  # noqa: E402
import gguf_bytes as gb  # noqa: E402
from llm_helpers import mcq_chat  # noqa: E402

from rcn_fast.llm import load_llm  # noqa: E402
from rcn_fast.llm.backends.llamacpp import LlamaCppLLM, lib  # noqa: E402

MANIFEST = json.loads((cc.DATA / "manifest.json").read_text(encoding="utf-8"))
_LONG = ("Question: Where would you put a plate after washing it? A. cupboard B. table C. floor. "
         "The quick brown fox jumps over the lazy dog. Knowledge connects concepts. ") * 3
CHATS = [
    [{"role": "user", "content": _LONG + "Answer with one letter."}],
    [{"role": "system", "content": "Pick the best answer."}, {"role": "user", "content": "Answer: A B C D E"}],
]
MCQ = [mcq_chat(_LONG + q) for q in ("Which is true? A. fox B. dog", "Where? A. cupboard B. table C. floor D. car")]
LABELS = ["A", "B", "C", "D"]


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("RCN_FAST_CACHE", str(tmp_path / "cache"))


@pytest.fixture(scope="module", params=list(cc.CASES))
def case(request, tmp_path_factory):
    """(name, llama.cpp on the converter's GGUF, the native engine on it, transformers on the original folder)."""
    name = request.param
    gguf = cc.DATA / f"{name}.gguf"
    assert hashlib.sha256(gguf.read_bytes()).hexdigest() == MANIFEST["cases"][name]["gguf_sha256"]
    folder = cc.write_folder(name, tmp_path_factory.mktemp(name))
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RCN_FAST_CACHE", str(folder / "cache"))
        llama = load_llm(str(gguf), engine="llamacpp", num_threads=2)
        native = load_llm(str(gguf), engine="native", num_threads=2)
    hf = load_llm(str(folder), device="cpu", dtype="float32")
    assert isinstance(llama, LlamaCppLLM)
    return name, llama, native, hf


def test_token_ids_equal_transformers_and_the_native_engine(case):
    _, llama, native, hf = case
    want = hf.encode_chats(CHATS + MCQ)
    assert llama.encode_chats(CHATS + MCQ) == want == native.encode_chats(CHATS + MCQ)
    text = "Answer: A <|im_end|> café 123"
    assert llama.tokenizer.encode(text, add_special_tokens=False) == native.tokenizer.encode(text, add_special_tokens=False)
    ids = want[0]
    assert llama.tokenizer.decode(ids, skip_special_tokens=True) == native.tokenizer.decode(ids, skip_special_tokens=True)
    assert llama.eos_ids == native.eos_ids and llama.pad_id == native.pad_id == hf.tokenizer.pad_token_id
    assert llama.tokenizer.get_vocab() == native.tokenizer.get_vocab()


def test_greedy_text_equals_transformers_on_the_original_folder(case):
    _, llama, native, hf = case
    got = llama.generate(CHATS, max_new_tokens=24)
    want = hf.generate(CHATS, max_new_tokens=24)
    assert [r[0].text for r in got] == [r[0].text for r in want] == [r[0].text for r in native.generate(CHATS, max_new_tokens=24)]
    assert [r[0].generated_tokens for r in got] == [r[0].generated_tokens for r in want]
    assert all(r[0].generated_tokens >= 8 for r in got)


def test_label_logprobs_within_1e_4_of_transformers_and_the_native_engine(case):
    _, llama, native, hf = case
    got, want = llama.label_logprobs(MCQ, LABELS), hf.label_logprobs(MCQ, LABELS)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-4)
    np.testing.assert_allclose(got, native.label_logprobs(MCQ, LABELS), rtol=0, atol=1e-4)
    assert np.ptp(want, axis=1).min() > 1e-3  # the labels differ: a wrong model would show
    assert llama.cost.total.calls >= 2 and llama.cost.total.prompt_tokens > 0


def test_top_logprobs_equal_the_native_engine(case):
    _, llama, native, _ = case
    ids = llama.encode_chats(MCQ)
    got, want = llama.top_logprobs_ids(ids, 5), native.top_logprobs_ids(ids, 5)
    assert [[t for t, _ in r] for r in got] == [[t for t, _ in r] for r in want]
    # a log-softmax over the whole vocabulary: float32 logits' rounding (~1e-5 each) adds up over 300 tokens
    np.testing.assert_allclose([[v for _, v in r] for r in got], [[v for _, v in r] for r in want], atol=3e-4)


# ------------------------------------------------------------------ quantized files, made by llama.cpp's quantizer


@pytest.fixture(scope="module")
def quantized(tmp_path_factory):
    """ftype -> the Llama 3.1-shaped 256-wide case quantized by ``llama_model_quantize``."""
    folder = tmp_path_factory.mktemp("quantized")
    out = {}
    for ftype in ("Q8_0", "Q4_0", "Q4_K_M"):
        out[ftype] = folder / f"k256-{ftype}.gguf"
        lib.quantize(cc.DATA / "llama31_k256.gguf", out[ftype], ftype)
    return out


def _types(path: Path) -> set[str]:
    from rcn_fast.llm.backends.engine.ggml_types import type_name
    from rcn_fast.llm.backends.engine.gguf_file import GGUFFile

    return {type_name(t.ggml_type) for t in GGUFFile(path).tensors.values()}


def _dequantised(src: Path, dst: Path) -> Path:
    """``src`` rewritten with every tensor dequantised to F32 by gguf-py (not by code under test)."""
    from gguf import GGUFReader
    from gguf.quants import dequantize

    kvs, tensors = gb.read(src)
    r = GGUFReader(str(src))
    flat = {t.name: dequantize(t.data, t.tensor_type).astype(np.float32).reshape(-1) for t in r.tensors}
    new = [gb.Tensor(t.name, t.dims, 0, flat[t.name].tobytes()) for t in tensors]
    kvs = gb.edit(kvs, "general.file_type", gb.U32, 0)
    dst.write_bytes(gb.build(kvs, new))
    return dst


def test_the_quantizer_wrote_k_quants(quantized):
    assert {"Q4_K", "Q6_K"} <= _types(quantized["Q4_K_M"])
    assert "Q6_K" in _types(quantized["Q4_0"]) and "Q4_0" in _types(quantized["Q4_0"])  # token_embd: Q6_K
    assert _types(quantized["Q8_0"]) == {"Q8_0", "F32"}


def test_a_q8_0_file_scores_as_the_native_engine_within_its_activation_rounding(quantized):
    """llama.cpp multiplies Q8_0 weights against activations it rounds to
    8-bit blocks, the native engine against float32 ones: on the same file
    the label log-probs differ by that rounding (about 0.04 here, where the
    labels lie about 2 apart), and the best label is the same."""
    llama = load_llm(str(quantized["Q8_0"]), engine="llamacpp", num_threads=2)
    native = load_llm(str(quantized["Q8_0"]), engine="native", num_threads=2)
    got, want = llama.label_logprobs(MCQ, LABELS), native.label_logprobs(MCQ, LABELS)
    np.testing.assert_allclose(got, want, rtol=0, atol=0.1)
    assert got.argmax(1).tolist() == want.argmax(1).tolist()
    assert np.ptp(want, axis=1).min() > 1.0


@pytest.mark.parametrize("ftype", ["Q4_0", "Q4_K_M"])
def test_k_quant_files_score_as_float32_on_their_dequantised_weights(ftype, quantized, tmp_path):
    """A file the native engine does not run (Q6_K, Q4_K tensors) against
    float32 arithmetic on the very weights gguf-py dequantises from it.
    llama.cpp on the dequantised file agrees with that reference to float
    rounding; on the quantized file what is left is its rounding of
    activations, a fraction of what the quantisation of the weights moved
    (the distance to the original F32 weights): llama.cpp reads the K-quant
    blocks as gguf-py does."""
    deq = _dequantised(quantized[ftype], tmp_path / "f32.gguf")
    ref = load_llm(str(deq), engine="native", num_threads=2).label_logprobs(MCQ, LABELS)
    same = load_llm(str(deq), engine="llamacpp", num_threads=2).label_logprobs(MCQ, LABELS)
    np.testing.assert_allclose(same, ref, rtol=0, atol=1e-4)
    got = load_llm(str(quantized[ftype]), engine="llamacpp", num_threads=2).label_logprobs(MCQ, LABELS)
    original = load_llm(str(cc.DATA / "llama31_k256.gguf"), engine="native", num_threads=2).label_logprobs(MCQ, LABELS)
    moved = np.abs(ref - original).max()
    assert moved > 0.3  # 4-bit weights move the scores
    assert np.abs(got - ref).max() < min(0.2, 0.35 * moved), (np.abs(got - ref).max(), moved)
    assert got.argmax(1).tolist() == ref.argmax(1).tolist()


# ------------------------------------------------------------------ batches, sequences, prefix reuse


@pytest.fixture(scope="module")
def qwen():
    return cc.DATA / "qwen2.gguf"


def test_batched_rows_equal_each_row_alone(qwen):
    """Rows decoded together (one llama_decode per step, a sequence id per
    row) give each row's text alone: no row sees another's cells."""
    chats = [[{"role": "user", "content": f"Question {i}: " + _LONG[: 40 + 9 * i]}] for i in range(6)]
    batched = load_llm(str(qwen), engine="llamacpp", num_threads=2, batch_size=4, prefix_seqs=0)
    got = batched.generate(chats, max_new_tokens=10)
    alone = load_llm(str(qwen), engine="llamacpp", num_threads=2, batch_size=1, prefix_seqs=0)
    assert [r[0].text for r in got] == [alone.generate([c], max_new_tokens=10)[0][0].text for c in chats]
    assert batched.runner.forward_calls < alone.runner.forward_calls


def test_prefix_reuse_changes_no_result(qwen):
    """Shared prefixes are computed once and copied to each row's sequence
    (llama_memory_seq_cp); texts and scores equal those computed without."""
    shared = _LONG + "Now answer. "
    chats = [mcq_chat(shared + q) for q in ("A. fox B. dog", "A. cupboard B. table", "A. one B. two")]
    reuse = load_llm(str(qwen), engine="llamacpp", num_threads=2, min_prefix=8)
    fresh = load_llm(str(qwen), engine="llamacpp", num_threads=2, prefix_seqs=0)
    np.testing.assert_allclose(reuse.label_logprobs(chats, ["A", "B"]), fresh.label_logprobs(chats, ["A", "B"]),
                               rtol=0, atol=1e-5)
    n_shared = len(reuse.encode_chats(chats[:1])[0]) - 20
    assert reuse.runner.reused_tokens >= 2 * n_shared  # the shared part ran once
    assert reuse.runner.forward_tokens < fresh.runner.forward_tokens
    again = reuse.runner.forward_tokens
    assert [r[0].text for r in reuse.generate(chats, max_new_tokens=6)] == \
        [r[0].text for r in fresh.generate(chats, max_new_tokens=6)]
    assert reuse.runner.forward_tokens - again < sum(len(x) for x in reuse.encode_chats(chats))  # kept from the scoring


def test_seeded_samples_are_those_drawn_one_by_one(qwen):
    llm = load_llm(str(qwen), engine="llamacpp", num_threads=2)
    kw = dict(max_new_tokens=6, temperature=1.0, seed=7)
    together = llm.generate(CHATS, num_samples=3, **kw)
    for i, chat in enumerate(CHATS):
        for s in range(3):
            assert llm.generate_samples([chat], [[s]], **kw)[0][0].text == together[i][s].text
    assert len({g.text for g in together[0]}) > 1


def test_a_small_context_serves_many_rows_and_refuses_a_prompt_it_cannot_hold(qwen):
    from rcn_fast.llm.backends.llamacpp.runner import ContextFullError

    chats = [[{"role": "user", "content": f"Row {i}. " + _LONG}] for i in range(5)]
    n = len(load_llm(str(qwen), engine="llamacpp", num_threads=2).encode_chats(chats[:1])[0])
    small = load_llm(str(qwen), engine="llamacpp", num_threads=2, n_ctx=2 * n + 40)  # two rows at a time
    roomy = load_llm(str(qwen), engine="llamacpp", num_threads=2)
    assert [r[0].text for r in small.generate(chats, max_new_tokens=8)] == \
        [r[0].text for r in roomy.generate(chats, max_new_tokens=8)]
    tiny = load_llm(str(qwen), engine="llamacpp", num_threads=2, n_ctx=n // 2)
    with pytest.raises(ContextFullError, match="raise n_ctx"):
        tiny.generate(chats[:1], max_new_tokens=4)


# ------------------------------------------------------------------ the doors


def test_nan_logits_are_errors_not_answers(tmp_path):
    from rcn_fast.llm.backends.logits import NonFiniteLogitsError
    from rcn_fast.llm.scoring.labels import LabelScoreError

    kvs, tensors = gb.read(cc.DATA / "llama_default.gguf")
    t = next(x for x in tensors if x.name == "output_norm.weight")
    tensors = gb.retensor(tensors, "output_norm.weight", data=np.full(len(t.data) // 4, np.nan, np.float32).tobytes())
    path = tmp_path / "nan.gguf"
    path.write_bytes(gb.build(kvs, tensors))
    llm = load_llm(str(path), engine="llamacpp", num_threads=1)
    with pytest.raises(LabelScoreError, match="NaN"):
        llm.label_logprobs(MCQ, LABELS)
    with pytest.raises(NonFiniteLogitsError, match="NaN or inf"):
        llm.generate(CHATS[:1], max_new_tokens=3)


def test_identity_names_the_file_digest_and_the_settings(tmp_path):
    path = tmp_path / "m.gguf"
    shutil.copy(cc.DATA / "llama_default.gguf", path)
    a = load_llm(str(path), engine="llamacpp", num_threads=1)
    assert a.identity.startswith(f"llamacpp:{path}:{lib.version()}:")
    assert load_llm(str(path), engine="llamacpp", num_threads=2).identity == a.identity  # threads: the same sums
    assert load_llm(str(path), engine="llamacpp", kv_type="f16").identity != a.identity
    assert load_llm(str(path), engine="native").identity != a.identity
    other = tmp_path / "other.gguf"
    shutil.copy(cc.DATA / "qwen2.gguf", other)
    assert LlamaCppLLM(other, name=str(path)).identity.rsplit(":", 1)[1] != a.identity.rsplit(":", 1)[1]


def test_the_call_cache_keys_on_the_identity(tmp_path):
    llm = load_llm(str(cc.DATA / "llama_default.gguf"), engine="llamacpp", num_threads=1, cache=tmp_path / "c")
    first = llm.label_logprobs(MCQ, LABELS)
    again = llm.label_logprobs(MCQ, LABELS)
    np.testing.assert_array_equal(first, again)
    assert llm.cost.total.cached_calls == len(MCQ)
    assert llm.identity.startswith("llamacpp:")


def test_the_chat_template_is_rendered_by_rcn_fasts_door(monkeypatch):
    """The file's template goes through rcn_fast._templates (budgets,
    sandbox), never through llama.cpp's or llama-cpp-python's Jinja."""
    import rcn_fast._templates as templates

    seen = []
    real = templates.render_chat_template
    monkeypatch.setattr(templates, "render_chat_template", lambda t, m, **kw: seen.append(t) or real(t, m, **kw))
    llm = load_llm(str(cc.DATA / "qwen2.gguf"), engine="llamacpp", num_threads=1)
    llm.encode_chats(CHATS)
    assert seen and all(t == llm.tokenizer.chat_template for t in seen)


def test_a_closed_model_is_an_error_not_a_crash():
    llm = load_llm(str(cc.DATA / "qwen2.gguf"), engine="llamacpp", num_threads=1)
    llm.close()
    with pytest.raises(RuntimeError, match="was closed"):
        llm.generate(CHATS[:1], max_new_tokens=2)
    with pytest.raises(RuntimeError, match="was closed"):
        llm.tokenizer.encode("hi")


def test_a_missing_llama_cpp_python_is_an_install_hint(monkeypatch):
    import sys

    monkeypatch.setattr(lib, "_lib", None)
    monkeypatch.setitem(sys.modules, "llama_cpp", None)
    with pytest.raises(ImportError, match=r"pip install 'rcn_fast\[llamacpp\]'"):
        load_llm(str(cc.DATA / "qwen2.gguf"), engine="llamacpp")


def test_served_by_rcn_fast_serve_streams_and_reports_logprobs(qwen):
    """The llama.cpp backend behind ``python -m rcn_fast.serve`` (what
    ``--engine auto`` picks for the 1B+ files): every generated token is
    reported as it is chosen, with the log-softmax of the step's logits
    before ``logit_bias`` -- the streamed text equals the whole greedy
    answer, and each token's log-prob equals llama.cpp's own log-prob of
    it after the same prefix (its prompt path, within llama.cpp's
    batch-size rounding)."""
    openai = pytest.importorskip("openai")
    from rcn_fast.llm.base import GenerationParams
    from tests.llm.test_serve_engine import serve

    llm = load_llm(str(qwen), engine="llamacpp", num_threads=2)
    ids = llm.encode_chats([[{"role": "user", "content": "Name a colour."}]])[0]
    got: list[tuple] = []
    out = llm.generate_ids([ids], GenerationParams(max_new_tokens=8), logprobs=3,
                           on_token=lambda p, s, t, lp, top: got.append((p, s, t, lp, top)))[0][0]
    toks = [g[2] for g in got]
    assert [g[:2] for g in got] == [(0, 0)] * len(got) and len(toks) == out.generated_tokens
    ref = llm.prompt_logprobs_ids([ids + toks], 3, chunk=64, check=lambda: None)[0][len(ids):]
    for (_, _, t, lp, top), (want_lp, want_top) in zip(got, ref):
        assert lp == pytest.approx(want_lp, abs=1e-3) and len(top) == 3 and top[0][1] >= top[-1][1]
        assert [i for i, _ in top] == [i for i, _ in want_top]
    # no log-probs asked: the tokens still reported, with None and []
    plain: list[tuple] = []
    llm.generate_ids([ids], GenerationParams(max_new_tokens=8), on_token=lambda *a: plain.append(a))
    assert [a[2] for a in plain] == toks and all(a[3] is None and a[4] == [] for a in plain)

    chat = [{"role": "user", "content": "Name a colour."}]
    with serve(llm, "q") as srv:
        client = openai.OpenAI(base_url=srv.base_url, api_key="unused", max_retries=0, timeout=300)
        whole = client.chat.completions.create(model="q", messages=chat, max_tokens=8, temperature=0, logprobs=True,
                                               top_logprobs=2)
        streamed = client.chat.completions.create(model="q", messages=chat, max_tokens=8, temperature=0,
                                                  stream=True)
        text = "".join(c.choices[0].delta.content or "" for c in streamed if c.choices)
        assert text == whole.choices[0].message.content
        content = whole.choices[0].logprobs.content
        # a prefix computed again in another batch: llama.cpp's numbers move by ~1e-6 (not batch invariant)
        assert [c.logprob for c in content] == pytest.approx([g[3] for g in got][:len(content)], abs=1e-4)
        comp = client.completions.create(model="q", prompt=ids, max_tokens=6, temperature=0, logprobs=2)
        assert len(comp.choices[0].logprobs.token_logprobs) == comp.usage.completion_tokens
