#include <cmath>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/hadamard.cuh"

namespace dsv41rt::kernels::cuda {
namespace {

// One block a row (grid-stride over the rows): the row is read whole into shared memory before
// anything is written, so y may alias x. Stage h pairs (i, i + h), i with bit h clear, as the
// CPU's loops do; each pair is one thread's, so every element sees the CPU's operations.
__global__ void walsh_hadamard_kernel(const float* x, int64_t rows, int64_t dim, float scale,
                                      float* y) {
  pdl_entry();
  extern __shared__ float v[];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const float* xr = x + r * dim;
    for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) v[i] = xr[i];
    __syncthreads();
    for (int64_t h = 1; h < dim; h *= 2) {
      for (int64_t p = threadIdx.x; p < dim / 2; p += blockDim.x) {
        const int64_t i = (p / h) * 2 * h + p % h;
        const float a = v[i], b = v[i + h];
        v[i] = __fadd_rn(a, b);
        v[i + h] = __fsub_rn(a, b);
      }
      __syncthreads();
    }
    float* yr = y + r * dim;
    for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) yr[i] = __fmul_rn(v[i], scale);
    __syncthreads();  // the next row's loads reuse v
  }
}

}  // namespace

cudaError_t walsh_hadamard(const float* x, int64_t rows, int64_t dim, float* y,
                           cudaStream_t stream) {
  if (rows < 0 || dim < 1 || (dim & (dim - 1)) != 0 || dim > kMaxHadamardDim)
    return cudaErrorInvalidValue;
  if (rows == 0) return cudaSuccess;
  if (!x || !y) return cudaErrorInvalidValue;
  // The contract's scale: dim^-0.5 in double, rounded to FP32 once (as the CPU reference).
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(dim)));
  const int threads = dim / 2 >= kThreads ? kThreads : (dim / 2 >= 32 ? int(dim / 2) : 32);
  walsh_hadamard_kernel<<<blocks_for(rows, 1), threads, size_t(dim) * sizeof(float), stream>>>(
      x, rows, dim, scale, y);
  return launch_status();
}

}  // namespace dsv41rt::kernels::cuda
