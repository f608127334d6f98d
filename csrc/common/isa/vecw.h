// A float vector of the variant's width W (16 lanes with AVX-512, 8 with
// AVX2 and in the baseline build) and the GGML block unpacking, shared by
// the quantised-weight kernels (csrc/llm/isa/*.cpp). Include it inside
// `namespace RCN_ISA { namespace {` after <cstdint>, <cstring>, <cmath>,
// <immintrin.h> (AVX2/AVX-512 builds) and llm/quant_blocks.h.
//
// Multiply-adds are explicit (vfma): fused on AVX2/AVX-512, a multiply then
// an add in the baseline build; the files are compiled with
// -ffp-contract=off, so the compiler never fuses anything on its own and
// every copy of a loop rounds the same way.
#ifndef RCN_FAST_CPU_ISA_VECW_H
#define RCN_FAST_CPU_ISA_VECW_H

// Fully unroll the loops over a register tile, so its accumulators live in
// registers (GCC keeps an array indexed in a rolled loop in memory).
#define RCN_UNROLL _Pragma("GCC unroll 16")

#if defined(__AVX512F__)
constexpr int W = 16;
typedef __m512 vf;
inline vf vzero() { return _mm512_setzero_ps(); }
inline vf vld(const float* p) { return _mm512_loadu_ps(p); }
inline void vst(float* p, vf v) { _mm512_storeu_ps(p, v); }
inline vf vld_n(const float* p, int n) { return _mm512_maskz_loadu_ps(__mmask16((1u << n) - 1u), p); }
inline void vst_n(float* p, vf v, int n) { _mm512_mask_storeu_ps(p, __mmask16((1u << n) - 1u), v); }
inline vf vset(float f) { return _mm512_set1_ps(f); }
inline vf vfma(vf a, vf b, vf c) { return _mm512_fmadd_ps(a, b, c); }
inline vf vmul(vf a, vf b) { return _mm512_mul_ps(a, b); }
inline vf vadd(vf a, vf b) { return _mm512_add_ps(a, b); }
inline vf vsub(vf a, vf b) { return _mm512_sub_ps(a, b); }
inline vf vdiv(vf a, vf b) { return _mm512_div_ps(a, b); }
inline vf vmax(vf a, vf b) { return _mm512_max_ps(a, b); }  // b when either is NaN
inline vf vmin(vf a, vf b) { return _mm512_min_ps(a, b); }
inline float vsum(vf v) {
  const __m256 h = _mm256_add_ps(_mm512_castps512_ps256(v),
                                 _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
  __m128 q = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
  q = _mm_add_ps(q, _mm_movehl_ps(q, q));
  q = _mm_add_ss(q, _mm_movehdup_ps(q));
  return _mm_cvtss_f32(q);
}
inline float vhmax(vf v) { return _mm512_reduce_max_ps(v); }
inline vf vld_f16(const uint16_t* p) { return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))); }
inline float f16(const uint8_t* p) { return _cvtsh_ss(read_u16(p)); }
// 2^n * y for integral-valued n
inline vf vscale2(vf y, vf n) { return _mm512_scalef_ps(y, n); }
inline vf vfloor(vf x) { return _mm512_roundscale_ps(x, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC); }

