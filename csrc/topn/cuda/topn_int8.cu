// The int8 bounded scan's search on CUDA (topn/cuda/topn_int8.h). Both
// kernels run blocks of four warps over tiles of 32 corpus rows (a
// grid-stride loop) for one query group (blockIdx.y), get each tile's
// exact integer dots and hand them to filter_tile (topn/topn_int8_scan.h:
// the intervals, the running bound, the candidates, the block's selection
// of lo values), which the host emulation (topn/cpu/topn_int8_emulated.cpp)
// runs the same way.
//
// * int8_mma_kernel (3 or more queries): A = 8 queries' c1 (rows 0-7) and
//   c2 (rows 8-15), one or two A tiles; the warps split each row's 64-byte
//   chunks (warp w: chunks w, w + 4, ...), so a lane holds its chunks'
//   query words in registers for the whole scan; per chunk a lane loads 16
//   bytes of each of 4 rows (one 8-row n-tile each) and issues two
//   mma.m16n8k32.s8 per A tile and n-tile; the four warps' partial sums
//   meet in shared memory.
// * int8_dp4a_kernel (1 or 2 queries): 16 lanes a row, lane l holding the
//   query words of 16-byte chunks l, l + 16, ... in registers, __dp4a on
//   each word, the 16 lanes' sums added by shuffles.
#include "topn/cuda/topn_int8.h"

#include <cstdint>
#include <stdexcept>

#include "common/cuda/lane_groups.cuh"
#include "common/cuda/mma.cuh"
#include "common/cuda/runtime.h"
#include "topn/cuda/topn_launch.h"

