"""Exact top-n past the memory wall: an int8 copy of the corpus scanned
first, with a proven interval for every score, and the few rows that can
still be among the k best rescored from the float16/float32 rows.

The ids (and scores) equal those of an exact search whose scores are the
rescoring's float32 dot products, by construction: nothing here estimates.

Build (once, :func:`quantize_rows`): each corpus row ``x_j`` (its stored
float16/float32 values) gets a float32 scale ``s_j = max|x_j| / 127``
(1 for a zero row), int8 codes ``c_j = round(x_j / s_j)`` (zero-padded to a
multiple of 16 columns), and two bounds, computed in float64 and rounded up
to float32 (after a 2^-40 relative inflation that covers float64's own
rounding): ``n_j >= ||x^_j||_2`` with ``x^_j = s_j c_j``, and
``e_j >= ||x_j - x^_j||_2``.

Query (:func:`query_terms`): a float32 query ``q`` (the values the
rescoring uses) gets ``s_q = max|q| / 127`` and two int8 terms
``c1 = round(q / s_q)``, ``c2 = round(256 (q / s_q - c1))``, so that
``q^ = s_q (c1 + c2 / 256)``; in float64, rounded up the same way:
``rho >= ||q - q^||_2``, ``nu >= ||q||_2``, ``gamma_nu >= gamma_d nu`` with
``gamma_d = d u' / (1 - d u')``, ``u' = 2^-23``; ``eta = (2 d + 32) 2^-149``.

The derivation. Let ``t_j = <q, x_j>`` (real numbers) and ``f_j`` the float32
score the rescoring computes: float32 products and sums in some order. For
any order, with every operation off by at most ``u'`` relative (one unit in
the last place: round to nearest, and also truncation, as tensor cores may
accumulate) plus underflow (at most ``2^-149`` an operation),
``|f_j - t_j| <= gamma_d sum_i |q_i x_ji| + eta`` (Higham, Accuracy and
Stability, section 3.1), and by Cauchy-Schwarz ``sum_i |q_i x_ji| <=
||q|| ||x_j|| <= nu (n_j + e_j)``. Next, ``t_j = <q^, x^_j> + <q - q^, x^_j> +
<q, x_j - x^_j>``, where ``<q^, x^_j> = s_q s_j (I1 + I2 / 256)`` with the
integer dot products ``I1 = <c1, c_j>``, ``I2 = <c2, c_j>`` (exact in int32,
and exact in float32 for widths up to 1032: ``|I| < 2^24``), and by
Cauchy-Schwarz ``|<q - q^, x^_j>| <= rho n_j``, ``|<q, x_j - x^_j>| <= nu e_j``.
The scan computes ``A = (s_q s_j) (I1 + I2 / 256)`` in float32: three roundings,
``|A - <q^, x^_j>| <= 3.001 u |A|`` (u = 2^-24). So

    |f_j - A| <= R_j = rho n_j + nu e_j + gamma_nu (n_j + e_j) + eta + 3.001 u |A|.

The scan computes the radius with every product and sum rounded to nearest
on its own (csrc/topn/topn_int8.h): ``r = (rho n_j + nu e_j + gamma_nu (n_j +
e_j) + eta + 16 u |A|) (1 + 2^-19)``. Its terms are non-negative, so the
computed sum is at least ``(1 - 9.01 u)`` times the exact one; the factor
``1 + 2^-19 = 1 + 32 u``, itself rounded, leaves ``r >= (1 + 21 u) R_j +
12.99 u |A|``; that margin covers the last rounding of ``lo = A - r`` and
``hi = A + r`` (at most ``u (|A| + r)``). Hence ``lo_j <= f_j <= hi_j`` for
every row, with ``lo`` and ``hi`` as computed.

Selection. Let ``T`` be the k-th largest ``lo`` of the query. The k rows
with ``lo >= T`` have ``f >= T``; any row with ``hi < T`` has ``f < T``, so
it cannot be among the k best (not even tied). The rows with ``hi >= T``
(the candidates, the k rows among them) are rescored, and their k best by
(score desc, id asc) are the exact result. The scan keeps, while it runs,
only the rows whose ``hi`` reaches a running bound: the k-th largest ``lo``
of some of the rows seen so far (a CPU thread's rows, in
csrc/topn/cpu/topn_int8.h; a CUDA block's, raised for every block in device
memory, in :mod:`rcn_fast.search.int8_cuda`), never above ``T``: a superset
of the candidates, filtered by ``T`` at the end. No [Q, N] intervals are
written. The rescoring reads the candidates' rows a bounded chunk at a
time (issue 55, S6).

The CPU variants (csrc/topn/isa/topn_int8_scan.cpp) compute ``A`` from
``I = 256 I1 + I2``, the dot product of the 16-bit term ``256 c1 + c2``
(one product for both terms), as ``RN(I) / 256``: ``I1 + I2 / 256`` is
``I / 256`` exactly and its one rounding is ``RN(I) / 256`` (no underflow),
so the interval is the same to the bit (csrc/topn/topn_int8.h).

What it needs: finite rows (the build refuses others) and finite query
values whose bounds stay far from float32's range (else the call is served
by the exact search on the rows): ``nu`` times the largest row bound below
:data:`MAX_PRODUCT` (no overflow), and ``s_q`` times the smallest row scale
at least :data:`MIN_SCALE_PRODUCT` (``2^-100``). The three-roundings bound on
``A`` holds only while ``fl(s_q s_j)`` is a normal float32: a subnormal
product (``max|q| max|x_j| < 127^2 2^-126``, about 1.9e-34) is off by up to
``2^-150`` absolute, which ``|I1 + I2 / 256|`` (up to ``2^24``) turns into
an error far above ``eta``; the interval could then miss the score (issue
55, W4). With ``s_q s_j >= 2^-100``, ``A`` is normal or exactly 0. Its cost: one read of the int8 codes
(half the bytes of float16) and of 12 bytes a row of bounds, then the
candidates' rows; the candidates number about k where the k best stand out
from the rest by more than the interval's width (about ``2 nu e_j``:
roughly 0.02 for unit-norm 768-d rows), more where many rows score within
it (duplicates, a zero query: every row). On the CPU the integer dot
products cost about half the float32 scan's multiply-adds a query and row,
so the bounded scan pays where the scan is bound by memory (few queries:
docs/retrieval.md has the figures).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rcn_fast import _arrays as A
from rcn_fast import _native
from rcn_fast.search.reference import select_topn

U = 2.0**-24
U_PRIME = 2.0**-23
#: Widest padded row the scan takes (its integer dot products convert to float32 exactly).
MAX_WIDTH = 1032
#: Widest rows an int8 copy is built for.
MAX_DIM = 1024
#: float64 bounds are inflated by this before they are rounded up to float32.
INFLATE64 = 1.0 + 2.0**-40
#: A query is served by the exact search when nu * the largest row bound exceeds this.
MAX_PRODUCT = 1e36
#: ... or when its scale times the smallest row scale is below this (a
#: subnormal ``s_q * s_j`` breaks the bound on A; see the module docstring).
MIN_SCALE_PRODUCT = 2.0**-100
#: Rows of a chunk of the reference's scan: its intervals take 8 * Q * rows bytes at most this many.
CHUNK_BYTES = 1 << 30
#: float32 bytes of the rows one rescoring step gathers (issue 55, S6).
RESCORE_BYTES = 1 << 26


def width_of(d: int) -> int:
    """Columns of the int8 codes of ``d``-wide rows: ``d`` rounded up to 16."""
    return -(-d // 16) * 16


class _Xp:
    """The few array operations the bounds need, on numpy arrays or on torch
    tensors (any device): one formula for the CPU and the GPU build."""

    def __init__(self, like: Any):
        self.torch = A.is_torch(like)
        if self.torch:
            import torch

            self.t, self.dev = torch, like.device

    def f64(self, a: Any) -> Any:
        return a.to(self.t.float64) if self.torch else np.asarray(a, dtype=np.float64)

    def f32(self, a: Any) -> Any:
        return a.to(self.t.float32) if self.torch else np.asarray(a).astype(np.float32)

    def amax(self, a: Any) -> Any:
        if a.shape[1] == 0:
            return self.zeros((a.shape[0],), "float64")
        return a.abs().amax(1) if self.torch else np.abs(a).max(1)

    def codes(self, t: Any, lo: int) -> Any:
        """round half to even, clipped to [lo, 127]."""
        return self.t.clamp(self.t.round(t), lo, 127) if self.torch else np.clip(np.rint(t), lo, 127)

    def norm(self, a: Any) -> Any:
        if self.torch:
            return self.t.sqrt(self.t.einsum("ij,ij->i", a, a))
        return np.sqrt(np.einsum("ij,ij->i", a, a))

    def up(self, x: Any) -> Any:
        """float64 values as float32, rounded up (after a 2^-40 inflation)."""
        x = self.f64(x) * INFLATE64
        f = self.f32(x)
        if self.torch:
            inf = self.t.tensor(float("inf"), dtype=self.t.float32, device=self.dev)
            return self.t.where(self.f64(f) < x, self.t.nextafter(f, inf), f)
        return np.where(f.astype(np.float64) < x, np.nextafter(f, np.float32(np.inf)), f).astype(np.float32)

    def scale(self, amax: Any) -> Any:
        """float32 scales ``amax / 127``; 1 where that is 0."""
        s = self.f32(self.f64(amax) / 127.0)
        return self.t.where(s > 0, s, 1.0) if self.torch else np.where(s > 0, s, np.float32(1.0)).astype(np.float32)

    def zeros(self, shape: tuple[int, ...], dtype: str) -> Any:
        if self.torch:
            return self.t.zeros(shape, dtype=getattr(self.t, dtype), device=self.dev)
        return np.zeros(shape, dtype)


@dataclass
class Int8Copy:
    """The int8 copy of a corpus: codes [N, width] int8, rows [N, 3]
    float32 (scale, norm bound, residual bound), the rows' width ``dim``."""

    codes: Any
    rows: Any
    dim: int
    _largest: float | None = field(default=None, repr=False, compare=False)
    _smallest_scale: float | None = field(default=None, repr=False, compare=False)

    def __len__(self) -> int:
        return int(self.codes.shape[0])

    @property
    def width(self) -> int:
        return int(self.codes.shape[1])

    def largest_bound(self) -> float:
        """The largest ``norm + err`` of a row (for the overflow guard;
        computed once)."""
        if self._largest is None:
            r = self.rows
            if A.is_torch(r):
                self._largest = float((r[:, 1].double() + r[:, 2].double()).max()) if len(r) else 0.0
            else:
                self._largest = float((r[:, 1].astype(np.float64) + r[:, 2]).max()) if len(r) else 0.0
        return self._largest

    def smallest_scale(self) -> float:
        """The smallest row scale ``s_j`` (for the underflow guard;
        computed once; 1 for an empty copy)."""
        if self._smallest_scale is None:
            r = self.rows
            if not len(r):
                self._smallest_scale = 1.0
            else:
                self._smallest_scale = float(r[:, 0].min())
        return self._smallest_scale

    def to(self, device: Any) -> "Int8Copy":
        """The copy as torch tensors on ``device``."""
        import torch

        def move(a: Any) -> Any:
            return (a if A.is_torch(a) else torch.from_numpy(np.ascontiguousarray(a))).to(device)

        return Int8Copy(move(self.codes), move(self.rows), self.dim, self.largest_bound(), self.smallest_scale())