#elif defined(__AVX2__)
constexpr int W = 8;
typedef __m256 vf;
inline vf vzero() { return _mm256_setzero_ps(); }
inline vf vld(const float* p) { return _mm256_loadu_ps(p); }
inline void vst(float* p, vf v) { _mm256_storeu_ps(p, v); }
inline __m256i lane_mask(int n) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}
inline vf vld_n(const float* p, int n) { return _mm256_maskload_ps(p, lane_mask(n)); }
inline void vst_n(float* p, vf v, int n) { _mm256_maskstore_ps(p, lane_mask(n), v); }
inline vf vset(float f) { return _mm256_set1_ps(f); }
inline vf vfma(vf a, vf b, vf c) { return _mm256_fmadd_ps(a, b, c); }
inline vf vmul(vf a, vf b) { return _mm256_mul_ps(a, b); }
inline vf vadd(vf a, vf b) { return _mm256_add_ps(a, b); }
inline vf vsub(vf a, vf b) { return _mm256_sub_ps(a, b); }
inline vf vdiv(vf a, vf b) { return _mm256_div_ps(a, b); }
inline vf vmax(vf a, vf b) { return _mm256_max_ps(a, b); }
inline vf vmin(vf a, vf b) { return _mm256_min_ps(a, b); }
inline float vsum(vf v) {
  __m128 q = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  q = _mm_add_ps(q, _mm_movehl_ps(q, q));
  q = _mm_add_ss(q, _mm_movehdup_ps(q));
  return _mm_cvtss_f32(q);
}
inline float vhmax(vf v) {
  __m128 q = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  q = _mm_max_ps(q, _mm_movehl_ps(q, q));
  q = _mm_max_ss(q, _mm_movehdup_ps(q));
  return _mm_cvtss_f32(q);
}
inline vf vld_f16(const uint16_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
inline float f16(const uint8_t* p) { return _cvtsh_ss(read_u16(p)); }
inline vf vscale2(vf y, vf n) {
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(y, _mm256_castsi256_ps(e));
}
inline vf vfloor(vf x) { return _mm256_floor_ps(x); }

#else  // baseline x86-64 (or any target): GCC/clang vector extensions
constexpr int W = 8;
typedef float vf __attribute__((vector_size(32)));
inline vf vzero() { return vf{0, 0, 0, 0, 0, 0, 0, 0}; }
inline vf vld(const float* p) {
  vf v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline void vst(float* p, vf v) { std::memcpy(p, &v, sizeof v); }
inline vf vld_n(const float* p, int n) {
  vf v = vzero();
  std::memcpy(&v, p, sizeof(float) * size_t(n));
  return v;
}
inline void vst_n(float* p, vf v, int n) { std::memcpy(p, &v, sizeof(float) * size_t(n)); }
inline vf vset(float f) { return vf{f, f, f, f, f, f, f, f}; }
inline vf vfma(vf a, vf b, vf c) { return a * b + c; }  // not fused (-ffp-contract=off)
inline vf vmul(vf a, vf b) { return a * b; }
inline vf vadd(vf a, vf b) { return a + b; }
inline vf vsub(vf a, vf b) { return a - b; }
inline vf vdiv(vf a, vf b) { return a / b; }
inline vf vmax(vf a, vf b) {
  vf r;
  for (int i = 0; i < 8; ++i) r[i] = a[i] > b[i] ? a[i] : b[i];  // b when either is NaN
  return r;
}
inline vf vmin(vf a, vf b) {
  vf r;
  for (int i = 0; i < 8; ++i) r[i] = a[i] < b[i] ? a[i] : b[i];
  return r;
}
inline float vsum(vf v) { return ((v[0] + v[4]) + (v[2] + v[6])) + ((v[1] + v[5]) + (v[3] + v[7])); }
inline float vhmax(vf v) {
  float m = v[0];
  for (int i = 1; i < 8; ++i) m = v[i] > m ? v[i] : m;
  return m;
}
inline vf vld_f16(const uint16_t* p) {
  vf v;
  for (int i = 0; i < 8; ++i) v[i] = half_to_float(p[i]);
  return v;
}
inline float f16(const uint8_t* p) { return half_to_float(read_u16(p)); }
inline vf vscale2(vf y, vf n) {
  vf r;
  for (int i = 0; i < 8; ++i) r[i] = std::ldexp(y[i], int(n[i]));
  return r;
}
inline vf vfloor(vf x) {
  vf r;
  for (int i = 0; i < 8; ++i) r[i] = std::floor(x[i]);
  return r;
}
#endif

// The sums of four vectors, each by exactly vsum's tree (so a value does not
// depend on whether it was reduced alone or in a group of four).
inline void vsum4(vf a, vf b, vf c, vf d, float* out) {
#if defined(__AVX512F__)
  const __m512 ab = _mm512_add_ps(_mm512_shuffle_f32x4(a, b, 0x44), _mm512_shuffle_f32x4(a, b, 0xEE));
  const __m512 cd = _mm512_add_ps(_mm512_shuffle_f32x4(c, d, 0x44), _mm512_shuffle_f32x4(c, d, 0xEE));
  __m512 x = _mm512_add_ps(_mm512_shuffle_f32x4(ab, cd, 0x88), _mm512_shuffle_f32x4(ab, cd, 0xDD));
  x = _mm512_add_ps(x, _mm512_permute_ps(x, 0x4E));
  x = _mm512_add_ps(x, _mm512_permute_ps(x, 0xB1));
  alignas(64) float t[16];
  _mm512_store_ps(t, x);
  out[0] = t[0], out[1] = t[4], out[2] = t[8], out[3] = t[12];
#elif defined(__AVX2__)
  __m256 ab = _mm256_add_ps(_mm256_permute2f128_ps(a, b, 0x20), _mm256_permute2f128_ps(a, b, 0x31));
  __m256 cd = _mm256_add_ps(_mm256_permute2f128_ps(c, d, 0x20), _mm256_permute2f128_ps(c, d, 0x31));
  ab = _mm256_add_ps(ab, _mm256_permute_ps(ab, 0x4E));
  cd = _mm256_add_ps(cd, _mm256_permute_ps(cd, 0x4E));
  ab = _mm256_add_ps(ab, _mm256_permute_ps(ab, 0xB1));
  cd = _mm256_add_ps(cd, _mm256_permute_ps(cd, 0xB1));
  alignas(32) float t[8], u[8];
  _mm256_store_ps(t, ab);
  _mm256_store_ps(u, cd);
  out[0] = t[0], out[1] = t[4], out[2] = u[0], out[3] = u[4];
#else
  out[0] = vsum(a), out[1] = vsum(b), out[2] = vsum(c), out[3] = vsum(d);
#endif
}

constexpr int kChunks = 32 / W;  // vectors per quantised block

// exp(x) per lane (Cephes' expf polynomial, ~2 ulp); NaN stays NaN, the
// input is clamped to [-88.38, 88.38] (so exp of a very negative number is
// ~1e-38, not 0).
inline vf vexp(vf x) {
  x = vmin(vset(88.3762626647949f), vmax(vset(-88.3762626647949f), x));
  const vf n = vfloor(vfma(x, vset(1.44269504088896341f), vset(0.5f)));
  x = vsub(x, vmul(n, vset(0.693359375f)));
  x = vsub(x, vmul(n, vset(-2.12194440e-4f)));
  vf y = vset(1.9875691500E-4f);
  y = vfma(y, x, vset(1.3981999507E-3f));
  y = vfma(y, x, vset(8.3334519073E-3f));
  y = vfma(y, x, vset(4.1665795894E-2f));
  y = vfma(y, x, vset(1.6666665459E-1f));
  y = vfma(y, x, vset(5.0000001201E-1f));
  y = vfma(y, vmul(x, x), vadd(x, vset(1.0f)));
  return vscale2(y, n);
}

#if defined(__AVX2__) || defined(__AVX512F__)
// The block's first two float16 values (d, and m for Q4_1) as floats 0 and 1
// (one 4-byte load: every block is longer than that).
inline __m128 dm_pair(const uint8_t* blk) {
  uint32_t v;
  std::memcpy(&v, blk, sizeof v);
  return _mm_cvtph_ps(_mm_cvtsi32_si128(int(v)));
}
#endif

// The 32 weights of one block as kChunks vectors (elements [j*W, j*W + W)
// in out[j]).
template <QType T>
inline void dq_block(const uint8_t* blk, vf* out) {
#if defined(__AVX512F__)
  const __m128 dm = dm_pair(blk);  // d (and m) converted at once
  const vf d = _mm512_broadcastss_ps(dm);
  if constexpr (T == QType::Q8_0) {
    for (int j = 0; j < 2; ++j) {
      const __m512i q = _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 2 + 16 * j)));
      out[j] = vmul(_mm512_cvtepi32_ps(q), d);
    }
  } else {
    const int off = T == QType::Q4_1 ? 4 : 2;
    const __m512i q = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + off)));
    __m512i lo = _mm512_and_si512(q, _mm512_set1_epi32(15));
    __m512i hi = _mm512_srli_epi32(q, 4);
    if constexpr (T == QType::Q4_0) {
      lo = _mm512_sub_epi32(lo, _mm512_set1_epi32(8));
      hi = _mm512_sub_epi32(hi, _mm512_set1_epi32(8));
      out[0] = vmul(_mm512_cvtepi32_ps(lo), d);
      out[1] = vmul(_mm512_cvtepi32_ps(hi), d);
    } else {
      const vf m = _mm512_broadcastss_ps(_mm_movehdup_ps(dm));
      out[0] = vfma(_mm512_cvtepi32_ps(lo), d, m);
      out[1] = vfma(_mm512_cvtepi32_ps(hi), d, m);
    }
  }
