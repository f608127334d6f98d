// Exact top-n maximum inner product search on CUDA: the launcher and the
// tiled algorithm (version 1; the tensor-core scan is topn/cuda/topn_mma.cu).
//
// The tiled algorithm is the CPU one (topn/cpu/topn.cpp): scan the corpus block by
// block, score each block against all queries with float32 accumulation,
// and fold the block into every query's running top-k while it is hot. The
// ordering (score desc, id asc; NaN/-inf never returned; (-inf, -1)
// padding) and the element conversions come from the shared headers
// topn/topn_order.h and common/dtypes.h.
#include <cub/block/block_scan.cuh>

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

#include "common/dtypes.h"
#include "topn/topn_order.h"
#include "topn/topn_select.h"
#include "common/cuda/lane_groups.cuh"
#include "common/cuda/runtime.h"
#include "topn/cuda/topn.h"
#include "topn/cuda/topn_mma.h"

namespace rcn_fast::cuda {
namespace {

// block sizes and grids: topn/cuda/topn_launch.h
constexpr int TILE = kScoreTile;
constexpr int TK = kScoreDepth;

// Block (x, y) scores query tile q_tile0 + y against corpus tile x.
template <DType QT, DType CT>
__global__ void __launch_bounds__(kScoreThreads, launch::kMinBlocksPerSm)
    score_block_kernel(const void* __restrict__ queries, int64_t qstride, const void* __restrict__ corpus,
                       int64_t cstride, int64_t Q, int64_t rows, int64_t row0, int64_t d, float* __restrict__ out,
                       int64_t out_stride, int64_t q_tile0) {
  using QS = typename Storage<QT>::type;
  using CS = typename Storage<CT>::type;
  __shared__ float qs[TK][TILE + 1];
  __shared__ float cs[TK][TILE + 1];
  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
  const int64_t q0 = (q_tile0 + int64_t(blockIdx.y)) * TILE, c0 = int64_t(blockIdx.x) * TILE;
  float acc[4][4] = {};
  for (int64_t k0 = 0; k0 < d; k0 += TK) {
    // stage a TK-deep slice of 64 queries and 64 corpus rows, as float32
    for (int e = threadIdx.x; e < TK * TILE; e += kScoreThreads) {
      const int kk = e % TK, r = e / TK;
      const int64_t kq = k0 + kk;
      const int64_t qrow = q0 + r, crow = c0 + r;
      qs[kk][r] = (qrow < Q && kq < d)
                      ? load_as_float<QT>(static_cast<const QS*>(queries) + qrow * qstride + kq)
                      : 0.f;
      cs[kk][r] = (crow < rows && kq < d)
                      ? load_as_float<CT>(static_cast<const CS*>(corpus) + (row0 + crow) * cstride + kq)
                      : 0.f;
    }
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < TK; ++kk) {
      float a[4], b[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) a[i] = qs[kk][ty + 16 * i];
#pragma unroll
      for (int j = 0; j < 4; ++j) b[j] = cs[kk][tx + 16 * j];
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
    }
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int64_t q = q0 + ty + 16 * i;
    if (q >= Q) continue;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int64_t c = c0 + tx + 16 * j;
      if (c < rows) out[q * out_stride + c] = acc[i][j];
    }
  }
}

// Candidate i of query q: the running list first (ids below every chunk id,
// already in (score desc, id asc) order), then the chunk in row order. So
// candidate order is id order among equal scores.
struct Candidates {
  const float* prev_s;
  const int64_t* prev_i;
  const float* chunk;
  int64_t k, rows, row0;
  __device__ float score(int64_t i) const { return i < k ? prev_s[i] : chunk[i - k]; }
  __device__ int64_t id(int64_t i) const { return i < k ? prev_i[i] : row0 + (i - k); }
  __device__ int64_t size() const { return k + rows; }
};

