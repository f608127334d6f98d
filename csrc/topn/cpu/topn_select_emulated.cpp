#include "topn/cpu/topn_select_emulated.h"

#include <algorithm>
#include <vector>

#include "topn/cpu/serial_group.h"
#include "topn/topn_block_select.h"
#include "topn/topn_select.h"

namespace rcn_fast {
namespace {

namespace ts = topn_select;

}  // namespace

void topn_select_emulated(const float* scores, int64_t Q, int64_t N, int64_t k, int64_t slice_rows, int round,
                          int merge_round, float* out_s, int64_t* out_i) {
  const SerialGroup g;
  const int64_t S = N == 0 ? 1 : (N + slice_rows - 1) / slice_rows;
  std::vector<float> part_s(size_t(S * Q * k));
  std::vector<int64_t> part_i(size_t(S * Q * k));
  const ts::Layout L = ts::layout(int(k), round);
  std::vector<float> s(size_t(L.slots));
  std::vector<uint32_t> id(size_t(L.slots));
  for (int64_t si = 0; si < S; ++si) {
    const int64_t r0 = si * slice_rows, r1 = std::min(N, r0 + slice_rows);
    for (int64_t q = 0; q < Q; ++q) {
      ts::Run<uint32_t> run;
      ts::init(run);
      for (int64_t rb = r0; rb < r1; rb += round) {
        for (int64_t r = rb; r < std::min(r1, rb + round); ++r)
          ts::offer(g, run, s.data(), id.data(), L, scores[q * N + r], uint32_t(r - r0));
        if (ts::needs_flush(run, L)) ts::flush(g, run, s.data(), id.data(), L);
      }
      const size_t at = size_t((si * Q + q) * k);
      ts::finish(g, run, s.data(), id.data(), L, part_s.data() + at, part_i.data() + at, r0);
    }
  }
  const ts::Layout M = ts::layout(int(k), merge_round);
  std::vector<float> ms(size_t(M.slots));
  std::vector<int64_t> mi(size_t(M.slots));
  for (int64_t q = 0; q < Q; ++q) {
    ts::Run<int64_t> run;
    ts::merge_lists(g, run, ms.data(), mi.data(), M, part_s.data(), part_i.data(), S, Q, q, out_s + q * k,
                    out_i + q * k);
  }
}

int topn_split_queries(const float* q, int64_t Q, int64_t d, int64_t q_stride, DType corpus, uint16_t* terms,
                       float* scales) {
  const ts::SplitSpec sp = ts::split_spec(corpus, DType::F32);
  for (int64_t r = 0; r < Q; ++r) {
    const float* row = q + r * q_stride;
    float maxabs = 0.f;
    for (int64_t e = 0; e < d; ++e) maxabs = std::max(maxabs, ts::finite_magnitude(row[e]));
    const float scale = ts::split_row_scale(maxabs);
    for (int64_t e = 0; e < d; ++e) {
      uint16_t* out = terms + r * d + e;
      if (corpus == DType::F16)
        ts::split_value<DType::F16>(row[e] / scale, sp, out, Q * d);
      else
        ts::split_value<DType::BF16>(row[e] / scale, sp, out, Q * d);
    }
    for (int t = 0; t < sp.terms; ++t) scales[t * Q + r] = scale * ts::pow2f(-sp.shift * t);
  }
  return sp.terms;
}

void topn_block_select_emulated(const topn_select::TermTile& tile, int64_t R, int64_t k, int64_t row0,
                                int64_t slices, int round, int merge_round, float* out_s, int64_t* out_i) {
  const SerialGroup g;
  const int64_t S = slices < 1 ? 1 : slices, Qt = tile.Qt, width = ts::slice_cols(R, S);
  std::vector<float> part_s(size_t(S * Qt * k));
  std::vector<int64_t> part_i(size_t(S * Qt * k));
  const ts::Layout L = ts::layout(int(k), round);
  std::vector<float> s(size_t(L.slots));
  std::vector<uint32_t> id(size_t(L.slots));
  for (int64_t si = 0; si < S; ++si) {  // the block select kernel: block (slice si, query q)
    const int64_t c0 = std::min(R, si * width), c1 = std::min(R, c0 + width);
    for (int64_t q = 0; q < Qt; ++q) {
      ts::Run<uint32_t> run;
      ts::init(run);
      ts::select_row(g, run, s.data(), id.data(), L, c1 - c0, ts::term_row(tile, q, c0), ts::SliceId{});
      const size_t at = size_t((si * Qt + q) * k);
      ts::finish(g, run, s.data(), id.data(), L, part_s.data() + at, part_i.data() + at, row0 + c0);
    }
  }
  const ts::Layout M = ts::layout(int(k), merge_round);  // the merge kernel: block q
  std::vector<float> ms(size_t(M.slots));
  std::vector<int64_t> mi(size_t(M.slots));
  for (int64_t q = 0; q < Qt; ++q) {
    ts::Run<int64_t> run;
    ts::merge_lists(g, run, ms.data(), mi.data(), M, part_s.data(), part_i.data(), S, Qt, q, out_s + q * k,
                    out_i + q * k);
  }
}

}  // namespace rcn_fast
