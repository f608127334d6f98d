// The 32 lanes of a warp as a sampler lane group (sampling/subset_sampler.h),
// for the CUDA samplers (sampling/cuda/sampling.cu, sampling_gram.cu).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

namespace rcn_fast::cuda {

constexpr unsigned kFull = 0xffffffffu;

// The 32 lanes of a warp as a sampler lane group (see subset_sampler.h).
// Butterfly (xor) reductions: every lane ends with the same bits, because
// each pairwise sum is computed from the same two operands.
struct WarpGroup {
  __device__ __forceinline__ int rank() const { return int(threadIdx.x & 31u); }
  __device__ __forceinline__ int size() const { return 32; }
  __device__ __forceinline__ float sum_f(float x) const {
    for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(kFull, x, o);
    return x;
  }
  __device__ __forceinline__ float max_f(float x) const {
    for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(kFull, x, o));
    return x;
  }
  __device__ __forceinline__ float exscan_f(float x) const {
    const int lane = rank();
    for (int o = 1; o < 32; o <<= 1) {
      const float y = __shfl_up_sync(kFull, x, o);
      if (lane >= o) x += y;
    }
    const float ex = __shfl_up_sync(kFull, x, 1);
    return lane == 0 ? 0.f : ex;
  }
  __device__ __forceinline__ int64_t sum_i(int64_t x) const {
    for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(kFull, (long long)x, o);
    return x;
  }
  __device__ __forceinline__ int64_t exscan_i(int64_t x) const {
    const int lane = rank();
    for (int o = 1; o < 32; o <<= 1) {
      const int64_t y = __shfl_up_sync(kFull, (long long)x, o);
      if (lane >= o) x += y;
    }
    const int64_t ex = __shfl_up_sync(kFull, (long long)x, 1);
    return lane == 0 ? 0 : ex;
  }
  __device__ __forceinline__ int64_t min_i(int64_t x) const {
    for (int o = 16; o > 0; o >>= 1) {
      const int64_t y = __shfl_xor_sync(kFull, (long long)x, o);
      x = y < x ? y : x;
    }
    return x;
  }
  __device__ __forceinline__ int64_t max_i(int64_t x) const {
    for (int o = 16; o > 0; o >>= 1) {
      const int64_t y = __shfl_xor_sync(kFull, (long long)x, o);
      x = y > x ? y : x;
    }
    return x;
  }
};

}  // namespace rcn_fast::cuda
