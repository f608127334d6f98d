// The ordering every top-n backend (CPU, CUDA, references) agrees on.
//
// * Higher score first; equal scores: lower corpus id first.
// * A score is admissible when it is neither NaN nor -inf. Inadmissible
//   scores are never returned; slots left empty are padded with
//   (score = -inf, id = -1).
#pragma once
#include <cstdint>

#include "common/dtypes.h"
#include "common/macros.h"

namespace rcn_fast {

RCN_HD bool topn_admissible(float s) {
  // NaN fails every comparison; -inf is the padding value.
  return s >= -3.402823466e38f;
}

RCN_HD bool topn_better(float sa, int64_t ia, float sb, int64_t ib) {
  return sa > sb || (sa == sb && ia < ib);
}

// Monotone map of admissible floats onto uint32 (larger key = larger score);
// inadmissible scores map to 0, below every admissible key. -0.0 and +0.0
// get the same key (topn_better treats them as equal and orders them by id;
// the radix select of the tiled kernel must too: issue 55, W2).
RCN_HD uint32_t topn_key(float s) {
  if (!topn_admissible(s)) return 0u;
  uint32_t u = float_to_bits(s);
  if ((u & 0x7FFFFFFFu) == 0u) u = 0u;  // -0.0 -> +0.0, by bits (no arithmetic a compiler may drop)
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// One pass of the tiled kernel's radix select (topn/cuda/topn.cu, MSB
// first, 8 bits a pass; host emulation: topn/cpu/topn_select_emulated.cpp).
// hist[256] counts the digit (key >> shift) & 255 of the admissible keys
// whose higher bits equal the prefix found so far; the digit of the
// need-th largest of them goes into the prefix, and `need` becomes how many
// keys equal to the longer prefix are still to take.
RCN_HD void topn_radix_pick(const unsigned int* hist, int shift, unsigned int& prefix, unsigned int& need) {
  unsigned int left = need, digit = 255u;
  for (int b = 255; b >= 0; --b) {
    if (hist[b] >= left) {
      digit = unsigned(b);
      break;
    }
    left -= hist[b];
  }
  prefix |= digit << shift;
  need = left;
}

// Whether a key's bits above this pass's digit equal the prefix's.
RCN_HD bool topn_radix_match(uint32_t key, uint32_t prefix, int shift) {
  const uint32_t hi_mask = shift == 24 ? 0u : (0xFFFFFFFFu << (shift + 8));
  return key != 0u && (key & hi_mask) == (prefix & hi_mask);
}

RCN_HD float topn_key_to_score(uint32_t key) {
  const uint32_t u = (key & 0x80000000u) ? (key & 0x7FFFFFFFu) : ~key;
  return bits_to_float(u);
}

}  // namespace rcn_fast