#elif defined(__AVX2__)
  const __m128 dm = dm_pair(blk);
  const vf d = _mm256_broadcastss_ps(dm);
  if constexpr (T == QType::Q8_0) {
    for (int j = 0; j < 4; ++j) {
      const __m256i q = _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(blk + 2 + 8 * j)));
      out[j] = vmul(_mm256_cvtepi32_ps(q), d);
    }
  } else {
    const int off = T == QType::Q4_1 ? 4 : 2;
    const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + off));
    const __m256i a = _mm256_cvtepu8_epi32(raw), b = _mm256_cvtepu8_epi32(_mm_srli_si128(raw, 8));
    const __m256i mask = _mm256_set1_epi32(15);
    __m256i q[4] = {_mm256_and_si256(a, mask), _mm256_and_si256(b, mask), _mm256_srli_epi32(a, 4),
                    _mm256_srli_epi32(b, 4)};
    if constexpr (T == QType::Q4_0) {
      for (int j = 0; j < 4; ++j) out[j] = vmul(_mm256_cvtepi32_ps(_mm256_sub_epi32(q[j], _mm256_set1_epi32(8))), d);
    } else {
      const vf m = _mm256_broadcastss_ps(_mm_movehdup_ps(dm));
      for (int j = 0; j < 4; ++j) out[j] = vfma(_mm256_cvtepi32_ps(q[j]), d, m);
    }
  }
