"""The GGUF file as the engine reads it, anchored outside the project:

* the GGML type table (one table for C++ and Python) equals gguf-py's
  GGML_QUANT_SIZES;
* every path to a ``.gguf`` goes through the strict reader (a walk of the
  package finds none around it);
* a real model written by llama.cpp's converter, rewritten with one fault
  (sizes, tensors, vocabulary, rope), is refused at load with one error
  naming the file: GGUFError for a self-contradicting file (no fallback),
  UnsupportedModel for what the engine does not run (``engine="auto"``
  goes to transformers) -- and the transformers path refuses what its GGUF
  reader would run wrong or allocate without bound;
* the eval exits 2 at load on a broken vocabulary (not 3 after failing
  every question).
"""

from __future__ import annotations

import ast
import json
import os
from pathlib import Path

import pytest

import gguf_bytes as gb

from rcn_fast.llm.backends.engine import GGUFError, UnsupportedModel, ggml_types
from rcn_fast.llm.backends.engine.architecture import check_for_transformers
from rcn_fast.llm.backends.engine.gguf_file import GGUFFile

DATA = Path(__file__).resolve().parent / "data" / "converter"
PKG = Path(__file__).resolve().parents[2] / "rcn_fast"


def test_the_type_table_is_gguf_pys():
    gguf = pytest.importorskip("gguf")
    ours = ggml_types.table()
    theirs = {int(t): sizes for t, sizes in gguf.GGML_QUANT_SIZES.items()}
    common = set(ours) & set(theirs)
    assert len(common) >= 30 and set(theirs) <= set(ours) | {t for t in theirs if t > 42}
    for t in common - {9}:
        assert (ours[t].block, ours[t].block_bytes) == theirs[t], ours[t]
    # Q8_1: ggml's block_q8_1 is two halves and 32 quants (static_assert in ggml-common.h, and gguf-py 0.19+'s
    # vendored copy says 2 + 2 + 32); older gguf-py releases wrote 4 + 4 + 32
    assert (ours[9].block, ours[9].block_bytes) == (32, 36) and theirs[9] in ((32, 36), (32, 40))
    for t in common:
        assert ours[t].name == gguf.GGMLQuantizationType(t).name
    assert ggml_types.matmul_types() == {"F32": 0, "F16": 1, "Q4_0": 2, "Q4_1": 3, "Q8_0": 8, "Q4_K": 12, "Q5_K": 13,
                                         "Q6_K": 14}
    assert ggml_types.tensor_nbytes((3, 64), 8) == 3 * 2 * 34 and ggml_types.type_name(99) == "type 99"
    with pytest.raises(ValueError, match="64-bit"):
        ggml_types.tensor_nbytes((2**40, 2**40), 0)


def _calls(tree: ast.AST) -> list[ast.Call]:
    return [n for n in ast.walk(tree) if isinstance(n, ast.Call)]


def _name(call: ast.Call) -> str:
    f = call.func
    return f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""


def test_every_way_to_a_gguf_file_goes_through_the_strict_reader():
    """Walk rcn_fast: a function that hands a ``.gguf`` to another reader
    (transformers' ``gguf_file=``, ``load_gguf_checkpoint``, gguf-py's
    ``GGUFReader``) or converts one (``load_gguf_cached``) also calls the
    guard (``check_for_transformers`` or ``GGUFFile``); no module but the
    reader unpacks GGUF bytes or reaches into its parsed metadata."""
    doors = {"check_for_transformers", "GGUFFile"}
    found = []
    for path in PKG.rglob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for fn in [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]:
            calls = _calls(fn)
            hands_over = [c for c in calls if _name(c) in ("load_gguf_checkpoint", "GGUFReader", "load_gguf_cached")
                          or any(k.arg == "gguf_file" for k in c.keywords)]
            if hands_over:
                found.append(f"{path.name}:{fn.name}")
                assert doors & {_name(c) for c in calls}, f"{path}:{fn.name} reads a .gguf without the guard"
        if path.name != "gguf_file.py":
            text = path.read_text(encoding="utf-8")
            assert "._values" not in text and "._types[" not in text, f"{path} reaches into GGUFFile's metadata"
    assert {"load.py:_make", "load.py:_load_gguf", "tokenizer.py:load_tokenizer"} <= set(found), found


