// Binding of the CUDA subset sampler (cuda/sampling.h). Inputs are CUDA
// arrays (torch tensors via DLPack) on one device; the kernels run on the
// caller's stream and the call returns once they finished (error flags).
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <string>

#include "bind_util.h"
#include "cuda/sampling.h"

namespace nb = nanobind;
using namespace rcn_fast;
using bind::AnyArray;

namespace {

using QueryIn = nb::ndarray<const float, nb::ndim<2>, nb::device::cuda>;
using MaskIn = nb::ndarray<const uint8_t, nb::ndim<2>, nb::c_contig, nb::device::cuda>;
using KeysIn = nb::ndarray<const int64_t, nb::ndim<1>, nb::c_contig, nb::device::cuda>;
using IdsOut = nb::ndarray<int64_t, nb::ndim<3>, nb::c_contig, nb::device::cuda>;
using LogpOut = nb::ndarray<float, nb::ndim<3>, nb::c_contig, nb::device::cuda>;

void sample_subsets(const QueryIn& query, const AnyArray& cand, nb::object mask_obj,
                    const KeysIn& keys, double tau, uint64_t seed, bool first_relevance,
                    IdsOut ids_out, nb::object logp_obj, uintptr_t stream) {
  bind::require_ndim(cand, 3, "cand_emb", "[B, n, d]");
  bind::require_device(cand, nb::device::cuda::value, "cand_emb", "CUDA");
  const DType ct = bind::float_dtype(cand, "cand_emb");
  bind::require_unit_inner_stride(cand, "cand_emb");
  const int dev = cand.device_id();
  const int64_t B = int64_t(cand.shape(0)), n = int64_t(cand.shape(1)), d = int64_t(cand.shape(2));
  bind::check_sampling_query(query, B, d);
  bind::check_sampling_keys(keys, B);
  if (query.device_id() != dev || keys.device_id() != dev || ids_out.device_id() != dev)
    throw nb::value_error("cand_emb: query_emb, cand_emb, keys and outputs must be on one CUDA device");
  bind::check_sampling_tau(tau);
  const uint8_t* mask = nullptr;
  if (!mask_obj.is_none()) {
    const MaskIn m = nb::cast<MaskIn>(mask_obj);
    if (int64_t(m.shape(0)) != B || int64_t(m.shape(1)) != n || m.device_id() != dev)
      throw nb::value_error("mask: expected a contiguous uint8 [B, n] array on the inputs' device");
    mask = m.data();
  }
  if (int64_t(ids_out.shape(0)) != B)
    throw nb::value_error("ids_out: expected an int64 [B, num_subsets, subset_size] array");
  const int64_t N = int64_t(ids_out.shape(1)), K = int64_t(ids_out.shape(2));
  if (K < 1) throw nb::value_error("subset_size: expected subset_size >= 1");
  float* logp = nullptr;
  if (!logp_obj.is_none()) {
    LogpOut l = nb::cast<LogpOut>(logp_obj);
    if (int64_t(l.shape(0)) != B || int64_t(l.shape(1)) != N || int64_t(l.shape(2)) != K ||
        l.device_id() != dev)
      throw nb::value_error("logp_out: expected a float32 [B, num_subsets, subset_size] CUDA array");
    logp = l.data();
  }

  const SamplingProblem p = bind::sampling_problem(query, cand, ct, mask, keys, tau, seed, first_relevance, N,
                                                   K, ids_out.data(), logp);
  SamplingResult r;
  {
    nb::gil_scoped_release release;
    r = cuda::sample_subsets_cuda(p, reinterpret_cast<cudaStream_t>(stream));
  }
  if (r.status == SamplingStatus::NonFiniteCandidate)
    throw nb::value_error(("cand_emb: question " + std::to_string(r.question) + ", candidate " +
                           std::to_string(r.candidate) +
                           ": its relevance dot(query_emb, cand_emb) is NaN or inf (the "
                           "embeddings hold NaN/inf values or overflow float32)")
                              .c_str());
  if (r.status == SamplingStatus::NonFiniteScore)
    throw nb::value_error(("tau: scores / tau overflow float32 for question " +
                           std::to_string(r.question) + " (use a larger tau or smaller embeddings)")
                              .c_str());
}

}  // namespace

void bind_sampling_cuda(nb::module_& m) {
  m.def("sample_subsets", &sample_subsets, nb::arg("query"), nb::arg("cand"),
        nb::arg("mask").none(), nb::arg("keys"), nb::arg("tau"), nb::arg("seed"),
        nb::arg("first_relevance"), nb::arg("ids_out"), nb::arg("logp_out").none(),
        nb::arg("stream") = 0,
        "Relevance-based subset sampling on CUDA into preallocated outputs.");
}
