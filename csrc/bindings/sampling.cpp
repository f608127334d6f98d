// Binding of the CPU subset sampler (sampling/cpu/sampling.h). The Python layer
// (rcn_fast/sampling/relevance.py) normalises the arguments; the checks here
// keep a direct call from crashing the interpreter.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include "bindings/util.h"
#include "common/philox.h"
#include "sampling/cpu/sampling.h"

namespace nb = nanobind;
using namespace rcn_fast;
using bind::AnyArray;
using Arrays = bind::DeviceArrays<nb::device::cpu>;

namespace {

void sample_subsets(const Arrays::Query& query, const AnyArray& cand, nb::object mask_obj,
                    const Arrays::Keys& keys, double tau, uint64_t seed, bool first_relevance,
                    Arrays::SubsetIds ids_out, nb::object logp_obj, int num_threads, bool uint16_is_bf16,
                    int emulate_lanes) {
  bind::run_sample_subsets<nb::device::cpu>(
      query, cand, mask_obj, keys, tau, seed, first_relevance, ids_out, logp_obj, uint16_is_bf16,
      [&](const SamplingProblem& p) {
        return emulate_lanes > 0 ? sample_subsets_lanes(p, emulate_lanes) : sample_subsets_cpu(p, num_threads);
      });
}

}  // namespace

void bind_sampling(nb::module_& m) {
  m.def("sample_subsets", &sample_subsets, nb::arg("query"), nb::arg("cand"),
        nb::arg("mask").none(), nb::arg("keys"), nb::arg("tau"), nb::arg("seed"),
        nb::arg("first_relevance"), nb::arg("ids_out"), nb::arg("logp_out").none(),
        nb::arg("num_threads") = 0, nb::arg("uint16_is_bf16") = false,
        nb::arg("emulate_lanes") = 0,
        "Relevance-based subset sampling (ReConnect eqs. 4-6) into preallocated outputs.\n"
        "emulate_lanes > 0 (tests only): run the CUDA kernel's lane-group logic on that many\n"
        "host threads instead of the CPU kernel.");
  m.def(
      "philox_uniform",
      [](uint64_t seed, uint64_t stream, uint32_t subset, uint32_t step) {
        return sampler_uniform(seed, stream, subset, step);
      },
      nb::arg("seed"), nb::arg("stream"), nb::arg("subset"), nb::arg("step"),
      "The sampler's uniform for (seed, stream, subset, step) (for tests).");
  m.def(
      "philox4x32_10",
      [](uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3, uint32_t k0, uint32_t k1) {
        const Philox4x32 r = philox4x32_10(Philox4x32{{c0, c1, c2, c3}}, k0, k1);
        return nb::make_tuple(r.v[0], r.v[1], r.v[2], r.v[3]);
      },
      "Raw Philox4x32-10 block (for known-answer tests).");
}