# ---------------------------------------------------------------- a real file, one fault at a time


@pytest.fixture(scope="module")
def real():
    pytest.importorskip("gguf")
    return gb.read(DATA / "llama_default.gguf")


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("RCN_FAST_CACHE", str(tmp_path / "cache"))


def _write(tmp_path: Path, kvs: list, tensors: list, name: str = "faulty.gguf") -> Path:
    path = tmp_path / name
    path.write_bytes(gb.build(kvs, tensors))
    return path


def _toks(kvs: list) -> list[str]:
    return next(kv.value for kv in kvs if kv.key == "tokenizer.ggml.tokens")


# case id -> (change of (kvs, tensors), error class, what the message says)
FAULTS = {
    "block-count-1e9": (lambda k, t: (gb.edit(k, "llama.block_count", gb.U32, 10**9), t), GGUFError,
                        "llama.block_count is 1000000000 but the file holds tensors of 2 blocks"),
    "head-count-0": (lambda k, t: (gb.edit(k, "llama.attention.head_count", gb.U32, 0), t), GGUFError,
                     "llama.attention.head_count is 0"),
    "head-count-kv-above-heads": (lambda k, t: (gb.edit(k, "llama.attention.head_count_kv", gb.U32, 3), t), GGUFError,
                                  "head_count_kv is 3, expected 1..2"),
    "head-counts-differ-per-block": (lambda k, t: (gb.edit(k, "llama.attention.head_count", gb.ARRAY, [2, 1], gb.U32),
                                                   t), UnsupportedModel, "differs between blocks"),
    "vocab-size-2**58": (lambda k, t: (gb.edit(k, "llama.vocab_size", gb.U64, 2**58), t), GGUFError,
                         "llama.vocab_size is 288230376151711744"),
    "embedding-length-wrong": (lambda k, t: (gb.edit(k, "llama.embedding_length", gb.U32, 48), t), GGUFError,
                               "llama.embedding_length is 48 but token_embd.weight has shape (300, 32)"),
    "eps-a-string": (lambda k, t: (gb.edit(k, "llama.attention.layer_norm_rms_epsilon", gb.STRING, "1e-5"), t),
                     GGUFError, "layer_norm_rms_epsilon must be float, the file holds string"),
    "eps-nan": (lambda k, t: (gb.edit(k, "llama.attention.layer_norm_rms_epsilon", gb.F32, float("nan")), t),
                GGUFError, "expected a finite number"),
    "no-architecture": (lambda k, t: (gb.edit(k, "general.architecture", drop=True), t), GGUFError,
                        "general.architecture is missing"),
    "context-length-a-float": (lambda k, t: (gb.edit(k, "llama.context_length", gb.F32, 256.0), t), GGUFError,
                               "context_length must be int"),
    "tensor-missing": (lambda k, t: (k, [x for x in t if x.name != "blk.1.ffn_up.weight"]), GGUFError,
                       "tensor 'blk.1.ffn_up.weight' is missing"),
    "tensor-wrong-shape": (lambda k, t: (k, gb.retensor(t, "blk.0.attn_norm.weight", dims=[16],
                                                         data=bytes(64))), GGUFError,
                           "'blk.0.attn_norm.weight' has shape (16,), expected (32,)"),
    "tensor-unused": (lambda k, t: (k, t + [gb.Tensor("blk.0.attn_output.bias", [32], 0, bytes(128))]),
                      UnsupportedModel, "'blk.0.attn_output.bias'"),
    "tensor-unknown": (lambda k, t: (k, t + [gb.Tensor("mystery.weight", [4], 0, bytes(16))]), UnsupportedModel,
                       "does not use: 'mystery.weight'"),
    "tensor-type-not-multiplied": (lambda k, t: (k, gb.retensor(t, "blk.0.ffn_up.weight", gtype=24,
                                                                 data=bytes(48 * 32))), UnsupportedModel,
                                   "'blk.0.ffn_up.weight' is I8"),
    "rope-freqs-wrong-shape": (lambda k, t: (k, t + [gb.Tensor("rope_freqs.weight", [3], 0, bytes(12))]), GGUFError,
                               "'rope_freqs.weight' has shape (3,), expected (8,)"),
    "rope-yarn": (lambda k, t: (gb.edit(gb.edit(k, "llama.rope.scaling.type", gb.STRING, "yarn"),
                                        "llama.rope.scaling.factor", gb.F32, 4.0), t), UnsupportedModel,
                  "rope scaling type 'yarn'"),
    "rope-unknown-type": (lambda k, t: (gb.edit(k, "llama.rope.scaling.type", gb.STRING, "fancy"), t),
                          UnsupportedModel, "rope scaling type 'fancy' (llama.cpp writes none, linear, yarn, longrope)"),
    "rope-attn-factor": (lambda k, t: (gb.edit(k, "llama.rope.scaling.attn_factor", gb.F32, 2.0), t),
                         UnsupportedModel, "attn_factor 2.0"),
    "no-tokens": (lambda k, t: (gb.edit(k, "tokenizer.ggml.tokens", drop=True), t), GGUFError,
                  "holds no tokenizer (tokenizer.ggml.tokens is missing)"),
    "empty-tokens-no-vocab-size": (lambda k, t: (gb.edit(gb.edit(gb.edit(k, "llama.vocab_size", drop=True),
                                                                 "tokenizer.ggml.token_type", drop=True),
                                                         "tokenizer.ggml.tokens", gb.ARRAY, [], gb.STRING), t),
                                   GGUFError, "holds no tokenizer (tokenizer.ggml.tokens is empty)"),
    "eos-a-string": (lambda k, t: (gb.edit(k, "tokenizer.ggml.eos_token_id", gb.STRING, "2"), t), GGUFError,
                     "tokenizer.ggml.eos_token_id must be int, the file holds string"),
    "bos-out-of-range": (lambda k, t: (gb.edit(k, "tokenizer.ggml.bos_token_id", gb.U32, 300), t), GGUFError,
                         "bos_token_id is 300, outside the vocabulary of 300 tokens"),
    "token-types-short": (lambda k, t: (gb.edit(k, "tokenizer.ggml.token_type", gb.ARRAY, [1] * 10, gb.I32), t),
                          GGUFError, "token_type has 10 entries for 300 tokens"),
    "merges-empty": (lambda k, t: (gb.edit(k, "tokenizer.ggml.merges", gb.ARRAY, [], gb.STRING), t), GGUFError,
                     "a byte-level BPE vocabulary without merges (tokenizer.ggml.merges is empty)"),
    "merges-missing": (lambda k, t: (gb.edit(k, "tokenizer.ggml.merges", drop=True), t), GGUFError,
                       "tokenizer.ggml.merges is missing"),
    "merge-repeated": (lambda k, t: (gb.edit(k, "tokenizer.ggml.merges", gb.ARRAY, ["e r", "o n", "e r"], gb.STRING),
                                     t), GGUFError, "merges[2] 'e r' repeats merges[0]"),
    "merges-more-than-tokens-form": (lambda k, t: (gb.edit(k, "tokenizer.ggml.merges", gb.ARRAY, ["e r"] * 5000,
                                                           gb.STRING), t), GGUFError,
                                     "tokenizer.ggml.merges has 5000 entries, more than the"),
    "no-eos": (lambda k, t: (gb.edit(k, "tokenizer.ggml.eos_token_id", drop=True), t), GGUFError,
               "tokenizer.ggml.eos_token_id is missing"),
    "merge-not-a-pair": (lambda k, t: (gb.edit(k, "tokenizer.ggml.merges", gb.ARRAY, ["e r", "o n x"], gb.STRING), t),
                         GGUFError, "merges[1] 'o n x' is not two tokens joined by one space"),
    "merge-unknown-token": (lambda k, t: (gb.edit(k, "tokenizer.ggml.merges", gb.ARRAY, ["e r", "zq zq"], gb.STRING),
                                          t), GGUFError, "merges[1] 'zq zq': 'zq' is not a token"),
    "sentencepiece": (lambda k, t: (gb.edit(k, "tokenizer.ggml.model", gb.STRING, "llama"), t), UnsupportedModel,
                      "tokenizer.ggml.model 'llama'"),
}