namespace rcn_fast::cuda {
namespace {

namespace ti = topn_int8;

// 16 bytes at p as four words (zeros where !ok); p is 16-byte aligned.
__device__ __forceinline__ void load16(const int8_t* p, bool ok, uint32_t* w) {
  int4 v = make_int4(0, 0, 0, 0);
  if (ok) v = __ldg(reinterpret_cast<const int4*>(p));
  w[0] = uint32_t(v.x);
  w[1] = uint32_t(v.y);
  w[2] = uint32_t(v.z);
  w[3] = uint32_t(v.w);
}

// 16 bytes at p (4-byte aligned: the query codes) as four words.
__device__ __forceinline__ void load16_words(const int8_t* p, bool ok, uint32_t* w) {
  const uint32_t* u = reinterpret_cast<const uint32_t*>(p);
#pragma unroll
  for (int e = 0; e < 4; ++e) w[e] = ok ? __ldg(u + e) : 0u;
}

template <int CPW, int AT>
__global__ void __launch_bounds__(kInt8Threads, launch::kMinBlocksPerSm)
    int8_mma_kernel(ti::ScanState st, int64_t group0) {
  extern __shared__ __align__(16) unsigned char smem[];
  constexpr int G = AT * ti::kMmaQueries;
  const int w = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32, g = lane / 4, t = lane % 4;
  const int64_t q0 = (group0 + int64_t(blockIdx.y)) * G;
  const int nq = st.Q - q0 < G ? int(st.Q - q0) : G;
  int32_t* red = reinterpret_cast<int32_t*>(smem);
  ti::BlockSel sel = ti::block_sel(smem + ti::mma_red_bytes(AT), G, st.k);
  uint32_t qa[CPW][AT][2][4];  // this lane's query words: chunk, A tile, term
#pragma unroll
  for (int ci = 0; ci < CPW; ++ci) {
    const int c = w + ti::kScanWarps * ci;
#pragma unroll
    for (int a = 0; a < AT; ++a) {
      const int qi = a * ti::kMmaQueries + g;
      const bool ok = qi < nq && ti::mma_valid(st.width, c, t);
#pragma unroll
      for (int term = 0; term < 2; ++term)
        load16_words(st.qcodes + ((q0 + (ok ? qi : 0)) * 2 + term) * st.width + (ok ? ti::mma_offset(c, t) : 0), ok,
                     qa[ci][a][term]);
    }
  }
  const BlockG grp;
  ti::begin_block(grp, sel, nq);
  const int64_t tiles = (st.N + ti::kTileRows - 1) / ti::kTileRows;
  for (int64_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
    const int64_t j0 = tile * ti::kTileRows;
    const int nrows = st.N - j0 < ti::kTileRows ? int(st.N - j0) : ti::kTileRows;
    int32_t acc[AT][ti::kMmaNTiles][4];
#pragma unroll
    for (int a = 0; a < AT; ++a)
#pragma unroll
      for (int nt = 0; nt < ti::kMmaNTiles; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[a][nt][e] = 0;
#pragma unroll
    for (int ci = 0; ci < CPW; ++ci) {
      const int c = w + ti::kScanWarps * ci;
      const bool kok = ti::mma_valid(st.width, c, t);
      uint32_t bw[ti::kMmaNTiles][4];
#pragma unroll
      for (int nt = 0; nt < ti::kMmaNTiles; ++nt) {
        const int r = nt * 8 + g;
        const bool ok = kok && r < nrows;
        load16(st.codes + (j0 + (ok ? r : 0)) * st.width + (ok ? ti::mma_offset(c, t) : 0), ok, bw[nt]);
      }
#pragma unroll
      for (int s = 0; s < 2; ++s) {
#pragma unroll
        for (int nt = 0; nt < ti::kMmaNTiles; ++nt) {
          uint32_t b[2];
          ti::mma_b(bw[nt], s, b);
#pragma unroll
          for (int a = 0; a < AT; ++a) {
            uint32_t av[4];
            ti::mma_a(qa[ci][a][0], qa[ci][a][1], s, av);
            mma16832_s8(acc[a][nt], av, b);
          }
        }
      }
    }
#pragma unroll
    for (int a = 0; a < AT; ++a)
#pragma unroll
      for (int nt = 0; nt < ti::kMmaNTiles; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) red[ti::red_at(w, a, nt, lane, e, AT)] = acc[a][nt][e];
    __syncthreads();
    ti::filter_tile(grp, st, sel, q0, nq, j0, nrows, ti::MmaDots{red, AT});
  }
}

template <int G, int CPL>
__global__ void __launch_bounds__(kInt8Threads, launch::kMinBlocksPerSm)
    int8_dp4a_kernel(ti::ScanState st, int64_t group0) {
  extern __shared__ __align__(16) unsigned char smem[];
  const int w = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
  const int64_t q0 = (group0 + int64_t(blockIdx.y)) * G;
  const int nq = st.Q - q0 < G ? int(st.Q - q0) : G;
  int32_t* dots = reinterpret_cast<int32_t*>(smem);
  ti::BlockSel sel = ti::block_sel(smem + ti::dp4a_dots_bytes(G), G, st.k);
  uint32_t qw[G][2][CPL][4];  // this lane's query words: query, term, chunk
#pragma unroll
  for (int qi = 0; qi < G; ++qi)
#pragma unroll
    for (int i = 0; i < CPL; ++i) {
      const int64_t c = ti::dp4a_chunk(lane, i);
      const bool ok = qi < nq && 16 * c < st.width;
#pragma unroll
      for (int term = 0; term < 2; ++term)
        load16_words(st.qcodes + ((q0 + (ok ? qi : 0)) * 2 + term) * st.width + (ok ? 16 * c : 0), ok, qw[qi][term][i]);
    }
  const BlockG grp;
  ti::begin_block(grp, sel, nq);
  const int64_t tiles = (st.N + ti::kTileRows - 1) / ti::kTileRows;
  constexpr int kSteps = ti::kTileRows / (ti::kScanWarps * 32 / ti::kDp4aLanes);
  for (int64_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
    const int64_t j0 = tile * ti::kTileRows;
    const int nrows = st.N - j0 < ti::kTileRows ? int(st.N - j0) : ti::kTileRows;
#pragma unroll
    for (int step = 0; step < kSteps; ++step) {
      const int r = ti::dp4a_row(w, lane, step);
      int32_t i1[G], i2[G];
#pragma unroll
      for (int qi = 0; qi < G; ++qi) i1[qi] = i2[qi] = 0;
#pragma unroll
      for (int i = 0; i < CPL; ++i) {
        const int64_t c = ti::dp4a_chunk(lane, i);
        const bool ok = r < nrows && 16 * c < st.width;
        uint32_t v[4];
        load16(st.codes + (j0 + (ok ? r : 0)) * st.width + (ok ? 16 * c : 0), ok, v);
#pragma unroll
        for (int qi = 0; qi < G; ++qi)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            i1[qi] = __dp4a(int(v[e]), int(qw[qi][0][i][e]), i1[qi]);
            i2[qi] = __dp4a(int(v[e]), int(qw[qi][1][i][e]), i2[qi]);
          }
      }
#pragma unroll
      for (int qi = 0; qi < G; ++qi)
#pragma unroll
        for (int o = ti::kDp4aLanes / 2; o > 0; o >>= 1) {  // within the row's 16 lanes
          i1[qi] += __shfl_xor_sync(0xffffffffu, i1[qi], o);
          i2[qi] += __shfl_xor_sync(0xffffffffu, i2[qi], o);
        }
      if (lane % ti::kDp4aLanes == 0 && r < nrows) {
#pragma unroll
        for (int qi = 0; qi < G; ++qi) {
          dots[(int64_t(qi) * ti::kTileRows + r) * 2] = i1[qi];
          dots[(int64_t(qi) * ti::kTileRows + r) * 2 + 1] = i2[qi];
        }
      }
    }
    __syncthreads();
    ti::filter_tile(grp, st, sel, q0, nq, j0, nrows, ti::TileDots{dots});
  }
}

using Kernel = void (*)(ti::ScanState, int64_t);

template <int AT>
Kernel mma_kernel(int chunks) {
  switch (chunks) {
    case 1: return int8_mma_kernel<1, AT>;
    case 2: return int8_mma_kernel<2, AT>;
    case 3: return int8_mma_kernel<3, AT>;
    default: return int8_mma_kernel<4, AT>;
  }
}

template <int G>
Kernel dp4a_kernel(int chunks) {
  switch (chunks) {
    case 1: return int8_dp4a_kernel<G, 1>;
    case 2: return int8_dp4a_kernel<G, 2>;
    case 3: return int8_dp4a_kernel<G, 3>;
    default: return int8_dp4a_kernel<G, 4>;
  }
}

}  // namespace

void topn_int8_scan_cuda(const ti::ScanState& st, cudaStream_t stream) {
  if (st.width % 16 != 0 || st.width > ti::kMaxWidth)
    throw std::invalid_argument("codes: expected a width that is a multiple of 16 and at most 1032");
  if (st.k < 0 || st.k > ti::kScanMaxK) throw std::invalid_argument("k: expected 0 <= k <= 1024");
  if (st.Q == 0 || st.N == 0) return;
  if (reinterpret_cast<uintptr_t>(st.codes) % 16 != 0 || reinterpret_cast<uintptr_t>(st.qcodes) % 4 != 0)
    throw std::invalid_argument("codes, qcodes: expected 16- and 4-byte aligned base addresses");
  const Int8ScanConfig c = int8_scan_config(st.Q, st.k, st.width);
  const Kernel kern = c.mma ? (c.atiles == 1 ? mma_kernel<1>(c.chunks) : mma_kernel<2>(c.chunks))
                            : (c.group == 1 ? dp4a_kernel<1>(c.chunks) : dp4a_kernel<2>(c.chunks));
  int dev = 0, sms = 0;
  check(cudaGetDevice(&dev), "cudaGetDevice");
  check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev), "cudaDeviceGetAttribute");
  check(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, int(c.smem)),
        "cudaFuncSetAttribute");
  // query groups in y, at most 65,535 a launch (topn_launch.h)
  for (const launch::Grid& g : int8_scan_launches(st.Q, st.N, c.group, sms)) {
    kern<<<dim3(unsigned(g.x), unsigned(g.y)), kInt8Threads, c.smem, stream>>>(st, g.y0);
    check(cudaGetLastError(), "topn int8 scan kernel");
  }
}

}  // namespace rcn_fast::cuda
