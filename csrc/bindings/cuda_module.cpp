// rcn_fast._cuda: thin nanobind bindings over the CUDA launchers. A separate
// module so that `import rcn_fast` never depends on a GPU or a driver: the
// CUDA runtime is linked statically and only touches the driver when called.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>

#include <string>

#include "bindings/util.h"
#include "common/cuda/runtime.h"
#include "sampling/cuda/sampling.h"
#include "sampling/cuda/sampling_gram.h"
#include "topn/cuda/topn.h"
#include "topn/cuda/topn_block_select.h"
#include "topn/cuda/topn_int8.h"

namespace nb = nanobind;
using namespace rcn_fast;

namespace {

nb::dict cuda_info() {
  nb::dict info;
  std::string why;
  const int n = cuda::device_count(why);
  info["device_count"] = n < 0 ? 0 : n;
  info["usable"] = n > 0;
  info["reason"] = why;
  info["architectures"] = RCN_CUDA_ARCHS;
  info["toolkit"] = RCN_CUDA_VERSION;
  int rt = 0, drv = 0;
  cudaRuntimeGetVersion(&rt);
  cudaDriverGetVersion(&drv);
  info["runtime_version"] = rt;
  info["driver_version"] = drv;
  if (n > 0) {
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, 0) == cudaSuccess) {
      info["device0"] = std::string(prop.name);
      info["device0_cc"] = std::to_string(prop.major) + "." + std::to_string(prop.minor);
    }
  }
  return info;
}

}  // namespace

void bind_topn_cuda(nb::module_& m);
void bind_sampling_cuda(nb::module_& m);


NB_MODULE(_cuda, m) {
  m.doc() = "rcn_fast CUDA launchers (see csrc/*/cuda/)";
  m.def("cuda_info", &cuda_info, "Devices, driver and toolkit as this module sees them.");
  bind_topn_cuda(m);
  bind_sampling_cuda(m);
  // the kernels' versions: a recorded GPU measurement counts for the
  // dispatcher only while the kernel it measured is the one built
  // (rcn_fast/_crossovers.py)
  nb::dict versions;
  versions["topn"] = cuda::kTopnKernelVersion;
  versions["topn_tiled"] = cuda::kTopnTiledKernelVersion;
  versions["topn_int8"] = cuda::kTopnInt8KernelVersion;
  versions["sample_subsets"] = cuda::kSamplingKernelVersion;
  versions["sample_subsets_gram"] = cuda::kSamplingGramKernelVersion;
  m.attr("KERNEL_VERSIONS") = versions;

}
