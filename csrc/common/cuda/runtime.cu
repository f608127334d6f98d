#include "common/cuda/runtime.h"

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

}  // namespace rcn_fast::cuda
