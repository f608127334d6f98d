// Relevance-based subset sampling (ReConnect eqs. 4-6): the per-step logic,
// written once and run by the CPU launcher (sampling/cpu/sampling.cpp, one lane) and
// the CUDA launcher (sampling/cuda/sampling.cu, one warp of 32 lanes per subset).
//
// For question b and subset s, step t draws document c_t from the
// candidates still eligible (valid and not yet chosen):
//   t = 0, first = uniform:    uniform over eligible candidates
//   t = 0, first = relevance:  p_j ∝ exp(rel_j / tau)
//   t >= 1:                    p_j ∝ exp((acc_j / t + rel_j) / tau)
// where rel_j = dot(e_q, e_j) and acc_j = sum over chosen c of dot(e_c, e_j),
// so acc_j / t = dot(mean of the chosen embeddings, e_j). The draw is an
// inverse-CDF draw with the uniform u = sampler_uniform(seed, stream, s, t)
// (common/philox.h): the first j, in index order, whose running sum of
// weights exceeds u * total. rcn_fast/sampling/reference.py is the same
// procedure in plain numpy.
//
// A Group is the set of lanes that cooperate on one subset. It provides
//   rank(), size(), and reductions whose result every lane receives:
//   sum_f, max_f, exscan_f (exclusive prefix sum in lane order), sum_i,
//   exscan_i, min_i, max_i (int64).
// Each lane owns a contiguous chunk of the candidates (lane_chunk), so the
// lane-order prefix sums are prefix sums in candidate order. The groups:
// SerialGroup (one lane, sampling/isa/sampling_steps.cpp, compiled per SIMD
// variant so the loops below vectorise) and WarpGroup (sampling/cuda/sampling.cu).
//
// Everything here is RCN_HD (static inline on the host): each translation
// unit keeps its own copy, as the ISA rules of topn/isa/topn_isa.h require.
#pragma once
#include <cstdint>

#include "common/dtypes.h"
#include "common/macros.h"
#include "common/philox.h"
#include "common/problems.h"


