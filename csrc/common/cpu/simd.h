// Which compiled variant of the ISA-specific kernels runs on this CPU.
#pragma once
#include <string>

namespace rcn_fast {

enum class SimdLevel : int { Generic = 0, AVX2 = 1 };

// Variants compiled into this build, e.g. "generic,avx2".
std::string simd_compiled();
// CPU features relevant to the variants, e.g. "avx2 fma f16c".
std::string cpu_features();
// The variant in use: the best one the CPU supports, unless RCN_FAST_SIMD
// names another (generic|avx2); an unsupported request falls back to generic
// and simd_note() says why.
SimdLevel active_simd();
const char* simd_name(SimdLevel level);
// Whether this build and CPU (and OS) run the avx2 (+fma, f16c) and the
// avx512 (f, bw, vl, dq) variants.
bool cpu_supports_avx2();
bool cpu_supports_avx512();
// ... and the VNNI variants, where compiled in: avx512vnni (avx512 +
// avx512_vnni: the LLM engine's 8-bit products and the int8 scan) and
// avxvnni (avx2 + AVX-VNNI: the int8 scan).
bool cpu_supports_avx512vnni();
bool cpu_supports_avxvnni();
std::string simd_note();

}  // namespace rcn_fast
