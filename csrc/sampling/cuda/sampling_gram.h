// CUDA launcher of the Gram sampler (sampling/sampling_gram.h; same contract
// as sampling/cpu/sampling.h): one block of 8 warps per question makes the
// question's Gram matrix and relevances in shared memory (tensor cores for
// float16/bfloat16, float32 FMAs for float32), then its warps run the
// subsets' steps from them.
#pragma once
#include <cuda_runtime.h>

#include "common/problems.h"

namespace rcn_fast::cuda {

// The Gram sampler's version (bench/gpu_results records it as
// "sample_subsets_gram"; rcn_fast/_crossovers.py ignores measurements of
// another version).
// Version 2 (issue 55): --fmad=false (the CPU's roundings).
constexpr int kSamplingGramKernelVersion = 2;

// Why the Gram sampler cannot serve `p` (nullptr: it can): more than
// gram::kMaxN candidates, a GPU below compute capability 8.0 for
// float16/bfloat16.
const char* sample_subsets_gram_unsupported(const SamplingProblem& p);

// Like sample_subsets_cuda: synchronises the stream once at the end to read
// the error flags.
SamplingResult sample_subsets_gram_cuda(const SamplingProblem& p, cudaStream_t stream);

}  // namespace rcn_fast::cuda
