#include "kernels/cuda/rms_norm.cuh"
#include "kernels/cuda/testing/device_buffer.cuh"
#include "kernels/cuda/testing/norm_test_entry.h"

namespace dsv41rt::kernels::cuda::testing {

void rms_norm(const float* x, const float* weight, int64_t rows, int64_t dim, float eps, float* y) {
  DeviceBuffer<float> dx(x, rows * dim), dy(rows * dim);
  DeviceBuffer<float> dw(weight, weight ? dim : 0);
  dy.poison();
  finish(cuda::rms_norm(dx.get(), weight ? dw.get() : nullptr, rows, dim, eps, dy.get(), nullptr));
  dy.to_host(y);
}

}  // namespace dsv41rt::kernels::cuda::testing
