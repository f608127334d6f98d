// Interface between the int8 bounded scan's driver (topn/cpu/topn_int8.cpp,
// baseline flags) and its per-ISA kernel (topn/isa/topn_int8_scan.cpp,
// compiled once per variant: generic, avx2 and, where the compiler has
// them, avx512vnni and avxvnni). Declarations and plain structs only (see
// topn_isa.h for why).
#pragma once
#include <cstdint>

namespace rcn_fast {

// The intervals (topn/topn_int8.h) of queries [0, Q) and corpus rows
// [j0, j1), into lo / hi at q * ld + (j - j0).
struct Int8TileArgs {
  const int8_t* codes;    // row j at codes + j * width
  const float* rows;      // [N, 3] bounds: scale, norm, err
  const int8_t* qcodes;   // [Q, 2, width]: the two int8 terms c1, c2 (the generic variant)
  const int16_t* q16;     // [Q, width]: 256 c1 + c2 (the avx2 and vnni variants: one product for both terms)
  const float* qparams;   // [Q, 5]
  int64_t width, Q, j0, j1;
  float* lo;
  float* hi;
  int64_t ld;
};

#define RCN_INT8_ISA_DECLS                   \
  void int8_intervals(const Int8TileArgs& a); \
  bool int8_uses_q16();

namespace generic {
RCN_INT8_ISA_DECLS
}
namespace avx2 {
RCN_INT8_ISA_DECLS
}
namespace avx512vnni {
RCN_INT8_ISA_DECLS
}
namespace avxvnni {
RCN_INT8_ISA_DECLS
}
#undef RCN_INT8_ISA_DECLS

}  // namespace rcn_fast
