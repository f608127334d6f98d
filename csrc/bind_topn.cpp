// Binding of the CPU top-n scan (cpu/topn.h).
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include "bind_util.h"
#include "cpu/topn.h"

namespace nb = nanobind;
using namespace rcn_fast;
using bind::AnyArray;

namespace {

using ScoresOut = nb::ndarray<float, nb::ndim<2>, nb::c_contig, nb::device::cpu>;
using IdsOut = nb::ndarray<int64_t, nb::ndim<2>, nb::c_contig, nb::device::cpu>;

void topn(const AnyArray& queries, const AnyArray& corpus, int64_t k, ScoresOut scores_out,
          IdsOut ids_out, int num_threads, bool uint16_is_bf16) {
  bind::require_ndim(queries, 2, "queries", "[Q, d]");
  bind::require_ndim(corpus, 2, "corpus", "[N, d]");
  bind::require_device(queries, nb::device::cpu::value, "queries", "CPU");
  bind::require_device(corpus, nb::device::cpu::value, "corpus", "CPU");
  const TopnProblem p = bind::topn_problem(queries, corpus, k, scores_out, ids_out, uint16_is_bf16,
                                            /*max_k=*/0, /*cuda=*/false);
  nb::gil_scoped_release release;
  topn_cpu(p, num_threads);
}

}  // namespace

void bind_topn(nb::module_& m) {
  m.def("topn", &topn, nb::arg("queries"), nb::arg("corpus"), nb::arg("k"),
        nb::arg("scores_out"), nb::arg("ids_out"), nb::arg("num_threads") = 0,
        nb::arg("uint16_is_bf16") = false,
        "Exact top-k inner product search into preallocated outputs.");
}
