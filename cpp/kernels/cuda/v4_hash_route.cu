#include <cmath>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/moe_route_common.cuh"
#include "kernels/cuda/v4_hash_route.cuh"

namespace dsv41rt::kernels::cuda {
namespace {

// Slots whose logits one block computes at once: 8 lanes each (the CPU dot's 8 partial sums).
constexpr int kSlotsPerPass = kThreads / 8;

// One block per token (grid-stride over tokens). Lane group g = threadIdx.x / 8 computes slot
// j = g, g + 32, ...: its lane l sums x[i] · gate[e, i] over i = 8u + l of the full chunks of 8 in
// u order; lane 0 adds the 8 partial sums and the tail in the CPU's order. Thread 0 then
// normalises in slot order.
__global__ void moe_route_hash_kernel(const float* __restrict__ x, const float* __restrict__ gate,
                                      const int32_t* __restrict__ tid2eid,
                                      const int32_t* __restrict__ tokens, int64_t S, int64_t H,
                                      int64_t E, int64_t k, int64_t vocab, float scale,
                                      int32_t* __restrict__ idx, float* __restrict__ weight) {
  pdl_entry();
  extern __shared__ float score[];  // [k] the routed experts' s, slot order
  __shared__ int valid;
  const int g = threadIdx.x / 8, l = threadIdx.x % 8;
  const unsigned group_mask = 0xFFu << ((threadIdx.x % 32) & ~7);
  const int64_t nfull = H / 8 * 8;
  for (int64_t t = blockIdx.x; t < S; t += gridDim.x) {
    const int64_t tok = tokens[t];
    const bool tok_ok = tok >= 0 && tok < vocab;
    if (threadIdx.x == 0) valid = tok_ok;
    __syncthreads();
    const float* xr = x + t * H;
    for (int64_t j = g; j < k; j += kSlotsPerPass) {
      const int32_t e = tok_ok ? tid2eid[tok * k + j] : -1;
      if (e < 0 || e >= E) {  // the whole group takes this branch (same j)
        if (l == 0) valid = 0;
        continue;
      }
      const float* wr = gate + int64_t(e) * H;
      float acc = 0.0f;
      for (int64_t i = l; i < nfull; i += 8) acc = __fadd_rn(acc, __fmul_rn(xr[i], wr[i]));
      float a[8];
#pragma unroll
      for (int m = 0; m < 8; ++m) a[m] = __shfl_sync(group_mask, acc, m, 8);
      if (l == 0) {
        float tail = 0.0f;
        for (int64_t i = nfull; i < H; ++i) tail = __fadd_rn(tail, __fmul_rn(xr[i], wr[i]));
        score[j] = __fsqrt_rn(route::softplus_ref(route::combine_lanes(a, tail)));
      }
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      int32_t* it = idx + t * k;
      float* wt = weight + t * k;
      if (!valid) {
        for (int64_t j = 0; j < k; ++j) it[j] = -1, wt[j] = NAN;
      } else {
        float sum = 0.0f;
        for (int64_t j = 0; j < k; ++j) sum = __fadd_rn(sum, score[j]);
        const float denom = __fadd_rn(sum, 1e-20f);
        for (int64_t j = 0; j < k; ++j) {
          it[j] = tid2eid[tok * k + j];
          wt[j] = __fmul_rn(__fdiv_rn(score[j], denom), scale);
        }
      }
    }
    __syncthreads();  // score and valid are reused by the next token
  }
}

}  // namespace

cudaError_t moe_route_hash(const float* x, const float* gate, const int32_t* tid2eid,
                           const int32_t* tokens, int64_t S, int64_t H, int64_t E, int64_t k,
                           int64_t vocab, float routed_scaling_factor, int32_t* idx, float* weight,
                           cudaStream_t stream) {
  if (S < 0 || H <= 0 || E <= 0 || k < 1 || vocab < 1) return cudaErrorInvalidValue;
  if (S == 0) return cudaSuccess;
  if (!x || !gate || !tid2eid || !tokens || !idx || !weight) return cudaErrorInvalidValue;
  const size_t smem = size_t(k) * sizeof(float);
  if (smem > 48 * 1024) return cudaErrorInvalidValue;
  const unsigned blocks = unsigned(S < kMaxBlocks ? S : kMaxBlocks);
  moe_route_hash_kernel<<<blocks, kThreads, smem, stream>>>(
      x, gate, tid2eid, tokens, S, H, E, k, vocab, routed_scaling_factor, idx, weight);
  return launch_status();
}

}  // namespace dsv41rt::kernels::cuda
