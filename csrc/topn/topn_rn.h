// a * b and a + b rounded once each, never fused into one fma by the
// compiler (the torch backend scales and sums a split query's terms with
// separate float32 operations; the block select must round the same way,
// and the int8 scan's interval, topn/topn_int8.h, is bit-equal on the CPU
// and the GPU only so). Free functions with internal linkage on the host:
// safe to include in the per-ISA sources (csrc/*/isa/).
#pragma once
#include "common/macros.h"

namespace rcn_fast::topn_select {

RCN_HD float mul_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  volatile float p = a * b;
  return p;
#endif
}
RCN_HD float add_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  volatile float s = a + b;
  return s;
#endif
}

}  // namespace rcn_fast::topn_select
