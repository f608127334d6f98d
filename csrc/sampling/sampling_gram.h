// The Gram sampler (issue 45 item 5; CUDA kernel sampling/cuda/sampling_gram.cu,
// host emulation sampling/cpu/sampling_gram_emulated.cpp): per question,
// every dot product a subset can need, dot(e_i, e_j), is computed once into
// the Gram matrix G [n, n] (and rel = E q), so the subsets' steps read G's
// rows instead of streaming the candidates again (the warp sampler reads all
// n candidates once a step and subset: 36 times a question at N = 9, K = 5).
// The steps themselves are sampling/subset_sampler.h's, unchanged.
//
// G of float16/bfloat16 candidates is made by mma.m16n8k16 (products exact,
// float32 accumulation) from 64-column slices of E staged in shared memory.
// The fragment layout (PTX ISA, mma.m16n8k16 .row.col, lane = 4 g + t): A
// [16 x 16] rows g and g + 8, columns 2t, 2t + 1 (register pairs 0, 1) and
// 2t + 8, 2t + 9 (2, 3); B [16 x 8] rows 2t, 2t + 1 (register 0) and 2t + 8,
// 2t + 9 (register 1) of column g; C [16 x 8] rows g and g + 8, columns 2t,
// 2t + 1. A tile of G (rows i0.., columns j0..) is A = E[i0.., k0..] times
// B = E[j0.., k0..]^T, so both fragments are 32-bit words of rows of E.
#pragma once
#include <cstdint>

#include "common/dtypes.h"
#include "common/macros.h"
#include "common/problems.h"
#include "sampling/subset_sampler.h"

namespace rcn_fast::gram {

constexpr int kMaxN = 128;   // candidates a question at most (G in shared memory)
constexpr int kSlice = 64;   // columns of E staged at a time
constexpr int kSlicePad = 8; // elements of padding per staged row (bank spread)

// Rows of G and E as staged: n rounded up to 16 (tiles of 16 rows, 8 columns).
RCN_HD int padded_rows(int64_t n) { return int((n + 15) / 16 * 16); }

// The 32-bit word of a staged slice E [rows][kSlice + kSlicePad] (16-bit
// elements) holding columns c, c + 1 of row r.
RCN_HD uint32_t word_at(const uint16_t* e, int r, int c) {
  const uint16_t* p = e + r * (kSlice + kSlicePad) + c;
  return uint32_t(p[0]) | (uint32_t(p[1]) << 16);
}

// Lane `lane`'s A fragment of rows i0.. and B fragment of rows j0.. of E
// (as columns of B), depth columns k0 .. k0 + 15 of the staged slice.
RCN_HD void fragment_a(int lane, const uint16_t* e, int i0, int k0, uint32_t a[4]) {
  const int g = lane >> 2, t = lane & 3;
  a[0] = word_at(e, i0 + g, k0 + 2 * t);
  a[1] = word_at(e, i0 + g + 8, k0 + 2 * t);
  a[2] = word_at(e, i0 + g, k0 + 2 * t + 8);
  a[3] = word_at(e, i0 + g + 8, k0 + 2 * t + 8);
}
RCN_HD void fragment_b(int lane, const uint16_t* e, int j0, int k0, uint32_t b[2]) {
  const int g = lane >> 2, t = lane & 3;
  b[0] = word_at(e, j0 + g, k0 + 2 * t);
  b[1] = word_at(e, j0 + g, k0 + 2 * t + 8);
}

// Lane `lane`'s accumulators of the tile (i0, j0) into G [npad][npad].
RCN_HD void store_c(int lane, const float c[4], float* G, int npad, int i0, int j0) {
  const int g = lane >> 2, t = lane & 3;
  G[(i0 + g) * npad + j0 + 2 * t] = c[0];
  G[(i0 + g) * npad + j0 + 2 * t + 1] = c[1];
  G[(i0 + g + 8) * npad + j0 + 2 * t] = c[2];
  G[(i0 + g + 8) * npad + j0 + 2 * t + 1] = c[3];
}

// Tiles of G: (npad / 16) row tiles x (npad / 8) column tiles; tile `i`
// has rows 16 (i / cols) .., columns 8 (i % cols) ...
RCN_HD int tiles(int npad) { return (npad / 16) * (npad / 8); }
RCN_HD void tile_origin(int tile, int npad, int* i0, int* j0) {
  const int cols = npad / 8;
  *i0 = 16 * (tile / cols);
  *j0 = 8 * (tile % cols);
}

// acc[j] += G[c][j] for the lane's candidates (any split of j over lanes:
// the caller syncs the group before the next step reads acc).
template <class G_>
RCN_HD void add_row(const G_& g, float* acc, const float* grow, int64_t n) {
  for (int64_t j = g.rank(); j < n; j += g.size()) acc[j] += grow[j];
}

// Subset s of question b, every step (subset_sampler.h's sample_step),
// with acc updated from G's rows; lane 0 writes the outputs. `sync()` is
// the group's barrier. Returns false when a step's score is not finite
// (the subset's remaining ids are -1; the caller reports the question).
template <class G_, class Sync>
RCN_HD bool run_subset(const G_& g, const Sync& sync, const SamplingProblem& p, int64_t b, int64_t s,
                       const float* rel, const float* G, int npad, float* acc, uint8_t* elig, float* w) {
  const int64_t n = p.n, K = p.subset_size;
  for (int64_t j = g.rank(); j < n; j += g.size()) {
    acc[j] = 0.f;
    elig[j] = p.mask == nullptr ? 1 : (p.mask[b * n + j] != 0);
  }
  sync();
  const sampler::StepArgs a = sampler::step_args(p, b, s, rel, acc, elig, w);
  const int64_t out0 = (b * p.num_subsets + s) * K;
  for (int64_t t = 0; t < K; ++t) {
    const sampler::Draw dr = sampler::sample_step(g, a, t);
    if (dr.index == sampler::kNonFinite) {
      for (int64_t r = t + g.rank(); r < K; r += g.size()) p.ids_out[out0 + r] = -1;
      return false;
    }
    if (g.rank() == 0) {
      p.ids_out[out0 + t] = dr.index;
      if (p.logp_out) p.logp_out[out0 + t] = dr.logp;
      if (dr.index >= 0) elig[dr.index] = 0;
    }
    sync();
    if (dr.index < 0 || t + 1 == K) continue;
    add_row(g, acc, G + dr.index * npad, n);
    sync();
  }
  return true;
}

}  // namespace rcn_fast::gram
