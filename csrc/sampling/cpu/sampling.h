// Relevance-based subset sampling (ReConnect eqs. 4-6) on the CPU: the
// launcher around the shared per-step logic of sampling/subset_sampler.h.
#pragma once
#include <cstdint>

#include "common/problems.h"

namespace rcn_fast {

// Fills ids_out (and logp_out); a failure is reported in the SamplingResult
// (common/problems.h). Results depend only on each question's inputs, seed
// and key: not on num_threads (<= 0: default_num_threads()).
SamplingResult sample_subsets_cpu(const SamplingProblem& p, int num_threads);

}  // namespace rcn_fast

namespace rcn_fast {

// Test aid for the CUDA launcher, which cannot run without a GPU: the same
// per-step logic run by `lanes` (1..32) host threads that cooperate like the
// lanes of a warp (collectives emulate the warp's butterfly reductions and
// shuffle scans in the same order), the dot products summed in the kernel's
// order (8 lanes each, FMAs; `vec`: its 16-byte loads of aligned rows, else
// element by element). Slow; for tests only. logp_out may be null. Returns
// like sample_subsets_cpu.
SamplingResult sample_subsets_lanes(const SamplingProblem& p, int lanes, bool vec = true);

}  // namespace rcn_fast
