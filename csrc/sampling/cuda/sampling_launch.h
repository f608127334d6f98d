// The launch table of the subset samplers (common/launch.h): block sizes,
// shared memory and grids of sampling.cu (the warp sampler) and
// sampling_gram.cu (the Gram sampler), as the launchers compute them. Host
// code only; tests/cuda_launch_table.cpp prints it for the resource check.
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "common/dtypes.h"
#include "common/launch.h"
#include "sampling/sampling_gram.h"

namespace rcn_fast::cuda {

// ---- the warp sampler (sampling.cu)
constexpr int kRelThreads = 128;     // rel_kernel: 8 lanes a candidate
constexpr int kSampleMaxWarps = 16;  // sample_kernel: warps (subsets at once) a block
constexpr int64_t kSampleScratchBudget = int64_t(256) << 20;  // bytes of per-subset state a chunk

// A sample_kernel launch plan: `warps` subsets a block, blocks in chunks of
// at most `chunk` (the scratch of a chunk within kSampleScratchBudget).
struct SamplePlan {
  int warps;
  int64_t blocks, chunk, per_block_bytes;
};

inline SamplePlan sample_plan(int64_t B, int64_t n, int64_t num_subsets) {
  SamplePlan s{};
  s.warps = int(std::max<int64_t>(1, std::min<int64_t>(num_subsets, kSampleMaxWarps)));
  s.per_block_bytes = s.warps * n * int64_t(2 * sizeof(float) + 1);
  s.blocks = B * launch::ceil_div(num_subsets, s.warps);
  s.chunk = std::max<int64_t>(1, std::min<int64_t>(s.blocks, kSampleScratchBudget / std::max<int64_t>(1, s.per_block_bytes)));
  return s;
}

// ---- the Gram sampler (sampling_gram.cu)
constexpr int kGramThreads = 256;
constexpr int kGramWarps = kGramThreads / 32;
constexpr int kGramLdF32 = gram::kSlice + 1;  // staged float32 rows: odd stride, no bank conflicts
constexpr int kGramLdHalf = gram::kSlice + gram::kSlicePad;

// Dynamic shared memory of a Gram block for npad (n rounded up to 16) rows:
// G, rel, the query slice, the staged slice, and each warp's acc, w and
// eligibility rows.
inline size_t gram_smem(DType t, int npad) {
  const size_t es = t == DType::F32 ? 4 : 2, ld = t == DType::F32 ? kGramLdF32 : kGramLdHalf;
  return size_t(npad) * npad * 4 + size_t(npad) * 4 + size_t(gram::kSlice) * 4 + size_t(npad) * ld * es +
         size_t(kGramWarps) * npad * 9;
}

// Rows (and columns) of a float32 thread's register tile of G for npad rows:
// 256 threads as 16 x 16, thread (r, c) the rows r + 16 i and columns c + 16 j,
// i, j < the tile: npad / 16 rounded up to 1, 2, 4 or 8 (issue 55, S7: an
// 8 x 8 tile whatever npad made 64 FMAs a column where n = 9 needs one).
inline int gram_f32_tile(int npad) {
  const int rg = (npad + 15) / 16;
  return rg <= 1 ? 1 : rg <= 2 ? 2 : rg <= 4 ? 4 : 8;
}

// ---- the table
inline std::vector<launch::KernelSpec> sampling_kernel_specs() {
  return {
      {"rel_kernel", kRelThreads, kRelThreads, 0, true},
      {"sample_kernel", kSampleMaxWarps * 32, 32, 0, true},
      {"gram_kernel", kGramThreads, kGramThreads, int64_t(gram_smem(DType::F32, gram::kMaxN)), true},
  };
}

}  // namespace rcn_fast::cuda
