"""Seeded, batch-independent sampling (rcn_fast.llm.seeded): the draws
against exact enumeration of the sampling distribution (chi-square), the
independence of successive steps, and the seed helpers."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from rcn_fast.llm.seeded import SeededSampler, draw, row_key, sample_seed, step_uniform, top_p_filter  # noqa: E402

# chi-square quantiles at 1 - 1e-4 (scipy.stats.chi2.ppf), by degrees of freedom
CHI2_Q = {1: 15.137, 2: 18.421, 3: 21.108, 4: 23.513, 5: 25.745, 35: 74.926}
LOGITS = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0, -3.0])
N = 20_000
PROMPT = [5, 17, 3]


def exact(logits: torch.Tensor, temperature: float, top_p: float) -> np.ndarray:
    """Sampling distribution by enumeration (float64): softmax(logits / T),
    restricted to the smallest most-likely set with mass >= top_p."""
    p = torch.softmax(logits.double() / temperature, -1).numpy()
    order = np.argsort(-p, kind="stable")
    keep = np.zeros_like(p, dtype=bool)
    mass = 0.0
    for i in order:
        if mass >= top_p:
            break
        keep[i] = True
        mass += p[i]
    q = np.where(keep, p, 0.0)
    return q / q.sum()


def chi2_stat(counts: np.ndarray, probs: np.ndarray) -> tuple[float, int]:
    m = probs > 0
    expected = probs[m] * counts.sum()
    return float(((counts[m] - expected) ** 2 / expected).sum()), int(m.sum()) - 1


def sampled_tokens(keys, step: int, temperature: float, top_p: float) -> np.ndarray:
    proc = SeededSampler(keys, prompt_width=len(PROMPT), temperature=temperature, top_p=top_p)
    input_ids = torch.zeros((len(keys), len(PROMPT) + step), dtype=torch.long)
    out = proc(input_ids, LOGITS.expand(len(keys), -1).clone())
    assert torch.isneginf(out).sum(1).eq(LOGITS.numel() - 1).all()  # one token per row, score 0
    return out.argmax(1).numpy()


@pytest.mark.parametrize("temperature,top_p", [(1.0, 1.0), (0.7, 1.0), (1.3, 0.8), (1.0, 0.6)])
def test_draws_follow_the_exact_distribution(temperature, top_p):
    keys = [row_key(0, s, PROMPT) for s in range(N)]
    toks = sampled_tokens(keys, 0, temperature, top_p)
    probs = exact(LOGITS, temperature, top_p)
    counts = np.bincount(toks, minlength=LOGITS.numel())
    assert counts[probs == 0].sum() == 0, "a token outside the nucleus was drawn"
    stat, df = chi2_stat(counts, probs)
    assert stat < CHI2_Q[df], (stat, df, counts, probs)


def test_successive_steps_are_independent():
    keys = [row_key(3, s, PROMPT) for s in range(N)]
    a = sampled_tokens(keys, 0, 1.0, 1.0)
    b = sampled_tokens(keys, 1, 1.0, 1.0)
    p = exact(LOGITS, 1.0, 1.0)
    joint = np.bincount(a * 6 + b, minlength=36)
    stat, df = chi2_stat(joint, np.outer(p, p).ravel())
    assert df == 35 and stat < CHI2_Q[35], stat


def test_draw_is_row_independent_and_handles_edges():
    gen = torch.Generator().manual_seed(0)
    scores = torch.randn(7, 50, generator=gen) * 3
    u = torch.rand(7, generator=gen, dtype=torch.float64)
    together = draw(scores, u, 0.9, 0.9)
    alone = torch.cat([draw(scores[i : i + 1], u[i : i + 1], 0.9, 0.9) for i in range(7)])
    assert torch.equal(together, alone)
    # u = 0 takes the first token with mass, u -> 1 the last one (never a masked token)
    masked = torch.full((1, 6), float("-inf"))
    masked[0, 2], masked[0, 4] = 0.0, 1.0
    assert draw(masked, torch.tensor([0.0], dtype=torch.float64), 1.0, 1.0).item() == 2
    assert draw(masked, torch.tensor([1.0 - 2**-53], dtype=torch.float64), 1.0, 1.0).item() == 4
    # top_p keeps the most likely token even when it alone exceeds top_p
    x = torch.tensor([[0.0, 5.0, 1.0]])
    assert torch.isneginf(top_p_filter(x, 0.1)).tolist() == [[True, False, True]]
    with pytest.raises(ValueError, match="temperature"):
        SeededSampler([b"k"], 1, 0.0, 1.0)


def test_keys_and_seeds():
    assert row_key(1, 0, PROMPT) == row_key(1, 0, list(PROMPT))
    assert len({row_key(1, 0, PROMPT), row_key(2, 0, PROMPT), row_key(1, 1, PROMPT), row_key(1, 0, PROMPT[:2])}) == 4
    u = [step_uniform(row_key(0, 0, PROMPT), t) for t in range(1000)]
    assert all(0.0 <= x < 1.0 for x in u) and len(set(u)) == 1000
    assert sample_seed(42, 0) == 42
    seeds = {sample_seed(seed, s) for seed in range(20) for s in range(1, 20)}
    assert len(seeds) == 20 * 19 and all(0 <= x < 2**31 for x in seeds)
    # unlike seed + s, the samples of neighbouring seeds do not share seeds
    assert sample_seed(5, 1) != sample_seed(6, 0)
