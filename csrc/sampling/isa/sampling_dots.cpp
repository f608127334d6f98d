// Inner loops of the CPU subset sampler, compiled once per SIMD variant
// (RCN_ISA = generic | avx2; see CMakeLists.txt). Internal linkage or
// namespace rcn_fast::RCN_ISA only, no standard-library templates and no
// shared inline helpers (see topn/isa/topn_isa.h).
//
// sampling_dots scores a few rows (the query, the documents a step chose)
// against every candidate of one question: a thin matrix product, tiled
// RX rows x RE candidates so each loaded candidate vector feeds RX FMAs.
#include <cstdint>
#include <cstring>

#include "common/dtypes.h"
#include "sampling/isa/sampling_isa.h"
#if defined(__FMA__)
#include <immintrin.h>  // intrinsics are always-inline: nothing is emitted out of line
#endif

namespace rcn_fast {
namespace RCN_ISA {
namespace {

#include "common/isa/vec8.h"

constexpr int RE = 3;  // candidates per tile

// acc + x * y: one rounding where the variant has FMA, two otherwise, and
// the same in every instantiation. This file is compiled with
// -ffp-contract=off (CMakeLists.txt), so the compiler never fuses on its own:
// a row's dot products are bit-identical whichever tile shape computed
// them, which keeps the sampler independent of thread count and batching.
inline v8f madd(v8f x, v8f y, v8f acc) {
#if defined(__FMA__)
  return (v8f)_mm256_fmadd_ps((__m256)x, (__m256)y, (__m256)acc);
#else
  return acc + x * y;
#endif
}
inline float madd1(float x, float y, float acc) {
#if defined(__FMA__)
  return __builtin_fmaf(x, y, acc);
#else
  return acc + x * y;
#endif
}

// RX x NE tile: out[r][j0 + c] for r < RX, c < NE (NE <= RE).
template <int RX, int NE>
void tile(const float* const* x, const float* e, int64_t es, int64_t j0, int64_t d,
          float* const* out) {
  v8f acc[RX][NE];
  for (int r = 0; r < RX; ++r)
    for (int c = 0; c < NE; ++c) acc[r][c] = v8f{};
  const float* ej[NE];
  for (int c = 0; c < NE; ++c) ej[c] = e + (j0 + c) * es;
  int64_t k = 0;
  for (; k + 8 <= d; k += 8) {
    v8f ev[NE];
    for (int c = 0; c < NE; ++c) ev[c] = vload(ej[c] + k);
    for (int r = 0; r < RX; ++r) {
      const v8f xv = vload(x[r] + k);
      for (int c = 0; c < NE; ++c) acc[r][c] = madd(xv, ev[c], acc[r][c]);
    }
  }
  for (int r = 0; r < RX; ++r)
    for (int c = 0; c < NE; ++c) {
      float s = hsum(acc[r][c]);
      for (int64_t kk = k; kk < d; ++kk) s = madd1(x[r][kk], ej[c][kk], s);
      out[r][j0 + c] = s;
    }
}

template <int RX>
void rows(const float* const* x, const SamplingDotsArgs& a, float* const* out) {
  int64_t j = 0;
  for (; j + RE <= a.n; j += RE) tile<RX, RE>(x, a.e, a.e_stride, j, a.d, out);
  for (; j < a.n; ++j) tile<RX, 1>(x, a.e, a.e_stride, j, a.d, out);
}

}  // namespace

void sampling_dots(const SamplingDotsArgs& a) {
  int64_t r = 0;
  for (; r + 4 <= a.nx; r += 4) rows<4>(a.x + r, a, a.out + r);
  switch (a.nx - r) {
    case 3: rows<3>(a.x + r, a, a.out + r); break;
    case 2: rows<2>(a.x + r, a, a.out + r); break;
    case 1: rows<1>(a.x + r, a, a.out + r); break;
    default: break;
  }
}

void sampling_convert(const SamplingConvertArgs& a) {
  for (int64_t j = 0; j < a.n; ++j) {
    const uint16_t* src = a.src + j * a.src_stride;
    float* dst = a.dst + j * a.d;
    int64_t k = 0;
    if (a.dtype == 1) {  // float16; else bfloat16
#if defined(RCN_HAVE_FLOAT16)
      for (; k + 8 <= a.d; k += 8) {
        v8h h;
        std::memcpy(&h, src + k, sizeof h);
        const v8f f = __builtin_convertvector(h, v8f);
        std::memcpy(dst + k, &f, sizeof f);
      }
      for (; k < a.d; ++k) {
        _Float16 h;
        std::memcpy(&h, src + k, sizeof h);
        dst[k] = float(h);
      }
#else
      for (; k < a.d; ++k) dst[k] = half_to_float(src[k]);
#endif
    } else {
      for (; k + 8 <= a.d; k += 8) {
        v8u16 h;
        std::memcpy(&h, src + k, sizeof h);
        const v8u32 w = __builtin_convertvector(h, v8u32) << 16;
        std::memcpy(dst + k, &w, sizeof w);
      }
      for (; k < a.d; ++k) {
        const uint32_t w = uint32_t(src[k]) << 16;
        std::memcpy(dst + k, &w, sizeof w);
      }
    }
  }
}

}  // namespace RCN_ISA
}  // namespace rcn_fast
