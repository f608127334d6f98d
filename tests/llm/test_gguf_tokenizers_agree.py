"""One GGUF file, one tokenizer (issue 47): transformers' first load of a
``.gguf`` (the converted-weights cache empty), its later loads (read from
the cache), a load with the cache off, the native engine and llama.cpp's
own tokenizer give the same ids for the same text.

The fault this pins: a Qwen2 GGUF read fresh by transformers split text
as its ``tokenizer.ggml.pre`` says (GPT-2's regex when the file names none),
but the copy saved in the cache reloaded as ``Qwen2Tokenizer``, which
rebuilds Qwen2's regex and NFC normalisation; the native engine picked
Qwen2's regex by architecture to match that copy. So on a fresh machine
the engine and transformers disagreed ("What is 2 + 2?": `` 2`` against
`` `` + ``2``) and on a warm one they agreed, and a decomposed accent was
NFC-composed by the cached copy alone."""

from __future__ import annotations

import importlib.util

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("gguf")

from llm_helpers import build_tokenizer, mcq_chat, write_tiny_gguf  # noqa: E402

from rcn_fast.llm import load, load_llm  # noqa: E402
from rcn_fast.llm.backends import gguf_cache  # noqa: E402

TEXTS = [
    "What is 2 + 2? A. 4 B. 5 C. 22",  # digits: GPT-2 keeps " 2" whole, Qwen2 splits every digit
    "It's 12345 o'clock, DON'T you 'LL",  # contractions: Qwen2 matches them in any case
    "cafe\u0301 caf\u00e9 \u4f60\u597d \U0001f600",  # a decomposed accent: NFC would compose it
    "a  \n\n  b\t\tc   ",  # whitespace runs
    "Hello world!!! ... (x+y)^2 <= z|w",  # punctuation runs
    "<|im_start|>user\nhi<|im_end|>\n",  # special tokens written in the text are matched whole
]
QUESTION = "Where would you put a plate after washing it? A. cupboard B. table C. floor D. oven E. car"


@pytest.fixture(scope="module", params=[("qwen2", "gpt-2"), ("qwen2", "qwen2"), ("qwen2", None),
                                        ("llama", "gpt-2"), ("llama", "qwen2"), ("llama", None)],
                ids=lambda p: f"{p[0]}-{p[1] or 'no-pre'}")
def gguf_file(request, tmp_path_factory):
    arch, pre = request.param
    return write_tiny_gguf(tmp_path_factory.mktemp(f"gguf-{arch}-{pre}"), arch, pre=pre), pre


@pytest.fixture
def loads(gguf_file, tmp_path, monkeypatch):
    """``{name: tokenizer}``: transformers cold, warm and with the cache off
    (the GGUF reader is counted: cold and off convert, warm does not), and
    the native engine's."""
    path, _ = gguf_file
    monkeypatch.setenv("RCN_FAST_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv(gguf_cache.ENV, raising=False)
    conversions = []
    real = load._load_gguf

    def counting(p, cfg):
        conversions.append(p)
        return real(p, cfg)

    monkeypatch.setattr(load, "_load_gguf", counting)
    cold = load_llm(str(path), engine="transformers", device="cpu")
    warm = load_llm(str(path), engine="transformers", device="cpu")
    assert len(conversions) == 1, "the second load did not read the cache"
    native = load_llm(str(path), engine="native", batch_size=2, num_threads=1)
    monkeypatch.setenv(gguf_cache.ENV, "0")
    off = load_llm(str(path), engine="transformers", device="cpu")
    assert len(conversions) == 2
    return {"transformers cold": cold, "transformers warm": warm, "transformers cache off": off, "native": native}


def _ids(llm, text: str) -> list[int]:
    return list(llm.tokenizer.encode(text, add_special_tokens=False))


def test_first_and_later_loads_and_the_engine_give_the_same_ids(loads):
    ref = loads["transformers cold"]
    for text in TEXTS:
        want = _ids(ref, text)
        for name, llm in loads.items():
            assert _ids(llm, text) == want, f"{name} tokenizes {text!r} otherwise than transformers' first load"
    chats = [mcq_chat(QUESTION), mcq_chat(TEXTS[0]), mcq_chat(TEXTS[2])]
    want = ref.encode_chats(chats)
    for name, llm in loads.items():
        assert llm.encode_chats(chats) == want, name


def test_the_same_ids_as_llama_cpp_on_the_same_file(gguf_file, loads):
    """llama.cpp is the reference of a GGUF's tokenizer. A file without
    ``tokenizer.ggml.pre`` is the one case left out: llama.cpp reads it
    with its own "default" split and warns that generation quality will be
    degraded (transformers and the engine use GPT-2's split there)."""
    if importlib.util.find_spec("llama_cpp") is None:
        pytest.skip("llama-cpp-python is not installed (pip install 'rcn_fast[server-test]')")
    path, pre = gguf_file
    if pre is None:
        pytest.skip("no tokenizer.ggml.pre: llama.cpp uses its degraded 'default' split (see the docstring)")
    import llama_cpp

    ref = llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)
    try:
        for text in TEXTS:
            want = ref.tokenize(text.encode("utf-8"), add_bos=False, special=True)
            for name, llm in loads.items():
                assert _ids(llm, text) == want, f"{name} tokenizes {text!r} otherwise than llama.cpp"
    finally:
        ref.close()


def test_a_tokenizer_that_loads_back_different_is_not_cached(gguf_file, tmp_path, monkeypatch, caplog):
    """The cache keeps a tokenizer only after reading it back and finding it
    the same: one that reads back different (here: given another
    pre-tokenizer, as Qwen2Tokenizer's rebuild did) is used as converted
    and not kept, and the next load converts again."""
    import tokenizers

    path, _ = gguf_file
    monkeypatch.setenv("RCN_FAST_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv(gguf_cache.ENV, raising=False)
    real = gguf_cache.read_tokenizer

    def reads_back_different(folder):
        tok = real(folder)
        tok.backend_tokenizer.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
        return tok

    monkeypatch.setattr(gguf_cache, "read_tokenizer", reads_back_different)
    with caplog.at_level("WARNING", logger="rcn_fast.llm.backends.gguf_cache"):
        llm = load_llm(str(path), engine="transformers", device="cpu")
    assert "does not load back the same" in caplog.text and "not cached" in caplog.text
    assert not any((tmp_path / "cache" / "gguf").iterdir()), "an entry was kept"
    monkeypatch.setattr(gguf_cache, "read_tokenizer", real)
    again = load_llm(str(path), engine="transformers", device="cpu")
    assert _ids(llm, TEXTS[0]) == _ids(again, TEXTS[0])
    assert len(list((tmp_path / "cache" / "gguf").iterdir())) == 1


def test_tokenizer_difference_names_what_differs():
    a, b = build_tokenizer(), build_tokenizer()
    assert gguf_cache.tokenizer_difference(a, b) is None
    import tokenizers

    b.backend_tokenizer.normalizer = tokenizers.normalizers.NFC()
    assert "pipelines differ" in gguf_cache.tokenizer_difference(a, b)
    c = build_tokenizer(template="{{ messages }}")
    assert "chat_template" in gguf_cache.tokenizer_difference(a, c)
