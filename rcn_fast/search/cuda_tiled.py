"""The CUDA top-n for many queries, the way FAISS does it
(faiss/gpu/impl/Distance.cu: tiles of about 512 queries x 256k-512k rows,
a float32 GEMM into a bounded buffer per tile, the tiles alternating between
two streams; faiss/gpu/utils/BlockSelectKernel.cuh: one block per query row
selects the k best in one pass), with rcn_fast's ordering rules.

Per tile of up to :data:`TILE_QUERIES` queries and as many corpus rows as
keep the tile's float32 scores within :data:`TILE_SCORE_BYTES`:

1. the GEMM, ``torch.mm`` with float32 output (cuBLAS; for a float16 or
   bfloat16 corpus the products are exact and summed in float32, a float32
   query split into two or three terms of the corpus dtype stacked as rows of
   the same GEMM, as in :mod:`rcn_fast.search.torch_backend`);
2. the block select (``rcn_fast._cuda.topn_block_select``,
   csrc/topn/cuda/topn_block_select.cu): each query row in ``S`` slices, one
   block of 256 threads a slice, one pass over its scores (a split query's
   terms scaled and summed as the torch backend sums them) with the running
   selection of csrc/topn/topn_select.h (threshold, buffer, flushes): the
   slice's k best by (score desc, id asc), NaN and -inf never kept;

tile ``j`` on stream ``j % 2``, so the GEMM of one tile overlaps the select
of the one before; each tile's lists go to their own slots of a ``[S_total,
Qt, k]`` buffer. Then one block a query merges its lists
(``topn_merge_lists``). No host synchronisation; the scores of a tile are the
only buffer that grows with the corpus, and it is bounded.

Stream order (as FAISS's Distance.cu prepares the queries on the main stream
before ``streamWait``): each query tile's left side (the split of float32
queries into terms, a kernel on the current stream) is enqueued first, then
the side streams wait for the current stream, so their GEMMs and selects
read finished terms and scales and run after the previous tile's merge;
the current stream waits for both before the merge. Everything runs under
the inputs' device (``torch.cuda.device``), so the merge and the split use
that device's stream on any GPU (issue 55: W1, C2).

The dispatcher runs this kernel (``topn_tiled`` in
:mod:`rcn_fast._crossovers`) only where a recorded run on the same GPU
measured it at least as fast as the torch backend; ``backend="cuda"`` runs
it for ``Q >=`` :data:`MIN_QUERIES` (16) or where the tensor-core scan
cannot serve the call.
"""

from __future__ import annotations

from typing import Any

from rcn_fast import _arrays as A
from rcn_fast import _native
from rcn_fast.search.torch_backend import mm_f32, mm_out_dtype_supported, split_query

#: Queries of a tile (FAISS: 512).
TILE_QUERIES = 512
#: Bytes of a tile's float32 scores (all terms): 512 queries x 256k rows.
TILE_SCORE_BYTES = 512 << 20
#: Columns of a slice at least (four rounds of the block select).
MIN_SLICE_COLS = 4096
#: Blocks the slices of a tile aim at, per multiprocessor.
BLOCKS_PER_SM = 2
#: ``backend="cuda"`` picks the GEMM tiles from this many queries (below,
#: the tensor-core scan where it can serve). 16 (issue 55, S1): from 16
#: queries the scan takes query groups of 16 or 32 in 88-137 KB of shared
#: memory a block (one block, 4 warps, an SM at d = 768) and reads the corpus
#: once per group without double buffering, where a GEMM reads it once per
#: 512 queries; the GEMM tiles run on cuBLAS. Chosen over redesigning the
#: scan's buffers because the GEMM tiles and their block select are tested
#: on the host and need no new kernel.
MIN_QUERIES = 16

_STREAMS: dict[int, tuple[Any, Any]] = {}
_SMS: dict[int, int] = {}


def _streams(torch: Any, device: Any) -> tuple[Any, Any]:
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _STREAMS:
        _STREAMS[index] = (torch.cuda.Stream(device), torch.cuda.Stream(device))
    return _STREAMS[index]


