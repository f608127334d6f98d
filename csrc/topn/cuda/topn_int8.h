// The int8 bounded scan on CUDA (topn/topn_int8.h): one pass over the int8
// codes (16-byte loads, eight lanes a row), __dp4a integer dot products
// with up to eight queries' two int8 terms held in shared memory, the
// interval of every (query, row) pair written to lo / hi.
#pragma once
#include <cuda_runtime.h>

#include "common/problems.h"

namespace rcn_fast::cuda {

// The version of the int8 scan (bench/gpu_results records it as
// "topn_int8"; rcn_fast/_crossovers.py ignores measurements of another).
// Version 2 (issue 55): launches split over gridDim.y, aligned inputs checked.
constexpr int kTopnInt8KernelVersion = 2;

void topn_int8_intervals_cuda(const TopnInt8Problem& p, cudaStream_t stream);

}  // namespace rcn_fast::cuda
