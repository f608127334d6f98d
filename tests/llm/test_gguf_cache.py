"""The converted-weights cache of GGUF models on transformers (issue 27.10;
engine="transformers": the native engine reads GGUF files in place): the second load
of a .gguf reads the cache (the GGUF reader is not called) and gives the
same logits, tokens and chat rendering; a damaged, extended or stale entry
is rebuilt; nothing but data files is ever read from it."""

from __future__ import annotations

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("gguf")

from llm_helpers import mcq_chat, write_llama_gguf  # noqa: E402

from rcn_fast.llm import load  # noqa: E402
from rcn_fast.llm.backends import gguf_cache  # noqa: E402
from rcn_fast.llm import load_llm  # noqa: E402

CHATS = [mcq_chat(q) for q in ("Where would you put a plate? A. cupboard B. floor", "What is 2 + 2? A. 4 B. 5")]


@pytest.fixture
def gguf_file(tiny_llm, tmp_path):
    path = tmp_path / "tiny.gguf"
    write_llama_gguf(tiny_llm.model, tiny_llm.tokenizer, path)
    return path


@pytest.fixture
def cache(tmp_path, monkeypatch):
    root = tmp_path / "cache"
    monkeypatch.setenv("RCN_FAST_CACHE", str(root))
    monkeypatch.delenv(gguf_cache.ENV, raising=False)
    return root


@pytest.fixture
def conversions(monkeypatch):
    """Counts the calls of the GGUF reader (transformers' dequantisation)."""
    calls = []
    real = load._load_gguf

    def counting(path, cfg):
        calls.append((str(path), cfg.dtype, cfg.device))
        return real(path, cfg)

    monkeypatch.setattr(load, "_load_gguf", counting)
    return calls


def _logits(llm) -> np.ndarray:
    return llm.final_logits(llm.encode_chats(CHATS)).float().numpy()


def test_second_load_reads_the_cache_and_gives_identical_logits(gguf_file, cache, conversions):
    first = load_llm(str(gguf_file), engine="transformers", device="cpu")
    assert len(conversions) == 1 and conversions[0][1:] == ("float32", "cpu")
    entries = list((cache / "gguf").iterdir())
    assert [e.name for e in entries] == [gguf_cache_sha(gguf_file)]
    manifest = json.loads((entries[0] / gguf_cache.MANIFEST).read_text())
    assert manifest["format"] == gguf_cache.CACHE_FORMAT and "model.safetensors" in manifest["files"]
    assert all(n.endswith((".safetensors", ".json", ".txt", ".jinja", ".model")) for n in manifest["files"])

    second = load_llm(str(gguf_file), engine="transformers", device="cpu")
    assert len(conversions) == 1, "the second load converted the GGUF again"
    assert second.identity == first.identity
    assert second.render(CHATS) == first.render(CHATS)
    assert second.encode_chats(CHATS) == first.encode_chats(CHATS)
    np.testing.assert_array_equal(_logits(second), _logits(first))
    assert [g[0].text for g in second.generate(CHATS, max_new_tokens=4)] == \
        [g[0].text for g in first.generate(CHATS, max_new_tokens=4)]


def test_cache_keeps_float32_whatever_dtype_is_asked(gguf_file, cache, conversions):
    half = load_llm(str(gguf_file), engine="transformers", device="cpu", dtype="bfloat16")
    assert half.model.dtype == torch.bfloat16 and conversions[0][1] == "float32"
    full = load_llm(str(gguf_file), engine="transformers", device="cpu")
    assert len(conversions) == 1 and full.model.dtype == torch.float32
    from safetensors import safe_open

    entry = next((cache / "gguf").iterdir())
    with safe_open(str(entry / "model.safetensors"), "pt") as f:
        assert {f.get_tensor(k).dtype for k in f.keys()} == {torch.float32}


def _entry(cache):
    return next((cache / "gguf").iterdir())


@pytest.mark.parametrize("damage", ["weights-bytes", "weights-truncated", "manifest-json", "manifest-missing",
                                    "extra-pickle", "file-missing", "other-transformers"])
