// Binding of the CPU subset sampler (sampling/cpu/sampling.h). The Python layer
// (rcn_fast/sampling/relevance.py) normalises the arguments; the checks here
// keep a direct call from crashing the interpreter.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include "bindings/util.h"
#include "common/philox.h"
#include "sampling/cpu/sampling.h"
#include "sampling/cpu/sampling_gram_emulated.h"

namespace nb = nanobind;
using namespace rcn_fast;
using bind::AnyArray;
using Arrays = bind::DeviceArrays<nb::device::cpu>;

namespace {

void sample_subsets(const Arrays::Query& query, const AnyArray& cand, nb::object mask_obj,
                    const Arrays::Keys& keys, double tau, uint64_t seed, bool first_relevance,
                    Arrays::SubsetIds ids_out, nb::object logp_obj, int num_threads, bool uint16_is_bf16,
                    int emulate_lanes, bool emulate_vec) {
  bind::run_sample_subsets<nb::device::cpu>(
      query, cand, mask_obj, keys, tau, seed, first_relevance, ids_out, logp_obj, uint16_is_bf16,
      [&](const SamplingProblem& p) {
        return emulate_lanes > 0 ? sample_subsets_lanes(p, emulate_lanes, emulate_vec)
                                 : sample_subsets_cpu(p, num_threads);
      });
}

// Test aid: the Gram sampler of sampling/cuda/sampling_gram.cu on the host.
void sample_subsets_gram_emulated_py(const Arrays::Query& query, const AnyArray& cand, nb::object mask_obj,
                                     const Arrays::Keys& keys, double tau, uint64_t seed, bool first_relevance,
                                     Arrays::SubsetIds ids_out, nb::object logp_obj, bool uint16_is_bf16) {
  bind::run_sample_subsets<nb::device::cpu>(query, cand, mask_obj, keys, tau, seed, first_relevance, ids_out,
                                            logp_obj, uint16_is_bf16,
                                            [&](const SamplingProblem& p) { return sample_subsets_gram_emulated(p); });
}

// Test aid: question b's Gram matrix as the Gram sampler makes it.
void sampling_gram_matrix_py(const AnyArray& cand, int64_t b, nb::ndarray<float, nb::ndim<2>, nb::c_contig,
                                                                           nb::device::cpu> out, bool uint16_is_bf16) {
  bind::require_ndim(cand, 3, "cand_emb", "[B, n, d]");
  const DType ct = bind::float_dtype(cand, "cand_emb", uint16_is_bf16);
  bind::require_unit_inner_stride(cand, "cand_emb");
  const int64_t B = int64_t(cand.shape(0)), n = int64_t(cand.shape(1)), d = int64_t(cand.shape(2));
  const int64_t npad = (n + 15) / 16 * 16;
  if (b < 0 || b >= B) throw nb::value_error("b: expected a question of cand_emb");
  if (n > 128) throw nb::value_error("cand_emb: the Gram sampler takes at most 128 candidates a question");
  if (int64_t(out.shape(0)) != npad || int64_t(out.shape(1)) != npad)
    throw nb::value_error("out: expected float32 [npad, npad], npad = n rounded up to 16");
  SamplingProblem p{};
  p.cand = cand.data();
  p.cand_dtype = ct;
  p.cand_stride_b = B > 1 ? int64_t(cand.stride(0)) : n * d;
  p.cand_stride_n = n > 1 ? int64_t(cand.stride(1)) : d;
  p.B = B;
  p.n = n;
  p.d = d;
  nb::gil_scoped_release release;
  sampling_gram_matrix_emulated(p, b, out.data());
}

}  // namespace

void bind_sampling(nb::module_& m) {
  m.def("sample_subsets_gram_emulated", &sample_subsets_gram_emulated_py, nb::arg("query"), nb::arg("cand"),
        nb::arg("mask").none(), nb::arg("keys"), nb::arg("tau"), nb::arg("seed"), nb::arg("first_relevance"),
        nb::arg("ids_out"), nb::arg("logp_out").none(), nb::arg("uint16_is_bf16") = false,
        "Test aid: the CUDA Gram sampler's logic (its Gram matrix through an emulation of mma.m16n8k16) on the host.");
  m.def("sampling_gram_matrix", &sampling_gram_matrix_py, nb::arg("cand"), nb::arg("b"), nb::arg("out"),
        nb::arg("uint16_is_bf16") = false, "Test aid: question b's Gram matrix as the CUDA Gram sampler makes it.");
  m.def("sample_subsets", &sample_subsets, nb::arg("query"), nb::arg("cand"),
        nb::arg("mask").none(), nb::arg("keys"), nb::arg("tau"), nb::arg("seed"),
        nb::arg("first_relevance"), nb::arg("ids_out"), nb::arg("logp_out").none(),
        nb::arg("num_threads") = 0, nb::arg("uint16_is_bf16") = false,
        nb::arg("emulate_lanes") = 0, nb::arg("emulate_vec") = true,
        "Relevance-based subset sampling (ReConnect eqs. 4-6) into preallocated outputs.\n"
        "emulate_lanes > 0 (tests only): run the CUDA kernel's lane-group logic on that many\n"
        "host threads instead of the CPU kernel, its dot products in the kernel's order\n"
        "(emulate_vec: the 16-byte loads of aligned rows, else element by element).");
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
