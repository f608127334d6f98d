// The problem descriptions shared by the CPU and CUDA launchers (one struct
// each, so the bindings fill them the same way; pointers are host memory for
// the CPU launchers and device memory for the CUDA ones), and the result the
// sampling launchers report.
#pragma once
#include <cstdint>

#include "common/dtypes.h"

namespace rcn_fast {

// Exact top-n maximum inner product search (topn/cpu/topn.h, topn/cuda/topn.h).
struct TopnProblem {
  const void* queries;      // [Q, d] rows of `query_dtype`, unit inner stride
  DType query_dtype;
  int64_t query_stride;     // elements between query rows
  const void* corpus;       // [N, d] rows of `corpus_dtype`, unit inner stride
  DType corpus_dtype;
  int64_t corpus_stride;    // elements between corpus rows
  int64_t Q, N, d, k;       // CUDA: 1 <= k <= cuda::kTopnMaxK
  float* scores_out;        // [Q, k] contiguous
  int64_t* ids_out;         // [Q, k] contiguous
};

// Relevance-based subset sampling, ReConnect eqs. 4-6 (sampling/cpu/sampling.h,
// sampling/cuda/sampling.h).
struct SamplingProblem {
  const float* query;       // [B, d] float32, unit inner stride
  int64_t query_stride;     // elements between query rows
  const void* cand;         // [B, n, d] of `cand_dtype`, unit inner stride
  DType cand_dtype;
  int64_t cand_stride_b;    // elements between questions
  int64_t cand_stride_n;    // elements between candidates
  const uint8_t* mask;      // [B, n] contiguous (1 = valid), or null: all valid
  const int64_t* keys;      // [B] stream id of each question
  int64_t B, n, d;
  int64_t num_subsets, subset_size;
  float inv_tau;            // 1 / tau, finite and > 0
  uint64_t seed;
  bool first_relevance;     // false: first document uniform
  int64_t* ids_out;         // [B, num_subsets, subset_size] contiguous
  float* logp_out;          // same shape, or null
};

// What a sampling launcher reports (CPU and CUDA alike): the first question
// (lowest index) that failed, if any.
enum class SamplingStatus : int {
  Ok = 0,
  NonFiniteCandidate = 1,  // dot(e_q, e_j) is NaN/inf: e_j (or e_q) holds NaN/inf or overflows
  NonFiniteScore = 2,      // a step's score / tau is NaN/inf (overflow)
};

struct SamplingResult {
  SamplingStatus status;
  int64_t question;   // the first question (lowest index) that failed
  int64_t candidate;  // the candidate, for NonFiniteCandidate
};

}  // namespace rcn_fast
