// CUDA launcher of the subset sampler. The per-step logic (draws, Philox
// stream layout, log-probabilities) is sampling/subset_sampler.h, shared with
// the CPU launcher; here it runs with a warp as the lane group.
//
//   rel_kernel:     block per question, 8 lanes per candidate:
//                   rel[b, j] = dot(e_q, e_j); NaN/inf flags an error
//   sample_kernel:  warp per subset, a block holding up to 16 subsets of one
//                   question (its candidates are read from HBM once a step
//                   and served by L1/L2 to the block's other warps); all
//                   steps in the kernel: draw (sample_step), mark,
//                   acc_j += dot(e_chosen, e_j) with 8 lanes per j
//
// Rows are read with 16-byte loads (common/cuda/vec_load.cuh) where the inputs are
// 16-byte aligned, and converted with the hardware instructions: float16
// costs what bfloat16 costs. (Until issue 35, every element went through the
// host's bit-manipulation float16 conversion, branches and a loop per
// element, and a whole warp reduced each dot product: float16 ran 4.5x
// slower than bfloat16.)
//
// Per-subset state (acc, eligible, weights) lives in global scratch (L1/L2
// resident for the usual n of a few hundred); questions are launched in
// chunks so that scratch stays bounded.
#include "sampling/cuda/sampling.h"

#include <algorithm>

#include "sampling/cuda/sampling_launch.h"

#include "sampling/subset_sampler.h"
#include "sampling/cuda/warp_group.cuh"
#include "common/cuda/runtime.h"
#include "common/cuda/vec_load.cuh"