__global__ void __launch_bounds__(kSelectThreads, launch::kMinBlocksPerSm)
    merge_select_kernel(const float* __restrict__ prev_s, const int64_t* __restrict__ prev_i,
                        const float* __restrict__ chunk, int64_t chunk_stride, int64_t k, int64_t rows, int64_t row0,
                        float* __restrict__ next_s, int64_t* __restrict__ next_i) {
  using Scan = cub::BlockScan<int, kSelectThreads>;
  __shared__ typename Scan::TempStorage scan_tmp;
  __shared__ unsigned int hist[256];
  __shared__ unsigned int s_prefix, s_need;
  __shared__ int s_taken;
  __shared__ float keep_s[kTopnMaxK];
  __shared__ int64_t keep_i[kTopnMaxK];

  const int64_t q = blockIdx.x;
  Candidates cand{prev_s + q * k, prev_i + q * k, chunk + q * chunk_stride, k, rows, row0};
  const int64_t n = cand.size();

  // how many admissible candidates: the target is min(k, that)
  if (threadIdx.x == 0) s_taken = 0;
  __syncthreads();
  int local = 0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) local += topn_key(cand.score(i)) != 0u;
  atomicAdd(&s_taken, local);
  __syncthreads();
  const int64_t target = k < int64_t(s_taken) ? k : int64_t(s_taken);

  // radix select (MSB first) of the target-th largest key T
  if (threadIdx.x == 0) {
    s_prefix = 0u;
    s_need = unsigned(target);
  }
  for (int shift = 24; shift >= 0 && target > 0; shift -= 8) {
    for (int b = threadIdx.x; b < 256; b += blockDim.x) hist[b] = 0u;
    __syncthreads();
    const unsigned int prefix = s_prefix;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
      const unsigned int key = topn_key(cand.score(i));
      if (topn_radix_match(key, prefix, shift)) atomicAdd(&hist[(key >> shift) & 255u], 1u);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      unsigned int pre = prefix, need = s_need;
      topn_radix_pick(hist, shift, pre, need);
      s_prefix = pre;
      s_need = need;  // how many candidates equal to the final prefix to take
    }
    __syncthreads();
  }
  __syncthreads();  // (Y1) T is read below even when no pass ran
  const unsigned int T = s_prefix;
  const unsigned int ties_needed = s_need;

  // gather: every key > T, then the first ties_needed keys == T in
  // candidate (= id) order
  if (threadIdx.x == 0) s_taken = 0;
  __syncthreads();
  if (target > 0) {
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
      const unsigned int key = topn_key(cand.score(i));
      if (key != 0u && key > T) {
        const int slot = atomicAdd(&s_taken, 1);
        keep_s[slot] = cand.score(i);
        keep_i[slot] = cand.id(i);
      }
    }
    __syncthreads();
    const int greater = s_taken;
    int ties_before = 0;  // ties already taken by earlier tiles
    for (int64_t base = 0; base < n && ties_before < int(ties_needed); base += blockDim.x) {
      const int64_t i = base + threadIdx.x;
      const int is_tie = (i < n && topn_key(cand.score(i)) == T) ? 1 : 0;
      int rank, total;
      Scan(scan_tmp).ExclusiveSum(is_tie, rank, total);
      if (is_tie && ties_before + rank < int(ties_needed)) {
        const int slot = greater + ties_before + rank;
        keep_s[slot] = cand.score(i);
        keep_i[slot] = cand.id(i);
      }
      ties_before += total;
      __syncthreads();
    }
  }
  __syncthreads();

  // bitonic sort of the kept entries by (score desc, id asc), padded
  const int width = topn_select::next_pow2(int(k));
  for (int64_t i = target + threadIdx.x; i < width; i += blockDim.x) {
    keep_s[i] = -INFINITY;
    keep_i[i] = -1;
  }
  __syncthreads();
  // padding (-inf, -1) sorts after every admissible entry (topn/topn_order.h)
  topn_select::bitonic_sort(BlockG{}, keep_s, keep_i, width);
  for (int64_t i = threadIdx.x; i < k; i += blockDim.x) {
    next_s[q * k + i] = i < target ? keep_s[i] : -INFINITY;
    next_i[q * k + i] = i < target ? keep_i[i] : -1;
  }
}

__global__ void __launch_bounds__(kPadThreads, launch::kMinBlocksPerSm) fill_padding_kernel(float* s, int64_t* ids, int64_t n) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) {
    s[i] = -INFINITY;
    ids[i] = -1;
  }
}

template <DType QT, DType CT>
void launch_scores(const TopnProblem& p, int64_t row0, int64_t rows, float* out,
                   int64_t out_stride, cudaStream_t stream) {
  // query tiles in y, at most 65,535 a launch (topn_launch.h)
  for (const launch::Grid& g : score_launches(p.Q, rows))
    score_block_kernel<QT, CT><<<dim3(unsigned(g.x), unsigned(g.y)), kScoreThreads, 0, stream>>>(
        p.queries, p.query_stride, p.corpus, p.corpus_stride, p.Q, rows, row0, p.d, out, out_stride, g.y0);
}

