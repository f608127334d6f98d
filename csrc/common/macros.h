// Shared by the CPU and CUDA code: one spelling for host-device functions.
#pragma once
#if defined(__CUDACC__)
#define RCN_HD __host__ __device__ __forceinline__
#else
// static: each translation unit keeps its own copy, so a copy compiled with
// AVX2 flags (csrc/*/isa/*) can never be linked into baseline code.
#define RCN_HD static inline
#endif
