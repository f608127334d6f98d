// Matrix products of quantised weights with 8-bit activations (llama.cpp's
// arithmetic; llm/quant_blocks.h is the specification, dot_row_ref the
// definition, llm/isa/quant_isa.h the interface), compiled once per SIMD
// variant (RCN_ISA = generic | avx2 | avx512 | avx512vnni).
//
// Each row of x is first quantised (quantize_x, llm/isa/quant_xq.cpp:
// XBlock32 for Q4_0, Q4_1, Q8_0; XBlock256 for Q4_K, Q5_K, Q6_K). Then per (x row, weight row) pair and per block, the products
// are summed exactly in integers (maddubs + madd, as llama.cpp's AVX2
// kernels; vpdpbusd where AVX-512 VNNI has it: the same integers, none of
// the sums saturates) and the block's sum goes into the pair's float
// accumulator with one fused multiply-add, block after block. Every
// implementation does exactly that, so all give the same bits: the generic
// variant (the reference, pair by pair), the row-major kernels below (a
// horizontal integer sum per block), and the kernels over the interleaved
// copies of Q4_0, Q4_1, Q8_0 (groups of 8 rows, one row per vector lane:
// no horizontal sums at all; llama.cpp's repacking idea). The AVX-512
// variants run the same 256-bit code (a decoding step is bound by reading
// the weights, not by the vector width).
//
// So a pair's result depends on nothing but its two rows: not on the tile,
// M, the batch around it, the thread split or whether the weights were
// packed -- a row's result is the same in every batch.
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

constexpr int64_t kAheadBytes = 2048;  // weight bytes prefetched ahead in each row

// Fully unroll the loops over a tile, so its accumulators live in registers
// (GCC keeps an array indexed in a rolled loop in memory).
#define RCN_UNROLL _Pragma("GCC unroll 16")

#if defined(__AVX2__)

#include "llm/isa/idot_simd.h"

inline float f16s(const uint8_t* p) { return _cvtsh_ss(read_u16(p)); }

// acc + the sums of four u8 x s8 products per int32 lane (bytes 4k..4k+3 -> lane k)
inline __m256i dp_u8s8(__m256i acc, __m256i u, __m256i s) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
  return _mm256_dpbusd_epi32(acc, u, s);
#else
  return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)));
#endif
}

// 32 nibbles of qs[16] as bytes 0..15: low nibbles first, then the high ones
inline __m256i nibbles32(const uint8_t* qs) {
  const __m128i t = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  const __m256i b = _mm256_inserti128_si256(_mm256_castsi128_si256(t), _mm_srli_epi16(t, 4), 1);
  return _mm256_and_si256(b, _mm256_set1_epi8(0xF));
}

alignas(32) const uint8_t kShufK4[256] = {
#define RCN_S2(i) i, i + 1, i, i + 1, i, i + 1, i, i + 1, i, i + 1, i, i + 1, i, i + 1, i, i + 1
    RCN_S2(0),  RCN_S2(0),  RCN_S2(2),  RCN_S2(2),  RCN_S2(4),  RCN_S2(4),  RCN_S2(6),  RCN_S2(6),
    RCN_S2(8),  RCN_S2(8),  RCN_S2(10), RCN_S2(10), RCN_S2(12), RCN_S2(12), RCN_S2(14), RCN_S2(14)};
#undef RCN_S2
// int16 scale i of a register holding 8 int16 scales (twice), in every lane
inline __m256i scale_k4(__m256i scales, int i) {
  return _mm256_shuffle_epi8(scales, _mm256_load_si256(reinterpret_cast<const __m256i*>(kShufK4) + i));
}

alignas(16) const uint8_t kShuf6[128] = {
#define RCN_S8(i) i, i, i, i, i, i, i, i
    RCN_S8(0),  RCN_S8(1),  RCN_S8(2),  RCN_S8(3),  RCN_S8(4),  RCN_S8(5),  RCN_S8(6),  RCN_S8(7),
    RCN_S8(8),  RCN_S8(9),  RCN_S8(10), RCN_S8(11), RCN_S8(12), RCN_S8(13), RCN_S8(14), RCN_S8(15)};
#undef RCN_S8
// int8 scales 2i and 2i + 1 (8 lanes each) as 16 int16
inline __m256i scale_6(__m128i scales, int i) {
  return _mm256_cvtepi8_epi16(_mm_shuffle_epi8(scales, _mm_load_si128(reinterpret_cast<const __m128i*>(kShuf6) + i)));
}

