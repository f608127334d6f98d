// Shared by the CPU and CUDA code: one spelling for host-device functions.
#pragma once
#if defined(__CUDACC__)
#define RCN_HD __host__ __device__ __forceinline__
#else
#define RCN_HD inline
#endif
