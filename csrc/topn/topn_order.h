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
// inadmissible scores map to 0, below every admissible key.
RCN_HD uint32_t topn_key(float s) {
  if (!topn_admissible(s)) return 0u;
  const uint32_t u = float_to_bits(s);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

RCN_HD float topn_key_to_score(uint32_t key) {
  const uint32_t u = (key & 0x80000000u) ? (key & 0x7FFFFFFFu) : ~key;
  return bits_to_float(u);
}

}  // namespace rcn_fast
