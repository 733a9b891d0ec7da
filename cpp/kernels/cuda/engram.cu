#include <cmath>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/engram.cuh"

namespace dsv41rt::kernels::cuda {
namespace {

using kernels::WeightFormat;
using kernels::WeightView;

constexpr int kWarp = 32;

// kv[t, o] = emb[t, :] · wkv[o, :]. A warp computes output o for up to TB tokens, so a weight
// row is read once per TB tokens (one warp per (token, output) re-read the whole FP32 projection,
// ~0.6 GB at V4.1's widths, for every token: 9 ms per call at 64 tokens), with kUnroll columns'
// loads in flight per lane. Each output keeps the one-warp-per-output arithmetic (lane-strided
// FMAs in column order, then a butterfly), so its bits do not depend on TB or the batch. A stored
// format (FP8 blocks on release) is decoded exactly as loaded: the same FP32 values, the same bits.
constexpr int kUnroll = 4;

template <int TB>
__global__ void engram_kv_kernel(const float* __restrict__ emb, const WeightView wkv, int64_t S,
                                 int64_t kvw, int64_t D, float* __restrict__ kv) {
  pdl_entry();
  const bool plain = wkv.format == WeightFormat::kF32;
  const int lane = threadIdx.x % kWarp;
  const int64_t groups = (S + TB - 1) / TB;
  const int64_t warps = int64_t(gridDim.x) * (blockDim.x / kWarp);
  for (int64_t w = blockIdx.x * int64_t(blockDim.x / kWarp) + threadIdx.x / kWarp; w < groups * kvw;
       w += warps) {
    const int64_t c = w / groups, t0 = (w % groups) * TB;
    const int nt = int(S - t0 < TB ? S - t0 : TB);
    const float* b = static_cast<const float*>(wkv.data) + c * D;  // read when plain
    const float* a = emb + t0 * D;
    float acc[TB];
#pragma unroll
    for (int tt = 0; tt < TB; ++tt) acc[tt] = 0.0f;
    for (int64_t i0 = lane; i0 < D; i0 += kWarp * kUnroll) {
      float bv[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int64_t i = i0 + kWarp * u;
        bv[u] = i >= D ? 0.0f : plain ? b[i] : wkv.value(c, i);
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int64_t i = i0 + kWarp * u;
        if (i >= D) break;
#pragma unroll
        for (int tt = 0; tt < TB; ++tt) {
          if (tt < nt) acc[tt] += a[tt * D + i] * bv[u];
        }
      }
    }
#pragma unroll
    for (int tt = 0; tt < TB; ++tt) {
      if (tt >= nt) break;  // warp-uniform
      float v = acc[tt];
      for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
      if (lane == 0) kv[(t0 + tt) * kvw + c] = v;
    }
  }
}

template <int TB>
cudaError_t launch_engram_kv(const float* emb, const WeightView& wkv, int64_t S, int64_t kvw,
                             int64_t D, float* kv, cudaStream_t stream) {
  const int64_t warps = (S + TB - 1) / TB * kvw;
  engram_kv_kernel<TB><<<blocks_for(warps * kWarp), kThreads, 0, stream>>>(emb, wkv, S, kvw, D, kv);
  return launch_status();
}

// Block-wide FP64 sum of three values (all threads get the totals).
__device__ void block_sum3(double& a, double& b, double& c) {
  __shared__ double part[3][32];
  for (int off = 16; off > 0; off >>= 1) {
    a += __shfl_xor_sync(0xffffffffu, a, off);
    b += __shfl_xor_sync(0xffffffffu, b, off);
    c += __shfl_xor_sync(0xffffffffu, c, off);
  }
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const int warps = (blockDim.x + kWarp - 1) / kWarp;
  if (lane == 0) part[0][warp] = a, part[1][warp] = b, part[2][warp] = c;
  __syncthreads();
  a = b = c = 0.0;
  for (int w = 0; w < warps; ++w) a += part[0][w], b += part[1][w], c += part[2][w];
  __syncthreads();  // part is reused by the next call
}

// One block per (token, stream) (grid-stride): FP64 reductions, the gate, then X += gate · value.
__global__ void engram_update_kernel(float* __restrict__ X, const float* __restrict__ kv,
                                     const float* __restrict__ q_weight,
                                     const float* __restrict__ k_weight,
                                     const uint8_t* __restrict__ token_mask, int64_t S, int64_t n,
                                     int64_t H, float eps, float inv_sqrt_h) {
  pdl_entry();
  const int64_t kvw = (n + 1) * H;
  const float fH = static_cast<float>(H);
  for (int64_t b = blockIdx.x; b < S * n; b += gridDim.x) {
    const int64_t t = b / n, i = b % n;
    float* xi = X + b * H;
    const float* ki = kv + t * kvw + i * H;
    const float* value = kv + t * kvw + n * H;
    const float* qw = q_weight + i * H;
    const float* kw = k_weight + i * H;
    const bool live = token_mask == nullptr || token_mask[t] != 0;  // block-uniform
    float gate = 0.0f;
    if (live) {
      double sx = 0, sk = 0, sd = 0;
      for (int64_t c = threadIdx.x; c < H; c += blockDim.x) {
        const float x = xi[c], kk = ki[c];
        const float w = __fmul_rn(qw[c], kw[c]);
        sx += double(x) * double(x);
        sk += double(kk) * double(kk);
        sd += double(__fmul_rn(x, w)) * double(kk);
      }
      block_sum3(sx, sk, sd);
      const float rstd = (1.0f / sqrtf(static_cast<float>(sx) / fH + eps)) *
                         (1.0f / sqrtf(static_cast<float>(sk) / fH + eps));
      const float dot = static_cast<float>(sd) * rstd * inv_sqrt_h;
      const float a = fabsf(dot);
      const float mag = sqrtf(a < 1e-6f ? 1e-6f : a);
      const float z = copysignf(mag, dot);
      gate = 1.0f / (1.0f + expf(-z));
    }
    // Every read of xi above finished before block_sum3's barrier; writes start only now.
    for (int64_t c = threadIdx.x; c < H; c += blockDim.x) xi[c] = xi[c] + gate * value[c];
    __syncthreads();
  }
}

}  // namespace

cudaError_t engram_forward(float* X, const float* emb, const WeightView& wkv, const float* q_weight,
                           const float* k_weight, const uint8_t* token_mask, int64_t S, int64_t n,
                           int64_t H, int64_t D, float eps, float* kv_workspace,
                           cudaStream_t stream, bool kv_ready) {
  if (S <= 0) return S == 0 ? cudaSuccess : cudaErrorInvalidValue;
  if (n < 1 || H <= 0 || D <= 0 || !kv_workspace) return cudaErrorInvalidValue;
  const int64_t kvw = (n + 1) * H;
  if (!kv_ready && (wkv.rows != kvw || wkv.cols != D || !wkv.data)) return cudaErrorInvalidValue;
  // Tokens per warp: as many as the batch fills (the arithmetic per output is the same).
  cudaError_t err = kv_ready  ? cudaSuccess
                    : S >= 16 ? launch_engram_kv<16>(emb, wkv, S, kvw, D, kv_workspace, stream)
                    : S >= 4  ? launch_engram_kv<4>(emb, wkv, S, kvw, D, kv_workspace, stream)
                              : launch_engram_kv<1>(emb, wkv, S, kvw, D, kv_workspace, stream);
  if (err != cudaSuccess) return err;
  const float inv_sqrt_h = static_cast<float>(std::pow(static_cast<double>(H), -0.5));
  const int64_t blocks = S * n < kMaxBlocks ? S * n : kMaxBlocks;
  engram_update_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(
      X, kv_workspace, q_weight, k_weight, token_mask, S, n, H, eps, inv_sqrt_h);
  return launch_status();
}

}  // namespace dsv41rt::kernels::cuda
