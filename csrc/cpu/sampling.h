// Relevance-based subset sampling (ReConnect eqs. 4-6) on the CPU: the
// launcher around the shared per-step logic of common/subset_sampler.h.
#pragma once
#include <cstdint>

#include "common/dtypes.h"

namespace rcn_fast {

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

// Fills ids_out (and logp_out). Results depend only on each question's
// inputs, seed and key: not on num_threads (<= 0: default_num_threads()).
SamplingResult sample_subsets_cpu(const SamplingProblem& p, int num_threads);

}  // namespace rcn_fast

namespace rcn_fast {

// Test aid for the CUDA launcher, which cannot run without a GPU: the same
// per-step logic run by `lanes` (1..32) host threads that cooperate like the
// lanes of a warp (collectives emulate the warp's butterfly reductions and
// shuffle scans in the same order). Slow; for tests only. logp_out may be
// null. Returns like sample_subsets_cpu.
SamplingResult sample_subsets_lanes(const SamplingProblem& p, int lanes);

}  // namespace rcn_fast
