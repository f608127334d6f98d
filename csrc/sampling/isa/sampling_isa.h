// Interface between the subset-sampling driver (sampling/cpu/sampling.cpp, baseline
// flags) and its ISA-specific inner loops (sampling/isa/sampling_dots.cpp and
// sampling/isa/sampling_steps.cpp, compiled once per SIMD variant). Declarations
// and plain structs only, for the reason given in topn/isa/topn_isa.h.
#pragma once
#include <cstdint>

namespace rcn_fast {

// out[r][j] = dot(x[r], e_j) for r < nx, j < n, accumulated in float32;
// x[r] are d contiguous floats, e_j = e + j * e_stride.
struct SamplingDotsArgs {
  const float* const* x;
  int64_t nx;
  const float* e;
  int64_t e_stride;
  int64_t n, d;
  float* const* out;
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

// Step t of G subsets of one question (subset indices s0 .. s0 + G - 1):
// for each, the draw of sampling/subset_sampler.h (sample_step, one lane),
// its output written at ids_out[g * out_stride] (and logp_out), the chosen
// candidate marked ineligible and stored in chosen[g] (-1: none left).
// Returns 0, or 2 when a score / tau is not finite (nothing else written).
struct SamplingDrawArgs {
  const float* rel;        // [n]
  const float* acc;        // [G, n]
  uint8_t* eligible;       // [G, n]
  float* w;                // [n] scratch
  int64_t n, G;
  float inv_tau;
  bool first_relevance;
  uint64_t seed, stream;
  int64_t s0, t;
  int64_t* ids_out;        // subset g, step t at ids_out[g * out_stride]
  float* logp_out;         // same layout, or null
  int64_t out_stride;
  int64_t* chosen;         // [G]
};

namespace generic {
void sampling_dots(const SamplingDotsArgs& a);
void sampling_convert(const SamplingConvertArgs& a);
int sampling_draw_step(const SamplingDrawArgs& a);
}  // namespace generic
namespace avx2 {
void sampling_dots(const SamplingDotsArgs& a);
void sampling_convert(const SamplingConvertArgs& a);
int sampling_draw_step(const SamplingDrawArgs& a);
}  // namespace avx2

}  // namespace rcn_fast
