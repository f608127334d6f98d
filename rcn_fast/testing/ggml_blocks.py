"""GGML weight blocks built in numpy, their plain dequantisation, and
llama.cpp's 8-bit activation arithmetic in numpy: the references the native
quantised matrix products (csrc/llm/isa/quant_gemm.cpp, quant_idot.cpp) and
the GGUF files written by the tests are checked against.

Layouts (csrc/llm/quant_blocks.h, from ggml-common.h): Q8_0 ``{f16 d; i8
q[32]}``, Q4_0 ``{f16 d; u8 qs[16]}`` (w = d * (nibble - 8)), Q4_1 ``{f16 d;
f16 m; u8 qs[16]}`` (w = d * nibble + m); nibble j < 16 is the low half of
``qs[j]``, j >= 16 the high half of ``qs[j - 16]``. The K-quants (256
elements a super-block): Q4_K ``{f16 d; f16 dmin; u8 scales[12]; u8
qs[128]}``, Q5_K ``{f16 d; f16 dmin; u8 scales[12]; u8 qh[32]; u8 qs[128]}``,
Q6_K ``{u8 ql[128]; u8 qh[64]; i8 scales[16]; f16 d}``.

Activations (llama.cpp's q8_0/q8_1 and q8_K, as the engine lays them out):
``XBLOCK32`` ``{f32 d; f16 s; i16 sum; i8 q[32]}`` and ``XBLOCK256`` ``{f32 d; i8
q[256]; i16 bsums[16]}``.
"""

from __future__ import annotations

import numpy as np

from rcn_fast.llm.backends.engine.ggml_types import matmul_types

#: name -> GGML type id of the formats the engine multiplies (the one type table, csrc/llm/ggml_types.h)
QTYPES = matmul_types()

#: GGML type ids
F32, F16, Q4_0, Q4_1, Q8_0, Q4_K, Q5_K, Q6_K = (QTYPES[n] for n in ("F32", "F16", "Q4_0", "Q4_1", "Q8_0", "Q4_K",
                                                                     "Q5_K", "Q6_K"))
KQUANTS = (Q4_K, Q5_K, Q6_K)

_DTYPES = {
    Q8_0: np.dtype([("d", "<f2"), ("q", "i1", 32)]),
    Q4_0: np.dtype([("d", "<f2"), ("qs", "u1", 16)]),
    Q4_1: np.dtype([("d", "<f2"), ("m", "<f2"), ("qs", "u1", 16)]),
    Q4_K: np.dtype([("d", "<f2"), ("dmin", "<f2"), ("scales", "u1", 12), ("qs", "u1", 128)]),
    Q5_K: np.dtype([("d", "<f2"), ("dmin", "<f2"), ("scales", "u1", 12), ("qh", "u1", 32), ("qs", "u1", 128)]),
    Q6_K: np.dtype([("ql", "u1", 128), ("qh", "u1", 64), ("scales", "i1", 16), ("d", "<f2")]),
}
#: blocks of smaller largest magnitude quantise to zeros (csrc/llm/quant_blocks.h's kTinyActivation)
TINY = np.float32(1e-30)
XBLOCK32 = np.dtype([("d", "<f4"), ("s", "<f2"), ("sum", "<i2"), ("q", "i1", 32)])
XBLOCK256 = np.dtype([("d", "<f4"), ("q", "i1", 256), ("bsums", "<i2", 16)])
assert XBLOCK32.itemsize == 40 and XBLOCK256.itemsize == 292


def block_of(qtype: int) -> int:
    return 256 if qtype in KQUANTS else 32 if qtype in _DTYPES else 1


def _edge_scales(shape: tuple[int, ...], rng: np.random.Generator, edge: bool, lo: float, hi: float) -> np.ndarray:
    scale = rng.uniform(lo, hi, shape)
    if edge:
        special = np.array([0.0, -0.0, 6.0e-8, -6.0e-8, 65504.0 / 4096, -1.0, 1.0], dtype=np.float64)
        scale.flat[: min(scale.size, len(special))] = special[: scale.size]
    return scale