#else
  float t[32];
  dequant_row_ref(T, blk, 0, 32, t);
  for (int j = 0; j < kChunks; ++j) out[j] = vld(t + j * W);
#endif
}

// The 32 weights of chunk b (elements [32b, 32b + 32)) of a quantised row,
// as kChunks vectors: a block of Q4_0/Q4_1/Q8_0, or an eighth of a K-quant
// super-block (the same values as dequant_row_ref, bit for bit: a product
// with the chunk's scale, then its min subtracted).
template <QType T>
inline void dq_chunk(const uint8_t* row, int64_t b, vf* out) {
  if constexpr (!qtype_is_kquant(T)) {
    dq_block<T>(row + b * qtype_unit_bytes(T), out);
  } else {
    const uint8_t* sb = row + b / 8 * qtype_unit_bytes(T);
    const int c = int(b % 8);
    float scale[2], min;
#if defined(__AVX2__) || defined(__AVX512F__)
    const __m256i m4 = _mm256_set1_epi8(0xF);
    __m256i q;
    if constexpr (T == QType::Q6_K) {
      const int half = c / 4, part = c % 4;
      const __m256i bits = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(sb + kq::kQl6 + 64 * half + 32 * (part & 1)));
      const __m256i hb = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(sb + kq::kQh6 + 32 * half));
      const __m256i lo = _mm256_and_si256(part < 2 ? bits : _mm256_srli_epi16(bits, 4), m4);
      const __m256i hi = _mm256_and_si256(_mm256_srl_epi16(hb, _mm_cvtsi32_si128(2 * part)), _mm256_set1_epi8(3));
      q = _mm256_sub_epi8(_mm256_or_si256(lo, _mm256_slli_epi16(hi, 4)), _mm256_set1_epi8(32));
      const float d = f16(sb + kq::kD6);
      const int8_t* sc = reinterpret_cast<const int8_t*>(sb + kq::kSc6) + 8 * half + 2 * part;
      scale[0] = d * float(sc[0]);
      scale[1] = d * float(sc[1]);
      min = 0.0f;
    } else {
      const uint8_t* qs = sb + (T == QType::Q4_K ? kq::kQs4 : kq::kQs5) + 32 * (c / 2);
      const __m256i bits = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs));
      q = _mm256_and_si256((c & 1) ? _mm256_srli_epi16(bits, 4) : bits, m4);
      if constexpr (T == QType::Q5_K) {
        const __m256i hb = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(sb + kq::kQh5));
        const __m256i h = _mm256_and_si256(_mm256_srl_epi16(hb, _mm_cvtsi32_si128(c)), _mm256_set1_epi8(1));
        q = _mm256_or_si256(q, _mm256_slli_epi16(h, 4));
      }
      uint8_t sc, m;
      get_scale_min_k4(c, sb + kq::kScales, sc, m);
      scale[0] = scale[1] = f16(sb + kq::kD) * float(sc);
      min = f16(sb + kq::kDmin) * float(m);
    }
