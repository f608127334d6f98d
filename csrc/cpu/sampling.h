// Relevance-based subset sampling (ReConnect eqs. 4-6) on the CPU: the
// launcher around the shared per-step logic of common/subset_sampler.h.
#pragma once
#include <cstdint>

#include "common/problems.h"

namespace rcn_fast {

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
