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
#include "sampling/sampling_gram.h"

namespace nb = nanobind;
using namespace rcn_fast;
using bind::AnyArray;
using Arrays = bind::DeviceArrays<nb::device::cuda>;

namespace {

void sample_subsets(const Arrays::Query& query, const AnyArray& cand, nb::object mask_obj,
                    const Arrays::Keys& keys, double tau, uint64_t seed, bool first_relevance,
                    Arrays::SubsetIds ids_out, nb::object logp_obj, uintptr_t stream, bool gram) {
  bind::run_sample_subsets<nb::device::cuda>(
      query, cand, mask_obj, keys, tau, seed, first_relevance, ids_out, logp_obj, /*uint16_is_bf16=*/false,
      [&](const SamplingProblem& p) {
        const cudaStream_t s = reinterpret_cast<cudaStream_t>(stream);
        if (!gram) return cuda::sample_subsets_cuda(p, s);
        if (const char* why = cuda::sample_subsets_gram_unsupported(p))
          throw std::invalid_argument(std::string("cand_emb: the Gram sampler cannot serve this call: ") + why);
        return cuda::sample_subsets_gram_cuda(p, s);
      });
}

}  // namespace

void bind_sampling_cuda(nb::module_& m) {
  m.attr("SAMPLER_GRAM_MAX_N") = gram::kMaxN;
  m.def("sample_subsets", &sample_subsets, nb::arg("query"), nb::arg("cand"),
        nb::arg("mask").none(), nb::arg("keys"), nb::arg("tau"), nb::arg("seed"),
        nb::arg("first_relevance"), nb::arg("ids_out"), nb::arg("logp_out").none(),
        nb::arg("stream") = 0, nb::arg("gram") = false,
        "Relevance-based subset sampling on CUDA into preallocated outputs.\n"
        "gram: the Gram sampler (a block a question, at most SAMPLER_GRAM_MAX_N candidates; ValueError\n"
        "where it cannot serve), else the warp sampler (a warp a subset).");
}
