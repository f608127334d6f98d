// Test aid for the Gram sampler (sampling/cuda/sampling_gram.cu), which
// cannot run without a GPU: its Gram matrix made through the same
// mma.m16n8k16 fragments (sampling/sampling_gram.h) by a host emulation of
// the instruction written from the PTX ISA's fragment layout (float16 /
// bfloat16), or by the same per-entry FMA order (float32); its relevances
// in the kernel's order; its subsets by sampling/sampling_gram.h's
// run_subset with one lane. Slow; for tests only.
#pragma once

#include "common/problems.h"

namespace rcn_fast {

SamplingResult sample_subsets_gram_emulated(const SamplingProblem& p);

// The Gram matrix [npad, npad] of question b as the kernel makes it (npad =
// n rounded up to 16; rows and columns past n are zero). For tests.
void sampling_gram_matrix_emulated(const SamplingProblem& p, int64_t b, float* G);

}  // namespace rcn_fast
