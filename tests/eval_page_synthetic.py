"""A synthetic run with realistic traces, for the results page's size (and
its browser test): ``python -m tests.eval_page_synthetic 10000`` writes
the page of 10,000 questions x (vanilla, single retrieval, ReConnect) and
prints its size (the number in docs/evaluation.md).

The traces have the shape and the sizes of ReConnect's defaults (k = 5
explanations, top_n = 5, N = 3 subsets of K = 5, 256 new tokens at most):
the same instruction text in every prompt, each question in every stage,
passages drawn from a corpus of 100,000, word-level random text (about as
compressible as English)."""

from __future__ import annotations

import math
import random
import sys
import time
from typing import Any

WORDS = [f"{a}{b}{c}" for a in ("b", "c", "d", "f", "g", "l", "m", "p", "r", "s", "t", "w", "st", "tr")
         for b in ("a", "e", "i", "o", "u", "ea", "ou") for c in ("n", "t", "rd", "ll", "ck", "ng", "s", "mp", "")]
SYSTEM_EXPAND = ("You are an expert in commonsense reasoning. For the question and its options below, write a list of "
                 "explanations: each one a short sentence of general knowledge that would help someone choose the right "
                 "option. Do not name the option you think is right.\nWrite one explanation per line, starting with '* '.")
SYSTEM_EXTRACT = ("Reference passages are given below. Extract from them the knowledge that helps answer the question: "
                  "short, general statements, one per line, starting with '* '. Leave out what does not help.")
SYSTEM_AGG = ("A list of explanations extracted from several sets of passages is given. Merge them into one list: "
              "drop repeats and what contradicts commonsense, keep what helps answer the question.")
SYSTEM_ANSWER = ("Answer the multiple-choice question. Use the explanations if they help. Reply with the label of the "
                 "correct option only.")


def _text(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words)).capitalize() + "."


def _lines(rng: random.Random, n: int, words: int) -> list[str]:
    return [_text(rng, words) for _ in range(n)]


def _logprobs(rng: random.Random, n: int) -> list[float]:
    x = [rng.gauss(0, 2) for _ in range(n)]
    m = max(x)
    s = math.log(sum(math.exp(v - m) for v in x)) + m
    return [v - s for v in x]


def _prediction(rng: random.Random, qid: str, question: str, options: str, trace: list[dict[str, Any]],
                passages: list[dict[str, Any]], knowledge: list[str], n: int) -> dict[str, Any]:
    lp = _logprobs(rng, n)
    pred = max(range(n), key=lambda i: lp[i])
    user = f"Question: {question}\nOptions:\n{options}"
    trace.append({"stage": "answer", "type": "score", "labels": list("ABCDE"[:n]), "logprobs": lp, "prompt": [
        {"role": "system", "content": SYSTEM_ANSWER + ("\n\nExplanations:\n" + "\n".join(f"* {k}" for k in knowledge)
                                                       if knowledge else "")},
        {"role": "user", "content": user}, {"role": "assistant", "content": "Answer:"}]})
    return {"question_id": qid, "pred": pred, "pred_label": "ABCDE"[pred], "choice_logprobs": lp, "knowledge": knowledge,
            "passages": passages, "trace": trace, "cost": {"llm_calls": 1 + len(trace), "prompt_tokens": 900,
                                                           "generated_tokens": 600, "cached_calls": 0}}


