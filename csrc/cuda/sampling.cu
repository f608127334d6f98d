// CUDA launcher of the subset sampler. The per-step logic (draws, Philox
// stream layout, log-probabilities) is common/subset_sampler.h, shared with
// the CPU launcher; here it runs with a warp as the lane group.
//
//   rel_kernel:     block per question, warp per candidate:
//                   rel[b, j] = dot(e_q, e_j); NaN/inf flags an error
//   sample_kernel:  warp per (question, subset), all steps in the kernel:
//                   draw (sample_step), mark, acc_j += dot(e_chosen, e_j)
//
// Per-subset state (acc, eligible, weights) lives in global scratch (L1/L2
// resident for the usual n of a few hundred); items are launched in chunks
// so that scratch stays bounded.
#include "cuda/sampling.h"

#include <algorithm>

#include "common/subset_sampler.h"
#include "cuda/runtime.h"

namespace rcn_fast::cuda {
namespace {

constexpr int kWarps = 4;                                   // warps per block
constexpr int64_t kScratchBudget = int64_t(256) << 20;      // bytes per chunk
constexpr unsigned kFull = 0xffffffffu;

// The 32 lanes of a warp as a sampler lane group (see subset_sampler.h).
// Butterfly (xor) reductions: every lane ends with the same bits, because
// each pairwise sum is computed from the same two operands.
struct WarpGroup {
  __device__ __forceinline__ int rank() const { return int(threadIdx.x & 31u); }
  __device__ __forceinline__ int size() const { return 32; }
  __device__ __forceinline__ float sum_f(float x) const {
    for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(kFull, x, o);
    return x;
  }
  __device__ __forceinline__ float max_f(float x) const {
    for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(kFull, x, o));
    return x;
  }
  __device__ __forceinline__ float exscan_f(float x) const {
    const int lane = rank();
    for (int o = 1; o < 32; o <<= 1) {
      const float y = __shfl_up_sync(kFull, x, o);
      if (lane >= o) x += y;
    }
    const float ex = __shfl_up_sync(kFull, x, 1);
    return lane == 0 ? 0.f : ex;
  }
  __device__ __forceinline__ int64_t sum_i(int64_t x) const {
    for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(kFull, (long long)x, o);
    return x;
  }
  __device__ __forceinline__ int64_t exscan_i(int64_t x) const {
    const int lane = rank();
    for (int o = 1; o < 32; o <<= 1) {
      const int64_t y = __shfl_up_sync(kFull, (long long)x, o);
      if (lane >= o) x += y;
    }
    const int64_t ex = __shfl_up_sync(kFull, (long long)x, 1);
    return lane == 0 ? 0 : ex;
  }
  __device__ __forceinline__ int64_t min_i(int64_t x) const {
    for (int o = 16; o > 0; o >>= 1) {
      const int64_t y = __shfl_xor_sync(kFull, (long long)x, o);
      x = y < x ? y : x;
    }
    return x;
  }
  __device__ __forceinline__ int64_t max_i(int64_t x) const {
    for (int o = 16; o > 0; o >>= 1) {
      const int64_t y = __shfl_xor_sync(kFull, (long long)x, o);
      x = y > x ? y : x;
    }
    return x;
  }
};

template <DType T>
__device__ __forceinline__ const typename Storage<T>::type* cand_row(const SamplingProblem& p,
                                                                     int64_t b, int64_t j) {
  return static_cast<const typename Storage<T>::type*>(p.cand) + b * p.cand_stride_b +
         j * p.cand_stride_n;
}

// dot(x, y) over d elements with all 32 lanes; every lane gets the sum.
template <DType TX, DType TY>
__device__ __forceinline__ float warp_dot(const WarpGroup& g, const typename Storage<TX>::type* x,
                                          const typename Storage<TY>::type* y, int64_t d) {
  float s = 0.f;
  for (int64_t k = g.rank(); k < d; k += 32) s += load_as_float<TX>(x + k) * load_as_float<TY>(y + k);
  return g.sum_f(s);
}

template <DType T>
__global__ void rel_kernel(SamplingProblem p, float* __restrict__ rel,
                           unsigned long long* __restrict__ bad_candidate) {
  const WarpGroup g;
  const int64_t b = blockIdx.x;
  const float* q = p.query + b * p.query_stride;
  for (int64_t j = threadIdx.x / 32; j < p.n; j += kWarps) {
    const float s = warp_dot<DType::F32, T>(g, q, cand_row<T>(p, b, j), p.d);
    if (g.rank() == 0) {
      rel[b * p.n + j] = s;
      const bool valid = p.mask == nullptr || p.mask[b * p.n + j] != 0;
      if (valid && !sampler::sampler_isfinite(s))
        atomicMin(bad_candidate, (unsigned long long)(b * p.n + j));
    }
  }
}

template <DType T>
__global__ void sample_kernel(SamplingProblem p, const float* __restrict__ rel,
                              int64_t item0, int64_t items, float* acc_all, uint8_t* elig_all,
                              float* w_all, unsigned long long* __restrict__ bad_score) {
  const WarpGroup g;
  const int64_t local = int64_t(blockIdx.x) * kWarps + threadIdx.x / 32;
  if (local >= items) return;  // whole warps leave together
  const int64_t item = item0 + local;
  const int64_t b = item / p.num_subsets, s = item % p.num_subsets;
  const int64_t n = p.n, K = p.subset_size;
  float* acc = acc_all + local * n;
  uint8_t* elig = elig_all + local * n;
  for (int64_t j = g.rank(); j < n; j += 32) {
    acc[j] = 0.f;
    elig[j] = p.mask == nullptr ? 1 : (p.mask[b * n + j] != 0);
  }
  __syncwarp();
  const sampler::StepArgs a = sampler::step_args(p, b, s, rel + b * n, acc, elig, w_all + local * n);
  const int64_t out0 = item * K;
  for (int64_t t = 0; t < K; ++t) {
    const sampler::Draw dr = sampler::sample_step(g, a, t);
    if (dr.index == sampler::kNonFinite) {
      if (g.rank() == 0) atomicMin(bad_score, (unsigned long long)b);
      for (int64_t r = t + g.rank(); r < K; r += 32) p.ids_out[out0 + r] = -1;
      return;
    }
    if (g.rank() == 0) {
      p.ids_out[out0 + t] = dr.index;
      if (p.logp_out) p.logp_out[out0 + t] = dr.logp;
      if (dr.index >= 0) elig[dr.index] = 0;
    }
    __syncwarp();
    if (dr.index < 0 || t + 1 == K) continue;
    const auto* ec = cand_row<T>(p, b, dr.index);
    for (int64_t j = 0; j < n; ++j) {
      if (!elig[j]) continue;  // the same for every lane: no divergence
      const float sim = warp_dot<T, T>(g, ec, cand_row<T>(p, b, j), p.d);
      if (g.rank() == 0) acc[j] += sim;
    }
    __syncwarp();
  }
}

template <DType T>
void launch(const SamplingProblem& p, cudaStream_t stream, float* rel, uint8_t* scratch,
            int64_t chunk, unsigned long long* flags) {
  rel_kernel<T><<<unsigned(p.B), kWarps * 32, 0, stream>>>(p, rel, flags);
  check(cudaGetLastError(), "sampler rel kernel");
  const int64_t items = p.B * p.num_subsets, n = p.n;
  float* acc = reinterpret_cast<float*>(scratch);
  float* w = acc + chunk * n;
  uint8_t* elig = reinterpret_cast<uint8_t*>(w + chunk * n);
  for (int64_t i0 = 0; i0 < items; i0 += chunk) {
    const int64_t m = std::min(chunk, items - i0);
    const unsigned blocks = unsigned((m + kWarps - 1) / kWarps);
    sample_kernel<T><<<blocks, kWarps * 32, 0, stream>>>(p, rel, i0, m, acc, elig, w, flags + 1);
    check(cudaGetLastError(), "sampler kernel");
  }
}

}  // namespace