namespace rcn_fast::cuda {
namespace {

// block sizes, warps and chunks: sampling/cuda/sampling_launch.h

template <DType T>
__device__ __forceinline__ const typename Storage<T>::type* cand_row(const SamplingProblem& p,
                                                                     int64_t b, int64_t j) {
  return static_cast<const typename Storage<T>::type*>(p.cand) + b * p.cand_stride_b +
         j * p.cand_stride_n;
}

// lanes that compute one dot product together (a 128-byte line of float16
// per pack round), so a warp scores 4 candidates at a time
constexpr int kDotLanes = 8;
constexpr int kDotsPerWarp = 32 / kDotLanes;

template <DType T, bool kVec>
__global__ void __launch_bounds__(kRelThreads, launch::kMinBlocksPerSm) rel_kernel(SamplingProblem p, float* __restrict__ rel,
                           unsigned long long* __restrict__ bad_candidate) {
  const int64_t b = blockIdx.x;
  const int lane = int(threadIdx.x & 31u), sub = lane % kDotLanes;
  const float* q = p.query + b * p.query_stride;
  const int64_t per_round = int64_t(blockDim.x / kDotLanes);
  // every lane of a warp runs the same number of rounds (the shuffles need all)
  for (int64_t j0 = int64_t(threadIdx.x / 32) * kDotsPerWarp; j0 < p.n; j0 += per_round) {
    const int64_t j = j0 + lane / kDotLanes;
    const bool active = j < p.n;
    const float s = group_dot<kDotLanes, kVec, DType::F32, T>(q, cand_row<T>(p, b, active ? j : 0), p.d,
                                                            sub, active);
    if (active && sub == 0) {
      rel[b * p.n + j] = s;
      const bool valid = p.mask == nullptr || p.mask[b * p.n + j] != 0;
      if (valid && !sampler::sampler_isfinite(s))
        atomicMin(bad_candidate, (unsigned long long)(b * p.n + j));
    }
  }
}

// Block = up to `warps` subsets of one question, warp w running subset
// sg * warps + w, where block i of the launch is (question b0 + i / groups,
// subset group sg = i % groups). Scratch slot of a warp: i * warps + w.
// __launch_bounds__: a block of 16 warps must fit the register file of every
// architecture (sm_80 gave sample_kernel<F32, true> 130 registers without
// it: 512 threads then need more than 65,536 and the launch fails; issue 55, C1).
template <DType T, bool kVec>
__global__ void __launch_bounds__(kSampleMaxWarps * 32, launch::kMinBlocksPerSm) sample_kernel(SamplingProblem p, const float* __restrict__ rel, int64_t block0, int64_t groups,
                              float* acc_all, uint8_t* elig_all, float* w_all,
                              unsigned long long* __restrict__ bad_score) {
  const WarpGroup g;
  const int warps = int(blockDim.x / 32), warp = int(threadIdx.x / 32);
  const int64_t blk = block0 + blockIdx.x;
  const int64_t b = blk / groups, s = (blk % groups) * warps + warp;
  if (s >= p.num_subsets) return;  // whole warps leave together
  const int lane = g.rank(), sub = lane % kDotLanes;
  const int64_t n = p.n, K = p.subset_size;
  const int64_t local = int64_t(blockIdx.x) * warps + warp;
  float* acc = acc_all + local * n;
  uint8_t* elig = elig_all + local * n;
  for (int64_t j = lane; j < n; j += 32) {
    acc[j] = 0.f;
    elig[j] = p.mask == nullptr ? 1 : (p.mask[b * n + j] != 0);
  }
  __syncwarp();
  const sampler::StepArgs a = sampler::step_args(p, b, s, rel + b * n, acc, elig, w_all + local * n);
  const int64_t out0 = (b * p.num_subsets + s) * K;
  for (int64_t t = 0; t < K; ++t) {
    const sampler::Draw dr = sampler::sample_step(g, a, t);
    if (dr.index == sampler::kNonFinite) {
      if (lane == 0) atomicMin(bad_score, (unsigned long long)b);
      for (int64_t r = t + lane; r < K; r += 32) p.ids_out[out0 + r] = -1;
      return;
    }
    if (lane == 0) {
      p.ids_out[out0 + t] = dr.index;
      if (p.logp_out) p.logp_out[out0 + t] = dr.logp;
      if (dr.index >= 0) elig[dr.index] = 0;
    }
    __syncwarp();
    if (dr.index < 0 || t + 1 == K) continue;
    const auto* ec = cand_row<T>(p, b, dr.index);
    for (int64_t j0 = 0; j0 < n; j0 += kDotsPerWarp) {
      const int64_t j = j0 + lane / kDotLanes;
      const bool active = j < n && elig[j];
      const float sim =
          group_dot<kDotLanes, kVec, T, T>(ec, cand_row<T>(p, b, active ? j : 0), p.d, sub, active);
      if (active && sub == 0) acc[j] += sim;
    }
    __syncwarp();
  }
}

template <DType T, bool kVec>
void launch_typed(const SamplingProblem& p, cudaStream_t stream, float* rel, uint8_t* scratch, const SamplePlan& plan,
                  unsigned long long* flags) {
  rel_kernel<T, kVec><<<unsigned(p.B), kRelThreads, 0, stream>>>(p, rel, flags);
  check(cudaGetLastError(), "sampler rel kernel");
  const int64_t n = p.n, slots = plan.chunk * plan.warps;
  float* acc = reinterpret_cast<float*>(scratch);
  float* w = acc + slots * n;
  uint8_t* elig = reinterpret_cast<uint8_t*>(w + slots * n);
  const int64_t groups = (p.num_subsets + plan.warps - 1) / plan.warps;
  for (int64_t i0 = 0; i0 < plan.blocks; i0 += plan.chunk) {
    const int64_t m = std::min(plan.chunk, plan.blocks - i0);
    sample_kernel<T, kVec><<<unsigned(m), unsigned(plan.warps * 32), 0, stream>>>(p, rel, i0, groups, acc, elig, w,
                                                                                  flags + 1);
    check(cudaGetLastError(), "sampler kernel");
  }
}

template <DType T>
void launch(const SamplingProblem& p, cudaStream_t stream, float* rel, uint8_t* scratch, const SamplePlan& plan,
            unsigned long long* flags) {
  const int64_t es = int64_t(sizeof(typename Storage<T>::type));
  const bool vec = aligned16(p.cand, es, p.cand_stride_n, p.cand_stride_b) &&
                   aligned16(p.query, 4, p.query_stride);
  if (vec) return launch_typed<T, true>(p, stream, rel, scratch, plan, flags);
  launch_typed<T, false>(p, stream, rel, scratch, plan, flags);
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
  const SamplePlan plan = sample_plan(p.B, n, p.num_subsets);
  float* rel = nullptr;
  uint8_t* scratch = nullptr;
  unsigned long long* flags = nullptr;
  scratch_alloc(&rel, size_t(p.B * n), stream);
  scratch_alloc(&scratch, size_t(plan.chunk * plan.per_block_bytes), stream);
  scratch_alloc(&flags, 2, stream);
  check(cudaMemsetAsync(flags, 0xff, 2 * sizeof(unsigned long long), stream), "cudaMemsetAsync");
  switch (p.cand_dtype) {
    case DType::F32: launch<DType::F32>(p, stream, rel, scratch, plan, flags); break;
    case DType::F16: launch<DType::F16>(p, stream, rel, scratch, plan, flags); break;
    case DType::BF16: launch<DType::BF16>(p, stream, rel, scratch, plan, flags); break;
  }
  unsigned long long host_flags[2];
  check(cudaMemcpyAsync(host_flags, flags, sizeof host_flags, cudaMemcpyDeviceToHost, stream), "cudaMemcpyAsync");
  scratch_free(rel, stream);
  scratch_free(scratch, stream);
  scratch_free(flags, stream);
  check(cudaStreamSynchronize(stream), "sampler kernels");
  const unsigned long long none = ~0ull;
  if (host_flags[0] != none)
    return SamplingResult{SamplingStatus::NonFiniteCandidate, int64_t(host_flags[0] / uint64_t(n)),
                          int64_t(host_flags[0] % uint64_t(n))};
  if (host_flags[1] != none) return SamplingResult{SamplingStatus::NonFiniteScore, int64_t(host_flags[1]), -1};
  return ok;
}

}  // namespace rcn_fast::cuda