void scores_for_chunk(const TopnProblem& p, int64_t row0, int64_t rows, float* out,
                      int64_t out_stride, cudaStream_t stream) {
  const DType qt = p.query_dtype, ct = p.corpus_dtype;
  if (qt == DType::F32 && ct == DType::F32) return launch_scores<DType::F32, DType::F32>(p, row0, rows, out, out_stride, stream);
  if (qt == DType::F32 && ct == DType::F16) return launch_scores<DType::F32, DType::F16>(p, row0, rows, out, out_stride, stream);
  if (qt == DType::F32 && ct == DType::BF16) return launch_scores<DType::F32, DType::BF16>(p, row0, rows, out, out_stride, stream);
  if (qt == DType::F16 && ct == DType::F16) return launch_scores<DType::F16, DType::F16>(p, row0, rows, out, out_stride, stream);
  if (qt == DType::BF16 && ct == DType::BF16) return launch_scores<DType::BF16, DType::BF16>(p, row0, rows, out, out_stride, stream);
  throw std::invalid_argument("queries: expected float32 or the corpus dtype");
}

}  // namespace

void topn_cuda(const TopnProblem& p, cudaStream_t stream, TopnAlgorithm algorithm) {
  if (p.k < 1 || p.k > kTopnMaxK) throw std::invalid_argument("k: out of the CUDA kernel's range");
  if (p.Q == 0) return;
  if (algorithm != TopnAlgorithm::Tiled) {
    const char* why = topn_mma_unsupported(p);
    if (why == nullptr) return topn_mma(p, stream);
    if (algorithm == TopnAlgorithm::Mma)
      throw std::invalid_argument(std::string("algorithm: the tensor-core scan cannot serve this call: ") + why);
  }
  const int64_t total = p.Q * p.k;
  // running lists: (scores_out, ids_out) and a second buffer, swapped per chunk
  float* run_s[2] = {p.scores_out, nullptr};
  int64_t* run_i[2] = {p.ids_out, nullptr};
  scratch_alloc(&run_s[1], size_t(total), stream);
  scratch_alloc(&run_i[1], size_t(total), stream);
  fill_padding_kernel<<<unsigned(launch::ceil_div(total, kPadThreads)), kPadThreads, 0, stream>>>(run_s[0], run_i[0],
                                                                                                  total);

  // chunk rows: bounded so the [Q, chunk] score buffer stays <= 256 MiB
  const int64_t budget = (int64_t(256) << 20) / int64_t(sizeof(float));
  int64_t chunk = std::max<int64_t>(TILE, std::min<int64_t>(int64_t(1) << 18, budget / std::max<int64_t>(p.Q, 1)));
  chunk = std::min<int64_t>(chunk, std::max<int64_t>(p.N, 1));
  float* scores = nullptr;
  scratch_alloc(&scores, size_t(p.Q * chunk), stream);

  int cur = 0;
  for (int64_t row0 = 0; row0 < p.N; row0 += chunk) {
    const int64_t rows = std::min<int64_t>(chunk, p.N - row0);
    scores_for_chunk(p, row0, rows, scores, chunk, stream);
    merge_select_kernel<<<unsigned(p.Q), kSelectThreads, 0, stream>>>(
        run_s[cur], run_i[cur], scores, chunk, p.k, rows, row0, run_s[1 - cur], run_i[1 - cur]);
    cur = 1 - cur;
  }
  if (cur == 1) {
    check(cudaMemcpyAsync(p.scores_out, run_s[1], size_t(total) * sizeof(float), cudaMemcpyDeviceToDevice, stream), "cudaMemcpyAsync");
    check(cudaMemcpyAsync(p.ids_out, run_i[1], size_t(total) * sizeof(int64_t), cudaMemcpyDeviceToDevice, stream), "cudaMemcpyAsync");
  }
  check(cudaGetLastError(), "topn kernels");
  scratch_free(scores, stream);
  scratch_free(run_s[1], stream);
  scratch_free(run_i[1], stream);
}

}  // namespace rcn_fast::cuda