SamplingResult sample_subsets_cuda(const SamplingProblem& p, cudaStream_t stream) {
  SamplingResult ok{SamplingStatus::Ok, -1, -1};
  const int64_t items = p.B * p.num_subsets, n = p.n, K = p.subset_size;
  if (items == 0 || K == 0) return ok;
  if (n == 0) {
    // nothing to draw: -1 everywhere (0xff bytes), log-probabilities 0
    check(cudaMemsetAsync(p.ids_out, 0xff, size_t(items * K) * sizeof(int64_t), stream), "cudaMemsetAsync");
    if (p.logp_out)
      check(cudaMemsetAsync(p.logp_out, 0, size_t(items * K) * sizeof(float), stream), "cudaMemsetAsync");
    return ok;
  }
  const int64_t per_item = n * int64_t(2 * sizeof(float) + 1);
  const int64_t chunk = std::max<int64_t>(1, std::min<int64_t>(items, kScratchBudget / per_item));
  float* rel = nullptr;
  uint8_t* scratch = nullptr;
  unsigned long long* flags = nullptr;
  check(cudaMallocAsync(reinterpret_cast<void**>(&rel), size_t(p.B * n) * sizeof(float), stream), "cudaMallocAsync");
  check(cudaMallocAsync(reinterpret_cast<void**>(&scratch), size_t(chunk * per_item), stream), "cudaMallocAsync");
  check(cudaMallocAsync(reinterpret_cast<void**>(&flags), 2 * sizeof(unsigned long long), stream), "cudaMallocAsync");
  check(cudaMemsetAsync(flags, 0xff, 2 * sizeof(unsigned long long), stream), "cudaMemsetAsync");
  switch (p.cand_dtype) {
    case DType::F32: launch<DType::F32>(p, stream, rel, scratch, chunk, flags); break;
    case DType::F16: launch<DType::F16>(p, stream, rel, scratch, chunk, flags); break;
    case DType::BF16: launch<DType::BF16>(p, stream, rel, scratch, chunk, flags); break;
  }
  unsigned long long host_flags[2];
  check(cudaMemcpyAsync(host_flags, flags, sizeof host_flags, cudaMemcpyDeviceToHost, stream), "cudaMemcpyAsync");
  cudaFreeAsync(rel, stream);
  cudaFreeAsync(scratch, stream);
  cudaFreeAsync(flags, stream);
  check(cudaStreamSynchronize(stream), "sampler kernels");
  const unsigned long long none = ~0ull;
  if (host_flags[0] != none)
    return SamplingResult{SamplingStatus::NonFiniteCandidate, int64_t(host_flags[0] / uint64_t(n)),
                          int64_t(host_flags[0] % uint64_t(n))};
  if (host_flags[1] != none) return SamplingResult{SamplingStatus::NonFiniteScore, int64_t(host_flags[1]), -1};
  return ok;
}

}  // namespace rcn_fast::cuda
