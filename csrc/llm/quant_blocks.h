// GGUF/GGML weight formats the CPU engine multiplies in place, their plain
// (scalar) dequantisation, and the 8-bit activation blocks of llama.cpp's
// integer arithmetic: the specification the vector kernels of
// llm/isa/quant_gemm.cpp (float32 activations) and llm/isa/quant_idot.cpp
// (8-bit activations) are tested against.
//
// A weight matrix W [N, K] is N rows of K elements; a quantised row is
// K/block blocks stored one after another (GGML's layout, as the bytes sit
// in a .gguf file; ggml/src/ggml-common.h and ggml-quants.c of llama.cpp):
//
//   Q8_0: {fp16 d; int8 q[32]}            w_j = d * q_j                 (34 bytes)
//   Q4_0: {fp16 d; uint8 qs[16]}          w_j = d * (nib_j - 8)          (18 bytes)
//   Q4_1: {fp16 d; fp16 m; uint8 qs[16]}  w_j = d * nib_j + m            (20 bytes)
//
// where nib_j is the low nibble of qs[j] for j < 16 and the high nibble of
// qs[j - 16] for j >= 16. The K-quants group 256 elements in a super-block:
//
//   Q4_K: {fp16 d; fp16 dmin; uint8 scales[12]; uint8 qs[128]}            (144 bytes)
//         8 sub-blocks of 32: w = (d * sc_s) * q - (dmin * m_s), q a nibble
//         (sub-block 2p: low nibbles of qs[32p..32p+32), 2p+1: high nibbles),
//         sc_s, m_s 6-bit (get_scale_min_k4 below).
//   Q5_K: {fp16 d; fp16 dmin; uint8 scales[12]; uint8 qh[32]; uint8 qs[128]}  (176 bytes)
//         as Q4_K with a fifth bit: bit s of qh[l] for element l of sub-block s.
//   Q6_K: {uint8 ql[128]; uint8 qh[64]; int8 scales[16]; fp16 d}          (210 bytes)
//         16 sub-blocks of 16: w = (d * sc_s) * (q - 32), q 6 bits (4 from
//         ql, 2 from qh; layout in dequant_row_ref).
//
// F32 and F16 rows are plain arrays (any K).
//
// Two arithmetics (QGemmArgs::xq, llm/isa/quant_isa.h):
//  * float32 activations: y[m, n] = sum_k x[m, k] * w[n, k] with the weights
//    dequantised as above, float32 accumulation: the numbers of a float32
//    matmul with the dequantised weights, up to the order of the summation;
//  * 8-bit activations (llama.cpp's): each row of x is first quantised to
//    blocks of int8 (XBlock32 for Q4_0, Q4_1, Q8_0: llama.cpp's q8_0 / q8_1;
//    XBlock256 for the K-quants: its q8_K), and every block's products are
//    summed exactly in integers before one float scale per block
//    (dot_row_ref below).
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>

#include "common/dtypes.h"
#include "llm/ggml_types.h"

