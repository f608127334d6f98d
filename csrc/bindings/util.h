// Argument checks shared by the nanobind modules (_C and _cuda). Every
// failure names the argument and what was expected.
#pragma once
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <cmath>
#include <cstdint>
#include <string>

#include "common/dtypes.h"
#include "common/problems.h"

namespace rcn_fast::bind {

namespace nb = nanobind;
using AnyArray = nb::ndarray<nb::ro>;

// uint16_is_bf16: numpy has no bfloat16; the Python layer passes ml_dtypes
// bfloat16 arrays as uint16 views and sets this flag.
inline DType float_dtype(const AnyArray& a, const char* name, bool uint16_is_bf16 = false) {
  const nb::dlpack::dtype t = a.dtype();
  if (t.lanes == 1) {
    if (uint16_is_bf16 && t.code == uint8_t(nb::dlpack::dtype_code::UInt) && t.bits == 16)
      return DType::BF16;
    if (t.code == uint8_t(nb::dlpack::dtype_code::Float) && t.bits == 32) return DType::F32;
    if (t.code == uint8_t(nb::dlpack::dtype_code::Float) && t.bits == 16) return DType::F16;
    if (t.code == uint8_t(nb::dlpack::dtype_code::Bfloat) && t.bits == 16) return DType::BF16;
  }
  throw nb::type_error((std::string(name) +
                        ": expected float32, float16 or bfloat16 elements (dlpack code " +
                        std::to_string(int(t.code)) + ", " + std::to_string(int(t.bits)) + " bits)")
                           .c_str());
}

inline void require_ndim(const AnyArray& a, size_t ndim, const char* name, const char* shape) {
  if (a.ndim() != ndim)
    throw nb::value_error((std::string(name) + ": expected a " + std::to_string(ndim) +
                           "-d array of shape " + shape + ", got " + std::to_string(a.ndim()) +
                           " dimension(s)")
                              .c_str());
}

// An empty array (some dimension 0) passes: it has no element to address,
// and exporters give it arbitrary strides (numpy's DLPack export gives 0).
inline void require_unit_inner_stride(const AnyArray& a, const char* name) {
  const size_t nd = a.ndim();
  for (size_t i = 0; i < nd; ++i)
    if (a.shape(i) == 0) return;
  if (nd > 0 && a.shape(nd - 1) > 1 && a.stride(nd - 1) != 1)
    throw nb::value_error((std::string(name) +
                           ": the last dimension must be contiguous (stride 1 element); "
                           "pass a contiguous copy")
                              .c_str());
  for (size_t i = 0; i < nd; ++i)
    if (a.stride(i) < 0)
      throw nb::value_error((std::string(name) + ": negative strides are not supported").c_str());
}

inline void require_device(const AnyArray& a, int device_type, const char* name, const char* where) {
  if (a.device_type() != device_type)
    throw nb::value_error((std::string(name) + ": expected an array in " + where + " memory").c_str());
}

// The typed arrays of the bindings on one device (nb::device::cpu or
// nb::device::cuda): the same ops take the same arrays on either, and the
// messages name the device's memory.
template <class Device>
struct DeviceArrays {
  static constexpr bool cuda = Device::value == nb::device::cuda::value;
  static constexpr const char* memory = cuda ? "CUDA" : "CPU";
  // top-n outputs, [Q, k]
  using TopnScores = nb::ndarray<float, nb::ndim<2>, nb::c_contig, Device>;
  using TopnIds = nb::ndarray<int64_t, nb::ndim<2>, nb::c_contig, Device>;
  // the sampler's inputs (query [B, d], mask [B, n], keys [B]) and outputs [B, N, K]
  using Query = nb::ndarray<const float, nb::ndim<2>, Device>;
  using Mask = nb::ndarray<const uint8_t, nb::ndim<2>, nb::c_contig, Device>;
  using Keys = nb::ndarray<const int64_t, nb::ndim<1>, nb::c_contig, Device>;
  using SubsetIds = nb::ndarray<int64_t, nb::ndim<3>, nb::c_contig, Device>;
  using SubsetLogp = nb::ndarray<float, nb::ndim<3>, nb::c_contig, Device>;
};

// ---------------------------------------------------------------- top-n
// The checks of a top-n call once its inputs' ndim and device are checked
// (run_topn), and the problem they describe. `max_k` > 0 bounds k (the CUDA
// kernel); `cuda` names CUDA memory in the messages.
template <class ScoresOut, class IdsOut>
inline TopnProblem topn_problem(const AnyArray& queries, const AnyArray& corpus, int64_t k,
                                const ScoresOut& scores_out, const IdsOut& ids_out,
                                bool uint16_is_bf16, int64_t max_k, bool cuda) {
  const DType qt = float_dtype(queries, "queries", uint16_is_bf16);
  const DType ct = float_dtype(corpus, "corpus", uint16_is_bf16);
  if (qt != DType::F32 && qt != ct)
    throw nb::type_error((std::string("queries: expected float32 or the corpus dtype (") +
                          dtype_name(ct) + "), got " + dtype_name(qt))
                             .c_str());
  require_unit_inner_stride(queries, "queries");
  require_unit_inner_stride(corpus, "corpus");
  const int64_t Q = int64_t(queries.shape(0)), d = int64_t(queries.shape(1));
  const int64_t N = int64_t(corpus.shape(0));
  if (int64_t(corpus.shape(1)) != d)
    throw nb::value_error(("corpus: expected " + std::to_string(d) +
                           " columns to match queries, got " + std::to_string(corpus.shape(1)))
                              .c_str());
  if (k < 1 || (max_k > 0 && k > max_k))
    throw nb::value_error((max_k > 0 ? "k: expected 1 <= k <= " + std::to_string(max_k) +
                                           (cuda ? " on CUDA" : "") + ", got " + std::to_string(k)
                                     : "k: expected k >= 1, got " + std::to_string(k))
                              .c_str());
  const std::string mem = cuda ? " CUDA array" : " array";
  if (int64_t(scores_out.shape(0)) != Q || int64_t(scores_out.shape(1)) != k)
    throw nb::value_error(("scores_out: expected a float32 [Q, k]" + mem).c_str());
  if (int64_t(ids_out.shape(0)) != Q || int64_t(ids_out.shape(1)) != k)
    throw nb::value_error(("ids_out: expected an int64 [Q, k]" + mem).c_str());

  TopnProblem p{};
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
  return p;
}

// The body of the CPU and CUDA top-n bindings: checks the arguments for
// `Device` (on CUDA: all on one device), then runs launch(problem) with the
// GIL released.
template <class Device, class Launch>
inline void run_topn(const AnyArray& queries, const AnyArray& corpus, int64_t k,
                     const typename DeviceArrays<Device>::TopnScores& scores_out,
                     const typename DeviceArrays<Device>::TopnIds& ids_out, bool uint16_is_bf16,
                     int64_t max_k, const Launch& launch) {
  using Arrays = DeviceArrays<Device>;
  require_ndim(queries, 2, "queries", "[Q, d]");
  require_ndim(corpus, 2, "corpus", "[N, d]");
  require_device(queries, Device::value, "queries", Arrays::memory);
  require_device(corpus, Device::value, "corpus", Arrays::memory);
  if (Arrays::cuda && (queries.device_id() != corpus.device_id() ||
                       scores_out.device_id() != corpus.device_id() ||
                       ids_out.device_id() != corpus.device_id()))
    throw nb::value_error("corpus: queries, corpus and outputs must be on the same CUDA device");
  const TopnProblem p =
      topn_problem(queries, corpus, k, scores_out, ids_out, uint16_is_bf16, max_k, Arrays::cuda);
  nb::gil_scoped_release release;
  launch(p);
}

// ---------------------------------------------------------------- sampling
// The sampler's argument checks shared by the CPU and CUDA bindings.
template <class QueryIn>
inline void check_sampling_query(const QueryIn& query, int64_t B, int64_t d) {
  if (int64_t(query.shape(0)) != B || int64_t(query.shape(1)) != d)
    throw nb::value_error(("query_emb: expected shape [" + std::to_string(B) + ", " +
                           std::to_string(d) + "] to match cand_emb [B, n, d]")
                              .c_str());
  if (d > 1 && query.stride(1) != 1)
    throw nb::value_error("query_emb: the last dimension must be contiguous");
}

template <class KeysIn>
inline void check_sampling_keys(const KeysIn& keys, int64_t B) {
  if (int64_t(keys.shape(0)) != B)
    throw nb::value_error(("keys: expected " + std::to_string(B) + " entries").c_str());
}

inline void check_sampling_tau(double tau) {
  if (!(tau > 0.0) || !std::isfinite(tau) || !std::isfinite(1.0f / float(tau)))
    throw nb::value_error(("tau: expected a finite float > 0 (and 1/tau finite in float32), got " +
                           std::to_string(tau))
                              .c_str());
}

// The sampling problem of checked arguments (N subsets of K per question).
template <class QueryIn, class KeysIn>
inline SamplingProblem sampling_problem(const QueryIn& query, const AnyArray& cand, DType ct,
                                        const uint8_t* mask, const KeysIn& keys, double tau,
                                        uint64_t seed, bool first_relevance, int64_t N, int64_t K,
                                        int64_t* ids_out, float* logp_out) {
  const int64_t B = int64_t(cand.shape(0)), n = int64_t(cand.shape(1)), d = int64_t(cand.shape(2));
  SamplingProblem p{};
  p.query = query.data();
  p.query_stride = B > 1 ? int64_t(query.stride(0)) : d;
  p.cand = cand.data();
  p.cand_dtype = ct;
  p.cand_stride_b = B > 1 ? int64_t(cand.stride(0)) : n * d;
  p.cand_stride_n = n > 1 ? int64_t(cand.stride(1)) : d;
  p.mask = mask;
  p.keys = keys.data();
  p.B = B;
  p.n = n;
  p.d = d;
  p.num_subsets = N;
  p.subset_size = K;
  p.inv_tau = float(1.0 / tau);
  p.seed = seed;
  p.first_relevance = first_relevance;
  p.ids_out = ids_out;
  p.logp_out = logp_out;
  return p;
}

inline std::string shape_str(int64_t a, int64_t b, int64_t c) {
  return "[" + std::to_string(a) + ", " + std::to_string(b) + ", " + std::to_string(c) + "]";
}

// The body of the CPU and CUDA sampling bindings: checks the arguments for
// `Device` (on CUDA: all on cand_emb's device), runs launch(problem) ->
// SamplingResult with the GIL released, and raises the failure it reports.
template <class Device, class Launch>
inline void run_sample_subsets(const typename DeviceArrays<Device>::Query& query, const AnyArray& cand,
                               const nb::object& mask_obj, const typename DeviceArrays<Device>::Keys& keys,
                               double tau, uint64_t seed, bool first_relevance,
                               const typename DeviceArrays<Device>::SubsetIds& ids_out,
                               const nb::object& logp_obj, bool uint16_is_bf16, const Launch& launch) {
  using Arrays = DeviceArrays<Device>;
  require_ndim(cand, 3, "cand_emb", "[B, n, d]");
  require_device(cand, Device::value, "cand_emb", Arrays::memory);
  const DType ct = float_dtype(cand, "cand_emb", uint16_is_bf16);
  require_unit_inner_stride(cand, "cand_emb");  // an empty cand_emb passes with any strides
  const int dev = cand.device_id();
  const int64_t B = int64_t(cand.shape(0)), n = int64_t(cand.shape(1)), d = int64_t(cand.shape(2));
  check_sampling_query(query, B, d);
  check_sampling_keys(keys, B);
  if (Arrays::cuda && (query.device_id() != dev || keys.device_id() != dev || ids_out.device_id() != dev))
    throw nb::value_error("cand_emb: query_emb, cand_emb, keys and outputs must be on one CUDA device");
  check_sampling_tau(tau);
  // The optional arrays are held until the launch returns: one that nanobind
  // converted (another dtype or order) lives only as long as its ndarray.
  typename Arrays::Mask m;
  typename Arrays::SubsetLogp l;
  const uint8_t* mask = nullptr;
  if (!mask_obj.is_none()) {
    m = nb::cast<typename Arrays::Mask>(mask_obj);
    if (int64_t(m.shape(0)) != B || int64_t(m.shape(1)) != n || (Arrays::cuda && m.device_id() != dev))
      throw nb::value_error(Arrays::cuda
                                ? "mask: expected a contiguous uint8 [B, n] array on the inputs' device"
                                : "mask: expected a contiguous uint8 [B, n] array");
    mask = m.data();
  }
  if (int64_t(ids_out.shape(0)) != B)
    throw nb::value_error("ids_out: expected an int64 [B, num_subsets, subset_size] array");
  const int64_t N = int64_t(ids_out.shape(1)), K = int64_t(ids_out.shape(2));
  if (K < 1) throw nb::value_error("subset_size: expected subset_size >= 1");
  float* logp = nullptr;
  if (!logp_obj.is_none()) {
    l = nb::cast<typename Arrays::SubsetLogp>(logp_obj);
    if (int64_t(l.shape(0)) != B || int64_t(l.shape(1)) != N || int64_t(l.shape(2)) != K ||
        (Arrays::cuda && l.device_id() != dev))
      throw nb::value_error(("logp_out: expected a float32 " +
                             (Arrays::cuda ? std::string("[B, num_subsets, subset_size] CUDA")
                                           : shape_str(B, N, K)) +
                             " array")
                                .c_str());
    logp = l.data();
  }

  const SamplingProblem p =
      sampling_problem(query, cand, ct, mask, keys, tau, seed, first_relevance, N, K, ids_out.data(), logp);
  const SamplingResult r = [&] {
    nb::gil_scoped_release release;
    return launch(p);
  }();
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
                             std::to_string(r.question) + " (use a larger tau or smaller embeddings)")
                                .c_str());
  }
}

}  // namespace rcn_fast::bind