// Q4_K/Q5_K: the 8 scales (int16 lanes 0-7, twice) and the 8 mins (as 8 int16) of a super-block
inline void kscales(const uint8_t* sb, __m256i& scales, __m128i& mins) {
  constexpr uint32_t kmask1 = 0x3f3f3f3f, kmask2 = 0x0f0f0f0f, kmask3 = 0x03030303;
  uint32_t u[4];
  std::memcpy(u, sb + kq::kScales, 12);
  u[3] = ((u[2] >> 4) & kmask2) | (((u[1] >> 6) & kmask3) << 4);
  const uint32_t aux = u[1] & kmask1;
  u[1] = (u[2] & kmask2) | (((u[0] >> 6) & kmask3) << 4);
  u[2] = aux;
  u[0] &= kmask1;
  const __m256i ms = _mm256_cvtepu8_epi16(_mm_set_epi32(int(u[3]), int(u[2]), int(u[1]), int(u[0])));
  const __m128i sc = _mm256_castsi256_si128(ms);
  scales = _mm256_inserti128_si256(_mm256_castsi128_si256(sc), sc, 1);
  mins = _mm256_extracti128_si256(ms, 1);
}

inline void prefetch_w(const uint8_t* p) { _mm_prefetch(reinterpret_cast<const char*>(p + kAheadBytes), _MM_HINT_T0); }

inline int hsum_i32_4(__m128i s) {
  s = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(2, 3, 0, 1)));
  return _mm_cvtsi128_si32(s);
}

inline float fmas(float a, float b, float c) {
  return _mm_cvtss_f32(_mm_fmadd_ss(_mm_set_ss(a), _mm_set_ss(b), _mm_set_ss(c)));
}

// R x-rows times C weight rows of a 32-element-block type, row-major weights.
template <QType T, int R, int C>
inline void itile32(const uint8_t* xq, int64_t xqs, const uint8_t* w, int64_t ws, int64_t K, float (*out)[4]) {
  constexpr int64_t bytes = qtype_unit_bytes(T);
  float acc[R][C] = {};
  const int64_t nb = K / kQuantBlock;
  for (int64_t b = 0; b < nb; ++b) {
    if ((b * bytes) % 64 < bytes)  // the block enters a new cache line: ask for the one kAheadBytes on
      RCN_UNROLL
      for (int c = 0; c < C; ++c) prefetch_w(w + c * ws + b * bytes);
    RCN_UNROLL
    for (int c = 0; c < C; ++c) {
      const uint8_t* blk = w + c * ws + b * bytes;
      __m256i wq;
      if constexpr (T == QType::Q8_0) wq = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 2));
      else if constexpr (T == QType::Q4_0) wq = _mm256_sub_epi8(nibbles32(blk + 2), _mm256_set1_epi8(8));
      else wq = nibbles32(blk + 4);
      const float dw = f16s(blk);
      const __m256i aw = T == QType::Q4_1 ? wq : _mm256_sign_epi8(wq, wq);
      RCN_UNROLL
      for (int r = 0; r < R; ++r) {
        const XBlock32* xb = reinterpret_cast<const XBlock32*>(xq + r * xqs) + b;
        const __m256i y = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xb->q));
        const __m256i sy = T == QType::Q4_1 ? y : _mm256_sign_epi8(y, wq);
        const int sumi = hsum_i32_8(dp_u8s8(_mm256_setzero_si256(), aw, sy));
        acc[r][c] = fmas(float(sumi), dw * xb->d, acc[r][c]);
        if constexpr (T == QType::Q4_1) acc[r][c] = fmas(f16s(blk + 2), _cvtsh_ss(xb->s), acc[r][c]);
      }
    }
  }
  RCN_UNROLL
  for (int r = 0; r < R; ++r)
    RCN_UNROLL
    for (int c = 0; c < C; ++c) out[r][c] = acc[r][c];
}

