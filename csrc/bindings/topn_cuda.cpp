// Binding of the CUDA top-n scan (topn/cuda/topn.h). Inputs are CUDA arrays
// (torch tensors via DLPack) on one device; the work is enqueued on the
// caller's stream.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include "bindings/topn_rows.h"
#include "bindings/util.h"
#include "topn/cuda/topn.h"
#include "topn/cuda/topn_block_select.h"
#include "topn/cuda/topn_int8.h"
#include "topn/cuda/topn_mma.h"

namespace nb = nanobind;
using namespace rcn_fast;
using bind::AnyArray;
using Arrays = bind::DeviceArrays<nb::device::cuda>;

namespace {

void topn(const AnyArray& queries, const AnyArray& corpus, int64_t k, Arrays::TopnScores scores_out,
          Arrays::TopnIds ids_out, uintptr_t stream, int algorithm) {
  if (algorithm < 0 || algorithm > 2)
    throw nb::value_error("algorithm: expected 0 (auto), 1 (tiled) or 2 (tensor-core scan)");
  bind::run_topn<nb::device::cuda>(
      queries, corpus, k, scores_out, ids_out, /*uint16_is_bf16=*/false, cuda::kTopnMaxK,
      [&](const TopnProblem& p) {
        cuda::topn_cuda(p, reinterpret_cast<cudaStream_t>(stream), cuda::TopnAlgorithm(algorithm));
      });
}

using Rows = bind::RowArrays<nb::device::cuda>;

cudaStream_t as_stream(uintptr_t s) { return reinterpret_cast<cudaStream_t>(s); }

void finish_rows(const Rows::Scores& scores, const Rows::TopS& top_s, const Rows::TopI& top_i, int64_t k,
                 int64_t id_base, Arrays::TopnScores out_s, Arrays::TopnIds out_i,
                 const std::optional<Rows::Scores>& queries, const std::optional<AnyArray>& corpus, uintptr_t stream) {
  const TopnFinishProblem p = bind::finish_problem<nb::device::cuda>(scores, top_s, top_i, k, id_base, out_s, out_i,
                                                                       queries, corpus, false);
  nb::gil_scoped_release release;
  cuda::topn_finish_rows_cuda(p, as_stream(stream));
}

void block_select(const Rows::Scores& scores, int terms, const std::optional<Rows::Scales>& scales, int64_t R,
                  int64_t k, int64_t row0, int64_t slices, Rows::Parts part_s, Rows::PartIds part_i, int64_t slot0,
                  uintptr_t stream) {
  const topn_select::TermTile t = bind::term_tile<nb::device::cuda>(scores, terms, scales, R);
  if (k < 1 || k > cuda::kTopnMaxK) throw nb::value_error("k: expected 1 <= k <= 1024");
  if (slices < 1 || slot0 < 0 || slot0 + slices > int64_t(part_s.shape(0)) || int64_t(part_s.shape(1)) != t.Qt ||
      int64_t(part_s.shape(2)) != k || part_i.shape(0) != part_s.shape(0) || part_i.shape(1) != part_s.shape(1) ||
      part_i.shape(2) != part_s.shape(2))
    throw nb::value_error("part_s, part_i: expected [S, Qt, k] lists with slots slot0 .. slot0 + slices - 1");
  bind::same_device(true, scores.device_id(), part_s.device_id(), "part_s");
  bind::same_device(true, scores.device_id(), part_i.device_id(), "part_i");
  nb::gil_scoped_release release;
  cuda::topn_block_select_cuda(t, R, k, row0, slices, part_s.data(), part_i.data(), slot0, as_stream(stream));
}

void merge_lists(const Rows::Parts& part_s, const Rows::PartIds& part_i, Arrays::TopnScores out_s,
                 Arrays::TopnIds out_i, uintptr_t stream) {
  const int64_t S = int64_t(part_s.shape(0)), Q = int64_t(part_s.shape(1)), k = int64_t(part_s.shape(2));
  if (part_i.shape(0) != part_s.shape(0) || part_i.shape(1) != part_s.shape(1) || part_i.shape(2) != part_s.shape(2) ||
      int64_t(out_s.shape(0)) != Q || int64_t(out_s.shape(1)) != k || int64_t(out_i.shape(0)) != Q ||
      int64_t(out_i.shape(1)) != k)
    throw nb::value_error("part_s, part_i, scores_out, ids_out: expected [S, Q, k] lists and [Q, k] outputs");
  if (k < 1 || k > cuda::kTopnMaxK) throw nb::value_error("k: expected 1 <= k <= 1024");
  nb::gil_scoped_release release;
  cuda::topn_merge_lists_cuda(part_s.data(), part_i.data(), S, Q, k, out_s.data(), out_i.data(), as_stream(stream));
}

void split_queries(const Rows::Scores& queries, nb::ndarray<nb::ndim<2>, nb::device::cuda> terms,
                   nb::ndarray<float, nb::c_contig, nb::device::cuda> scales, uintptr_t stream) {
  const nb::dlpack::dtype td = terms.dtype();
  const bool f16 = td.code == uint8_t(nb::dlpack::dtype_code::Float);
  const bool bf16 = td.code == uint8_t(nb::dlpack::dtype_code::Bfloat);
  if (td.bits != 16 || td.lanes != 1 || !(f16 || bf16))
    throw nb::type_error("terms: expected float16 or bfloat16 (the corpus dtype)");
  const DType ct = f16 ? DType::F16 : DType::BF16;
  const int64_t Q = int64_t(queries.shape(0)), d = int64_t(queries.shape(1));
  const int64_t T = ct == DType::F16 ? 2 : 3;
  if (int64_t(terms.shape(0)) != T * Q || int64_t(terms.shape(1)) != d ||
      (terms.shape(0) > 1 && terms.stride(0) != int64_t(d)) || (d > 1 && terms.stride(1) != 1) ||
      int64_t(scales.size()) != T * Q)
    throw nb::value_error("terms, scales: expected contiguous [T * Q, d] terms (T = 2 float16, 3 bfloat16) and "
                          "T * Q float32 scales");
  bind::same_device(true, queries.device_id(), terms.device_id(), "terms");
  bind::same_device(true, queries.device_id(), scales.device_id(), "scales");
  const int64_t qs = bind::row_stride(queries, "queries");
  nb::gil_scoped_release release;
  cuda::topn_split_queries_cuda(queries.data(), DType::F32, qs, Q, int(d), int(d), ct,
                                static_cast<uint16_t*>(terms.data()), scales.data(),
                                as_stream(stream));
}

using I8 = bind::Int8Arrays<nb::device::cuda>;
using Scan = bind::Int8ScanArrays<nb::device::cuda>;

void int8_scan(const I8::Codes& codes, const I8::Rows& rows, const I8::QCodes& qcodes, const I8::Rows& qparams,
               int64_t k, Scan::Bound bound, Scan::CandQ cand_q, Scan::CandJ cand_j, Scan::CandF cand_lo,
               Scan::CandF cand_hi, Scan::Count count, uintptr_t stream) {
  const topn_int8::ScanState st = bind::int8_scan_state<nb::device::cuda>(codes, rows, qcodes, qparams, k, bound,
                                                                           cand_q, cand_j, cand_lo, cand_hi, count);
  nb::gil_scoped_release release;
  cuda::topn_int8_scan_cuda(st, as_stream(stream));
}

}  // namespace

