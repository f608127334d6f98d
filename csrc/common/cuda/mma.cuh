// One tensor-core instruction shared by the CUDA kernels: mma.sync
// m16n8k16 with float16 or bfloat16 inputs and float32 accumulation (every
// product exact, the sums float32). Fragment layouts: PTX ISA, "Matrix
// Fragments for mma.m16n8k16" (topn/cuda/topn_mma.cu, sampling/sampling_gram.h).
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

}  // namespace rcn_fast::cuda
