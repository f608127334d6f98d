#include "topn/cpu/topn_int8_emulated.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <vector>

#include "topn/cpu/serial_group.h"
#include "topn/cuda/topn_launch.h"

namespace rcn_fast {
namespace {

namespace ti = topn_int8;

int8_t byte_of(uint32_t w, int i) { return int8_t(uint8_t(w >> (8 * i))); }

// 16 bytes at p as four little-endian words (zeros where !ok), as the kernels load them.
void load16(const int8_t* p, bool ok, uint32_t* w) {
  if (!ok) {
    std::fill(w, w + 4, 0u);
    return;
  }
  std::memcpy(w, p, 16);
}

// __dp4a(a, b, c): c + the sum of the four signed byte products.
int32_t dp4a(uint32_t a, uint32_t b, int32_t c) {
  for (int i = 0; i < 4; ++i) c += int32_t(byte_of(a, i)) * int32_t(byte_of(b, i));
  return c;
}

// One block of a query group: its shared memory and lane state.
struct Block {
  std::vector<unsigned char> smem;
  ti::BlockSel sel{};
  // mma: query words [warp][lane][chunk][A tile][term][4]; dp4a: [warp][lane][query][term][chunk][4]
  std::vector<uint32_t> qw;
};

struct Emulator {
  const ti::ScanState& st;
  cuda::Int8ScanConfig c;
  SerialGroup g;

  size_t qw_size() const {
    return size_t(ti::kScanWarps) * 32 * size_t(c.chunks) * size_t(c.mma ? c.atiles : c.group) * 2 * 4;
  }
  uint32_t* mma_qw(Block& b, int w, int lane, int ci, int a, int term) const {
    return b.qw.data() + ((((size_t(w) * 32 + lane) * c.chunks + ci) * c.atiles + a) * 2 + term) * 4;
  }
  uint32_t* dp4a_qw(Block& b, int w, int lane, int qi, int term, int i) const {
    return b.qw.data() + ((((size_t(w) * 32 + lane) * c.group + qi) * 2 + term) * c.chunks + i) * 4;
  }

  // The block's start: its lanes' query words, its selections.
  void begin(Block& b, int64_t q0, int nq) const {
    b.smem.assign(c.smem + 16, 0);
    const int64_t dots = c.mma ? ti::mma_red_bytes(c.atiles) : ti::dp4a_dots_bytes(c.group);
    b.sel = ti::block_sel(b.smem.data() + dots, c.group, st.k);
    b.qw.assign(qw_size(), 0u);
    for (int w = 0; w < ti::kScanWarps; ++w)
      for (int lane = 0; lane < 32; ++lane)
        for (int ci = 0; ci < c.chunks; ++ci)
          for (int x = 0; x < (c.mma ? c.atiles : c.group); ++x)
            for (int term = 0; term < 2; ++term) {
              if (c.mma) {
                const int cc = w + ti::kScanWarps * ci, qi = x * ti::kMmaQueries + lane / 4;
                const bool ok = qi < nq && ti::mma_valid(st.width, cc, lane % 4);
                load16(ok ? st.qcodes + ((q0 + qi) * 2 + term) * st.width + ti::mma_offset(cc, lane % 4) : st.qcodes,
                       ok, mma_qw(b, w, lane, ci, x, term));
              } else {
                const int64_t ch = ti::dp4a_chunk(lane, ci);
                const bool ok = x < nq && 16 * ch < st.width;
                load16(ok ? st.qcodes + ((q0 + x) * 2 + term) * st.width + 16 * ch : st.qcodes, ok,
                       dp4a_qw(b, w, lane, x, term, ci));
              }
            }
    ti::begin_block(g, b.sel, nq);
  }

