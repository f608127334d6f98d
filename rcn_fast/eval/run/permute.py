"""``--permute-choices K``: each question under K cyclic permutations of its
choices, a diagnostic of label bias (Zheng et al. 2023, "Large Language
Models Are Not Robust Multiple Choice Selectors"), never the default.

A permuted question is a question: :func:`rotate` moves its choice texts
``shift`` places (the labels stay where they are, the gold index follows
its text), and the plan (:func:`rcn_fast.eval.run.plan.plan`) gives every
task x pipeline x seed one more unit per shift 1 .. K-1, with its own
checkpoint (``seed<S>-perm<shift>-<key>.jsonl``, the shift in its key), so
the plain records are never mixed with permuted ones and a killed run
resumes each as it does any unit. Shift 0 is the plain order, answered
once. A question with n choices is asked in its first ``min(K, n)``
orders (shifts below n), so no order is asked twice.

:func:`permutation_summary` reads them back for the reports: accuracy over
the orders (per question the mean over its orders, then the mean over
questions and seeds), accuracy per shift, and the share of questions whose
chosen choice (by its text's original index) is the same in every order.
"""

from __future__ import annotations

import dataclasses
from typing import Any

#: The most orders a question can be asked in (one per choice: MCQuestion allows 26).
MAX_PERMUTATIONS = 26


def check_permute_choices(k: Any) -> int:
    """``permute_choices``: 0 (off) or a number of orders in [2, 26]."""
    if isinstance(k, bool) or not isinstance(k, int) or not (k == 0 or 2 <= k <= MAX_PERMUTATIONS):
        raise ValueError(f"permute_choices: expected 0 (off) or a number of cyclic orders of the choices from 2 to "
                         f"{MAX_PERMUTATIONS} (the plain order is one of them), got {k!r}")
    return k


def rotate(question: Any, shift: int) -> Any:
    """``question`` with its choice texts moved ``shift`` places: position
    ``i`` holds the text that was at ``(i + shift) % n``; the labels stay,
    the gold index follows its text, the id is the same (its checkpoint
    file tells the orders apart)."""
    n = len(question.choices)
    s = shift % n
    choices = list(question.choices[s:]) + list(question.choices[:s])
    answer = None if question.answer is None else (question.answer - s) % n
    return dataclasses.replace(question, choices=choices, answer=answer)


def original_index(pred: int, shift: int, n: int) -> int:
    """The original index of the choice at position ``pred`` of the order rotated by ``shift``."""
    return (pred + shift) % n


def shifts_of(question: Any, k: int) -> range:
    """The orders a question is asked in: shifts 0 .. min(k, n) - 1."""
    return range(min(k, len(question.choices)))


def skip_reason(spec: Any) -> str | None:
    """Why a task's choices are not permuted (None: they are)."""
    if spec.kind == "open":
        return "an open-domain task has no choices"
    if spec.choices_in_question:
        return "its question text lists the choices (choices_in_question), which a rotation would not move"
    return None


def permuted_questions(questions: list[Any], k: int) -> dict[int, list[Any]]:
    """``{shift: the questions asked in that order, rotated}`` for shifts 1 .. k-1."""
    return {s: [rotate(q, s) for q in questions if s < len(q.choices)] for s in range(1, k)}


def permutation_summary(tr: Any, pipeline: str) -> dict[str, Any]:
    """Accuracy over the orders of one task x pipeline (a
    :class:`rcn_fast.eval.report.diagnostics.TaskRecords`).

    Returns
    -------
    dict
        ``k``; ``acc`` (per question the mean accuracy over its orders, then
        the mean over questions, then over seeds; only questions answered in
        every order count: ``n`` of them, ``n_incomplete`` left out);
        ``plain_acc`` (the plain order on the same questions); ``acc_per_shift``
        ``{shift: accuracy}``; ``consistency`` (the share of those questions
        that got the same choice, by its original index, in every order).
    """
    plain = tr.records.get(pipeline, {})
    perm = tr.permuted.get(pipeline, {})
    k = tr.permute_k
    accs, plains, same = [], [], []
    per_shift: dict[int, list[float]] = {}
    incomplete = 0
    for seed, recs in plain.items():
        q_accs, q_plain, q_same = [], [], []
        for q in tr.questions:
            if q.answer is None:
                continue
            got = []
            for s in shifts_of(q, k):
                rec = recs.get(q.id) if s == 0 else perm.get(seed, {}).get(s, {}).get(q.id)
                p = (rec or {}).get("prediction", {}).get("pred") if isinstance(rec, dict) else None
                if not isinstance(p, int):
                    break
                got.append((s, original_index(p, s, len(q.choices))))
            else:
                hits = [float(o == q.answer) for _, o in got]
                q_accs.append(sum(hits) / len(hits))
                q_plain.append(hits[0])
                q_same.append(float(len({o for _, o in got}) == 1))
                for (s, _), h in zip(got, hits):
                    per_shift.setdefault(s, []).append(h)
                continue
            incomplete += 1
        if q_accs:
            accs.append(sum(q_accs) / len(q_accs))
            plains.append(sum(q_plain) / len(q_plain))
            same.append(sum(q_same) / len(q_same))

    def mean(v: list[float]) -> float | None:
        return sum(v) / len(v) if v else None

    n_seeds = max(len(plain), 1)
    return {"k": k, "acc": mean(accs), "plain_acc": mean(plains), "consistency": mean(same),
            "acc_per_shift": {str(s): mean(v) for s, v in sorted(per_shift.items())},
            "n": len(per_shift.get(0, [])) // n_seeds, "n_incomplete": incomplete // n_seeds}


__all__ = ["rotate", "original_index", "shifts_of", "skip_reason", "permuted_questions", "permutation_summary",
           "check_permute_choices", "MAX_PERMUTATIONS"]
