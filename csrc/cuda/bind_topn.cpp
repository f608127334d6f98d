// Binding of the CUDA top-n scan (cuda/topn.h). Inputs are CUDA arrays
// (torch tensors via DLPack) on one device; the work is enqueued on the
// caller's stream.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include "bind_util.h"
#include "cuda/topn.h"

namespace nb = nanobind;
using namespace rcn_fast;
using bind::AnyArray;

namespace {

using ScoresOut = nb::ndarray<float, nb::ndim<2>, nb::c_contig, nb::device::cuda>;
using IdsOut = nb::ndarray<int64_t, nb::ndim<2>, nb::c_contig, nb::device::cuda>;

void topn(const AnyArray& queries, const AnyArray& corpus, int64_t k, ScoresOut scores_out,
          IdsOut ids_out, uintptr_t stream) {
  bind::require_ndim(queries, 2, "queries", "[Q, d]");
  bind::require_ndim(corpus, 2, "corpus", "[N, d]");
  bind::require_device(queries, nb::device::cuda::value, "queries", "CUDA");
  bind::require_device(corpus, nb::device::cuda::value, "corpus", "CUDA");
  if (queries.device_id() != corpus.device_id() || scores_out.device_id() != corpus.device_id() ||
      ids_out.device_id() != corpus.device_id())
    throw nb::value_error("corpus: queries, corpus and outputs must be on the same CUDA device");
  const TopnProblem p = bind::topn_problem(queries, corpus, k, scores_out, ids_out, /*uint16_is_bf16=*/false,
                                            cuda::kTopnMaxK, /*cuda=*/true);
  nb::gil_scoped_release release;
  cuda::topn_cuda(p, reinterpret_cast<cudaStream_t>(stream));
}

}  // namespace

void bind_topn_cuda(nb::module_& m) {
  m.attr("TOPN_MAX_K") = cuda::kTopnMaxK;
  m.def("topn", &topn, nb::arg("queries"), nb::arg("corpus"), nb::arg("k"), nb::arg("scores_out"),
        nb::arg("ids_out"), nb::arg("stream") = 0,
        "Exact top-k inner product search on CUDA into preallocated outputs.");
}
