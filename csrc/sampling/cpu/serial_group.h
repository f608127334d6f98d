// One host thread as the subset sampler's lane group
// (sampling/subset_sampler.h): rank 0 of 1, every reduction the value
// itself. Include it inside an anonymous namespace (and, in a file compiled
// per SIMD variant, inside `namespace RCN_ISA`), after <cstdint>: code
// compiled per variant shares no inline helper with the baseline
// (topn/isa/topn_isa.h), so each file holds its own copy of this one
// definition.
#ifndef RCN_FAST_SAMPLING_CPU_SERIAL_GROUP_H
#define RCN_FAST_SAMPLING_CPU_SERIAL_GROUP_H

struct SerialGroup {
  int rank() const { return 0; }
  int size() const { return 1; }
  float sum_f(float x) const { return x; }
  float max_f(float x) const { return x; }
  float exscan_f(float) const { return 0.f; }
  int64_t sum_i(int64_t x) const { return x; }
  int64_t exscan_i(int64_t) const { return 0; }
  int64_t min_i(int64_t x) const { return x; }
  int64_t max_i(int64_t x) const { return x; }
};

#endif  // RCN_FAST_SAMPLING_CPU_SERIAL_GROUP_H
