"""The GGUF reader's refusals, case by case, in the manner of llama.cpp's
tests/test-gguf.cpp (handcrafted files: a bad header, bad metadata, bad
tensor infos, bad data; and the files that must load): every malformed file
is one GGUFError that names the file and the fault, never another error, a
crash or a huge allocation. Then the model-level faults of a real tiny model
(sizes, tensors, vocabulary) refused at load, before the first question.
"""

from __future__ import annotations

import struct

import numpy as np
import pytest

import gguf_bytes as gb
from gguf_bytes import KV, Layout, Tensor

from rcn_fast.llm.backends.engine.gguf_file import MAX_NESTING, GGUFError, GGUFFile


def _f32(n: int, seed: int = 0) -> bytes:
    return np.random.default_rng(seed).standard_normal(n).astype(np.float32).tobytes()


def _q8(rows: int) -> bytes:  # Q8_0 blocks of 32 elements: f16 scale + 32 int8
    return b"".join(struct.pack("<e", 0.5) + bytes(range(32)) for _ in range(rows))


KVS = [KV("general.architecture", gb.STRING, "test"), KV("test.count", gb.U32, 7),
       KV("test.ratio", gb.F32, 0.5), KV("test.flag", gb.BOOL, True), KV("test.big", gb.I64, -(2**40)),
       KV("test.names", gb.ARRAY, ["a", "bb", ""], gb.STRING), KV("test.ints", gb.ARRAY, list(range(100)), gb.I32)]
TENSORS = [Tensor("a", [4], 0, _f32(4)), Tensor("b", [32, 3], 8, _q8(3)), Tensor("c", [5, 2], 0, _f32(10, 1))]


def _nested(depth: int) -> bytes:
    """A file whose one metadata entry is ``depth`` arrays, each holding the next (the last one byte)."""
    payload = struct.pack("<IQ", gb.ARRAY, 1) * (depth - 1) + struct.pack("<IQ", gb.U8, 1) + b"\x01"
    return b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + gb.string("nested") + struct.pack("<I", gb.ARRAY) + payload


def _blob(**layout) -> bytes:
    return gb.build(KVS, TENSORS, Layout(**layout))


def _header(n_tensors: int, n_kv: int) -> bytes:
    return b"GGUF" + struct.pack("<IQQ", 3, n_tensors, n_kv)


def _entry(key: str | bytes, vtype: int, payload: bytes) -> bytes:
    return gb.string(key) + struct.pack("<I", vtype) + payload


def _strings(items: list[bytes]) -> bytes:
    return b"".join(struct.pack("<Q", n) + b"x" * min(n, 1) for n in items)


