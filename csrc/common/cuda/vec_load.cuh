// 16-byte loads of kernel elements as float32, for the CUDA kernels that
// stream rows (the sampler's dot products, the top-n scan). A "pack" is 8
// consecutive elements: one 16-byte load of float16/bfloat16, two of float32.
// The caller guarantees 16-byte alignment (rows whose start and stride are
// multiples of 16 bytes); elements past the last whole pack are loaded one
// by one (load_as_float).
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "common/dtypes.h"

namespace rcn_fast::cuda {

constexpr int kPack = 8;  // elements a pack

// Whether `p` and every row stride (in elements of `bytes_per_element`) keep
// 16-byte alignment.
inline bool aligned16(const void* p, int64_t bytes_per_element, int64_t stride_a, int64_t stride_b = 0) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0 && (stride_a * bytes_per_element) % 16 == 0 &&
         (stride_b * bytes_per_element) % 16 == 0;
}

__device__ __forceinline__ float2 bf16x2_to_float2(uint32_t w) {
  return make_float2(__uint_as_float(w << 16), __uint_as_float(w & 0xFFFF0000u));
}

__device__ __forceinline__ float2 halfx2_to_float2(uint32_t w) {
  __half2 h;
  static_assert(sizeof h == sizeof w, "half2 is 32 bits");
  memcpy(&h, &w, sizeof w);
  return __half22float2(h);
}

// The 8 elements at p (16-byte aligned) as float32, read through the
// read-only cache.
template <DType T>
__device__ __forceinline__ void load_pack(const typename Storage<T>::type* p, float (&x)[kPack]) {
  if constexpr (T == DType::F32) {
    const float4 a = __ldg(reinterpret_cast<const float4*>(p));
    const float4 b = __ldg(reinterpret_cast<const float4*>(p) + 1);
    x[0] = a.x; x[1] = a.y; x[2] = a.z; x[3] = a.w;
    x[4] = b.x; x[5] = b.y; x[6] = b.z; x[7] = b.w;
  } else {
    const uint4 v = __ldg(reinterpret_cast<const uint4*>(p));
    const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float2 f = T == DType::F16 ? halfx2_to_float2(w[i]) : bf16x2_to_float2(w[i]);
      x[2 * i] = f.x;
      x[2 * i + 1] = f.y;
    }
  }
}

// dot(x, y) over d elements by a group of G lanes (G divides 32, the group's
// lanes consecutive; `sub` is the lane's rank in it). Every lane of the warp
// must call it (the reduction shuffles over the full warp); each group gets
// its own sum on all its lanes. kVec: x and y 16-byte aligned -> packs of 8,
// the last d % 8 elements one by one; else element by element.
template <int G, bool kVec, DType TX, DType TY>
__device__ __forceinline__ float group_dot(const typename Storage<TX>::type* x,
                                           const typename Storage<TY>::type* y, int64_t d, int sub,
                                           bool active) {
  float s = 0.f;
  if (active) {
    int64_t tail = 0;
    if constexpr (kVec) {
      const int64_t packs = d / kPack;
#pragma unroll 2
      for (int64_t c = sub; c < packs; c += G) {
        if constexpr (TX == DType::F32 && TY == DType::F32) {
          // two float4 halves: 8 fewer live registers (sample_kernel<F32>
          // spilled on sm_90 at its 128-register bound), the same FMA order
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const float4 a = __ldg(reinterpret_cast<const float4*>(x + c * kPack) + h);
            const float4 b = __ldg(reinterpret_cast<const float4*>(y + c * kPack) + h);
            s = fmaf(a.x, b.x, s);
            s = fmaf(a.y, b.y, s);
            s = fmaf(a.z, b.z, s);
            s = fmaf(a.w, b.w, s);
          }
        } else {
          float a[kPack], b[kPack];
          load_pack<TX>(x + c * kPack, a);
          load_pack<TY>(y + c * kPack, b);
#pragma unroll
          for (int i = 0; i < kPack; ++i) s = fmaf(a[i], b[i], s);
        }
      }
      tail = packs * kPack;
    }
    for (int64_t e = tail + sub; e < d; e += G) s = fmaf(load_as_float<TX>(x + e), load_as_float<TY>(y + e), s);
  }
#pragma unroll
  for (int o = G / 2; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
  return s;
}

}  // namespace rcn_fast::cuda
