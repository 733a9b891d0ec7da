#include "core/device.h"

#ifdef DSV41RT_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace dsv41rt {

int cuda_device_count() noexcept {
#ifdef DSV41RT_WITH_CUDA
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky error so later calls are not poisoned
    return 0;
  }
  return n;
#else
  return 0;
#endif
}

}  // namespace dsv41rt
