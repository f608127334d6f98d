// rcn_fast._C: thin nanobind bindings over the framework-free CPU kernels.
// Arrays arrive through DLPack / the buffer protocol without copies; the
// GIL is released while a kernel runs. Each op binds itself in its own
// csrc/bindings/<op>.cpp; this file holds the module and the build report.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>

#include "common/cpu/parallel.h"
#include "llm/cpu/quant_kernels.h"
#include "common/cpu/simd.h"
#include "topn/cpu/topn_int8.h"

namespace nb = nanobind;
using namespace rcn_fast;

void bind_topn(nb::module_& m);
void bind_sampling(nb::module_& m);
void bind_llm_decoder(nb::module_& m);

namespace {

nb::dict build_info() {
  nb::dict info;
  info["version"] = RCN_VERSION;
  info["compiler"] = RCN_COMPILER;
  info["simd_compiled"] = simd_compiled();
  info["simd_active"] = simd_name(active_simd());
  info["simd_note"] = simd_note();
  info["cpu_features"] = cpu_features();
  info["llm_kernels"] = quant_kernels().name;  // the local LLM engine's variant (csrc/llm/cpu/quant_kernels.h)
  info["llm_kernels_compiled"] = quant_compiled();
  info["int8_scan"] = int8_isa_named("")->name;  // the int8 bounded scan's variant (csrc/topn/cpu/topn_int8.h)
  info["int8_scan_compiled"] = int8_isa_compiled();
  info["num_threads"] = default_num_threads();
  info["cuda_compiled"] = bool(RCN_CUDA_COMPILED);
  info["cuda_option"] = RCN_CUDA_OPTION;
  return info;
}

}  // namespace

NB_MODULE(_C, m) {
  m.doc() = "rcn_fast native CPU kernels (framework-free C++; see csrc/)";
  bind_topn(m);
  bind_sampling(m);
  bind_llm_decoder(m);
  m.def("build_info", &build_info, "What this module was built with and what it runs.");
}