@pytest.mark.parametrize("case", list(FAULTS))
def test_a_faulty_model_is_refused_at_load_naming_the_file(case, real, tmp_path, cache):
    from rcn_fast.llm import load_llm
    from rcn_fast.llm.load import gguf_order

    change, cls, message = FAULTS[case]
    path = _write(tmp_path, *change(*real))
    GGUFFile(path)  # the format is fine: the fault is in what the file says
    with pytest.raises(cls) as err:
        load_llm(str(path), engine="native")
    assert str(path) in str(err.value) and message in str(err.value), str(err.value)
    if cls is UnsupportedModel:  # the refusal names a backend that runs the file, or says none installed does
        assert "the native engine does not run it; " in str(err.value)
        assert " runs it" in str(err.value) or " run it" in str(err.value) or "no installed backend" in str(err.value)
        assert gguf_order(path)[0][0] == "native"  # well-formed: engine="auto" probes the backends in order
    else:  # a self-contradicting file: "auto" refuses it too, before any backend sees it
        with pytest.raises(GGUFError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
            load_llm(str(path), engine="auto")


def test_the_unmodified_file_loads(real, tmp_path, cache):
    from rcn_fast.llm import load_llm

    path = _write(tmp_path, *real, name="same.gguf")
    llm = load_llm(str(path), engine="native", num_threads=1)
    assert llm.model.hp.n_layer == 2 and not llm.model.tied and llm.model.rope_freqs is None


@pytest.mark.parametrize("case,message", [
    ("block-count-1e9", "block_count is 1000000000 but the file holds tensors of 2 blocks"),
    ("rope-freqs", "rope_freqs.weight (Llama 3.1/3.2 rope scaling), which transformers' GGUF reader ignores"),
    ("rope-linear", "rope scaling 'linear' (factor 2.0"),
    ("rope-scale-linear-old-key", "rope scaling 'linear' (factor 3.0"),
])
def test_the_transformers_path_refuses_what_its_reader_would_get_wrong(case, message, real, tmp_path, monkeypatch):
    """Before transformers allocates anything (a block count of 10**9 grew it
    past GBs) or runs a rope its GGUF reader drops (the default rope,
    silently), the guard refuses the file; the tokenizer path (client-side
    chat rendering) reads such files."""
    from rcn_fast.llm import load_llm

    kvs, tensors = real
    if case == "block-count-1e9":
        kvs = gb.edit(kvs, "llama.block_count", gb.U32, 10**9)
    elif case == "rope-freqs":
        tensors = tensors + [gb.Tensor("rope_freqs.weight", [8], 0, bytes(32))]
    elif case == "rope-linear":
        kvs = gb.edit(gb.edit(kvs, "llama.rope.scaling.type", gb.STRING, "linear"), "llama.rope.scaling.factor",
                      gb.F32, 2.0)
    else:
        kvs = gb.edit(kvs, "llama.rope.scale_linear", gb.F32, 3.0)
    path = _write(tmp_path, kvs, tensors)
    monkeypatch.setenv("RCN_FAST_CACHE", str(tmp_path / "cache"))
    with pytest.raises(GGUFError, match="cannot run on transformers") as err:
        check_for_transformers(path)
    assert message in str(err.value) and str(path) in str(err.value)
    # a file whose sizes contradict its tensors is refused before any backend (malformed); one transformers would
    # run wrong is refused by transformers, naming the backends that run it
    with pytest.raises(GGUFError, match="block_count is 1000000000" if case == "block-count-1e9" else
                       "cannot run on transformers.*(engine='native'|no installed backend runs it)"):
        load_llm(str(path), engine="transformers", device="cpu")
    assert not (tmp_path / "cache" / "gguf").exists()  # nothing converted
    if case != "block-count-1e9":
        from rcn_fast.llm.tokenizer import load_tokenizer

        pytest.importorskip("transformers")
        assert load_tokenizer(str(path)).encode("Answer: A")


def test_a_broken_vocabulary_fails_the_eval_at_load_with_status_2(real, tmp_path, capsys, monkeypatch):
    """Found at load (exit 2, one message naming the file), not at the first
    generate of every question (exit 3)."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from rcn_fast.eval.cli import main

    kvs, tensors = real
    path = _write(tmp_path, gb.edit(kvs, "tokenizer.ggml.merges", gb.ARRAY, ["e r", "zq zq"], gb.STRING), tensors)
    q = tmp_path / "q.jsonl"
    q.write_text("".join(json.dumps({"id": f"q{i}", "question": {"stem": f"Which is true {i}?", "choices": [
        {"label": lab, "text": f"option {lab}"} for lab in "ABCD"]}, "answerKey": "A"}) + "\n" for i in range(3)))
    monkeypatch.setenv("RCN_FAST_CACHE", str(tmp_path / "cache"))
    rc = main(["--tasks", str(q), "--pipelines", "vanilla", "--model", str(path), "--output-path",
               str(tmp_path / "out"), "--no-progress", "--no-plot", "--device", "cpu"])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert "'zq' is not a token" in err and str(path) in err and "Traceback" not in err


def test_a_model_file_changed_under_a_running_engine_is_refused(tmp_path, cache):
    """The identity of the mapped file (size, mtime, inode) is checked before
    every forward pass: a file rewritten in place (zeroed: the old identity
    would have answered ',,,,') or replaced is an error naming it."""
    import shutil

    from rcn_fast.llm import load_llm

    path = tmp_path / "m.gguf"
    shutil.copy(DATA / "llama_default.gguf", path)
    llm = load_llm(str(path), engine="native", num_threads=1)
    chat = [[{"role": "user", "content": "Answer: A"}]]
    first = llm.generate(chat, max_new_tokens=3)
    assert llm.generate(chat, max_new_tokens=3) == first
    with open(path, "r+b") as f:  # zeroed in place, same size
        f.seek(llm.gguf.tensors["blk.0.ffn_up.weight"].offset)
        f.write(bytes(256))
    st = os.stat(path)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # a coarse-clock file system: the write is seen
    with pytest.raises(GGUFError, match="changed on disk since it was loaded") as err:
        llm.generate(chat, max_new_tokens=3)
    assert str(path) in str(err.value) and "mtime_ns" in str(err.value)
    with pytest.raises(GGUFError, match="changed on disk"):
        llm.label_logprobs([chat[0] + [{"role": "assistant", "content": "Answer: "}]], ["A", "B"])
    with pytest.raises(GGUFError, match="changed on disk"):
        llm.identity  # noqa: B018 -- no digest of other bytes under the loaded model's name
    replaced = tmp_path / "m2.gguf"
    shutil.copy(DATA / "llama_default.gguf", replaced)
    llm2 = load_llm(str(replaced), engine="native", num_threads=1)
    os.replace(path, replaced)  # another file renamed over it: a new inode
    with pytest.raises(GGUFError, match="inode"):
        llm2.generate(chat, max_new_tokens=3)
