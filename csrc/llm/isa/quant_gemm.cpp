// Matrix products with weights in their GGML format (llm/isa/quant_isa.h),
// compiled once per SIMD variant (RCN_ISA = generic | avx2 | avx512).
//
// The algorithm (activations stay float32; weights are dequantised in
// registers, never as a whole matrix):
//
//   few rows of x (M <= RMAX): one pass over w; each block of C weight rows
//     is unpacked in registers and multiplied with the M rows of x
//     (decoding: w is read once per step, the cost is the unpacking);
//   more rows: x is cut into blocks of MB rows that stay in L2; per block,
//     C weight rows at a time are unpacked into a float32 panel (L1) and an
//     R x C register tile of dot products runs over it.
//
// Both paths give every (m, n) pair the same multiply-adds in the same order
// (a W-lane accumulator over k, then a fixed lane sum): the unpacked panel
// holds exactly the values the register path computes. So y[m, n] depends
// only on x[m, :] and w[n, :] -- not on M, the batch around it or the thread
// split.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#if defined(__AVX2__) || defined(__AVX512F__)
#include <immintrin.h>
#endif

#include "llm/quant_blocks.h"
#include "llm/isa/quant_isa.h"

namespace rcn_fast {
namespace RCN_ISA {
namespace {

#include "common/isa/vecw.h"

#if defined(__AVX512F__)
constexpr int RMAX = 4, CMAX = 4;  // 16 accumulators + 8 unpacked vectors of 32
#elif defined(__AVX2__)
constexpr int RMAX = 2, CMAX = 4;  // 8 accumulators + 4 unpacked + 1 of 16
#else
constexpr int RMAX = 2, CMAX = 2;
#endif

constexpr int64_t kPrefetch = 1024;  // bytes ahead in each weight row

struct Tile {
  float v[RMAX][CMAX];
};

// The R x C accumulators of a tile: zeroed, and summed into ``out``.
template <int R, int C>
inline void zero_tile(vf (&acc)[R][C]) {
  RCN_UNROLL
  for (int r = 0; r < R; ++r)
    RCN_UNROLL
    for (int c = 0; c < C; ++c) acc[r][c] = vzero();
}

template <int R, int C>
inline void sum_tile(const vf (&acc)[R][C], Tile& out) {
  RCN_UNROLL
  for (int r = 0; r < R; ++r)
    RCN_UNROLL
    for (int c = 0; c < C; ++c) out.v[r][c] = vsum(acc[r][c]);
}

// R rows of x times C rows of a quantised w (K a multiple of 32), unpacked in registers.
template <QType T, int R, int C>
inline void tile_blocked(const float* x, int64_t xs, const uint8_t* w, int64_t ws, int64_t K, Tile& out) {
  vf acc[R][C];
  zero_tile<R, C>(acc);
  const int64_t nb = K / kQuantBlock;
  for (int64_t b = 0; b < nb; ++b) {
#if defined(__AVX2__) || defined(__AVX512F__)
    if ((b & 1) == 0) {  // the weights stream from memory once: ask for them kPrefetch bytes ahead
      RCN_UNROLL
      for (int c = 0; c < C; ++c)
        _mm_prefetch(reinterpret_cast<const char*>(w + c * ws + chunk_offset<T>(b) + kPrefetch), _MM_HINT_T0);
    }
#endif
#if defined(__AVX512F__)
    vf wv[C][kChunks];  // all C rows unpacked, x loaded once per chunk
    RCN_UNROLL
    for (int c = 0; c < C; ++c) dq_chunk<T>(w + c * ws, b, wv[c]);
    RCN_UNROLL
    for (int j = 0; j < kChunks; ++j)
      RCN_UNROLL
      for (int r = 0; r < R; ++r) {
        const vf xv = vld(x + r * xs + b * kQuantBlock + j * W);
        RCN_UNROLL
        for (int c = 0; c < C; ++c) acc[r][c] = vfma(xv, wv[c][j], acc[r][c]);
      }
#else
    RCN_UNROLL
    for (int c = 0; c < C; ++c) {  // one row unpacked at a time (16 registers)
      vf wv[kChunks];
      dq_chunk<T>(w + c * ws, b, wv);
      RCN_UNROLL
      for (int j = 0; j < kChunks; ++j)
        RCN_UNROLL
        for (int r = 0; r < R; ++r) acc[r][c] = vfma(vld(x + r * xs + b * kQuantBlock + j * W), wv[j], acc[r][c]);
    }
#endif
  }
  sum_tile<R, C>(acc, out);
}

// R rows of x times C plain rows (F32/F16 of any K; the float32 panel is a
// plain F32 w), zero past K.
template <QType T, int R, int C>
inline void tile_plain(const float* x, int64_t xs, const uint8_t* w, int64_t ws, int64_t K, Tile& out) {
  vf acc[R][C];
  zero_tile<R, C>(acc);
  // One W-wide step from k to end (k + W, or K for the last, partial
  // chunk, whose x is read zero past K).
  auto step = [&](int64_t k, int64_t end, auto partial) {
    vf xv[R];
    RCN_UNROLL
    for (int r = 0; r < R; ++r) xv[r] = decltype(partial)::value ? load_x(x + r * xs, k, K) : vld(x + r * xs + k);
    RCN_UNROLL
    for (int c = 0; c < C; ++c) {
      const vf wv = load_plain<T>(w + c * ws, k, end);
      RCN_UNROLL
      for (int r = 0; r < R; ++r) acc[r][c] = vfma(xv[r], wv, acc[r][c]);
    }
  };
  int64_t k = 0;
  for (; k + W <= K; k += W) step(k, k + W, std::false_type{});
  if (k < K) step(k, K, std::true_type{});
  sum_tile<R, C>(acc, out);
}

template <QType T, int R, int C>
inline void tile(const float* x, int64_t xs, const uint8_t* w, int64_t ws, int64_t K, Tile& out) {
  if constexpr (T == QType::F32 || T == QType::F16)
    tile_plain<T, R, C>(x, xs, w, ws, K, out);
  else
    tile_blocked<T, R, C>(x, xs, w, ws, K, out);
}

// tile<T, R, C> for run-time R <= RMAX, C <= CMAX.
template <QType T, int R>
inline void tile_c(int C, const float* x, int64_t xs, const uint8_t* w, int64_t ws, int64_t K, Tile& out) {
  static_assert(CMAX == 2 || CMAX == 4, "tile_c covers C <= 4");
  switch (C) {
    case 1: tile<T, R, 1>(x, xs, w, ws, K, out); return;
    case 2: tile<T, R, 2>(x, xs, w, ws, K, out); return;
    case 3: if constexpr (CMAX >= 3) tile<T, R, 3>(x, xs, w, ws, K, out); return;
    default: if constexpr (CMAX >= 4) tile<T, R, 4>(x, xs, w, ws, K, out); return;
  }
}

template <QType T>
inline void tile_rc(int R, int C, const float* x, int64_t xs, const uint8_t* w, int64_t ws, int64_t K, Tile& out) {
  static_assert(RMAX == 2 || RMAX == 4, "tile_rc covers R <= 4");
  switch (R) {
    case 1: tile_c<T, 1>(C, x, xs, w, ws, K, out); return;
    case 2: tile_c<T, 2>(C, x, xs, w, ws, K, out); return;
    case 3: if constexpr (RMAX >= 3) tile_c<T, 3>(C, x, xs, w, ws, K, out); return;
    default: if constexpr (RMAX >= 4) tile_c<T, 4>(C, x, xs, w, ws, K, out); return;
  }
}

inline void store_tile(const QGemmArgs& a, int64_t m0, int64_t n0, int R, int C, const Tile& t) {
  RCN_UNROLL
  for (int r = 0; r < R; ++r) {
    float* y = a.y + (m0 + r) * a.y_stride + n0;
    RCN_UNROLL
    for (int c = 0; c < C; ++c) {
      float v = t.v[r][c];
      if (a.bias) v += a.bias[n0 + c];
      y[c] = a.accumulate ? y[c] + v : v;
    }
  }
}

// Rows [n0, n0 + C) of w unpacked to float32 rows of Kp floats (zero past K).
template <QType T>
inline void unpack_panel(const QGemmArgs& a, int64_t n0, int C, int64_t Kp, float* panel) {
  RCN_UNROLL
  for (int c = 0; c < C; ++c) {
    const uint8_t* row = a.w + (n0 + c) * a.w_stride;
    float* dst = panel + c * Kp;
    if constexpr (T == QType::F32 || T == QType::F16) {
      for (int64_t k = 0; k < Kp; k += W) vst(dst + k, load_plain<T>(row, k, a.K));
    } else {
      for (int64_t b = 0; b < a.K / kQuantBlock; ++b) {
        vf wv[kChunks];
        dq_chunk<T>(row, b, wv);
        RCN_UNROLL
        for (int j = 0; j < kChunks; ++j) vst(dst + b * kQuantBlock + j * W, wv[j]);
      }
    }
  }
}

template <QType T>
void qgemm_t(const QGemmArgs& a, int64_t n_begin, int64_t n_end, float* scratch) {
  if (a.M <= RMAX) {
    for (int64_t n = n_begin; n < n_end; n += CMAX) {
      const int C = int(n_end - n < CMAX ? n_end - n : CMAX);
      Tile t;
      tile_rc<T>(int(a.M), C, a.x, a.x_stride, a.w + n * a.w_stride, a.w_stride, a.K, t);
      store_tile(a, 0, n, int(a.M), C, t);
    }
    return;
  }
  const int64_t Kp = (a.K + W - 1) / W * W;
  int64_t MB = (int64_t(1) << 17) / (a.K > 0 ? a.K : 1);  // ~512 KiB of x per block
  MB = MB < RMAX ? RMAX : MB / RMAX * RMAX;
  const int64_t ps = Kp * 4;  // panel row stride in bytes
  for (int64_t m0 = 0; m0 < a.M; m0 += MB) {
    const int64_t m1 = m0 + MB < a.M ? m0 + MB : a.M;
    for (int64_t n = n_begin; n < n_end; n += CMAX) {
      const int C = int(n_end - n < CMAX ? n_end - n : CMAX);
      unpack_panel<T>(a, n, C, Kp, scratch);
      const uint8_t* panel = reinterpret_cast<const uint8_t*>(scratch);
      for (int64_t m = m0; m < m1; m += RMAX) {
        const int R = int(m1 - m < RMAX ? m1 - m : RMAX);
        Tile t;
        tile_rc<QType::F32>(R, C, a.x + m * a.x_stride, a.x_stride, panel, ps, a.K, t);
        store_tile(a, m, n, R, C, t);
      }
    }
  }
}

}  // namespace

void qgemm(const QGemmArgs& a, int64_t n_begin, int64_t n_end, float* scratch) {
  switch (QType(a.qtype)) {
    case QType::F32: qgemm_t<QType::F32>(a, n_begin, n_end, scratch); return;
    case QType::F16: qgemm_t<QType::F16>(a, n_begin, n_end, scratch); return;
    case QType::Q4_0: qgemm_t<QType::Q4_0>(a, n_begin, n_end, scratch); return;
    case QType::Q4_1: qgemm_t<QType::Q4_1>(a, n_begin, n_end, scratch); return;
    case QType::Q8_0: qgemm_t<QType::Q8_0>(a, n_begin, n_end, scratch); return;
    case QType::Q4_K: qgemm_t<QType::Q4_K>(a, n_begin, n_end, scratch); return;
    case QType::Q5_K: qgemm_t<QType::Q5_K>(a, n_begin, n_end, scratch); return;
    case QType::Q6_K: qgemm_t<QType::Q6_K>(a, n_begin, n_end, scratch); return;
  }
}

int lanes() { return W; }

}  // namespace RCN_ISA
}  // namespace rcn_fast
