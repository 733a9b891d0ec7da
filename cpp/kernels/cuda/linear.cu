#include "core/dtype.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/linear.cuh"
#include "kernels/cuda/weight_decode.cuh"

namespace dsv41rt::kernels::cuda {
namespace {

constexpr int kTile = 32;        // output rows and columns per block, and the k slice
constexpr int kRowsPerPass = 8;  // blockDim.y
constexpr int kPerThread = kTile / kRowsPerPass;  // output rows per thread

// Block (32, 8) computes y[m0 : m0+32, n0 : n0+32] of group blockIdx.z; thread (tx, ty) owns
// column n0 + tx of rows m0 + ty + 8r. Row strides ldx / ldy, group strides gx / gy; group g
// reads weight rows [g * gw, g * gw + n). Weights decode exactly to FP32 whatever their format, so
// every format gives the result of FP32 weights of the same values.
template <WeightFormat F>
__global__ void __launch_bounds__(kTile* kRowsPerPass)
    linear_kernel(const float* __restrict__ x, const WeightView w, float* __restrict__ y, int64_t m,
                  int64_t k, int64_t n, int64_t ldx, int64_t ldy, int64_t gx, int64_t gw,
                  int64_t gy, bool accumulate) {
  pdl_entry();
  __shared__ float xs[kTile][kTile + 1];
  __shared__ float ws[kTile][kTile + 1];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int64_t g = blockIdx.z;
  x += g * gx;
  y += g * gy;
  const int64_t wrow0 = g * gw;
  const int64_t m0 = static_cast<int64_t>(blockIdx.y) * kTile;
  const int64_t n0 = static_cast<int64_t>(blockIdx.x) * kTile;
  float acc[kPerThread];
#pragma unroll
  for (int r = 0; r < kPerThread; ++r) acc[r] = 0.0f;
  for (int64_t k0 = 0; k0 < k; k0 += kTile) {
    const int64_t col = k0 + tx;
#pragma unroll
    for (int r = 0; r < kPerThread; ++r) {
      const int i = ty + kRowsPerPass * r;
      const int64_t xr = m0 + i, wr = n0 + i;
      xs[i][tx] = (xr < m && col < k) ? x[xr * ldx + col] : 0.0f;
      ws[i][tx] = (wr < n && col < k) ? weight_at<F>(w, wrow0 + wr, col) : 0.0f;
    }
    __syncthreads();
#pragma unroll 8
    for (int kk = 0; kk < kTile; ++kk) {
      const float wv = ws[tx][kk];
#pragma unroll
      for (int r = 0; r < kPerThread; ++r) {
        acc[r] = __fmaf_rn(xs[ty + kRowsPerPass * r][kk], wv, acc[r]);
      }
    }
    __syncthreads();
  }
  const int64_t c = n0 + tx;
  if (c >= n) return;
#pragma unroll
  for (int r = 0; r < kPerThread; ++r) {
    const int64_t row = m0 + ty + kRowsPerPass * r;
    if (row < m) {
      float* dst = y + row * ldy + c;
      *dst = accumulate ? __fadd_rn(*dst, acc[r]) : acc[r];
    }
  }
}

cudaError_t launch(const float* x, const WeightView& w, float* y, int64_t m, int64_t k, int64_t n,
                   int64_t groups, int64_t ldx, int64_t ldy, int64_t gx, int64_t gw, int64_t gy,
                   bool accumulate, cudaStream_t stream) {
  if (m < 0 || k < 0 || n < 0 || groups < 0) return cudaErrorInvalidValue;
  if (m == 0 || n == 0 || groups == 0) return cudaSuccess;
  if (w.cols != k || w.rows < (groups - 1) * gw + n || w.data == nullptr) {
    return cudaErrorInvalidValue;
  }
  const int64_t bx = (n + kTile - 1) / kTile, by = (m + kTile - 1) / kTile;
  if (bx > 0x7fffffff || by > kMaxBlocks || groups > kMaxBlocks) return cudaErrorInvalidValue;
  const dim3 grid(static_cast<unsigned>(bx), static_cast<unsigned>(by),
                  static_cast<unsigned>(groups));
  const dim3 block(kTile, kRowsPerPass);
  dispatch_format(w.format, [&]<WeightFormat F>() {
    linear_kernel<F>
        <<<grid, block, 0, stream>>>(x, w, y, m, k, n, ldx, ldy, gx, gw, gy, accumulate);
  });
  return launch_status();
}

}  // namespace

cudaError_t linear(const float* x, const WeightView& w, int64_t m, int64_t k, int64_t n, float* y,
                   bool accumulate, cudaStream_t stream) {
  return launch(x, w, y, m, k, n, 1, k, n, 0, 0, 0, accumulate, stream);
}

cudaError_t grouped_linear(const float* x, const WeightView& w, int64_t m, int64_t groups,
                           int64_t k_g, int64_t n_g, float* y, cudaStream_t stream) {
  return launch(x, w, y, m, k_g, n_g, groups, groups * k_g, groups * n_g, k_g, n_g, n_g, false,
                stream);
}

}  // namespace dsv41rt::kernels::cuda