// R x-rows times C weight rows of a K-quant type (one row of a super-block at a time).
template <QType T, int R, int C>
inline void itile256(const uint8_t* xq, int64_t xqs, const uint8_t* w, int64_t ws, int64_t K, float (*out)[4]) {
  constexpr int64_t bytes = qtype_unit_bytes(T);
  float acc[R][C] = {};
  const __m256i m4 = _mm256_set1_epi8(0xF);
  const int64_t nb = K / kSuperBlock;
  for (int64_t b = 0; b < nb; ++b) {
    RCN_UNROLL
    for (int c = 0; c < C; ++c) {
      const uint8_t* sb = w + c * ws + b * bytes;
      RCN_UNROLL
      for (int l = 0; l < int(bytes); l += 64) prefetch_w(sb + l);  // every line of the super-block, ahead
      __m256i sumi[R];
      RCN_UNROLL
      for (int r = 0; r < R; ++r) sumi[r] = _mm256_setzero_si256();
      if constexpr (T == QType::Q6_K) {
        const __m128i sc = _mm_loadu_si128(reinterpret_cast<const __m128i*>(sb + kq::kSc6));
        RCN_UNROLL
        for (int j = 0; j < 2; ++j) {
          const __m256i b1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(sb + kq::kQl6 + 64 * j));
          const __m256i b2 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(sb + kq::kQl6 + 64 * j + 32));
          const __m256i bh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(sb + kq::kQh6 + 32 * j));
          const __m256i m3 = _mm256_set1_epi8(3);
          __m256i q[4];
          q[0] = _mm256_or_si256(_mm256_and_si256(b1, m4), _mm256_slli_epi16(_mm256_and_si256(bh, m3), 4));
          q[1] = _mm256_or_si256(_mm256_and_si256(b2, m4),
                                 _mm256_slli_epi16(_mm256_and_si256(bh, _mm256_set1_epi8(12)), 2));
          q[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(b1, 4), m4),
                                 _mm256_and_si256(bh, _mm256_set1_epi8(48)));
          q[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(b2, 4), m4),
                                 _mm256_srli_epi16(_mm256_and_si256(bh, _mm256_set1_epi8(-64)), 2));
          __m256i s[4];
          RCN_UNROLL
          for (int k = 0; k < 4; ++k) s[k] = scale_6(sc, 4 * j + k);
          RCN_UNROLL
          for (int r = 0; r < R; ++r) {
            const int8_t* y = reinterpret_cast<const XBlock256*>(xq + r * xqs)[b].q + 128 * j;
            RCN_UNROLL
            for (int k = 0; k < 4; ++k) {
              const __m256i yk = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(y + 32 * k));
              sumi[r] = _mm256_add_epi32(sumi[r], _mm256_madd_epi16(s[k], _mm256_maddubs_epi16(q[k], yk)));
            }
          }
        }
        const __m256i sc16 = _mm256_cvtepi8_epi16(sc);
        const float d = f16s(sb + kq::kD6);
        RCN_UNROLL
        for (int r = 0; r < R; ++r) {
          const XBlock256& xb = reinterpret_cast<const XBlock256*>(xq + r * xqs)[b];
          const __m256i bs = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xb.bsums));
          const __m256i sub = _mm256_slli_epi32(_mm256_madd_epi16(bs, sc16), 5);  // 32 * sum(sc * bsum): q's offset
          acc[r][c] = fmas(float(hsum_i32_8(_mm256_sub_epi32(sumi[r], sub))), xb.d * d, acc[r][c]);
        }
      } else {
        __m256i scales;
        __m128i mins;
        kscales(sb, scales, mins);
        const uint8_t* qs = sb + (T == QType::Q4_K ? kq::kQs4 : kq::kQs5);
        __m256i hb = _mm256_setzero_si256();
        if constexpr (T == QType::Q5_K) hb = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(sb + kq::kQh5));
        RCN_UNROLL
        for (int j = 0; j < 4; ++j) {
          const __m256i bits = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs + 32 * j));
          __m256i lo = _mm256_and_si256(bits, m4), hi = _mm256_and_si256(_mm256_srli_epi16(bits, 4), m4);
          if constexpr (T == QType::Q5_K) {  // bit 2j (low half) and 2j + 1 (high half) of qh, as 16
            const __m256i one = _mm256_set1_epi8(1);
            lo = _mm256_add_epi8(lo, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 2 * j), one), 4));
            hi = _mm256_add_epi8(hi, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 2 * j + 1), one), 4));
          }
          const __m256i sl = scale_k4(scales, 2 * j), sh = scale_k4(scales, 2 * j + 1);
          RCN_UNROLL
          for (int r = 0; r < R; ++r) {
            const int8_t* y = reinterpret_cast<const XBlock256*>(xq + r * xqs)[b].q + 64 * j;
            const __m256i yl = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(y));
            const __m256i yh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(y + 32));
            const __m256i pl = _mm256_madd_epi16(sl, _mm256_maddubs_epi16(lo, yl));
            const __m256i ph = _mm256_madd_epi16(sh, _mm256_maddubs_epi16(hi, yh));
            sumi[r] = _mm256_add_epi32(sumi[r], _mm256_add_epi32(pl, ph));
          }
        }
        const float d = f16s(sb + kq::kD), dmin = f16s(sb + kq::kDmin);
        RCN_UNROLL
        for (int r = 0; r < R; ++r) {
          const XBlock256& xb = reinterpret_cast<const XBlock256*>(xq + r * xqs)[b];
          const __m256i bs = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xb.bsums));
          const __m128i s32 = _mm_hadd_epi16(_mm256_castsi256_si128(bs), _mm256_extracti128_si256(bs, 1));
          const int summ = hsum_i32_4(_mm_madd_epi16(mins, s32));  // sum of m * (32-element sums)
          acc[r][c] = fmas(float(hsum_i32_8(sumi[r])), xb.d * d, acc[r][c]);
          acc[r][c] = fmas(float(summ), -xb.d * dmin, acc[r][c]);
        }
      }
    }
  }
  RCN_UNROLL
  for (int r = 0; r < R; ++r)
    RCN_UNROLL
    for (int c = 0; c < C; ++c) out[r][c] = acc[r][c];
}

