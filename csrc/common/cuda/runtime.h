// Small CUDA runtime helpers shared by the launchers.
#pragma once
#include <cuda_runtime.h>

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

}  // namespace rcn_fast::cuda
