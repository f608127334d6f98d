// CUDA launcher of the exact top-n scan (same contract as topn/cpu/topn.h).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "common/problems.h"
#include "topn/cuda/topn_launch.h"

namespace rcn_fast::cuda {

// The CUDA top-n algorithms (TopnAlgorithm):
//   Tiled (version 1): scans the corpus in chunks: a tiled float32 score
//     kernel fills a [Q, chunk] buffer, then one block per query merges the
//     chunk into its running top-k (radix select on topn_key, ties by lower
//     id, bitonic sort of the k kept). Any dtype, k <= kTopnMaxK.
//   Mma (version 2, topn/cuda/topn_mma.h): tensor-core scores with the selection
//     fused, float16/bfloat16 corpora, k <= kTopnMmaMaxK.
//   Auto: Mma where it can serve the call (topn_mma_unsupported), else
//     Tiled. Neither looks at the query values (the scan's split of a
//     float32 query scores non-finite values as a float32 GEMM does).
// Enqueued on `stream`; scratch is allocated with cudaMallocAsync.
enum class TopnAlgorithm : int { Auto = 0, Tiled = 1, Mma = 2 };

// The version of the automatic choice's kernels (bench/gpu_results records
// it with every measurement; rcn_fast/_crossovers.py ignores measurements of
// another version).
// Version 3 (issue 55): __launch_bounds__ from the launch table (the
// scan's registers changed), -0.0 keyed as +0.0 in the tiled kernel.
constexpr int kTopnKernelVersion = 3;

void topn_cuda(const TopnProblem& p, cudaStream_t stream, TopnAlgorithm algorithm = TopnAlgorithm::Auto);

}  // namespace rcn_fast::cuda
