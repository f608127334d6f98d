// The one-pass selections of topn/topn_block_select.h on CUDA: the block
// select of the GEMM tiles (issue 45, the tiled top-n of
// rcn_fast/search/cuda_tiled.py: float32 score tiles from cuBLAS, each row
// selected in one pass by blocks of 256 threads), the merge of per-slice
// lists (also the tensor-core scan's last step), and the torch backend's
// finishing of a chunk (no host synchronisation).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "common/problems.h"
#include "topn/cuda/topn_launch.h"
#include "topn/topn_block_select.h"

namespace rcn_fast::cuda {

// The version of the GEMM tiles + block select (bench/gpu_results records
// it as "topn_tiled"; rcn_fast/_crossovers.py ignores measurements of
// another version).
// Version 2 (issue 55): block_select_kernel<TERMS> (no local memory), the
// stream order of rcn_fast/search/cuda_tiled.py fixed.
constexpr int kTopnTiledKernelVersion = 2;

// Block (slice, q) selects the k best of columns [slice * w, slice * w + w)
// of query q's row of the tile (w = slice_cols(R, slices), topn_block_select.h)
// into part_s / part_i [S_total, Qt, k] at slot slot0 + slice, ids + row0.
// 1 <= k <= 1024, Qt <= 65535, a slice's columns < 2^32.
void topn_block_select_cuda(const topn_select::TermTile& tile, int64_t R, int64_t k, int64_t row0,
                            int64_t slices, float* part_s, int64_t* part_i, int64_t slot0, cudaStream_t stream);

// One block per query: the k best of its S lists (part [S, Q, k]) into
// out_s / out_i [Q, k].
void topn_merge_lists_cuda(const float* part_s, const int64_t* part_i, int64_t S, int64_t Q, int64_t k,
                           float* out_s, int64_t* out_i, cudaStream_t stream);

// One block per query row: TopnFinishProblem (common/problems.h).
void topn_finish_rows_cuda(const TopnFinishProblem& p, cudaStream_t stream);

}  // namespace rcn_fast::cuda
