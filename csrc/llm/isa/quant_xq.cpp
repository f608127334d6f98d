// The 8-bit activation blocks of llama.cpp's arithmetic (quantize_x,
// llm/isa/quant_isa.h): XBlock32 rows for Q4_0/Q4_1/Q8_0 weights, XBlock256
// for the K-quants, bit for bit the reference quantisers of
// llm/quant_blocks.h in every variant (the same float products, rounding
// half to even, the same largest-magnitude value), compiled once per SIMD
// variant.
#include <cmath>
#include <cstdint>
#include <cstring>
#if defined(__AVX2__) || defined(__AVX512F__)
#include <immintrin.h>
#endif

#include "llm/quant_blocks.h"
#include "llm/isa/quant_isa.h"

namespace rcn_fast {
namespace RCN_ISA {
namespace {

#if defined(__AVX2__)

#include "llm/isa/idot_simd.h"

inline __m256 vabs(__m256 v) { return _mm256_andnot_ps(_mm256_set1_ps(-0.0f), v); }
inline bool all_finite(__m256 a) {  // a: absolute values
  return _mm256_movemask_ps(_mm256_cmp_ps(a, _mm256_set1_ps(3.402823466e38f), _CMP_LE_OQ)) == 0xFF;
}
inline float hmax8(__m256 v) {
  __m128 q = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  q = _mm_max_ps(q, _mm_movehl_ps(q, q));
  q = _mm_max_ss(q, _mm_movehdup_ps(q));
  return _mm_cvtss_f32(q);
}
// round half to even (the default rounding mode, as std::nearbyint), to int32
inline __m256i rint32(__m256 v) { return _mm256_cvtps_epi32(_mm256_round_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)); }
// 32 int32 (four vectors) -> 32 int8 in order
inline __m256i pack32(__m256i a, __m256i b, __m256i c, __m256i d) {
  const __m256i ab = _mm256_packs_epi32(a, b), cd = _mm256_packs_epi32(c, d);
  return _mm256_permutevar8x32_epi32(_mm256_packs_epi16(ab, cd), _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

void quantize_row32(const float* x, int64_t K, XBlock32* out) {
  for (int64_t b = 0; b < K / kQuantBlock; ++b, x += kQuantBlock) {
    __m256 v[4], mx = _mm256_setzero_ps();
    bool finite = true;
    for (int j = 0; j < 4; ++j) {
      v[j] = _mm256_loadu_ps(x + 8 * j);
      finite = finite && all_finite(vabs(v[j]));
      mx = _mm256_max_ps(mx, vabs(v[j]));
    }
    XBlock32& o = out[b];
    if (!finite) {
      set_nonfinite_block(o);
      continue;
    }
    const float amax = hmax8(mx);
    const float d = amax / 127.0f, id = amax >= kTinyActivation ? 127.0f / amax : 0.0f;
    __m256i q[4];
    for (int j = 0; j < 4; ++j) q[j] = rint32(_mm256_mul_ps(v[j], _mm256_set1_ps(id)));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(o.q), pack32(q[0], q[1], q[2], q[3]));
    const int sum = hsum_i32_8(_mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3])));
    o.d = round_to_half(d);
    o.s = float_to_half_bits(d * float(sum));
    o.sum = int16_t(sum);
  }
}

void quantize_row256(const float* x, int64_t K, XBlock256* out) {
  for (int64_t b = 0; b < K / kSuperBlock; ++b, x += kSuperBlock) {
    XBlock256& o = out[b];
    __m256 mx = _mm256_setzero_ps();
    bool finite = true;
    for (int j = 0; j < 32; ++j) {
      const __m256 a = vabs(_mm256_loadu_ps(x + 8 * j));
      finite = finite && all_finite(a);
      mx = _mm256_max_ps(mx, a);
    }
    std::memset(o.bsums, 0, sizeof o.bsums);
    const float amax = hmax8(mx);
    if (!finite || amax < kTinyActivation) {
      o.d = finite ? 0.0f : NAN;
      std::memset(o.q, 0, sizeof o.q);
      continue;
    }
    int first = 0;
    while (std::fabs(x[first]) != amax) ++first;  // the first value of largest magnitude, with its sign
    const float iscale = -127.0f / x[first];
    const __m256 s = _mm256_set1_ps(iscale);
    const __m256i top = _mm256_set1_epi32(127);
    for (int j = 0; j < 8; ++j) {
      __m256i q[4];
      for (int k = 0; k < 4; ++k) q[k] = _mm256_min_epi32(rint32(_mm256_mul_ps(_mm256_loadu_ps(x + 32 * j + 8 * k), s)), top);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(o.q + 32 * j), pack32(q[0], q[1], q[2], q[3]));
      o.bsums[2 * j] = int16_t(hsum_i32_8(_mm256_add_epi32(q[0], q[1])));
      o.bsums[2 * j + 1] = int16_t(hsum_i32_8(_mm256_add_epi32(q[2], q[3])));
    }
    o.d = 1.0f / iscale;
  }
}
#else
void quantize_row32(const float* x, int64_t K, XBlock32* out) { quantize_x32_ref(x, K, out); }
void quantize_row256(const float* x, int64_t K, XBlock256* out) { quantize_x256_ref(x, K, out); }
#endif

}  // namespace

void quantize_x(int qtype, const float* x, int64_t x_stride, int64_t M, int64_t K, uint8_t* out, int64_t out_stride) {
  const QType t = QType(qtype);
  for (int64_t m = 0; m < M; ++m) {
    if (xq_block(t) == kSuperBlock)
      quantize_row256(x + m * x_stride, K, reinterpret_cast<XBlock256*>(out + m * out_stride));
    else if (xq_block(t) == kQuantBlock)
      quantize_row32(x + m * x_stride, K, reinterpret_cast<XBlock32*>(out + m * out_stride));
  }
}

}  // namespace RCN_ISA
}  // namespace rcn_fast
