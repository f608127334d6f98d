#include "topn/cpu/topn_select_emulated.h"

#include <algorithm>
#include <vector>

#include "topn/cpu/serial_group.h"
#include "topn/topn_block_select.h"
#include "topn/topn_order.h"
#include "topn/topn_select.h"

namespace rcn_fast {
namespace {

namespace ts = topn_select;

// Each slice [si * width, ...) of each of Q rows of R columns selected in
// rounds of `round` (select_row with one lane) into part [S, Q, k], ids +
// row0 + the slice's start; row_at(q, c0) gives query q's scores from
// column c0 on.
template <class RowAt>
void select_slices(int64_t Q, int64_t R, int64_t S, int64_t width, int64_t k, int round, int64_t row0,
                   const RowAt& row_at, std::vector<float>& part_s, std::vector<int64_t>& part_i) {
  const SerialGroup g;
  part_s.assign(size_t(S * Q * k), 0.f);
  part_i.assign(size_t(S * Q * k), 0);
  const ts::Layout L = ts::layout(int(k), round);
  std::vector<float> s(size_t(L.slots));
  std::vector<uint32_t> id(size_t(L.slots));
  for (int64_t si = 0; si < S; ++si) {
    const int64_t c0 = std::min(R, si * width), c1 = std::min(R, c0 + width);
    for (int64_t q = 0; q < Q; ++q) {
      ts::Run<uint32_t> run;
      ts::init(run);
      ts::select_row(g, run, s.data(), id.data(), L, c1 - c0, row_at(q, c0), ts::SliceId{});
      const size_t at = size_t((si * Q + q) * k);
      ts::finish(g, run, s.data(), id.data(), L, part_s.data() + at, part_i.data() + at, row0 + c0);
    }
  }
}

// The merge kernel: block q merges its S lists in rounds of `merge_round`.
void merge_all(int64_t Q, int64_t S, int64_t k, int merge_round, const std::vector<float>& part_s,
               const std::vector<int64_t>& part_i, float* out_s, int64_t* out_i) {
  const SerialGroup g;
  const ts::Layout M = ts::layout(int(k), merge_round);
  std::vector<float> ms(size_t(M.slots));
  std::vector<int64_t> mi(size_t(M.slots));
  for (int64_t q = 0; q < Q; ++q) {
    ts::Run<int64_t> run;
    ts::merge_lists(g, run, ms.data(), mi.data(), M, part_s.data(), part_i.data(), S, Q, q, out_s + q * k,
                    out_i + q * k);
  }
}

// A row of a [Q, N] score matrix from column c0 on.
struct MatrixRow {
  const float* row;
  float operator()(int64_t i) const { return row[i]; }
};

}  // namespace

void topn_select_emulated(const float* scores, int64_t Q, int64_t N, int64_t k, int64_t slice_rows, int round,
                          int merge_round, float* out_s, int64_t* out_i) {
  const int64_t S = N == 0 ? 1 : (N + slice_rows - 1) / slice_rows;
  std::vector<float> part_s;
  std::vector<int64_t> part_i;
  select_slices(Q, N, S, slice_rows, k, round, 0,
                [&](int64_t q, int64_t c0) { return MatrixRow{scores + q * N + c0}; }, part_s, part_i);
  merge_all(Q, S, k, merge_round, part_s, part_i, out_s, out_i);
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
  const int64_t S = slices < 1 ? 1 : slices;
  std::vector<float> part_s;
  std::vector<int64_t> part_i;
  const int64_t width = ts::slice_cols(R, S);
  switch (tile.terms) {  // the kernel's instantiations (block_select_kernel<TERMS>)
    case 1:
      select_slices(tile.Qt, R, S, width, k, round, row0,
                    [&](int64_t q, int64_t c0) { return ts::term_row<1>(tile, q, c0); }, part_s, part_i);
      break;
    case 2:
      select_slices(tile.Qt, R, S, width, k, round, row0,
                    [&](int64_t q, int64_t c0) { return ts::term_row<2>(tile, q, c0); }, part_s, part_i);
      break;
    default:
      select_slices(tile.Qt, R, S, width, k, round, row0,
                    [&](int64_t q, int64_t c0) { return ts::term_row<3>(tile, q, c0); }, part_s, part_i);
  }
  merge_all(tile.Qt, S, k, merge_round, part_s, part_i, out_s, out_i);
}

void topn_tiled_merge_emulated(const float* prev_s, const int64_t* prev_i, const float* chunk, int64_t Q, int64_t k,
                               int64_t rows, int64_t row0, float* next_s, int64_t* next_i) {
  const int64_t n = k + rows;
  std::vector<float> keep_s(size_t(ts::next_pow2(int(k))));
  std::vector<int64_t> keep_i(keep_s.size());
  unsigned int hist[256];
  for (int64_t q = 0; q < Q; ++q) {
    // candidate i: the running list first, then the chunk in row order
    auto score = [&](int64_t i) { return i < k ? prev_s[q * k + i] : chunk[q * rows + (i - k)]; };
    auto id = [&](int64_t i) { return i < k ? prev_i[q * k + i] : row0 + (i - k); };
    int64_t taken = 0;
    for (int64_t i = 0; i < n; ++i) taken += topn_key(score(i)) != 0u;
    const int64_t target = std::min(k, taken);
    unsigned int prefix = 0u, need = unsigned(target);
    for (int shift = 24; shift >= 0 && target > 0; shift -= 8) {
      std::fill(hist, hist + 256, 0u);
      for (int64_t i = 0; i < n; ++i) {
        const uint32_t key = topn_key(score(i));
        if (topn_radix_match(key, prefix, shift)) ++hist[(key >> shift) & 255u];
      }
      topn_radix_pick(hist, shift, prefix, need);
    }
    int64_t slot = 0;
    if (target > 0) {
      for (int64_t i = 0; i < n; ++i) {
        const uint32_t key = topn_key(score(i));
        if (key != 0u && key > prefix) {
          keep_s[size_t(slot)] = score(i);
          keep_i[size_t(slot++)] = id(i);
        }
      }
      unsigned int ties = 0;
      for (int64_t i = 0; i < n && ties < need; ++i)
        if (topn_key(score(i)) == prefix) {
          keep_s[size_t(slot)] = score(i);
          keep_i[size_t(slot++)] = id(i);
          ++ties;
        }
    }
    const int width = ts::next_pow2(int(k));
    for (int64_t i = target; i < width; ++i) {
      keep_s[size_t(i)] = -bits_to_float(0x7f800000u);
      keep_i[size_t(i)] = -1;
    }
    ts::bitonic_sort(SerialGroup{}, keep_s.data(), keep_i.data(), width);
    for (int64_t i = 0; i < k; ++i) {
      next_s[q * k + i] = i < target ? keep_s[size_t(i)] : -bits_to_float(0x7f800000u);
      next_i[q * k + i] = i < target ? keep_i[size_t(i)] : -1;
    }
  }
}

}  // namespace rcn_fast