def quantize_rows(x: Any) -> tuple[Any, Any]:
    """int8 codes [n, width] and bounds [n, 3] (scale, norm, err) of rows
    ``x`` [n, d] (float16 or float32, finite; see the module docstring), in
    the library and on the device of ``x`` (numpy, or torch: a GPU builds
    the copy of 1M rows in a fraction of a second)."""
    xp = _Xp(x)
    x64 = xp.f64(x)
    n, d = x64.shape
    scale = xp.scale(xp.amax(x64))
    s64 = xp.f64(scale)[:, None]
    c = xp.codes(x64 / s64, -127)
    codes = xp.zeros((n, width_of(d)), "int8")
    codes[:, :d] = c
    xhat = s64 * c
    rows = xp.zeros((n, 3), "float32")
    rows[:, 0] = scale
    rows[:, 1] = xp.up(xp.norm(xhat))
    rows[:, 2] = xp.up(xp.norm(x64 - xhat))
    return codes, rows


def build_int8(embeddings: Any, chunk: int = 1 << 16) -> Int8Copy:
    """The int8 copy of ``embeddings`` [N, d] (float16/float32, finite rows,
    ``d <= MAX_DIM``; numpy, or a torch tensor: the copy is then built on its
    device and returned there), in chunks of ``chunk`` rows."""
    n, d = (int(v) for v in embeddings.shape)
    if d > MAX_DIM:
        raise ValueError(f"embeddings: an int8 copy takes rows of at most {MAX_DIM} values, got {d}")
    xp = _Xp(embeddings)
    codes, rows = xp.zeros((n, width_of(d)), "int8"), xp.zeros((n, 3), "float32")
    for s in range(0, n, chunk):
        block = embeddings[s : s + chunk] if xp.torch else np.asarray(embeddings[s : s + chunk])
        finite = (block.isfinite() if xp.torch else np.isfinite(block)).all(1)
        if not bool(finite.all()):
            bad = s + int((~finite).nonzero()[0][0])
            raise ValueError(f"embeddings: row {bad} holds NaN or inf; an int8 copy needs finite rows")
        codes[s : s + chunk], rows[s : s + chunk] = quantize_rows(block)
    return Int8Copy(codes, rows, d)