  // A tile's partial sums in shared memory, warp by warp, as int8_mma_kernel leaves them.
  void mma_tile(Block& b, int64_t j0, int nrows) const {
    int32_t* red = reinterpret_cast<int32_t*>(b.smem.data());
    for (int w = 0; w < ti::kScanWarps; ++w) {
      std::vector<int32_t> acc(size_t(c.atiles) * ti::kMmaNTiles * 32 * 4, 0);
      for (int ci = 0; ci < c.chunks; ++ci) {
        const int cc = w + ti::kScanWarps * ci;
        uint32_t bw[ti::kMmaNTiles][32][4];
        for (int nt = 0; nt < ti::kMmaNTiles; ++nt)
          for (int lane = 0; lane < 32; ++lane) {
            const int r = nt * 8 + lane / 4;
            const bool ok = ti::mma_valid(st.width, cc, lane % 4) && r < nrows;
            load16(ok ? st.codes + (j0 + r) * st.width + ti::mma_offset(cc, lane % 4) : st.codes, ok, bw[nt][lane]);
          }
        for (int s = 0; s < 2; ++s)
          for (int nt = 0; nt < ti::kMmaNTiles; ++nt)
            for (int a = 0; a < c.atiles; ++a) {
              uint32_t ar[32][4], br[32][2];
              int32_t cr[32][4];
              for (int lane = 0; lane < 32; ++lane) {
                ti::mma_b(bw[nt][lane], s, br[lane]);
                ti::mma_a(mma_qw(b, w, lane, ci, a, 0), mma_qw(b, w, lane, ci, a, 1), s, ar[lane]);
                for (int e = 0; e < 4; ++e) cr[lane][e] = acc[((size_t(a) * ti::kMmaNTiles + nt) * 32 + lane) * 4 + e];
              }
              mma16832_s8_emulated(ar, br, cr);
              for (int lane = 0; lane < 32; ++lane)
                for (int e = 0; e < 4; ++e) acc[((size_t(a) * ti::kMmaNTiles + nt) * 32 + lane) * 4 + e] = cr[lane][e];
            }
      }
      for (int a = 0; a < c.atiles; ++a)
        for (int nt = 0; nt < ti::kMmaNTiles; ++nt)
          for (int lane = 0; lane < 32; ++lane)
            for (int e = 0; e < 4; ++e)
              red[ti::red_at(w, a, nt, lane, e, c.atiles)] = acc[((size_t(a) * ti::kMmaNTiles + nt) * 32 + lane) * 4 + e];
    }
  }

  // A tile's dots in shared memory, as int8_dp4a_kernel leaves them.
  void dp4a_tile(Block& b, int64_t j0, int nrows) const {
    int32_t* dots = reinterpret_cast<int32_t*>(b.smem.data());
    constexpr int kSteps = ti::kTileRows / (ti::kScanWarps * 32 / ti::kDp4aLanes);
    for (int step = 0; step < kSteps; ++step)
      for (int w = 0; w < ti::kScanWarps; ++w) {
        std::vector<int32_t> part(size_t(32) * c.group * 2, 0);  // each lane's sums
        for (int lane = 0; lane < 32; ++lane) {
          const int r = ti::dp4a_row(w, lane, step);
          for (int i = 0; i < c.chunks; ++i) {
            const int64_t ch = ti::dp4a_chunk(lane, i);
            uint32_t v[4];
            const bool ok = r < nrows && 16 * ch < st.width;
            load16(ok ? st.codes + (j0 + r) * st.width + 16 * ch : st.codes, ok, v);
            for (int qi = 0; qi < c.group; ++qi)
              for (int e = 0; e < 4; ++e)
                for (int term = 0; term < 2; ++term) {
                  int32_t& p = part[(size_t(lane) * c.group + qi) * 2 + term];
                  p = dp4a(v[e], dp4a_qw(b, w, lane, qi, term, i)[e], p);
                }
          }
        }
        for (int o = ti::kDp4aLanes / 2; o > 0; o >>= 1) {  // the xor shuffles, all lanes at once
          std::vector<int32_t> next(part);
          for (int lane = 0; lane < 32; ++lane)
            for (size_t x = 0; x < size_t(c.group) * 2; ++x)
              next[size_t(lane) * c.group * 2 + x] += part[size_t(lane ^ o) * c.group * 2 + x];
          part.swap(next);
        }
        for (int lane = 0; lane < 32; lane += ti::kDp4aLanes) {
          const int r = ti::dp4a_row(w, lane, step);
          if (r >= nrows) continue;
          for (int qi = 0; qi < c.group; ++qi)
            for (int term = 0; term < 2; ++term)
              dots[(int64_t(qi) * ti::kTileRows + r) * 2 + term] = part[(size_t(lane) * c.group + qi) * 2 + term];
        }
      }
  }

