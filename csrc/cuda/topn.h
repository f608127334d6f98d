// CUDA launcher of the exact top-n scan (same contract as cpu/topn.h).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "common/problems.h"

namespace rcn_fast::cuda {

// Largest k the selection kernel keeps in shared memory.
constexpr int64_t kTopnMaxK = 1024;

// Scans the corpus in chunks: a tiled score kernel fills a [Q, chunk]
// buffer, then one block per query merges the chunk into its running top-k
// (radix select on topn_key, ties by lower id, bitonic sort of the k kept).
// Enqueued on `stream`; scratch is allocated with cudaMallocAsync.
void topn_cuda(const TopnProblem& p, cudaStream_t stream);

}  // namespace rcn_fast::cuda
