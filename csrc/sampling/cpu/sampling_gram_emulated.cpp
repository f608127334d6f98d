#include "sampling/cpu/sampling_gram_emulated.h"

#include <cmath>
#include <cstring>
#include <vector>

#include "sampling/sampling_gram.h"

namespace rcn_fast {
namespace {

namespace gm = gram;

#include "sampling/cpu/serial_group.h"

struct NoSync {
  void operator()() const {}
};

uint16_t bits_at(const SamplingProblem& p, int64_t b, int64_t r, int64_t k) {
  return static_cast<const uint16_t*>(p.cand)[b * p.cand_stride_b + r * p.cand_stride_n + k];
}

float value_at(const SamplingProblem& p, int64_t b, int64_t r, int64_t k) {
  if (p.cand_dtype == DType::F32) return static_cast<const float*>(p.cand)[b * p.cand_stride_b + r * p.cand_stride_n + k];
  const uint16_t h = bits_at(p, b, r, k);
  return p.cand_dtype == DType::F16 ? half_to_float(h) : bf16_to_float(h);
}

float half_value(DType t, uint16_t h) { return t == DType::F16 ? half_to_float(h) : bf16_to_float(h); }

// mma.m16n8k16 (row.col, f32 accumulate) over the 32 lanes' registers, from
// the PTX ISA's fragment layout (g = lane / 4, t = lane % 4):
// A[r][c]: lane 4 (r % 8) + (c % 8) / 2, register (r >= 8) + 2 (c >= 8), half c % 2;
// B[k][n]: lane 4 n + (k % 8) / 2, register (k >= 8), half k % 2;
// C[r][n]: lane 4 (r % 8) + n / 2, register 2 (r >= 8) + n % 2.
// The products of float16/bfloat16 values are exact in float32; they are
// added in k order.
void mma_emulated(DType t, const uint32_t a[32][4], const uint32_t bfr[32][2], float c[32][4]) {
  auto half_of = [](uint32_t w, int h) { return uint16_t(h ? (w >> 16) : (w & 0xFFFFu)); };
  float A[16][16], B[16][8];
  for (int r = 0; r < 16; ++r)
    for (int col = 0; col < 16; ++col)
      A[r][col] = half_value(t, half_of(a[4 * (r % 8) + (col % 8) / 2][(r >= 8) + 2 * (col >= 8)], col % 2));
  for (int k = 0; k < 16; ++k)
    for (int n = 0; n < 8; ++n) B[k][n] = half_value(t, half_of(bfr[4 * n + (k % 8) / 2][k >= 8], k % 2));
  for (int r = 0; r < 16; ++r)
    for (int n = 0; n < 8; ++n) {
      float& d = c[4 * (r % 8) + n / 2][2 * (r >= 8) + n % 2];
      for (int k = 0; k < 16; ++k) d = std::fma(A[r][k], B[k][n], d);
    }
}

}  // namespace

void sampling_gram_matrix_emulated(const SamplingProblem& p, int64_t b, float* G) {
  const int64_t n = p.n, d = p.d;
  const int npad = gm::padded_rows(n);
  std::memset(G, 0, sizeof(float) * size_t(npad) * size_t(npad));
  if (p.cand_dtype == DType::F32) {  // each entry: FMAs in column order, as every thread of the kernel
    for (int i = 0; i < n; ++i)
      for (int j = 0; j < n; ++j) {
        float s = 0.f;
        for (int64_t k = 0; k < d; ++k) s = std::fma(value_at(p, b, i, k), value_at(p, b, j, k), s);
        G[i * npad + j] = s;
      }
    return;
  }
  const int n_tiles = gm::tiles(npad);
  std::vector<float> acc(size_t(n_tiles) * 32 * 4, 0.f);
  std::vector<uint16_t> stage(size_t(npad) * (gm::kSlice + gm::kSlicePad));
  for (int64_t k0 = 0; k0 < d; k0 += gm::kSlice) {
    for (int r = 0; r < npad; ++r)
      for (int cc = 0; cc < gm::kSlice; ++cc)
        stage[size_t(r) * (gm::kSlice + gm::kSlicePad) + cc] = r < n && k0 + cc < d ? bits_at(p, b, r, k0 + cc) : 0;
    for (int tile = 0; tile < n_tiles; ++tile) {
      int i0, j0;
      gm::tile_origin(tile, npad, &i0, &j0);
      float(*c)[4] = reinterpret_cast<float(*)[4]>(acc.data() + size_t(tile) * 32 * 4);
      for (int kk = 0; kk < gm::kSlice; kk += 16) {
        uint32_t a[32][4], bfr[32][2];
        for (int lane = 0; lane < 32; ++lane) {
          gm::fragment_a(lane, stage.data(), i0, kk, a[lane]);
          gm::fragment_b(lane, stage.data(), j0, kk, bfr[lane]);
        }
        mma_emulated(p.cand_dtype, a, bfr, c);
      }
    }
  }
  for (int tile = 0; tile < n_tiles; ++tile) {
    int i0, j0;
    gm::tile_origin(tile, npad, &i0, &j0);
    for (int lane = 0; lane < 32; ++lane) gm::store_c(lane, acc.data() + (size_t(tile) * 32 + lane) * 4, G, npad, i0, j0);
  }
}

SamplingResult sample_subsets_gram_emulated(const SamplingProblem& p) {
  SamplingResult res{SamplingStatus::Ok, -1, -1};
  const int64_t n = p.n, d = p.d;
  if (p.B * p.num_subsets == 0 || p.subset_size == 0) return res;
  const int npad = gm::padded_rows(n);
  const size_t np = static_cast<size_t>(npad);
  std::vector<float> G(np * np), rel(np), acc(np), w(np);
  std::vector<uint8_t> elig(np);
  for (int64_t b = 0; b < p.B; ++b) {
    if (n == 0) {
      for (int64_t i = 0; i < p.num_subsets * p.subset_size; ++i) {
        p.ids_out[b * p.num_subsets * p.subset_size + i] = -1;
        if (p.logp_out) p.logp_out[b * p.num_subsets * p.subset_size + i] = 0.f;
      }
      continue;
    }
    sampling_gram_matrix_emulated(p, b, G.data());
    const float* q = p.query + b * p.query_stride;
    for (int64_t j = 0; j < n; ++j) {  // the kernel's order: FMAs in column order
      float s = 0.f;
      for (int64_t k = 0; k < d; ++k) s = std::fma(value_at(p, b, j, k), q[k], s);
      rel[size_t(j)] = s;
      const bool valid = p.mask == nullptr || p.mask[b * n + j] != 0;
      if (valid && !std::isfinite(s) && res.status == SamplingStatus::Ok) res = {SamplingStatus::NonFiniteCandidate, b, j};
    }
    for (int64_t s = 0; s < p.num_subsets; ++s)
      if (!gm::run_subset(SerialGroup{}, NoSync{}, p, b, s, rel.data(), G.data(), npad, acc.data(), elig.data(),
                          w.data()) &&
          res.status == SamplingStatus::Ok)
        res = {SamplingStatus::NonFiniteScore, b, -1};
  }
  return res;
}

}  // namespace rcn_fast
