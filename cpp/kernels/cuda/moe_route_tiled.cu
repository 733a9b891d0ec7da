// The score router for many tokens (prefill; contract: kernels/moe.h moe_route; exactness:
// kernels/cuda/moe.cuh). moe_route.cu's cluster per token restages the whole gate matrix for
// every token (0.66 MB at bench-40's E 32, H 5120: 2 ms per 4,096-token layer); here a block takes
// kTileTokens tokens and stages each chunk of gate rows once for all of them. The arithmetic per
// (token, expert) is the same: lane j of an 8-lane group accumulates elements 8u + j in order with
// explicit _rn products and sums, the 8 lane sums and the tail are added in the CPU's order, and
// the selection is the shared warp routine, so the bits equal moe_route.cu's and the CPU's.
#include <cuda_pipeline.h>

#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/moe.cuh"
#include "kernels/cuda/moe_route_common.cuh"

namespace dsv41rt::kernels::cuda {
namespace {

constexpr int kTileTokens = 16;
constexpr int kGroups = 32;  // 8-lane groups of a block: 32 experts per pass
constexpr int kBlockThreads = 8 * kGroups;
constexpr int kRowPad = 8;  // floats of padding per staged row (bank spread)
constexpr size_t kSmemBudget = 200 * 1024;

struct TiledShape {
  int64_t S, H, E, k;
  int64_t chunk;  // columns staged per pass (a multiple of 8)
  bool vec4;      // x and gate rows 16-byte aligned, H % 4 == 0
};

__global__ void __launch_bounds__(kBlockThreads)
    moe_route_tiled_kernel(const float* __restrict__ x, const float* __restrict__ gate_w,
                           const float* __restrict__ bias, TiledShape sh, float scale,
                           bool normalize, int32_t* __restrict__ idx, float* __restrict__ weight) {
  pdl_entry();
  extern __shared__ float smem[];
  const int64_t ld = sh.chunk + kRowPad;
  float* xs = smem;                           // [kTileTokens][ld]
  float* ws = xs + kTileTokens * ld;          // [kGroups][ld]
  float* s_all = ws + kGroups * ld;           // [kTileTokens][E] unbiased scores
  float* c_all = s_all + kTileTokens * sh.E;  // [kTileTokens][E] choices (s + bias)
  unsigned char* taken = reinterpret_cast<unsigned char*>(c_all + kTileTokens * sh.E);
  const int g = threadIdx.x / 8, j = threadIdx.x % 8;
  const unsigned gmask = 0xFFu << ((threadIdx.x % 32) & ~7);
  const int64_t t0 = int64_t(blockIdx.x) * kTileTokens;
  const int nt = static_cast<int>(sh.S - t0 < kTileTokens ? sh.S - t0 : kTileTokens);
  const int64_t nfull = sh.H / 8 * 8;

  for (int64_t e0 = 0; e0 < sh.E; e0 += kGroups) {  // one pass per 32 experts
    const int64_t rows = sh.E - e0 < kGroups ? sh.E - e0 : kGroups;
    float acc[kTileTokens];
#pragma unroll
    for (int tb = 0; tb < kTileTokens; ++tb) acc[tb] = 0.0f;
    for (int64_t c0 = 0; c0 < nfull; c0 += sh.chunk) {
      const int64_t n = nfull - c0 < sh.chunk ? nfull - c0 : sh.chunk;
      __syncthreads();  // the previous chunk has been consumed
      // Rows 0 .. nt - 1: the tokens' x; then the pass's gate rows.
      auto src_row = [&](int64_t r) {
        return r < nt ? x + (t0 + r) * sh.H : gate_w + (e0 + r - nt) * sh.H;
      };
      auto dst_row = [&](int64_t r) { return r < nt ? xs + r * ld : ws + (r - nt) * ld; };
      const int64_t total_rows = nt + rows;
      if (sh.vec4) {
        const int64_t q = n / 4, total = total_rows * q;
        for (int64_t i = threadIdx.x; i < total; i += blockDim.x)
          __pipeline_memcpy_async(dst_row(i / q) + 4 * (i % q), src_row(i / q) + c0 + 4 * (i % q),
                                  16);
        __pipeline_commit();
        __pipeline_wait_prior(0);
      } else {
        const int64_t total = total_rows * n;
        for (int64_t i = threadIdx.x; i < total; i += blockDim.x)
          dst_row(i / n)[i % n] = src_row(i / n)[c0 + i % n];
      }
      __syncthreads();
      if (g < rows) {
        const float* wr = ws + g * ld;
        for (int64_t u = 0; u < n; u += 8) {
          const float w = wr[u + j];
#pragma unroll
          for (int tb = 0; tb < kTileTokens; ++tb) {
            if (tb < nt) acc[tb] = __fadd_rn(acc[tb], __fmul_rn(xs[tb * ld + u + j], w));
          }
        }
      }
    }
    if (g < rows) {  // whole groups of 8 lanes, aligned in their warp
      const int64_t e = e0 + g;
      const float* wr = gate_w + e * sh.H;
#pragma unroll
      for (int tb = 0; tb < kTileTokens; ++tb) {
        if (tb >= nt) break;
        float a[8];
#pragma unroll
        for (int m = 0; m < 8; ++m) a[m] = __shfl_sync(gmask, acc[tb], m, 8);
        if (j == 0) {
          const float* xr = x + (t0 + tb) * sh.H;
          float tail = 0.0f;
          for (int64_t i = nfull; i < sh.H; ++i) tail = __fadd_rn(tail, __fmul_rn(xr[i], wr[i]));
          const float s = __fsqrt_rn(route::softplus_ref(route::combine_lanes(a, tail)));
          s_all[tb * sh.E + e] = s;
          c_all[tb * sh.E + e] = bias ? __fadd_rn(s, bias[e]) : s;
        }
      }
    }
  }
  for (int64_t i = threadIdx.x; i < int64_t(nt) * sh.E; i += blockDim.x) taken[i] = 0;
  __syncthreads();
  const int warp = threadIdx.x / 32;
  for (int tb = warp; tb < nt; tb += kBlockThreads / 32) {
    route::select_experts(s_all + tb * sh.E, c_all + tb * sh.E, taken + tb * sh.E, sh.E, sh.k,
                          normalize, scale, idx + (t0 + tb) * sh.k, weight + (t0 + tb) * sh.k);
  }
}

}  // namespace

cudaError_t moe_route_tiled(const float* x, const float* gate_w, const float* bias, int64_t S,
                            int64_t H, int64_t E, int64_t k, float routed_scaling_factor,
                            bool normalize, int32_t* idx, float* weight, cudaStream_t stream) {
  if (S <= 0) return S == 0 ? cudaSuccess : cudaErrorInvalidValue;
  if (H <= 0 || E <= 0 || k < 1 || k > E) return cudaErrorInvalidValue;
  TiledShape sh{S, H, E, k, 0, false};
  sh.vec4 = H % 4 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0 &&
            reinterpret_cast<uintptr_t>(gate_w) % 16 == 0;
  // Staging width: as many columns as the budget holds for the tile's x and 32 gate rows.
  const size_t fixed = size_t(2 * kTileTokens * E) * sizeof(float) + size_t(kTileTokens * E);
  if (fixed + size_t(kTileTokens + kGroups) * (8 + kRowPad) * sizeof(float) > kSmemBudget)
    return cudaErrorInvalidValue;  // E beyond what a tile's scores fit in
  const int64_t floats = int64_t((kSmemBudget - fixed) / sizeof(float));
  const int64_t by_budget = (floats / (kTileTokens + kGroups) - kRowPad) / 8 * 8;
  const int64_t nfull = H / 8 * 8;
  sh.chunk = by_budget < nfull ? by_budget : nfull;
  if (sh.chunk < 8) sh.chunk = 8;
  const size_t smem =
      size_t((kTileTokens + kGroups) * (sh.chunk + kRowPad)) * sizeof(float) + fixed;
  const cudaError_t attr = cudaFuncSetAttribute(
      moe_route_tiled_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
  if (attr != cudaSuccess) return attr;
  const int64_t blocks = (S + kTileTokens - 1) / kTileTokens;
  if (blocks > 0x7fffffff) return cudaErrorInvalidValue;
  moe_route_tiled_kernel<<<static_cast<unsigned>(blocks), kBlockThreads, smem, stream>>>(
      x, gate_w, bias, sh, routed_scaling_factor, normalize, idx, weight);
  return launch_status();
}

}  // namespace dsv41rt::kernels::cuda
