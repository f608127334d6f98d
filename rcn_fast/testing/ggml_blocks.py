"""GGML weight blocks built in numpy, and their plain dequantisation: the
reference the native quantised matrix products (csrc/llm/isa/quant_gemm.cpp)
and the GGUF files written by the tests are checked against.

Layouts (csrc/llm/quant_blocks.h): Q8_0 ``{f16 d; i8 q[32]}``, Q4_0
``{f16 d; u8 qs[16]}`` (w = d * (nibble - 8)), Q4_1 ``{f16 d; f16 m; u8 qs[16]}``
(w = d * nibble + m); nibble j < 16 is the low half of ``qs[j]``, j >= 16
the high half of ``qs[j - 16]``.
"""

from __future__ import annotations

import numpy as np

from rcn_fast.llm.backends.engine.ggml_types import matmul_types

#: name -> GGML type id of the formats the engine multiplies (the one type table, csrc/llm/ggml_types.h)
QTYPES = matmul_types()

#: GGML type ids
F32, F16, Q4_0, Q4_1, Q8_0 = (QTYPES[n] for n in ("F32", "F16", "Q4_0", "Q4_1", "Q8_0"))

_DTYPES = {
    Q8_0: np.dtype([("d", "<f2"), ("q", "i1", 32)]),
    Q4_0: np.dtype([("d", "<f2"), ("qs", "u1", 16)]),
    Q4_1: np.dtype([("d", "<f2"), ("m", "<f2"), ("qs", "u1", 16)]),
}


def random_blocks(qtype: int, n: int, k: int, rng: np.random.Generator, *, edge: bool = False) -> np.ndarray:
    """Random raw rows of a GGML matrix [n, k]: uint8 [n, row bytes]. With
    ``edge`` the scales include 0, -0, negatives, the largest and smallest
    (subnormal) float16 values and the quantised values their extremes."""
    if qtype == F32:
        return rng.standard_normal((n, k)).astype(np.float32).view(np.uint8).reshape(n, -1)
    if qtype == F16:
        return rng.standard_normal((n, k)).astype(np.float16).view(np.uint8).reshape(n, -1)
    if k % 32:
        raise ValueError(f"k: a quantised row needs a multiple of 32 elements, got {k}")
    b = np.zeros((n, k // 32), dtype=_DTYPES[qtype])
    scale = rng.uniform(-0.05, 0.05, b.shape)
    if edge:
        special = np.array([0.0, -0.0, 6.0e-8, -6.0e-8, 65504.0 / 4096, -1.0, 1.0], dtype=np.float64)
        scale.flat[: min(scale.size, len(special))] = special[: scale.size]
    b["d"] = scale
    if qtype == Q8_0:
        q = rng.integers(-128, 128, (n, k // 32, 32))
        if edge:
            q[..., 0], q[..., 1] = -128, 127
        b["q"] = q
    else:
        qs = rng.integers(0, 256, (n, k // 32, 16))
        if edge:
            qs[..., 0], qs[..., 1] = 0, 255
        b["qs"] = qs
        if qtype == Q4_1:
            m = rng.uniform(-0.2, 0.2, b.shape)
            if edge:
                m.flat[: min(m.size, 3)] = [0.0, -0.0, -65504.0 / 4096][: min(m.size, 3)]
            b["m"] = m
    return b.view(np.uint8).reshape(n, -1)


def dequantize(raw: np.ndarray, qtype: int, k: int) -> np.ndarray:
    """The float32 weights [n, k] of raw GGML rows (the plain formulas, in float32)."""
    n = raw.shape[0]
    raw = np.ascontiguousarray(raw)
    if qtype == F32:
        return raw.view(np.float32).reshape(n, k).copy()
    if qtype == F16:
        return raw.view(np.float16).reshape(n, k).astype(np.float32)
    b = raw.view(_DTYPES[qtype]).reshape(n, k // 32)
    d = b["d"].astype(np.float32)[..., None]
    if qtype == Q8_0:
        return (d * b["q"].astype(np.float32)).reshape(n, k)
    qs = b["qs"]
    nib = np.concatenate([qs & 15, qs >> 4], axis=-1).astype(np.float32)
    if qtype == Q4_0:
        return (d * (nib - 8.0)).reshape(n, k)
    return (d * nib + b["m"].astype(np.float32)[..., None]).reshape(n, k)


__all__ = ["F32", "F16", "Q4_0", "Q4_1", "Q8_0", "QTYPES", "random_blocks", "dequantize"]
