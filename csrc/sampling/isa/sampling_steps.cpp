// The CPU's draws: the shared per-step logic of sampling/subset_sampler.h run
// with a one-lane group, compiled once per SIMD variant (RCN_ISA) with the
// kernel flags, so its branch-free passes (logits, exp, sums) vectorise,
// and with -ffp-contract=off (CMakeLists.txt): a logit is computed with the
// same roundings in the vectorised pass and in the scalar recomputation of
// the chosen one, in every inlined copy.
// All of subset_sampler.h is RCN_HD (static inline on the host) and the
// group lives in an anonymous namespace: nothing here can be merged with
// another variant at link time (see topn/isa/topn_isa.h).
#include <cstdint>

#include "sampling/subset_sampler.h"
#include "sampling/isa/sampling_isa.h"

namespace rcn_fast {
namespace RCN_ISA {
namespace {

#include "sampling/cpu/serial_group.h"  // the lanes of a CPU thread: one

}  // namespace

int sampling_draw_step(const SamplingDrawArgs& a) {
  sampler::StepArgs sa{};
  sa.rel = a.rel;
  sa.w = a.w;
  sa.n = a.n;
  sa.inv_tau = a.inv_tau;
  sa.first_relevance = a.first_relevance;
  sa.seed = a.seed;
  sa.stream = a.stream;
  const SerialGroup lane;
  for (int64_t g = 0; g < a.G; ++g) {
    sa.acc = a.acc + g * a.n;
    sa.eligible = a.eligible + g * a.n;
    sa.subset = uint32_t(a.s0 + g);
    const sampler::Draw dr = sampler::sample_step(lane, sa, a.t);
    if (dr.index == sampler::kNonFinite) return 2;
    a.ids_out[g * a.out_stride] = dr.index;
    if (a.logp_out) a.logp_out[g * a.out_stride] = dr.logp;
    a.chosen[g] = dr.index;
    if (dr.index >= 0) a.eligible[g * a.n + dr.index] = 0;
  }
  return 0;
}

}  // namespace RCN_ISA
}  // namespace rcn_fast
