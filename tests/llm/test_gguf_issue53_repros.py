"""Issue 53 item 4, the engine's file checks, repro by repro (each failed
on fca19ce): N10 (one duplicated merge loaded silently and changed
answers; 10**7 duplicates cost ~3 GB; 8,000,000 empty nested metadata
arrays parsed eagerly to 1.5 GB), B7 (``engine="auto"`` passed a file the
native layer refused as malformed on to transformers), B5 (a file
rewritten in place with its mtime put back kept its old identity), B6 (a
file without an end-of-sequence id failed with a raw TypeError at the
first ``generate``).

The two large files are opened in a child process whose peak memory is
read back: the refusals come from counts, before anything is built.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import gguf_bytes as gb

from rcn_fast.llm.backends.engine import GGUFError
from rcn_fast.llm.backends.engine.gguf_file import MAX_NESTED_ARRAYS, GGUFFile

DATA = Path(__file__).resolve().parent / "data" / "converter"
CHAT = [[{"role": "user", "content": "Answer: A"}]]
_PROC = pytest.mark.skipif(not Path("/proc/self/status").is_file(), reason="reads the peak memory from /proc")


@pytest.fixture(scope="module")
def real():
    pytest.importorskip("gguf")
    return gb.read(DATA / "llama_default.gguf")


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("RCN_FAST_CACHE", str(tmp_path / "cache"))


def _merges(kvs: list) -> list[str]:
    return next(kv.value for kv in kvs if kv.key == "tokenizer.ggml.merges")


def _engines() -> list[str]:
    from rcn_fast.llm.backends.llamacpp import installed

    return ["native", "auto"] + (["llamacpp"] if installed() else [])


def _open_in_child(call: str) -> tuple[str, float]:
    """``call`` (an expression that opens a file) in a child Python:
    ("REFUSED <message>" or "LOADED", the child's peak RSS in MiB)."""
    script = textwrap.dedent(f"""
        from rcn_fast.llm.backends.engine.gguf_file import GGUFError, GGUFFile
        from rcn_fast.llm.backends.probe import check_file
        try:
            {call}
            print("LOADED")
        except GGUFError as exc:
            print("REFUSED " + str(exc))
        # VmHWM: this program's peak (ru_maxrss would keep the forking parent's across exec)
        with open("/proc/self/status") as f:
            print(next(int(ln.split()[1]) for ln in f if ln.startswith("VmHWM:")) / 1024)
    """)
    root = str(Path(__file__).resolve().parents[2])
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600,
                         env={**os.environ, "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])})
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.strip().splitlines()
    return lines[-2], float(lines[-1])


# ------------------------------------------------------------------ N10


@pytest.mark.parametrize("engine", ["native", "auto", "llamacpp"])
def test_n10_one_duplicated_merge_is_refused(engine, real, tmp_path, cache):
    """+13 bytes (one merge listed twice) changed obqa-40 accuracy 0.200 ->
    0.225 in silence: tokenizers ranks a repeated merge by its second place,
    llama.cpp by its first. Every engine refuses it, naming both places."""
    from rcn_fast.llm import load_llm

    if engine == "llamacpp":
        pytest.importorskip("llama_cpp")
    kvs, tensors = real
    merges = _merges(kvs)
    path = tmp_path / "dup1.gguf"
    path.write_bytes(gb.build(gb.edit(kvs, "tokenizer.ggml.merges", gb.ARRAY, merges + [merges[3]], gb.STRING),
                              tensors))
    assert path.stat().st_size - (DATA / "llama_default.gguf").stat().st_size <= 32
    with pytest.raises(GGUFError, match=rf"merges\[{len(merges)}\] '{merges[3]}' repeats merges\[3\]") as err:
        load_llm(str(path), engine=engine)
    assert str(path) in str(err.value)


def test_n10_a_tokenizer_cached_before_the_check_does_not_let_the_file_in(real, tmp_path, cache, monkeypatch):
    """The GGUF tokenizer cache is keyed by the file's header: an entry that
    an older build made from a file with a repeated merge (build 3 did not
    check) is rebuilt, and so checked, not read."""
    from rcn_fast.llm import load_llm
    from rcn_fast.llm.backends.engine import tokenizer as toklib

    kvs, tensors = real
    merges = _merges(kvs)
    path = tmp_path / "dup1.gguf"
    path.write_bytes(gb.build(gb.edit(kvs, "tokenizer.ggml.merges", gb.ARRAY, merges + [merges[3]], gb.STRING),
                              tensors))
    with monkeypatch.context() as mp:  # the build of before: no check, version 3
        mp.setattr(toklib, "check_merges", lambda g: g.meta("tokenizer.ggml.merges", "str[]"))
        mp.setattr(toklib, "BUILD_VERSION", 3)
        load_llm(str(path), engine="native")
    assert any((tmp_path / "cache" / "gguf-tokenizers").iterdir())
    with pytest.raises(GGUFError, match=r"repeats merges\[3\]"):
        load_llm(str(path), engine="native")


@_PROC
def test_n10_ten_million_duplicate_merges_are_refused_by_count(real, tmp_path):
    """10**7 duplicates loaded at 2.94 GB: now refused from the array's
    length (more merges than the vocabulary's tokens can form distinct
    ones), before one merge is parsed."""
    kvs, tensors = real
    blob = gb.build(gb.edit(kvs, "tokenizer.ggml.merges", gb.ARRAY, ["e r"], gb.STRING), tensors)
    one = gb.string("e r")
    at = blob.index(struct.pack("<IQ", gb.STRING, 1) + one)
    n = 10**7 + 1  # (n - 1) * 11 bytes added: a multiple of the 32-byte alignment, the tensors stay in place
    path = tmp_path / "dup1e7.gguf"
    path.write_bytes(blob[:at] + struct.pack("<IQ", gb.STRING, n) + one * n + blob[at + 12 + len(one):])
    assert path.stat().st_size > 110_000_000
    line, peak = _open_in_child(f"check_file({str(path)!r})")
    assert line.startswith("REFUSED") and f"tokenizer.ggml.merges has {n} entries, more than the" in line, line
    assert peak < 300, f"{peak:.0f} MiB to refuse it"


@_PROC
def test_n10_eight_million_empty_nested_arrays_are_refused_before_they_are_built(tmp_path):
    """8,000,000 empty arrays inside one array (96 MB) parsed eagerly to
    1.52 GB; now counted against the file's budget of nested arrays first."""
    n = 8_000_000
    payload = struct.pack("<IQ", gb.ARRAY, n) + struct.pack("<IQ", gb.U8, 0) * n
    path = tmp_path / "nested.gguf"
    path.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + gb.string("junk") + struct.pack("<I", gb.ARRAY) + payload)
    line, peak = _open_in_child(f"GGUFFile({str(path)!r})")
    assert line.startswith("REFUSED") and f"an array of {n} arrays" in line, line
    assert peak < 300, f"{peak:.0f} MiB to refuse it"


def test_nested_arrays_are_budgeted_across_the_file(tmp_path):
    """The budget counts every array inside an array, in all entries: many
    small nested entries are refused as one large one is, and the budget's
    worth still loads."""
    def entry(key: str, count: int) -> bytes:
        return gb.string(key) + struct.pack("<IIQ", gb.ARRAY, gb.ARRAY, count) + struct.pack("<IQ", gb.U8, 0) * count

    half = MAX_NESTED_ARRAYS // 2
    path = tmp_path / "ok.gguf"
    path.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 0, 2) + entry("a", half) + entry("b", half))
    assert GGUFFile(path).value_type("a") == "array of array"
    path.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 0, 3) + entry("a", half) + entry("b", half) + entry("c", 1))
    with pytest.raises(GGUFError, match=rf"metadata 'c' holds arrays of arrays beyond the {MAX_NESTED_ARRAYS}"):
        GGUFFile(path)


