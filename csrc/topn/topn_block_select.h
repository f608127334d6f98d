// One-pass selections over score rows that are already in memory, written
// once for a group of cooperating lanes (a CUDA block, or one host thread:
// topn/cpu/topn_rows.cpp runs the same code on the CPU and to test it).
// They use the running selection of topn/topn_select.h (threshold, buffer,
// bitonic flushes) and its ordering rules (topn/topn_order.h):
//
// * select_row: the k best of a row of n candidates, offered in rounds of
//   L.round (lane r offers candidates rb + r, rb + r + size, ...: adjacent
//   lanes read adjacent scores), flushing between rounds where needed. The
//   block select of the GEMM tiles (topn/cuda/topn_block_select.cu) runs it
//   over a slice of a [Q, rows] float32 score tile; the merge of the
//   slices' lists runs it over [S, k] candidates per query.
// * finish_row: the exact top-k of one row of a chunk's scores from
//   torch.topk's k + 1 best (the torch backend, rcn_fast/search/
//   torch_backend.py): the list as it is, sorted by (score desc, id asc)
//   where equal scores sit in it; the whole row selected again only where
//   topk's answer can be wrong (a NaN among the k + 1, or a tie across the
//   k-th place). No host decision: the torch backend never synchronises.
//
// A group provides rank(), size(), sync(), claim(&counter) (topn_select.h)
// and any(bool): whether the argument is true on some lane, on every lane.
#pragma once
#include <cstdint>

#include "common/dtypes.h"
#include "common/macros.h"
#include "topn/topn_order.h"
#include "topn/topn_rn.h"
#include "topn/topn_select.h"