namespace rcn_fast {

// The GGML types the kernels multiply (their ids and sizes are those of
// llm/ggml_types.h, the one table of GGML type facts; the enum names them
// for the kernels' templates, and static_asserts keep the two in step).
enum class QType : int { F32 = 0, F16 = 1, Q4_0 = 2, Q4_1 = 3, Q8_0 = 8, Q4_K = 12, Q5_K = 13, Q6_K = 14 };

constexpr int64_t kQuantBlock = 32;   // elements per Q4_0/Q4_1/Q8_0 block, and per unpacked chunk of any type
constexpr int64_t kSuperBlock = 256;  // elements per K-quant super-block (GGML's QK_K)

// Whether the kernels multiply GGML type `t` (the table's `matmul` flag).
constexpr bool qtype_known(int t) {
  const GGMLTypeInfo* info = ggml_type_info(t);
  return info != nullptr && info->matmul;
}

constexpr const char* qtype_name(QType t) { return ggml_type_info(int(t))->name; }

constexpr bool qtype_is_blocked(QType t) { return ggml_type_info(int(t))->block > 1; }
constexpr bool qtype_is_kquant(QType t) { return t == QType::Q4_K || t == QType::Q5_K || t == QType::Q6_K; }

// Elements per block (1 for F32, F16).
constexpr int64_t qtype_block(QType t) { return ggml_type_info(int(t))->block; }

// Bytes of one block (quantised types) or of one element (F32, F16).
constexpr int64_t qtype_unit_bytes(QType t) { return ggml_type_info(int(t))->block_bytes; }

// Bytes of a row of K elements (K a multiple of the block for the quantised types).
constexpr int64_t qtype_row_bytes(QType t, int64_t K) {
  return K / ggml_type_info(int(t))->block * ggml_type_info(int(t))->block_bytes;
}

// "F32=0, F16=1, Q4_0=2, ...": the types the kernels multiply, for messages.
inline std::string qtype_supported_names() {
  std::string out;
  for (const GGMLTypeInfo& t : kGGMLTypes)
    if (t.matmul) out += (out.empty() ? "" : ", ") + std::string(t.name) + "=" + std::to_string(t.id);
  return out;
}

static_assert(qtype_known(0) && qtype_known(1) && qtype_known(2) && qtype_known(3) && qtype_known(8) &&
                  qtype_known(12) && qtype_known(13) && qtype_known(14),
              "every QType is a type the table marks as multiplied");
constexpr int qtype_count() {
  int n = 0;
  for (const GGMLTypeInfo& t : kGGMLTypes) n += t.matmul ? 1 : 0;
  return n;
}
static_assert(qtype_count() == 8, "every type the table marks as multiplied is a QType");
static_assert(qtype_block(QType::Q4_0) == kQuantBlock && qtype_block(QType::Q4_1) == kQuantBlock &&
                  qtype_block(QType::Q8_0) == kQuantBlock && qtype_block(QType::Q4_K) == kSuperBlock &&
                  qtype_block(QType::Q5_K) == kSuperBlock && qtype_block(QType::Q6_K) == kSuperBlock,
              "blocks of 32, super-blocks of 256");
static_assert(qtype_unit_bytes(QType::Q4_K) == 144 && qtype_unit_bytes(QType::Q5_K) == 176 &&
                  qtype_unit_bytes(QType::Q6_K) == 210,
              "ggml-common.h's block_q4_K, block_q5_K, block_q6_K");

// Byte offsets inside a K-quant super-block (ggml-common.h).
namespace kq {
constexpr int kD = 0, kDmin = 2, kScales = 4;   // Q4_K, Q5_K
constexpr int kQs4 = 16;                        // Q4_K qs[128]
constexpr int kQh5 = 16, kQs5 = 48;             // Q5_K qh[32], qs[128]
constexpr int kQl6 = 0, kQh6 = 128, kSc6 = 192, kD6 = 208;  // Q6_K
}  // namespace kq

inline uint16_t read_u16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// The 6-bit scale and min of sub-block j (0..7) of a Q4_K/Q5_K super-block
// (ggml-quants.c's get_scale_min_k4).
inline void get_scale_min_k4(int j, const uint8_t* q, uint8_t& d, uint8_t& m) {
  if (j < 4) {
    d = q[j] & 63;
    m = q[j + 4] & 63;
  } else {
    d = uint8_t((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
    m = uint8_t((q[j + 4] >> 4) | ((q[j - 0] >> 6) << 4));
  }
}

// The 32 quantised values of chunk c (elements [32c, 32c + 32)) of a
// K-quant super-block: q as integers (Q6_K: q - 32, signed), and the
// chunk's float scales (two for Q6_K's sub-blocks of 16, else one twice)
// and offset: w_j = scale[j / 16] * q_j - min, as ggml's dequantize_row_*
// computes it (a product, then a difference; min = 0 for Q6_K).
inline void kquant_chunk_ref(QType t, const uint8_t* sb, int c, int8_t* q, float* scale, float* min) {
  if (t == QType::Q6_K) {
    const int half = c / 4, part = c % 4;  // 128-element half, 32-element part of it
    const uint8_t* ql = sb + kq::kQl6 + 64 * half + (part & 1) * 32;
    const uint8_t* qh = sb + kq::kQh6 + 32 * half;
    const int8_t* sc = reinterpret_cast<const int8_t*>(sb + kq::kSc6) + 8 * half;
    const float d = half_to_float(read_u16(sb + kq::kD6));
    for (int l = 0; l < 32; ++l) {
      const int lo = part < 2 ? (ql[l] & 0xF) : (ql[l] >> 4);
      q[l] = int8_t((lo | (((qh[l] >> (2 * part)) & 3) << 4)) - 32);
    }
    scale[0] = d * float(sc[2 * part]);  // elements 0-15 of the chunk
    scale[1] = d * float(sc[2 * part + 1]);  // and 16-31
    *min = 0.0f;
    return;
  }
  uint8_t sc, m;
  get_scale_min_k4(c, sb + kq::kScales, sc, m);
  const float d = half_to_float(read_u16(sb + kq::kD)), dmin = half_to_float(read_u16(sb + kq::kDmin));
  scale[0] = scale[1] = d * float(sc);
  *min = dmin * float(m);
  const uint8_t* qs = sb + (t == QType::Q4_K ? kq::kQs4 : kq::kQs5) + 32 * (c / 2);
  for (int l = 0; l < 32; ++l) {
    int v = (c & 1) ? (qs[l] >> 4) : (qs[l] & 0xF);
    if (t == QType::Q5_K && ((sb[kq::kQh5 + l] >> c) & 1)) v += 16;
    q[l] = int8_t(v);
  }
}

// Elements [k0, k0 + n) of one row as float32 (the reference dequantisation,
// ggml's dequantize_row_* operation for operation; for the quantised types
// k0 and n are multiples of 32).
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
    if (qtype_is_kquant(t)) {
      int8_t q[32];
      float scale[2], min;
      kquant_chunk_ref(t, row + b / 8 * bytes, int(b % 8), q, scale, &min);
      for (int j = 0; j < 32; ++j) out[j] = scale[j / 16] * float(q[j]) - min;
      continue;
    }
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

// ---------------------------------------------------------------------------
// 8-bit activations (llama.cpp's arithmetic for quantised weights)

// 32 activations for a Q4_0, Q4_1 or Q8_0 block (llama.cpp's q8_0 and q8_1
// in one layout): q_j = round_half_even(x_j * 127 / amax), d = amax / 127
// rounded to float16 (as llama.cpp stores it; kept as a float), s = d *
// sum(q) as float16 bits (q8_1's s: Q4_1's offset term), sum = sum(q).
struct XBlock32 {
  float d;
  uint16_t s;
  int16_t sum;
  int8_t q[32];
};
// 256 activations for a K-quant super-block (llama.cpp's q8_K, ggml's
// quantize_row_q8_K_ref): max = the value of largest magnitude (the first),
// q_j = min(127, round_half_even(-127 / max * x_j)), d = 1 / (-127 / max),
// bsums[i] = sum of q[16i .. 16i + 16).
struct XBlock256 {
  float d;
  int8_t q[256];
  int16_t bsums[16];
};
static_assert(sizeof(XBlock32) == 40 && sizeof(XBlock256) == 292, "packed activation blocks");
// A block holding an inf or NaN gets d = s = NaN and q = 0, sum = 0: its products are
// NaN, as the float32 arithmetic's would be (no undefined conversion). A
// block whose largest magnitude is below kTinyActivation is all zeros
// (127 / amax would overflow; llama.cpp's float16 d is 0 there anyway).
constexpr float kTinyActivation = 1e-30f;

// The block of 32 activations that held an inf or NaN (see above).
inline void set_nonfinite_block(XBlock32& o) {
  o.d = NAN;
  o.s = 0x7E00;  // float16 NaN
  o.sum = 0;
  std::memset(o.q, 0, sizeof o.q);
}

// The activation block a weight type multiplies: 32, 256, or 0 (float32
// activations: F32, F16).
constexpr int64_t xq_block(QType t) { return qtype_is_kquant(t) ? kSuperBlock : qtype_is_blocked(t) ? kQuantBlock : 0; }
// Bytes of one row of K activations quantised for weight type t.
constexpr int64_t xq_row_bytes(QType t, int64_t K) {
  return xq_block(t) == kSuperBlock ? K / kSuperBlock * int64_t(sizeof(XBlock256))
         : xq_block(t) == kQuantBlock ? K / kQuantBlock * int64_t(sizeof(XBlock32))
                                      : 0;
}

inline float round_to_half(float f) { return half_to_float(float_to_half_bits(f)); }

// x [K] -> K / 32 XBlock32 (the reference; every variant's quantiser gives these bits).
inline void quantize_x32_ref(const float* x, int64_t K, XBlock32* out) {
  for (int64_t b = 0; b < K / kQuantBlock; ++b, x += kQuantBlock) {
    XBlock32& o = out[b];
    float amax = 0.0f;
    bool finite = true;
    for (int j = 0; j < 32; ++j) {
      finite = finite && std::fabs(x[j]) <= 3.402823466e38f;
      amax = std::fabs(x[j]) > amax ? std::fabs(x[j]) : amax;
    }
    if (!finite) {
      set_nonfinite_block(o);
      continue;
    }
    const float d = amax / 127.0f, id = amax >= kTinyActivation ? 127.0f / amax : 0.0f;
    int sum = 0;
    for (int j = 0; j < 32; ++j) {
      o.q[j] = int8_t(std::nearbyint(x[j] * id));
      sum += o.q[j];
    }
    o.d = round_to_half(d);
    o.s = float_to_half_bits(d * float(sum));
    o.sum = int16_t(sum);
  }
}

// x [K] -> K / 256 XBlock256 (the reference; every variant's quantiser gives these bits).
inline void quantize_x256_ref(const float* x, int64_t K, XBlock256* out) {
  for (int64_t b = 0; b < K / kSuperBlock; ++b, x += kSuperBlock) {
    XBlock256& o = out[b];
    float amax = 0.0f, max = 0.0f;
    bool finite = true;
    for (int j = 0; j < 256; ++j) {
      const float ax = std::fabs(x[j]);
      finite = finite && ax <= 3.402823466e38f;
      if (ax > amax) amax = ax, max = x[j];
    }
    std::memset(o.bsums, 0, sizeof o.bsums);
    if (!finite || amax < kTinyActivation) {
      o.d = finite ? 0.0f : NAN;
      std::memset(o.q, 0, sizeof o.q);
      continue;
    }
    const float iscale = -127.0f / max;
    for (int j = 0; j < 256; ++j) {
      const int v = int(std::nearbyint(iscale * x[j]));
      o.q[j] = int8_t(v < 127 ? v : 127);
      o.bsums[j / 16] = int16_t(o.bsums[j / 16] + o.q[j]);
    }
    o.d = 1.0f / iscale;
  }
}

// sum_k w[k] * x[k] for one row of K weights of type t and the row's
// quantised activations xq (xq_row_bytes(t, K) bytes). The definition of
// the 8-bit arithmetic, which every implementation (any variant, packed or
// not, any tile) computes to the same bits: per block, in order, the exact
// integer sum of products, then one fused multiply-add into a single float
// accumulator,
//   Q4_0, Q8_0: acc = fma(float(sum q_w * q_x), dw * dx, acc)   (q_w - 8 for Q4_0)
//   Q4_1:       the same, then acc = fma(mw, sx, acc)
//   Q4_K, Q5_K: acc = fma(float(sum_s sc_s * sum q * q_x), dx * d, acc),
//               then acc = fma(float(sum_s m_s * bsum_s), -dx * dmin, acc)
//   Q6_K:       acc = fma(float(sum_s sc_s * sum (q - 32) * q_x), dx * d, acc)
// (dw * dx, dx * d: float32 products; bsum_s the sum of the 32 activations of
// sub-block s).
inline float dot_row_ref(QType t, const uint8_t* w, const uint8_t* xq, int64_t K) {
  float acc = 0.0f;
  if (!qtype_is_kquant(t)) {
    const XBlock32* x = reinterpret_cast<const XBlock32*>(xq);
    const int64_t bytes = qtype_unit_bytes(t);
    for (int64_t b = 0; b < K / kQuantBlock; ++b, w += bytes) {
      const float dw = half_to_float(read_u16(w));
      int sumi = 0;
      for (int j = 0; j < 32; ++j) {
        int q;
        if (t == QType::Q8_0) q = int8_t(w[2 + j]);
        else if (t == QType::Q4_0) q = (j < 16 ? (w[2 + j] & 15) : (w[2 + j - 16] >> 4)) - 8;
        else q = j < 16 ? (w[4 + j] & 15) : (w[4 + j - 16] >> 4);
        sumi += q * x[b].q[j];
      }
      acc = std::fma(float(sumi), dw * x[b].d, acc);
      if (t == QType::Q4_1) acc = std::fma(half_to_float(read_u16(w + 2)), half_to_float(x[b].s), acc);
    }
    return acc;
  }
  const XBlock256* x = reinterpret_cast<const XBlock256*>(xq);
  const int64_t bytes = qtype_unit_bytes(t);
  for (int64_t b = 0; b < K / kSuperBlock; ++b, w += bytes) {
    int sumi = 0, summ = 0;
    for (int c = 0; c < 8; ++c) {
      int8_t q[32];
      float scale[2], min;
      kquant_chunk_ref(t, w, c, q, scale, &min);  // the integer scales recovered below
      if (t == QType::Q6_K) {
        const int8_t* sc = reinterpret_cast<const int8_t*>(w + kq::kSc6) + 8 * (c / 4) + 2 * (c % 4);
        for (int h = 0; h < 2; ++h) {
          int s = 0;
          for (int l = 16 * h; l < 16 * h + 16; ++l) s += q[l] * x[b].q[32 * c + l];
          sumi += sc[h] * s;
        }
      } else {
        uint8_t sc, m;
        get_scale_min_k4(c, w + kq::kScales, sc, m);
        int s = 0;
        for (int l = 0; l < 32; ++l) s += q[l] * x[b].q[32 * c + l];
        sumi += sc * s;
        summ += m * (x[b].bsums[2 * c] + x[b].bsums[2 * c + 1]);
      }
    }
    if (t == QType::Q6_K) {
      acc = std::fma(float(sumi), x[b].d * half_to_float(read_u16(w + kq::kD6)), acc);
    } else {
      acc = std::fma(float(sumi), x[b].d * half_to_float(read_u16(w + kq::kD)), acc);
      acc = std::fma(float(summ), -x[b].d * half_to_float(read_u16(w + kq::kDmin)), acc);
    }
  }
  return acc;
}

// ---------------------------------------------------------------------------
// Interleaved copies of Q4_0, Q4_1 and Q8_0 weights (llama.cpp's repacking
// idea, as its q4_0_8x8 on AVX2): groups of 8 rows, block by block, so one
// 32-byte vector holds 4 consecutive quants of each of the 8 rows (bytes
// 4r..4r+3: row r) and the 8 rows' block sums land in the 8 lanes of one
// vector. Only where the time goes changes: the numbers are dot_row_ref's.
//
// A group's block b: {fp16 d[8]; (Q4_1) fp16 m[8]; uint8 v[4 or 8][32]} with
//   Q4_0, Q4_1: v[k][4r + i] = qs_r[4k + i]  (k < 4: low nibbles are quants
//               4k + i, high nibbles 16 + 4k + i)
//   Q8_0:       v[k][4r + i] = q_r[4k + i]   (k < 8)
// and a group's Q4_K super-block b: {fp16 d[8]; fp16 dmin[8]; uint8 sc[8][8]
// (sub-block, row); uint8 m[4][8][2] (sub-block pair p, row, 2p / 2p + 1);
// uint8 v[4][8][32]} with v[p][k][4r + i] = qs_r[32p + 4k + i] (low nibbles:
// sub-block 2p, high: 2p + 1; quants 4k + i of each): 1184 bytes for 8 x 144.
constexpr int kPackRows = 8;

constexpr bool qtype_packs(QType t) {
  return t == QType::Q4_0 || t == QType::Q4_1 || t == QType::Q8_0 || t == QType::Q4_K;
}

// Bytes of one packed block (super-block for Q4_K) of a group of 8 rows.
constexpr int64_t packed_block_bytes(QType t) {
  return t == QType::Q8_0 ? 16 + 256 : t == QType::Q4_1 ? 32 + 128 : t == QType::Q4_K ? 32 + 128 + 1024 : 16 + 128;
}

// Bytes of the packed copy of the first N / 8 * 8 rows of a [N, K] matrix.
constexpr int64_t packed_bytes(QType t, int64_t N, int64_t K) {
  return qtype_packs(t) ? N / kPackRows * (K / qtype_block(t)) * packed_block_bytes(t) : 0;
}

// Rows [8g, 8g + 8) of w (row_bytes apart) into group g of `out`, for g in [g0, g1).
inline void pack_groups(QType t, const uint8_t* w, int64_t row_bytes, int64_t K, int64_t g0, int64_t g1,
                        uint8_t* out) {
  if (t == QType::Q4_K) {
    const int64_t nb = K / kSuperBlock, pb = packed_block_bytes(t);
    for (int64_t g = g0; g < g1; ++g)
      for (int64_t b = 0; b < nb; ++b) {
        uint8_t* o = out + (g * nb + b) * pb;
        for (int r = 0; r < kPackRows; ++r) {
          const uint8_t* sb = w + (g * kPackRows + r) * row_bytes + b * 144;
          std::memcpy(o + 2 * r, sb + kq::kD, 2);
          std::memcpy(o + 16 + 2 * r, sb + kq::kDmin, 2);
          for (int s = 0; s < 8; ++s) {
            uint8_t sc, m;
            get_scale_min_k4(s, sb + kq::kScales, sc, m);
            o[32 + 8 * s + r] = sc;
            o[96 + 16 * (s / 2) + 2 * r + (s % 2)] = m;
          }
          for (int p = 0; p < 4; ++p)
            for (int k = 0; k < 8; ++k) std::memcpy(o + 160 + 256 * p + 32 * k + 4 * r, sb + kq::kQs4 + 32 * p + 4 * k, 4);
        }
      }
    return;
  }
  const int64_t nb = K / kQuantBlock, bytes = qtype_unit_bytes(t), pb = packed_block_bytes(t);
  const int head = t == QType::Q4_1 ? 32 : 16, qoff = t == QType::Q4_1 ? 4 : 2;
  const int chunks = t == QType::Q8_0 ? 8 : 4;
  for (int64_t g = g0; g < g1; ++g)
    for (int64_t b = 0; b < nb; ++b) {
      uint8_t* o = out + (g * nb + b) * pb;
      for (int r = 0; r < kPackRows; ++r) {
        const uint8_t* blk = w + (g * kPackRows + r) * row_bytes + b * bytes;
        std::memcpy(o + 2 * r, blk, 2);                                   // d
        if (t == QType::Q4_1) std::memcpy(o + 16 + 2 * r, blk + 2, 2);  // m
        for (int k = 0; k < chunks; ++k) std::memcpy(o + head + 32 * k + 4 * r, blk + qoff + 4 * k, 4);
      }
    }
}

}  // namespace rcn_fast
