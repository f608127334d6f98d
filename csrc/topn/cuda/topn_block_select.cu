// The one-pass selections on CUDA (topn/cuda/topn_block_select.h): thin
// kernels around topn/topn_block_select.h with a block as the lane group,
// the running selection in shared memory. The CPU runs the same code with
// one thread (topn/cpu/topn_rows.cpp, topn/cpu/topn_select_emulated.cpp).
#include "topn/cuda/topn_block_select.h"

#include <algorithm>
#include <stdexcept>

#include "common/cuda/lane_groups.cuh"
#include "common/cuda/runtime.h"

namespace rcn_fast::cuda {
namespace {

namespace ts = topn_select;

template <int TERMS>
__global__ void __launch_bounds__(kBlockSelectThreads, launch::kMinBlocksPerSm)
    block_select_kernel(ts::TermTile tile, int64_t R, int k, int64_t row0, int64_t width, float* part_s,
                        int64_t* part_i, int64_t slot0) {
  extern __shared__ __align__(16) unsigned char smem[];
  __shared__ ts::Run<uint32_t> run;
  const ts::Layout L = ts::layout(k, kBlockSelectRound);
  float* s = reinterpret_cast<float*>(smem);
  uint32_t* id = reinterpret_cast<uint32_t*>(s + L.slots);
  const int64_t si = blockIdx.x, q = blockIdx.y;
  const int64_t c0 = min(R, si * width), c1 = min(R, c0 + width);
  const BlockG g;
  if (threadIdx.x == 0) ts::init(run);
  __syncthreads();
  ts::select_row(g, run, s, id, L, c1 - c0, ts::term_row<TERMS>(tile, q, c0), ts::SliceId{});
  const size_t at = size_t(((slot0 + si) * tile.Qt + q) * k);
  ts::finish(g, run, s, id, L, part_s + at, part_i + at, row0 + c0);
}

__global__ void __launch_bounds__(kMergeThreads, launch::kMinBlocksPerSm)
    merge_kernel(const float* __restrict__ part_s, const int64_t* __restrict__ part_i, int64_t S, int64_t Q, int k,
                 float* out_s, int64_t* out_i) {
  extern __shared__ __align__(16) unsigned char smem[];
  __shared__ ts::Run<int64_t> run;
  const ts::Layout L = ts::layout(k, kMergeThreads);
  int64_t* sel_i = reinterpret_cast<int64_t*>(smem);
  float* sel_s = reinterpret_cast<float*>(sel_i + L.slots);
  const int64_t q = blockIdx.x;
  ts::merge_lists(BlockG{}, run, sel_s, sel_i, L, part_s, part_i, S, Q, q, out_s + q * k, out_i + q * k);
}

template <DType CT>
__global__ void __launch_bounds__(kBlockSelectThreads, launch::kMinBlocksPerSm) finish_rows_kernel(TopnFinishProblem p) {
  extern __shared__ __align__(16) unsigned char smem[];
  __shared__ ts::Run<uint32_t> run;
  const ts::Layout L = ts::layout(int(p.k), kBlockSelectRound);
  float* s = reinterpret_cast<float*>(smem);
  uint32_t* id = reinterpret_cast<uint32_t*>(s + L.slots);
  const int64_t q = blockIdx.x;
  using CS = typename Storage<CT>::type;
  const ts::RescoreNan<CT> score{p.scores + q * p.ld, p.queries ? p.queries + q * p.q_stride : nullptr,
                                 static_cast<const CS*>(p.corpus), p.c_stride, p.d};
  ts::finish_row(BlockG{}, run, s, id, L, p.top_s + q * p.kk, p.top_i + q * p.kk, p.kk, p.n, score,
                 p.out_s + q * p.k, p.out_i + q * p.k, p.id_base);
}

void check_k(int64_t k) {
  if (k < 1 || k > 1024) throw std::invalid_argument("k: expected 1 <= k <= 1024");
}

}  // namespace

void topn_block_select_cuda(const ts::TermTile& tile, int64_t R, int64_t k, int64_t row0, int64_t slices,
                            float* part_s, int64_t* part_i, int64_t slot0, cudaStream_t stream) {
  check_k(k);
  if (tile.Qt < 1 || tile.Qt > 65535) throw std::invalid_argument("scores: expected 1 to 65535 query rows");
  if (tile.terms < 1 || tile.terms > 3) throw std::invalid_argument("terms: expected 1, 2 or 3");
  const int64_t S = std::max<int64_t>(1, slices), width = ts::slice_cols(R, S);
  if (width >= (int64_t(1) << 32)) throw std::invalid_argument("slices: a slice must have fewer than 2^32 columns");
  const size_t bytes = block_select_smem(k);
  const dim3 grid(unsigned(S), unsigned(tile.Qt));
  if (tile.terms == 1)
    block_select_kernel<1><<<grid, kBlockSelectThreads, bytes, stream>>>(tile, R, int(k), row0, width, part_s,
                                                                          part_i, slot0);
  else if (tile.terms == 2)
    block_select_kernel<2><<<grid, kBlockSelectThreads, bytes, stream>>>(tile, R, int(k), row0, width, part_s,
                                                                          part_i, slot0);
  else
    block_select_kernel<3><<<grid, kBlockSelectThreads, bytes, stream>>>(tile, R, int(k), row0, width, part_s,
                                                                          part_i, slot0);
  check(cudaGetLastError(), "topn block select kernel");
}

void topn_merge_lists_cuda(const float* part_s, const int64_t* part_i, int64_t S, int64_t Q, int64_t k,
                           float* out_s, int64_t* out_i, cudaStream_t stream) {
  check_k(k);
  if (Q == 0) return;
  const size_t bytes = merge_smem(k);
  merge_kernel<<<unsigned(Q), kMergeThreads, bytes, stream>>>(part_s, part_i, S, Q, int(k), out_s, out_i);
  check(cudaGetLastError(), "topn merge kernel");
}

void topn_finish_rows_cuda(const TopnFinishProblem& p, cudaStream_t stream) {
  check_k(p.k);
  if (p.Q == 0) return;
  if (p.n >= (int64_t(1) << 32)) throw std::invalid_argument("scores: expected fewer than 2^32 columns");
  const size_t bytes = block_select_smem(p.k);
  switch (p.corpus_dtype) {
    case DType::F32: finish_rows_kernel<DType::F32><<<unsigned(p.Q), kBlockSelectThreads, bytes, stream>>>(p); break;
    case DType::F16: finish_rows_kernel<DType::F16><<<unsigned(p.Q), kBlockSelectThreads, bytes, stream>>>(p); break;
    case DType::BF16: finish_rows_kernel<DType::BF16><<<unsigned(p.Q), kBlockSelectThreads, bytes, stream>>>(p); break;
  }
  check(cudaGetLastError(), "topn finish kernel");
}

}  // namespace rcn_fast::cuda
