// The int8 bounded scan's intervals on the CPU, compiled once per SIMD
// variant (RCN_ISA = generic | avx2 | avx512vnni | avxvnni; CMakeLists.txt
// compiles this file without floating-point contraction, so the vector
// interval below rounds every product and sum on its own, as
// topn/topn_int8.h requires). Internal linkage or namespace
// rcn_fast::RCN_ISA only, and no standard-library template.
//
// The integer dot products, four corpus rows at a time:
// * generic: I1 = <c1, c_j> and I2 = <c2, c_j> in int32 (the compiler
//   vectorises the loops), A = a_of_terms(I1, I2);
// * avx2: the 16-bit query term 256 c1 + c2 (one product serves both
//   terms), 16 codes widened to int16 and multiplied pairwise into eight
//   int32 lanes (vpmaddwd, then vpaddd), as llama.cpp's q8 dot products
//   accumulate; vpmaddubsw (u8 x s8) would need a sign fix-up and two
//   products an element for the two terms, twice the work;
// * avx512vnni, avxvnni: the same with vpdpwssd (the multiply and the
//   add in one instruction; 256-bit vectors, AVX512VL for the first).
// Each lane sums at most 65 steps of two products of at most 32,640 x 127:
// below 2^31. The lanes are summed exactly (pairs in int32, then float64),
// and A = RN(I) / 256 (a_of_dot's value, topn/topn_int8.h).
#include <cstdint>
#include <cstring>

#include "topn/isa/topn_int8_isa.h"
#include "topn/topn_int8.h"
#if defined(__AVX2__)
#include <immintrin.h>  // intrinsics are always-inline: nothing is emitted out of line
#endif

