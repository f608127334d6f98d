// The tensor-core instructions of the CUDA kernels: mma.sync m16n8k16 with
// float16 or bfloat16 inputs and float32 accumulation (every product
// exact, the sums float32), and mma.sync m16n8k32 with int8 inputs and
// int32 accumulation (exact). Fragment layouts: PTX ISA, "Matrix Fragments
// for mma.m16n8k16" (topn/cuda/topn_mma.cu, sampling/sampling_gram.h) and
// "for mma.m16n8k32" (topn/topn_int8_scan.h).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "common/dtypes.h"

namespace rcn_fast::cuda {

template <DType T>
__device__ __forceinline__ void mma16816(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                         uint32_t b0, uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  if constexpr (T == DType::F16) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  }
#else
  __trap();  // the launcher never runs this kernel below compute capability 8.0
#endif
}

// c += a b for a 16 x 32 s8 A (a[4]), a 32 x 8 s8 B (b[2]), int32 c[4].
__device__ __forceinline__ void mma16832_s8(int32_t (&c)[4], const uint32_t* a, const uint32_t* b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#else
  __trap();  // the launcher never runs this kernel below compute capability 8.0
#endif
}

}  // namespace rcn_fast::cuda
