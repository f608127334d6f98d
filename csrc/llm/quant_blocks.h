// GGUF/GGML weight formats the CPU engine multiplies in place, and their
// plain (scalar) dequantisation: the specification the vector kernels of
// llm/isa/quant_gemm.cpp are tested against.
//
// A weight matrix W [N, K] is N rows of K elements; a quantised row is K/32
// blocks of 32 elements stored one after another (GGML's layout, as the
// bytes sit in a .gguf file):
//
//   Q8_0: {fp16 d; int8 q[32]}            w_j = d * q_j                 (34 bytes)
//   Q4_0: {fp16 d; uint8 qs[16]}          w_j = d * (nib_j - 8)          (18 bytes)
//   Q4_1: {fp16 d; fp16 m; uint8 qs[16]}  w_j = d * nib_j + m            (20 bytes)
//
// where nib_j is the low nibble of qs[j] for j < 16 and the high nibble of
// qs[j - 16] for j >= 16. F32 and F16 rows are plain arrays (any K).
//
// The matrix product is y[m, n] = sum_k x[m, k] * w[n, k] with float32 x and
// float32 accumulation: the same numbers as a float32 matmul with the
// dequantised weights, up to the order of the summation (activations are
// never quantised).
#pragma once
#include <cstdint>
#include <cstring>
#include <string>

#include "common/dtypes.h"
#include "llm/ggml_types.h"

namespace rcn_fast {

// The GGML types the kernels multiply (their ids and sizes are those of
// llm/ggml_types.h, the one table of GGML type facts; the enum names them
// for the kernels' templates, and static_asserts keep the two in step).
enum class QType : int { F32 = 0, F16 = 1, Q4_0 = 2, Q4_1 = 3, Q8_0 = 8 };

constexpr int64_t kQuantBlock = 32;  // elements per quantised block

// Whether the kernels multiply GGML type `t` (the table's `matmul` flag).
constexpr bool qtype_known(int t) {
  const GGMLTypeInfo* info = ggml_type_info(t);
  return info != nullptr && info->matmul;
}

constexpr const char* qtype_name(QType t) { return ggml_type_info(int(t))->name; }

constexpr bool qtype_is_blocked(QType t) { return ggml_type_info(int(t))->block > 1; }

// Bytes of one block (quantised types) or of one element (F32, F16).
constexpr int64_t qtype_unit_bytes(QType t) { return ggml_type_info(int(t))->block_bytes; }

// Bytes of a row of K elements (K a multiple of the block for the quantised types).
constexpr int64_t qtype_row_bytes(QType t, int64_t K) {
  return K / ggml_type_info(int(t))->block * ggml_type_info(int(t))->block_bytes;
}

// "F32=0, F16=1, Q4_0=2, Q4_1=3, Q8_0=8": the types the kernels multiply, for messages.
inline std::string qtype_supported_names() {
  std::string out;
  for (const GGMLTypeInfo& t : kGGMLTypes)
    if (t.matmul) out += (out.empty() ? "" : ", ") + std::string(t.name) + "=" + std::to_string(t.id);
  return out;
}

static_assert(qtype_known(0) && qtype_known(1) && qtype_known(2) && qtype_known(3) && qtype_known(8),
              "every QType is a type the table marks as multiplied");
constexpr int qtype_count() {
  int n = 0;
  for (const GGMLTypeInfo& t : kGGMLTypes) n += t.matmul ? 1 : 0;
  return n;
}
static_assert(qtype_count() == 5, "every type the table marks as multiplied is a QType");
static_assert(qtype_is_blocked(QType::Q4_0) && qtype_is_blocked(QType::Q4_1) && qtype_is_blocked(QType::Q8_0) &&
                  ggml_type_info(2)->block == kQuantBlock && ggml_type_info(3)->block == kQuantBlock &&
                  ggml_type_info(8)->block == kQuantBlock,
              "the quantised kernels read blocks of kQuantBlock elements");

inline uint16_t read_u16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// Elements [k0, k0 + n) of one row as float32 (the reference dequantisation;
// for the quantised types k0 and n are multiples of 32).
inline void dequant_row_ref(QType t, const uint8_t* row, int64_t k0, int64_t n, float* out) {
  switch (t) {
    case QType::F32:
      std::memcpy(out, reinterpret_cast<const float*>(row) + k0, size_t(n) * sizeof(float));
      return;
    case QType::F16:
      for (int64_t i = 0; i < n; ++i) out[i] = half_to_float(read_u16(row + 2 * (k0 + i)));
      return;
    default: break;
  }
  const int64_t bytes = qtype_unit_bytes(t);
  for (int64_t b = k0 / kQuantBlock; b < (k0 + n) / kQuantBlock; ++b, out += kQuantBlock) {
    const uint8_t* blk = row + b * bytes;
    const float d = half_to_float(read_u16(blk));
    if (t == QType::Q8_0) {
      for (int j = 0; j < 32; ++j) out[j] = d * float(int8_t(blk[2 + j]));
    } else if (t == QType::Q4_0) {
      for (int j = 0; j < 16; ++j) {
        out[j] = d * float(int(blk[2 + j] & 15) - 8);
        out[j + 16] = d * float(int(blk[2 + j] >> 4) - 8);
      }
    } else {  // Q4_1
      const float m = half_to_float(read_u16(blk + 2));
      for (int j = 0; j < 16; ++j) {
        out[j] = d * float(blk[4 + j] & 15) + m;
        out[j + 16] = d * float(blk[4 + j] >> 4) + m;
      }
    }
  }
}

}  // namespace rcn_fast
