"""Issue 26 item 7: the ONNX export cache is checked before it is used.

A byte flipped in ``model.onnx.data`` gave NaN embeddings silently and a
truncated file a raw ONNX Runtime error. Every export now records the size
and sha256 of its files (``checksums.json``); sizes are compared on every
load, hashes once per process per folder state (or with
``verify_export=True``). A damaged export in a cache is exported again; one
in the model folder (``cache_dir="model"``) is refused naming the folder to
delete.
"""

from __future__ import annotations

import json
import logging
import os
import shutil

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("onnxruntime")
pytest.importorskip("onnxscript")

from rcn_fast.retrieval import Encoder  # noqa: E402
from rcn_fast.retrieval.encoders import onnx as ob  # noqa: E402
from tests.retrieval.tiny import make_tiny_bert  # noqa: E402

TEXTS = ["plants need light to grow", "ice is cold", "magnets attract iron", ""]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return make_tiny_bert(tmp_path_factory.mktemp("tiny") / "bert")


@pytest.fixture(scope="module")
def exported(tiny, tmp_path_factory):
    """One export (the slow part), copied per test; its reference embeddings."""
    cache = tmp_path_factory.mktemp("export_cache")
    enc = Encoder.from_pretrained(tiny, backend="onnx", cache_dir=cache)
    return enc.onnx_path.parent, enc.encode_passages(TEXTS)


@pytest.fixture
def cache(exported, tmp_path):
    """A cache folder holding a copy of the export (same key, same name)."""
    folder, _ = exported
    c = tmp_path / "cache"
    shutil.copytree(folder.parent, c)
    return c / folder.name


def _weights(folder):
    """The largest file of the export (the weights)."""
    return max((p for p in folder.iterdir() if p.suffix in (".onnx", ".data")), key=lambda p: p.stat().st_size)


def _flip(path, offset_from_end=64):
    b = bytearray(path.read_bytes())
    b[len(b) - offset_from_end] ^= 0xFF
    path.write_bytes(bytes(b))


def test_export_records_sizes_and_hashes(exported):
    folder, _ = exported
    rec = json.loads((folder / "checksums.json").read_text())
    assert rec["format"] == "rcn_fast.onnx_export/1"
    names = sorted(p.name for p in folder.iterdir() if p.name != "checksums.json")
    assert sorted(rec["files"]) == names and "model.onnx" in names and "export.json" in names
    for n in names:
        assert rec["files"][n]["size"] == (folder / n).stat().st_size and len(rec["files"][n]["sha256"]) == 64
    assert ob.export_problem(folder, verify=True) is None


def test_int8_copy_is_recorded_and_checked(tiny, cache):
    q8 = Encoder.from_pretrained(tiny, backend="onnx", cache_dir=cache.parent, quantize="int8")
    rec = json.loads((cache / "checksums.json").read_text())
    assert q8.onnx_path.name in rec["files"] and "model.onnx" in rec["files"]
    assert rec["files"][q8.onnx_path.name]["size"] == q8.onnx_path.stat().st_size
    _flip(q8.onnx_path)
    assert ob.export_problem(cache) == f"{q8.onnx_path.name} does not match its sha256 (damaged on disk)"


def test_flipped_byte_is_detected_and_reexported(tiny, exported, cache, caplog):
    _, ref = exported
    w = _weights(cache)
    _flip(w)
    assert "does not match its sha256" in ob.export_problem(cache, verify=True)
    with caplog.at_level(logging.WARNING, logger="rcn_fast.retrieval"):
        enc = Encoder.from_pretrained(tiny, backend="onnx", cache_dir=cache.parent)
    assert any("is damaged" in r.message and w.name in r.message and "exporting it again" in r.message
               for r in caplog.records)
    got = enc.encode_passages(TEXTS)
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got, ref, atol=1e-6)  # the fresh export, not the damaged one
    assert ob.export_problem(cache, verify=True) is None
    assert not [p for p in cache.parent.iterdir() if ".damaged." in p.name]


def test_flip_keeping_size_and_mtime_is_caught_with_verify(tiny, cache):
    """Hashes run once per process per folder state; verify_export=True
    rehashes even when size and mtime were kept."""
    Encoder.from_pretrained(tiny, backend="onnx", cache_dir=cache.parent)  # hashed once here
    w = _weights(cache)
    st = w.stat()
    _flip(w)
    os.utime(w, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert ob.export_problem(cache) is None  # same size and mtime: not rehashed this process
    with pytest.raises(ValueError, match="does not match its sha256"):
        ob.verify_export(cache)
    Encoder.from_pretrained(tiny, backend="onnx", cache_dir=cache.parent, verify_export=True)  # re-exported
    assert ob.export_problem(cache, verify=True) is None


def test_truncated_file_is_detected_with_a_clear_message(tiny, exported, cache):
    _, ref = exported
    w = _weights(cache)
    size = w.stat().st_size
    with open(w, "r+b") as f:
        f.truncate(size // 2)
    assert ob.export_problem(cache) == f"{w.name} is {size // 2} bytes, {size} were exported (truncated or overwritten)"
    # the export inside a model folder is not a cache rcn_fast may replace: refused, naming the folder
    model = cache.parent / "model"
    shutil.copytree(tiny, model)
    (model / "onnx").mkdir()
    shutil.copytree(cache, model / "onnx" / cache.name.replace(tiny.name, "model", 1))
    with pytest.raises(ValueError, match=r"the ONNX export in .*model/onnx/model-mean-\w+ is damaged: "
                                         rf"{w.name} is \d+ bytes, {size} were exported .*delete the folder"):
        Encoder.from_pretrained(model, backend="onnx", cache_dir="model")
    # in a cache: exported again, same embeddings
    enc = Encoder.from_pretrained(tiny, backend="onnx", cache_dir=cache.parent)
    np.testing.assert_allclose(enc.encode_passages(TEXTS), ref, atol=1e-6)


def test_export_without_checksums_is_reexported(tiny, cache, caplog):
    """An export written before checksums existed cannot be checked: exported again."""
    (cache / "checksums.json").unlink()
    with caplog.at_level(logging.WARNING, logger="rcn_fast.retrieval"):
        Encoder.from_pretrained(tiny, backend="onnx", cache_dir=cache.parent)
    assert any("has no checksums.json" in r.message for r in caplog.records)
    assert ob.export_problem(cache, verify=True) is None
