// Interface between the subset-sampling driver (cpu/sampling.cpp, baseline
// flags) and its ISA-specific inner loops (cpu/isa/sampling_dots.cpp,
// compiled once per SIMD variant). Declarations and plain structs only, for
// the reason given in cpu/isa/topn_isa.h.
#pragma once
#include <cstdint>

namespace rcn_fast {

// out[r * out_stride + j] = dot(x[r], e_j) for r < nx, j < n, accumulated in
// float32; x[r] are d contiguous floats, e_j = e + j * e_stride.
struct SamplingDotsArgs {
  const float* const* x;
  int64_t nx;
  const float* e;
  int64_t e_stride;
  int64_t n, d;
  float* out;
  int64_t out_stride;
};

// dst[j * d + k] = float(src[j * src_stride + k]) for j < n, k < d, where
// src holds float16 (dtype 1) or bfloat16 (dtype 2) bit patterns.
struct SamplingConvertArgs {
  const uint16_t* src;
  int64_t src_stride;
  int dtype;
  int64_t n, d;
  float* dst;
};

namespace generic {
void sampling_dots(const SamplingDotsArgs& a);
void sampling_convert(const SamplingConvertArgs& a);
}  // namespace generic
namespace avx2 {
void sampling_dots(const SamplingDotsArgs& a);
void sampling_convert(const SamplingConvertArgs& a);
}  // namespace avx2

}  // namespace rcn_fast
