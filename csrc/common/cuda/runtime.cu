#include "common/cuda/runtime.h"

#include <atomic>

namespace rcn_fast::cuda {

int device_count(std::string& why) {
  int n = 0;
  const cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess) {
    why = cudaGetErrorString(err);
    cudaGetLastError();  // clear the sticky error
    return -1;
  }
  if (n == 0) why = "no CUDA device";
  return n;
}

namespace {
constexpr int kMaxDevices = 256;
std::atomic<bool> g_pool_kept[kMaxDevices];
}  // namespace

void keep_scratch_pool() {
  int dev = 0;
  check(cudaGetDevice(&dev), "cudaGetDevice");
  if (dev < 0 || dev >= kMaxDevices || g_pool_kept[dev].load(std::memory_order_acquire)) return;
  cudaMemPool_t pool;
  check(cudaDeviceGetDefaultMemPool(&pool, dev), "cudaDeviceGetDefaultMemPool");
  unsigned long long current = 0;
  check(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &current), "cudaMemPoolGetAttribute");
  if (current < kScratchKeepBytes) {
    unsigned long long keep = kScratchKeepBytes;
    check(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep), "cudaMemPoolSetAttribute");
  }
  g_pool_kept[dev].store(true, std::memory_order_release);
}

void* scratch_bytes(size_t bytes, cudaStream_t stream) {
  keep_scratch_pool();
  void* p = nullptr;
  check(cudaMallocAsync(&p, bytes, stream), "cudaMallocAsync");
  return p;
}

}  // namespace rcn_fast::cuda
