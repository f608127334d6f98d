// The int8 bounded scan's search on CUDA (issue 55, S2), written once for
// a lane group: a CUDA block (topn/cuda/topn_int8.cu) or one host thread
// (topn/cpu/topn_int8_emulated.cpp runs the same tile logic to test it).
//
// The kernels filter while they scan: no [Q, N] intervals are written and
// the host waits once, at the end, for the candidates' count.
//
// * A block takes a group of queries and, in a grid-stride loop, tiles of
//   kTileRows corpus rows. Per tile it gets the exact integer dots I1 =
//   <c1_q, c_j>, I2 = <c2_q, c_j> (tensor-core mma.m16n8k32.s8 for many
//   queries, __dp4a for one or two: below) and runs filter_tile.
// * filter_tile: each (query, row) pair's interval [lo, hi]
//   (topn/topn_int8.h). The pair is a candidate when hi >= the query's
//   running bound: the larger of the bound in global memory (raised by
//   every block, atomicMax on the order-preserving key of topn_order.h)
//   and the k-th largest lo this block has seen (its running selection of
//   topn_select.h over lo values, in shared memory). A candidate takes a
//   slot of the global buffer from an atomic counter and writes (query,
//   row, lo, hi) there when the slot is below the capacity; the counter
//   counts every candidate, so the caller sees an overflow and scans again
//   with a buffer that holds them all (never a silent drop). The bound is
//   the k-th largest lo of a subset of the rows, so never above T, the
//   query's k-th largest lo over all rows: every row with hi >= T is
//   written. T itself is the k-th largest lo among the candidates (every
//   row with lo >= T is one).
// * A pair whose lo reaches the bound is offered to the block's selection;
//   when a flush raises its k-th entry, the block publishes it as the
//   global bound. k = 0: no bound, every pair a candidate (the intervals
//   themselves, for tests).
#pragma once
#include <cstdint>

#include "common/macros.h"
#include "topn/topn_int8.h"
#include "topn/topn_order.h"
#include "topn/topn_select.h"

