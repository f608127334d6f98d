// Exact top-n on tensor cores for float16/bfloat16 corpora (issue 35): the
// corpus is streamed once per query group with 16-byte loads straight into
// mma fragments, scored with mma.sync m16n8k16 (corpus-dtype inputs, float32
// accumulation: every product is exact, the sums are float32), and every
// score is offered at once to a per-query running selection in shared
// memory (topn/topn_select.h: threshold, buffer, bitonic flushes), so the
// [Q, N] score matrix is never written. Each block scans one slice of the
// corpus for one group of up to 32 queries and writes its k best per query;
// a merge kernel (one block per query, the same selection) makes the final
// list (topn/cuda/topn_block_select.h). A float32 query is split into two (float16) or three (bfloat16)
// terms of the corpus dtype (topn/topn_select.h), each scored as a column
// of the GEMM and summed in float32, smallest term first. (A corpus value of
// +-inf times a zero term is NaN: with a split query such a row's score is
// NaN, never returned, where the float32 product would be +-inf. The launcher
// does not look for non-finite corpus values: a pass over the corpus would
// cost as much as the scan.)
//
// Fragment layout (PTX ISA, mma.m16n8k16, .row.col): lane = 4 * g + t. A
// 64-element depth step of a 16-row tile is read as 16 contiguous elements
// per lane and row (rows g and g + 8, columns 16 t .. 16 t + 15: two 16-byte
// loads each), and its four k16 sub-steps use elements 4 s .. 4 s + 3: the
// same physical columns for the query fragment (query row g of the tile's
// 8 columns), so the mma sums exactly the products of the 64 columns, in a
// permuted order.
#include <cuda_runtime.h>

#include <algorithm>
#include <stdexcept>

#include "topn/topn_select.h"
#include "common/cuda/lane_groups.cuh"
#include "common/cuda/mma.cuh"
#include "common/cuda/runtime.h"
#include "topn/cuda/topn_block_select.h"
#include "topn/cuda/topn_mma.h"
#include "common/cuda/vec_load.cuh"

