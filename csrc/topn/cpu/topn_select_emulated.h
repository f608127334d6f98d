// Test aids for the CUDA top-n scan, which cannot run without a GPU: the
// shared selection (topn/topn_select.h) and query split run on the host
// by one thread, exactly as the kernels sequence them.
#pragma once
#include <cstdint>

#include "common/dtypes.h"
#include "topn/topn_block_select.h"

namespace rcn_fast {

// The scan's two-level selection over precomputed scores [Q, N] (row-major):
// slices of `slice_rows` columns, each scanned in rounds of `round` columns
// with a running selection per query (ids as offsets in the slice), each
// slice's k best listed, then the lists merged in rounds of `merge_round`.
// Fills out_s / out_i [Q, k] like topn_cpu. 1 <= k; slice_rows < 2^32.
void topn_select_emulated(const float* scores, int64_t Q, int64_t N, int64_t k, int64_t slice_rows, int round,
                          int merge_round, float* out_s, int64_t* out_i);

// The scan's split of float32 queries [Q, d] into terms of `corpus`
// (float16 or bfloat16): terms [T, Q, d] (bits), scales [T, Q]. Returns T.
// Non-finite values are split as topn/topn_select.h says.
int topn_split_queries(const float* q, int64_t Q, int64_t d, int64_t q_stride, DType corpus, uint16_t* terms,
                       float* scales);

// The block select of the GEMM tiles (topn/cuda/topn_block_select.cu) over
// one score tile: `slices` slices of each query row selected in rounds of
// `round` candidates (block (slice, query) of the kernel), their lists
// merged in rounds of `merge_round` (block q of the merge kernel). Fills
// out_s / out_i [Qt, k] (ids + row0). 1 <= k; columns of a slice < 2^32.
void topn_block_select_emulated(const topn_select::TermTile& tile, int64_t R, int64_t k, int64_t row0,
                                int64_t slices, int round, int merge_round, float* out_s, int64_t* out_i);

// One chunk of the tiled kernel (version 1, topn/cuda/topn.cu's
// merge_select_kernel) for each of Q queries: the running lists prev [Q, k]
// (ids below the chunk's, in order) and the chunk's scores [Q, rows] (ids
// row0 + column) give next [Q, k], by the kernel's steps run serially: the
// admissible count, the radix select of the k-th largest topn_key (4
// passes of 8 bits), every key above it, then its ties in candidate (= id)
// order, sorted by (score desc, id asc). 1 <= k <= 1024.
void topn_tiled_merge_emulated(const float* prev_s, const int64_t* prev_i, const float* chunk, int64_t Q, int64_t k,
                               int64_t rows, int64_t row0, float* next_s, int64_t* next_i);

}  // namespace rcn_fast
