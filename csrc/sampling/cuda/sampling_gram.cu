// The Gram sampler on CUDA (sampling/cuda/sampling_gram.h). Block b (256
// threads, 8 warps) is question b:
//
//   1. the question's candidates E [n, d] pass through shared memory in
//      slices of 64 columns (one read of the inputs from HBM): every slice
//      adds to the Gram matrix G = E E^T (float16/bfloat16: mma.m16n8k16
//      tiles of 16 x 8, each warp its tiles, accumulators in registers;
//      float32: each thread an RG x RG register tile of FMAs, RG = npad /
//      16 rounded up to 1, 2, 4 or 8, so a small question does not compute
//      an 8 x 8 tile of zeros: issue 55, S7) and thread j < n
//      adds to rel_j = dot(e_q, e_j) (FMAs in column order);
//   2. G and rel go to shared memory; a relevance that is not finite for a
//      valid candidate flags the question (as the warp sampler does);
//   3. warp w runs subsets w, w + 8, ... (sampling/sampling_gram.h
//      run_subset: subset_sampler.h's steps, acc_j += G[c][j]).
//
// The warp sampler (sampling/cuda/sampling.cu, version 2) read a question's
// n candidates once a step and subset, 36 times at N = 9, K = 5: 55 GB of
// L1/L2 traffic at B = 10,000 in float16, where one read of the inputs is
// 1.5 GB; here that read is all.
#include "sampling/cuda/sampling_gram.h"

#include <algorithm>

#include "sampling/cuda/sampling_launch.h"

#include "common/cuda/mma.cuh"
#include "common/cuda/runtime.h"
#include "common/cuda/vec_load.cuh"
#include "sampling/cuda/warp_group.cuh"
#include "sampling/sampling_gram.h"