def query_terms(q: np.ndarray, width: int) -> tuple[np.ndarray, np.ndarray]:
    """Two int8 terms [Q, 2, width] and the parameters [Q, 5] (scale, rho,
    nu, gamma nu, eta) of float32 queries ``q`` [Q, d] (finite)."""
    xp = _Xp(np.zeros(0))
    q64 = np.asarray(q, dtype=np.float32).astype(np.float64)
    n_q, d = q64.shape
    scale = xp.scale(xp.amax(q64))
    s64 = scale.astype(np.float64)[:, None]
    t = q64 / s64
    c1 = xp.codes(t, -127)
    c2 = xp.codes((t - c1) * 256.0, -128)
    qcodes = np.zeros((n_q, 2, width), np.int8)
    qcodes[:, 0, :d], qcodes[:, 1, :d] = c1, c2
    res = q64 - s64 * (c1 + c2 / 256.0)
    gamma = d * U_PRIME / (1.0 - d * U_PRIME)
    nu64 = xp.norm(q64)
    params = np.empty((n_q, 5), np.float32)
    params[:, 0] = scale
    params[:, 1] = xp.up(xp.norm(res))
    params[:, 2] = xp.up(nu64)
    params[:, 3] = xp.up(gamma * nu64 * INFLATE64)
    params[:, 4] = np.float32((2 * d + 32) * 2.0**-149)
    return qcodes, params