#if defined(__AVX512F__)
    for (int j = 0; j < 2; ++j) {
      const __m128i part = j == 0 ? _mm256_castsi256_si128(q) : _mm256_extracti128_si256(q, 1);
      out[j] = vsub(vmul(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(part)), vset(scale[j])), vset(min));
    }
#else
    alignas(32) int8_t qb[32];
    _mm256_store_si256(reinterpret_cast<__m256i*>(qb), q);
    for (int j = 0; j < 4; ++j) {
      const __m256i v = _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(qb + 8 * j)));
      out[j] = vsub(vmul(_mm256_cvtepi32_ps(v), vset(scale[j / 2])), vset(min));
    }
#endif
#else
    int8_t q[32];
    kquant_chunk_ref(T, sb, c, q, scale, &min);
    for (int j = 0; j < kChunks; ++j) {
      vf v;
      for (int i = 0; i < W; ++i) v[i] = float(q[j * W + i]);
      out[j] = vsub(vmul(v, vset(scale[j * W / 16])), vset(min));
    }
#endif
  }
}

// Bytes of a row before chunk b (for prefetching: exact for the 32-element
// blocks, rounded down inside a K-quant super-block).
template <QType T>
constexpr int64_t chunk_offset(int64_t b) {
  return b * qtype_unit_bytes(T) / (qtype_block(T) / kQuantBlock);
}

// Elements [k, k + W) of a plain (F32 or F16) row of K elements, zero past K.
template <QType T>
inline vf load_plain(const uint8_t* row, int64_t k, int64_t K) {
  const int64_t left = K - k;
  if constexpr (T == QType::F32) {
    const float* p = reinterpret_cast<const float*>(row) + k;
    return left >= W ? vld(p) : vld_n(p, int(left));
  } else {
    const uint16_t* p = reinterpret_cast<const uint16_t*>(row) + k;
    if (left >= W) return vld_f16(p);
    float t[W] = {};
    for (int64_t i = 0; i < left; ++i) t[i] = half_to_float(p[i]);
    return vld(t);
  }
}

inline vf load_x(const float* x, int64_t k, int64_t K) { return K - k >= W ? vld(x + k) : vld_n(x + k, int(K - k)); }

#endif  // RCN_FAST_CPU_ISA_VECW_H
