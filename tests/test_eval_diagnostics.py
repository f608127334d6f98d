"""What distorts the numbers (issue 54 item 2): label histograms, the
majority baseline, the label-bias warning and its thresholds, truncated
generations per stage, repeated subsets, the chart title's model spec
(wrapped, never cut), and the cyclic permutations of ``--permute-choices``."""

from __future__ import annotations

import itertools

import pytest

from rcn_fast.data.questions import MCQuestion
from rcn_fast.eval.report import diagnostics as dg


def _q(i: int, gold: int, n: int = 4) -> MCQuestion:
    return MCQuestion(f"q{i}", f"question {i}?", [f"choice {i}-{c}" for c in range(n)], answer=gold)


def _rec(q: MCQuestion, pred: int, *, old: bool = False, trace=None) -> dict:
    lab = q.labels[pred]
    p = {"question_id": q.id, "pred": pred, "choice_logprobs": [0.0 if i == pred else -2.0 for i in range(len(q.choices))],
         "trace": trace or []}
    p.update({"label": lab, "answer": q.answer} if old else {"pred_label": lab, "gold": q.answer,
                                                             "gold_label": q.answer_label})
    return {"id": q.id, "seed": 0, "status": "ok", "metrics": {"acc": float(pred == q.answer)}, "elapsed_s": 0.1,
            "prediction": p}


def _task(preds: dict[str, list[int]], golds: list[int], n: int = 4, old: bool = False, traces=None) -> dg.TaskRecords:
    qs = [_q(i, g, n) for i, g in enumerate(golds)]
    recs = {p: {0: {q.id: _rec(q, v, old=old, trace=(traces or {}).get(p, [None] * len(qs))[i])
                    for i, (q, v) in enumerate(zip(qs, vs))}} for p, vs in preds.items()}
    return dg.TaskRecords("t", "multiple_choice", qs, recs)


@pytest.mark.parametrize("old", [False, True])
def test_histograms_the_majority_baseline_and_the_warning_read_both_field_names(old):
    golds = [0] * 12 + [1] * 10 + [2] * 11 + [3] * 7
    tr = _task({"reconnect": [2] * 39 + [0], "vanilla": [0, 1, 2, 3] * 10}, golds, old=old)
    d = dg.diagnose({"demo": tr})
    t = d["tasks"]["demo"]
    assert t["labels"] == ["A", "B", "C", "D"] and t["gold"] == {"A": 12, "B": 10, "C": 11, "D": 7}
    assert t["majority_baseline"] == {"label": "A", "acc": 12 / 40, "n": 40}
    r = t["pipelines"]["reconnect"]
    assert r["histogram"] == {"A": 1, "B": 0, "C": 39, "D": 0} and r["top_label"] == "C"
    assert r["top_share"] == pytest.approx(39 / 40) and r["always_top_acc"] == pytest.approx(11 / 40)
    assert r["warning"] == ("t / reconnect: answered C on 39 of 40 predictions (98%); gold has C on 11 of 40 (28%); "
                            "always answering C would score 0.275")
    assert t["pipelines"]["vanilla"]["warning"] is None
    assert d["warnings"] == [r["warning"]]
    md = dg.markdown_sections(d)
    assert "| gold | 12 | 10 | 11 | 7 | A (30%) | 0.300 (majority baseline) |" in md
    assert "| reconnect | 1 | 0 | 39 | 0 | C (98%) | 0.275 |" in md and f"* warning: {r['warning']}" in md


def test_the_bias_thresholds():
    gold4 = {"A": 25, "B": 25, "C": 25, "D": 25}
    w = dg.bias_warning
    assert w("t", "p", {"A": 50, "B": 50}, gold4, 4, None) is None  # exactly half: not more than half
    assert w("t", "p", {"A": 51, "B": 49}, gold4, 4, None) is not None  # more than half, 4 choices
    assert w("t", "p", {"A": 6, "B": 3}, gold4, 4, None) is None  # fewer than WARN_MIN_PREDICTIONS
    gold2 = {"A": 50, "B": 50}
    assert w("t", "p", {"A": 79, "B": 21}, gold2, 2, None) is None  # 2 choices: 80% is the line
    assert w("t", "p", {"A": 81, "B": 19}, gold2, 2, None) is not None
    skew = {"A": 10, "B": 40, "C": 40, "D": 10}  # gold has A 10%: the top label A at 30% is more than twice that
    assert w("t", "p", {"A": 30, "B": 25, "C": 25, "D": 20}, skew, 4, None) is not None
    assert w("t", "p", {"A": 20, "B": 30, "C": 26, "D": 24}, skew, 4, None) is None  # top B: under its gold share
    assert w("t", "p", {"A": 30, "B": 30, "C": 40}, {}, 4, None) is None  # no gold, share under the line


