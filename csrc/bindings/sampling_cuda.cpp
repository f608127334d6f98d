// Binding of the CUDA subset sampler (sampling/cuda/sampling.h). Inputs are CUDA
// arrays (torch tensors via DLPack) on one device; the kernels run on the
// caller's stream and the call returns once they finished (error flags).
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <stdexcept>
#include <string>

#include "bindings/util.h"
#include "sampling/cuda/sampling.h"
#include "sampling/cuda/sampling_gram.h"

namespace nb = nanobind;
using namespace rcn_fast;
using bind::AnyArray;
using Arrays = bind::DeviceArrays<nb::device::cuda>;

namespace {

void sample_subsets(const Arrays::Query& query, const AnyArray& cand, nb::object mask_obj,
                    const Arrays::Keys& keys, double tau, uint64_t seed, bool first_relevance,
                    Arrays::SubsetIds ids_out, nb::object logp_obj, uintptr_t stream) {
  bind::run_sample_subsets<nb::device::cuda>(
      query, cand, mask_obj, keys, tau, seed, first_relevance, ids_out, logp_obj, /*uint16_is_bf16=*/false,
      [&](const SamplingProblem& p) {
        return cuda::sample_subsets_cuda(p, reinterpret_cast<cudaStream_t>(stream));
      });
}

void sample_subsets_gram(const Arrays::Query& query, const AnyArray& cand, nb::object mask_obj,
                         const Arrays::Keys& keys, double tau, uint64_t seed, bool first_relevance,
                         Arrays::SubsetIds ids_out, nb::object logp_obj, uintptr_t stream) {
  bind::run_sample_subsets<nb::device::cuda>(
      query, cand, mask_obj, keys, tau, seed, first_relevance, ids_out, logp_obj, /*uint16_is_bf16=*/false,
      [&](const SamplingProblem& p) {
        if (const char* why = cuda::sample_subsets_gram_unsupported(p))
          throw std::invalid_argument(std::string("cand_emb: the Gram sampler cannot serve this call: ") + why);
        return cuda::sample_subsets_gram_cuda(p, reinterpret_cast<cudaStream_t>(stream));
      });
}

}  // namespace

void bind_sampling_cuda(nb::module_& m) {
  m.def("sample_subsets_gram", &sample_subsets_gram, nb::arg("query"), nb::arg("cand"), nb::arg("mask").none(),
        nb::arg("keys"), nb::arg("tau"), nb::arg("seed"), nb::arg("first_relevance"), nb::arg("ids_out"),
        nb::arg("logp_out").none(), nb::arg("stream") = 0,
        "The Gram sampler (a block a question; at most 128 candidates) into preallocated outputs.");
  m.attr("SAMPLER_GRAM_MAX_N") = 128;
  m.def("sample_subsets", &sample_subsets, nb::arg("query"), nb::arg("cand"),
        nb::arg("mask").none(), nb::arg("keys"), nb::arg("tau"), nb::arg("seed"),
        nb::arg("first_relevance"), nb::arg("ids_out"), nb::arg("logp_out").none(),
        nb::arg("stream") = 0,
        "Relevance-based subset sampling on CUDA into preallocated outputs.");
}
