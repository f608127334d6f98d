// Element types of the kernels and their exact conversion to float32.
// Plain bit manipulation so the same functions run on the host (reference
// paths, CPU tails) and in CUDA kernels.
#pragma once
#include <cstdint>
#include <cstring>

#include "common/macros.h"

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
RCN_HD float half_to_float(uint16_t h) {
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
