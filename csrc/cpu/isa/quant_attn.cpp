// Attention over one sequence's key/value cache and the SiLU gate of the
// feed-forward block (cpu/isa/quant_isa.h), compiled once per SIMD variant.
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

#include "common/quant_blocks.h"
#include "cpu/isa/quant_isa.h"

namespace rcn_fast {
namespace RCN_ISA {
namespace {

#include "cpu/isa/vecw.h"

// hd = NCH * W (the last chunk may be partial: `tail` lanes, 0 = full)
template <int NCH>
void attend_t(const AttnArgs& a, int tail) {
  const int64_t n = a.n;
  const int last = tail ? tail : W;
  for (int g = 0; g < a.G; ++g) {
    const float* q = a.q + g * a.q_stride;
    float* s = a.scores + g * n;
    vf qv[NCH];
    RCN_UNROLL
    for (int c = 0; c < NCH; ++c) qv[c] = c + 1 < NCH ? vld(q + c * W) : vld_n(q + c * W, last);
    vf mx = vset(-INFINITY);
    int64_t p = 0;
    for (; p < n; ++p) {
      const float* k = a.k + p * a.kv_stride;
      vf acc = vzero();
      RCN_UNROLL
      for (int c = 0; c < NCH; ++c) acc = vfma(qv[c], c + 1 < NCH ? vld(k + c * W) : vld_n(k + c * W, last), acc);
      s[p] = vsum(acc) * a.scale;
    }
    // softmax: max, exponentials, their sum (fixed order)
    p = 0;
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
    const float inv = 1.0f / vsum(tot);
    vf acc[NCH];
    RCN_UNROLL
    for (int c = 0; c < NCH; ++c) acc[c] = vzero();
    for (p = 0; p < n; ++p) {
      const float* v = a.v + p * a.kv_stride;
      const vf e = vset(s[p]);
      RCN_UNROLL
      for (int c = 0; c < NCH; ++c) acc[c] = vfma(e, c + 1 < NCH ? vld(v + c * W) : vld_n(v + c * W, last), acc[c]);
    }
    float* out = a.out + g * a.out_stride;
    RCN_UNROLL
    for (int c = 0; c < NCH; ++c) {
      const vf r = vmul(acc[c], vset(inv));
      if (c + 1 < NCH)
        vst(out + c * W, r);
      else
        vst_n(out + c * W, r, last);
    }
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
