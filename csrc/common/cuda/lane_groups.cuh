// The groups of cooperating lanes that run the shared selection code of
// topn/topn_select.h and topn/topn_block_select.h on the device: one warp,
// or one block. (The host runs the same code with one thread:
// topn/cpu/serial_group.h.) any(p): p on some lane, on every lane (a
// barrier of the group).
#pragma once
#include <cuda_runtime.h>

namespace rcn_fast::cuda {

struct WarpG {
  __device__ int rank() const { return int(threadIdx.x & 31u); }
  __device__ int size() const { return 32; }
  __device__ void sync() const { __syncwarp(); }
  __device__ int claim(int* c) const { return atomicAdd(c, 1); }
  __device__ bool any(bool p) const { return __any_sync(0xffffffffu, p) != 0; }
};

struct BlockG {
  __device__ int rank() const { return int(threadIdx.x); }
  __device__ int size() const { return int(blockDim.x); }
  __device__ void sync() const { __syncthreads(); }
  __device__ int claim(int* c) const { return atomicAdd(c, 1); }
  __device__ bool any(bool p) const { return __syncthreads_or(int(p)) != 0; }
};

}  // namespace rcn_fast::cuda