# (case id, file bytes, what the message says)
BAD = [
    # the header
    ("header-bad-magic", _blob(magic=b"FUGG"), "not a GGUF file"),
    ("header-version-0", _blob(version=0), "version 0"),
    ("header-version-1", _blob(version=1), "v1 is no longer read"),
    ("header-version-future", _blob(version=4), "version 4"),
    ("header-other-byte-order", _blob(version=3 << 24), "other byte order"),
    ("header-n-tensors-huge", _blob(n_tensors=-1), "tensor count -1"),
    ("header-n-tensors-too-many", _blob(n_tensors=10**6), "tensor count 1000000 is impossible"),
    ("header-n-kv-huge", _blob(n_kv=-1), "metadata count -1"),
    ("header-too-short", b"GGUF\x03\x00", "too short"),
    ("header-cut-in-counts", b"GGUF" + struct.pack("<IQ", 3, 0) + b"\x00\x00", "metadata count"),
    # the metadata
    ("kv-key-size-huge", _header(0, 1) + struct.pack("<Q", 2**64 - 1) + b"k" + bytes(32), "metadata key 0"),
    ("kv-empty-key", _header(0, 1) + _entry("", gb.U8, b"\x01"), "metadata key 0 is empty"),
    ("kv-key-not-utf8", _header(0, 1) + _entry(b"\xff\xfe", gb.U8, b"\x01"), "metadata key 0 is not UTF-8"),
    ("kv-bad-type", _header(0, 1) + _entry("k", 13, b"\x01" + bytes(16)), "'k' has unknown value type 13"),
    ("kv-duplicate-key", gb.build([KV("k", gb.U8, 1), KV("k", gb.U8, 2)], []), "'k' appears twice"),
    ("kv-string-past-end", _header(0, 1) + _entry("k", gb.STRING, struct.pack("<Q", 1000) + b"abc"), "1000 bytes"),
    ("kv-array-count-huge", _header(0, 1) + _entry("k", gb.ARRAY, struct.pack("<IQ", gb.U32, 2**60) + bytes(8)),
     "an array of 1152921504606846976 elements cannot fit"),
    ("kv-array-bad-element-type", _header(0, 1) + _entry("k", gb.ARRAY, struct.pack("<IQ", 99, 1) + b"\x01"),
     "array of unknown value type 99"),
    ("kv-array-string-past-end", _header(0, 1) + _entry("k", gb.ARRAY, struct.pack("<IQ", gb.STRING, 100) + _strings(
        [1] * 50 + [10**9] + [1] * 49)), "string 50 of 100 runs past the end"),
    ("kv-nested-too-deep", _nested(5000), f"more than {MAX_NESTING} deep"),
    ("kv-alignment-not-power-of-2", gb.build([KV("general.alignment", gb.U32, 13)], TENSORS), "not a power of two"),
    ("kv-alignment-zero", gb.build([KV("general.alignment", gb.U32, 0)], TENSORS), "not a power of two"),
    ("kv-alignment-wrong-type", gb.build([KV("general.alignment", gb.I32, 32)], TENSORS), "must be a uint32"),
    # the tensor infos
    ("tensors-name-too-long", gb.build([], [Tensor("t" * 64, [4], 0, _f32(4))]), "at most 63"),
    ("tensors-duplicate-name", gb.build([], [Tensor("a", [4], 0, _f32(4)), Tensor("a", [4], 0, _f32(4))]),
     "'a' appears twice"),
    ("tensors-five-dims", gb.build([], [Tensor("a", [1, 1, 1, 1, 4], 0, _f32(4))]), "5 dimensions"),
    ("tensors-negative-dim", gb.build([], [Tensor("a", [-1], 0, _f32(4))]), "negative dimension"),
    ("tensors-elements-overflow", gb.build([], [Tensor("a", [576, 2**62 + 1], 0, _f32(4))]), "64-bit"),
    ("tensors-nbytes-overflow", gb.build([], [Tensor("a", [2**31, 2**31], 27, _f32(4))]), "64-bit"),
    ("tensors-unknown-type", gb.build([], [Tensor("a", [4], 43, _f32(4))]), "unknown GGML type 43"),
    ("tensors-retired-type", gb.build([], [Tensor("a", [32], 4, bytes(20))]), "unknown GGML type 4"),
    ("tensors-row-not-whole-blocks", gb.build([], [Tensor("a", [33], 8, _q8(2))]), "not whole Q8_0 blocks"),
    ("tensors-offset-huge", gb.build([], [Tensor("a", [4], 0, _f32(4), offset=-1)]), "expected 0"),
    ("tensors-offset-gap", gb.build([], [Tensor("a", [4], 0, _f32(4)), Tensor("b", [4], 0, _f32(4), offset=64)]),
     "'b' is at offset 64 of the data section, expected 32"),
    ("tensors-overlap", gb.build([], [Tensor("a", [16], 0, _f32(16)), Tensor("b", [4], 0, _f32(4), offset=32)]),
     "'b' is at offset 32 of the data section, expected 64"),
    ("tensors-inconsistent-alignment", gb.build([], TENSORS, Layout(alignment=1)), "expected"),
    ("tensors-unaligned-custom", gb.build([KV("general.alignment", gb.U32, 64)], TENSORS), "expected"),
    # the data
    ("data-one-byte-short", _blob(data_slack=-1), "runs past the end of the file"),
    ("data-missing", _blob(data_slack=-200), "tensor 'a' (16 bytes at byte"),
]


@pytest.mark.parametrize("case,blob,message", BAD, ids=[c[0] for c in BAD])
def test_a_malformed_file_is_one_error_naming_it(case, blob, message, tmp_path):
    path = tmp_path / f"{case}.gguf"
    path.write_bytes(blob)
    with pytest.raises(GGUFError) as err:
        GGUFFile(path)
    assert str(path) in str(err.value)
    assert message in str(err.value), str(err.value)