  void tile(Block& b, int64_t q0, int nq, int64_t tile_index) const {
    const int64_t j0 = tile_index * ti::kTileRows;
    const int nrows = int(std::min<int64_t>(ti::kTileRows, st.N - j0));
    if (c.mma) {
      mma_tile(b, j0, nrows);
      ti::filter_tile(g, st, b.sel, q0, nq, j0, nrows,
                      ti::MmaDots{reinterpret_cast<const int32_t*>(b.smem.data()), c.atiles});
    } else {
      dp4a_tile(b, j0, nrows);
      ti::filter_tile(g, st, b.sel, q0, nq, j0, nrows, ti::TileDots{reinterpret_cast<const int32_t*>(b.smem.data())});
    }
  }
};

}  // namespace

void mma16832_s8_emulated(const uint32_t (*a)[4], const uint32_t (*b)[2], int32_t (*c)[4]) {
  int8_t A[16][32], B[32][8];
  for (int lane = 0; lane < 32; ++lane) {
    const int g = lane >> 2, t = lane & 3;
    for (int i = 0; i < 16; ++i) {  // a_i: register i / 4, byte i % 4
      const int row = (i < 4 || (i >= 8 && i < 12)) ? g : g + 8;
      const int col = t * 4 + (i & 3) + (i >= 8 ? 16 : 0);
      A[row][col] = byte_of(a[lane][i / 4], i % 4);
    }
    for (int i = 0; i < 8; ++i) {  // b_i: register i / 4
      const int row = t * 4 + (i & 3) + (i >= 4 ? 16 : 0);
      B[row][g] = byte_of(b[lane][i / 4], i % 4);
    }
  }
  for (int lane = 0; lane < 32; ++lane) {
    const int g = lane >> 2, t = lane & 3;
    for (int i = 0; i < 4; ++i) {
      const int row = g + (i >= 2 ? 8 : 0), col = 2 * t + (i & 1);
      int32_t s = 0;
      for (int k = 0; k < 32; ++k) s += int32_t(A[row][k]) * int32_t(B[k][col]);
      c[lane][i] += s;
    }
  }
}

void topn_int8_scan_emulated(const ti::ScanState& st, int64_t sms) {
  if (st.width % 16 != 0 || st.width > ti::kMaxWidth)
    throw std::invalid_argument("codes: expected a width that is a multiple of 16 and at most 1032");
  if (st.k < 0 || st.k > ti::kScanMaxK) throw std::invalid_argument("k: expected 0 <= k <= 1024");
  if (st.Q == 0 || st.N == 0) return;
  Emulator em{st, cuda::int8_scan_config(st.Q, st.k, st.width), SerialGroup{}};
  const int64_t tiles = (st.N + ti::kTileRows - 1) / ti::kTileRows;
  for (const launch::Grid& grid : cuda::int8_scan_launches(st.Q, st.N, em.c.group, sms)) {
    for (int64_t y = 0; y < grid.y; ++y) {
      const int64_t q0 = (grid.y0 + y) * em.c.group;
      const int nq = int(std::min<int64_t>(em.c.group, st.Q - q0));
      std::vector<Block> blocks(size_t(grid.x));
      for (Block& b : blocks) em.begin(b, q0, nq);
      for (int64_t round = 0; round * grid.x < tiles; ++round)
        for (int64_t x = 0; x < grid.x; ++x) {
          const int64_t t = x + round * grid.x;
          if (t < tiles) em.tile(blocks[size_t(x)], q0, nq, t);
        }
    }
  }
}

}  // namespace rcn_fast
