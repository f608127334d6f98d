// The exact top-n's int8 bounded scan (issue 45 item 4,
// rcn_fast/search/int8_bounded.py has the derivation): the interval that
// provably holds the float32 score of a (query, corpus row) pair, from the
// exact integer dot products of the query's two int8 terms with the row's
// int8 codes and the per-row and per-query bounds. One formula
// (interval_of), run by the CPU variants (topn/isa/topn_int8_scan.cpp, four
// lanes at a time), the CUDA kernels (topn/cuda/topn_int8.cu, through
// topn/topn_int8_scan.h) and, operation for operation, by the numpy
// reference: every product and sum is rounded on its own (mul_rn / add_rn,
// or vector operations compiled without contraction), so they agree to the
// bit.
//
// A = I1 + I2 / 256 in float32 comes from the two dot products (the CUDA
// kernels: a_of_terms) or from their combination I = 256 I1 + I2, the dot
// product of the 16-bit query term 256 c1 + c2 (the CPU variants: one
// vpmaddwd / vpdpwssd serves both terms): |I1|, |I2| < 2^24 are exact in
// float32, I2 / 256 is exact (a power of two), so the one rounding of the
// sum is RN(I1 + I2 / 256) = RN(I / 256) = RN(I) / 256 (|I| >= 1 or I = 0:
// no underflow), which a_of_dot computes from the exact int64 I.
#pragma once
#include <cstdint>

#include "common/macros.h"
#include "topn/topn_rn.h"

namespace rcn_fast::topn_int8 {

// per query: scale s_q, rho (||q - q_hat||_2), nu (||q||_2), gamma * nu, eta
constexpr int kQueryParams = 5;
// per row: scale s_j, norm (||x_hat_j||_2), err (||x_j - x_hat_j||_2)
constexpr int kRowBounds = 3;
// 16 u = 8 u' (u = 2^-24): the rounding of x_hat's dot product and of the
// interval's own arithmetic, relative to |A|
constexpr float kSlack = 9.5367431640625e-07f;
// 1 + 2^-19: the rounding of the radius's sum of non-negative terms
constexpr float kInflate = 1.0000019073486328125f;
// The largest width the checks accept (a multiple of 16: 1024 is the widest
// in use): its integer dot products convert to float32 exactly, and the
// CPU variants' 32-bit lanes (at most 65 steps of two products of at most
// 32,640 x 127) cannot overflow.
constexpr int64_t kMaxWidth = 1032;

// A from the two terms' dot products.
RCN_HD float a_of_terms(int32_t i1, int32_t i2) {
  using topn_select::add_rn;
  using topn_select::mul_rn;
  return add_rn(float(i1), mul_rn(float(i2), 0.00390625f));  // i1 + i2 / 256
}

// A from I = 256 I1 + I2 (exact in int64): RN(I) / 256, the same bits.
RCN_HD float a_of_dot(int64_t dot) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(__ll2float_rn(dot), 0.00390625f);
#else
  return topn_select::mul_rn(float(dot), 0.00390625f);  // int64 -> float rounds to nearest
#endif
}

// lo <= the float32 score <= hi for A = a (above), query parameters
// qp[kQueryParams] and row bounds rb[kRowBounds], in any type T whose
// Ops::mul / add / sub round each result once (float, or vectors of
// floats), Ops::abs clears the sign and Ops::splat makes a T of a constant.
template <class Ops, class T>
RCN_HD void interval_of(T a, const T* qp, const T* rb, T* lo, T* hi) {
  const T ahat = Ops::mul(Ops::mul(qp[0], rb[0]), a);
  T r = Ops::mul(qp[1], rb[1]);                                   // rho * ||x_hat||
  r = Ops::add(r, Ops::mul(qp[2], rb[2]));                        // + nu * ||x - x_hat||
  r = Ops::add(r, Ops::mul(qp[3], Ops::add(rb[1], rb[2])));       // + gamma nu (||x_hat|| + ||x - x_hat||)
  r = Ops::add(r, qp[4]);                                         // + eta (underflow)
  r = Ops::add(r, Ops::mul(Ops::splat(kSlack), Ops::abs(ahat)));  // + 16 u |A_hat|
  r = Ops::mul(r, Ops::splat(kInflate));
  *lo = Ops::sub(ahat, r);
  *hi = Ops::add(ahat, r);
}

#if !defined(RCN_ISA)  // the per-ISA sources bring their own (vector) Ops
// float32, each operation rounded on its own (host and device).
struct RnOps {
  RCN_HD_METHOD static float mul(float a, float b) { return topn_select::mul_rn(a, b); }
  RCN_HD_METHOD static float add(float a, float b) { return topn_select::add_rn(a, b); }
  RCN_HD_METHOD static float sub(float a, float b) { return topn_select::add_rn(a, -b); }
  RCN_HD_METHOD static float abs(float a) { return a < 0.f ? -a : a; }
  RCN_HD_METHOD static float splat(float c) { return c; }
};

// The interval of exact integer dots i1 = <c1_q, c_j>, i2 = <c2_q, c_j>.
RCN_HD void interval(int32_t i1, int32_t i2, const float* qp, const float* rb, float* lo, float* hi) {
  interval_of<RnOps>(a_of_terms(i1, i2), qp, rb, lo, hi);
}
#endif

}  // namespace rcn_fast::topn_int8
