"""Peers of the subset sampler that bench/bench_sampling.py times
(rcn_fast/testing/peers.py), checked here so the benchmark never compares
against a wrong implementation.

``torch_loop_sample`` is how the published ReConnect code samples: one
question and one subset at a time, a ``torch.distributions.Categorical``
per step. It draws from the same model with torch's own generator, so it
is checked against the exact distribution, not against our ids.
"""

from __future__ import annotations

import numpy as np
import pytest

from rcn_fast.testing.peers import torch_loop_sample
from tests.test_sampling import chi_square_pvalue, exact_ordered_subset_probs


@pytest.mark.parametrize("first", ["uniform", "relevance"])
def test_torch_loop_peer_samples_the_model(first):
    torch = pytest.importorskip("torch")
    n, k, d, draws = 6, 3, 5, 6_000
    rng = np.random.default_rng(11)
    q = (rng.standard_normal((1, d)) * 0.6).astype(np.float32)
    e = (rng.standard_normal((1, n, d)) * 0.6).astype(np.float32)
    probs = exact_ordered_subset_probs(q[0], e[0], k, 1.0, first)
    ids = torch_loop_sample(torch.from_numpy(q), torch.from_numpy(e), draws, k, tau=1.0, seed=3,
                            first=first)[0].numpy()
    keys, counts = np.unique(ids, axis=0, return_counts=True)
    observed = {tuple(int(x) for x in row): int(c) for row, c in zip(keys, counts)}
    assert chi_square_pvalue(observed, probs, draws) > 1e-3
    wrong = exact_ordered_subset_probs(q[0], e[0], k, 1.0, first, use_mean=False)
    assert chi_square_pvalue(observed, wrong, draws) < 1e-2
