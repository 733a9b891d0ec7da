#include "kernels/cuda/common.cuh"
#include "kernels/cuda/rms_norm.cuh"

namespace dsv41rt::kernels::cuda {
namespace {

// One block per row: each thread accumulates a strided slice of x², the block reduces through
// warp shuffles and shared memory, then every thread scales its slice.
__global__ void rms_norm_kernel(const float* __restrict__ x, const float* __restrict__ weight,
                                int64_t dim, float eps, float* __restrict__ y) {
  const float* xr = x + blockIdx.x * dim;
  float* yr = y + blockIdx.x * dim;
  // Loads in batches of kBatch per thread (a plain loop waits on each in turn), adds in order.
  constexpr int kBatch = 8;
  float acc = 0.0f;
  for (int64_t i0 = threadIdx.x; i0 < dim; i0 += int64_t(blockDim.x) * kBatch) {
    float v[kBatch];
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int64_t i = i0 + int64_t(blockDim.x) * u;
      v[u] = i < dim ? xr[i] : 0.0f;
    }
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      if (i0 + int64_t(blockDim.x) * u < dim) acc += v[u] * v[u];
    }
  }
  for (int off = 16; off > 0; off >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, off);
  __shared__ float warp_sums[32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) warp_sums[warp] = acc;
  __syncthreads();
  if (warp == 0) {
    acc = lane < (blockDim.x + 31) / 32 ? warp_sums[lane] : 0.0f;
    for (int off = 16; off > 0; off >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, off);
    if (lane == 0) warp_sums[0] = acc;
  }
  __syncthreads();
  const float inv = 1.0f / sqrtf(warp_sums[0] / static_cast<float>(dim) + eps);
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) {
    const float v = xr[i] * inv;
    yr[i] = weight ? weight[i] * v : v;
  }
}

}  // namespace

cudaError_t rms_norm(const float* x, const float* weight, int64_t rows, int64_t dim, float eps,
                     float* y, cudaStream_t stream) {
  if (rows <= 0) return cudaSuccess;
  if (dim <= 0 || rows > 0x7fffffff) return cudaErrorInvalidValue;
  rms_norm_kernel<<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(x, weight, dim, eps, y);
  return launch_status();
}

}  // namespace dsv41rt::kernels::cuda