namespace rcn_fast::sampler {

// Draw::index values that are not candidate indices.
constexpr int64_t kNone = -1;       // no eligible candidate left (padding)
constexpr int64_t kNonFinite = -2;  // a score (or score / tau) is NaN or inf

struct Draw {
  int64_t index;
  float logp;  // log-probability of this draw; 0 for kNone
};


// exp(x) for x <= 0 (the softmax weights exp(z - max)), the same arithmetic
// on host and device: x = k ln2 + r with |r| <= ln2 / 2, a degree-6 Taylor
// polynomial for e^r (truncation error < 1e-7 relative) times 2^k. Inlined
// and branch-light, it is several times cheaper than a libm call. Results
// below e^-87 (float32's normal range) are flushed to 0.
RCN_HD float sampler_exp_nonpos(float x) {
  const float xc = x < -87.0f ? -87.0f : x;  // -inf -> -87 (x is never NaN)
  const int k = int(xc * 1.44269504f - 0.5f);  // round to nearest (xc <= 0)
  const float kf = float(k);
  float r = xc - kf * 0.693145751953125f;      // ln2, Cody-Waite split
  r = r - kf * 1.428606765330187e-06f;
  float p = 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const float y = p * bits_to_float(uint32_t(k + 127) << 23);
  return y * float(x >= -87.0f);  // a product, not a branch: vectorises
}
RCN_HD float sampler_log(float x) {
#if defined(__CUDA_ARCH__)
  return logf(x);
#else
  return __builtin_logf(x);  // no std:: inline wrapper (see topn/isa/topn_isa.h)
#endif
}
RCN_HD bool sampler_isfinite(float x) { return x - x == 0.f; }

// [lo, hi): the candidates lane g.rank() owns.
template <class G>
RCN_HD void lane_chunk(const G& g, int64_t n, int64_t& lo, int64_t& hi) {
  const int64_t chunk = (n + g.size() - 1) / g.size();
  lo = int64_t(g.rank()) * chunk;
  if (lo > n) lo = n;
  hi = lo + chunk;
  if (hi > n) hi = n;
}

// The candidate of rank floor(u * m) among the m eligible ones (index order).
template <class G>
RCN_HD Draw draw_uniform(const G& g, const uint8_t* eligible, int64_t n, float u) {
  int64_t lo, hi;
  lane_chunk(g, n, lo, hi);
  int64_t local = 0;
  for (int64_t j = lo; j < hi; ++j) local += eligible[j] ? 1 : 0;
  const int64_t m = g.sum_i(local);
  if (m == 0) return Draw{kNone, 0.f};
  const int64_t prefix = g.exscan_i(local);
  int64_t target = int64_t(double(u) * double(m));
  if (target >= m) target = m - 1;
  int64_t found = -1;
  if (target >= prefix && target < prefix + local) {
    int64_t seen = prefix;
    for (int64_t j = lo; j < hi; ++j) {
      if (!eligible[j]) continue;
      if (seen == target) {
        found = j;
        break;
      }
      ++seen;
    }
  }
  return Draw{g.max_i(found), -sampler_log(float(m))};
}

// p_j ∝ exp(z_j), z_j = (acc_j * inv_count + rel_j) * inv_tau over eligible j.
// `w` is scratch for n floats (the weights). inv_count = 0 ignores acc
// (which must then still hold finite values, e.g. zeros).
template <class G>
RCN_HD Draw draw_softmax(const G& g, const float* rel, const float* acc, float inv_count,
                         float inv_tau, const uint8_t* eligible, int64_t n, float u, float* w) {
  int64_t lo, hi;
  lane_chunk(g, n, lo, hi);
  const float ninf = -bits_to_float(0x7f800000u);
  // Branch-free passes over the lane's chunk (ineligible candidates get
  // logit -inf, weight 0), eight partial maxima / sums in a fixed order, so
  // a compiler can vectorise them.
  float mp[8], sp[8];
  for (int l = 0; l < 8; ++l) {
    mp[l] = ninf;
    sp[l] = 0.f;
  }
  int64_t j;
  for (j = lo; j < hi; ++j) {
    const float z = (acc[j] * inv_count + rel[j]) * inv_tau;
    w[j] = eligible[j] ? z : ninf;
  }
  int bad = 0;  // an eligible logit that is NaN or +-inf
  for (j = lo; j < hi; ++j) bad |= int(eligible[j] != 0) & int(!(w[j] - w[j] == 0.f));
  for (j = lo; j + 8 <= hi; j += 8)
    for (int l = 0; l < 8; ++l) mp[l] = w[j + l] > mp[l] ? w[j + l] : mp[l];
  for (; j < hi; ++j) mp[0] = w[j] > mp[0] ? w[j] : mp[0];
  if (g.max_i(bad)) return Draw{kNonFinite, 0.f};
  float m_local = mp[0];
  for (int l = 1; l < 8; ++l) m_local = mp[l] > m_local ? mp[l] : m_local;
  const float m = g.max_f(m_local);
  if (!(m > ninf)) return Draw{kNone, 0.f};  // nothing eligible
  for (j = lo; j < hi; ++j) w[j] = sampler_exp_nonpos(w[j] - m);
  for (j = lo; j + 8 <= hi; j += 8)
    for (int l = 0; l < 8; ++l) sp[l] += w[j + l];
  for (; j < hi; ++j) sp[0] += w[j];
  const float s_local = ((sp[0] + sp[1]) + (sp[2] + sp[3])) + ((sp[4] + sp[5]) + (sp[6] + sp[7]));
  const float total = g.sum_f(s_local);
  const float prefix = g.exscan_f(s_local);
  const float target = u * total;
  // First j (index order) with a positive weight whose running sum passes
  // the target; rounding can leave none, then the last positive weight wins.
  const int64_t kBig = int64_t(0x7fffffffffffffff);
  int64_t found = kBig;
  float run = prefix;
  for (j = lo; j < hi; ++j) {
    if (!(w[j] > 0.f)) continue;  // ineligible or underflowed
    run += w[j];
    if (run > target) {
      found = j;
      break;
    }
  }
  int64_t idx = g.min_i(found);
  if (idx == kBig) {  // the same on every lane
    int64_t last = -1;
    for (j = hi - 1; j >= lo; --j)
      if (w[j] > 0.f) {
        last = j;
        break;
      }
    idx = g.max_i(last);
  }
  const float z = (acc[idx] * inv_count + rel[idx]) * inv_tau;
  return Draw{idx, (z - m) - sampler_log(total)};
}

// Everything one step of one subset reads and writes.
struct StepArgs {
  const float* rel;        // [n] dot(e_q, e_j) (valid j)
  const float* acc;        // [n] sum over the chosen c of dot(e_c, e_j)
  uint8_t* eligible;       // [n] 1 = valid and not chosen yet
  float* w;                // [n] scratch
  int64_t n;
  float inv_tau;
  bool first_relevance;
  uint64_t seed, stream;
  uint32_t subset;
};

// The step arguments of subset `s` of question `b` of `p` (CPU and CUDA):
// `rel_row` is that question's relevance row, the rest per-subset scratch.
RCN_HD StepArgs step_args(const SamplingProblem& p, int64_t b, int64_t s, const float* rel_row,
                          const float* acc, uint8_t* eligible, float* w) {
  StepArgs a{};
  a.rel = rel_row;
  a.acc = acc;
  a.eligible = eligible;
  a.w = w;
  a.n = p.n;
  a.inv_tau = p.inv_tau;
  a.first_relevance = p.first_relevance;
  a.seed = p.seed;
  a.stream = uint64_t(p.keys[b]);
  a.subset = uint32_t(s);
  return a;
}

// Step t of a subset: the draw (no bookkeeping: the caller marks the chosen
// candidate ineligible, adds its similarity row to acc, and writes outputs).
template <class G>
RCN_HD Draw sample_step(const G& g, const StepArgs& a, int64_t t) {
  const float u = sampler_uniform(a.seed, a.stream, a.subset, uint32_t(t));
  if (t == 0 && !a.first_relevance) return draw_uniform(g, a.eligible, a.n, u);
  const float inv_count = t == 0 ? 0.f : 1.0f / float(t);
  return draw_softmax(g, a.rel, a.acc, inv_count, a.inv_tau, a.eligible, a.n, u, a.w);
}

}  // namespace rcn_fast::sampler
