// The GGML tensor types: the one table of their facts, for C++ and Python.
//
// Every place that needs a type's id, name, block size or bytes reads it
// here: the C++ kernels and checks (llm/quant_blocks.h) at compile time,
// the Python GGUF reader (rcn_fast/llm/backends/engine/ggml_types.py)
// through rcn_fast._C.ggml_type_table(). The values are GGML's
// (ggml/include/ggml.h, gguf-py's GGML_QUANT_SIZES); ids GGML retired
// (4, 5, 31-33, 36-38) are absent, so a file using one is refused as an
// unknown type, as gguf.cpp refuses it.
//
// RCN_GGML_TYPE(NAME, id, elements per block, bytes per block, the engine multiplies it)
#pragma once
#include <cstdint>

#define RCN_GGML_TYPES(X)          \
  X(F32, 0, 1, 4, 1)               \
  X(F16, 1, 1, 2, 1)               \
  X(Q4_0, 2, 32, 18, 1)            \
  X(Q4_1, 3, 32, 20, 1)            \
  X(Q5_0, 6, 32, 22, 0)            \
  X(Q5_1, 7, 32, 24, 0)            \
  X(Q8_0, 8, 32, 34, 1)            \
  X(Q8_1, 9, 32, 36, 0)            \
  X(Q2_K, 10, 256, 84, 0)          \
  X(Q3_K, 11, 256, 110, 0)         \
  X(Q4_K, 12, 256, 144, 1)         \
  X(Q5_K, 13, 256, 176, 1)         \
  X(Q6_K, 14, 256, 210, 1)         \
  X(Q8_K, 15, 256, 292, 0)         \
  X(IQ2_XXS, 16, 256, 66, 0)       \
  X(IQ2_XS, 17, 256, 74, 0)        \
  X(IQ3_XXS, 18, 256, 98, 0)       \
  X(IQ1_S, 19, 256, 50, 0)         \
  X(IQ4_NL, 20, 32, 18, 0)         \
  X(IQ3_S, 21, 256, 110, 0)        \
  X(IQ2_S, 22, 256, 82, 0)         \
  X(IQ4_XS, 23, 256, 136, 0)       \
  X(I8, 24, 1, 1, 0)               \
  X(I16, 25, 1, 2, 0)              \
  X(I32, 26, 1, 4, 0)              \
  X(I64, 27, 1, 8, 0)              \
  X(F64, 28, 1, 8, 0)              \
  X(IQ1_M, 29, 256, 56, 0)         \
  X(BF16, 30, 1, 2, 0)             \
  X(TQ1_0, 34, 256, 54, 0)         \
  X(TQ2_0, 35, 256, 66, 0)         \
  X(MXFP4, 39, 32, 17, 0)          \
  X(NVFP4, 40, 64, 36, 0)          \
  X(Q1_0, 41, 128, 18, 0)          \
  X(Q2_0, 42, 64, 18, 0)

namespace rcn_fast {

struct GGMLTypeInfo {
  const char* name;
  int id;
  int64_t block;        // elements per block
  int64_t block_bytes;  // bytes per block
  bool matmul;          // the engine's kernels multiply it (llm/quant_blocks.h)
};

#define RCN_GGML_TYPE_ROW(NAME, ID, BLOCK, BYTES, MATMUL) GGMLTypeInfo{#NAME, ID, BLOCK, BYTES, MATMUL != 0},
inline constexpr GGMLTypeInfo kGGMLTypes[] = {RCN_GGML_TYPES(RCN_GGML_TYPE_ROW)};
#undef RCN_GGML_TYPE_ROW

// The facts of type `id`, or nullptr for an id GGML does not define.
constexpr const GGMLTypeInfo* ggml_type_info(int id) {
  for (const GGMLTypeInfo& t : kGGMLTypes)
    if (t.id == id) return &t;
  return nullptr;
}

}  // namespace rcn_fast
