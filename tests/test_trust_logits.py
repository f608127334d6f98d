"""The logits processors of the local backend: ``logit_bias`` added to the
chosen tokens' logits with its tensors built once per device and dtype (not
once per generated token), and the checks of ``logit_bias`` values."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from rcn_fast.llm.backends.logits import LogitBias, check_logit_bias  # noqa: E402


def test_logit_bias_adds_to_the_chosen_tokens_with_tensors_built_once(monkeypatch):
    proc = LogitBias({3: -100.0, 0: 2.5})
    built = []
    real = torch.tensor
    monkeypatch.setattr(torch, "tensor", lambda *a, **k: built.append(a) or real(*a, **k))
    scores = torch.zeros(2, 5)
    for step in range(4):  # one call per generated token
        out = proc(torch.zeros(2, 7 + step, dtype=torch.long), scores)
        assert out.tolist() == [[2.5, 0.0, 0.0, -100.0, 0.0]] * 2
        assert scores.abs().sum() == 0  # the input is not changed
    assert len(built) == 2  # ids and values, once
    half = proc(torch.zeros(2, 7, dtype=torch.long), scores.to(torch.float64))
    assert half.dtype == torch.float64 and half[0, 0] == 2.5 and len(built) == 4  # another dtype: its own tensors
    assert LogitBias({})(None, scores) is scores


@pytest.mark.parametrize("bias, why", [
    ({"5": True}, "expected a number"), ({"5": math.nan}, "expected a number"), ({"5": math.inf}, "expected a number"),
    ({"5": 101}, "expected a number"), ({"5": "1"}, "expected a number"), ({"x": 1}, "is not a token id"),
    ({10: 1}, "is not a token id"), ([1], "expected a mapping"),
])
def test_check_logit_bias_refuses_what_is_not_a_bias(bias, why):
    with pytest.raises(ValueError, match=why):
        check_logit_bias(bias, 10)


def test_check_logit_bias_reads_token_ids_and_numbers():
    assert check_logit_bias({"3": 1, 4: -100.0, " 5 ": 0.5}, 10) == {3: 1.0, 4: -100.0, 5: 0.5}
