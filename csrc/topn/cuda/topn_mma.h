// Tensor-core top-n scan for float16/bfloat16 corpora (topn/cuda/topn_mma.cu).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "common/problems.h"
#include "topn/cuda/topn_launch.h"

namespace rcn_fast::cuda {

// Why the tensor-core scan cannot serve `p` on the current device (nullptr:
// it can): float32 corpus, k > kTopnMmaMaxK, d % 8 != 0, corpus rows not
// 16-byte aligned, compute capability below 8.0, ... It never reads the
// query values: float32 queries on a float16/bfloat16 corpus are split into
// terms of the corpus dtype (topn/topn_select.h: a non-finite query value
// is the first term as it is, so it scores as in a float32 GEMM).
const char* topn_mma_unsupported(const TopnProblem& p);

// The split of queries [Q, d] (float32, or the corpus dtype: one term) into
// terms [T, Q, dpad] of the corpus dtype (bits, zero past d) and scales
// [T, Q] (topn/topn_select.h), one block a row, on `stream`.
void topn_split_queries_cuda(const void* queries, DType query_dtype, int64_t query_stride, int64_t Q, int d, int dpad,
                             DType corpus_dtype, uint16_t* terms, float* scales, cudaStream_t stream);

// Enqueues the scan on `stream` (a query-split kernel, the scan, the merge);
// scratch from cudaMallocAsync. Requires topn_mma_unsupported(p) == nullptr.
void topn_mma(const TopnProblem& p, cudaStream_t stream);

}  // namespace rcn_fast::cuda
