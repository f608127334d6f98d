// Argument checks of the row selections (topn/topn_block_select.h) shared
// by the CPU and CUDA bindings: the torch backend's finishing of a chunk,
// and the block select of a score tile. Every failure names the argument.
#pragma once
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>

#include "bindings/util.h"
#include "topn/topn_block_select.h"
#include "topn/topn_int8.h"
#include "topn/topn_int8_scan.h"

namespace rcn_fast::bind {

template <class Device>
struct RowArrays {
  using Scores = nb::ndarray<const float, nb::ndim<2>, Device>;  // rows any stride apart, unit inner stride
  using TopS = nb::ndarray<const float, nb::ndim<2>, nb::c_contig, Device>;
  using TopI = nb::ndarray<const int64_t, nb::ndim<2>, nb::c_contig, Device>;
  using Scales = nb::ndarray<const float, nb::ndim<1>, nb::c_contig, Device>;
  using Parts = nb::ndarray<float, nb::ndim<3>, nb::c_contig, Device>;
  using PartIds = nb::ndarray<int64_t, nb::ndim<3>, nb::c_contig, Device>;
};

// Elements between the rows of a 2-d array with unit inner stride (checked).
template <class A>
inline int64_t row_stride(const A& a, const char* name) {
  if (a.shape(1) > 1 && a.stride(1) != 1)
    throw nb::value_error((std::string(name) + ": the last dimension must be contiguous").c_str());
  if (a.shape(0) > 1 && a.stride(0) < int64_t(a.shape(1)))
    throw nb::value_error((std::string(name) + ": rows must not overlap").c_str());
  return a.shape(0) > 1 ? int64_t(a.stride(0)) : int64_t(a.shape(1));
}

inline void same_device(bool cuda, int expected, int got, const char* name) {
  if (cuda && got != expected)
    throw nb::value_error((std::string(name) + ": expected an array on the scores' CUDA device").c_str());
}

// An argument's device and name, for same_device over several at once.
struct Placed {
  int device;
  const char* name;
};

inline void same_device(bool cuda, int expected, std::initializer_list<Placed> arrays) {
  for (const Placed& a : arrays) same_device(cuda, expected, a.device, a.name);
}

// The finishing problem of checked arguments (common/problems.h).
template <class Device>
inline TopnFinishProblem finish_problem(const typename RowArrays<Device>::Scores& scores,
                                        const typename RowArrays<Device>::TopS& top_s,
                                        const typename RowArrays<Device>::TopI& top_i, int64_t k, int64_t id_base,
                                        const typename DeviceArrays<Device>::TopnScores& out_s,
                                        const typename DeviceArrays<Device>::TopnIds& out_i,
                                        const std::optional<typename RowArrays<Device>::Scores>& queries,
                                        const std::optional<AnyArray>& corpus, bool uint16_is_bf16) {
  constexpr bool cuda = DeviceArrays<Device>::cuda;
  const int64_t Q = int64_t(scores.shape(0)), n = int64_t(scores.shape(1));
  if (k < 1 || k > 1024) throw nb::value_error(("k: expected 1 <= k <= 1024, got " + std::to_string(k)).c_str());
  if (n >= (int64_t(1) << 32)) throw nb::value_error("scores: expected fewer than 2^32 columns");
  const int64_t kk = k + 1 < n ? k + 1 : n;
  if (int64_t(top_s.shape(0)) != Q || int64_t(top_s.shape(1)) != kk || int64_t(top_i.shape(0)) != Q ||
      int64_t(top_i.shape(1)) != kk)
    throw nb::value_error(("top_s, top_i: expected torch.topk's [Q, min(k + 1, n)] = [" + std::to_string(Q) + ", " +
                           std::to_string(kk) + "] values and indices")
                              .c_str());
  if (int64_t(out_s.shape(0)) != Q || int64_t(out_s.shape(1)) != k || int64_t(out_i.shape(0)) != Q ||
      int64_t(out_i.shape(1)) != k)
    throw nb::value_error("scores_out, ids_out: expected [Q, k] arrays");
  const int dev = scores.device_id();
  same_device(cuda, dev, {{top_s.device_id(), "top_s"}, {top_i.device_id(), "top_i"},
                          {out_s.device_id(), "scores_out"}, {out_i.device_id(), "ids_out"}});
  TopnFinishProblem p{};
  p.scores = scores.data();
  p.ld = row_stride(scores, "scores");
  p.Q = Q;
  p.n = n;
  p.top_s = top_s.data();
  p.top_i = top_i.data();
  p.kk = kk;
  p.k = k;
  p.id_base = id_base;
  p.out_s = out_s.data();
  p.out_i = out_i.data();
  p.corpus_dtype = DType::F32;
  if (queries.has_value() != corpus.has_value())
    throw nb::value_error("queries, corpus: expected both (rescoring of NaN scores) or neither");
  if (queries) {
    const auto& c = *corpus;
    require_ndim(c, 2, "corpus", "[n, d]");
    require_device(c, Device::value, "corpus", DeviceArrays<Device>::memory);
    same_device(cuda, dev, {{queries->device_id(), "queries"}, {c.device_id(), "corpus"}});
    require_unit_inner_stride(c, "corpus");
    const int64_t d = int64_t(queries->shape(1));
    if (int64_t(queries->shape(0)) != Q || int64_t(c.shape(0)) != n || int64_t(c.shape(1)) != d)
      throw nb::value_error("queries, corpus: expected float32 [Q, d] queries and the chunk's [n, d] corpus rows");
    p.queries = queries->data();
    p.q_stride = row_stride(*queries, "queries");
    p.corpus = c.data();
    p.corpus_dtype = float_dtype(c, "corpus", uint16_is_bf16);
    p.c_stride = n > 1 ? int64_t(c.stride(0)) : d;
    p.d = d;
  }
  return p;
}

// A score tile of `terms` terms (scores [terms * Qt, >= R], scales
// [terms * Qt] or none for one term), checked.
template <class Device>
inline topn_select::TermTile term_tile(const typename RowArrays<Device>::Scores& scores, int terms,
                                       const std::optional<typename RowArrays<Device>::Scales>& scales, int64_t R) {
  if (terms < 1 || terms > 3) throw nb::value_error("terms: expected 1, 2 or 3");
  const int64_t rows = int64_t(scores.shape(0));
  if (rows % terms != 0) throw nb::value_error("scores: expected terms * Qt rows");
  if (R < 0 || R > int64_t(scores.shape(1))) throw nb::value_error("R: expected 0 <= R <= the scores' columns");
  topn_select::TermTile t{};
  t.s = scores.data();
  t.ld = row_stride(scores, "scores");
  t.Qt = rows / terms;
  t.terms = terms;
  if (terms > 1) {
    if (!scales || int64_t(scales->shape(0)) != rows)
      throw nb::value_error("scales: expected float32 [terms * Qt] with more than one term");
    same_device(DeviceArrays<Device>::cuda, scores.device_id(), scales->device_id(), "scales");
    t.scales = scales->data();
  }
  return t;
}

template <class Device>
struct Int8Arrays {
  using Codes = nb::ndarray<const int8_t, nb::ndim<2>, nb::c_contig, Device>;
  using Rows = nb::ndarray<const float, nb::ndim<2>, nb::c_contig, Device>;
  using QCodes = nb::ndarray<const int8_t, nb::ndim<3>, nb::c_contig, Device>;
  using Out = nb::ndarray<float, nb::ndim<2>, Device>;
};

// The int8 bounded scan's inputs, checked (common/problems.h; no outputs).
template <class Device>
inline TopnInt8Problem int8_inputs(const typename Int8Arrays<Device>::Codes& codes,
                                   const typename Int8Arrays<Device>::Rows& rows,
                                   const typename Int8Arrays<Device>::QCodes& qcodes,
                                   const typename Int8Arrays<Device>::Rows& qparams) {
  constexpr bool cuda = DeviceArrays<Device>::cuda;
  const int64_t N = int64_t(codes.shape(0)), W = int64_t(codes.shape(1)), Q = int64_t(qcodes.shape(0));
  if (W % 16 != 0 || W > topn_int8::kMaxWidth)
    throw nb::value_error(("codes: expected int8 [N, width] with width a multiple of 16 and at most 1032, got width " +
                           std::to_string(W)).c_str());
  if (int64_t(rows.shape(0)) != N || int64_t(rows.shape(1)) != topn_int8::kRowBounds)
    throw nb::value_error("rows: expected float32 [N, 3] (scale, norm, err) per code row");
  if (int64_t(qcodes.shape(1)) != 2 || int64_t(qcodes.shape(2)) != W)
    throw nb::value_error("qcodes: expected int8 [Q, 2, width]: two terms per query, the codes' width");
  if (int64_t(qparams.shape(0)) != Q || int64_t(qparams.shape(1)) != topn_int8::kQueryParams)
    throw nb::value_error("qparams: expected float32 [Q, 5] (scale, rho, nu, gamma * nu, eta)");
  // the scans read codes 16 bytes and query codes 4 bytes at a time (an
  // offset view of a larger array can start anywhere: issue 55, C3)
  if (reinterpret_cast<uintptr_t>(codes.data()) % 16 != 0)
    throw nb::value_error("codes: expected a 16-byte aligned start (an offset view? pass a copy)");
  if (reinterpret_cast<uintptr_t>(qcodes.data()) % 4 != 0)
    throw nb::value_error("qcodes: expected a 4-byte aligned start (an offset view? pass a copy)");
  same_device(cuda, codes.device_id(), {{rows.device_id(), "rows"}, {qcodes.device_id(), "qcodes"},
                                        {qparams.device_id(), "qparams"}});
  TopnInt8Problem p{};
  p.codes = codes.data();
  p.rows = rows.data();
  p.N = N;
  p.width = W;
  p.qcodes = qcodes.data();
  p.qparams = qparams.data();
  p.Q = Q;
  return p;
}

// ... with the intervals' outputs lo / hi [Q, N], checked.
template <class Device>
inline TopnInt8Problem int8_problem(const typename Int8Arrays<Device>::Codes& codes,
                                    const typename Int8Arrays<Device>::Rows& rows,
                                    const typename Int8Arrays<Device>::QCodes& qcodes,
                                    const typename Int8Arrays<Device>::Rows& qparams,
                                    const typename Int8Arrays<Device>::Out& lo,
                                    const typename Int8Arrays<Device>::Out& hi) {
  TopnInt8Problem p = int8_inputs<Device>(codes, rows, qcodes, qparams);
  for (const auto* o : {&lo, &hi}) {
    if (int64_t(o->shape(0)) != p.Q || int64_t(o->shape(1)) != p.N || (p.N > 1 && o->stride(1) != 1))
      throw nb::value_error("lo, hi: expected float32 [Q, N] outputs with contiguous rows");
  }
  if (p.Q > 1 && lo.stride(0) != hi.stride(0)) throw nb::value_error("lo, hi: expected the same row stride");
  same_device(DeviceArrays<Device>::cuda, codes.device_id(), {{lo.device_id(), "lo"}, {hi.device_id(), "hi"}});
  p.lo = lo.data();
  p.hi = hi.data();
  p.ld = p.Q > 1 ? int64_t(lo.stride(0)) : p.N;
  return p;
}

template <class Device>
struct Int8ScanArrays {
  using Bound = nb::ndarray<int32_t, nb::ndim<1>, nb::c_contig, Device>;  // topn_key bits, as int32
  using CandQ = nb::ndarray<int32_t, nb::ndim<1>, nb::c_contig, Device>;
  using CandJ = nb::ndarray<int64_t, nb::ndim<1>, nb::c_contig, Device>;
  using CandF = nb::ndarray<float, nb::ndim<1>, nb::c_contig, Device>;
  using Count = nb::ndarray<int64_t, nb::ndim<1>, nb::c_contig, Device>;  // [1], read as unsigned
};

// The int8 search's state of checked arguments (topn/topn_int8_scan.h).
template <class Device>
inline topn_int8::ScanState int8_scan_state(const typename Int8Arrays<Device>::Codes& codes,
                                            const typename Int8Arrays<Device>::Rows& rows,
                                            const typename Int8Arrays<Device>::QCodes& qcodes,
                                            const typename Int8Arrays<Device>::Rows& qparams, int64_t k,
                                            typename Int8ScanArrays<Device>::Bound bound,
                                            typename Int8ScanArrays<Device>::CandQ cand_q,
                                            typename Int8ScanArrays<Device>::CandJ cand_j,
                                            typename Int8ScanArrays<Device>::CandF cand_lo,
                                            typename Int8ScanArrays<Device>::CandF cand_hi,
                                            typename Int8ScanArrays<Device>::Count count) {
  const TopnInt8Problem p = int8_inputs<Device>(codes, rows, qcodes, qparams);
  if (k < 0 || k > topn_int8::kScanMaxK)
    throw nb::value_error(("k: expected 0 (no filter) <= k <= 1024, got " + std::to_string(k)).c_str());
  if (int64_t(bound.shape(0)) != p.Q) throw nb::value_error("bound: expected int32 [Q] (0: no bound yet)");
  const int64_t cap = int64_t(cand_q.shape(0));
  if (int64_t(cand_j.shape(0)) != cap || int64_t(cand_lo.shape(0)) != cap || int64_t(cand_hi.shape(0)) != cap)
    throw nb::value_error("cand_q, cand_j, cand_lo, cand_hi: expected [capacity] arrays of one capacity");
  if (int64_t(count.shape(0)) != 1) throw nb::value_error("count: expected int64 [1]");
  same_device(DeviceArrays<Device>::cuda, codes.device_id(),
              {{bound.device_id(), "bound"}, {cand_q.device_id(), "cand_q"}, {cand_j.device_id(), "cand_j"},
               {cand_lo.device_id(), "cand_lo"}, {cand_hi.device_id(), "cand_hi"}, {count.device_id(), "count"}});
  topn_int8::ScanState st{};
  st.codes = p.codes;
  st.rows = p.rows;
  st.qcodes = p.qcodes;
  st.qparams = p.qparams;
  st.N = p.N;
  st.width = p.width;
  st.Q = p.Q;
  st.k = int(k);
  st.bound = reinterpret_cast<unsigned int*>(bound.data());
  st.count = reinterpret_cast<unsigned long long*>(count.data());
  st.cap = cap;
  st.cand_q = cand_q.data();
  st.cand_j = cand_j.data();
  st.cand_lo = cand_lo.data();
  st.cand_hi = cand_hi.data();
  return st;
}

}  // namespace rcn_fast::bind