def test_damaged_or_stale_entry_is_rebuilt(gguf_file, cache, conversions, damage, caplog):
    first = load_llm(str(gguf_file), engine="transformers", device="cpu")
    entry = _entry(cache)
    weights = entry / "model.safetensors"
    if damage == "weights-bytes":
        data = bytearray(weights.read_bytes())
        data[-5] ^= 0xFF  # same size, other bytes
        weights.write_bytes(bytes(data))
    elif damage == "weights-truncated":
        weights.write_bytes(weights.read_bytes()[:-64])
    elif damage == "manifest-json":
        (entry / gguf_cache.MANIFEST).write_text("{not json")
    elif damage == "manifest-missing":
        (entry / gguf_cache.MANIFEST).unlink()
    elif damage == "extra-pickle":
        (entry / "pytorch_model.bin").write_bytes(b"\x80\x04K\x01.")
    elif damage == "file-missing":
        (entry / "tokenizer.json").unlink()
    elif damage == "other-transformers":
        meta = json.loads((entry / gguf_cache.MANIFEST).read_text())
        meta["transformers"] = "0.0.1"
        (entry / gguf_cache.MANIFEST).write_text(json.dumps(meta))
    with caplog.at_level("WARNING", logger="rcn_fast.llm.backends.gguf_cache"):
        again = load_llm(str(gguf_file), engine="transformers", device="cpu")
    assert len(conversions) == 2, "a damaged entry was used instead of converting again"
    assert "stale or damaged" in caplog.text
    np.testing.assert_array_equal(_logits(again), _logits(first))
    gguf_cache.verify_entry(_entry(cache), gguf_cache_sha(gguf_file))  # the rebuilt entry is whole
    assert not (_entry(cache) / "pytorch_model.bin").exists()
    load_llm(str(gguf_file), engine="transformers", device="cpu")
    assert len(conversions) == 2


def gguf_cache_sha(path) -> str:
    from rcn_fast.model_files import file_fingerprint

    return str(file_fingerprint(path)["sha256"])


def test_a_changed_gguf_gets_its_own_entry(gguf_file, cache, conversions, tiny_llm, tmp_path):
    load_llm(str(gguf_file), engine="transformers", device="cpu")
    with torch.no_grad():
        model = type(tiny_llm.model)(tiny_llm.model.config)
        model.load_state_dict(tiny_llm.model.state_dict())
        model.lm_head.weight.mul_(-1.0)
    write_llama_gguf(model, tiny_llm.tokenizer, gguf_file)  # same path, other weights
    changed = load_llm(str(gguf_file), engine="transformers", device="cpu")
    assert len(conversions) == 2 and len(list((cache / "gguf").iterdir())) == 2
    ref = load_llm((model.eval(), tiny_llm.tokenizer), device="cpu")
    np.testing.assert_allclose(_logits(changed), _logits(ref), rtol=1e-5, atol=1e-5)


def test_cache_off_and_unwritable_cache_still_load(gguf_file, cache, conversions, monkeypatch, caplog):
    monkeypatch.setenv(gguf_cache.ENV, "0")
    load_llm(str(gguf_file), engine="transformers", device="cpu")
    load_llm(str(gguf_file), engine="transformers", device="cpu")
    assert len(conversions) == 2 and not (cache / "gguf").exists()
    monkeypatch.delenv(gguf_cache.ENV)
    cache.mkdir()
    (cache / "gguf").write_text("a file where the cache folder should be")
    with caplog.at_level("WARNING", logger="rcn_fast.llm.backends.gguf_cache"):
        llm = load_llm(str(gguf_file), engine="transformers", device="cpu")
    assert len(conversions) == 3 and "not cached" in caplog.text and llm.label_logprobs(CHATS, ["A", "B"]).shape == (2, 2)


def test_load_tokenizer_reads_the_cached_tokenizer(gguf_file, cache, conversions, monkeypatch):
    from rcn_fast.llm.tokenizer import load_tokenizer

    llm = load_llm(str(gguf_file), engine="transformers", device="cpu")
    import transformers

    real = transformers.AutoTokenizer.from_pretrained
    seen = []

    def spy(*a, **kw):
        seen.append(kw.get("gguf_file"))
        return real(*a, **kw)

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", spy)
    tok = load_tokenizer(str(gguf_file))
    assert seen == [], "the tokenizer was not read from the cache (AutoTokenizer read the GGUF or picked a class)"
    assert type(tok) is transformers.PreTrainedTokenizerFast
    assert tok("hello world")["input_ids"] == llm.tokenizer("hello world")["input_ids"]
