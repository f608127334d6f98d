"""Philox4x32-10 in numpy: the twin of csrc/common/philox.h.

The sampler's random numbers are a pure function of ``(seed, stream,
subset, step)``: key = the 64-bit seed, counter = (stream id as two 32-bit
words, subset, step). Nothing is stateful, so every backend and every
thread produces the same numbers for the same question.
"""

from __future__ import annotations

import numpy as np

_M0, _M1 = 0xD2511F53, 0xCD9E8D57
_W0, _W1 = 0x9E3779B9, 0xBB67AE85
_MASK32 = 0xFFFFFFFF


def philox4x32_10(
    counter: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray], key: tuple[int, int]
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Ten Philox4x32 rounds.

    Parameters
    ----------
    counter : four uint32 arrays (broadcastable), the counter words c0..c3
    key : two Python ints < 2**32, the key words k0, k1

    Returns
    -------
    Four uint32 arrays of the broadcast shape.
    """
    c0, c1, c2, c3 = (np.asarray(c, dtype=np.uint32) for c in counter)
    c0, c1, c2, c3 = np.broadcast_arrays(c0, c1, c2, c3)
    k0, k1 = int(key[0]) & _MASK32, int(key[1]) & _MASK32
    for _ in range(10):
        p0 = c0.astype(np.uint64) * np.uint64(_M0)
        p1 = c2.astype(np.uint64) * np.uint64(_M1)
        hi0, lo0 = (p0 >> np.uint64(32)).astype(np.uint32), (p0 & np.uint64(_MASK32)).astype(np.uint32)
        hi1, lo1 = (p1 >> np.uint64(32)).astype(np.uint32), (p1 & np.uint64(_MASK32)).astype(np.uint32)
        c0, c1, c2, c3 = hi1 ^ c1 ^ np.uint32(k0), lo1, hi0 ^ c3 ^ np.uint32(k1), lo0
        k0, k1 = (k0 + _W0) & _MASK32, (k1 + _W1) & _MASK32
    return c0, c1, c2, c3


def sampler_uniform(seed: int, streams: np.ndarray, subsets: np.ndarray, step: int | np.ndarray) -> np.ndarray:
    """The sampler's uniform numbers in [0, 1) (24 random bits, float32).

    Parameters
    ----------
    seed : int in [0, 2**64)
    streams : int64 array, one stream id per question (reinterpreted as uint64)
    subsets : int array of subset indices (broadcast against ``streams``)
    step : draw index within the subset

    Returns
    -------
    float32 array of the broadcast shape of ``streams``, ``subsets`` and ``step``.
    """
    s = np.asarray(streams, dtype=np.int64).view(np.uint64)
    lo = (s & np.uint64(_MASK32)).astype(np.uint32)
    hi = (s >> np.uint64(32)).astype(np.uint32)
    x0, _, _, _ = philox4x32_10(
        (lo, hi, np.asarray(subsets, dtype=np.uint32), np.asarray(step, dtype=np.uint32)),
        (seed & _MASK32, (seed >> 32) & _MASK32),
    )
    return ((x0 >> np.uint32(8)).astype(np.float32) * np.float32(1.0 / 16777216.0)).astype(np.float32)
