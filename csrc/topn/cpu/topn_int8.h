// The int8 bounded scan on the CPU (topn/topn_int8.h; the CUDA kernel is
// topn/cuda/topn_int8.h): lo / hi [Q, N] of TopnInt8Problem.
#pragma once

#include "common/problems.h"

namespace rcn_fast {

void topn_int8_intervals(const TopnInt8Problem& p, int num_threads);

}  // namespace rcn_fast
