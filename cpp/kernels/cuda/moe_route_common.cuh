// Pieces shared by the two score-router kernels (moe_route.cu: a cluster per token, for decode;
// moe_route_tiled.cu: tokens in tiles, for prefill), so both give the CPU's bits.
#pragma once

#include <cuda_runtime_api.h>

#include <climits>
#include <cstdint>

namespace dsv41rt::kernels::cuda::route {

// torch softplus(threshold 20) as the CPU computes it (log1pf(expf(x))): each step goes through
// FP64 and is rounded to FP32, which reproduces correctly rounded expf / log1pf.
__device__ inline float softplus_ref(float x) {
  if (x > 20.0f) return x;
  const float e = static_cast<float>(exp(static_cast<double>(x)));
  return static_cast<float>(log1p(static_cast<double>(e)));
}

// A logit from the 8 lane sums (lane j: elements 8u + j) and the tail past the last full chunk of
// 8, added in the CPU's order (kernels/cpu/linear.cc `dot`).
__device__ inline float combine_lanes(const float (&a)[8], float tail) {
  return __fadd_rn(__fadd_rn(__fadd_rn(__fadd_rn(a[0], a[1]), __fadd_rn(a[2], a[3])),
                             __fadd_rn(__fadd_rn(a[4], a[5]), __fadd_rn(a[6], a[7]))),
                   tail);
}

// One token's selection by one full warp: the CPU's k passes (best = first untaken, replaced by
// any strictly greater choice) pick the first untaken expert when its choice is NaN, else the
// lowest index holding the largest non-NaN choice: lanes find both over their experts, the warp
// combines them. Writes it[0, k) and wt[0, k) (normalised, scaled); `taken` [E] starts zeroed.
__device__ inline void select_experts(const float* s_all, const float* c_all, unsigned char* taken,
                                      int64_t E, int64_t k, bool normalize, float scale,
                                      int32_t* it, float* wt) {
  const int lane = threadIdx.x % 32;
  for (int64_t jj = 0; jj < k; ++jj) {
    int first = INT_MAX, best = -1;
    float bv = 0.0f;
    for (int64_t e = lane; e < E; e += 32) {
      if (taken[e]) continue;
      if (first == INT_MAX) first = int(e);
      const float v = c_all[e];
      if (v == v && (best < 0 || v > bv)) best = int(e), bv = v;
    }
    for (int off = 16; off > 0; off >>= 1) {
      first = min(first, __shfl_xor_sync(0xffffffffu, first, off));
      const int ob = __shfl_xor_sync(0xffffffffu, best, off);
      const float ov = __shfl_xor_sync(0xffffffffu, bv, off);
      if (ob >= 0 && (best < 0 || ov > bv || (ov == bv && ob < best))) best = ob, bv = ov;
    }
    const float cf = c_all[first];
    const int chosen = (best < 0 || cf != cf) ? first : best;
    if (lane == 0) {
      taken[chosen] = 1;
      it[jj] = chosen;
      wt[jj] = s_all[chosen];
    }
    __syncwarp();
  }
  if (lane == 0) {
    if (normalize && k > 1) {
      float sum = 0.0f;
      for (int64_t jj = 0; jj < k; ++jj) sum = __fadd_rn(sum, wt[jj]);
      const float denom = __fadd_rn(sum, 1e-20f);
      for (int64_t jj = 0; jj < k; ++jj) wt[jj] = __fdiv_rn(wt[jj], denom);
    }
    for (int64_t jj = 0; jj < k; ++jj) wt[jj] = __fmul_rn(wt[jj], scale);
  }
}

}  // namespace dsv41rt::kernels::cuda::route

namespace dsv41rt::kernels::cuda {

/// The router for many tokens (moe_route_tiled.cu): same contract and bits as moe_route; the
/// launcher of moe_route hands it forwards of at least kRouteTiledMinTokens tokens. A tile of 16
/// tokens takes a block ~180 us on bench-40's router whatever the token count below ~2k tokens,
/// while a token's cluster takes ~0.5 us of the GPU: 64 decode rows routed in 183 us tiled vs
/// 39 us by clusters, 4,096 prefill rows in 0.35 ms vs 1.9 ms (H200, 2026-12-04 / 12-03 profiles),
/// so the tiles pay from a few hundred tokens on.
constexpr int64_t kRouteTiledMinTokens = 384;
cudaError_t moe_route_tiled(const float* x, const float* gate_w, const float* bias, int64_t S,
                            int64_t H, int64_t E, int64_t k, float routed_scaling_factor,
                            bool normalize, int32_t* idx, float* weight, cudaStream_t stream);

}  // namespace dsv41rt::kernels::cuda
