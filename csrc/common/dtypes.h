// Element types of the kernels and their exact conversions to and from
// float32. Plain bit manipulation so the same functions run on the host
// (reference paths, CPU tails) and in CUDA kernels, except float16 -> float32
// on the device, which is the hardware conversion (same result).
#pragma once
#include <cstdint>
#include <cstring>

#include "common/macros.h"

#if defined(__CUDACC__)
#include <cuda_fp16.h>
#endif

namespace rcn_fast {

enum class DType : int { F32 = 0, F16 = 1, BF16 = 2 };

inline const char* dtype_name(DType t) {
  switch (t) {
    case DType::F32: return "float32";
    case DType::F16: return "float16";
    case DType::BF16: return "bfloat16";
  }
  return "unknown";
}

RCN_HD float bits_to_float(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
#endif
}

RCN_HD uint32_t float_to_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
#endif
}

// bfloat16 is the upper half of a float32: exact.
RCN_HD float bf16_to_float(uint16_t h) { return bits_to_float(uint32_t(h) << 16); }

// IEEE binary16 -> binary32, exact for normals, subnormals, inf and NaN.
// On the device it is the hardware conversion (one cvt instruction, as cheap
// as bfloat16's shift); the bit manipulation below (branches and a
// normalisation loop per element) is the host's, where the SIMD kernels use
// F16C and only tails come here.
RCN_HD float half_to_float(uint16_t h) {
#if defined(__CUDA_ARCH__)
  return __half2float(__ushort_as_half(h));
#else
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1Fu;
  uint32_t mant = h & 0x3FFu;
  if (exp == 0x1Fu) return bits_to_float(sign | 0x7F800000u | (mant << 13));
  if (exp != 0) return bits_to_float(sign | ((exp + 112u) << 23) | (mant << 13));
  if (mant == 0) return bits_to_float(sign);
  // subnormal: normalise
  int e = -1;
  do {
    mant <<= 1;
    ++e;
  } while ((mant & 0x400u) == 0);
  mant &= 0x3FFu;
  return bits_to_float(sign | (uint32_t(112 - e) << 23) | (mant << 13));
#endif
}

// binary32 -> bfloat16 bits, round to nearest even (NaN stays a quiet NaN).
RCN_HD uint16_t float_to_bf16_bits(float f) {
  const uint32_t u = float_to_bits(f);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return uint16_t((u >> 16) | 0x40u);
  return uint16_t((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

// binary32 -> binary16 bits, round to nearest even: overflow to inf,
// subnormal results rounded at 2^-24, NaN stays a quiet NaN. The same bits
// as the hardware conversion (__float2half_rn) for every input.
RCN_HD uint16_t float_to_half_bits(float f) {
  const uint32_t u = float_to_bits(f);
  const uint32_t sign = (u >> 16) & 0x8000u;
  const uint32_t a = u & 0x7FFFFFFFu;
  if (a >= 0x7F800000u) return uint16_t(sign | 0x7C00u | (a > 0x7F800000u ? 0x200u : 0u));
  if (a >= 0x477FF000u) return uint16_t(sign | 0x7C00u);  // >= 65520 rounds to inf
  if (a >= 0x38800000u) {                                  // a normal half (>= 2^-14)
    uint32_t v = a - 0x38000000u;                          // rebias 127 -> 15
    v += 0xFFFu + ((v >> 13) & 1u);
    return uint16_t(sign | (v >> 13));
  }
  if (a < 0x33000000u) return uint16_t(sign);  // below 2^-25: zero
  const uint32_t exp = a >> 23;                // 102..112
  const uint32_t mant = (a & 0x7FFFFFu) | 0x800000u;
  const uint32_t shift = 126u - exp;           // to units of 2^-24
  uint32_t q = mant >> shift;
  const uint32_t rem = mant & ((1u << shift) - 1u), half = 1u << (shift - 1u);
  if (rem > half || (rem == half && (q & 1u))) ++q;
  return uint16_t(sign | q);
}

template <DType T> struct Storage;
template <> struct Storage<DType::F32> { using type = float; };
template <> struct Storage<DType::F16> { using type = uint16_t; };
template <> struct Storage<DType::BF16> { using type = uint16_t; };

template <DType T>
RCN_HD float load_as_float(const typename Storage<T>::type* p) {
  if constexpr (T == DType::F32) {
    return *p;
  } else if constexpr (T == DType::F16) {
    return half_to_float(*p);
  } else {
    return bf16_to_float(*p);
  }
}

}  // namespace rcn_fast
