#include "kernels/cuda/dtype_convert.cuh"
#include "core/dtype.h"

namespace dsv41rt::kernels {
namespace {

constexpr int kThreads = 256;
// Grid-stride loops with a capped grid: any n works without overflowing gridDim.x.
constexpr int64_t kMaxBlocks = 65535;

int blocks_for(int64_t n) {
  const int64_t blocks = (n + kThreads - 1) / kThreads;
  return static_cast<int>(blocks < kMaxBlocks ? blocks : kMaxBlocks);
}

__global__ void fp8_e4m3_to_f32_kernel(const uint8_t* __restrict__ src, int64_t n,
                                       float* __restrict__ dst) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    dst[i] = fp8_e4m3_to_f32(src[i]);
  }
}

__global__ void bf16_to_f32_kernel(const uint16_t* __restrict__ src, int64_t n,
                                   float* __restrict__ dst) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    dst[i] = bf16_to_f32(src[i]);
  }
}

// One thread per packed byte: writes the even (low nibble) and, if present, odd element.
__global__ void fp4_e2m1_packed_to_f32_kernel(const uint8_t* __restrict__ src, int64_t n,
                                              float* __restrict__ dst) {
  const int64_t nbytes = (n + 1) / 2;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t b = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; b < nbytes;
       b += stride) {
    const uint8_t byte = src[b];
    dst[2 * b] = fp4_e2m1_to_f32(fp4_unpack_lo(byte));
    if (2 * b + 1 < n) dst[2 * b + 1] = fp4_e2m1_to_f32(fp4_unpack_hi(byte));
  }
}

}  // namespace

cudaError_t decode_fp8_e4m3_to_f32(const uint8_t* src, int64_t n, float* dst, cudaStream_t stream) {
  if (n <= 0) return n == 0 ? cudaSuccess : cudaErrorInvalidValue;
  fp8_e4m3_to_f32_kernel<<<blocks_for(n), kThreads, 0, stream>>>(src, n, dst);
  return cudaGetLastError();
}

cudaError_t decode_bf16_to_f32(const uint16_t* src, int64_t n, float* dst, cudaStream_t stream) {
  if (n <= 0) return n == 0 ? cudaSuccess : cudaErrorInvalidValue;
  bf16_to_f32_kernel<<<blocks_for(n), kThreads, 0, stream>>>(src, n, dst);
  return cudaGetLastError();
}

cudaError_t decode_fp4_e2m1_packed_to_f32(const uint8_t* src, int64_t n, float* dst,
                                          cudaStream_t stream) {
  if (n <= 0) return n == 0 ? cudaSuccess : cudaErrorInvalidValue;
  fp4_e2m1_packed_to_f32_kernel<<<blocks_for((n + 1) / 2), kThreads, 0, stream>>>(src, n, dst);
  return cudaGetLastError();
}

}  // namespace dsv41rt::kernels