namespace rcn_fast::cuda {
namespace {

namespace ts = topn_select;

// block size, shared memory and grid: topn/cuda/topn_launch.h
constexpr int kWarps = kScanWarps;
constexpr int kTile = kScanTile;
constexpr int kDepth = kScanDepth;
constexpr int kQPad = kScanQPad;

__device__ __forceinline__ uint4 load16_or_zero(const uint16_t* p, bool ok) {
  return ok ? __ldg(reinterpret_cast<const uint4*>(p)) : make_uint4(0u, 0u, 0u, 0u);
}

struct ScanArgs {
  const uint16_t* corpus;  // [N, stride] float16/bfloat16 bits, 16-byte aligned rows
  int64_t stride, N;
  int d, dpad;              // dpad: d rounded up to kDepth
  const uint16_t* terms;    // [T, Q, dpad]
  const float* scales;      // [T, Q]
  int64_t Q;
  int qsel;                 // selections a block keeps: min(8 NT, Q) (the same for every block)
  int k;
  int64_t slice_rows;       // a multiple of the round's rows
  int tiles_per_warp;       // tiles a warp scores each round
  float* part_s;            // [S, Q, k]
  int64_t* part_i;
};

template <DType CT, int NT, int TERMS>
__global__ void __launch_bounds__(kScanThreads, launch::kMinBlocksPerSm) scan_kernel(ScanArgs a) {
  constexpr int QB = 8 * NT;
  extern __shared__ __align__(16) unsigned char smem[];
  const int qstride = a.dpad + kQPad;
  uint16_t* sq = reinterpret_cast<uint16_t*>(smem);                                  // [TERMS][QB][qstride]
  float* sscale = reinterpret_cast<float*>(sq + size_t(TERMS) * QB * qstride);       // [TERMS][QB]
  auto* runs = reinterpret_cast<ts::Run<uint32_t>*>(sscale + TERMS * QB);            // [qsel]
  const ts::Layout L = ts::layout(a.k, kWarps * kTile * a.tiles_per_warp);
  float* sel_s = reinterpret_cast<float*>(runs + a.qsel);                             // [qsel][slots]
  uint32_t* sel_i = reinterpret_cast<uint32_t*>(sel_s + size_t(a.qsel) * L.slots);   // [qsel][slots]

  const int warp = int(threadIdx.x / 32), lane = int(threadIdx.x & 31u), g = lane >> 2, t = lane & 3;
  const int64_t q0 = int64_t(blockIdx.y) * QB;
  const int64_t r0 = int64_t(blockIdx.x) * a.slice_rows, r1 = min(a.N, r0 + a.slice_rows);

  // the group's query terms (zero rows past Q) and scales
  const int chunks = a.dpad / 8;
  for (int i = threadIdx.x; i < TERMS * QB * chunks; i += blockDim.x) {
    const int c = i % chunks, row = i / chunks, tq = row / QB, ql = row % QB;
    const int64_t q = q0 + ql;
    uint4 v = make_uint4(0u, 0u, 0u, 0u);
    if (q < a.Q) v = *reinterpret_cast<const uint4*>(a.terms + (tq * a.Q + q) * a.dpad + c * 8);
    *reinterpret_cast<uint4*>(sq + size_t(row) * qstride + c * 8) = v;
  }
  for (int i = threadIdx.x; i < TERMS * QB; i += blockDim.x) {
    const int tq = i / QB, ql = i % QB;
    sscale[i] = q0 + ql < a.Q ? a.scales[tq * a.Q + q0 + ql] : 0.f;
  }
  for (int i = threadIdx.x; i < a.qsel; i += blockDim.x) ts::init(runs[i]);
  __syncthreads();

  const WarpG wg;
  const int round_rows = L.round;
  for (int64_t rb = r0; rb < r1; rb += round_rows) {
    for (int tile = 0; tile < a.tiles_per_warp; ++tile) {
      const int64_t row0 = rb + int64_t(tile * kWarps + warp) * kTile;
      if (row0 >= r1) break;  // the warp's remaining tiles are past the slice (uniform per warp)
      const int64_t ra = row0 + g, rc = row0 + g + 8;
      const bool va = ra < r1, vc = rc < r1;
      const uint16_t* pa = a.corpus + (va ? ra : r0) * a.stride;
      const uint16_t* pc = a.corpus + (vc ? rc : r0) * a.stride;
      float acc[TERMS * NT][4];
#pragma unroll
      for (int i = 0; i < TERMS * NT; ++i) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.f;
      for (int ks = 0; ks < a.dpad; ks += kDepth) {
        const int col = ks + t * 16;
        const bool c0 = col < a.d, c1 = col + 8 < a.d;  // d % 8 == 0: whole 16-byte chunks
        const uint4 xa0 = load16_or_zero(pa + col, va && c0), xa1 = load16_or_zero(pa + col + 8, va && c1);
        const uint4 xc0 = load16_or_zero(pc + col, vc && c0), xc1 = load16_or_zero(pc + col + 8, vc && c1);
        const uint32_t wa[8] = {xa0.x, xa0.y, xa0.z, xa0.w, xa1.x, xa1.y, xa1.z, xa1.w};
        const uint32_t wc[8] = {xc0.x, xc0.y, xc0.z, xc0.w, xc1.x, xc1.y, xc1.z, xc1.w};
#pragma unroll
        for (int tq = 0; tq < TERMS; ++tq) {
#pragma unroll
          for (int j = 0; j < NT; ++j) {
            const uint16_t* b = sq + size_t(tq * QB + 8 * j + g) * qstride + col;
            const uint4 b0 = *reinterpret_cast<const uint4*>(b), b1 = *reinterpret_cast<const uint4*>(b + 8);
            const uint32_t wb[8] = {b0.x, b0.y, b0.z, b0.w, b1.x, b1.y, b1.z, b1.w};
#pragma unroll
            for (int s = 0; s < 4; ++s)
              mma16816<CT>(acc[tq * NT + j], wa[2 * s], wc[2 * s], wa[2 * s + 1], wc[2 * s + 1], wb[2 * s],
                           wb[2 * s + 1]);
          }
        }
      }
      // acc[.][e]: row row0 + g + 8 (e >> 1), query column 8 j + 2 t + (e & 1)
#pragma unroll
      for (int j = 0; j < NT; ++j) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int64_t row = (e >> 1) ? rc : ra;
          const int ql = 8 * j + 2 * t + (e & 1);
          if (row >= r1 || q0 + ql >= a.Q) continue;
          float score = acc[(TERMS - 1) * NT + j][e] * sscale[(TERMS - 1) * QB + ql];
#pragma unroll
          for (int tq = TERMS - 2; tq >= 0; --tq) score += acc[tq * NT + j][e] * sscale[tq * QB + ql];
          ts::offer(wg, runs[ql], sel_s + size_t(ql) * L.slots, sel_i + size_t(ql) * L.slots, L, score,
                    uint32_t(row - r0));
        }
      }
    }
    __syncthreads();
    for (int ql = warp; ql < a.qsel; ql += kWarps)
      if (ts::needs_flush(runs[ql], L))
        ts::flush(wg, runs[ql], sel_s + size_t(ql) * L.slots, sel_i + size_t(ql) * L.slots, L);
    __syncthreads();
  }
  for (int ql = warp; ql < a.qsel; ql += kWarps) {
    const int64_t q = q0 + ql;
    if (q >= a.Q) continue;
    const size_t at = size_t((int64_t(blockIdx.x) * a.Q + q) * a.k);
    ts::finish(wg, runs[ql], sel_s + size_t(ql) * L.slots, sel_i + size_t(ql) * L.slots, L, a.part_s + at,
               a.part_i + at, r0);
  }
}

