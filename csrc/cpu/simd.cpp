#include "cpu/simd.h"

#include <cstdlib>
#include <cstring>

namespace rcn_fast {
namespace {

bool cpu_supports_avx2() {
#if RCN_HAVE_AVX2 && (defined(__GNUC__) || defined(__clang__)) && (defined(__x86_64__) || defined(__i386__))
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
         __builtin_cpu_supports("f16c");
#else
  return false;
#endif
}

struct Choice {
  SimdLevel level = SimdLevel::Generic;
  std::string note;
};

Choice choose() {
  Choice c;
  const bool avx2 = cpu_supports_avx2();
  c.level = avx2 ? SimdLevel::AVX2 : SimdLevel::Generic;
  if (const char* env = std::getenv("RCN_FAST_SIMD")) {
    if (std::strcmp(env, "generic") == 0) {
      c.level = SimdLevel::Generic;
      c.note = "RCN_FAST_SIMD=generic";
    } else if (std::strcmp(env, "avx2") == 0) {
      if (avx2) {
        c.level = SimdLevel::AVX2;
        c.note = "RCN_FAST_SIMD=avx2";
      } else {
        c.level = SimdLevel::Generic;
        c.note = "RCN_FAST_SIMD=avx2 ignored: this build or CPU lacks avx2+fma+f16c";
      }
    } else {
      c.note = std::string("RCN_FAST_SIMD='") + env + "' is not one of generic|avx2; ignored";
    }
  }
  return c;
}

const Choice& choice() {
  static const Choice c = choose();
  return c;
}

}  // namespace

std::string simd_compiled() { return RCN_HAVE_AVX2 ? "generic,avx2" : "generic"; }

std::string cpu_features() {
  std::string out;
#if (defined(__GNUC__) || defined(__clang__)) && (defined(__x86_64__) || defined(__i386__))
  __builtin_cpu_init();
  const char* names[] = {"sse4.2", "avx", "avx2", "fma", "f16c", "avx512f"};
  for (const char* n : names) {
    bool has = false;
    if (!std::strcmp(n, "sse4.2")) has = __builtin_cpu_supports("sse4.2");
    if (!std::strcmp(n, "avx")) has = __builtin_cpu_supports("avx");
    if (!std::strcmp(n, "avx2")) has = __builtin_cpu_supports("avx2");
    if (!std::strcmp(n, "fma")) has = __builtin_cpu_supports("fma");
    if (!std::strcmp(n, "f16c")) has = __builtin_cpu_supports("f16c");
    if (!std::strcmp(n, "avx512f")) has = __builtin_cpu_supports("avx512f");
    if (has) {
      if (!out.empty()) out += ' ';
      out += n;
    }
  }
#endif
  return out;
}

SimdLevel active_simd() { return choice().level; }
std::string simd_note() { return choice().note; }

const char* simd_name(SimdLevel level) {
  return level == SimdLevel::AVX2 ? "avx2" : "generic";
}

}  // namespace rcn_fast