# ------------------------------------------------------------------ B7


def test_b7_auto_never_passes_a_malformed_file_on(real, tmp_path, cache, monkeypatch, capsys):
    """Empty merges: the native layer refused the file as malformed and
    ``engine="auto"`` ran it on transformers (acc 0.000, 434 tokens/q, no
    warning). Now a malformed file is refused by every engine, auto
    included, before any backend is tried; the eval exits 2 naming it."""
    from rcn_fast.llm import load_llm
    from rcn_fast.llm import load as load_mod

    kvs, tensors = real
    path = tmp_path / "empty-merges.gguf"
    path.write_bytes(gb.build(gb.edit(kvs, "tokenizer.ggml.merges", gb.ARRAY, [], gb.STRING), tensors))
    tried = []
    monkeypatch.setattr(load_mod, "_make", lambda backend, *a, **k: tried.append(backend))
    for engine in ("auto", "native", "llamacpp", "transformers"):
        with pytest.raises(GGUFError, match="without merges"):
            load_llm(str(path), engine=engine)
    assert tried == []  # no backend was handed the file
    monkeypatch.undo()
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from rcn_fast.eval.cli import main

    q = tmp_path / "q.jsonl"
    q.write_text("".join(json.dumps({"id": f"q{i}", "question": {"stem": f"Which is true {i}?", "choices": [
        {"label": lab, "text": f"option {lab}"} for lab in "ABCD"]}, "answerKey": "A"}) + "\n" for i in range(3)))
    monkeypatch.setenv("RCN_FAST_CACHE", str(tmp_path / "cache"))
    rc = main(["--tasks", str(q), "--pipelines", "vanilla", "--model", str(path), "--output-path",
               str(tmp_path / "out"), "--no-progress", "--no-plot", "--device", "cpu"])
    err = capsys.readouterr().err
    assert rc == 2 and "without merges" in err and str(path) in err, err