def test_truncation_counts_per_stage_and_repeated_subsets():
    gen = (lambda st, r: {"stage": st, "type": "generate", "prompt": [], "output": "x", "finish_reason": r})
    traces = {"reconnect": [
        [gen("query_expansion", "length"), {"stage": "sampling", "type": "sample", "subsets": [["a", "b"], ["b", "a"]]},
         gen("knowledge_extraction", "length"), gen("knowledge_extraction", "stop")],
        [gen("query_expansion", "stop"), {"stage": "sampling", "type": "sample", "subsets": [["a", "b"], ["a", "c"]]},
         {"stage": "rr_reasoning", "type": "generate", "finish_reasons": ["length", "stop", "length"]}],
    ]}
    tr = _task({"reconnect": [0, 1]}, [0, 1], traces=traces)
    d = dg.diagnose({"t": tr})
    p = d["tasks"]["t"]["pipelines"]["reconnect"]
    assert p["truncation"] == {"query_expansion": {"generations": 2, "truncated": 1},
                               "knowledge_extraction": {"generations": 2, "truncated": 1},
                               "rr_reasoning": {"generations": 3, "truncated": 2}}
    assert p["repeated_subsets"] == {"questions": 1, "of": 2}
    assert "t / reconnect: 2 of 3 rr_reasoning generations stopped at the token limit (max_new_tokens)" in d["warnings"]
    assert "| reconnect | rr_reasoning | 2 / 3 (67%) |" in dg.markdown_sections(d)


# ------------------------------------------------------------------ chart title
def test_a_long_served_model_spec_is_wrapped_never_cut():
    from rcn_fast.eval.report.plot import MAX_SPEC_LINES, model_caption, plot_labels, wrap_spec

    spec = "openai:http://gpu-host.example.internal:8000/v1#meta-llama/Llama-3.1-8B-Instruct"
    for width in (12, 20, 33, 70):
        lines = wrap_spec(spec, width)
        assert "".join(lines) == spec and all(len(x) <= width for x in lines)
    lines = model_caption({"model": {"spec": spec, "name": "meta-llama/Llama-3.1-8B-Instruct"}}, 40)
    assert "".join(lines) == f"model: {spec}" and len(lines) <= MAX_SPEC_LINES
    very = "openai:http://" + "x" * 300 + "#m"
    short = model_caption({"model": {"spec": very, "name": "m-name"}}, 40)
    assert short == ["model: m-name (full spec in the report)"]
    doc = {"results": {"t": {"p": {"acc": 0.5, "seeds": [0], "n_questions": 3}}}, "configs": {"t": {"metrics": ["acc"]}},
           "model": {"spec": spec}}
    assert "".join(plot_labels(doc, width=40)["model"]) == f"model: {spec}"


# ------------------------------------------------------------------ permutations
@pytest.mark.parametrize("n", [2, 3, 4, 5, 7])
def test_a_rotation_keeps_every_choice_its_text_and_the_gold(n):
    from rcn_fast.eval.run.permute import original_index, rotate, shifts_of

    q = _q(0, n - 1, n)
    for s in range(n):
        r = rotate(q, s)
        assert r.id == q.id and r.labels == q.labels and sorted(r.choices) == sorted(q.choices)
        assert r.choices[r.answer] == q.choices[q.answer]
        for pos in range(n):
            assert r.choices[pos] == q.choices[original_index(pos, s, n)]
    assert list(shifts_of(q, 3)) == list(range(min(3, n)))
    assert [c for c in rotate(q, 1).choices] == q.choices[1:] + q.choices[:1]


def test_permute_choices_is_checked():
    from rcn_fast.eval import EvalConfig, EvalError

    assert EvalConfig(permute_choices=4).permute_choices == 4 and EvalConfig().permute_choices == 0
    for bad in (1, -1, 27, 2.0, True, "3"):
        with pytest.raises(EvalError, match="permute_choices: expected 0 .off. or a number of cyclic orders"):
            EvalConfig(permute_choices=bad)


def test_accuracy_over_the_orders():
    from rcn_fast.eval.run.permute import permutation_summary, rotate

    qs = [_q(0, 0, 3), _q(1, 1, 2), _q(2, 2, 3)]
    # picked (by original index) in orders 0, 1, 2: q0 always 0 (right); q1 (2 choices) 1 then 0; q2 2, 0, missing
    picks = {"q0": [0, 0, 0], "q1": [1, 0], "q2": [2, 0, None]}
    plain = {q.id: _rec(q, picks[q.id][0]) for q in qs}
    perm = {}
    for s in (1, 2):
        perm[s] = {}
        for q in qs:
            if s < len(q.choices) and picks[q.id][s] is not None:
                r = rotate(q, s)
                pos = (picks[q.id][s] - s) % len(q.choices)  # where the picked text sits in the rotated order
                perm[s][q.id] = _rec(r, pos)
    tr = dg.TaskRecords("t", "multiple_choice", qs, {"p": {0: plain}}, {"p": {0: perm}}, permute_k=3)
    s = permutation_summary(tr, "p")
    assert s["n"] == 2 and s["n_incomplete"] == 1  # q2 was not answered in every order
    assert s["acc"] == pytest.approx((1.0 + 0.5) / 2) and s["plain_acc"] == pytest.approx(1.0)
    assert s["consistency"] == pytest.approx(0.5) and s["acc_per_shift"] == {"0": 1.0, "1": 0.5, "2": 1.0}


@pytest.mark.parametrize("k, n", list(itertools.product([2, 3, 5], [2, 4])))
def test_the_orders_asked_per_question(k, n):
    from rcn_fast.eval.run.permute import permuted_questions

    qs = [_q(i, i % n, n) for i in range(3)]
    orders = permuted_questions(qs, k)
    assert sorted(orders) == list(range(1, k)) and all(len(orders[s]) == (3 if s < n else 0) for s in orders)
