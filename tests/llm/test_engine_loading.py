"""Loading the native engine: which engine ``load_llm`` picks and the
option checks, the GGUF reader's errors, models it refuses, the tokenizer
cache (written once, read after, rebuilt when damaged or stale), loading
and generating without importing transformers; and the prefix cache's
bookkeeping."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

pytest.importorskip("gguf")
pytest.importorskip("tokenizers")

from llm_helpers import build_model, build_tokenizer, mcq_chat, write_gguf  # noqa: E402

from rcn_fast.llm import load_llm  # noqa: E402
from rcn_fast.llm.backends.engine import GGUFLLM, UnsupportedModel  # noqa: E402
from rcn_fast.llm.backends.engine import tokenizer as toklib  # noqa: E402
from rcn_fast.llm.backends.engine.gguf_file import GGUFError, GGUFFile  # noqa: E402
from rcn_fast.llm.backends.engine.prefix_cache import PrefixCache, shared_prefixes  # noqa: E402


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
    pytest.importorskip("torch")
    tok = build_tokenizer()
    model = build_model("llama", len(tok), tok.eos_token_id, tok.pad_token_id)
    path = tmp_path_factory.mktemp("gguf") / "tiny.gguf"
    write_gguf(model, tok, path)
    return path


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("RCN_FAST_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("RCN_FAST_GGUF_CACHE", raising=False)
    return tmp_path / "cache" / "gguf-tokenizers"


def test_engine_choice_and_option_checks(tiny_gguf, tiny_llama_dir, cache):
    from rcn_fast.llm.backends.hf import HFLLM

    assert isinstance(load_llm(str(tiny_gguf)), GGUFLLM)
    assert isinstance(load_llm(str(tiny_gguf), device="cpu", num_threads=1, prefix_cache_mb=0), GGUFLLM)
    assert isinstance(load_llm(str(tiny_gguf), engine="transformers"), HFLLM)
    assert isinstance(load_llm(str(tiny_gguf), dtype="bfloat16"), HFLLM)  # not float32: transformers
    with pytest.raises(ValueError, match="dtype"):
        load_llm(str(tiny_gguf), engine="native", dtype="bfloat16")
    with pytest.raises(ValueError, match="engine"):
        load_llm(str(tiny_gguf), engine="llama.cpp")
    with pytest.raises(ValueError, match="num_threads"):
        load_llm(str(tiny_gguf), num_threads=-1)
    with pytest.raises(ValueError, match="batch_size"):
        load_llm(str(tiny_gguf), batch_size=0)
    with pytest.raises(ValueError, match="'native' runs .gguf files only"):
        load_llm(str(tiny_llama_dir), engine="native")
    with pytest.raises(TypeError, match="apply to the native engine only"):
        load_llm(str(tiny_llama_dir), prefix_cache_mb=10)
    with pytest.raises(TypeError, match="apply to the native and llamacpp engines only"):  # not dropped in silence
        load_llm(str(tiny_gguf), engine="transformers", num_threads=2)
    with pytest.raises(TypeError, match=r"\['isa'\] apply to the native engine only"):
        load_llm(str(tiny_gguf), engine="llamacpp", isa="avx2")
    with pytest.raises(TypeError, match=r"\['kv_type'\] apply to the llamacpp engine only"):
        load_llm(str(tiny_gguf), engine="native", kv_type="f16")
    with pytest.raises(ValueError, match="'llamacpp' runs .gguf files only"):
        load_llm(str(tiny_llama_dir), engine="llamacpp")
    with pytest.raises(TypeError, match="unknown option"):
        load_llm(str(tiny_gguf), threads=2)
    # llama.cpp's 8-bit arithmetic: a native-engine option, so auto tries the native engine only
    q8 = load_llm(str(tiny_gguf), activations="q8")
    assert isinstance(q8, GGUFLLM) and q8.config.activations == "q8" and ":q8:" in q8.identity
    assert ":q8:" not in load_llm(str(tiny_gguf)).identity
    with pytest.raises(ValueError, match="activations"):
        load_llm(str(tiny_gguf), activations="int4")
    with pytest.raises(TypeError, match=r"\['activations'\] apply to the native engine only"):
        load_llm(str(tiny_gguf), engine="llamacpp", activations="q8")


def test_gguf_reader_refuses_what_is_not_gguf(tiny_gguf, tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"NOPE" + bytes(60))
    with pytest.raises(GGUFError, match="magic"):
        GGUFFile(bad)
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(tiny_gguf.read_bytes()[: tiny_gguf.stat().st_size // 2])
    with pytest.raises(GGUFError, match="truncated|past the end"):
        GGUFFile(cut)
    g = GGUFFile(tiny_gguf)
    assert g.meta("general.architecture", "str") == "llama" and "blk.0.attn_q.weight" in g.tensors
    assert g.float32("output_norm.weight").dtype == np.float32


def test_models_the_engine_does_not_run_name_a_backend_that_does(tmp_path):
    import gguf

    path = tmp_path / "other.gguf"
    w = gguf.GGUFWriter(str(path), "phi3")
    w.add_tensor("token_embd.weight", np.zeros((4, 32), np.float32))
    w.add_tokenizer_model("gpt2")
    w.add_token_list(["a", "b", "ab", "</s>"])
    w.add_token_merges(["a b"])
    w.add_eos_token_id(3)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(UnsupportedModel, match="architecture 'phi3'") as err:
        load_llm(str(path), engine="native")
    assert " runs it" in str(err.value) or " run it" in str(err.value) or "no installed backend runs it (" in \
        str(err.value)


@pytest.mark.parametrize("change", ["sentencepiece", "no merges"])
def test_a_vocabulary_the_engine_cannot_build_is_refused_at_load(change, tmp_path, cache, monkeypatch):
    """Refused when the model is made (not on the tokenizer's background
    thread at first use): a vocabulary the engine does not build
    (SentencePiece) is UnsupportedModel, where engine="auto" goes on to the
    next backend; a byte-level BPE one without merges is malformed
    (GGUFError, llama.cpp refuses it too), refused by every engine, "auto"
    included (issue 53, B7: it fell back to transformers and scored
    0.000)."""
    pytest.importorskip("torch")
    import gguf

    from rcn_fast.llm import load as load_mod

    with monkeypatch.context() as mp:
        if change == "sentencepiece":
            real = gguf.GGUFWriter.add_tokenizer_model
            mp.setattr(gguf.GGUFWriter, "add_tokenizer_model", lambda self, model: real(self, "llama"))
        else:
            mp.setattr(gguf.GGUFWriter, "add_token_merges", lambda self, merges: None)
        tok = build_tokenizer()
        path = tmp_path / "other-vocab.gguf"
        write_gguf(build_model("llama", len(tok), tok.eos_token_id, tok.pad_token_id), tok, path)
    if change == "no merges":
        for engine in ("native", "auto", "llamacpp", "transformers"):
            with pytest.raises(GGUFError, match="without merges"):
                load_llm(str(path), engine=engine)
        return
    with pytest.raises(UnsupportedModel, match="tokenizer.ggml.model 'llama'"):
        toklib.GGUFTokenizer(GGUFFile(path))
    with pytest.raises(UnsupportedModel, match="the native engine does not run it; ") as err:
        load_llm(str(path), engine="native")
    order, _, _ = load_mod.gguf_order(path)
    assert order[0] == "native"  # auto probes it first, then goes on (not refused as malformed)
    assert "engine='" in str(err.value) or "no installed backend runs it" in str(err.value)


def test_one_prompts_samples_prefill_it_once(tiny_gguf, cache):
    """The samples of one prompt share all of it but its last token: it is
    prefilled once, not once per sample; the samples stay those drawn
    without the prefix cache."""
    llm = load_llm(str(tiny_gguf), num_threads=1)
    chat = [{"role": "user", "content": "Please read the following question carefully and answer it. " * 3}]
    n = len(llm.encode_chats([chat])[0])
    assert n > 40
    kw = dict(max_new_tokens=2, temperature=1.0, num_samples=4, seed=5)
    got = llm.generate([chat], **kw)
    assert llm.runner.forward_tokens <= n + 4 * 2  # the prompt once, then per sample its last token and one step
    assert llm.eos_ids is llm.eos_ids  # computed once
    llm.prefix_cache.max_bytes = 0
    assert llm.generate([chat], **kw) == got
    assert llm.runner.forward_tokens >= n + 4 * n  # without the cache each sample prefills the prompt


def test_tokenizer_cache_is_written_once_then_read(tiny_gguf, cache, monkeypatch, caplog):
    builds = []
    real = toklib.build_backend
    monkeypatch.setattr(toklib, "build_backend", lambda g: builds.append(1) or real(g))
    chats = [mcq_chat("What is 2 + 2? A. 4 B. 5")]
    first = load_llm(str(tiny_gguf)).encode_chats(chats)
    entries = list(cache.iterdir())
    assert len(builds) == 1 and len(entries) == 1
    meta = json.loads((entries[0] / "manifest.json").read_text())
    assert meta["format"] == toklib.CACHE_FORMAT and meta["build"] == toklib.BUILD_VERSION
    assert load_llm(str(tiny_gguf)).encode_chats(chats) == first and len(builds) == 1  # read, not built
    (entries[0] / "tokenizer.json").write_text('{"damaged": true}')
    with caplog.at_level("WARNING"):
        assert load_llm(str(tiny_gguf)).encode_chats(chats) == first
    assert len(builds) == 2 and "rebuilding" in caplog.text
    meta = json.loads((entries[0] / "manifest.json").read_text())
    meta["build"] = -1
    (entries[0] / "manifest.json").write_text(json.dumps(meta))
    assert load_llm(str(tiny_gguf)).encode_chats(chats) == first and len(builds) == 3  # stale builder: rebuilt
    monkeypatch.setenv("RCN_FAST_GGUF_CACHE", "0")
    assert load_llm(str(tiny_gguf)).encode_chats(chats) == first and len(builds) == 4


def test_loads_and_generates_without_transformers(tiny_gguf, tmp_path):
    code = textwrap.dedent(f"""
        import sys
        from rcn_fast.llm import load_llm
        llm = load_llm({str(tiny_gguf)!r})
        out = llm.generate([[{{"role": "user", "content": "What is 2 + 2?"}}]], max_new_tokens=4)
        assert out[0][0].generated_tokens >= 1
        print("transformers" in sys.modules)
    """)
    env = dict(os.environ, RCN_FAST_CACHE=str(tmp_path / "cache"))
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "False"


def _kv(n: int, d: int = 4) -> tuple[np.ndarray, np.ndarray]:
    return np.zeros((2, n, d), np.float32), np.ones((2, n, d), np.float32)


def test_prefix_cache_lookup_and_lru_by_bytes():
    one = _kv(1)[0].nbytes * 2  # bytes of one cached token
    pc = PrefixCache(10 * one)
    assert pc.store([1, 2, 3], *_kv(3)) and pc.store([1, 2, 3, 4, 5], *_kv(5))
    e, n = pc.lookup([1, 2, 3, 4, 5, 6], 5)
    assert e.tokens == (1, 2, 3, 4, 5) and n == 5
    assert pc.lookup([1, 2, 3, 4, 9], 9)[1] == 4  # the longest common prefix, part of an entry
    assert pc.lookup([1, 2, 3, 4, 5], 2)[1] == 2  # at most max_len tokens
    assert pc.lookup([1, 2, 9], 2, min_len=3) is None and pc.lookup([8], 5) is None and pc.nbytes == 8 * one
    assert pc.lookup([1, 2, 3], 3)[0].tokens == (1, 2, 3, 4, 5)  # a tie goes to the most recently used
    assert pc.store([7, 8, 9], *_kv(3))  # 11 tokens > 10: the least recent, (1, 2, 3), goes
    assert (1, 2, 3) not in pc and (1, 2, 3, 4, 5) in pc and pc.nbytes == 8 * one and pc.stats.evicted == 1
    assert pc.store([1, 2, 3], *_kv(3))  # 11 again: now (1..5) is the least recent
    assert (1, 2, 3, 4, 5) not in pc and pc.nbytes == 6 * one and pc.stats.evicted == 2
    assert not pc.store(list(range(11)), *_kv(11))  # alone over the budget: not stored
    # a speculative entry goes first and never pushes out the others
    assert pc.store([4, 4, 4, 4], *_kv(4), speculative=True) and pc.nbytes == 10 * one
    assert not pc.store([5, 5], *_kv(2), speculative=True)  # would need to evict a kept entry: it goes itself
    assert (1, 2, 3) in pc and (7, 8, 9) in pc and (4, 4, 4, 4) in pc
    pc.lookup([4, 4, 4, 4, 1], 4)  # used: promoted
    assert pc.store([6], *_kv(1))
    assert (7, 8, 9) not in pc and (1, 2, 3) in pc and (4, 4, 4, 4) in pc
    with pytest.raises(ValueError, match="k, v"):
        pc.store([1], *_kv(2))
    with pytest.raises(ValueError, match="max_bytes"):
        PrefixCache(-1)


def test_shared_prefixes_are_the_longest_common_prefixes_with_neighbours():
    instr = list(range(100, 140))
    prompts = [instr + [1, 2, 3, 4], instr + [1, 2, 5], instr + [9], [7] * 50, instr]
    got = shared_prefixes(prompts, min_len=8)
    # instr + [1, 2] is shared by the first two; instr by those and the 3rd/5th (the 5th keeps a token to run)
    assert got == [tuple(instr[:-1]), tuple(instr), tuple(instr + [1, 2])]
    assert shared_prefixes(prompts, min_len=45) == []
    assert shared_prefixes([[1, 2, 3]], min_len=1) == []
