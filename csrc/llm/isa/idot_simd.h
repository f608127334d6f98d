// AVX2 integer helpers shared by the 8-bit arithmetic's ISA files
// (llm/isa/quant_idot.cpp, llm/isa/quant_xq.cpp). Include it inside
// `namespace RCN_ISA { namespace {` after <immintrin.h>, in an AVX2 build.
#ifndef RCN_FAST_LLM_ISA_IDOT_SIMD_H
#define RCN_FAST_LLM_ISA_IDOT_SIMD_H

// the sum of the 8 int32 lanes
inline int hsum_i32_8(__m256i a) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(a), _mm256_extracti128_si256(a, 1));
  s = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(2, 3, 0, 1)));
  return _mm_cvtsi128_si32(s);
}

#endif  // RCN_FAST_LLM_ISA_IDOT_SIMD_H
