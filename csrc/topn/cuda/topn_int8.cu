// The int8 bounded scan on CUDA (topn/cuda/topn_int8.h). A block of 256
// threads holds the two int8 terms of up to 8 queries in shared memory and
// walks rows in a grid-stride loop, 8 lanes a row (32 rows a block a step):
// lane l of a row reads 16-byte chunks l, l + 8, ... (consecutive lanes,
// consecutive bytes), feeds each 4-byte word to __dp4a for both terms of
// every query, and the 8 lanes' exact int32 sums are added by shuffles;
// the row's first lane writes the intervals (topn/topn_int8.h).
#include "topn/cuda/topn_int8.h"

#include <algorithm>
#include <cstdint>
#include <stdexcept>

#include "common/cuda/runtime.h"
#include "topn/cuda/topn_launch.h"
#include "topn/topn_int8.h"

namespace rcn_fast::cuda {
namespace {

// block size, groups, shared memory and grid: topn/cuda/topn_launch.h
constexpr int kThreads = kInt8Threads;
constexpr int kLanes = kInt8Lanes;

// Block (x, y) scans rows for query group group0 + y.
template <int G>
__global__ void __launch_bounds__(kThreads, launch::kMinBlocksPerSm) int8_kernel(TopnInt8Problem p, int64_t group0) {
  extern __shared__ __align__(16) unsigned char smem[];
  const int64_t words = p.width / 4, chunks = p.width / 16;
  int32_t* sq = reinterpret_cast<int32_t*>(smem);                         // [G][2][words]
  float* sp = reinterpret_cast<float*>(sq + size_t(G) * 2 * words);       // [G][kQueryParams]
  const int64_t q0 = (group0 + int64_t(blockIdx.y)) * G;
  const int nq = p.Q - q0 < G ? int(p.Q - q0) : G;
  const int32_t* qwords = reinterpret_cast<const int32_t*>(p.qcodes + q0 * 2 * p.width);
  for (int64_t i = threadIdx.x; i < int64_t(nq) * 2 * words; i += kThreads) sq[i] = qwords[i];
  for (int i = threadIdx.x; i < nq * topn_int8::kQueryParams; i += kThreads)
    sp[i] = p.qparams[q0 * topn_int8::kQueryParams + i];
  __syncthreads();
  const int sub = int(threadIdx.x % kLanes);
  const int64_t rows_per_step = int64_t(gridDim.x) * (kThreads / kLanes);
  // every lane of a warp runs the same number of steps (the shuffles need all)
  const int64_t steps = (p.N + rows_per_step - 1) / rows_per_step;
  for (int64_t step = 0; step < steps; ++step) {
    const int64_t j = step * rows_per_step + int64_t(blockIdx.x) * (kThreads / kLanes) + threadIdx.x / kLanes;
    const bool active = j < p.N;
    int32_t i1[G], i2[G];
#pragma unroll
    for (int g = 0; g < G; ++g) i1[g] = i2[g] = 0;
    if (active) {
      const int4* row = reinterpret_cast<const int4*>(p.codes + j * p.width);
      for (int64_t c = sub; c < chunks; c += kLanes) {
        const int4 v = __ldg(row + c);
        const int32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int g = 0; g < G; ++g) {
          if (g >= nq) break;
          const int32_t* a = sq + size_t(g) * 2 * words + 4 * c;
          const int32_t* b = a + words;
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            i1[g] = __dp4a(w[e], a[e], i1[g]);
            i2[g] = __dp4a(w[e], b[e], i2[g]);
          }
        }
      }
    }
#pragma unroll
    for (int g = 0; g < G; ++g) {
#pragma unroll
      for (int o = kLanes / 2; o > 0; o >>= 1) {
        i1[g] += __shfl_xor_sync(0xffffffffu, i1[g], o);
        i2[g] += __shfl_xor_sync(0xffffffffu, i2[g], o);
      }
    }
    if (active && sub == 0) {
      const float* rb = p.rows + j * topn_int8::kRowBounds;
      const float r[3] = {rb[0], rb[1], rb[2]};
#pragma unroll
      for (int g = 0; g < G; ++g) {
        if (g >= nq) break;
        const int64_t at = (q0 + g) * p.ld + j;
        topn_int8::interval(i1[g], i2[g], sp + g * topn_int8::kQueryParams, r, p.lo + at, p.hi + at);
      }
    }
  }
}

template <int G>
void launch(const TopnInt8Problem& p, cudaStream_t stream) {
  int dev = 0, sms = 0;
  check(cudaGetDevice(&dev), "cudaGetDevice");
  check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev), "cudaDeviceGetAttribute");
  const size_t smem = int8_smem(G, p.width);
  // query groups in y, at most 65,535 a launch (topn_launch.h)
  for (const launch::Grid& g : int8_launches(p.Q, p.N, sms)) {
    int8_kernel<G><<<dim3(unsigned(g.x), unsigned(g.y)), kThreads, smem, stream>>>(p, g.y0);
    check(cudaGetLastError(), "topn int8 kernel");
  }
}

}  // namespace

void topn_int8_intervals_cuda(const TopnInt8Problem& p, cudaStream_t stream) {
  if (p.width % 16 != 0 || p.width > topn_int8::kMaxWidth)
    throw std::invalid_argument("codes: expected a width that is a multiple of 16 and at most 1032");
  if (p.Q == 0 || p.N == 0) return;
  if (reinterpret_cast<uintptr_t>(p.codes) % 16 != 0 || reinterpret_cast<uintptr_t>(p.qcodes) % 4 != 0)
    throw std::invalid_argument("codes, qcodes: expected 16- and 4-byte aligned base addresses");
  switch (int8_group(p.Q)) {
    case 1: return launch<1>(p, stream);
    case 2: return launch<2>(p, stream);
    case 4: return launch<4>(p, stream);
    default: return launch<kInt8MaxGroup>(p, stream);
  }
}

}  // namespace rcn_fast::cuda
