// The exact top-n's int8 bounded scan (issue 45 item 4,
// rcn_fast/search/int8_bounded.py has the derivation): the interval that
// provably holds the float32 score of a (query, corpus row) pair, from the
// exact integer dot products of the query's two int8 terms with the row's
// int8 codes and the per-row and per-query bounds. One formula, run by the
// CPU (topn/cpu/topn_int8.cpp), the CUDA kernel (topn/cuda/topn_int8.cu) and,
// operation for operation, by the numpy reference: every product and sum is
// rounded on its own (mul_rn / add_rn), so the three agree to the bit.
#pragma once
#include <cstdint>

#include "common/macros.h"
#include "topn/topn_block_select.h"

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
// the largest padded width whose integer dot products convert to float32 exactly
constexpr int64_t kMaxWidth = 1032;

// lo <= the float32 score <= hi for exact integer dots i1 = <c1_q, c_j>,
// i2 = <c2_q, c_j>, query parameters qp[kQueryParams], row bounds rb[kRowBounds].
RCN_HD void interval(int32_t i1, int32_t i2, const float* qp, const float* rb, float* lo, float* hi) {
  using topn_select::add_rn;
  using topn_select::mul_rn;
  const float a = add_rn(float(i1), mul_rn(float(i2), 0.00390625f));  // i1 + i2 / 256
  const float ahat = mul_rn(mul_rn(qp[0], rb[0]), a);
  const float mag = ahat < 0.f ? -ahat : ahat;
  float r = mul_rn(qp[1], rb[1]);                            // rho * ||x_hat||
  r = add_rn(r, mul_rn(qp[2], rb[2]));                       // + nu * ||x - x_hat||
  r = add_rn(r, mul_rn(qp[3], add_rn(rb[1], rb[2])));        // + gamma nu (||x_hat|| + ||x - x_hat||)
  r = add_rn(r, qp[4]);                                      // + eta (underflow)
  r = add_rn(r, mul_rn(kSlack, mag));                        // + 16 u |A_hat|
  r = mul_rn(r, kInflate);
  *lo = add_rn(ahat, -r);
  *hi = add_rn(ahat, r);
}

}  // namespace rcn_fast::topn_int8
