// Launch configurations as data (issue 55): each CUDA domain has a launch
// table (topn/cuda/topn_launch.h, sampling/cuda/sampling_launch.h) that its
// launchers take their block sizes, dynamic shared memory and grids from,
// and that the resource check reads (tests/test_cuda_resources.py compiles
// tests/cuda_launch_table.cpp against the same headers): a kernel's
// __launch_bounds__ is its table entry's max_threads, the shared memory a
// launcher requests never exceeds the entry's max_dynamic_smem, and every
// grid comes from a plan function here or in the domain header, so the test
// checks the very arithmetic the launchers run. Host code only (no CUDA
// headers): the host compiler builds the test's dumper from it.
#pragma once
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace rcn_fast::launch {

// One kernel (every template instantiation of one __global__ function).
struct KernelSpec {
  const char* kernel;         // the __global__ function's name
  int max_threads;            // the largest block its launcher chooses (= its __launch_bounds__)
  int min_threads;            // the smallest
  int64_t max_dynamic_smem;   // the most dynamic shared memory its launcher requests (bytes)
  bool hot;                   // its inner loop carries the op: a register spill is an error
};

// The second argument of every __launch_bounds__ (minimum blocks an SM):
// registers up to what one block of max_threads allows. Given the maximum
// block alone, CUDA 13's ptxas aims at a higher occupancy and spills
// (score_block_kernel: 48 registers and a stack for __launch_bounds__(256),
// 80 and none for __launch_bounds__(256, 1)).
constexpr int kMinBlocksPerSm = 1;

// Grid limits of every architecture rcn_fast builds for (compute capability >= 8.0).
constexpr int64_t kMaxGridX = 2147483647;
constexpr int64_t kMaxGridYZ = 65535;
// Dynamic shared memory above this needs cudaFuncAttributeMaxDynamicSharedMemorySize.
constexpr int64_t kDefaultSmem = 48 * 1024;

// One launch of a plan: its grid and the first unit (query, block ...) its
// y index 0 stands for.
struct Grid {
  int64_t x, y;
  int64_t y0;  // offset of blockIdx.y == 0, in the launch's y units
};

// The launches covering `gx` x `gy_total` blocks when gridDim.y may not
// exceed kMaxGridYZ: one launch per chunk of at most kMaxGridYZ y blocks.
inline std::vector<Grid> y_chunks(int64_t gx, int64_t gy_total) {
  if (gx > kMaxGridX) throw std::invalid_argument("grid: more than 2^31 - 1 blocks in x");
  std::vector<Grid> out;
  for (int64_t y0 = 0; y0 < gy_total; y0 += kMaxGridYZ)
    out.push_back(Grid{gx, gy_total - y0 < kMaxGridYZ ? gy_total - y0 : kMaxGridYZ, y0});
  return out;
}

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace rcn_fast::launch
