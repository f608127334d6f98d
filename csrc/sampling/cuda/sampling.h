// CUDA launcher of the subset sampler (same contract as sampling/cpu/sampling.h).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "common/problems.h"

namespace rcn_fast::cuda {

// Two kernels on `stream`: one warp per candidate scores rel = dot(e_q, e_j)
// (and flags NaN/inf); then one warp per (question, subset) runs every step
// of that subset (sampling/subset_sampler.h with a 32-lane group, Philox in
// the kernel). Scratch comes from cudaMallocAsync. Synchronises the stream
// once at the end to read the error flags, reported as on the CPU.
SamplingResult sample_subsets_cuda(const SamplingProblem& p, cudaStream_t stream);

// The kernel's version (2: issue 35's 16-byte loads and hardware float16
// conversion); see kTopnKernelVersion.
// Version 3 (issue 55): __launch_bounds__(512, 1) (the sm_80 launch at 16
// warps failed), --fmad=false (the CPU's roundings).
constexpr int kSamplingKernelVersion = 3;

}  // namespace rcn_fast::cuda
