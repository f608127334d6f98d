// Small CUDA runtime helpers shared by the launchers.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <stdexcept>
#include <string>

namespace rcn_fast::cuda {

inline void check(cudaError_t err, const char* what) {
  if (err != cudaSuccess)
    throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(err));
}

// Number of usable devices, or -1 with `why` filled when the driver/runtime
// cannot be used (no driver, no device, driver too old, ...).
int device_count(std::string& why);

// Bytes of scratch the current device's default memory pool keeps mapped
// between calls (issue 55, S5): its release threshold is raised to at least
// this once per device, so a launcher's cudaMallocAsync scratch is not
// handed back to the driver at every synchronisation (the default threshold
// is 0) and mapped again by the next call. A higher threshold someone else
// set (torch's cudaMallocAsync backend) is kept.
constexpr unsigned long long kScratchKeepBytes = 1ull << 30;

// Raises the current device's default pool's release threshold (once a device).
void keep_scratch_pool();

// `bytes` of scratch on `stream` (cudaMallocAsync from the current
// device's default pool, see keep_scratch_pool); free with scratch_free.
void* scratch_bytes(size_t bytes, cudaStream_t stream);

// `count` elements of T of scratch (scratch_bytes).
template <class T>
void scratch_alloc(T** p, size_t count, cudaStream_t stream) {
  *p = static_cast<T*>(scratch_bytes(count * sizeof(T), stream));
}

inline void scratch_free(void* p, cudaStream_t stream) {
  if (p != nullptr) cudaFreeAsync(p, stream);
}

}  // namespace rcn_fast::cuda
