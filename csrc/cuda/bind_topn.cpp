// Binding of the CUDA top-n scan (cuda/topn.h). Inputs are CUDA arrays
// (torch tensors via DLPack) on one device; the work is enqueued on the
// caller's stream.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <string>

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
  const DType qt = bind::float_dtype(queries, "queries");
  const DType ct = bind::float_dtype(corpus, "corpus");
  if (qt != DType::F32 && qt != ct)
    throw nb::type_error((std::string("queries: expected float32 or the corpus dtype (") +
                          dtype_name(ct) + "), got " + dtype_name(qt))
                             .c_str());
  bind::require_unit_inner_stride(queries, "queries");
  bind::require_unit_inner_stride(corpus, "corpus");
  const int64_t Q = int64_t(queries.shape(0)), d = int64_t(queries.shape(1));
  const int64_t N = int64_t(corpus.shape(0));
  if (int64_t(corpus.shape(1)) != d)
    throw nb::value_error(("corpus: expected " + std::to_string(d) + " columns to match queries").c_str());
  if (k < 1 || k > cuda::kTopnMaxK)
    throw nb::value_error(("k: expected 1 <= k <= " + std::to_string(cuda::kTopnMaxK) +
                           " on CUDA, got " + std::to_string(k))
                              .c_str());
  if (int64_t(scores_out.shape(0)) != Q || int64_t(scores_out.shape(1)) != k)
    throw nb::value_error("scores_out: expected a float32 [Q, k] CUDA array");
  if (int64_t(ids_out.shape(0)) != Q || int64_t(ids_out.shape(1)) != k)
    throw nb::value_error("ids_out: expected an int64 [Q, k] CUDA array");

  cuda::TopnProblemCuda p{};
  p.queries = queries.data();
  p.query_dtype = qt;
  p.query_stride = Q > 1 ? int64_t(queries.stride(0)) : d;
  p.corpus = corpus.data();
  p.corpus_dtype = ct;
  p.corpus_stride = N > 1 ? int64_t(corpus.stride(0)) : d;
  p.Q = Q;
  p.N = N;
  p.d = d;
  p.k = k;
  p.scores_out = scores_out.data();
  p.ids_out = ids_out.data();
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
