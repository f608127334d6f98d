// Top-n scan kernels, compiled once per SIMD variant (RCN_ISA = generic |
// avx2; see CMakeLists.txt). Everything here has internal linkage or lives
// in namespace rcn_fast::RCN_ISA, and no standard-library template is used,
// so the variants cannot leak into each other at link time.
//
// The algorithm (shared with the CUDA launcher in topn/cuda/topn.cu):
//   for each block of corpus rows:
//     score the block against the queries (fp32 accumulation)
//     while the scores are hot, offer each to its query's candidate buffer
// The full [Q, N] score matrix never exists.
#include <cstdint>
#include <cstring>

#include "common/dtypes.h"
#include "topn/isa/topn_isa.h"
#if defined(__F16C__) && defined(__AVX__)
#include <immintrin.h>  // intrinsics are always-inline: nothing is emitted out of line
#endif

namespace rcn_fast {
namespace RCN_ISA {
namespace {

#include "common/isa/vec8.h"

constexpr int MR = 6;    // corpus rows per micro-tile
constexpr int NR = 16;   // queries per micro-tile (two 8-lane vectors)

inline void vstore(float* p, v8f v) { std::memcpy(p, &v, sizeof v); }
inline v8f splat(float f) { return v8f{f, f, f, f, f, f, f, f}; }

// 8 consecutive elements of a corpus row as float32.
template <DType T> inline v8f load8(const void* base, int64_t off) {
  if constexpr (T == DType::F32) {
    return vload(static_cast<const float*>(base) + off);
  } else if constexpr (T == DType::F16) {
#if defined(__F16C__) && defined(__AVX__)
    const __m256 f = _mm256_cvtph_ps(
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(base) + off)));
    v8f v;
    std::memcpy(&v, &f, sizeof v);
    return v;
#elif defined(RCN_HAVE_FLOAT16)
    v8h h;
    std::memcpy(&h, static_cast<const uint16_t*>(base) + off, sizeof h);
    return __builtin_convertvector(h, v8f);
#else
    const uint16_t* h = static_cast<const uint16_t*>(base) + off;
    return v8f{half_to_float(h[0]), half_to_float(h[1]), half_to_float(h[2]), half_to_float(h[3]),
               half_to_float(h[4]), half_to_float(h[5]), half_to_float(h[6]), half_to_float(h[7])};
#endif
  } else {
    v8u16 h;
    std::memcpy(&h, static_cast<const uint16_t*>(base) + off, sizeof h);
    v8u32 w = __builtin_convertvector(h, v8u32) << 16;
    v8f f;
    std::memcpy(&f, &w, sizeof f);
    return f;
  }
}

template <DType T> inline float load1(const void* base, int64_t off) {
  if constexpr (T == DType::F32) {
    return static_cast<const float*>(base)[off];
  } else if constexpr (T == DType::F16) {
#if defined(RCN_HAVE_FLOAT16)
    _Float16 h;
    std::memcpy(&h, static_cast<const uint16_t*>(base) + off, sizeof h);
    return float(h);
#else
    return half_to_float(static_cast<const uint16_t*>(base)[off]);
#endif
  } else {
    return bf16_to_float(static_cast<const uint16_t*>(base)[off]);
  }
}

inline void offer(TopnCollector* c, int64_t q, float s, int64_t id) {
  // NaN and -inf never pass: thr starts at -inf and only grows.
  if (!(s > c->thr[q])) return;
  int64_t& n = c->count[q];
  c->scores[q * c->cap + n] = s;
  c->ids[q * c->cap + n] = id;
  if (++n == c->cap) topn_compact(c, q);
}

// ---- few queries: stream each row once, in order, for all NQ queries ----
// One row at a time keeps a single sequential stream per thread (the
// hardware prefetcher's best case; interleaving several rows measured 1.6x
// slower on a float16 corpus). S accumulators per query split k so that
// NQ * S independent FMA chains hide the FMA latency.
template <DType T, int NQ>
void gemv_row(const TopnScanArgs& a, int64_t r) {
  constexpr int S = NQ == 1 ? 4 : 2;
  const int64_t d = a.d;
  const float* q0 = a.qrows;
  const void* row = static_cast<const char*>(a.corpus) + r * a.row_stride * (T == DType::F32 ? 4 : 2);
  v8f acc[NQ][S];
  for (int j = 0; j < NQ; ++j)
    for (int u = 0; u < S; ++u) acc[j][u] = v8f{};
  int64_t k = 0;
  for (; k + 8 * S <= d; k += 8 * S) {
    for (int u = 0; u < S; ++u) {
      const v8f x = load8<T>(row, k + 8 * u);
      for (int j = 0; j < NQ; ++j) acc[j][u] += x * vload(q0 + j * d + k + 8 * u);
    }
  }
  for (; k + 8 <= d; k += 8) {
    const v8f x = load8<T>(row, k);
    for (int j = 0; j < NQ; ++j) acc[j][0] += x * vload(q0 + j * d + k);
  }
  for (int j = 0; j < NQ; ++j) {
    v8f t = acc[j][0];
    for (int u = 1; u < S; ++u) t += acc[j][u];
    float s = hsum(t);
    for (int64_t kk = k; kk < d; ++kk) s += load1<T>(row, kk) * q0[j * d + kk];
    offer(a.col, j, s, r);
  }
}

template <DType T, int NQ>
void gemv_scan(const TopnScanArgs& a) {
  for (int64_t r = a.row_begin; r < a.row_end; ++r) gemv_row<T, NQ>(a, r);
}

// ---- many queries: register-tiled micro-kernel, MR rows x NR queries ----
// c[MR][NR] (+)= rows[i][k] * qp[k][j] over k in [0, kl)
inline void micro_kernel(const float* __restrict qp, const float* const* rows,
                         int64_t kl, float* __restrict c, bool accumulate) {
  v8f c00, c01, c10, c11, c20, c21, c30, c31, c40, c41, c50, c51;
  if (accumulate) {
    c00 = vload(c + 0);  c01 = vload(c + 8);
    c10 = vload(c + 16); c11 = vload(c + 24);
    c20 = vload(c + 32); c21 = vload(c + 40);
    c30 = vload(c + 48); c31 = vload(c + 56);
    c40 = vload(c + 64); c41 = vload(c + 72);
    c50 = vload(c + 80); c51 = vload(c + 88);
  } else {
    c00 = c01 = c10 = c11 = c20 = c21 = c30 = c31 = c40 = c41 = c50 = c51 = v8f{};
  }
  const float *r0 = rows[0], *r1 = rows[1], *r2 = rows[2], *r3 = rows[3],
              *r4 = rows[4], *r5 = rows[5];
  for (int64_t k = 0; k < kl; ++k) {
    const v8f b0 = vload(qp + k * NR), b1 = vload(qp + k * NR + 8);
    v8f x;
    x = splat(r0[k]); c00 += x * b0; c01 += x * b1;
    x = splat(r1[k]); c10 += x * b0; c11 += x * b1;
    x = splat(r2[k]); c20 += x * b0; c21 += x * b1;
    x = splat(r3[k]); c30 += x * b0; c31 += x * b1;
    x = splat(r4[k]); c40 += x * b0; c41 += x * b1;
    x = splat(r5[k]); c50 += x * b0; c51 += x * b1;
  }
  vstore(c + 0, c00);  vstore(c + 8, c01);
  vstore(c + 16, c10); vstore(c + 24, c11);
  vstore(c + 32, c20); vstore(c + 40, c21);
  vstore(c + 48, c30); vstore(c + 56, c31);
  vstore(c + 64, c40); vstore(c + 72, c41);
  vstore(c + 80, c50); vstore(c + 88, c51);
}

template <DType T>
void convert_rows(const TopnScanArgs& a, int64_t r, int64_t nb, float* dst) {
  const int64_t d = a.d;
  for (int64_t i = 0; i < nb; ++i) {
    const void* src = static_cast<const uint16_t*>(a.corpus) + (r + i) * a.row_stride;
    float* out = dst + i * d;
    int64_t k = 0;
    for (; k + 8 <= d; k += 8) vstore(out + k, load8<T>(src, k));
    for (; k < d; ++k) out[k] = load1<T>(src, k);
  }
}

template <DType T>
void gemm_scan(const TopnScanArgs& a) {
  const int64_t d = a.d, Q = a.Q;
  const int64_t nqp = (Q + NR - 1) / NR;
  // workspace: [row pointers][zero row d][converted block][score tiles]
  const float** rowp = reinterpret_cast<const float**>(a.work);
  float* zero_row = a.work + 2 * kTopnBlockRows;
  float* block = zero_row + d;
  float* tiles = block + kTopnBlockRows * d;
  for (int64_t k = 0; k < d; ++k) zero_row[k] = 0.f;

  for (int64_t b0 = a.row_begin; b0 < a.row_end; b0 += kTopnBlockRows) {
    const int64_t nb = a.row_end - b0 < kTopnBlockRows ? a.row_end - b0 : kTopnBlockRows;
    const int64_t ncp = (nb + MR - 1) / MR;
    if constexpr (T == DType::F32) {
      for (int64_t i = 0; i < nb; ++i)
        rowp[i] = static_cast<const float*>(a.corpus) + (b0 + i) * a.row_stride;
    } else {
      convert_rows<T>(a, b0, nb, block);
      for (int64_t i = 0; i < nb; ++i) rowp[i] = block + i * d;
    }
    for (int64_t i = nb; i < ncp * MR; ++i) rowp[i] = zero_row;

    for (int64_t qp = 0; qp < nqp; ++qp) {
      const float* qpanel = a.qpack + qp * d * NR;
      for (int64_t kc = 0; kc < d; kc += kTopnDepth) {
        const int64_t kl = d - kc < kTopnDepth ? d - kc : kTopnDepth;
        const float* rs[MR];
        for (int64_t cp = 0; cp < ncp; ++cp) {
          for (int i = 0; i < MR; ++i) rs[i] = rowp[cp * MR + i] + kc;
          micro_kernel(qpanel + kc * NR, rs, kl, tiles + cp * MR * NR, kc > 0);
        }
      }
      // offer the finished tiles, rows in increasing id order per query
      const int64_t q_end = (qp + 1) * NR < Q ? (qp + 1) * NR : Q;
      for (int64_t i = 0; i < nb; ++i) {
        const float* srow = tiles + i * NR;
        for (int64_t q = qp * NR; q < q_end; ++q) offer(a.col, q, srow[q - qp * NR], b0 + i);
      }
    }
  }
}

template <DType T>
void scan(const TopnScanArgs& a) {
  switch (a.Q) {
    case 1: return gemv_scan<T, 1>(a);
    case 2: return gemv_scan<T, 2>(a);
    case 3: return gemv_scan<T, 3>(a);
    case 4: return gemv_scan<T, 4>(a);
    default: return gemm_scan<T>(a);
  }
}

}  // namespace

void topn_scan(const TopnScanArgs& a) {
  switch (static_cast<DType>(a.dtype)) {
    case DType::F32: return scan<DType::F32>(a);
    case DType::F16: return scan<DType::F16>(a);
    case DType::BF16: return scan<DType::BF16>(a);
  }
}

}  // namespace RCN_ISA
}  // namespace rcn_fast