// Query terms [T, Q, dpad] (zero padded) and scales [T, Q]: one block a row.
template <DType CT>
__global__ void __launch_bounds__(kSplitThreads, launch::kMinBlocksPerSm) split_kernel(const void* __restrict__ queries, DType qt, int64_t qstride, int64_t Q, int d,
                             int dpad, uint16_t* __restrict__ terms, float* __restrict__ scales) {
  const int64_t r = blockIdx.x;
  const ts::SplitSpec sp = ts::split_spec(CT, qt);
  __shared__ float red[32];
  if (qt == CT) {  // one term: the bits as they are
    const uint16_t* row = static_cast<const uint16_t*>(queries) + r * qstride;
    for (int e = threadIdx.x; e < dpad; e += blockDim.x) terms[r * dpad + e] = e < d ? row[e] : uint16_t(0);
    if (threadIdx.x == 0) scales[r] = 1.0f;
    return;
  }
  const float* row = static_cast<const float*>(queries) + r * qstride;
  float m = 0.f;
  for (int e = threadIdx.x; e < d; e += blockDim.x) m = fmaxf(m, ts::finite_magnitude(row[e]));
  for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
  if ((threadIdx.x & 31u) == 0) red[threadIdx.x / 32] = m;
  __syncthreads();
  if (threadIdx.x < 32) {
    float v = threadIdx.x < blockDim.x / 32 ? red[threadIdx.x] : 0.f;
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    if (threadIdx.x == 0) red[0] = v;
  }
  __syncthreads();
  const float scale = ts::split_row_scale(red[0]);
  for (int e = threadIdx.x; e < dpad; e += blockDim.x) {
    uint16_t* out = terms + r * dpad + e;
    if (e < d) {
      ts::split_value<CT>(row[e] / scale, sp, out, Q * dpad);
    } else {
      for (int tq = 0; tq < sp.terms; ++tq) out[tq * Q * dpad] = 0;
    }
  }
  if (threadIdx.x == 0)
    for (int tq = 0; tq < sp.terms; ++tq) scales[tq * Q + r] = scale * ts::pow2f(-sp.shift * tq);
}

int device_optin_smem() {
  int dev = 0, v = 0;
  check(cudaGetDevice(&dev), "cudaGetDevice");
  check(cudaDeviceGetAttribute(&v, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev), "cudaDeviceGetAttribute");
  return v;
}

template <DType CT, int NT, int TERMS>
void launch_scan(const ScanArgs& a, const ScanConfig& c, int64_t S, int64_t groups, cudaStream_t stream) {
  auto kern = scan_kernel<CT, NT, TERMS>;
  check(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, int(c.smem)),
        "cudaFuncSetAttribute");
  kern<<<dim3(unsigned(S), unsigned(groups)), kScanThreads, c.smem, stream>>>(a);
}

template <DType CT, int TERMS>
void launch_scan_nt(const ScanArgs& a, const ScanConfig& c, int64_t S, int64_t groups, cudaStream_t stream) {
  if (c.nt == 4) return launch_scan<CT, 4, TERMS>(a, c, S, groups, stream);
  if (c.nt == 2) return launch_scan<CT, 2, TERMS>(a, c, S, groups, stream);
  launch_scan<CT, 1, TERMS>(a, c, S, groups, stream);
}