namespace rcn_fast {
namespace RCN_ISA {
namespace {

typedef float v4f __attribute__((vector_size(16)));
typedef int32_t v4i __attribute__((vector_size(16)));

// Four float32 lanes, each operation rounded once (no contraction in this file).
struct V4Ops {
  static v4f mul(v4f a, v4f b) { return a * b; }
  static v4f add(v4f a, v4f b) { return a + b; }
  static v4f sub(v4f a, v4f b) { return a - b; }
  static v4f abs(v4f a) {
    v4i bits;
    std::memcpy(&bits, &a, sizeof a);
    bits &= 0x7FFFFFFF;
    std::memcpy(&a, &bits, sizeof a);
    return a;
  }
  static v4f splat(float c) { return v4f{c, c, c, c}; }
};

constexpr int kRows = 4;      // corpus rows a micro-tile
constexpr int64_t kAhead = 16;  // rows prefetched ahead (few queries: the scan streams the codes)
constexpr int64_t kQueryBlock = 16;  // queries whose 16-bit terms (24 KB at width 768) stay in L1 with the rows a pass

// The intervals of query q for rows j, j + 1, ... (nvalid of them, <= 4),
// given their A values.
inline void write_intervals(const Int8TileArgs& a, int64_t q, int64_t j, int nvalid, const v4f* rb, v4f av) {
  const float* qp = a.qparams + q * topn_int8::kQueryParams;
  v4f qpv[topn_int8::kQueryParams];
  for (int i = 0; i < topn_int8::kQueryParams; ++i) qpv[i] = V4Ops::splat(qp[i]);
  v4f lo, hi;
  topn_int8::interval_of<V4Ops>(av, qpv, rb, &lo, &hi);
  float* lo_out = a.lo + q * a.ld + (j - a.j0);
  float* hi_out = a.hi + q * a.ld + (j - a.j0);
  if (nvalid == kRows) {
    std::memcpy(lo_out, &lo, sizeof lo);
    std::memcpy(hi_out, &hi, sizeof hi);
  } else {
    for (int r = 0; r < nvalid; ++r) {
      lo_out[r] = lo[r];
      hi_out[r] = hi[r];
    }
  }
}

// The bounds of rows j .. j + 3 as three vectors (invalid lanes repeat the last row).
inline void row_bounds(const Int8TileArgs& a, int64_t j, int nvalid, v4f* rb) {
  for (int i = 0; i < topn_int8::kRowBounds; ++i) {
    for (int r = 0; r < kRows; ++r) {
      const int64_t jr = j + (r < nvalid ? r : nvalid - 1);
      rb[i][r] = a.rows[jr * topn_int8::kRowBounds + i];
    }
  }
}

#if defined(__AVX2__)

inline __m256i macc(__m256i acc, __m256i x, __m256i q) {
#if defined(RCN_ISA_AVX512VNNI)
  return _mm256_dpwssd_epi32(acc, x, q);
#elif defined(RCN_ISA_AVXVNNI)
  return _mm256_dpwssd_avx_epi32(acc, x, q);
#else
  return _mm256_add_epi32(acc, _mm256_madd_epi16(x, q));
#endif
}

// The exact sums of the eight int32 lanes of a0 .. a3, as RN(sum) / 256
// (a_of_dot): lanes paired in int32 (below 2^31: each lane is below 2^30),
// then summed in float64 (exact: below 2^53), rounded once to float32.
inline v4f exact_a(__m256i a0, __m256i a1, __m256i a2, __m256i a3) {
  const __m256i p01 = _mm256_hadd_epi32(a0, a1), p23 = _mm256_hadd_epi32(a2, a3);
  const __m256d s01 = _mm256_add_pd(_mm256_cvtepi32_pd(_mm256_castsi256_si128(p01)),
                                    _mm256_cvtepi32_pd(_mm256_extracti128_si256(p01, 1)));
  const __m256d s23 = _mm256_add_pd(_mm256_cvtepi32_pd(_mm256_castsi256_si128(p23)),
                                    _mm256_cvtepi32_pd(_mm256_extracti128_si256(p23, 1)));
  const __m256d h = _mm256_permute4x64_pd(_mm256_hadd_pd(s01, s23), _MM_SHUFFLE(3, 1, 2, 0));  // a0 a1 a2 a3
  const __m128 f = _mm_mul_ps(_mm256_cvtpd_ps(h), _mm_set1_ps(0.00390625f));
  v4f out;
  std::memcpy(&out, &f, sizeof out);
  return out;
}

inline __m256i load_codes16(const int8_t* p) {
  return _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
inline __m256i load_q16(const int16_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }

// One row's sums with queries 0 .. NQ - 1 (NQ <= 4) of qrow, two named
// accumulators a query (arrays of them were kept in memory by GCC: a
// store-to-load round trip on every step's chain).
template <int NQ>
inline void row_dots(const int8_t* row, const int16_t* qrow, int64_t width, __m256i* out) {
  const __m256i z = _mm256_setzero_si256();
  __m256i a0 = z, a1 = z, a2 = z, a3 = z, b0 = z, b1 = z, b2 = z, b3 = z;
  int64_t c = 0;
  if constexpr (NQ == 1) {  // one query: 64 bytes a step, four accumulators
    __m256i c0 = z, d0 = z;
    for (; c + 64 <= width; c += 64) {
      a0 = macc(a0, load_codes16(row + c), load_q16(qrow + c));
      b0 = macc(b0, load_codes16(row + c + 16), load_q16(qrow + c + 16));
      c0 = macc(c0, load_codes16(row + c + 32), load_q16(qrow + c + 32));
      d0 = macc(d0, load_codes16(row + c + 48), load_q16(qrow + c + 48));
    }
    a0 = _mm256_add_epi32(a0, c0);  // disjoint steps: a lane of one accumulator
    b0 = _mm256_add_epi32(b0, d0);
  }
  for (; c + 32 <= width; c += 32) {
    const __m256i x0 = load_codes16(row + c), x1 = load_codes16(row + c + 16);
    a0 = macc(a0, x0, load_q16(qrow + c));
    b0 = macc(b0, x1, load_q16(qrow + c + 16));
    if constexpr (NQ > 1) {
      a1 = macc(a1, x0, load_q16(qrow + width + c));
      b1 = macc(b1, x1, load_q16(qrow + width + c + 16));
    }
    if constexpr (NQ > 2) {
      a2 = macc(a2, x0, load_q16(qrow + 2 * width + c));
      b2 = macc(b2, x1, load_q16(qrow + 2 * width + c + 16));
    }
    if constexpr (NQ > 3) {
      a3 = macc(a3, x0, load_q16(qrow + 3 * width + c));
      b3 = macc(b3, x1, load_q16(qrow + 3 * width + c + 16));
    }
  }
  if (c < width) {
    const __m256i x0 = load_codes16(row + c);
    a0 = macc(a0, x0, load_q16(qrow + c));
    if constexpr (NQ > 1) a1 = macc(a1, x0, load_q16(qrow + width + c));
    if constexpr (NQ > 2) a2 = macc(a2, x0, load_q16(qrow + 2 * width + c));
    if constexpr (NQ > 3) a3 = macc(a3, x0, load_q16(qrow + 3 * width + c));
  }
  // the two accumulators cover disjoint steps: their lanes' sum is a lane of one (below 2^31)
  out[0] = _mm256_add_epi32(a0, b0);
  if constexpr (NQ > 1) out[1] = _mm256_add_epi32(a1, b1);
  if constexpr (NQ > 2) out[2] = _mm256_add_epi32(a2, b2);
  if constexpr (NQ > 3) out[3] = _mm256_add_epi32(a3, b3);
}

// Few queries (NQ <= 4): one row at a time, a single sequential stream a
// thread (the hardware prefetcher's best case: topn_scan.cpp's gemv_row);
// rows' sums reduced and bounded four at a time.
template <int NQ>
void few(const Int8TileArgs& a, int64_t q0) {
  const int16_t* qrow = a.q16 + q0 * a.width;
  for (int64_t j = a.j0; j < a.j1; j += kRows) {
    const int nvalid = a.j1 - j < kRows ? int(a.j1 - j) : kRows;
    __m256i acc[kRows][NQ];
    if (j + kAhead < a.j1) {  // the rows kAhead on, a cache line at a time
      const char* ahead = reinterpret_cast<const char*>(a.codes + (j + kAhead) * a.width);
      for (int64_t o = 0; o < kRows * a.width; o += 64) _mm_prefetch(ahead + o, _MM_HINT_T0);
    }
    for (int r = 0; r < kRows; ++r) {
      if (r < nvalid) {
        row_dots<NQ>(a.codes + (j + r) * a.width, qrow, a.width, acc[r]);
      } else {
        for (int b = 0; b < NQ; ++b) acc[r][b] = _mm256_setzero_si256();
      }
    }
    v4f rb[topn_int8::kRowBounds];
    row_bounds(a, j, nvalid, rb);
    for (int b = 0; b < NQ; ++b)
      write_intervals(a, q0 + b, j, nvalid, rb, exact_a(acc[0][b], acc[1][b], acc[2][b], acc[3][b]));
  }
}

// Many queries: three rows widened to int16 once (x [3][width], in L1),
// then four queries at a time against them: 12 accumulators, the three
// rows and one query's terms in the 16 registers; the four queries' sums
// of a row reduced and bounded together (their parameters transposed).
// (AVX2 has no fused multiply-add of int16: its product needs a register of
// its own, so three queries there: 9 + 3 + 1 + 1 registers.)
constexpr int kManyRows = 3;
#if defined(RCN_ISA_AVX512VNNI) || defined(RCN_ISA_AVXVNNI)
constexpr int kManyQueries = 4;
#else
constexpr int kManyQueries = 3;
#endif

// Query parameters of queries q .. q + kManyQueries - 1 (qb: the first past
// the block) as kQueryParams vectors (a fourth lane, if unused, repeats q).
inline void params_t(const Int8TileArgs& a, int64_t q, int64_t qb, v4f* qpt) {
  for (int i = 0; i < topn_int8::kQueryParams; ++i)
    for (int b = 0; b < 4; ++b)
      qpt[i][b] = a.qparams[(b < kManyQueries && q + b < qb ? q + b : q) * topn_int8::kQueryParams + i];
}

// The intervals of row j for queries q .. q + nq - 1 (nq <= 4), given their A values.
inline void write_row(const Int8TileArgs& a, int64_t q, int nq, int64_t j, const v4f* qpt, v4f av) {
  v4f rb[topn_int8::kRowBounds];
  for (int i = 0; i < topn_int8::kRowBounds; ++i) rb[i] = V4Ops::splat(a.rows[j * topn_int8::kRowBounds + i]);
  v4f lo, hi;
  topn_int8::interval_of<V4Ops>(av, qpt, rb, &lo, &hi);
  for (int b = 0; b < nq; ++b) {
    a.lo[(q + b) * a.ld + (j - a.j0)] = lo[b];
    a.hi[(q + b) * a.ld + (j - a.j0)] = hi[b];
  }
}

template <int QB>
inline void micro(const Int8TileArgs& a, int64_t q0, const int16_t* x, int64_t j, int nvalid, const v4f* qpt) {
  // named accumulators (an array of them was kept in memory by GCC)
  const __m256i z = _mm256_setzero_si256();
  __m256i a00 = z, a01 = z, a02 = z, a03 = z, a10 = z, a11 = z, a12 = z, a13 = z, a20 = z, a21 = z, a22 = z, a23 = z;
  const int16_t* qrow = a.q16 + q0 * a.width;
  const int16_t *x0p = x, *x1p = x + a.width, *x2p = x + 2 * a.width;
  for (int64_t c = 0; c < a.width; c += 16) {
    const __m256i x0 = _mm256_load_si256(reinterpret_cast<const __m256i*>(x0p + c));
    const __m256i x1 = _mm256_load_si256(reinterpret_cast<const __m256i*>(x1p + c));
    const __m256i x2 = _mm256_load_si256(reinterpret_cast<const __m256i*>(x2p + c));
    __m256i qv = load_q16(qrow + c);
    a00 = macc(a00, x0, qv);
    a10 = macc(a10, x1, qv);
    a20 = macc(a20, x2, qv);
    if constexpr (QB > 1) {
      qv = load_q16(qrow + a.width + c);
      a01 = macc(a01, x0, qv);
      a11 = macc(a11, x1, qv);
      a21 = macc(a21, x2, qv);
    }
    if constexpr (QB > 2) {
      qv = load_q16(qrow + 2 * a.width + c);
      a02 = macc(a02, x0, qv);
      a12 = macc(a12, x1, qv);
      a22 = macc(a22, x2, qv);
    }
    if constexpr (QB > 3 && kManyQueries > 3) {
      qv = load_q16(qrow + 3 * a.width + c);
      a03 = macc(a03, x0, qv);
      a13 = macc(a13, x1, qv);
      a23 = macc(a23, x2, qv);
    }
  }
  write_row(a, q0, QB, j, qpt, exact_a(a00, a01, a02, a03));
  if (nvalid > 1) write_row(a, q0, QB, j + 1, qpt, exact_a(a10, a11, a12, a13));
  if (nvalid > 2) write_row(a, q0, QB, j + 2, qpt, exact_a(a20, a21, a22, a23));
}

void many(const Int8TileArgs& a, int64_t qa, int64_t qb) {
  alignas(32) int16_t x[kManyRows * topn_int8::kMaxWidth];
  v4f qpt[(kQueryBlock / kManyQueries + 1) * topn_int8::kQueryParams];
  for (int64_t q = qa; q < qb; q += kManyQueries) params_t(a, q, qb, qpt + ((q - qa) / kManyQueries) * topn_int8::kQueryParams);
  for (int64_t j = a.j0; j < a.j1; j += kManyRows) {
    const int nvalid = a.j1 - j < kManyRows ? int(a.j1 - j) : kManyRows;
    if (j + 2 * kManyRows < a.j1) {  // the group after next, while this one computes
      const char* ahead = reinterpret_cast<const char*>(a.codes + (j + 2 * kManyRows) * a.width);
      for (int64_t o = 0; o < kManyRows * a.width; o += 64) _mm_prefetch(ahead + o, _MM_HINT_T0);
    }
    for (int r = 0; r < kManyRows; ++r) {  // invalid rows: zeros
      const int8_t* row = a.codes + (j + r) * a.width;
      for (int64_t c = 0; c < a.width; c += 16)
        _mm256_store_si256(reinterpret_cast<__m256i*>(x + r * a.width + c),
                           r < nvalid ? load_codes16(row + c) : _mm256_setzero_si256());
    }
    for (int64_t q = qa; q < qb; q += kManyQueries) {
      const v4f* qp = qpt + ((q - qa) / kManyQueries) * topn_int8::kQueryParams;
      switch (qb - q < kManyQueries ? int(qb - q) : kManyQueries) {
        case 1: micro<1>(a, q, x, j, nvalid, qp); break;
        case 2: micro<2>(a, q, x, j, nvalid, qp); break;
        case 3: micro<3>(a, q, x, j, nvalid, qp); break;
        default: micro<kManyQueries>(a, q, x, j, nvalid, qp);
      }
    }
  }
}

void rows_all(const Int8TileArgs& a) {
  switch (a.Q) {
    case 1: return few<1>(a, 0);
    case 2: return few<2>(a, 0);
    case 3: return few<3>(a, 0);
    case 4: return few<4>(a, 0);
    default:
      // a block of queries over every row of the range (their terms stay
      // in the L2 cache), four rows at a time (in L1 over the block)
      for (int64_t qa = 0; qa < a.Q; qa += kQueryBlock) many(a, qa, qa + kQueryBlock < a.Q ? qa + kQueryBlock : a.Q);
  }
}

#else  // generic

int32_t dot_i8(const int8_t* x, const int8_t* y, int64_t n) {
  int32_t s = 0;
  for (int64_t i = 0; i < n; ++i) s += int32_t(x[i]) * int32_t(y[i]);
  return s;
}

void rows4(const Int8TileArgs& a, int64_t qa, int64_t qb, int64_t j, int nvalid) {
  v4f rb[topn_int8::kRowBounds];
  row_bounds(a, j, nvalid, rb);
  for (int64_t q = qa; q < qb; ++q) {
    const int8_t* c1 = a.qcodes + q * 2 * a.width;
    v4f av = V4Ops::splat(0.f);
    for (int r = 0; r < kRows; ++r) {
      const int8_t* row = a.codes + (j + (r < nvalid ? r : nvalid - 1)) * a.width;
      av[r] = topn_int8::a_of_terms(dot_i8(c1, row, a.width), dot_i8(c1 + a.width, row, a.width));
    }
    write_intervals(a, q, j, nvalid, rb, av);
  }
}

void rows_all(const Int8TileArgs& a) {
  for (int64_t j = a.j0; j < a.j1; j += kRows) rows4(a, 0, a.Q, j, a.j1 - j < kRows ? int(a.j1 - j) : kRows);
}

#endif

}  // namespace

bool int8_uses_q16() {
#if defined(__AVX2__)
  return true;
#else
  return false;
#endif
}

void int8_intervals(const Int8TileArgs& a) {
  if (a.j1 > a.j0 && a.Q > 0) rows_all(a);
}

}  // namespace RCN_ISA
}  // namespace rcn_fast
