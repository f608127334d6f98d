// Binding of the CPU top-n scan (topn/cpu/topn.h).
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "bindings/topn_rows.h"
#include "bindings/util.h"
#include "topn/cpu/topn.h"
#include "topn/cpu/topn_int8.h"
#include "topn/cpu/topn_int8_emulated.h"
#include "topn/cpu/topn_rows.h"
#include "topn/cpu/topn_select_emulated.h"

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

using Scores = nb::ndarray<const float, nb::ndim<2>, nb::c_contig, nb::device::cpu>;

// Test aid: the CUDA scan's selection on the host (topn/cpu/topn_select_emulated.h).
void topn_select_emulated_py(const Scores& scores, int64_t k, int64_t slice_rows, int round, int merge_round,
                             Arrays::TopnScores out_s, Arrays::TopnIds out_i) {
  const int64_t Q = int64_t(scores.shape(0)), N = int64_t(scores.shape(1));
  if (k < 1) throw nb::value_error("k: expected k >= 1");
  if (slice_rows < 1 || slice_rows > int64_t(0xFFFFFFFF) || round < 1 || merge_round < 1)
    throw nb::value_error("slice_rows, round, merge_round: expected positive sizes (slice_rows < 2^32)");
  if (int64_t(out_s.shape(0)) != Q || int64_t(out_s.shape(1)) != k || int64_t(out_i.shape(0)) != Q ||
      int64_t(out_i.shape(1)) != k)
    throw nb::value_error("scores_out, ids_out: expected [Q, k] arrays");
  nb::gil_scoped_release release;
  topn_select_emulated(scores.data(), Q, N, k, slice_rows, round, merge_round, out_s.data(), out_i.data());
}

// Test aid: the CUDA scan's query split on the host.
int topn_split_queries_py(const Scores& q, const std::string& corpus_dtype,
                          nb::ndarray<uint16_t, nb::ndim<3>, nb::c_contig, nb::device::cpu> terms,
                          nb::ndarray<float, nb::ndim<2>, nb::c_contig, nb::device::cpu> scales) {
  const int64_t Q = int64_t(q.shape(0)), d = int64_t(q.shape(1));
  DType ct;
  if (corpus_dtype == "float16")
    ct = DType::F16;
  else if (corpus_dtype == "bfloat16")
    ct = DType::BF16;
  else
    throw nb::value_error("corpus_dtype: expected 'float16' or 'bfloat16'");
  const int64_t T = ct == DType::F16 ? 2 : 3;
  if (int64_t(terms.shape(0)) != T || int64_t(terms.shape(1)) != Q || int64_t(terms.shape(2)) != d ||
      int64_t(scales.shape(0)) != T || int64_t(scales.shape(1)) != Q)
    throw nb::value_error("terms, scales: expected uint16 [T, Q, d] and float32 [T, Q] arrays");
  return topn_split_queries(q.data(), Q, d, d, ct, terms.data(), scales.data());
}

using Rows = bind::RowArrays<nb::device::cpu>;

void topn_finish_rows_py(const Rows::Scores& scores, const Rows::TopS& top_s, const Rows::TopI& top_i, int64_t k,
                         int64_t id_base, Arrays::TopnScores out_s, Arrays::TopnIds out_i,
                         const std::optional<Rows::Scores>& queries, const std::optional<AnyArray>& corpus,
                         int num_threads, bool uint16_is_bf16) {
  const TopnFinishProblem p = bind::finish_problem<nb::device::cpu>(scores, top_s, top_i, k, id_base, out_s, out_i,
                                                                      queries, corpus, uint16_is_bf16);
  nb::gil_scoped_release release;
  topn_finish_rows(p, num_threads);
}

// Test aid: the CUDA block select of a score tile on the host.
void topn_block_select_emulated_py(const Rows::Scores& scores, int terms, const std::optional<Rows::Scales>& scales,
                                   int64_t R, int64_t k, int64_t row0, int64_t slices, int round, int merge_round,
                                   Arrays::TopnScores out_s, Arrays::TopnIds out_i) {
  const topn_select::TermTile t = bind::term_tile<nb::device::cpu>(scores, terms, scales, R);
  if (k < 1 || k > 1024) throw nb::value_error("k: expected 1 <= k <= 1024");
  if (slices < 1 || round < 1 || merge_round < 1)
    throw nb::value_error("slices, round, merge_round: expected positive sizes");
  if (topn_select::slice_cols(R, slices) >= (int64_t(1) << 32))
    throw nb::value_error("slices: a slice must have fewer than 2^32 columns");
  if (int64_t(out_s.shape(0)) != t.Qt || int64_t(out_s.shape(1)) != k || int64_t(out_i.shape(0)) != t.Qt ||
      int64_t(out_i.shape(1)) != k)
    throw nb::value_error("scores_out, ids_out: expected [Qt, k] arrays");
  nb::gil_scoped_release release;
  topn_block_select_emulated(t, R, k, row0, slices, round, merge_round, out_s.data(), out_i.data());
}

