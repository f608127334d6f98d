#include "common/cpu/simd.h"

#include <cstdlib>
#include <cstring>
#include <utility>

#if (defined(__GNUC__) || defined(__clang__)) && (defined(__x86_64__) || defined(__i386__))
#define RCN_X86_CPUID 1
#include <cpuid.h>
#endif

namespace rcn_fast {
namespace {

// x86 features from CPUID (and XGETBV for the OS's save of the wide
// registers). __builtin_cpu_supports is not used: older clang versions do
// not know "f16c".
struct X86Features {
  bool sse42 = false, avx = false, avx2 = false, fma = false, f16c = false, avx512f = false;
  bool avx512bw = false, avx512vl = false, avx512dq = false;
  bool avx512vnni = false, avxvnni = false;  // vpdpwssd (the int8 scan: topn/cpu/topn_int8.cpp)
};

X86Features x86_features() {
  X86Features f;
#if RCN_X86_CPUID
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return f;
  f.sse42 = (c >> 20) & 1u;
  bool ymm = false, zmm = false;
  if ((c >> 27) & 1u) {  // OSXSAVE: XGETBV is available
    unsigned lo = 0, hi = 0;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    ymm = (lo & 0x6u) == 0x6u;    // XMM and YMM state
    zmm = (lo & 0xE6u) == 0xE6u;  // and opmask, ZMM state
  }
  f.avx = ymm && ((c >> 28) & 1u);
  f.fma = f.avx && ((c >> 12) & 1u);
  f.f16c = f.avx && ((c >> 29) & 1u);
  if (__get_cpuid_count(7, 0, &a, &b, &c, &d)) {
    f.avx2 = f.avx && ((b >> 5) & 1u);
    f.avx512f = zmm && ((b >> 16) & 1u);
    f.avx512dq = f.avx512f && ((b >> 17) & 1u);
    f.avx512bw = f.avx512f && ((b >> 30) & 1u);
    f.avx512vl = f.avx512f && ((b >> 31) & 1u);
    f.avx512vnni = f.avx512f && ((c >> 11) & 1u);
    const unsigned max_sub = a;  // leaf 7's highest subleaf
    if (max_sub >= 1 && __get_cpuid_count(7, 1, &a, &b, &c, &d)) f.avxvnni = f.avx && ((a >> 4) & 1u);
  }
#endif
  return f;
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
    } else if (std::strcmp(env, "avx512") == 0 || std::strcmp(env, "avx512vnni") == 0) {
      // only the quantised-weight kernels (llm/cpu/quant_kernels.cpp) have an avx512 variant
      c.note = avx2 ? std::string("RCN_FAST_SIMD=") + env + ": avx2 (no such variant of this kernel)" : "";
    } else {
      c.note = std::string("RCN_FAST_SIMD='") + env + "' is not one of generic|avx2|avx512|avx512vnni; ignored";
    }
  }
  return c;
}

const Choice& choice() {
  static const Choice c = choose();
  return c;
}

}  // namespace

bool cpu_supports_avx2() {
#if RCN_HAVE_AVX2
  const X86Features f = x86_features();
  return f.avx2 && f.fma && f.f16c;
#else
  return false;
#endif
}

bool cpu_supports_avx512() {
#if RCN_HAVE_AVX512
  const X86Features f = x86_features();
  return f.avx512f && f.avx512bw && f.avx512vl && f.avx512dq && cpu_supports_avx2();
#else
  return false;
#endif
}

bool cpu_supports_avx512vnni() {
#if RCN_HAVE_AVX512VNNI
  return cpu_supports_avx512() && x86_features().avx512vnni;
#else
  return false;
#endif
}

bool cpu_supports_avxvnni() {
#if RCN_HAVE_AVXVNNI
  return x86_features().avxvnni && cpu_supports_avx2();
#else
  return false;
#endif
}

std::string simd_compiled() { return RCN_HAVE_AVX2 ? "generic,avx2" : "generic"; }

std::string cpu_features() {
  std::string out;
  const X86Features f = x86_features();
  const std::pair<const char*, bool> named[] = {{"sse4.2", f.sse42}, {"avx", f.avx},   {"avx2", f.avx2},
                                                {"fma", f.fma},       {"f16c", f.f16c}, {"avx512f", f.avx512f},
                                                {"avx512bw", f.avx512bw}, {"avx512vl", f.avx512vl},
                                                {"avx512dq", f.avx512dq}, {"avx512vnni", f.avx512vnni},
                                                {"avxvnni", f.avxvnni}};
  for (const auto& [name, has] : named) {
    if (!has) continue;
    if (!out.empty()) out += ' ';
    out += name;
  }
  return out;
}

SimdLevel active_simd() { return choice().level; }
std::string simd_note() { return choice().note; }

const char* simd_name(SimdLevel level) {
  return level == SimdLevel::AVX2 ? "avx2" : "generic";
}

}  // namespace rcn_fast