template <QType T, int R, int C>
inline void itile(const uint8_t* xq, int64_t xqs, const uint8_t* w, int64_t ws, int64_t K, float (*out)[4]) {
  if constexpr (qtype_is_kquant(T))
    itile256<T, R, C>(xq, xqs, w, ws, K, out);
  else
    itile32<T, R, C>(xq, xqs, w, ws, K, out);
}

constexpr int RMAX = 4;

template <QType T, int R>
inline void itile_c(int C, const uint8_t* xq, int64_t xqs, const uint8_t* w, int64_t ws, int64_t K, float (*out)[4]) {
  switch (C) {
    case 1: itile<T, R, 1>(xq, xqs, w, ws, K, out); return;
    case 2: itile<T, R, 2>(xq, xqs, w, ws, K, out); return;
    case 3: itile<T, R, 3>(xq, xqs, w, ws, K, out); return;
    default: itile<T, R, 4>(xq, xqs, w, ws, K, out); return;
  }
}

template <QType T, int R>
inline void itile_c2(int C, const uint8_t* xq, int64_t xqs, const uint8_t* w, int64_t ws, int64_t K,
                     float (*out)[4]) {
  if (C == 1)
    itile<T, R, 1>(xq, xqs, w, ws, K, out);
  else
    itile<T, R, 2>(xq, xqs, w, ws, K, out);
}

// The tile shape (registers): one x row with up to 4 weight rows (decoding:
// the weight rows share each x load), or up to 4 x rows with up to 2.
template <QType T>
inline void itile_rc(int R, int C, const uint8_t* xq, int64_t xqs, const uint8_t* w, int64_t ws, int64_t K,
                     float (*out)[4]) {
  switch (R) {
    case 1: itile_c<T, 1>(C, xq, xqs, w, ws, K, out); return;
    case 2: itile_c2<T, 2>(C, xq, xqs, w, ws, K, out); return;
    case 3: itile_c2<T, 3>(C, xq, xqs, w, ws, K, out); return;
    default: itile_c2<T, 4>(C, xq, xqs, w, ws, K, out); return;
  }
}

constexpr int kCols(int R) { return R == 1 ? 4 : 2; }

