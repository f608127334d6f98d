// Matrix products with GGML-format weights on the CPU (llm/quant_blocks.h,
// llm/isa/quant_isa.h): the kernel variant in use and a threaded launcher.
#pragma once
#include <cstdint>
#include <memory>
#include <new>
#include <string>

#include "llm/isa/quant_isa.h"

namespace rcn_fast {

// One compiled variant of the quantised-weight kernels.
struct QuantKernels {
  const char* name;  // "generic" | "avx2" | "avx512" | "avx512vnni"
  int lanes;
  void (*qgemm)(const QGemmArgs&, int64_t, int64_t, float*);
  void (*iqgemm)(const QGemmArgs&, int64_t, int64_t);
  void (*quantize_x)(int, const float*, int64_t, int64_t, int64_t, uint8_t*, int64_t);
  void (*attend)(const AttnArgs&);
  void (*silu_mul)(float*, const float*, int64_t);
};

// The one dispatch point of a product: the 8-bit arithmetic when the
// activations come quantised (a.xq) and the weights are blocks, else float32.
inline void run_qgemm(const QuantKernels& k, const QGemmArgs& a, int64_t n0, int64_t n1, float* scratch) {
  if (a.xq != nullptr && a.qtype != 0 && a.qtype != 1)
    k.iqgemm(a, n0, n1);
  else
    k.qgemm(a, n0, n1, scratch);
}

// The variant chosen at load time: the widest this build and CPU support,
// unless RCN_FAST_SIMD names another (generic | avx2 | avx512 | avx512vnni).
const QuantKernels& quant_kernels();
// A variant by name, or nullptr when it is not compiled in or the CPU lacks it.
const QuantKernels* quant_kernels_named(const std::string& name);
// "generic,avx2,avx512,avx512vnni" (the variants compiled into this build).
std::string quant_compiled();
// Why the chosen variant is not the widest (RCN_FAST_SIMD), or "".
std::string quant_note();

// Output rows per dynamically scheduled chunk of a product with N rows on
// `threads` threads (a multiple of 8: whole groups of a packed copy).
int64_t quant_chunk_rows(int64_t N, int threads);

// An interleaved copy of a matrix's weights (pack_groups, llm/quant_blocks.h), 64-byte aligned.
struct PackedCopy {
  struct Free {
    void operator()(uint8_t* p) const { ::operator delete[](p, std::align_val_t(64)); }
  };
  std::unique_ptr<uint8_t, Free> data;
  int64_t bytes = 0;
};
// The packed copy of w [N, K] (empty for a type that does not pack), made on num_threads threads.
PackedCopy pack_weights(int qtype, const uint8_t* w, int64_t N, int64_t K, int64_t row_bytes, int num_threads);

// y = x . w^T (+ bias) (+ y) on num_threads threads (<= 0: the default),
// rows of w split in chunks taken from a shared counter; with `q8` (and
// block weights) x is quantised first and multiplied in 8-bit arithmetic.
void quant_matmul(const QGemmArgs& a, int64_t N, int num_threads, const QuantKernels& k, bool q8 = false);

}  // namespace rcn_fast
