#include <cooperative_groups.h>
#include <cuda_pipeline.h>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/rms_norm.cuh"

namespace dsv41rt::kernels::cuda {
namespace {

// One block per row: each thread accumulates a strided slice of x², the block reduces through
// warp shuffles and shared memory, then every thread scales its slice.
__global__ void rms_norm_kernel(const float* __restrict__ x, const float* __restrict__ weight,
                                int64_t dim, float eps, float* __restrict__ y) {
  pdl_entry();
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

// Few rows (decode) leave a one-block-per-row kernel latency-bound: one SM streams the whole row
// (20480 floats at V4.1's mHC width, ~6 us). Here a row is a cluster of kSplit blocks that
// computes exactly what rms_norm_kernel does: block r plays that kernel's warp r (lanes l sum
// x[32r + l + 256u] in u order, staged through shared memory with cp.async, then the same
// butterfly), every block combines the 8 warp sums as that kernel's warp 0 does (read through
// distributed shared memory), and writes its eighth of the row. Rows are bitwise those of
// rms_norm_kernel, whichever kernel a batch size picks.
constexpr int kSplit = 8;  // = warps of rms_norm_kernel's kThreads

__global__ void __cluster_dims__(kSplit, 1, 1)
    rms_norm_split_kernel(const float* __restrict__ x, const float* __restrict__ weight,
                          int64_t dim, float eps, float* __restrict__ y) {
  pdl_entry();
  namespace cg = cooperative_groups;
  extern __shared__ float staged[];  // [ceil(dim / 256)][32]
  __shared__ float part;
  cg::cluster_group cluster = cg::this_cluster();
  const int r = int(cluster.block_rank());
  const float* xr = x + blockIdx.y * dim;
  float* yr = y + blockIdx.y * dim;
  const int64_t passes = (dim + kThreads - 1) / kThreads;
  for (int64_t e = threadIdx.x; e < passes * 32; e += blockDim.x) {
    const int64_t i = (e / 32) * kThreads + 32 * r + e % 32;
    if (i < dim) __pipeline_memcpy_async(staged + e, xr + i, sizeof(float));
  }
  __pipeline_commit();
  __pipeline_wait_prior(0);
  __syncthreads();
  if (threadIdx.x < 32) {
    const int lane = threadIdx.x;
    float acc = 0.0f;
    constexpr int kBatch = 8;  // reads in flight together, added in order
    for (int64_t u0 = 0; u0 < passes; u0 += kBatch) {
      float v[kBatch];
#pragma unroll
      for (int b = 0; b < kBatch; ++b) v[b] = u0 + b < passes ? staged[(u0 + b) * 32 + lane] : 0.0f;
#pragma unroll
      for (int b = 0; b < kBatch; ++b) {
        if (u0 + b < passes && (u0 + b) * kThreads + 32 * r + lane < dim) acc += v[b] * v[b];
      }
    }
    for (int off = 16; off > 0; off >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, off);
    if (lane == 0) part = acc;
  }
  cluster.sync();  // every block's warp sum is ready
  float total = 0.0f;
  if (threadIdx.x < 32) {
    const int lane = threadIdx.x;
    float acc = lane < kSplit ? *cluster.map_shared_rank(&part, lane) : 0.0f;
    for (int off = 16; off > 0; off >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, off);
    if (lane == 0) staged[0] = acc;  // the staged values are consumed
  }
  cluster.sync();  // the others' sums are read (they may exit); staged[0] is published
  total = staged[0];
  const float inv = 1.0f / sqrtf(total / static_cast<float>(dim) + eps);
  const int64_t per = (dim + kSplit - 1) / kSplit;
  const int64_t i0 = r * per, i1 = i0 + per < dim ? i0 + per : dim;
  for (int64_t i = i0 + threadIdx.x; i < i1; i += blockDim.x) {
    const float v = xr[i] * inv;
    yr[i] = weight ? weight[i] * v : v;
  }
}

// Rows up to this many take the split kernel.
constexpr int64_t kSplitMaxRows = 64;

}  // namespace

cudaError_t rms_norm(const float* x, const float* weight, int64_t rows, int64_t dim, float eps,
                     float* y, cudaStream_t stream) {
  if (rows <= 0) return cudaSuccess;
  if (dim <= 0 || rows > 0x7fffffff) return cudaErrorInvalidValue;
  if (rows <= kSplitMaxRows) {
    const int64_t staged = (dim + kThreads - 1) / kThreads * 32 * int64_t(sizeof(float));
    if (staged <= 200 * 1024) {  // dim <= 409600
      if (staged > 48 * 1024) {
        const cudaError_t err = cudaFuncSetAttribute(
            rms_norm_split_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(staged));
        if (err != cudaSuccess) return err;
      }
      rms_norm_split_kernel<<<dim3(kSplit, unsigned(rows)), kThreads, size_t(staged), stream>>>(
          x, weight, dim, eps, y);
      return launch_status();
    }
  }
  rms_norm_kernel<<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(x, weight, dim, eps, y);
  return launch_status();
}

}  // namespace dsv41rt::kernels::cuda