// R x rows times one packed group of 8 weight rows (Q4_0, Q4_1, Q8_0):
// out[r][i] for weight row 8g + i. The lanes are the rows.
template <QType T, int R>
inline void pgroup(const uint8_t* xq, int64_t xqs, const uint8_t* grp, int64_t nb, float (*out)[8]) {
  constexpr int64_t pb = packed_block_bytes(T);
  constexpr int head = T == QType::Q4_1 ? 32 : 16;
  __m256 acc[R];
  RCN_UNROLL
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  const __m256i m4 = _mm256_set1_epi8(0xF);
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* blk = grp + b * pb;
    _mm_prefetch(reinterpret_cast<const char*>(blk + kAheadBytes), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(blk + kAheadBytes + 64), _MM_HINT_T0);
    if constexpr (pb > 128) _mm_prefetch(reinterpret_cast<const char*>(blk + kAheadBytes + 128), _MM_HINT_T0);
    if constexpr (pb > 192) _mm_prefetch(reinterpret_cast<const char*>(blk + kAheadBytes + 192), _MM_HINT_T0);
    const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk)));
    __m256i v[8];  // v[k]: quants 4k..4k+3 of the 8 rows
    if constexpr (T == QType::Q8_0) {
      RCN_UNROLL
      for (int k = 0; k < 8; ++k) v[k] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + head + 32 * k));
    } else {
      RCN_UNROLL
      for (int k = 0; k < 4; ++k) {
        const __m256i p = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + head + 32 * k));
        v[k] = _mm256_and_si256(p, m4);
        v[k + 4] = _mm256_and_si256(_mm256_srli_epi16(p, 4), m4);
      }
    }
    RCN_UNROLL
    for (int r = 0; r < R; ++r) {
      const XBlock32* xb = reinterpret_cast<const XBlock32*>(xq + r * xqs) + b;
      int32_t y4[8];
      std::memcpy(y4, xb->q, 32);
      __m256i sum;
      if constexpr (T == QType::Q8_0) {
        sum = _mm256_setzero_si256();
        RCN_UNROLL
        for (int k = 0; k < 8; ++k)
          sum = dp_u8s8(sum, _mm256_sign_epi8(v[k], v[k]), _mm256_sign_epi8(_mm256_set1_epi32(y4[k]), v[k]));
      } else {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
        sum = _mm256_setzero_si256();
        RCN_UNROLL
        for (int k = 0; k < 8; ++k) sum = _mm256_dpbusd_epi32(sum, v[k], _mm256_set1_epi32(y4[k]));
#else
        // 8 pair sums of at most 2 * 15 * 127 each: int16 holds them (30480)
        __m256i s16 = _mm256_maddubs_epi16(v[0], _mm256_set1_epi32(y4[0]));
        RCN_UNROLL
        for (int k = 1; k < 8; ++k) s16 = _mm256_add_epi16(s16, _mm256_maddubs_epi16(v[k], _mm256_set1_epi32(y4[k])));
        sum = _mm256_madd_epi16(s16, _mm256_set1_epi16(1));
#endif
        if constexpr (T == QType::Q4_0)  // the quants' offset 8: minus 8 * sum(q_x)
          sum = _mm256_sub_epi32(sum, _mm256_set1_epi32(8 * int(xb->sum)));
      }
      acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum), _mm256_mul_ps(dw, _mm256_set1_ps(xb->d)), acc[r]);
      if constexpr (T == QType::Q4_1)
        acc[r] = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 16))),
                                 _mm256_set1_ps(_cvtsh_ss(xb->s)), acc[r]);
    }
  }
  RCN_UNROLL
  for (int r = 0; r < R; ++r) _mm256_storeu_ps(out[r], acc[r]);
}

// Row r's int16 scale pair (sc, sc) for the 8 rows of a packed Q4_K sub-block (bytes sc[0..8)).
alignas(32) const int8_t kScPairs[32] = {0, -1, 0, -1, 1, -1, 1, -1, 2, -1, 2, -1, 3, -1, 3, -1,
                                         4, -1, 4, -1, 5, -1, 5, -1, 6, -1, 6, -1, 7, -1, 7, -1};

