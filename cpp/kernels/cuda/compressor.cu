#include <cmath>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/compressor.cuh"

namespace dsv41rt::kernels::cuda {
namespace {

// One thread per output (g, c), grid-stride: the CPU reference's exact per-channel sequence
// (max, Σ exp(x - max), Σ value · exp(x - max) / Σ) over the group's rows; neighbouring threads
// read neighbouring channels, so every row access is coalesced.
__global__ void compress_pool_kernel(const float* __restrict__ values,
                                     const float* __restrict__ scores, int64_t groups,
                                     int64_t ratio, int64_t D, float* __restrict__ pooled) {
  const int64_t n = groups * D;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t g = i / D, c = i % D;
    const int64_t base = g * ratio * D + c;
    float m = -INFINITY;
    for (int64_t t = 0; t < ratio; ++t) m = fmaxf(m, scores[base + t * D]);
    float denom = 0.0f;
    for (int64_t t = 0; t < ratio; ++t) denom += expf(scores[base + t * D] - m);
    float acc = 0.0f;
    for (int64_t t = 0; t < ratio; ++t) {
      acc += values[base + t * D] * (expf(scores[base + t * D] - m) / denom);
    }
    pooled[i] = acc;
  }
}

}  // namespace

cudaError_t compress_pool(const float* values, const float* scores, int64_t groups, int64_t ratio,
                          int64_t D, float* pooled, cudaStream_t stream) {
  if (groups < 0 || ratio < 1 || D <= 0) return cudaErrorInvalidValue;
  if (groups == 0) return cudaSuccess;
  compress_pool_kernel<<<blocks_for(groups * D), kThreads, 0, stream>>>(values, scores, groups,
                                                                        ratio, D, pooled);
  return launch_status();
}

}  // namespace dsv41rt::kernels::cuda