namespace rcn_fast::topn_select {

// The k best of candidates [0, n) into `run` (not finished: the caller
// calls finish). score_at(i) and id_at(i) give candidate i. Collective.
template <class G, class Id, class ScoreAt, class IdAt>
RCN_HD void select_row(const G& g, Run<Id>& run, float* s, Id* id, const Layout& L, int64_t n,
                       const ScoreAt& score_at, const IdAt& id_at) {
  for (int64_t rb = 0; rb < n; rb += L.round) {
    const int64_t re = rb + L.round < n ? rb + L.round : n;
    for (int64_t i = rb + g.rank(); i < re; i += g.size()) offer(g, run, s, id, L, score_at(i), id_at(i));
    g.sync();
    const bool full = needs_flush(run, L);
    g.sync();  // every lane decided before a flush moves nbuf
    if (full) flush(g, run, s, id, L);
  }
}

// A score tile of T terms [T, Qt, ld] (term-major, as the GEMM of a split
// query writes it: rhs rows t * Qt + q) and their scales [T, Qt]: the score
// of (query q, column j) is sum_t scale_t * s_t, summed smallest term first
// (T = 1: the score as it is, no scale). Each product is rounded, then
// each sum: the torch backend's s.mul_(scales) and add_ sequence.
struct TermTile {
  const float* s;
  int64_t ld;        // elements between tile rows
  int64_t Qt;        // query rows of the tile
  int terms;         // T, 1..3
  const float* scales;  // [T, Qt]; null when T == 1
};

// Query q's row of a tile of TERMS terms from column col0 on: TERMS is a
// template parameter, so the rows and scales live in registers (a run-time
// count indexed them in local memory: issue 55, S3).
template <int TERMS>
struct TermRow {
  static_assert(TERMS >= 1 && TERMS <= 3, "1 to 3 terms");
  const float* row[TERMS];
  float scale[TERMS];
  RCN_HD_METHOD float operator()(int64_t j) const {
    if constexpr (TERMS == 1) {
      return row[0][j];
    } else {
      float acc = mul_rn(row[TERMS - 1][j], scale[TERMS - 1]);
      for (int t = TERMS - 2; t >= 0; --t) acc = add_rn(mul_rn(row[t][j], scale[t]), acc);
      return acc;
    }
  }
};

template <int TERMS>
RCN_HD TermRow<TERMS> term_row(const TermTile& tile, int64_t q, int64_t col0) {
  TermRow<TERMS> r{};
  for (int t = 0; t < TERMS; ++t) {
    r.row[t] = tile.s + (int64_t(t) * tile.Qt + q) * tile.ld + col0;
    r.scale[t] = TERMS == 1 ? 1.0f : tile.scales[int64_t(t) * tile.Qt + q];
  }
  return r;
}

// Column offsets within a slice, as the selection's 32-bit ids.
struct SliceId {
  RCN_HD_METHOD uint32_t operator()(int64_t i) const { return uint32_t(i); }
};

// The candidates of the merge: the lists [S, Q, k] of S slices, query q;
// candidate c is entry c % k of slice c / k.
struct ListScore {
  const float* s;
  int64_t Q, k, q;
  RCN_HD_METHOD float operator()(int64_t c) const { return s[((c / k) * Q + q) * k + c % k]; }
};
struct ListId {
  const int64_t* i;
  int64_t Q, k, q;
  RCN_HD_METHOD int64_t operator()(int64_t c) const { return i[((c / k) * Q + q) * k + c % k]; }
};

// Collective: the k best of query q's S lists into out_s / out_i [k].
template <class G>
RCN_HD void merge_lists(const G& g, Run<int64_t>& run, float* s, int64_t* id, const Layout& L,
                        const float* part_s, const int64_t* part_i, int64_t S, int64_t Q, int64_t q,
                        float* out_s, int64_t* out_i) {
  if (g.rank() == 0) init(run);
  g.sync();
  select_row(g, run, s, id, L, S * L.k, ListScore{part_s, Q, L.k, q}, ListId{part_i, Q, L.k, q});
  finish(g, run, s, id, L, out_s, out_i, 0);
}

// Column j's score in a chunk's score row, with a NaN recomputed as a
// float32 dot product of the query row and corpus row j when `q` is set (a
// split query: a corpus +-inf times a zero term is NaN in the GEMM where the
// float32 product is +-inf; any non-finite term makes the sum's value
// independent of the order of the additions).
template <DType CT>
struct RescoreNan {
  const float* row;
  const float* q;  // null: no rescoring
  const typename Storage<CT>::type* c;
  int64_t c_stride, d;
  RCN_HD_METHOD float operator()(int64_t j) const {
    const float v = row[j];
    if (v == v || q == nullptr) return v;
    const typename Storage<CT>::type* cj = c + j * c_stride;
    float acc = 0.f;
    for (int64_t e = 0; e < d; ++e) acc = add_rn(mul_rn(q[e], load_as_float<CT>(cj + e)), acc);
    return acc;
  }
};

// The slices of a row of n columns: S slices of slice_cols(n, S) columns
// (the last shorter).
RCN_HD int64_t slice_cols(int64_t n, int64_t S) { return S <= 1 ? n : (n + S - 1) / S; }

// One row of finish_rows: `top_s` / `top_i` [kk] are torch.topk's best of
// the row (scores descending, NaN first; column indices), kk = min(k + 1, n);
// score_at(j) is column j's score (the row itself, or a rescoring of its
// NaN scores). Writes the exact top-k (ids + id_base, (-inf, -1) padding).
template <class G, class ScoreAt>
RCN_HD void finish_row(const G& g, Run<uint32_t>& run, float* s, uint32_t* id, const Layout& L,
                       const float* top_s, const int64_t* top_i, int64_t kk, int64_t n, const ScoreAt& score_at,
                       float* out_s, int64_t* out_i, int64_t id_base) {
  const int64_t k = L.k, m = kk < k ? kk : k;
  bool nan = false, tie = false;
  for (int64_t i = g.rank(); i < kk; i += g.size()) {
    nan = nan || top_s[i] != top_s[i];
    tie = tie || (i + 1 < m && top_s[i] == top_s[i + 1]);
  }
  // a tie across the k-th place: entries equal to the k-th may lie beyond the k + 1 topk returned
  const bool boundary = kk > k && top_s[k - 1] == top_s[k] && topn_admissible(top_s[k - 1]);
  const bool again = g.any(nan) || boundary;
  if (again) {
    if (g.rank() == 0) init(run);
    g.sync();
    select_row(g, run, s, id, L, n, score_at, SliceId{});
    finish(g, run, s, id, L, out_s, out_i, id_base);
    return;
  }
  const float ninf = -bits_to_float(0x7f800000u);
  if (g.any(tie)) {  // equal scores in the list: put them in id order
    const int width = next_pow2(int(m));
    for (int i = g.rank(); i < width; i += g.size()) {
      s[i] = i < m ? top_s[i] : ninf;
      id[i] = i < m ? uint32_t(top_i[i]) : pad_id<uint32_t>();
    }
    g.sync();
    bitonic_sort(g, s, id, width);
    for (int64_t i = g.rank(); i < k; i += g.size()) {
      const bool real = i < m && topn_admissible(s[i]);
      out_s[i] = real ? s[i] : ninf;
      out_i[i] = real ? id_base + int64_t(id[i]) : int64_t(-1);
    }
    g.sync();
    return;
  }
  for (int64_t i = g.rank(); i < k; i += g.size()) {
    const bool real = i < m && topn_admissible(top_s[i]);
    out_s[i] = real ? top_s[i] : ninf;
    out_i[i] = real ? id_base + top_i[i] : int64_t(-1);
  }
}

}  // namespace rcn_fast::topn_select
