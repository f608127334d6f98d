// Attention over one sequence's key/value cache and the SiLU gate of the
// feed-forward block (llm/isa/quant_isa.h), compiled once per SIMD variant.
//
// attend: for the G query heads of one key/value head (grouped-query
// attention), scores s_p = scale * q . k_p for every cached position p,
// an exact softmax (max subtracted, vexp, the sum taken once), then
// out = sum_p e_p v_p / sum_p e_p. Each (query row, head) is computed alone,
// so its result does not depend on the other rows of the batch.
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

#include "common/isa/vecw.h"

// hd = NCH * W (the last chunk may be partial: `tail` lanes, 0 = full)
template <int NCH>
inline vf chunk_load(const float* p, int c, int last) {
  return c + 1 < NCH ? vld(p + c * W) : vld_n(p + c * W, last);
}

constexpr int64_t kAhead = 8;  // positions prefetched ahead (the cache rows stream from memory once)

// Ask for a row of hd = NCH * W floats (its cache lines) ahead of its use.
template <int NCH>
inline void prefetch_row(const float* p) {
#if defined(__AVX2__) || defined(__AVX512F__)
  RCN_UNROLL
  for (int l = 0; l < (NCH * W * 4 + 63) / 64; ++l) _mm_prefetch(reinterpret_cast<const char*>(p) + 64 * l, _MM_HINT_T0);
#else
  (void)p;
#endif
}

// Scores of one query head against positions [0, n): four positions at a
// time share one reduction (vsum4; the same tree as a single vsum).
template <int NCH>
void scores_t(const AttnArgs& a, const float* q, float* s, int last) {
  vf qv[NCH];
  RCN_UNROLL
  for (int c = 0; c < NCH; ++c) qv[c] = chunk_load<NCH>(q, c, last);
  int64_t p = 0;
  for (; p + 4 <= a.n; p += 4) {
    RCN_UNROLL
    for (int i = 0; i < 4; ++i)
      if (p + i + kAhead < a.n) prefetch_row<NCH>(a.k + (p + i + kAhead) * a.kv_stride);
    vf acc[4];
    RCN_UNROLL
    for (int i = 0; i < 4; ++i) acc[i] = vzero();
    RCN_UNROLL
    for (int c = 0; c < NCH; ++c)
      RCN_UNROLL
      for (int i = 0; i < 4; ++i) acc[i] = vfma(qv[c], chunk_load<NCH>(a.k + (p + i) * a.kv_stride, c, last), acc[i]);
    vsum4(acc[0], acc[1], acc[2], acc[3], s + p);
    RCN_UNROLL
    for (int i = 0; i < 4; ++i) s[p + i] *= a.scale;
  }
  for (; p < a.n; ++p) {
    vf acc = vzero();
    RCN_UNROLL
    for (int c = 0; c < NCH; ++c) acc = vfma(qv[c], chunk_load<NCH>(a.k + p * a.kv_stride, c, last), acc);
    s[p] = vsum(acc) * a.scale;
  }
}

// exp(s - max) in place; returns 1 / their sum.
inline float softmax_inplace(float* s, int64_t n) {
  vf mx = vset(-INFINITY);
  int64_t p = 0;
  for (; p + W <= n; p += W) mx = vmax(mx, vld(s + p));
  float m = vhmax(mx);
  for (; p < n; ++p) m = s[p] > m ? s[p] : m;
  if (std::isnan(m)) m = 0.0f;  // NaN scores stay NaN through the exponentials
  vf tot = vzero();
  p = 0;
  for (; p + W <= n; p += W) {
    const vf e = vexp(vsub(vld(s + p), vset(m)));
    vst(s + p, e);
    tot = vadd(tot, e);
  }
  if (p < n) {
    const int r = int(n - p);
    const vf e = vexp(vsub(vld_n(s + p, r), vset(m)));
    vst_n(s + p, e, r);
    tot = vadd(tot, vld_n(s + p, r));
  }
  return 1.0f / vsum(tot);
}

// out_g = sum_p e_gp v_p * inv_g for the G heads at once (each value row read once).
template <int NCH, int G>
void values_t(const AttnArgs& a, const float* inv, int last) {
  vf acc[G][NCH];
  RCN_UNROLL
  for (int g = 0; g < G; ++g)
    RCN_UNROLL
    for (int c = 0; c < NCH; ++c) acc[g][c] = vzero();
  for (int64_t p = 0; p < a.n; ++p) {
    const float* v = a.v + p * a.kv_stride;
    if (p + kAhead < a.n) prefetch_row<NCH>(v + kAhead * a.kv_stride);
    RCN_UNROLL
    for (int c = 0; c < NCH; ++c) {
      const vf vc = chunk_load<NCH>(v, c, last);
      RCN_UNROLL
      for (int g = 0; g < G; ++g) acc[g][c] = vfma(vset(a.scores[g * a.n + p]), vc, acc[g][c]);
    }
  }
  RCN_UNROLL
  for (int g = 0; g < G; ++g) {
    float* out = a.out + g * a.out_stride;
    RCN_UNROLL
    for (int c = 0; c < NCH; ++c) {
      const vf r = vmul(acc[g][c], vset(inv[g]));
      if (c + 1 < NCH)
        vst(out + c * W, r);
      else
        vst_n(out + c * W, r, last);
    }
  }
}