def multiprocessors(torch: Any, device: Any) -> int:
    """The multiprocessors of a CUDA device (asked once)."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _SMS:
        _SMS[index] = int(torch.cuda.get_device_properties(index).multi_processor_count)
    return _SMS[index]


def tile_shape(n_queries: int, n_rows: int, terms: int, sms: int) -> tuple[int, int, int]:
    """``(queries, rows, slices)`` of a tile: up to :data:`TILE_QUERIES`
    queries; rows keeping ``terms * queries * rows`` float32 scores within
    :data:`TILE_SCORE_BYTES` (a multiple of 256, at least
    :data:`MIN_SLICE_COLS`, at most the corpus); slices so that a tile has
    about ``BLOCKS_PER_SM * sms`` blocks, each slice at least
    :data:`MIN_SLICE_COLS` columns."""
    qt = max(1, min(n_queries, TILE_QUERIES))
    rows = TILE_SCORE_BYTES // (4 * terms * qt)
    rows = max(MIN_SLICE_COLS, rows // 256 * 256)
    rows = max(1, min(rows, n_rows))
    want = max(1, -(-BLOCKS_PER_SM * sms // qt))
    slices = max(1, min(want, -(-rows // MIN_SLICE_COLS)))
    return qt, rows, slices


def topn_tiled(queries: Any, corpus: Any, k: int) -> tuple[Any, Any]:
    """Exact top-k of CUDA tensors by GEMM tiles and block selects.

    Parameters
    ----------
    queries : CUDA tensor [Q, d]
        float32 or the corpus dtype.
    corpus : CUDA tensor [N, d]
        float32, float16 or bfloat16, on the queries' device.
    k : int
        ``1 <= k <= min(N, 1024)``.

    Returns
    -------
    scores : float32 [Q, k], ids : int64 [Q, k] (``(-inf, -1)`` where no
    admissible score is left), on the corpus's device.
    """
    import torch

    mod, why = _native.cuda_module()
    if mod is None or not hasattr(mod, "topn_block_select"):
        raise RuntimeError(f"the GEMM tiles need rcn_fast._cuda with topn_block_select: {why or 'an older build'}")
    dev = corpus.device
    n_q, n = int(queries.shape[0]), int(corpus.shape[0])
    out_s = torch.empty((n_q, k), dtype=torch.float32, device=dev)
    out_i = torch.empty((n_q, k), dtype=torch.int64, device=dev)
    if n_q == 0:
        return out_s, out_i
    ct = str(corpus.dtype).removeprefix("torch.")
    split = ct != "float32" and queries.dtype != corpus.dtype
    terms = {"float16": 2, "bfloat16": 3}[ct] if split else 1
    out_ok = ct != "float32" and mm_out_dtype_supported(torch, dev, corpus.dtype)
    with A.on_device(corpus):
        side = _streams(torch, dev)
        sms = multiprocessors(torch, dev)
        qt, rows, slices = tile_shape(n_q, n, terms, sms)
        n_tiles = -(-n // rows)
        cur = torch.cuda.current_stream(dev)
        for q0 in range(0, n_q, qt):
            q1 = min(n_q, q0 + qt)
            lhs, scales = _lhs(torch, queries[q0:q1], ct, split)  # on cur
            part_s = torch.empty((n_tiles * slices, q1 - q0, k), dtype=torch.float32, device=dev)
            part_i = torch.empty((n_tiles * slices, q1 - q0, k), dtype=torch.int64, device=dev)
            for st in side:  # after the split (and the previous tile's merge) were enqueued
                st.wait_stream(cur)
            for j in range(n_tiles):
                r0 = j * rows
                block = corpus[r0 : r0 + rows]
                st = side[j % 2]
                with torch.cuda.stream(st):
                    s = mm_f32(torch, lhs, block, out_ok) if ct != "float32" else torch.mm(lhs, block.T)
                    mod.topn_block_select(s, terms, scales, int(block.shape[0]), k, r0, slices, part_s, part_i,
                                          j * slices, st.cuda_stream)
            for st in side:
                cur.wait_stream(st)
            mod.topn_merge_lists(part_s, part_i, out_s[q0:q1], out_i[q0:q1], cur.cuda_stream)
    return out_s, out_i


def _lhs(torch: Any, q: Any, ct: str, split: bool) -> tuple[Any, Any]:
    """The GEMM's left side for queries ``q`` [Qt, d] and the terms' scales
    (flat [T * Qt], or None for one term)."""
    if ct == "float32":
        return q.float(), None
    if not split:
        return q, None
    terms, scales = split_query(torch, q, ct)
    return terms, scales.view(-1)
