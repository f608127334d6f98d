// Binding of the CPU subset sampler (cpu/sampling.h). The Python layer
// (rcn_fast/sampling/relevance.py) normalises the arguments; the checks here
// keep a direct call from crashing the interpreter.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <string>

#include "bind_util.h"
#include "common/philox.h"
#include "cpu/sampling.h"

namespace nb = nanobind;
using namespace rcn_fast;
using bind::AnyArray;

namespace {

using QueryIn = nb::ndarray<const float, nb::ndim<2>, nb::device::cpu>;
using MaskIn = nb::ndarray<const uint8_t, nb::ndim<2>, nb::c_contig, nb::device::cpu>;
using KeysIn = nb::ndarray<const int64_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
using IdsOut = nb::ndarray<int64_t, nb::ndim<3>, nb::c_contig, nb::device::cpu>;
using LogpOut = nb::ndarray<float, nb::ndim<3>, nb::c_contig, nb::device::cpu>;

std::string shape_str(int64_t a, int64_t b, int64_t c) {
  return "[" + std::to_string(a) + ", " + std::to_string(b) + ", " + std::to_string(c) + "]";
}

void sample_subsets(const QueryIn& query, const AnyArray& cand, nb::object mask_obj,
                    const KeysIn& keys, double tau, uint64_t seed, bool first_relevance,
                    IdsOut ids_out, nb::object logp_obj, int num_threads, bool uint16_is_bf16,
                    int emulate_lanes) {
  bind::require_ndim(cand, 3, "cand_emb", "[B, n, d]");
  bind::require_device(cand, nb::device::cpu::value, "cand_emb", "CPU");
  const DType ct = bind::float_dtype(cand, "cand_emb", uint16_is_bf16);
  const int64_t B = int64_t(cand.shape(0)), n = int64_t(cand.shape(1)), d = int64_t(cand.shape(2));
  if (B > 0 && n > 0) bind::require_unit_inner_stride(cand, "cand_emb");  // empty: any strides
  bind::check_sampling_query(query, B, d);
  bind::check_sampling_keys(keys, B);
  bind::check_sampling_tau(tau);
  const uint8_t* mask = nullptr;
  if (!mask_obj.is_none()) {
    const MaskIn m = nb::cast<MaskIn>(mask_obj);
    if (int64_t(m.shape(0)) != B || int64_t(m.shape(1)) != n)
      throw nb::value_error("mask: expected a contiguous uint8 [B, n] array");
    mask = m.data();
  }
  const int64_t N = int64_t(ids_out.shape(0)) == B ? int64_t(ids_out.shape(1)) : -1;
  const int64_t K = int64_t(ids_out.shape(2));
  if (N < 0) throw nb::value_error("ids_out: expected an int64 [B, num_subsets, subset_size] array");
  if (K < 1) throw nb::value_error("subset_size: expected subset_size >= 1");
  float* logp = nullptr;
  if (!logp_obj.is_none()) {
    LogpOut l = nb::cast<LogpOut>(logp_obj);
    if (int64_t(l.shape(0)) != B || int64_t(l.shape(1)) != N || int64_t(l.shape(2)) != K)
      throw nb::value_error(("logp_out: expected a float32 " + shape_str(B, N, K) + " array").c_str());
    logp = l.data();
  }

  const SamplingProblem p = bind::sampling_problem(query, cand, ct, mask, keys, tau, seed, first_relevance, N,
                                                   K, ids_out.data(), logp);
  SamplingResult r;
  {
    nb::gil_scoped_release release;
    r = emulate_lanes > 0 ? sample_subsets_lanes(p, emulate_lanes) : sample_subsets_cpu(p, num_threads);
  }
  switch (r.status) {
    case SamplingStatus::Ok: return;
    case SamplingStatus::NonFiniteCandidate:
      throw nb::value_error(("cand_emb: question " + std::to_string(r.question) + ", candidate " +
                             std::to_string(r.candidate) +
                             ": its relevance dot(query_emb, cand_emb) is NaN or inf (the "
                             "embeddings hold NaN/inf values or overflow float32)")
                                .c_str());
    case SamplingStatus::NonFiniteScore:
      throw nb::value_error(("tau: scores / tau overflow float32 for question " +
                             std::to_string(r.question) +
                             " (use a larger tau or smaller embeddings)")
                                .c_str());
  }
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