template <int NCH>
void attend_t(const AttnArgs& a, int tail) {
  const int last = tail ? tail : W;
  float inv[64];
  for (int g = 0; g < a.G; ++g) {
    scores_t<NCH>(a, a.q + g * a.q_stride, a.scores + g * a.n, last);
    inv[g] = softmax_inplace(a.scores + g * a.n, a.n);
  }
  if (a.G * NCH <= 16 && a.G <= 4) {  // all heads' accumulators fit the registers
    switch (a.G) {
      case 1: values_t<NCH, 1>(a, inv, last); return;
      case 2: if constexpr (2 * NCH <= 16) values_t<NCH, 2>(a, inv, last); return;
      case 3: if constexpr (3 * NCH <= 16) values_t<NCH, 3>(a, inv, last); return;
      default: if constexpr (4 * NCH <= 16) values_t<NCH, 4>(a, inv, last); return;
    }
  }
  for (int g = 0; g < a.G; ++g) {
    AttnArgs one = a;
    one.scores = a.scores + g * a.n;
    one.out = a.out + g * a.out_stride;
    values_t<NCH, 1>(one, inv + g, last);
  }
}

}  // namespace

void attend(const AttnArgs& a) {
  const int nch = (a.hd + W - 1) / W, tail = a.hd % W;
  switch (nch) {
    case 1: attend_t<1>(a, tail); return;
    case 2: attend_t<2>(a, tail); return;
    case 3: attend_t<3>(a, tail); return;
    case 4: attend_t<4>(a, tail); return;
    case 5: attend_t<5>(a, tail); return;
    case 6: attend_t<6>(a, tail); return;
    case 7: attend_t<7>(a, tail); return;
    case 8: attend_t<8>(a, tail); return;
    case 9: attend_t<9>(a, tail); return;
    case 10: attend_t<10>(a, tail); return;
    case 11: attend_t<11>(a, tail); return;
    case 12: attend_t<12>(a, tail); return;
    case 13: attend_t<13>(a, tail); return;
    case 14: attend_t<14>(a, tail); return;
    case 15: attend_t<15>(a, tail); return;
    case 16: attend_t<16>(a, tail); return;
    case 32: attend_t<32>(a, tail); return;  // hd 256 on 8 lanes
    default: break;
  }
  // any other head size: a plain loop (the driver refuses hd > 512)
  for (int g = 0; g < a.G; ++g) {
    const float* q = a.q + g * a.q_stride;
    float* s = a.scores + g * a.n;
    float m = -INFINITY;
    for (int64_t p = 0; p < a.n; ++p) {
      const float* k = a.k + p * a.kv_stride;
      float acc = 0.0f;
      for (int i = 0; i < a.hd; ++i) acc += q[i] * k[i];
      s[p] = acc * a.scale;
      m = s[p] > m ? s[p] : m;
    }
    if (std::isnan(m)) m = 0.0f;
    float tot = 0.0f;
    for (int64_t p = 0; p < a.n; ++p) tot += (s[p] = std::exp(s[p] - m));
    float* out = a.out + g * a.out_stride;
    for (int i = 0; i < a.hd; ++i) out[i] = 0.0f;
    for (int64_t p = 0; p < a.n; ++p)
      for (int i = 0; i < a.hd; ++i) out[i] += s[p] * a.v[p * a.kv_stride + i];
    for (int i = 0; i < a.hd; ++i) out[i] *= 1.0f / tot;
  }
}

void silu_mul(float* g, const float* u, int64_t n) {
  int64_t i = 0;
  const vf one = vset(1.0f);
  for (; i + W <= n; i += W) {
    const vf x = vld(g + i);
    vst(g + i, vmul(vdiv(x, vadd(one, vexp(vsub(vzero(), x)))), vld(u + i)));
  }
  if (i < n) {
    const int r = int(n - i);
    const vf x = vld_n(g + i, r);
    vst_n(g + i, vmul(vdiv(x, vadd(one, vexp(vsub(vzero(), x)))), vld_n(u + i, r)), r);
  }
}

}  // namespace RCN_ISA
}  // namespace rcn_fast