// R x rows times one packed group of 8 Q4_K rows (the lanes are the rows).
template <int R>
inline void pgroup_k4(const uint8_t* xq, int64_t xqs, const uint8_t* grp, int64_t nb, float (*out)[8]) {
  constexpr int64_t pb = packed_block_bytes(QType::Q4_K);
  __m256 acc[R];
  RCN_UNROLL
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  const __m256i m4 = _mm256_set1_epi8(0xF);
  const __m256i pairs = _mm256_load_si256(reinterpret_cast<const __m256i*>(kScPairs));
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* blk = grp + b * pb;
    for (int l = 0; l < int(pb); l += 64) _mm_prefetch(reinterpret_cast<const char*>(blk + 4 * pb + l), _MM_HINT_T0);
    __m256i sumi[R];
    RCN_UNROLL
    for (int r = 0; r < R; ++r) sumi[r] = _mm256_setzero_si256();
    for (int p = 0; p < 4; ++p) {
      __m256i lo16[R], hi16[R];
      RCN_UNROLL
      for (int k = 0; k < 8; ++k) {
        const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 160 + 256 * p + 32 * k));
        const __m256i lo = _mm256_and_si256(v, m4), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
        RCN_UNROLL
        for (int r = 0; r < R; ++r) {
          const int8_t* y = reinterpret_cast<const XBlock256*>(xq + r * xqs)[b].q + 64 * p + 4 * k;
          int32_t yl, yh;
          std::memcpy(&yl, y, 4);
          std::memcpy(&yh, y + 32, 4);
          // 8 pair sums of at most 2 * 15 * 127 each: int16 holds them
          const __m256i pl = _mm256_maddubs_epi16(lo, _mm256_set1_epi32(yl));
          const __m256i ph = _mm256_maddubs_epi16(hi, _mm256_set1_epi32(yh));
          lo16[r] = k == 0 ? pl : _mm256_add_epi16(lo16[r], pl);
          hi16[r] = k == 0 ? ph : _mm256_add_epi16(hi16[r], ph);
        }
      }
      const __m256i sl = _mm256_shuffle_epi8(
          _mm256_set1_epi64x(*reinterpret_cast<const int64_t*>(blk + 32 + 16 * p)), pairs);
      const __m256i sh = _mm256_shuffle_epi8(
          _mm256_set1_epi64x(*reinterpret_cast<const int64_t*>(blk + 32 + 16 * p + 8)), pairs);
      RCN_UNROLL
      for (int r = 0; r < R; ++r)
        sumi[r] = _mm256_add_epi32(sumi[r], _mm256_add_epi32(_mm256_madd_epi16(lo16[r], sl), _mm256_madd_epi16(hi16[r], sh)));
    }
    const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk)));
    const __m256 dmin = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 16)));
    RCN_UNROLL
    for (int r = 0; r < R; ++r) {
      const XBlock256& xb = reinterpret_cast<const XBlock256*>(xq + r * xqs)[b];
      const __m256i bs = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xb.bsums));
      const __m128i b32 = _mm_hadd_epi16(_mm256_castsi256_si128(bs), _mm256_extracti128_si256(bs, 1));
      __m256i summ = _mm256_setzero_si256();
      RCN_UNROLL
      for (int p = 0; p < 4; ++p) {  // rows' (m_2p, m_2p+1) . (bsum_2p, bsum_2p+1)
        const __m256i mp = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 96 + 16 * p)));
        summ = _mm256_add_epi32(summ, _mm256_madd_epi16(mp, _mm256_set1_epi32(_mm_extract_epi32(b32, p))));
      }
      const __m256 dx = _mm256_set1_ps(xb.d);
      acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sumi[r]), _mm256_mul_ps(dx, d), acc[r]);
      acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(summ), _mm256_mul_ps(_mm256_set1_ps(-xb.d), dmin), acc[r]);
    }
  }
  RCN_UNROLL
  for (int r = 0; r < R; ++r) _mm256_storeu_ps(out[r], acc[r]);
}

template <QType T>
inline void pgroup_r(int R, const uint8_t* xq, int64_t xqs, const uint8_t* grp, int64_t nb, float (*out)[8]) {
  if constexpr (T == QType::Q4_K) {
    if (R == 1)
      pgroup_k4<1>(xq, xqs, grp, nb, out);
    else
      pgroup_k4<2>(xq, xqs, grp, nb, out);
  } else {
    if (R == 1)
      pgroup<T, 1>(xq, xqs, grp, nb, out);
    else
      pgroup<T, 2>(xq, xqs, grp, nb, out);
  }
}

#else  // generic: the reference, pair by pair

constexpr int RMAX = 1;
constexpr int kCols(int) { return 1; }

template <QType T>
inline void itile_rc(int, int, const uint8_t* xq, int64_t, const uint8_t* w, int64_t, int64_t K, float (*out)[4]) {
  out[0][0] = dot_row_ref(T, w, xq, K);
}

#endif