def synthetic_tasks(n_questions: int, seed: int = 0, corpus: int = 100_000) -> dict[str, Any]:
    """``{"syn": TaskRecords}`` of one task of ``n_questions`` 5-choice questions."""
    from rcn_fast.data.questions import MCQuestion
    from rcn_fast.eval.report.diagnostics import TaskRecords

    rng = random.Random(seed)
    ptext = {}

    def passage(i: int) -> dict[str, Any]:
        pid = f"p{i}"
        if pid not in ptext:
            ptext[pid] = _text(random.Random(i), 22)
        return {"id": pid, "text": ptext[pid], "score": round(rng.uniform(0.3, 0.9), 6)}

    questions, recs = [], {"vanilla": {0: {}}, "single_retrieval": {0: {}}, "reconnect": {0: {}}}
    for qi in range(n_questions):
        qid = f"q{qi:05d}"
        choices = [" ".join(rng.choice(WORDS) for _ in range(3)) for _ in range(5)]
        q = MCQuestion(qid, _text(rng, 16)[:-1] + "?", choices, answer=rng.randrange(5))
        questions.append(q)
        options = "\n".join(f"{lab}. {c}" for lab, c in zip("ABCDE", choices))
        user = f"Question: {q.question}\nOptions:\n{options}"
        recs["vanilla"][0][qid] = {"id": qid, "seed": 0, "status": "ok", "elapsed_s": 0.2, "metrics": {},
                                   "prediction": _prediction(rng, qid, q.question, options, [], [], [], 5)}
        sr = [passage(rng.randrange(corpus)) for _ in range(5)]
        tr = [{"stage": "retrieval", "type": "retrieve", "queries": [q.question], "results": [[p["id"] for p in sr]],
               "scores": [[p["score"] for p in sr]], "passages": [{"id": p["id"], "score": p["score"]} for p in sr]}]
        recs["single_retrieval"][0][qid] = {"id": qid, "seed": 0, "status": "ok", "elapsed_s": 0.3, "metrics": {},
                                            "prediction": _prediction(rng, qid, q.question, options, tr, sr,
                                                                      [p["text"] for p in sr], 5)}
        exps = _lines(rng, 5, 14)
        trace: list[dict[str, Any]] = [{
            "stage": "query_expansion", "type": "generate", "prompt": [{"role": "system", "content": SYSTEM_EXPAND},
                                                                       {"role": "user", "content": user}],
            "output": "\n".join(f"* {e}" for e in exps), "finish_reason": rng.choice(["stop", "stop", "length"]),
            "prompt_tokens": 180, "generated_tokens": 120, "parsed": exps}]
        per_query = [[passage(rng.randrange(corpus)) for _ in range(5)] for _ in range(6)]
        pool = list({p["id"]: p for res in per_query for p in res}.values())
        trace.append({"stage": "retrieval", "type": "retrieve", "queries": exps + [q.question], "top_n": 5,
                      "results": [[p["id"] for p in r] for r in per_query],
                      "scores": [[p["score"] for p in r] for r in per_query],
                      "pool": [p["id"] for p in pool], "passages": [{"id": p["id"], "score": p["score"]} for p in pool]})
        rel = [round(rng.uniform(0.2, 0.9), 6) for _ in pool]
        z = sum(math.exp(r / 0.05) for r in rel)
        subsets = [rng.sample([p["id"] for p in pool], 5) for _ in range(3)]
        trace.append({"stage": "sampling", "type": "sample", "strategy": "relevance", "subset_size": 5,
                      "pool": [p["id"] for p in pool], "relevance": rel,
                      "probability": [round(math.exp(r / 0.05) / z, 6) for r in rel], "temperature": 0.05,
                      "tau": 1.0, "score_scale": 20.0, "first": "relevance", "subsets": subsets,
                      "draw_probability": [[round(rng.random(), 6) for _ in range(5)] for _ in range(3)],
                      "seed": 0, "key": rng.randrange(1 << 62)})
        extractions = []
        for s in subsets:
            out = _lines(rng, 4, 14)
            extractions.append(out)
            listed = "\n".join(f"* {ptext[i]}" for i in s)
            trace.append({"stage": "knowledge_extraction", "type": "generate", "prompt": [
                {"role": "system", "content": f"{SYSTEM_EXTRACT}\n\nReference passages:\n{listed}"},
                {"role": "user", "content": user}], "output": "\n".join(f"* {x}" for x in out),
                "finish_reason": rng.choice(["stop", "length"]), "prompt_tokens": 420, "generated_tokens": 150,
                "parsed": out, "decoding": {"temperature": 0.7, "top_p": 0.9, "seed": rng.randrange(1 << 31)}})
        knowledge = _lines(rng, 6, 14)
        cands = "\n".join(f"* {x}" for e in extractions for x in e)
        trace.append({"stage": "knowledge_aggregation", "type": "generate", "prompt": [
            {"role": "system", "content": f"{SYSTEM_AGG}\n\nCandidate explanations:\n{cands}"},
            {"role": "user", "content": user}], "output": "\n".join(f"* {x}" for x in knowledge),
            "finish_reason": "stop", "prompt_tokens": 520, "generated_tokens": 160, "parsed": knowledge})
        recs["reconnect"][0][qid] = {"id": qid, "seed": 0, "status": "ok", "elapsed_s": 1.5, "metrics": {},
                                     "prediction": _prediction(rng, qid, q.question, options, trace, pool, knowledge, 5)}
    return {"syn": TaskRecords("syn", "multiple_choice", questions, recs)}


def synthetic_doc(tasks: dict[str, Any]) -> dict[str, Any]:
    """A results document (diagnostics included) of :func:`synthetic_tasks`."""
    from rcn_fast.eval.report.diagnostics import diagnose

    res = {t: {p: {"acc": 0.4, "acc_std": 0.0, "acc_stderr": 0.01, "seeds": [0], "n_questions": len(tr.questions),
                   "n_failed": 0, "n_unlabeled": 0, "llm_calls_per_q": 1.0, "tokens_per_q": 900.0,
                   "questions_per_s": 2.0} for p in tr.records} for t, tr in tasks.items()}
    return {"results": res, "configs": {t: {"metrics": ["acc"]} for t in tasks}, "chance": {t: 0.2 for t in tasks},
            "model": {"spec": "openai:http://gpu-host:8000/v1#meta-llama/Llama-3.1-8B-Instruct"},
            "diagnostics": diagnose(tasks), "failures": [], "date": "synthetic"}


def main(argv: list[str]) -> None:
    from rcn_fast.eval.report.page import render_page

    n = int(argv[0]) if argv else 10_000
    t0 = time.perf_counter()
    tasks = synthetic_tasks(n)
    t1 = time.perf_counter()
    html = render_page(synthetic_doc(tasks), tasks)
    t2 = time.perf_counter()
    raw = sum(len(str(r["prediction"])) for tr in tasks.values() for by in tr.records.values()
              for recs in by.values() for r in recs.values())
    print(f"{n} questions x 3 pipelines: page {len(html.encode()) / 1e6:.1f} MB (records {raw / 1e6:.0f} MB as "
          f"text); made in {t1 - t0:.1f} s, rendered in {t2 - t1:.1f} s")
    if len(argv) > 1:
        with open(argv[1], "w", encoding="utf-8") as f:
            f.write(html)


if __name__ == "__main__":
    main(sys.argv[1:])
