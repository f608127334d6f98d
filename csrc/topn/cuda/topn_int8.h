// The int8 bounded scan's search on CUDA (topn/topn_int8_scan.h): one pass
// over the int8 codes that filters while it scans (a running k-th lower
// bound per query, candidates into a bounded buffer by an atomic counter),
// tensor-core mma.m16n8k32.s8 dot products for three or more queries,
// __dp4a for one or two, the query words in registers.
#pragma once
#include <cuda_runtime.h>

#include "topn/topn_int8_scan.h"

namespace rcn_fast::cuda {

// The version of the int8 scan (bench/gpu_results records it as
// "topn_int8"; rcn_fast/_crossovers.py ignores measurements of another).
// Version 2 (issue 55): launches split over gridDim.y, aligned inputs
// checked. Version 3 (issue 55, S2): the filter inside the kernel, IMMA for
// many queries, no [Q, N] intervals, no host synchronisation a chunk.
constexpr int kTopnInt8KernelVersion = 3;

// Enqueues the search of `st` (device pointers; st.count and st.bound as
// the caller set them) on `stream`.
void topn_int8_scan_cuda(const topn_int8::ScanState& st, cudaStream_t stream);

}  // namespace rcn_fast::cuda
