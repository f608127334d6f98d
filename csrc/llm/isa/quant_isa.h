// Interface between the quantised-weight drivers (llm/cpu/quant_kernels.cpp,
// llm/cpu/decoder.cpp; baseline flags) and their ISA-specific kernels
// (llm/isa/quant_gemm.cpp, llm/isa/quant_idot.cpp, llm/isa/quant_xq.cpp,
// llm/isa/quant_attn.cpp, compiled once per SIMD variant: generic, avx2,
// avx512, avx512vnni).
// Declarations and plain structs only (see topn_isa.h for why).
#pragma once
#include <cstdint>

namespace rcn_fast {

// y[m, n] (+)= bias[n] + sum_k x[m, k] * w[n, k] for n in [n_begin, n_end).
// w: N rows of `w_stride` bytes in the GGML format `qtype` (llm/quant_blocks.h).
//
// Two arithmetics. With xq == nullptr (or F32/F16 weights): float32
// activations (qgemm); per (m, n) pair a vector of W lanes (W = the
// variant's width) accumulates x[m, k] * w[n, k] over k = lane (mod W) in
// ascending k, and the lanes are summed in a fixed tree. With xq (the rows
// of x quantised by quantize_x for this qtype, `xq_stride` bytes apart):
// llama.cpp's 8-bit arithmetic (iqgemm; llm/isa/quant_idot.cpp). Either
// way the bias, then y (when accumulating) are added last, and the order
// does not depend on M, on the rows around m or n, or on the thread split,
// so a row's result is the same in every batch (the engine's batch
// invariance rests on this).
struct QGemmArgs {
  const float* x;
  int64_t x_stride;  // floats between rows of x
  int64_t M;
  const uint8_t* w;
  int64_t w_stride;  // bytes between rows of w
  int qtype;         // QType
  int64_t K;
  const float* bias;  // [N] or nullptr
  float* y;
  int64_t y_stride;  // floats between rows of y
  bool accumulate;    // y += result instead of y = result
  const uint8_t* xq = nullptr;  // x quantised for qtype (8-bit arithmetic), or nullptr
  int64_t xq_stride = 0;        // bytes between rows of xq
  // the interleaved copy of w's first N / 8 * 8 rows (pack_groups, llm/quant_blocks.h), or nullptr;
  // the 8-bit products read it instead of w where it covers the rows (the same numbers)
  const uint8_t* wp = nullptr;
};

// Floats of scratch one qgemm call needs.
int64_t qgemm_scratch_floats(int64_t K);

// Attention of G query heads that share one key/value head, over the
// positions [0, n) of one sequence's cache:
//   out_g = softmax(scale * q_g . k_p over p) . v
struct AttnArgs {
  const float* q;  // G rows of hd floats, `q_stride` apart
  int64_t q_stride;
  int G;
  const float* k;  // position p's key at k + p * kv_stride
  const float* v;
  int64_t kv_stride;
  int64_t n;
  int hd;
  float scale;
  float* out;  // G rows of hd floats, `out_stride` apart
  int64_t out_stride;
  float* scores;  // scratch: G * n floats
};

// qgemm: the float32 arithmetic (xq ignored); iqgemm: the 8-bit one (a.xq
// set, qtype blocked); quantize_x: M rows of x (x_stride floats apart) into
// the activation blocks of weight type qtype (XBlock32 or XBlock256 rows,
// out_stride bytes apart; llm/quant_blocks.h), the reference's bits.
#define RCN_QUANT_ISA_DECLS                                                   \
  void qgemm(const QGemmArgs& a, int64_t n_begin, int64_t n_end, float* scratch); \
  void iqgemm(const QGemmArgs& a, int64_t n_begin, int64_t n_end);             \
  void quantize_x(int qtype, const float* x, int64_t x_stride, int64_t M, int64_t K, uint8_t* out, \
                  int64_t out_stride);                                         \
  void attend(const AttnArgs& a);                                              \
  void silu_mul(float* g, const float* u, int64_t n); /* g = silu(g) * u */    \
  int lanes();

namespace generic {
RCN_QUANT_ISA_DECLS
}
namespace avx2 {
RCN_QUANT_ISA_DECLS
}
namespace avx512 {
RCN_QUANT_ISA_DECLS
}
namespace avx512vnni {
RCN_QUANT_ISA_DECLS
}
#undef RCN_QUANT_ISA_DECLS

}  // namespace rcn_fast
