"""The numba kernel of :func:`rcn_fast.kg.bfs_subgraphs` (imported lazily:
numba is optional). Same algorithm and random stream as
``rcn_fast.kg.sampler.bfs_one_reference``; compiled once and cached on disk."""

import numpy as np
from numba import njit, prange

u64 = np.uint64
# the constants of rcn_fast.kg.sampler (splitmix64)
GOLDEN, C1, C2, C3 = u64(0x9E3779B97F4A7C15), u64(0xBF58476D1CE4E5B9), u64(0x94D049BB133111EB), u64(0x632BE59BD9B4E019)
S30, S27, S31, S11 = u64(30), u64(27), u64(31), u64(11)
ONE = u64(1)
INV53 = 1.0 / 9007199254740992.0


@njit(inline="always", cache=True)
def mix(z):
    z = (z ^ (z >> S30)) * C1
    z = (z ^ (z >> S27)) * C2
    return z ^ (z >> S31)


@njit(parallel=True, cache=True)
def kernel(indptr, indices, slot_edges, heads, num_nodes, centres, p, max_depth, max_nodes, max_edges, seed,
           nchunks, out_nodes, out_depth, out_n, out_edges, out_e):
    C = centres.shape[0]
    per = (C + nchunks - 1) // nchunks
    seedmix = u64(seed) * GOLDEN
    for t in prange(nchunks):
        lo = t * per
        hi = min(C, lo + per)
        if lo >= hi:
            continue
        mark = np.zeros(num_nodes, dtype=np.int32)
        tree_buf = np.empty(max_nodes, dtype=np.int64)
        for ci in range(lo, hi):
            stamp = ci - lo + 1
            c = centres[ci]
            key = mix(seedmix ^ mix(u64(c) + C3))
            k = u64(0)
            cnt = 1
            out_nodes[ci, 0] = c
            out_depth[ci, 0] = 0
            mark[c] = stamp
            nt = 0
            start = 0
            layer = 0
            full = max_nodes <= 1
            while layer < max_depth and not full:
                end = cnt
                if start == end:
                    break
                for i in range(start, end):
                    u = out_nodes[ci, i]
                    for s in range(indptr[u], indptr[u + 1]):
                        v = indices[s]
                        if mark[v] == stamp:
                            continue
                        k += ONE
                        x = float(mix(key + k * GOLDEN) >> S11) * INV53
                        if x >= p:
                            continue
                        mark[v] = stamp
                        out_nodes[ci, cnt] = v
                        out_depth[ci, cnt] = layer + 1
                        tree_buf[nt] = slot_edges[s]
                        nt += 1
                        cnt += 1
                        if cnt >= max_nodes:
                            full = True
                            break
                    if full:
                        break
                start = end
                layer += 1
            ne = 0
            for j in range(nt):
                if ne >= max_edges:
                    break
                out_edges[ci, ne] = tree_buf[j]
                ne += 1
            for i in range(cnt):
                if ne >= max_edges:
                    break
                u = out_nodes[ci, i]
                for s in range(indptr[u], indptr[u + 1]):
                    e = slot_edges[s]
                    if mark[indices[s]] == stamp and heads[e] == u:
                        is_tree = False
                        for j in range(nt):
                            if tree_buf[j] == e:
                                is_tree = True
                                break
                        if not is_tree:
                            out_edges[ci, ne] = e
                            ne += 1
                            if ne >= max_edges:
                                break
            out_n[ci] = cnt
            out_e[ci] = ne