namespace rcn_fast::cuda {
namespace {

namespace gm = gram;

// block size and shared memory: sampling/cuda/sampling_launch.h
constexpr int kThreads = kGramThreads;
constexpr int kWarps = kGramWarps;
constexpr int kTilesPerWarp = (gm::kMaxN / 16) * (gm::kMaxN / 8) / kWarps;  // 16
constexpr int kLdF32 = kGramLdF32;
constexpr int kLdHalf = kGramLdHalf;

template <DType T>
constexpr int stage_ld() { return T == DType::F32 ? kLdF32 : kLdHalf; }

struct WarpSync {
  __device__ void operator()() const { __syncwarp(); }
};

// The origin of warp `warp`'s ti-th tile of G; false past the last tile.
__device__ __forceinline__ bool warp_tile(int warp, int ti, int npad, int* i0, int* j0) {
  const int tile = warp + ti * kWarps;
  if (tile >= gm::tiles(npad)) return false;
  gm::tile_origin(tile, npad, i0, j0);
  return true;
}

// RG: the float32 register tile's rows (and columns), npad <= 16 RG (1 for float16/bfloat16).
template <DType T, bool kVec, int RG>
__global__ void __launch_bounds__(kThreads, launch::kMinBlocksPerSm) gram_kernel(SamplingProblem p, int npad, unsigned long long* flags) {
  using S = typename Storage<T>::type;
  extern __shared__ __align__(16) unsigned char smem[];
  float* G = reinterpret_cast<float*>(smem);
  float* rel = G + size_t(npad) * npad;
  float* qs = rel + npad;
  S* stage = reinterpret_cast<S*>(qs + gm::kSlice);
  float* acc_all = reinterpret_cast<float*>(stage + size_t(npad) * stage_ld<T>());
  float* w_all = acc_all + kWarps * npad;
  uint8_t* elig_all = reinterpret_cast<uint8_t*>(w_all + kWarps * npad);
  const int64_t b = blockIdx.x, n = p.n, d = p.d;
  const int tid = int(threadIdx.x), warp = tid / 32, lane = tid & 31;
  const S* base = static_cast<const S*>(p.cand) + b * p.cand_stride_b;
  const float* q = p.query + b * p.query_stride;
  float relacc = 0.f;
  float c[T == DType::F32 ? 1 : kTilesPerWarp][4] = {};
  float f[RG][RG] = {};
  const int tr = tid / 16, tc = tid % 16;  // float32: rows tr + 16 i, columns tc + 16 j
  for (int64_t k0 = 0; k0 < d; k0 += gm::kSlice) {
    __syncthreads();  // the previous slice is consumed
    if constexpr (kVec) {  // 16-byte loads of 8 elements (d % 8 == 0, rows 16-byte aligned)
      constexpr int per = 8;
      for (int idx = tid; idx < npad * (gm::kSlice / per); idx += kThreads) {
        const int r = idx / (gm::kSlice / per), cc = (idx % (gm::kSlice / per)) * per;
        const int64_t k = k0 + cc;
        S v[per];
        if (r < n && k < d) {
          const S* src = base + r * p.cand_stride_n + k;
          if constexpr (T == DType::F32) {
            const float4 a = __ldg(reinterpret_cast<const float4*>(src)), e = __ldg(reinterpret_cast<const float4*>(src) + 1);
            v[0] = a.x; v[1] = a.y; v[2] = a.z; v[3] = a.w; v[4] = e.x; v[5] = e.y; v[6] = e.z; v[7] = e.w;
          } else {
            const uint4 a = __ldg(reinterpret_cast<const uint4*>(src));
            const uint32_t wv[4] = {a.x, a.y, a.z, a.w};
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              v[2 * e] = uint16_t(wv[e] & 0xFFFFu);
              v[2 * e + 1] = uint16_t(wv[e] >> 16);
            }
          }
        } else {
#pragma unroll
          for (int e = 0; e < per; ++e) v[e] = S(0);
        }
#pragma unroll
        for (int e = 0; e < per; ++e) stage[r * stage_ld<T>() + cc + e] = v[e];
      }
    } else {
      for (int idx = tid; idx < npad * gm::kSlice; idx += kThreads) {
        const int r = idx / gm::kSlice, cc = idx % gm::kSlice;
        const int64_t k = k0 + cc;
        stage[r * stage_ld<T>() + cc] = (r < n && k < d) ? base[r * p.cand_stride_n + k] : S(0);
      }
    }
    for (int i = tid; i < gm::kSlice; i += kThreads) qs[i] = k0 + i < d ? q[k0 + i] : 0.f;
    __syncthreads();
    if (tid < n)
      for (int cc = 0; cc < gm::kSlice; ++cc)
        relacc = fmaf(load_as_float<T>(stage + tid * stage_ld<T>() + cc), qs[cc], relacc);
    if constexpr (T == DType::F32) {
      for (int cc = 0; cc < gm::kSlice; ++cc) {
        float a[RG], bb[RG];
#pragma unroll
        for (int i = 0; i < RG; ++i) a[i] = tr + 16 * i < npad ? stage[(tr + 16 * i) * kLdF32 + cc] : 0.f;
#pragma unroll
        for (int j = 0; j < RG; ++j) bb[j] = tc + 16 * j < npad ? stage[(tc + 16 * j) * kLdF32 + cc] : 0.f;
#pragma unroll
        for (int i = 0; i < RG; ++i)
#pragma unroll
          for (int j = 0; j < RG; ++j) f[i][j] = fmaf(a[i], bb[j], f[i][j]);
      }
    } else {
      const uint16_t* e = reinterpret_cast<const uint16_t*>(stage);
#pragma unroll
      for (int ti = 0; ti < kTilesPerWarp; ++ti) {
        int i0, j0;
        if (!warp_tile(warp, ti, npad, &i0, &j0)) break;
#pragma unroll
        for (int kk = 0; kk < gm::kSlice; kk += 16) {
          uint32_t a[4], bfr[2];
          gm::fragment_a(lane, e, i0, kk, a);
          gm::fragment_b(lane, e, j0, kk, bfr);
          mma16816<T>(c[ti], a[0], a[1], a[2], a[3], bfr[0], bfr[1]);
        }
      }
    }
  }
  if constexpr (T == DType::F32) {
#pragma unroll
    for (int i = 0; i < RG; ++i)
#pragma unroll
      for (int j = 0; j < RG; ++j)
        if (tr + 16 * i < npad && tc + 16 * j < npad) G[(tr + 16 * i) * npad + tc + 16 * j] = f[i][j];
  } else {
#pragma unroll
    for (int ti = 0; ti < kTilesPerWarp; ++ti) {
      int i0, j0;
      if (!warp_tile(warp, ti, npad, &i0, &j0)) break;
      gm::store_c(lane, c[ti], G, npad, i0, j0);
    }
  }
  if (tid < n) {
    rel[tid] = relacc;
    const bool valid = p.mask == nullptr || p.mask[b * n + tid] != 0;
    if (valid && !sampler::sampler_isfinite(relacc)) atomicMin(flags, (unsigned long long)(b * n + tid));
  }
  __syncthreads();
  const WarpGroup g;
  const WarpSync sync;
  for (int64_t s = warp; s < p.num_subsets; s += kWarps)
    if (!gm::run_subset(g, sync, p, b, s, rel, G, npad, acc_all + warp * npad, elig_all + warp * npad,
                        w_all + warp * npad) && lane == 0)
      atomicMin(flags + 1, (unsigned long long)b);
}

template <DType T, bool kVec, int RG>
void launch_typed(const SamplingProblem& p, int npad, unsigned long long* flags, cudaStream_t stream) {
  const size_t bytes = gram_smem(T, npad);
  auto kern = gram_kernel<T, kVec, RG>;
  check(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)), "cudaFuncSetAttribute");
  kern<<<unsigned(p.B), kThreads, bytes, stream>>>(p, npad, flags);  // one block a question
  check(cudaGetLastError(), "sampler Gram kernel");
}