def random_blocks(qtype: int, n: int, k: int, rng: np.random.Generator, *, edge: bool = False) -> np.ndarray:
    """Random raw rows of a GGML matrix [n, k]: uint8 [n, row bytes]. With
    ``edge`` the scales include 0, -0, negatives, the largest and smallest
    (subnormal) float16 values and the quantised values their extremes."""
    if qtype == F32:
        return rng.standard_normal((n, k)).astype(np.float32).view(np.uint8).reshape(n, -1)
    if qtype == F16:
        return rng.standard_normal((n, k)).astype(np.float16).view(np.uint8).reshape(n, -1)
    blk = block_of(qtype)
    if k % blk:
        raise ValueError(f"k: a quantised row needs a multiple of {blk} elements, got {k}")
    b = np.zeros((n, k // blk), dtype=_DTYPES[qtype])
    for name in _DTYPES[qtype].names:  # every byte field random, then the scales set below
        if name not in ("d", "dmin", "m"):
            info = np.iinfo(_DTYPES[qtype][name].base)
            b[name] = rng.integers(info.min, info.max + 1, b[name].shape)
    if qtype in KQUANTS:
        b["d"] = _edge_scales(b.shape, rng, edge, -0.01, 0.01)
        if qtype != Q6_K:
            b["dmin"] = rng.uniform(-0.01, 0.01, b.shape)
        if edge:  # extreme quants and scales in the first super-block of every row
            for name in ("qs", "ql", "qh"):
                if name in _DTYPES[qtype].names:
                    b[name][:, 0, :4] = [0, 255, 0, 255]
            b["scales"][:, 0, :2] = (-128, 127) if qtype == Q6_K else (0, 255)
        return b.view(np.uint8).reshape(n, -1)
    b["d"] = _edge_scales(b.shape, rng, edge, -0.05, 0.05)
    if qtype == Q8_0:
        if edge:
            b["q"][..., 0], b["q"][..., 1] = -128, 127
    else:
        if edge:
            b["qs"][..., 0], b["qs"][..., 1] = 0, 255
        if qtype == Q4_1:
            m = rng.uniform(-0.2, 0.2, b.shape)
            if edge:
                m.flat[: min(m.size, 3)] = [0.0, -0.0, -65504.0 / 4096][: min(m.size, 3)]
            b["m"] = m
    return b.view(np.uint8).reshape(n, -1)


def _k_scale_min(scales: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """ggml's get_scale_min_k4 for all 8 sub-blocks: (scales, mins), int [..., 8]."""
    s = scales.astype(np.int64)
    sc = np.concatenate([s[..., 0:4] & 63, (s[..., 8:12] & 0xF) | ((s[..., 0:4] >> 6) << 4)], axis=-1)
    mn = np.concatenate([s[..., 4:8] & 63, (s[..., 8:12] >> 4) | ((s[..., 4:8] >> 6) << 4)], axis=-1)
    return sc, mn


def kquant_ints(raw: np.ndarray, qtype: int, k: int) -> tuple[np.ndarray, ...]:
    """The integers of K-quant rows [n, k]: Q4_K/Q5_K -> (q [n, nb, 8, 32],
    scales [n, nb, 8], mins [n, nb, 8], d, dmin); Q6_K -> (q - 32 [n, nb, 16,
    16], scales [n, nb, 16], d); d, dmin float32 [n, nb]."""
    n = raw.shape[0]
    b = np.ascontiguousarray(raw).view(_DTYPES[qtype]).reshape(n, k // 256)
    d = b["d"].astype(np.float32)
    if qtype == Q6_K:
        ql = b["ql"].astype(np.int64).reshape(n, -1, 2, 2, 32)  # [half, lo/hi 32 bytes, 32]
        qh = b["qh"].astype(np.int64).reshape(n, -1, 2, 1, 32)
        parts = [(ql[:, :, :, p & 1] >> (4 * (p >= 2)) & 0xF) | (((qh[:, :, :, 0] >> (2 * p)) & 3) << 4)
                 for p in range(4)]
        q = np.stack(parts, axis=3).reshape(n, -1, 16, 16) - 32  # [half, part, 32] -> 16 sub-blocks of 16
        return q, b["scales"].astype(np.int64), d
    qs = b["qs"].astype(np.int64).reshape(n, -1, 4, 32)
    q = np.stack([qs & 0xF, qs >> 4], axis=3).reshape(n, -1, 8, 32)
    if qtype == Q5_K:
        qh = b["qh"].astype(np.int64)[:, :, None, :]
        q = q + ((qh >> np.arange(8)[None, None, :, None]) & 1) * 16
    sc, mn = _k_scale_min(b["scales"])
    return q, sc, mn, d, b["dmin"].astype(np.float32)


def dequantize(raw: np.ndarray, qtype: int, k: int) -> np.ndarray:
    """The float32 weights [n, k] of raw GGML rows (ggml's dequantize_row_*
    formulas, in float32)."""
    n = raw.shape[0]
    raw = np.ascontiguousarray(raw)
    if qtype == F32:
        return raw.view(np.float32).reshape(n, k).copy()
    if qtype == F16:
        return raw.view(np.float16).reshape(n, k).astype(np.float32)
    if qtype == Q6_K:
        q, sc, d = kquant_ints(raw, qtype, k)
        return ((d[..., None] * sc.astype(np.float32))[..., None] * q.astype(np.float32)).reshape(n, k)
    if qtype in KQUANTS:
        q, sc, mn, d, dmin = kquant_ints(raw, qtype, k)
        scale = d[..., None] * sc.astype(np.float32)
        return (scale[..., None] * q.astype(np.float32) - (dmin[..., None] * mn.astype(np.float32))[..., None]
                ).reshape(n, k)
    b = raw.view(_DTYPES[qtype]).reshape(n, k // 32)
    d = b["d"].astype(np.float32)[..., None]
    if qtype == Q8_0:
        return (d * b["q"].astype(np.float32)).reshape(n, k)
    qs = b["qs"]
    nib = np.concatenate([qs & 15, qs >> 4], axis=-1).astype(np.float32)
    if qtype == Q4_0:
        return (d * (nib - 8.0)).reshape(n, k)
    return (d * nib + b["m"].astype(np.float32)[..., None]).reshape(n, k)


def quantize_activations(x: np.ndarray, qtype: int) -> np.ndarray:
    """Rows of x [M, K] float32 as the engine's 8-bit activation blocks for
    weights of ``qtype`` (XBLOCK32 or XBLOCK256, [M, K / block]): the
    reference quantisers of csrc/llm/quant_blocks.h in numpy float32."""
    x = np.asarray(x, dtype=np.float32)
    M, K = x.shape
    blk = 256 if qtype in KQUANTS else 32
    xb = x.reshape(M, K // blk, blk)
    ax = np.abs(xb)
    finite = np.isfinite(xb).all(-1)
    amax = np.where(finite, ax.max(-1, initial=0.0), 0.0).astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        if blk == 32:
            out = np.zeros((M, K // 32), XBLOCK32)
            d = amax / np.float32(127)
            inv = np.where(amax >= TINY, np.float32(127) / np.maximum(amax, TINY), np.float32(0)).astype(np.float32)
            q = np.rint(np.where(finite[..., None], xb, 0) * inv[..., None]).astype(np.int64)
            out["q"] = q
            out["sum"] = q.sum(-1)
            out["d"] = np.where(finite, d.astype(np.float16).astype(np.float32), np.nan)
            out["s"] = np.where(finite, (d * q.sum(-1).astype(np.float32)).astype(np.float16), np.float16(np.nan))
            return out
        out = np.zeros((M, K // 256), XBLOCK256)
        first = np.take_along_axis(xb, ax.argmax(-1)[..., None], -1)[..., 0]  # the first of largest magnitude
        ok = finite & (amax >= TINY)
        iscale = np.where(ok, np.float32(-127) / np.where(ok, first, 1), np.float32(0)).astype(np.float32)
        q = np.minimum(127, np.rint(np.where(ok[..., None], xb, 0) * iscale[..., None])).astype(np.int64)
        out["q"] = q
        out["bsums"] = q.reshape(M, K // 256, 16, 16).sum(-1)
        out["d"] = np.where(ok, np.float32(1) / np.where(ok, iscale, 1), np.where(finite, 0.0, np.nan))
    return out


def q8_products(x: np.ndarray, raw: np.ndarray, qtype: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """llama.cpp's 8-bit arithmetic for y = x . w^T, exactly: the integer
    block sums times the float32 block scales, summed in float64 ([M, N]),
    and the same sum of the products' magnitudes (the scale of the float32
    rounding of the partial sums)."""
    xa = quantize_activations(x, qtype)
    M, N = x.shape[0], raw.shape[0]
    dx = xa["d"].astype(np.float64)
    out = []
    for f in (lambda a: a, np.abs):  # the value, then the magnitudes
        if qtype in KQUANTS:
            if qtype == Q6_K:
                q, sc, d = kquant_ints(raw, qtype, k)
                y = xa["q"].astype(np.int64).reshape(M, -1, 16, 16)
                sumi = np.einsum("nbs,mnbs->mnb", f(sc), np.einsum("nbsl,mbsl->mnbs", f(q), f(y)))
                terms = [(dx[:, None, :] * d[None].astype(np.float64)) * sumi]
            else:
                q, sc, mn, d, dmin = kquant_ints(raw, qtype, k)
                y = xa["q"].astype(np.int64).reshape(M, -1, 8, 32)
                sumi = np.einsum("nbs,mnbs->mnb", sc, np.einsum("nbsl,mbsl->mnbs", q, f(y)))
                bs = f(xa["q"].astype(np.int64)).reshape(M, -1, 8, 32).sum(-1)
                summ = np.einsum("nbs,mbs->mnb", mn, bs)
                terms = [(dx[:, None, :] * d[None].astype(np.float64)) * sumi,
                         -(dx[:, None, :] * dmin[None].astype(np.float64)) * summ]
        else:
            b = np.ascontiguousarray(raw).view(_DTYPES[qtype]).reshape(N, k // 32)
            if qtype == Q8_0:
                wq = b["q"].astype(np.int64)
            else:
                nib = np.concatenate([b["qs"] & 15, b["qs"] >> 4], axis=-1).astype(np.int64)
                wq = nib - (8 if qtype == Q4_0 else 0)
            sumi = np.einsum("nbj,mbj->mnb", f(wq), f(xa["q"].astype(np.int64)))
            terms = [(b["d"].astype(np.float64)[None] * dx[:, None, :]) * sumi]
            if qtype == Q4_1:
                terms.append(b["m"].astype(np.float64)[None] * xa["s"].astype(np.float64)[:, None, :])
        out.append(sum(np.abs(t).sum(-1) if f is np.abs else t.sum(-1) for t in terms))
    return out[0], out[1]


__all__ = ["F32", "F16", "Q4_0", "Q4_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K", "KQUANTS", "QTYPES", "XBLOCK32", "XBLOCK256",
           "block_of", "random_blocks", "kquant_ints", "dequantize", "quantize_activations", "q8_products"]
