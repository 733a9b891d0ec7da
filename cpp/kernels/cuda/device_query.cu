#include <cuda_runtime.h>

#include "kernels/cuda/device_query.cuh"

namespace dsv41rt::kernels {

int cuda_device_count() noexcept {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky error so later calls are not poisoned
    return 0;
  }
  return n;
}

}  // namespace dsv41rt::kernels
