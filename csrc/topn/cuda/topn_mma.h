// Tensor-core top-n scan for float16/bfloat16 corpora (topn/cuda/topn_mma.cu).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "common/problems.h"

namespace rcn_fast::cuda {

// Largest k of the tensor-core scan (its lists live in shared memory).
constexpr int64_t kTopnMmaMaxK = 256;

// Why the tensor-core scan cannot serve `p` on the current device (nullptr:
// it can): float32 corpus, k > kTopnMmaMaxK, d % 8 != 0, corpus rows not
// 16-byte aligned, compute capability below 8.0, ... It never reads the
// query values: float32 queries on a float16/bfloat16 corpus are split into
// terms of the corpus dtype, which needs finite queries (a row with a NaN or
// +-inf scores NaN everywhere, so its results are all padding). The caller
// checks (rcn_fast/search/topn.py asks for the tiled kernel instead).
const char* topn_mma_unsupported(const TopnProblem& p);

// Enqueues the scan on `stream` (a query-split kernel, the scan, the merge);
// scratch from cudaMallocAsync. Requires topn_mma_unsupported(p) == nullptr.
void topn_mma(const TopnProblem& p, cudaStream_t stream);

}  // namespace rcn_fast::cuda