inline void store(const QGemmArgs& a, int64_t m0, int64_t n0, int R, int C, const float (*t)[4]) {
  for (int r = 0; r < R; ++r) {
    float* y = a.y + (m0 + r) * a.y_stride + n0;
    for (int c = 0; c < C; ++c) {
      float v = t[r][c];
      if (a.bias) v += a.bias[n0 + c];
      y[c] = a.accumulate ? y[c] + v : v;
    }
  }
}

template <QType T>
void rowmajor(const QGemmArgs& a, int64_t n_begin, int64_t n_end) {
  // x rows in blocks that stay in L2 (~256 KiB of quantised rows), each
  // block against the whole row range, a tile at a time
  const int64_t xrb = xq_row_bytes(T, a.K);
  int64_t MB = (int64_t(1) << 18) / (xrb > 0 ? xrb : 1);
  MB = MB < RMAX ? RMAX : MB / RMAX * RMAX;
  for (int64_t m0 = 0; m0 < a.M; m0 += MB) {
    const int64_t m1 = m0 + MB < a.M ? m0 + MB : a.M;
    const int R0 = int(m1 - m0 < RMAX ? m1 - m0 : RMAX);
    const int CM = kCols(R0);
    for (int64_t n = n_begin; n < n_end; n += CM) {
      const int C = int(n_end - n < CM ? n_end - n : CM);
      for (int64_t m = m0; m < m1; m += RMAX) {
        const int R = int(m1 - m < RMAX ? m1 - m : RMAX);
        float t[4][4];
        itile_rc<T>(R, C, a.xq + m * a.xq_stride, a.xq_stride, a.w + n * a.w_stride, a.w_stride, a.K, t);
        store(a, m, n, R, C, t);
      }
    }
  }
}

template <QType T>
void iqgemm_t(const QGemmArgs& a, int64_t n_begin, int64_t n_end) {
#if defined(__AVX2__)
  if constexpr (qtype_packs(T)) {
    if (a.wp != nullptr) {  // whole groups of the packed copy; the rows around them row-major (the same bits)
      const int64_t g0 = (n_begin + kPackRows - 1) / kPackRows, g1 = n_end / kPackRows;
      if (g0 < g1) {
        if (n_begin < g0 * kPackRows) rowmajor<T>(a, n_begin, g0 * kPackRows);
        const int64_t nb = a.K / qtype_block(T), gbytes = nb * packed_block_bytes(T);
        for (int64_t m0 = 0; m0 < a.M; m0 += 64)  // x rows in blocks (L2), each against all groups
          for (int64_t g = g0; g < g1; ++g)
            for (int64_t m = m0; m < a.M && m < m0 + 64; m += 2) {
              const int R = a.M - m < 2 ? 1 : 2;
              float t[2][8];
              pgroup_r<T>(R, a.xq + m * a.xq_stride, a.xq_stride, a.wp + g * gbytes, nb, t);
              for (int r = 0; r < R; ++r) {
                float* y = a.y + (m + r) * a.y_stride + g * kPackRows;
                for (int i = 0; i < kPackRows; ++i) {
                  float v = t[r][i];
                  if (a.bias) v += a.bias[g * kPackRows + i];
                  y[i] = a.accumulate ? y[i] + v : v;
                }
              }
            }
        if (g1 * kPackRows < n_end) rowmajor<T>(a, g1 * kPackRows, n_end);
        return;
      }
    }
  }
#endif
  rowmajor<T>(a, n_begin, n_end);
}

}  // namespace

void iqgemm(const QGemmArgs& a, int64_t n_begin, int64_t n_end) {
  switch (QType(a.qtype)) {
    case QType::Q4_0: iqgemm_t<QType::Q4_0>(a, n_begin, n_end); return;
    case QType::Q4_1: iqgemm_t<QType::Q4_1>(a, n_begin, n_end); return;
    case QType::Q8_0: iqgemm_t<QType::Q8_0>(a, n_begin, n_end); return;
    case QType::Q4_K: iqgemm_t<QType::Q4_K>(a, n_begin, n_end); return;
    case QType::Q5_K: iqgemm_t<QType::Q5_K>(a, n_begin, n_end); return;
    case QType::Q6_K: iqgemm_t<QType::Q6_K>(a, n_begin, n_end); return;
    default: return;  // float weights never come here (qgemm runs them)
  }
}

}  // namespace RCN_ISA
}  // namespace rcn_fast
