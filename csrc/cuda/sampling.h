// CUDA launcher of the subset sampler (same contract as cpu/sampling.h).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "common/dtypes.h"

namespace rcn_fast::cuda {

struct SamplingProblemCuda {
  const float* query;       // device [B, d] float32, unit inner stride
  int64_t query_stride;
  const void* cand;         // device [B, n, d] of `cand_dtype`, unit inner stride
  DType cand_dtype;
  int64_t cand_stride_b, cand_stride_n;
  const uint8_t* mask;      // device [B, n] contiguous, or null (all valid)
  const int64_t* keys;      // device [B]
  int64_t B, n, d;
  int64_t num_subsets, subset_size;
  float inv_tau;
  uint64_t seed;
  bool first_relevance;
  int64_t* ids_out;         // device [B, num_subsets, subset_size]
  float* logp_out;          // device, same shape, or null
};

// What went wrong, if anything (mirrors cpu/sampling.h's SamplingResult).
struct SamplingErrorCuda {
  int status;          // 0 ok, 1 non-finite candidate relevance, 2 non-finite score
  int64_t question;
  int64_t candidate;
};

// Two kernels on `stream`: one warp per candidate scores rel = dot(e_q, e_j)
// (and flags NaN/inf); then one warp per (question, subset) runs every step
// of that subset (common/subset_sampler.h with a 32-lane group, Philox in
// the kernel). Scratch comes from cudaMallocAsync. Synchronises the stream
// once at the end to read the error flags.
SamplingErrorCuda sample_subsets_cuda(const SamplingProblemCuda& p, cudaStream_t stream);

}  // namespace rcn_fast::cuda