def test_the_suite_has_thirty_cases_at_least():
    assert len(BAD) >= 30 and len({c[0] for c in BAD}) == len(BAD)


@pytest.mark.parametrize("layout", [Layout(), Layout(alignment=1), Layout(data_slack=100)],
                         ids=["default-alignment", "custom-alignment-1", "trailing-bytes"])
def test_well_formed_files_load_and_read_back(layout, tmp_path):
    """test-gguf.cpp's *_SUCCESS / *_CUSTOM_ALIGN cases: the header, the
    metadata and the tensors read back as written."""
    kvs = KVS + ([KV("general.alignment", gb.U32, 1)] if layout.alignment == 1 else [])
    path = tmp_path / "ok.gguf"
    path.write_bytes(gb.build(kvs, TENSORS, layout))
    g = GGUFFile(path)
    assert g.version == 3 and g.alignment == layout.alignment and g.keys() == [kv.key for kv in kvs]
    assert g.meta("test.count", "int") == 7 and g.meta("test.ratio", "float") == 0.5
    assert g.meta("test.flag", "bool") is True and g.meta("test.big", "int") == -(2**40)
    assert g.meta("test.names", "str[]") == ["a", "bb", ""]
    assert g.meta("test.ints", "int[]").tolist() == list(range(100))  # longer than 64: parsed on demand
    assert list(g.tensors) == ["a", "b", "c"]
    assert g.tensors["c"].shape == (2, 5) and g.tensors["b"].shape == (3, 32)
    for t in TENSORS:
        assert g.data(t.name).tobytes() == t.data
    assert g.data("b").shape == (3, 34)
    np.testing.assert_array_equal(g.float32("c"), np.frombuffer(TENSORS[2].data, np.float32).reshape(2, 5))


def test_zero_element_tensors_and_shallow_nesting_load(tmp_path):
    """A tensor with a 0 dimension (test-gguf.cpp's TENSORS_ZERO_DIM) and
    arrays of arrays up to the nesting bound."""
    path = tmp_path / "zero.gguf"
    path.write_bytes(gb.build([], [Tensor("z", [4, 0], 0, b""), Tensor("a", [4], 0, _f32(4))]))
    g = GGUFFile(path)
    assert g.tensors["z"].shape == (0, 4) and g.tensors["z"].nbytes == 0 and g.data("z").shape == (0, 0)
    path.write_bytes(_nested(MAX_NESTING))
    g = GGUFFile(path)
    assert g.value_type("nested") == "array of array" and g.keys() == ["nested"]


def test_the_typed_getter_names_the_key_and_the_file(tmp_path):
    path = tmp_path / "typed.gguf"
    path.write_bytes(gb.build(KVS, []))
    g = GGUFFile(path)
    with pytest.raises(GGUFError, match=r"typed.gguf: metadata test.count must be str, the file holds uint32"):
        g.meta("test.count", "str")
    with pytest.raises(GGUFError, match="test.names must be int\\[\\], the file holds array of string"):
        g.meta("test.names", "int[]")
    with pytest.raises(GGUFError, match="metadata test.absent is missing"):
        g.meta("test.absent", "int")
    assert g.meta("test.absent", "int", None) is None
    assert g.meta("test.count", ("str", "int")) == 7
    with pytest.raises(ValueError, match="kind"):
        g.meta("test.count", "integer")
    assert g.array_length("test.names", "str[]") == 3
    with pytest.raises(GGUFError, match="test.count must be str\\[\\]"):
        g.array_length("test.count", "str[]")


def test_an_invalid_utf8_entry_of_a_long_string_array_is_named(tmp_path):
    names = [f"t{i}" for i in range(100)]
    blob = gb.build([KV("k", gb.ARRAY, names, gb.STRING)], []).replace(b"t42", b"t\xff2")
    path = tmp_path / "utf8.gguf"
    path.write_bytes(blob)
    g = GGUFFile(path)  # long arrays are checked for bounds at open, decoded when read
    with pytest.raises(GGUFError, match=r"utf8.gguf: metadata k: entry 42 is not UTF-8"):
        g.meta("k", "str[]")
