// Binding of the CUDA top-n scan (topn/cuda/topn.h). Inputs are CUDA arrays
// (torch tensors via DLPack) on one device; the work is enqueued on the
// caller's stream.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include "bindings/util.h"
#include "topn/cuda/topn.h"
#include "topn/cuda/topn_mma.h"

namespace nb = nanobind;
using namespace rcn_fast;
using bind::AnyArray;
using Arrays = bind::DeviceArrays<nb::device::cuda>;

namespace {

void topn(const AnyArray& queries, const AnyArray& corpus, int64_t k, Arrays::TopnScores scores_out,
          Arrays::TopnIds ids_out, uintptr_t stream, int algorithm) {
  if (algorithm < 0 || algorithm > 2)
    throw nb::value_error("algorithm: expected 0 (auto), 1 (tiled) or 2 (tensor-core scan)");
  bind::run_topn<nb::device::cuda>(
      queries, corpus, k, scores_out, ids_out, /*uint16_is_bf16=*/false, cuda::kTopnMaxK,
      [&](const TopnProblem& p) {
        cuda::topn_cuda(p, reinterpret_cast<cudaStream_t>(stream), cuda::TopnAlgorithm(algorithm));
      });
}

}  // namespace

void bind_topn_cuda(nb::module_& m) {
  m.attr("TOPN_MAX_K") = cuda::kTopnMaxK;
  m.attr("TOPN_MMA_MAX_K") = cuda::kTopnMmaMaxK;
  m.def("topn", &topn, nb::arg("queries"), nb::arg("corpus"), nb::arg("k"), nb::arg("scores_out"),
        nb::arg("ids_out"), nb::arg("stream") = 0, nb::arg("algorithm") = 0,
        "Exact top-k inner product search on CUDA into preallocated outputs.\n"
        "algorithm: 0 the tensor-core scan where it can serve the call, else the tiled kernel;\n"
        "1 the tiled kernel; 2 the tensor-core scan (k <= TOPN_MMA_MAX_K; ValueError where it cannot serve).\n"
        "0 and 2 do not check the query values: float32 queries on a float16/bfloat16 corpus must be\n"
        "finite (the scan splits them into terms of the corpus dtype; a row with NaN or +-inf gets only\n"
        "padding). The caller checks (rcn_fast.search.topn passes 1 for non-finite queries).");
}