def intervals_reference(codes: np.ndarray, rows: np.ndarray, qcodes: np.ndarray,
                        params: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """lo, hi [Q, n] in numpy, operation for operation as
    csrc/topn/topn_int8.h computes them (float32, each rounded on its own)."""
    f32 = np.float32
    c = codes.astype(np.float64)
    i1 = (qcodes[:, 0].astype(np.float64) @ c.T).astype(f32)  # exact integers, exactly in float32
    i2 = (qcodes[:, 1].astype(np.float64) @ c.T).astype(f32)
    qp = [params[:, i : i + 1].astype(f32) for i in range(5)]
    s, nrm, err = (rows[:, i][None, :].astype(f32) for i in range(3))
    a = i1 + i2 * f32(0.00390625)
    ahat = (qp[0] * s) * a
    r = qp[1] * nrm
    r = r + qp[2] * err
    r = r + qp[3] * (nrm + err)
    r = r + qp[4]
    r = r + f32(9.5367431640625e-07) * np.abs(ahat)
    r = r * f32(1.0000019073486328125)
    return (ahat - r).astype(f32), (ahat + r).astype(f32)


def rescore_reference(q: np.ndarray, x: np.ndarray) -> np.ndarray:
    """float32 scores [C] of paired rows: float32 products summed in float32."""
    return np.einsum("ij,ij->i", np.asarray(q, np.float32), np.asarray(x, dtype=np.float32))


def aligned16(a: Any) -> Any:
    """``a`` (numpy or torch), copied where its first element is not 16-byte
    aligned: the int8 scans read the codes 16 bytes at a time, and the
    bindings refuse an unaligned start (an offset view)."""
    ptr = a.data_ptr() if A.is_torch(a) else a.ctypes.data
    if ptr % 16 == 0:
        return a
    if A.is_torch(a):
        return a.clone(memory_format=A._torch().contiguous_format)
    buf = np.empty(a.nbytes + 16, np.uint8)
    off = (-buf.ctypes.data) % 16
    out = buf[off : off + a.nbytes].view(a.dtype).reshape(a.shape)
    out[...] = a
    return out


def _native_intervals(codes: np.ndarray, rows: np.ndarray, qcodes: np.ndarray,
                      params: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    mod, _ = _native.cpu_module()
    if mod is None or not hasattr(mod, "topn_int8_intervals"):
        return intervals_reference(codes, rows, qcodes, params)
    lo = np.empty((qcodes.shape[0], codes.shape[0]), np.float32)
    hi = np.empty_like(lo)
    mod.topn_int8_intervals(aligned16(np.ascontiguousarray(codes)), rows, aligned16(qcodes), params, lo, hi)
    return lo, hi


def servable(queries: np.ndarray, copy: Int8Copy) -> bool:
    """Whether the bounded scan can serve these float32 queries: finite, and
    bounds far from float32's range: no overflow (``nu`` times the largest
    row bound below :data:`MAX_PRODUCT`) and no subnormal ``s_q * s_j``
    (each query's scale times the smallest row scale at least
    :data:`MIN_SCALE_PRODUCT`)."""
    if not np.isfinite(queries).all():
        return False
    if not len(queries) or not len(copy):
        return True
    q64 = queries.astype(np.float64)
    nu = float(np.sqrt(np.einsum("ij,ij->i", q64, q64)).max())
    if not (math.isfinite(nu) and nu * copy.largest_bound() < MAX_PRODUCT):
        return False
    amax = np.abs(q64).max(1) if q64.shape[1] else np.zeros(len(q64))
    s_q = np.where(amax > 0, amax / 127.0, 1.0)  # the query scale (1 for a zero query), as query_terms makes it
    return float(s_q.min()) * copy.smallest_scale() >= MIN_SCALE_PRODUCT


def topn_int8_numpy(queries: np.ndarray, rows: np.ndarray, copy: Int8Copy, k: int, *,
                    chunk: int | None = None, intervals: Any = None) -> tuple[np.ndarray, np.ndarray]:
    """Exact top-k of ``queries`` [Q, d] (float32 values) over ``rows`` [N,
    d] by the int8 bounded scan of ``copy`` (numpy arrays; see the module
    docstring). ``1 <= k <= N``. By default rcn_fast._C's scan filters
    while it runs (:func:`native_candidates`); ``chunk`` (rows a step) or
    ``intervals`` (the scan's function) take the reference's path
    (:func:`candidates_reference`) instead."""
    q = np.ascontiguousarray(queries, dtype=np.float32)
    qcodes, params = query_terms(q, copy.width)
    mod, _ = _native.cpu_module()
    if chunk is None and intervals is None and mod is not None and hasattr(mod, "topn_int8_candidates"):
        qi, j = native_candidates(copy, qcodes, params, k)
    else:
        qi, j = candidates_reference(copy, qcodes, params, k, chunk=chunk, intervals=intervals)
    return _best_per_query(qi, j, rescore_chunked(q, rows, qi, j), q.shape[0], k)


def native_candidates(copy: Int8Copy, qcodes: np.ndarray, params: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """(query, row) of the pairs with ``hi >= T`` (T: the query's k-th
    largest ``lo``; -inf with fewer than k rows), query after query, rows
    ascending, by rcn_fast._C's scan: each thread keeps a running k-th
    largest ``lo`` per query and only the rows whose ``hi`` reaches it
    (csrc/topn/cpu/topn_int8.h), so no [Q, N] intervals are written."""
    mod, _ = _native.cpu_module()
    counts, ids = mod.topn_int8_candidates(aligned16(np.ascontiguousarray(copy.codes)), copy.rows, aligned16(qcodes),
                                           params, k)
    return np.repeat(np.arange(len(counts), dtype=np.int64), counts), ids


def candidates_reference(copy: Int8Copy, qcodes: np.ndarray, params: np.ndarray, k: int, *, chunk: int | None = None,
                         intervals: Any = None) -> tuple[np.ndarray, np.ndarray]:
    """:func:`native_candidates` in numpy: the intervals of ``chunk`` rows at
    a time (``intervals``: the scan's function, default rcn_fast._C's
    intervals, else :func:`intervals_reference`), the k-th largest ``lo``
    seen so far as the running bound, filtered by T at the end."""
    n_q, n = qcodes.shape[0], len(copy)
    scan = intervals or _native_intervals
    chunk = chunk or max(1, CHUNK_BYTES // (8 * max(1, n_q)))
    best = np.full((n_q, 0), -np.inf, np.float32)
    cand_q, cand_j, cand_hi = [], [], []
    for r0 in range(0, n, chunk):
        lo, hi = scan(copy.codes[r0 : r0 + chunk], copy.rows[r0 : r0 + chunk], qcodes, params)
        both = np.concatenate([best, lo], 1)
        kk = min(k, both.shape[1])
        best = -np.partition(-both, kk - 1, axis=1)[:, :kk]
        t_run = best.min(1) if kk == k else np.full(n_q, -np.inf, np.float32)  # the k-th largest lo so far
        qi, j = np.nonzero(hi >= t_run[:, None])
        cand_q.append(qi)
        cand_j.append(j + r0)
        cand_hi.append(hi[qi, j])
    t_final = best.min(1)
    qi, j, hi = np.concatenate(cand_q), np.concatenate(cand_j), np.concatenate(cand_hi)
    keep = hi >= t_final[qi]
    order = np.lexsort((j[keep], qi[keep]))
    return qi[keep][order].astype(np.int64), j[keep][order].astype(np.int64)


def rescore_chunked(q: np.ndarray, rows: Any, qi: np.ndarray, j: np.ndarray,
                    budget: int | None = None) -> np.ndarray:
    """float32 scores of the pairs (query ``qi``, row ``j``; grouped by
    query) by :func:`rescore_reference`, the query's row broadcast (as
    :func:`topn_exact_numpy` scores) and at most ``budget`` bytes of float32
    rows gathered at a time (issue 55, S6: no [candidates, d] arrays)."""
    d = q.shape[1]
    step = max(1, (budget or RESCORE_BYTES) // (4 * max(1, d)))
    scores = np.empty(len(j), np.float32)
    bounds = np.flatnonzero(np.diff(qi)) + 1 if len(qi) else np.zeros(0, np.int64)
    for s0, s1 in zip(np.r_[0, bounds], np.r_[bounds, len(qi)]):
        for c0 in range(int(s0), int(s1), step):
            c1 = min(int(s1), c0 + step)
            scores[c0:c1] = rescore_reference(np.broadcast_to(q[qi[c0]], (c1 - c0, d)), np.asarray(rows[j[c0:c1]]))
    return scores


def _best_per_query(qi: np.ndarray, j: np.ndarray, scores: np.ndarray, n_q: int,
                    k: int) -> tuple[np.ndarray, np.ndarray]:
    """The k best candidates of each query by (score desc, id asc), padded
    with (-inf, -1)."""
    order = np.lexsort((j, -scores, qi))
    qi, j, scores = qi[order], j[order], scores[order]
    start = np.searchsorted(qi, np.arange(n_q))
    pos = np.arange(len(qi)) - start[qi]
    take = pos < k
    out_s = np.full((n_q, k), -np.inf, np.float32)
    out_i = np.full((n_q, k), -1, np.int64)
    out_s[qi[take], pos[take]] = scores[take]
    out_i[qi[take], pos[take]] = j[take]
    return out_s, out_i


def topn_exact_numpy(queries: np.ndarray, rows: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The exact search the bounded scan equals: every row rescored as the
    bounded scan rescores candidates (a test aid; memory Q x N)."""
    q = np.asarray(queries, np.float32)
    n = rows.shape[0]
    scores = np.stack([rescore_reference(np.broadcast_to(q[i], rows.shape), rows) for i in range(len(q))]) \
        if len(q) else np.zeros((0, n), np.float32)
    return select_topn(scores, np.broadcast_to(np.arange(n, dtype=np.int64), scores.shape), k)


@dataclass
class Int8Corpus:
    """A corpus with its int8 copy, for ``rcn_fast.topn(queries,
    Int8Corpus(rows, copy), k)``: the bounded scan of ``copy`` picks the
    candidates, ``rows`` [N, d] (numpy, or torch on the copy's device or the
    host) rescore them. ``copy`` holds numpy arrays for a CPU search, CUDA
    tensors (:meth:`Int8Copy.to`) for a GPU one."""

    rows: Any
    copy: Int8Copy

    def __post_init__(self) -> None:
        if len(self.copy) != int(self.rows.shape[0]) or self.copy.dim != int(self.rows.shape[1]):
            raise ValueError(f"copy: an int8 copy of {len(self.copy)} rows of width {self.copy.dim} does not match "
                             f"rows of shape {tuple(self.rows.shape)}")


def topn_int8(queries: Any, corpus: Int8Corpus, k: int) -> tuple[Any, Any] | None:
    """Exact top-k by the bounded scan (``1 <= k <= N``), in the library and
    on the device of ``queries``; None where it cannot serve the queries
    (non-finite values, bounds near float32's range): the caller searches
    the rows exactly instead."""
    copy = corpus.copy
    on_gpu = A.is_cuda(copy.codes)
    q_host = A.to_float32_numpy(queries)
    if not servable(q_host, copy):
        return None
    if on_gpu:  # query batches of at most 65,535 (the scan's grid takes more; the candidate buffers need not)
        from rcn_fast.search import int8_cuda

        codes = aligned16(copy.codes)
        parts = []
        for q0 in range(0, max(1, q_host.shape[0]), 65535):
            qcodes, params = query_terms(q_host[q0 : q0 + 65535], copy.width)
            parts.append(int8_cuda.search(queries[q0 : q0 + 65535], qcodes, params, codes, copy.rows, corpus.rows, k))
        if len(parts) == 1:
            return parts[0]
        import torch

        return torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])
    rows = A.to_numpy(corpus.rows) if A.is_torch(corpus.rows) else corpus.rows
    plain = copy if not A.is_torch(copy.codes) else Int8Copy(A.to_numpy(copy.codes), A.to_numpy(copy.rows), copy.dim,
                                                              copy.largest_bound(), copy.smallest_scale())
    s, i = topn_int8_numpy(q_host, rows, plain, k)
    return (A.from_numpy_like(queries, s), A.from_numpy_like(queries, i)) if A.is_torch(queries) else (s, i)
