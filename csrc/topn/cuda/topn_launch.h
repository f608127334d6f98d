// The launch table of the top-n kernels (common/launch.h): block sizes,
// shared memory and grids of topn.cu (tiled v1), topn_mma.cu (tensor-core
// scan), topn_block_select.cu and topn_int8.cu, as the launchers compute
// them. Host code only; tests/cuda_launch_table.cpp prints it for the
// resource check.
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <vector>

#include "common/launch.h"
#include "topn/topn_int8.h"
#include "topn/topn_int8_scan.h"
#include "topn/topn_select.h"

namespace rcn_fast::cuda {

// Largest k of the tiled kernel's selection and of the block selects.
constexpr int64_t kTopnMaxK = 1024;
// Largest k of the tensor-core scan (its lists live in shared memory).
constexpr int64_t kTopnMmaMaxK = 256;

// ---- tiled v1 (topn.cu)
constexpr int kScoreTile = 64;      // queries x corpus rows per score block
constexpr int kScoreDepth = 16;     // depth slice staged in shared memory
constexpr int kScoreThreads = 256;
constexpr int kSelectThreads = 256;
constexpr int kPadThreads = 256;

// The score kernel's launches for Q queries and `rows` corpus rows: blocks
// of kScoreTile x kScoreTile, y = query tiles, at most kMaxGridYZ a launch
// (y0: the first query tile of the launch).
inline std::vector<launch::Grid> score_launches(int64_t Q, int64_t rows) {
  return launch::y_chunks(launch::ceil_div(rows, kScoreTile), launch::ceil_div(Q, kScoreTile));
}

// ---- tensor-core scan (topn_mma.cu)
constexpr int kScanWarps = 4;       // warps per scan block
constexpr int kScanThreads = kScanWarps * 32;
constexpr int kScanTile = 16;       // corpus rows of one mma tile
constexpr int kScanDepth = 64;      // columns of one depth step
constexpr int kScanQPad = 8;        // elements of padding per query row in shared memory
constexpr int64_t kScanSmemCap = int64_t(160) << 10;  // the most a scan block asks for
constexpr int kSplitThreads = 128;

// Shared memory of a scan block: `terms` x qb query rows (dpad + pad
// halves), their scales, qsel runs and their selections.
inline size_t scan_smem(int terms, int qb, int qsel, int dpad, const topn_select::Layout& L) {
  return size_t(terms) * qb * (dpad + kScanQPad) * 2 + size_t(terms) * qb * 4 +
         size_t(qsel) * sizeof(topn_select::Run<uint32_t>) +
         size_t(qsel) * size_t(L.slots) * (sizeof(float) + sizeof(uint32_t));
}

struct ScanConfig {
  int nt, tiles;   // query tiles of 8 a block; mma tiles a warp scores a round
  size_t smem;     // dynamic shared memory
};

// The widest query group whose shared memory fits min(optin, kScanSmemCap)
// (NT 4, 2, 1 with 1, 2, 4 tiles a warp a round); nt = 0 when none does.
inline ScanConfig scan_config(int64_t Q, int64_t k, int terms, int dpad, int64_t optin) {
  const size_t limit = size_t(std::min<int64_t>(optin, kScanSmemCap));
  const int nts[3] = {4, 2, 1};
  for (int nt : nts) {
    if (nt > 1 && 8 * (nt / 2) >= Q) continue;  // a narrower group already holds every query
    const int tiles = 4 / nt;
    const topn_select::Layout L = topn_select::layout(int(k), kScanWarps * kScanTile * tiles);
    const size_t smem = scan_smem(terms, 8 * nt, int(std::min<int64_t>(8 * nt, Q)), dpad, L);
    if (smem <= limit) return ScanConfig{nt, tiles, smem};
  }
  return ScanConfig{0, 0, 0};
}

constexpr int64_t kScanPartialBytes = int64_t(512) << 20;
constexpr int64_t kScanMaxSliceRows = int64_t(1) << 31;

// The scan's grid: S slices of `slice` rows (x) by query groups (y).
struct ScanGrid {
  int64_t S, slice, groups;
};

inline ScanGrid scan_grid(int64_t N, int64_t Q, int64_t k, const ScanConfig& c, int64_t sms) {
  const int64_t qb = 8 * c.nt, round_rows = int64_t(kScanWarps) * kScanTile * c.tiles;
  const int64_t groups = launch::ceil_div(Q, qb);
  if (groups > launch::kMaxGridYZ) throw std::invalid_argument("queries: more query groups than gridDim.y takes");
  // about 4 blocks an SM over all query groups, at least a few rounds each,
  // and the slices' lists within kScanPartialBytes
  int64_t S = std::max<int64_t>(1, (int64_t(4) * sms + groups - 1) / groups);
  S = std::min<int64_t>(S, std::max<int64_t>(1, (N + 4 * round_rows - 1) / (4 * round_rows)));
  S = std::min<int64_t>(S, std::max<int64_t>(1, kScanPartialBytes / (Q * k * 12)));
  S = std::max<int64_t>(S, (N + kScanMaxSliceRows - 1) / kScanMaxSliceRows);  // offsets in a slice are 32-bit
  int64_t slice = (N + S - 1) / S;
  slice = std::max<int64_t>(round_rows, (slice + round_rows - 1) / round_rows * round_rows);
  S = std::max<int64_t>(1, (N + slice - 1) / slice);
  return ScanGrid{S, slice, groups};
}

// ---- block select, merge, finishing (topn_block_select.cu)
// Candidates a block select offers between two flush checks (256 threads,
// 4 each), and the threads of the merge (one candidate each a round).
constexpr int kBlockSelectThreads = 256;
constexpr int kBlockSelectRound = 1024;
constexpr int kMergeThreads = 256;

template <class Id>
size_t selection_bytes(const topn_select::Layout& L) {
  return size_t(L.slots) * (sizeof(float) + sizeof(Id));
}
inline size_t block_select_smem(int64_t k) {
  return selection_bytes<uint32_t>(topn_select::layout(int(k), kBlockSelectRound));
}
inline size_t merge_smem(int64_t k) { return selection_bytes<int64_t>(topn_select::layout(int(k), kMergeThreads)); }

// ---- int8 bounded scan (topn_int8.cu; the tile logic: topn/topn_int8_scan.h)
constexpr int kInt8Threads = topn_int8::kScanThreads;
// __dp4a for up to this many queries a call, tensor cores (mma.m16n8k32.s8) above
constexpr int64_t kInt8Dp4aMaxQueries = 2;
// the tensor-core kernel holds two A tiles (16 queries) a block up to this
// k, one (8) above: the selections of lo values fit the shared memory
constexpr int64_t kInt8WideMaxK = 256;
constexpr int kInt8MaxChunks = 4;   // the query words a lane holds: 64-byte chunks a warp / 16-byte chunks a lane

struct Int8ScanConfig {
  bool mma;
  int group;    // queries a block
  int atiles;   // mma: A tiles of 8 queries
  int chunks;   // mma: 64-byte chunks a warp; dp4a: 16-byte chunks a lane
  size_t smem;  // dynamic shared memory
};

// The kernel, its query group and shared memory for Q queries, k (0: no
// filter) and the codes' width (a multiple of 16, at most 1024).
inline Int8ScanConfig int8_scan_config(int64_t Q, int64_t k, int64_t width) {
  Int8ScanConfig c{};
  if (Q <= kInt8Dp4aMaxQueries) {
    c.mma = false;
    c.group = int(Q < 1 ? 1 : Q);
    c.atiles = 0;
    c.chunks = int(std::max<int64_t>(1, launch::ceil_div(launch::ceil_div(width, 16), topn_int8::kDp4aLanes)));
    c.smem = size_t(topn_int8::dp4a_dots_bytes(c.group) + topn_int8::sel_bytes(c.group, int(k)));
  } else {
    c.mma = true;
    c.atiles = Q <= topn_int8::kMmaQueries || k > kInt8WideMaxK ? 1 : 2;
    c.group = c.atiles * topn_int8::kMmaQueries;
    c.chunks = int(std::max<int64_t>(
        1, launch::ceil_div(launch::ceil_div(width, topn_int8::kMmaChunk), topn_int8::kScanWarps)));
    c.smem = size_t(topn_int8::mma_red_bytes(c.atiles) + topn_int8::sel_bytes(c.group, int(k)));
  }
  if (c.chunks > kInt8MaxChunks) throw std::invalid_argument("codes: expected a width of at most 1024");
  return c;
}

// The scan's launches: about 4 blocks an SM over all query groups (x, a
// grid-stride loop over tiles of rows), query groups in y, at most
// kMaxGridYZ a launch (y0: the first group of the launch).
inline std::vector<launch::Grid> int8_scan_launches(int64_t Q, int64_t N, int group, int64_t sms) {
  const int64_t groups = launch::ceil_div(Q, group);
  int64_t blocks = std::max<int64_t>(1, (int64_t(4) * sms + groups - 1) / groups);
  blocks = std::min<int64_t>(blocks, std::max<int64_t>(1, launch::ceil_div(N, topn_int8::kTileRows)));
  return launch::y_chunks(blocks, groups);
}

// The most dynamic shared memory either kernel asks for (k up to the limit).
inline int64_t int8_max_smem(bool mma) {
  int64_t most = 0;
  for (int64_t Q : {int64_t(1), int64_t(2), int64_t(8), int64_t(9)})
    for (int64_t k : {int64_t(0), kInt8WideMaxK, kInt8WideMaxK + 1, int64_t(topn_int8::kScanMaxK)}) {
      const Int8ScanConfig c = int8_scan_config(Q, k, 1024);
      if (c.mma == mma) most = std::max<int64_t>(most, int64_t(c.smem));
    }
  return most;
}

// ---- the table
inline std::vector<launch::KernelSpec> topn_kernel_specs() {
  return {
      {"score_block_kernel", kScoreThreads, kScoreThreads, 0, true},
      {"merge_select_kernel", kSelectThreads, kSelectThreads, 0, false},
      {"fill_padding_kernel", kPadThreads, kPadThreads, 0, false},
      {"scan_kernel", kScanThreads, kScanThreads, kScanSmemCap, true},
      {"split_kernel", kSplitThreads, kSplitThreads, 0, false},
      {"block_select_kernel", kBlockSelectThreads, kBlockSelectThreads, int64_t(block_select_smem(kTopnMaxK)), true},
      {"merge_kernel", kMergeThreads, kMergeThreads, int64_t(merge_smem(kTopnMaxK)), false},
      {"finish_rows_kernel", kBlockSelectThreads, kBlockSelectThreads, int64_t(block_select_smem(kTopnMaxK)), false},
      {"int8_mma_kernel", kInt8Threads, kInt8Threads, int8_max_smem(true), true},
      {"int8_dp4a_kernel", kInt8Threads, kInt8Threads, int8_max_smem(false), true},
  };
}

}  // namespace rcn_fast::cuda
