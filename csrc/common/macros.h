// Shared by the CPU and CUDA code: one spelling for host-device functions.
#pragma once
#if defined(__CUDACC__)
#define RCN_HD __host__ __device__ __forceinline__
#else
// static: each translation unit keeps its own copy, so a copy compiled with
// AVX2 flags (csrc/*/isa/*) can never be linked into baseline code.
#define RCN_HD static inline
#endif

// Member functions of the shared host-device structs (a member cannot be
// static: an inline member has one definition program-wide, so a header
// using it must stay out of the per-ISA sources, csrc/*/isa/).
#if defined(__CUDACC__)
#define RCN_HD_METHOD __host__ __device__ __forceinline__
#else
#define RCN_HD_METHOD inline
#endif
