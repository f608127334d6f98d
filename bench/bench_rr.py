"""RR benchmarks (pytest-benchmark): batched vs one question at a time.

    python -m pytest bench/bench_rr.py --benchmark-only -s --benchmark-columns=mean,rounds

* ``rr evidence``: a scripted LLM (rcn_fast/testing/rr_doubles.PathsLLM)
  returns fixed reasoning paths built from real science sentences, so the
  time is RR's own work: sentence splitting and parsing, BM25 (bm25s) over
  the corpus, encoder reranking (the retriever's encoder, similarity_model=
  'retriever': all-MiniLM-L6-v2 when installed, else a tiny BERT; the
  paper's all-mpnet-base-v2 is not installed here), NLI (a tiny random
  BertForSequenceClassification) and the vote. Batched = one BM25, one encoder and one NLI call for all sentences
  of all questions; one at a time = the same calls per question. The
  predictions must be identical and the log-probabilities equal within
  1e-5 (asserted; batch padding moves float32 rounding).
* ``rr tiny-llama``: the same with a tiny random-weight Llama sampling the
  paths few-shot (one generation call with num_samples=N for the batch vs
  one per question). With the local backend a sampled path depends only on
  (seed, prompt, sample index), not on the batch, so the two modes must
  sample the same paths and give the same predictions (asserted, as
  above).

Knobs: RCN_BENCH_RR_QUESTIONS (default 32; 8 with RCN_FAST_BENCH_QUICK=1),
RCN_BENCH_RR_PATHS (default 5), RCN_BENCH_THREADS (torch threads, default
2); rounds: pytest-benchmark's ``--benchmark-min-rounds`` (one round is a
whole pipeline run). The machine is shared: compare ratios within one run.
"""

from __future__ import annotations

import hashlib
import os

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("bm25s")
pytest.importorskip("pysbd")
os.environ["HF_HUB_OFFLINE"] = "1"

from rcn_fast import MCQuestion  # noqa: E402
from rcn_fast.pipelines import InMemoryRetriever, build  # noqa: E402
from rcn_fast.testing.rr_doubles import PathsLLM, make_tiny_nli  # noqa: E402
from rcn_fast.testing.tiny_retrieval import make_tiny_bert, minilm_dir, real_sentences  # noqa: E402

QUICK = os.environ.get("RCN_FAST_BENCH_QUICK") == "1"
N_Q = int(os.environ.get("RCN_BENCH_RR_QUESTIONS", "8" if QUICK else "32"))
N_PATHS = int(os.environ.get("RCN_BENCH_RR_PATHS", "5"))
THREADS = int(os.environ.get("RCN_BENCH_THREADS", "2"))
RESULTS: dict[str, list] = {}
TINY: dict[str, list] = {}  # tiny-llama mode -> (question id, pred, log-probs, sampled paths)