void bind_topn_cuda(nb::module_& m) {
  m.def("topn_int8_scan", &int8_scan, nb::arg("codes"), nb::arg("rows"), nb::arg("qcodes"), nb::arg("qparams"),
        nb::arg("k"), nb::arg("bound"), nb::arg("cand_q"), nb::arg("cand_j"), nb::arg("cand_lo"), nb::arg("cand_hi"),
        nb::arg("count"), nb::arg("stream") = 0,
        "The int8 bounded scan's search (csrc/topn/topn_int8_scan.h), enqueued on `stream`: every (query, row)\n"
        "pair whose hi reaches the query's running bound (bound [Q], int32 bits of an order-preserving key, 0:\n"
        "none; raised in place) is written to cand_* [capacity] at a slot of the atomic count [1] (which counts\n"
        "past the capacity: scan again with a larger buffer). k = 0: every pair (the intervals).");
  m.def("topn_finish_rows", &finish_rows, nb::arg("scores"), nb::arg("top_s"), nb::arg("top_i"), nb::arg("k"),
        nb::arg("id_base"), nb::arg("scores_out"), nb::arg("ids_out"), nb::arg("queries").none() = nb::none(),
        nb::arg("corpus").none() = nb::none(), nb::arg("stream") = 0,
        "The torch backend's finishing of a chunk on the device (no host synchronisation): see rcn_fast._C.");
  m.def("topn_block_select", &block_select, nb::arg("scores"), nb::arg("terms"), nb::arg("scales").none(),
        nb::arg("R"), nb::arg("k"), nb::arg("row0"), nb::arg("slices"), nb::arg("part_s"), nb::arg("part_i"),
        nb::arg("slot0"), nb::arg("stream") = 0,
        "The block select of a float32 score tile [terms * Qt, >= R] (the GEMM of the queries' terms and corpus\n"
        "rows row0 .. row0 + R - 1): the k best of each of `slices` slices of each row into part_s / part_i\n"
        "[S, Qt, k] at slots slot0 .. slot0 + slices - 1.");
  m.def("topn_merge_lists", &merge_lists, nb::arg("part_s"), nb::arg("part_i"), nb::arg("scores_out"),
        nb::arg("ids_out"), nb::arg("stream") = 0, "The k best of each query's S lists [S, Q, k] into [Q, k].");
  m.def("topn_split_queries", &split_queries, nb::arg("queries"), nb::arg("terms"), nb::arg("scales"),
        nb::arg("stream") = 0,
        "float32 queries [Q, d] as terms [T * Q, d] of the terms' dtype (term-major) and their scales [T * Q].");
  m.attr("TOPN_BLOCK_SELECT_ROUND") = cuda::kBlockSelectRound;
  m.attr("TOPN_MAX_K") = cuda::kTopnMaxK;
  m.attr("TOPN_MMA_MAX_K") = cuda::kTopnMmaMaxK;
  m.def("topn", &topn, nb::arg("queries"), nb::arg("corpus"), nb::arg("k"), nb::arg("scores_out"),
        nb::arg("ids_out"), nb::arg("stream") = 0, nb::arg("algorithm") = 0,
        "Exact top-k inner product search on CUDA into preallocated outputs.\n"
        "algorithm: 0 the tensor-core scan where it can serve the call, else the tiled kernel;\n"
        "1 the tiled kernel; 2 the tensor-core scan (k <= TOPN_MMA_MAX_K; ValueError where it cannot serve).\n"
        "The scan splits a float32 query into terms of a float16/bfloat16 corpus dtype; a corpus value of\n"
        "+-inf times a zero term scores NaN there (never returned) where a float32 product is +-inf.");
}