// Test aid: one chunk of the CUDA tiled kernel (v1) on the host.
void topn_tiled_merge_emulated_py(const Arrays::TopnScores& prev_s, const Arrays::TopnIds& prev_i,
                                  const Scores& chunk, int64_t row0, Arrays::TopnScores next_s,
                                  Arrays::TopnIds next_i) {
  const int64_t Q = int64_t(prev_s.shape(0)), k = int64_t(prev_s.shape(1)), rows = int64_t(chunk.shape(1));
  if (k < 1 || k > 1024) throw nb::value_error("prev_s: expected [Q, k] with 1 <= k <= 1024");
  for (const int64_t* shape : {prev_i.shape_ptr(), next_s.shape_ptr(), next_i.shape_ptr()})
    if (shape[0] != Q || shape[1] != k) throw nb::value_error("prev_i, next_s, next_i: expected [Q, k] like prev_s");
  if (int64_t(chunk.shape(0)) != Q) throw nb::value_error("chunk: expected [Q, rows] scores");
  nb::gil_scoped_release release;
  topn_tiled_merge_emulated(prev_s.data(), prev_i.data(), chunk.data(), Q, k, rows, row0, next_s.data(),
                            next_i.data());
}

using I8 = bind::Int8Arrays<nb::device::cpu>;

// The int8 scan's variant named `isa` ("" the one in use), or a ValueError.
const Int8Isa& int8_isa(const std::string& isa) {
  const Int8Isa* v = int8_isa_named(isa);
  if (v == nullptr)
    throw nb::value_error(("isa: '" + isa + "' is not compiled in or not supported by this CPU (compiled: " +
                           int8_isa_compiled() + ")").c_str());
  return *v;
}

void topn_int8_intervals_py(const I8::Codes& codes, const I8::Rows& rows, const I8::QCodes& qcodes,
                            const I8::Rows& qparams, I8::Out lo, I8::Out hi, int num_threads,
                            const std::string& isa) {
  const TopnInt8Problem p = bind::int8_problem<nb::device::cpu>(codes, rows, qcodes, qparams, lo, hi);
  const Int8Isa& v = int8_isa(isa);
  nb::gil_scoped_release release;
  topn_int8_intervals(p, num_threads, v);
}

using Ids = nb::ndarray<nb::numpy, int64_t, nb::ndim<1>>;

// A numpy array owning a copy of `v`.
Ids owned(const std::vector<int64_t>& v) {
  int64_t* data = new int64_t[v.empty() ? 1 : v.size()];
  std::copy(v.begin(), v.end(), data);
  nb::capsule owner(data, [](void* ptr) noexcept { delete[] static_cast<int64_t*>(ptr); });
  return Ids(data, {v.size()}, owner);
}

nb::tuple topn_int8_candidates_py(const I8::Codes& codes, const I8::Rows& rows, const I8::QCodes& qcodes,
                                  const I8::Rows& qparams, int64_t k, int num_threads, const std::string& isa) {
  const TopnInt8Problem p = bind::int8_inputs<nb::device::cpu>(codes, rows, qcodes, qparams);
  if (k < 1) throw nb::value_error("k: expected k >= 1");
  const Int8Isa& v = int8_isa(isa);
  Int8Candidates c;
  {
    nb::gil_scoped_release release;
    c = topn_int8_candidates(p, k, num_threads, v);
  }
  return nb::make_tuple(owned(c.counts), owned(c.ids));
}

using Scan = bind::Int8ScanArrays<nb::device::cpu>;

// Test aid: the CUDA int8 search on the host (topn/cpu/topn_int8_emulated.h).
void topn_int8_scan_emulated_py(const I8::Codes& codes, const I8::Rows& rows, const I8::QCodes& qcodes,
                                const I8::Rows& qparams, int64_t k, Scan::Bound bound, Scan::CandQ cand_q,
                                Scan::CandJ cand_j, Scan::CandF cand_lo, Scan::CandF cand_hi, Scan::Count count,
                                int64_t sms) {
  const topn_int8::ScanState st =
      bind::int8_scan_state<nb::device::cpu>(codes, rows, qcodes, qparams, k, bound, cand_q, cand_j, cand_lo, cand_hi,
                                             count);
  if (sms < 1) throw nb::value_error("sms: expected a positive multiprocessor count");
  nb::gil_scoped_release release;
  topn_int8_scan_emulated(st, sms);
}

}  // namespace