template <DType T>
void launch(const SamplingProblem& p, int npad, unsigned long long* flags, cudaStream_t stream) {
  const int64_t es = int64_t(sizeof(typename Storage<T>::type));
  const bool vec = p.d % 8 == 0 && aligned16(p.cand, es, p.cand_stride_n, p.cand_stride_b);
  if constexpr (T == DType::F32) {
    switch (gram_f32_tile(npad)) {  // the register tile covers npad rows (sampling_launch.h)
      case 1: return vec ? launch_typed<T, true, 1>(p, npad, flags, stream) : launch_typed<T, false, 1>(p, npad, flags, stream);
      case 2: return vec ? launch_typed<T, true, 2>(p, npad, flags, stream) : launch_typed<T, false, 2>(p, npad, flags, stream);
      case 4: return vec ? launch_typed<T, true, 4>(p, npad, flags, stream) : launch_typed<T, false, 4>(p, npad, flags, stream);
      default: return vec ? launch_typed<T, true, 8>(p, npad, flags, stream) : launch_typed<T, false, 8>(p, npad, flags, stream);
    }
  } else {
    if (vec) return launch_typed<T, true, 1>(p, npad, flags, stream);
    launch_typed<T, false, 1>(p, npad, flags, stream);
  }
}

}  // namespace

const char* sample_subsets_gram_unsupported(const SamplingProblem& p) {
  if (p.n > gm::kMaxN) return "more than 128 candidates a question (the Gram matrix lives in shared memory)";
  if (p.B > 0x7FFFFFFF) return "more than 2^31 - 1 questions in one call";
  if (p.cand_dtype != DType::F32) {
    int dev = 0, major = 0;
    check(cudaGetDevice(&dev), "cudaGetDevice");
    check(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev), "cudaDeviceGetAttribute");
    if (major < 8) return "compute capability below 8.0 (tensor cores for float16/bfloat16)";
  }
  return nullptr;
}

SamplingResult sample_subsets_gram_cuda(const SamplingProblem& p, cudaStream_t stream) {
  SamplingResult ok{SamplingStatus::Ok, -1, -1};
  const int64_t items = p.B * p.num_subsets;
  if (items == 0 || p.subset_size == 0) return ok;
  if (p.n == 0) {
    check(cudaMemsetAsync(p.ids_out, 0xff, size_t(items * p.subset_size) * sizeof(int64_t), stream), "cudaMemsetAsync");
    if (p.logp_out)
      check(cudaMemsetAsync(p.logp_out, 0, size_t(items * p.subset_size) * sizeof(float), stream), "cudaMemsetAsync");
    return ok;
  }
  const int npad = gm::padded_rows(p.n);
  unsigned long long* flags = nullptr;
  scratch_alloc(&flags, 2, stream);
  check(cudaMemsetAsync(flags, 0xff, 2 * sizeof(unsigned long long), stream), "cudaMemsetAsync");
  switch (p.cand_dtype) {
    case DType::F32: launch<DType::F32>(p, npad, flags, stream); break;
    case DType::F16: launch<DType::F16>(p, npad, flags, stream); break;
    case DType::BF16: launch<DType::BF16>(p, npad, flags, stream); break;
  }
  unsigned long long host_flags[2];
  check(cudaMemcpyAsync(host_flags, flags, sizeof host_flags, cudaMemcpyDeviceToHost, stream), "cudaMemcpyAsync");
  scratch_free(flags, stream);
  check(cudaStreamSynchronize(stream), "sampler Gram kernel");
  const unsigned long long none = ~0ull;
  if (host_flags[0] != none)
    return SamplingResult{SamplingStatus::NonFiniteCandidate, int64_t(host_flags[0] / uint64_t(p.n)),
                          int64_t(host_flags[0] % uint64_t(p.n))};
  if (host_flags[1] != none) return SamplingResult{SamplingStatus::NonFiniteScore, int64_t(host_flags[1]), -1};
  return ok;
}

}  // namespace rcn_fast::cuda