def _h(s: str) -> int:
    return int.from_bytes(hashlib.sha256(s.encode()).digest()[:8], "little")


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    torch.set_num_threads(THREADS)
    from rcn_fast.nli import NLIModel
    from rcn_fast.retrieval import Encoder

    d = minilm_dir()
    if d is not None:
        enc, enc_name = Encoder.from_pretrained(d, query_prefix="", passage_prefix=""), "minilm"
    else:
        enc, enc_name = Encoder.from_pretrained(make_tiny_bert(tmp_path_factory.mktemp("bert") / "b")), "tiny-bert"
    facts = real_sentences(1500)
    retriever = InMemoryRetriever(enc, facts, ids=[f"fact-{i}" for i in range(len(facts))])
    nli = NLIModel.from_pretrained(make_tiny_nli(tmp_path_factory.mktemp("nli") / "n"), max_length=128,
                                   device="cpu", batch_size=64)
    qs = [MCQuestion(f"q{i}", f"Which statement about nature is right ({i})?", ["first", "second", "third", "fourth"])
          for i in range(N_Q)]

    def script(question: str) -> list[str]:
        h = _h(question)
        out = []
        for j in range(N_PATHS):
            a, b = facts[(h + 7 * j) % len(facts)], facts[(h // 3 + 11 * j) % len(facts)]
            out.append(f"{a} {b} So the answer is {'ABCD'[(h + j) % 4]}.")
        return out

    return retriever, nli, qs, script, enc_name


def _key(preds) -> list:
    return [(p.question_id, p.pred, p.choice_logprobs) for p in preds]


def _same(a: list, b: list) -> bool:
    """Same predictions; log-probabilities equal up to float32 rounding (the
    encoder and NLI batches pad differently, which moves the last bits)."""
    import numpy as np

    return all(x[:2] == y[:2] and np.allclose(x[2], y[2], atol=1e-5, rtol=0) for x, y in zip(a, b)) \
        and len(a) == len(b)


@pytest.mark.parametrize("mode", ["batched", "one_at_a_time"])
def test_rr_evidence_questions_per_second(benchmark, pedantic, record, setup, mode):
    retriever, nli, qs, script, enc_name = setup
    pipe = build("rr", llm=PathsLLM(script), retriever=retriever, nli=nli, num_paths=N_PATHS,
                 similarity_model="retriever")
    pipe.run(MCQuestion("warm-up", "Which is a colour?", ["blue", "dog"]))  # not timed
    fn = (lambda: pipe.run_batch(qs)) if mode == "batched" else (lambda: [pipe.run(q) for q in qs])
    benchmark.group = f"rr evidence (scripted LLM, {enc_name}, tiny NLI) {len(qs)} questions x {N_PATHS} paths"
    preds = pedantic(fn)
    RESULTS[mode] = _key(preds)
    benchmark.extra_info["questions/s"] = round(len(qs) / benchmark.stats.stats.mean, 2)
    benchmark.extra_info["sentences"] = sum(sum(s["checked"] for s in t["sentences"]) for p in preds
                                            for t in p.trace if t["type"] == "path")
    record(benchmark.group, mode, benchmark)
    if len(RESULTS) == 2:
        same = _same(RESULTS["batched"], RESULTS["one_at_a_time"])
        print(f"\nidentical predictions (log-probs within 1e-5) batched vs one at a time: {same}")
        assert same


@pytest.mark.parametrize("mode", ["batched", "one_at_a_time"])
def test_rr_tiny_llama_questions_per_second(benchmark, pedantic, record, setup, mode, tmp_path_factory):
    from rcn_fast.llm import load_llm
    from rcn_fast.testing.tiny_llm import make_tiny_llama

    retriever, nli, qs, _, enc_name = setup
    if "dir" not in TINY:  # both modes sample with the same model
        TINY["dir"] = make_tiny_llama(tmp_path_factory.mktemp("llama") / "m")
    llm = load_llm(TINY["dir"], batch_size=len(qs))
    pipe = build("rr", llm=llm, retriever=retriever, nli=nli, num_paths=N_PATHS, max_new_tokens=24,
                 similarity_model="retriever")
    pipe.run(MCQuestion("warm-up", "Which is a colour?", ["blue", "dog"]))
    fn = (lambda: pipe.run_batch(qs)) if mode == "batched" else (lambda: [pipe.run(q) for q in qs])
    benchmark.group = f"rr tiny-llama ({enc_name}, tiny NLI) {len(qs)} questions x {N_PATHS} paths, 24 tokens"
    preds = pedantic(fn)
    assert len(preds) == len(qs)
    if benchmark.stats is not None:
        benchmark.extra_info["questions/s"] = round(len(qs) / benchmark.stats.stats.mean, 2)
    record(benchmark.group, mode, benchmark)
    TINY[mode] = [(*k, p.trace[0]["outputs"]) for k, p in zip(_key(preds), preds)]
    if "batched" in TINY and "one_at_a_time" in TINY:
        a, b = TINY["batched"], TINY["one_at_a_time"]
        same_paths = [x[3] for x in a] == [y[3] for y in b]
        same = same_paths and _same([x[:3] for x in a], [y[:3] for y in b])
        print(f"\nsame sampled paths and predictions batched vs one at a time: {same}")
        assert same