namespace rcn_fast::topn_int8 {

namespace ts = topn_select;

constexpr int kTileRows = 32;      // rows a block filters at a time (its selection's round)
constexpr int kScanMaxK = 1024;    // the largest k of the search
constexpr int kScanThreads = 128;  // both kernels: four warps
constexpr int kScanWarps = kScanThreads / 32;
// tensor cores: a block's warps split a row's 64-byte chunks (warp w takes
// chunks w, w + 4, ...); a warp scores kMmaNTiles tiles of 8 rows
constexpr int kMmaChunk = 64;
constexpr int kMmaNTiles = kTileRows / 8;
constexpr int kMmaQueries = 8;     // queries of one A tile: rows 0-7 their c1, rows 8-15 their c2
// __dp4a: 16 lanes a row (two rows a warp), lane l reads 16-byte chunks l, l + 16, ...
constexpr int kDp4aLanes = 16;

// The search's state in global memory (device pointers on the GPU).
struct ScanState {
  const int8_t* codes;      // [N, width]
  const float* rows;        // [N, 3]
  const int8_t* qcodes;     // [Q, 2, width]
  const float* qparams;     // [Q, 5]
  int64_t N, width, Q;
  int k;                    // 0: no filter
  unsigned int* bound;      // [Q] topn_key of the running bound (0: none yet)
  unsigned long long* count;  // candidates found (may exceed cap)
  int64_t cap;
  int32_t* cand_q;          // [cap] each
  int64_t* cand_j;
  float* cand_lo;
  float* cand_hi;
};

// A block's selections of lo values, one a query of its group, in shared memory.
struct BlockSel {
  ts::Run<uint32_t>* run;   // [group]
  float* s;                 // [group, L.slots]
  uint32_t* id;             // [group, L.slots]
  float* bnd;               // [group]: the tile's bound
  ts::Layout L;
};

// The selections' layout for k (k = 0: one slot, unused).
RCN_HD ts::Layout sel_layout(int k) { return ts::layout(k > 0 ? k : 1, kTileRows); }

// Shared bytes of a block's selections for `group` queries.
RCN_HD int64_t sel_bytes(int group, int k) {
  const ts::Layout L = sel_layout(k);
  return int64_t(group) * (int64_t(sizeof(ts::Run<uint32_t>)) + int64_t(L.slots) * 8 + 4);
}

// The selections laid out in `smem` (16-byte aligned).
RCN_HD BlockSel block_sel(unsigned char* smem, int group, int k) {
  BlockSel b{};
  b.L = sel_layout(k);
  b.run = reinterpret_cast<ts::Run<uint32_t>*>(smem);
  b.s = reinterpret_cast<float*>(smem + int64_t(group) * int64_t(sizeof(ts::Run<uint32_t>)));
  b.id = reinterpret_cast<uint32_t*>(b.s + int64_t(group) * b.L.slots);
  b.bnd = reinterpret_cast<float*>(b.id + int64_t(group) * b.L.slots);
  return b;
}

RCN_HD float read_bound(const unsigned int* b) {
#if defined(__CUDA_ARCH__)
  const unsigned int key = *reinterpret_cast<const volatile unsigned int*>(b);
#else
  const unsigned int key = *b;
#endif
  return key == 0u ? -bits_to_float(0x7f800000u) : topn_key_to_score(key);
}

RCN_HD void raise_bound(unsigned int* b, unsigned int key) {
#if defined(__CUDA_ARCH__)
  atomicMax(b, key);
#else
  if (key > *b) *b = key;
#endif
}

RCN_HD unsigned long long claim_slot(unsigned long long* c) {
#if defined(__CUDA_ARCH__)
  return atomicAdd(c, 1ull);
#else
  return (*c)++;
#endif
}

// Collective: the block's selections start empty.
template <class G>
RCN_HD void begin_block(const G& g, BlockSel& b, int nq) {
  for (int i = g.rank(); i < nq; i += g.size()) ts::init(b.run[i]);
  g.sync();
}

// Collective: one tile, rows j0 .. j0 + nrows - 1 of queries q0 .. q0 + nq - 1;
// dots(qi, r, &i1, &i2) gives the pair's exact integer dots.
template <class G, class Dots>
RCN_HD void filter_tile(const G& g, const ScanState& st, BlockSel& b, int64_t q0, int nq, int64_t j0, int nrows,
                        const Dots& dots) {
  const float ninf = -bits_to_float(0x7f800000u);
  for (int qi = g.rank(); qi < nq; qi += g.size()) {
    float t = ninf;
    if (st.k > 0) {
      t = read_bound(st.bound + q0 + qi);
      const ts::Run<uint32_t>& r = b.run[qi];
      if (r.count == st.k && r.thr_s > t) t = r.thr_s;
    }
    b.bnd[qi] = t;
  }
  g.sync();
  for (int p = g.rank(); p < nq * nrows; p += g.size()) {
    const int qi = p / nrows, r = p % nrows;
    const int64_t q = q0 + qi, j = j0 + r;
    int32_t i1, i2;
    dots(qi, r, &i1, &i2);
    float lo, hi;
    interval(i1, i2, st.qparams + q * kQueryParams, st.rows + j * kRowBounds, &lo, &hi);
    const float t = b.bnd[qi];
    if (hi >= t) {  // NaN never
      const unsigned long long slot = claim_slot(st.count);
      if (slot < (unsigned long long)st.cap) {
        st.cand_q[slot] = int32_t(q);
        st.cand_j[slot] = j;
        st.cand_lo[slot] = lo;
        st.cand_hi[slot] = hi;
      }
    }
    if (st.k > 0 && lo >= t) ts::offer(g, b.run[qi], b.s + int64_t(qi) * b.L.slots, b.id + int64_t(qi) * b.L.slots,
                                       b.L, lo, uint32_t(j));
  }
  g.sync();
  if (st.k == 0) return;
  // flush where the buffer could overflow in the next tile, or where it
  // first holds enough for a k-th entry (the bound's first value); every
  // lane reads every selection's fill, then none moves before the flushes
  unsigned int full = 0;
  for (int qi = 0; qi < nq; ++qi) {
    const ts::Run<uint32_t>& r = b.run[qi];
    if (ts::needs_flush(r, b.L) || (r.count < st.k && r.count + r.nbuf >= st.k)) full |= 1u << qi;
  }
  g.sync();
  for (int qi = 0; qi < nq; ++qi) {
    if (!(full & (1u << qi))) continue;
    ts::Run<uint32_t>& r = b.run[qi];
    ts::flush(g, r, b.s + int64_t(qi) * b.L.slots, b.id + int64_t(qi) * b.L.slots, b.L);
    if (g.rank() == 0 && r.count == st.k) raise_bound(st.bound + q0 + qi, topn_key(r.thr_s));
  }
}

// ---- the tensor-core dots (mma.m16n8k32.row.col.s32.s8.s8.s32)
// PTX ISA fragments, lane = 4 g + t: A (16 x 32, row-major) registers
// a0 = A[g][4t..4t+3], a1 = A[g+8][4t..], a2 = A[g][16+4t..], a3 = A[g+8][16+4t..];
// B (32 x 8, column-major) b0 = B[4t..4t+3][g], b1 = B[16+4t..][g];
// C (16 x 8) c0, c1 = C[g][2t, 2t+1], c2, c3 = C[g+8][2t, 2t+1].
// Any permutation of k applied to A and B alike leaves the integer sums
// unchanged: lane t's 16 bytes at 64 c + 16 t of a row serve two k-steps
// (words 0, 1 the first's k = 4t.. and 16+4t.., words 2, 3 the second's),
// one 16-byte load a lane a row per 64 bytes.

// Whether lane t's 16 bytes of chunk c lie within the row.
RCN_HD bool mma_valid(int64_t width, int c, int t) { return int64_t(kMmaChunk) * c + 16 * t < width; }
RCN_HD int64_t mma_offset(int c, int t) { return int64_t(kMmaChunk) * c + 16 * t; }

// A's registers of k-step s (0, 1) from a lane's words of its query's c1 and c2.
RCN_HD void mma_a(const uint32_t* c1, const uint32_t* c2, int s, uint32_t* a) {
  a[0] = c1[2 * s];
  a[1] = c2[2 * s];
  a[2] = c1[2 * s + 1];
  a[3] = c2[2 * s + 1];
}
// B's registers of k-step s from a lane's words of its row.
RCN_HD void mma_b(const uint32_t* w, int s, uint32_t* b) {
  b[0] = w[2 * s];
  b[1] = w[2 * s + 1];
}

// Where the warps leave their partial sums: red[warp][a][nt][lane][e]
// (e: c0..c3), and the dots of (query qi, tile row r) summed over the warps.
RCN_HD int64_t red_at(int w, int a, int nt, int lane, int e, int atiles) {
  return ((((int64_t(w) * atiles + a) * kMmaNTiles + nt) * 32 + lane) * 4) + e;
}
// Shared bytes of the partial sums (atiles A tiles) and of a tile's dots (group queries).
RCN_HD int64_t mma_red_bytes(int atiles) { return int64_t(kScanWarps) * atiles * kMmaNTiles * 32 * 4 * 4; }
RCN_HD int64_t dp4a_dots_bytes(int group) { return int64_t(group) * kTileRows * 2 * 4; }

struct MmaDots {
  const int32_t* red;
  int atiles;
  RCN_HD_METHOD void operator()(int qi, int r, int32_t* i1, int32_t* i2) const {
    const int a = qi / kMmaQueries, g = qi % kMmaQueries, nt = r / 8, n = r % 8;
    const int lane = 4 * g + n / 2, e = n % 2;
    int32_t s1 = 0, s2 = 0;
    for (int w = 0; w < kScanWarps; ++w) {
      s1 += red[red_at(w, a, nt, lane, e, atiles)];
      s2 += red[red_at(w, a, nt, lane, 2 + e, atiles)];
    }
    *i1 = s1;
    *i2 = s2;
  }
};

// ---- the __dp4a dots: dots[qi][r][term] of the tile
struct TileDots {
  const int32_t* dots;
  RCN_HD_METHOD void operator()(int qi, int r, int32_t* i1, int32_t* i2) const {
    *i1 = dots[(int64_t(qi) * kTileRows + r) * 2];
    *i2 = dots[(int64_t(qi) * kTileRows + r) * 2 + 1];
  }
};

// The tile row lane `lane` of warp w scores at step `step` of a tile
// (kDp4aLanes lanes a row), and the 16-byte chunk it reads i-th.
RCN_HD int dp4a_row(int w, int lane, int step) {
  return step * (kScanWarps * 32 / kDp4aLanes) + w * (32 / kDp4aLanes) + lane / kDp4aLanes;
}
RCN_HD int64_t dp4a_chunk(int lane, int i) { return int64_t(lane % kDp4aLanes) + int64_t(kDp4aLanes) * i; }

}  // namespace rcn_fast::topn_int8