template <DType CT>
void run_typed(const TopnProblem& p, cudaStream_t stream) {
  const ts::SplitSpec sp = ts::split_spec(CT, p.query_dtype);
  const int d = int(p.d), dpad = (d + kDepth - 1) / kDepth * kDepth;
  const ScanConfig c = scan_config(p.Q, p.k, sp.terms, dpad, device_optin_smem());
  if (c.nt == 0) throw std::logic_error("topn_mma: no configuration fits (topn_mma_unsupported said it fits)");
  const int qb = 8 * c.nt;
  int dev = 0, sms = 0;
  check(cudaGetDevice(&dev), "cudaGetDevice");
  check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev), "cudaDeviceGetAttribute");
  const ScanGrid grid = scan_grid(p.N, p.Q, p.k, c, sms);
  const int64_t S = grid.S, groups = grid.groups, slice = grid.slice;

  uint16_t* terms = nullptr;
  float *scales = nullptr, *part_s = nullptr;
  int64_t* part_i = nullptr;
  scratch_alloc(&terms, size_t(sp.terms * p.Q * dpad), stream);
  scratch_alloc(&scales, size_t(sp.terms * p.Q), stream);
  scratch_alloc(&part_s, size_t(S * p.Q * p.k), stream);
  scratch_alloc(&part_i, size_t(S * p.Q * p.k), stream);
  topn_split_queries_cuda(p.queries, p.query_dtype, p.query_stride, p.Q, d, dpad, CT, terms, scales, stream);

  ScanArgs a{};
  a.corpus = static_cast<const uint16_t*>(p.corpus);
  a.stride = p.corpus_stride;
  a.N = p.N;
  a.d = d;
  a.dpad = dpad;
  a.terms = terms;
  a.scales = scales;
  a.Q = p.Q;
  a.qsel = int(std::min<int64_t>(qb, p.Q));
  a.k = int(p.k);
  a.slice_rows = slice;
  a.tiles_per_warp = c.tiles;
  a.part_s = part_s;
  a.part_i = part_i;
  if (sp.terms == 1) launch_scan_nt<CT, 1>(a, c, S, groups, stream);
  else if (sp.terms == 2) launch_scan_nt<CT, 2>(a, c, S, groups, stream);
  else launch_scan_nt<CT, 3>(a, c, S, groups, stream);
  check(cudaGetLastError(), "topn scan kernel");

  topn_merge_lists_cuda(part_s, part_i, S, p.Q, p.k, p.scores_out, p.ids_out, stream);
  scratch_free(terms, stream);
  scratch_free(scales, stream);
  scratch_free(part_s, stream);
  scratch_free(part_i, stream);
}

}  // namespace

const char* topn_mma_unsupported(const TopnProblem& p) {
  if (p.corpus_dtype == DType::F32) return "float32 corpus (the tensor-core scan takes float16/bfloat16)";
  if (p.k > kTopnMmaMaxK) return "k above the tensor-core scan's limit";
  if (p.d < 1 || p.d % 8 != 0) return "d is not a multiple of 8";
  if (p.N < 1 || p.Q < 1) return "empty input";
  if (p.Q > int64_t(65535) * 8) return "more than 524,280 queries in one call";
  if (!aligned16(p.corpus, 2, p.corpus_stride)) return "corpus rows are not 16-byte aligned";
  int dev = 0, major = 0;
  check(cudaGetDevice(&dev), "cudaGetDevice");
  check(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev), "cudaDeviceGetAttribute");
  if (major < 8) return "compute capability below 8.0";
  const ts::SplitSpec sp = ts::split_spec(p.corpus_dtype, p.query_dtype);
  const int dpad = int((p.d + kDepth - 1) / kDepth * kDepth);
  if (scan_config(p.Q, p.k, sp.terms, dpad, device_optin_smem()).nt == 0) return "queries too wide for shared memory";
  return nullptr;
}

void topn_split_queries_cuda(const void* queries, DType query_dtype, int64_t query_stride, int64_t Q, int d, int dpad,
                             DType corpus_dtype, uint16_t* terms, float* scales, cudaStream_t stream) {
  if (Q == 0) return;
  if (corpus_dtype == DType::F16)
    split_kernel<DType::F16><<<unsigned(Q), kSplitThreads, 0, stream>>>(queries, query_dtype, query_stride, Q, d, dpad, terms,
                                                              scales);
  else if (corpus_dtype == DType::BF16)
    split_kernel<DType::BF16><<<unsigned(Q), kSplitThreads, 0, stream>>>(queries, query_dtype, query_stride, Q, d, dpad,
                                                               terms, scales);
  else
    throw std::invalid_argument("corpus_dtype: expected float16 or bfloat16");
  check(cudaGetLastError(), "topn split kernel");
}

void topn_mma(const TopnProblem& p, cudaStream_t stream) {
  if (p.corpus_dtype == DType::F16) return run_typed<DType::F16>(p, stream);
  run_typed<DType::BF16>(p, stream);
}

}  // namespace rcn_fast::cuda
