// Binding of the CPU top-n scan (cpu/topn.h).
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include "bind_util.h"
#include "cpu/topn.h"

namespace nb = nanobind;
using namespace rcn_fast;
using bind::AnyArray;
using Arrays = bind::DeviceArrays<nb::device::cpu>;

namespace {

void topn(const AnyArray& queries, const AnyArray& corpus, int64_t k, Arrays::TopnScores scores_out,
          Arrays::TopnIds ids_out, int num_threads, bool uint16_is_bf16) {
  bind::run_topn<nb::device::cpu>(queries, corpus, k, scores_out, ids_out, uint16_is_bf16, /*max_k=*/0,
                                  [&](const TopnProblem& p) { topn_cpu(p, num_threads); });
}

}  // namespace

void bind_topn(nb::module_& m) {
  m.def("topn", &topn, nb::arg("queries"), nb::arg("corpus"), nb::arg("k"),
        nb::arg("scores_out"), nb::arg("ids_out"), nb::arg("num_threads") = 0,
        nb::arg("uint16_is_bf16") = false,
        "Exact top-k inner product search into preallocated outputs.");
}
