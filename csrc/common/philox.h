// Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2,
// 3", SC'11): a counter-based generator. The output is a pure function of a
// 128-bit counter and a 64-bit key, so any thread can produce the number for
// (seed, stream, subset, step) directly, in any order, with no shared state.
// Host and device share this code (RCN_HD); rcn_fast/sampling/philox.py is
// the numpy twin and tests/test_sampling_philox.py checks both against the
// published known-answer vectors.
#pragma once
#include <cstdint>

#include "common/macros.h"

namespace rcn_fast {

struct Philox4x32 {
  uint32_t v[4];
};

RCN_HD void philox_mulhilo(uint32_t a, uint32_t b, uint32_t& hi, uint32_t& lo) {
  const uint64_t p = uint64_t(a) * uint64_t(b);
  hi = uint32_t(p >> 32);
  lo = uint32_t(p);
}

// Ten rounds of Philox4x32 on counter c with key (k0, k1).
RCN_HD Philox4x32 philox4x32_10(Philox4x32 c, uint32_t k0, uint32_t k1) {
  constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;
  constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
  for (int round = 0; round < 10; ++round) {
    uint32_t hi0, lo0, hi1, lo1;
    philox_mulhilo(kM0, c.v[0], hi0, lo0);
    philox_mulhilo(kM1, c.v[2], hi1, lo1);
    const Philox4x32 next{{hi1 ^ c.v[1] ^ k0, lo1, hi0 ^ c.v[3] ^ k1, lo0}};
    c = next;
    k0 += kW0;
    k1 += kW1;
  }
  return c;
}

// The sampler's stream layout: key = seed (64 bits), counter = (stream id
// (64 bits), subset, step). The first output word becomes a float in
// [0, 1) with 24 random bits (exactly representable, never 1).
RCN_HD float sampler_uniform(uint64_t seed, uint64_t stream, uint32_t subset, uint32_t step) {
  const Philox4x32 ctr{{uint32_t(stream), uint32_t(stream >> 32), subset, step}};
  const Philox4x32 out = philox4x32_10(ctr, uint32_t(seed), uint32_t(seed >> 32));
  return float(out.v[0] >> 8) * (1.0f / 16777216.0f);
}

}  // namespace rcn_fast