# ------------------------------------------------------------------ B5


@pytest.mark.parametrize("engine", ["native", "llamacpp"])
def test_b5_a_file_rewritten_in_place_with_its_mtime_put_back_is_refused(engine, tmp_path, cache):
    """Same size, same mtime (put back with utime), same inode: the ctime
    (which no user can set back) is part of the file identity now, so the
    next forward pass refuses the file instead of answering ',,,,,,' under
    the old identity."""
    from rcn_fast.llm import load_llm

    if engine == "llamacpp":
        pytest.importorskip("llama_cpp")
    path = tmp_path / "m.gguf"
    shutil.copy(DATA / "llama_default.gguf", path)
    llm = load_llm(str(path), engine=engine, num_threads=1)
    first = llm.generate(CHAT, max_new_tokens=3)
    before = os.stat(path)
    time.sleep(0.05)  # past the file system's coarse clock tick
    with open(path, "r+b") as f:  # zeroed in place, same size
        f.seek(llm.gguf.tensors["blk.0.ffn_up.weight"].offset)
        f.write(bytes(256))
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = os.stat(path)
    assert (after.st_size, after.st_mtime_ns, after.st_ino) == (before.st_size, before.st_mtime_ns, before.st_ino)
    with pytest.raises(GGUFError, match="changed on disk since it was loaded .*ctime_ns") as err:
        llm.generate(CHAT, max_new_tokens=3)
    assert str(path) in str(err.value) and first


# ------------------------------------------------------------------ B6


@pytest.mark.parametrize("engine", ["native", "auto", "llamacpp", "transformers"])
def test_b6_a_file_without_an_eos_id_is_a_named_error_at_load(engine, real, tmp_path, cache):
    """No ``tokenizer.ggml.eos_token_id`` (and no pad id): a raw TypeError
    at the first ``generate`` before; now a GGUFError at load naming the
    key, whatever the engine."""
    from rcn_fast.llm import load_llm

    if engine == "llamacpp":
        pytest.importorskip("llama_cpp")
    kvs, tensors = real
    for key in ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.padding_token_id"):
        kvs = gb.edit(kvs, key, drop=True)
    path = tmp_path / "no-eos.gguf"
    path.write_bytes(gb.build(kvs, tensors))
    with pytest.raises(GGUFError, match="tokenizer.ggml.eos_token_id is missing") as err:
        load_llm(str(path), engine=engine)
    assert str(path) in str(err.value)
