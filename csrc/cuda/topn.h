// CUDA launcher of the exact top-n scan (same contract as cpu/topn.h).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "common/dtypes.h"

namespace rcn_fast::cuda {

// Largest k the selection kernel keeps in shared memory.
constexpr int64_t kTopnMaxK = 1024;

struct TopnProblemCuda {
  const void* queries;  // device [Q, d], unit inner stride
  DType query_dtype;
  int64_t query_stride;
  const void* corpus;   // device [N, d], unit inner stride
  DType corpus_dtype;
  int64_t corpus_stride;
  int64_t Q, N, d, k;   // 1 <= k <= kTopnMaxK
  float* scores_out;    // device [Q, k]
  int64_t* ids_out;     // device [Q, k]
};

// Scans the corpus in chunks: a tiled score kernel fills a [Q, chunk]
// buffer, then one block per query merges the chunk into its running top-k
// (radix select on topn_key, ties by lower id, bitonic sort of the k kept).
// Enqueued on `stream`; scratch is allocated with cudaMallocAsync.
void topn_cuda(const TopnProblemCuda& p, cudaStream_t stream);

}  // namespace rcn_fast::cuda