void bind_topn(nb::module_& m) {
  m.def("topn_int8_intervals", &topn_int8_intervals_py, nb::arg("codes"), nb::arg("rows"), nb::arg("qcodes"),
        nb::arg("qparams"), nb::arg("lo"), nb::arg("hi"), nb::arg("num_threads") = 0, nb::arg("isa") = "",
        "The int8 bounded scan (csrc/topn/topn_int8.h): lo / hi [Q, N] that hold every (query, row) float32 score.\n"
        "isa: '' (the variant in use), 'generic', 'avx2', 'avx512vnni', 'avxvnni' (ValueError where not supported).");
  m.def("topn_int8_candidates", &topn_int8_candidates_py, nb::arg("codes"), nb::arg("rows"), nb::arg("qcodes"),
        nb::arg("qparams"), nb::arg("k"), nb::arg("num_threads") = 0, nb::arg("isa") = "",
        "The bounded scan's candidates of an exact top-k: (counts [Q], ids [sum(counts)] int64), for each query\n"
        "the rows with hi >= the k-th largest lo of the query (all rows when fewer than k), ascending; filtered\n"
        "while the scan runs (csrc/topn/cpu/topn_int8.h), no [Q, N] intervals written.");
  m.def("topn_int8_scan_emulated", &topn_int8_scan_emulated_py, nb::arg("codes"), nb::arg("rows"),
        nb::arg("qcodes"), nb::arg("qparams"), nb::arg("k"), nb::arg("bound"), nb::arg("cand_q"), nb::arg("cand_j"),
        nb::arg("cand_lo"), nb::arg("cand_hi"), nb::arg("count"), nb::arg("sms") = 132,
        "Test aid: rcn_fast._cuda.topn_int8_scan on the host (its blocks, lanes and tile logic; the mma\n"
        "fragments by the PTX ISA's layout), as a GPU with `sms` multiprocessors would run it.");
  m.def("topn_int8_isa", [](const std::string& name) -> nb::object {
          const Int8Isa* v = int8_isa_named(name);
          if (v == nullptr) return nb::none();
          return nb::str(v->name);
        }, nb::arg("name") = "",
        "The int8 scan's variant: '' the one in use; a name where it is compiled in and runs here; else None.");
  m.def("topn_finish_rows", &topn_finish_rows_py, nb::arg("scores"), nb::arg("top_s"), nb::arg("top_i"),
        nb::arg("k"), nb::arg("id_base"), nb::arg("scores_out"), nb::arg("ids_out"),
        nb::arg("queries").none() = nb::none(), nb::arg("corpus").none() = nb::none(), nb::arg("num_threads") = 0,
        nb::arg("uint16_is_bf16") = false,
        "The torch backend's finishing of a chunk: from scores [Q, n] and torch.topk's k + 1 best of each row,\n"
        "the exact top-k (score desc, id asc; NaN and -inf never returned) into [Q, k] outputs (ids + id_base).\n"
        "With queries (float32 [Q, d]) and corpus (the chunk's [n, d] rows), NaN scores are recomputed in float32.");
  m.def("topn_block_select_emulated", &topn_block_select_emulated_py, nb::arg("scores"), nb::arg("terms"),
        nb::arg("scales").none(), nb::arg("R"), nb::arg("k"), nb::arg("row0"), nb::arg("slices"), nb::arg("round"),
        nb::arg("merge_round"), nb::arg("scores_out"), nb::arg("ids_out"),
        "Test aid: the CUDA block select of a score tile [terms * Qt, >= R] and the merge of its slices, on the host.");
  m.def("topn_select_emulated", &topn_select_emulated_py, nb::arg("scores"), nb::arg("k"), nb::arg("slice_rows"),
        nb::arg("round"), nb::arg("merge_round"), nb::arg("scores_out"), nb::arg("ids_out"),
        "Test aid: the CUDA top-n scan's selection (topn/topn_select.h) over scores [Q, N] on the host.");
  m.def("topn_tiled_merge_emulated", &topn_tiled_merge_emulated_py, nb::arg("prev_s"), nb::arg("prev_i"),
        nb::arg("chunk"), nb::arg("row0"), nb::arg("next_s"), nb::arg("next_i"),
        "Test aid: one chunk of the CUDA tiled kernel (radix select on topn_key) merged into running lists, on the host.");
  m.def("topn_split_queries", &topn_split_queries_py, nb::arg("queries"), nb::arg("corpus_dtype"), nb::arg("terms"),
        nb::arg("scales"),
        "Test aid: the CUDA top-n scan's split of float32 queries into terms of the corpus dtype.");
  m.def("topn", &topn, nb::arg("queries"), nb::arg("corpus"), nb::arg("k"),
        nb::arg("scores_out"), nb::arg("ids_out"), nb::arg("num_threads") = 0,
        nb::arg("uint16_is_bf16") = false,
        "Exact top-k inner product search into preallocated outputs.");
}
