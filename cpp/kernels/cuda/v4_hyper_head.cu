#include "kernels/cuda/common.cuh"
#include "kernels/cuda/v4_hyper_head.cuh"

namespace dsv41rt::kernels::cuda {
namespace {

constexpr unsigned kFullMask = 0xffffffffu;
// hc_mix's chunk of the n·H inputs and its block size (kernels/cuda/mhc.cu kMixChunk, kThreads):
// the per-chunk partial sums depend on both, so they are the same here.
constexpr int64_t kChunk = 512;
constexpr int kWarps = kThreads / 32;
constexpr int kPerLane = int(kChunk / 32);

// One block of kThreads per token s. Shared: the chunk of inputs, each warp's Σ f² of it, and the
// n running logits (z, added chunk by chunk in order as hc_mix's finishing kernel does).
__global__ void hc_head_pre_kernel(const float* __restrict__ X, const float* __restrict__ fn,
                                   const float* __restrict__ base, const float* __restrict__ scale,
                                   int64_t n, int64_t H, float rms_eps, float hc_eps,
                                   float* __restrict__ pre) {
  pdl_entry();
  extern __shared__ float z[];  // [n]
  __shared__ float xs[kChunk];
  __shared__ double warp_sq[kWarps];
  __shared__ double total_sq;
  const int64_t s = blockIdx.x, K = n * H;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const float* f = X + s * K;
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) z[j] = 0.0f;
  if (threadIdx.x == 0) total_sq = 0.0;
  for (int64_t i0 = 0; i0 < K; i0 += kChunk) {
    const int64_t i1 = i0 + kChunk < K ? i0 + kChunk : K;
    __syncthreads();  // the previous chunk is consumed
    for (int u = threadIdx.x; u < int(kChunk); u += blockDim.x) {
      xs[u] = i0 + u < i1 ? f[i0 + u] : 0.0f;
    }
    __syncthreads();
    // Σ f² of the chunk: thread-strided in double, the warp's xor reduction, the warps in order.
    double acc = 0.0;
    for (int64_t i = i0 + threadIdx.x; i < i1; i += blockDim.x) {
      const float v = xs[i - i0];
      acc += __fmul_rn(v, v);
    }
    for (int off = 16; off > 0; off >>= 1) acc += __shfl_xor_sync(kFullMask, acc, off);
    if (lane == 0) warp_sq[warp] = acc;
    // Row j's dot over the chunk by warp j % kWarps: lane l takes inputs l + 32u (FMA in u order),
    // then the xor reduction; lane 0 adds it to the row's running logit.
    for (int64_t j = warp; j < n; j += kWarps) {
      const float* wj = fn + j * K;
      float d = 0.0f;
#pragma unroll
      for (int u = 0; u < kPerLane; ++u) {
        const int64_t i = i0 + lane + 32 * u;
        if (i < i1) d = __fmaf_rn(xs[lane + 32 * u], wj[i], d);
      }
      for (int off = 16; off > 0; off >>= 1) d += __shfl_xor_sync(kFullMask, d, off);
      if (lane == 0) z[j] = __fadd_rn(z[j], d);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      double chunk = 0.0;
      for (int w = 0; w < kWarps; ++w) chunk += warp_sq[w];
      total_sq += chunk;
    }
  }
  __syncthreads();
  const float mean = __fdiv_rn(static_cast<float>(total_sq), static_cast<float>(K));
  const float r = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(mean, rms_eps)));
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
    const float zj = __fadd_rn(base[j], __fmul_rn(__fmul_rn(z[j], r), scale[0]));
    pre[s * n + j] = __fadd_rn(__fdiv_rn(1.0f, __fadd_rn(1.0f, expf(-zj))), hc_eps);
  }
}

}  // namespace

cudaError_t hc_head_pre(const float* X, const float* fn, const float* base, const float* scale,
                        int64_t S, int64_t n, int64_t H, float rms_eps, float hc_eps, float* pre,
                        cudaStream_t stream) {
  if (S < 0 || n <= 0 || H <= 0 || S > 0x7fffffff) return cudaErrorInvalidValue;
  if (S == 0) return cudaSuccess;
  if (!X || !fn || !base || !scale || !pre) return cudaErrorInvalidValue;
  const size_t smem = size_t(n) * sizeof(float);
  if (smem > 16 * 1024) return cudaErrorInvalidValue;
  hc_head_pre_kernel<<<unsigned(S), kThreads, smem, stream>>>(X, fn, base, scale, n, H, rms_eps,
                                                              hc_eps, pre);
  return launch_status();
}

}  // namespace dsv41rt::kernels::cuda
