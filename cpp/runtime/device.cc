#include "runtime/device.h"

#ifdef DSV41RT_WITH_CUDA
#include "kernels/cuda/device_query.cuh"
#endif

namespace dsv41rt {

int cuda_device_count() noexcept {
#ifdef DSV41RT_WITH_CUDA
  return kernels::cuda_device_count();
#else
  return 0;
#endif
}

}  // namespace dsv41rt
