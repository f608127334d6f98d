"""The int8 bounded scan's search on a GPU (issue 55, S2 and S6): the
orchestration of ``rcn_fast._cuda.topn_int8_scan`` (csrc/topn/topn_int8_scan.h;
the bounds and the exactness argument: :mod:`rcn_fast.search.int8_bounded`).

One kernel pass over the int8 codes filters while it scans: each query
keeps a running lower bound on T (its k-th largest ``lo``) in device memory,
raised as the blocks go, and only the (query, row) pairs with ``hi`` at or
above it are written, with their ``lo`` and ``hi``, to a candidate buffer
by an atomic counter. The host waits once, for the count (and how many
candidates survive the final filter), after the pass: when the count
exceeds the buffer, the pass runs again with a buffer of that size and the
bounds found so far (it then writes no more; nothing is dropped). On the
device, T is the k-th largest ``lo`` among a query's candidates (every row
with ``lo >= T`` is one) and the candidates with ``hi >= T`` are rescored
from the original rows in chunks of at most :data:`RESCORE_BYTES` (S6: no
[candidates, d] float32 tensor; rows on the host are gathered a chunk at a
time), their k best by (score desc, id asc) the result.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rcn_fast import _arrays as A
from rcn_fast import _native

#: Bytes of one candidate slot (query int32, row int64, lo and hi float32).
SLOT_BYTES = 20
#: A query batch whose first candidate buffer would exceed this is split in halves.
CANDIDATE_BYTES = 1 << 30
#: float32 bytes of a rescoring chunk's rows (and as many of its queries' rows).
RESCORE_BYTES = 1 << 28


def capacity(n_queries: int, k: int, sms: int) -> int:
    """A first candidate buffer for ``n_queries`` queries: about k a block
    of a query group (each block's own k-th ``lo`` bounds the rows it
    writes until the blocks' shared bound overtakes it), twice over, plus
    room for ties."""
    groups = -(-n_queries // 8)
    blocks = max(1, -(-4 * sms // groups))
    return n_queries * (2 * k * blocks + 1024)


def search(queries: Any, qcodes: np.ndarray, params: np.ndarray, codes: Any, bounds: Any, rows: Any,
           k: int) -> tuple[Any, Any]:
    """The k best rows of ``queries`` [Q, d] (torch, float32 values) by the
    int8 copy ``codes`` [N, width] int8 and ``bounds`` [N, 3] float32 (CUDA
    tensors; codes 16-byte aligned), with the query terms ``qcodes`` [Q, 2,
    width] int8 and ``params`` [Q, 5] float32 (numpy, from
    ``int8_bounded.query_terms``); ``rows`` [N, d] the original rows (on the
    codes' device or the host). ``1 <= k <= N``. Scores [Q, k] float32 and
    ids [Q, k] int64 on the codes' device."""
    import torch

    from rcn_fast.search.cuda_tiled import multiprocessors

    mod, why = _native.cuda_module()
    if mod is None or not hasattr(mod, "topn_int8_scan"):
        raise RuntimeError(f"the int8 scan on a GPU needs rcn_fast._cuda with topn_int8_scan: {why}")
    dev = codes.device
    n_q = int(qcodes.shape[0])
    with A.on_device(codes):  # the codes' device current while the search runs (issue 55, C2)
        sms = multiprocessors(torch, dev)
        if n_q > 1 and capacity(n_q, k, sms) * SLOT_BYTES > CANDIDATE_BYTES:
            half = n_q // 2
            a = search(queries[:half], qcodes[:half], params[:half], codes, bounds, rows, k)
            b = search(queries[half:], qcodes[half:], params[half:], codes, bounds, rows, k)
            return torch.cat([a[0], b[0]]), torch.cat([a[1], b[1]])
        qi, j = _candidates(torch, mod, torch.from_numpy(qcodes).to(dev), torch.from_numpy(params).to(dev), codes,
                            bounds, k, capacity(n_q, k, sms))
        q = queries if A.is_torch(queries) else torch.from_numpy(np.asarray(queries, np.float32))
        scores = _rescore(torch, q.to(dev).float(), rows, qi, j)
        return best_per_query_torch(torch, qi, j, scores, n_q, k)


def _candidates(torch: Any, mod: Any, qcodes: Any, params: Any, codes: Any, bounds: Any, k: int,
                cap: int) -> tuple[Any, Any]:
    """(query, row) of the pairs with hi >= T, by the scan and one host
    synchronisation (two where the first buffer overflowed)."""
    dev, n_q = codes.device, int(qcodes.shape[0])
    stream = torch.cuda.current_stream(dev).cuda_stream
    bound = torch.zeros(n_q, dtype=torch.int32, device=dev)  # no bound yet (key 0)
    count = torch.zeros(1, dtype=torch.int64, device=dev)
    while True:
        cand_q = torch.full((cap,), n_q, dtype=torch.int32, device=dev)  # n_q: a slot no candidate took
        cand_j = torch.empty(cap, dtype=torch.int64, device=dev)
        cand_lo = torch.empty(cap, dtype=torch.float32, device=dev)
        cand_hi = torch.empty(cap, dtype=torch.float32, device=dev)
        count.zero_()
        with A.on_device(codes):  # on the codes' device, with its stream (issue 55, C2)
            mod.topn_int8_scan(codes, bounds, qcodes, params, k, bound, cand_q, cand_j, cand_lo, cand_hi, count,
                               stream)
        keep = final_filter(torch, cand_q, cand_lo, cand_hi, n_q, k)
        total, kept = (int(v) for v in torch.stack([count[0], keep.sum()]).tolist())  # the host waits here
        if total <= cap:
            break
        cap = total  # again with the bounds found: it writes at most as many
    first = torch.sort((~keep).to(torch.uint8), stable=True).indices[:kept]  # the kept slots, in slot order
    return cand_q[first].long(), cand_j[first]


def final_filter(torch: Any, cand_q: Any, cand_lo: Any, cand_hi: Any, n_q: int, k: int) -> Any:
    """Which slots hold a pair with hi >= T, T the k-th largest lo among
    its query's candidates (-inf with fewer than k), on the device (no host
    synchronisation; slots with query ``n_q`` took no candidate)."""
    dev, cap = cand_q.device, int(cand_q.shape[0])  # cap >= 1
    valid = cand_q < n_q
    ninf = torch.tensor(float("-inf"), device=dev)
    lo = torch.where(valid, cand_lo, ninf)
    order = torch.sort(lo, descending=True, stable=True).indices
    order = order[torch.sort(cand_q[order], stable=True).indices]  # by query, lo descending within
    counts = torch.zeros(n_q + 1, dtype=torch.int64, device=dev).index_add_(
        0, cand_q.long(), torch.ones(cap, dtype=torch.int64, device=dev))
    start = torch.cumsum(counts, 0) - counts
    kth = lo[order][(start[:n_q] + k - 1).clamp(max=cap - 1)]
    t = torch.where(counts[:n_q] >= k, kth, ninf)
    t = torch.cat([t, torch.tensor([float("inf")], device=dev)])  # a free slot is never kept
    return valid & (cand_hi >= t[cand_q.long()])


def _rescore(torch: Any, q: Any, rows: Any, qi: Any, j: Any) -> Any:
    """float32 scores of the pairs (qi, j) from the original rows, a chunk
    of at most RESCORE_BYTES of float32 rows at a time (S6); rows on the
    host are gathered there chunk by chunk."""
    dev, n, d = q.device, int(j.shape[0]), int(q.shape[1])
    scores = torch.empty(n, dtype=torch.float32, device=dev)
    step = max(1, RESCORE_BYTES // (4 * max(1, d)))
    on_device = A.is_torch(rows) and rows.device == dev
    if not on_device:
        host = A.to_numpy(rows) if A.is_torch(rows) else rows
        j_host = j.cpu().numpy()
    for c0 in range(0, n, step):
        c1 = min(n, c0 + step)
        if on_device:
            x = rows.index_select(0, j[c0:c1])
        else:
            x = torch.from_numpy(np.ascontiguousarray(host[j_host[c0:c1]])).to(dev)
        scores[c0:c1] = (q.index_select(0, qi[c0:c1]) * x.float()).sum(1)
    return scores


def best_per_query_torch(torch: Any, qi: Any, j: Any, scores: Any, n_q: int, k: int) -> tuple[Any, Any]:
    """The k best candidates of each query by (score desc, id asc), padded
    with (-inf, -1), in torch ops on the candidates' device."""
    dev = scores.device
    # stable sorts, the last key first: each sorts the permutation so far (a
    # loop over a tuple of the keys sorted the reordered arrays by the
    # original keys' order: found running this path through the stand-in of
    # tests/cuda_standin.py, issue 55)
    perm = torch.sort(j, stable=True).indices
    perm = perm[torch.sort(scores[perm], stable=True, descending=True).indices]
    perm = perm[torch.sort(qi[perm], stable=True).indices]
    qi, j, scores = qi[perm], j[perm], scores[perm]
    start = torch.searchsorted(qi, torch.arange(n_q, device=dev))
    pos = torch.arange(qi.shape[0], device=dev) - start[qi]
    take = pos < k
    out_s = torch.full((n_q, k), float("-inf"), dtype=torch.float32, device=dev)
    out_i = torch.full((n_q, k), -1, dtype=torch.int64, device=dev)
    out_s[qi[take], pos[take]] = scores[take]
    out_i[qi[take], pos[take]] = j[take]
    return out_s, out_i
