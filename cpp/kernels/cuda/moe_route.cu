// The score router (contract: kernels/moe.h moe_route; exactness: kernels/cuda/moe.cuh).
//
// Why a cluster: a token's logits are E dot products of H terms, and the CPU's summation order
// (kernels/cpu/linear.cc `dot`: lane j of 8 accumulates elements i + j of every full chunk of 8)
// allows at most 8 threads per expert. One block per token (the first version) left E * 8 threads
// to stream the whole gate matrix with a short run of loads in flight each: 69 us per token at
// bench-40's E 32, H 5120 (0.66 MB), 2.8 ms of a 18 ms decode step. Here each token is a cluster of
// kRouteSplit blocks; block r stages the rows of its experts [r * per, (r + 1) * per) chunk by
// chunk into shared memory with cp.async (every piece in flight at once), the lanes then walk
// shared memory in the CPU's order, and block 0 gathers every score through distributed shared
// memory and runs the CPU's k-pass selection with one warp.
#include <cooperative_groups.h>
#include <cuda_pipeline.h>

#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/moe.cuh"
#include "kernels/cuda/moe_route_common.cuh"

namespace dsv41rt::kernels::cuda {
namespace {

namespace cg = cooperative_groups;

constexpr int kRouteSplit = 8;            // blocks per token (a portable cluster size)
constexpr int kMaxExpertsPerBlock = 128;  // 8 lanes each: 1024 threads
constexpr int kRowPad = 8;                // floats of padding per staged row (bank spread)
constexpr size_t kRouteSmemBudget = 200 * 1024;

struct RouteShape {
  int64_t S, H, E, k;
  int64_t per;    // experts per block
  int64_t chunk;  // columns staged per pass (a multiple of 8)
  bool vec4;      // x and gate rows 16-byte aligned, H % 4 == 0
};

// Copies x[c0, c0 + n) and the block's gate rows [e0, e0 + rows) over the same columns into
// shared memory (row stride ld); n is a multiple of 8.
__device__ void stage_chunk(const float* xr, const float* gate_w, const RouteShape& sh, int64_t e0,
                            int64_t rows, int64_t c0, int64_t n, int64_t ld, float* xs, float* ws) {
  auto src_row = [&](int64_t r) { return r == 0 ? xr : gate_w + (e0 + r - 1) * sh.H; };
  auto dst_row = [&](int64_t r) { return r == 0 ? xs : ws + (r - 1) * ld; };
  // Row by row, the block's threads across the columns: a flat index split by a 64-bit / and %
  // per piece cost ~85 instructions a piece and was most of this kernel's time (ncu, bench-40
  // decode: 136k instructions, 16 us per token).
  const int total_rows = static_cast<int>(rows) + 1;
  if (sh.vec4) {  // cp.async: every 16-byte piece in flight at once, no registers
    const int q = static_cast<int>(n / 4);
    for (int r = 0; r < total_rows; ++r) {
      const float* src = src_row(r) + c0;
      float* dst = dst_row(r);
      for (int i = threadIdx.x; i < q; i += blockDim.x)
        __pipeline_memcpy_async(dst + 4 * i, src + 4 * i, 16);
    }
    __pipeline_commit();
    __pipeline_wait_prior(0);
  } else {
    for (int r = 0; r < total_rows; ++r) {
      const float* src = src_row(r) + c0;
      float* dst = dst_row(r);
      for (int i = threadIdx.x; i < static_cast<int>(n); i += blockDim.x) dst[i] = src[i];
    }
  }
}

// Grid (kRouteSplit, tokens), cluster (kRouteSplit, 1, 1). Group g = threadIdx.x / 8 of block r
// owns expert e = r * per + g; its lane j accumulates staged elements 8u + j of every chunk in
// order, so the logit is the CPU's bit for bit (explicit _rn intrinsics: no FMA contraction).
__global__ void __cluster_dims__(kRouteSplit, 1, 1)
    moe_route_kernel(const float* __restrict__ x, const float* __restrict__ gate_w,
                     const float* __restrict__ bias, RouteShape sh, float scale, bool normalize,
                     int32_t* __restrict__ idx, float* __restrict__ weight) {
  pdl_entry();
  extern __shared__ float smem[];
  const int64_t ld = sh.chunk + kRowPad;
  float* xs = smem;                  // [chunk]
  float* ws = xs + ld;               // [per][ld]
  float* s_part = ws + sh.per * ld;  // [per] this block's unbiased scores
  float* c_part = s_part + sh.per;   // [per] this block's s + bias
  float* s_all = c_part + sh.per;    // [E] block 0: every score
  float* c_all = s_all + sh.E;       // [E]
  unsigned char* taken = reinterpret_cast<unsigned char*>(c_all + sh.E);  // [E]
  cg::cluster_group cluster = cg::this_cluster();
  const int64_t rank = cluster.block_rank();
  const int64_t e0 = rank * sh.per;
  const int64_t rows = e0 < sh.E ? (sh.E - e0 < sh.per ? sh.E - e0 : sh.per) : 0;
  const int64_t g = threadIdx.x / 8;
  const int j = threadIdx.x % 8;
  const unsigned gmask = 0xFFu << ((threadIdx.x % 32) & ~7);
  const int64_t nfull = sh.H / 8 * 8;

  for (int64_t t = blockIdx.y; t < sh.S; t += gridDim.y) {
    const float* xr = x + t * sh.H;
    float acc = 0.0f;
    for (int64_t c0 = 0; c0 < nfull; c0 += sh.chunk) {
      const int64_t n = nfull - c0 < sh.chunk ? nfull - c0 : sh.chunk;
      __syncthreads();  // the previous chunk has been consumed
      stage_chunk(xr, gate_w, sh, e0, rows, c0, n, ld, xs, ws);
      __syncthreads();
      if (g < rows) {
        const float* wr = ws + g * ld;
        // kBatch products at a time (their shared-memory reads in flight together), then added in
        // order: the same arithmetic as one product and add per step.
        constexpr int kBatch = 16;
        int64_t u = 0;
        for (; u + 8 * kBatch <= n; u += 8 * kBatch) {
          float p[kBatch];
#pragma unroll
          for (int b = 0; b < kBatch; ++b) p[b] = __fmul_rn(xs[u + 8 * b + j], wr[u + 8 * b + j]);
#pragma unroll
          for (int b = 0; b < kBatch; ++b) acc = __fadd_rn(acc, p[b]);
        }
        for (; u < n; u += 8) acc = __fadd_rn(acc, __fmul_rn(xs[u + j], wr[u + j]));
      }
    }
    if (g < rows) {  // whole groups of 8 lanes, aligned in their warp
      float a[8];
#pragma unroll
      for (int m = 0; m < 8; ++m) a[m] = __shfl_sync(gmask, acc, m, 8);
      if (j == 0) {
        const int64_t e = e0 + g;
        const float* wr = gate_w + e * sh.H;
        float tail = 0.0f;
        for (int64_t i = nfull; i < sh.H; ++i) tail = __fadd_rn(tail, __fmul_rn(xr[i], wr[i]));
        const float logit = route::combine_lanes(a, tail);
        const float s = __fsqrt_rn(route::softplus_ref(logit));
        s_part[g] = s;
        c_part[g] = bias ? __fadd_rn(s, bias[e]) : s;
      }
    }
    cluster.sync();  // every block's scores are complete
    if (rank == 0) {
      for (int64_t e = threadIdx.x; e < sh.E; e += blockDim.x) {
        const unsigned r = unsigned(e / sh.per);
        s_all[e] = *cluster.map_shared_rank(s_part + e % sh.per, r);
        c_all[e] = *cluster.map_shared_rank(c_part + e % sh.per, r);
        taken[e] = 0;
      }
    }
    cluster.sync();  // block 0 has read the others' scores (they may move on or exit)
    if (rank == 0 && threadIdx.x < 32) {
      route::select_experts(s_all, c_all, taken, sh.E, sh.k, normalize, scale, idx + t * sh.k,
                            weight + t * sh.k);
    }
    // The next token restages after a __syncthreads(); block 0's selection reads only its own
    // shared memory, which no other block writes.
  }
}

}  // namespace

cudaError_t moe_route(const float* x, const float* gate_w, const float* bias, int64_t S, int64_t H,
                      int64_t E, int64_t k, float routed_scaling_factor, bool normalize,
                      int32_t* idx, float* weight, cudaStream_t stream) {
  if (S <= 0) return S == 0 ? cudaSuccess : cudaErrorInvalidValue;
  if (H <= 0 || E <= 0 || k < 1 || k > E) return cudaErrorInvalidValue;
  RouteShape sh{S, H, E, k, (E + kRouteSplit - 1) / kRouteSplit, 0, false};
  if (sh.per > kMaxExpertsPerBlock) return cudaErrorInvalidValue;  // E <= 1024
  if (S >= kRouteTiledMinTokens) {  // prefill: gate rows staged once per tile of tokens
    return moe_route_tiled(x, gate_w, bias, S, H, E, k, routed_scaling_factor, normalize, idx,
                           weight, stream);
  }
  sh.vec4 = H % 4 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0 &&
            reinterpret_cast<uintptr_t>(gate_w) % 16 == 0;
  // Staging width: as many columns as the budget holds for x plus `per` padded rows.
  const size_t fixed = size_t(2 * sh.per + 2 * E) * sizeof(float) + size_t(E);
  const int64_t floats = int64_t((kRouteSmemBudget - fixed) / sizeof(float));
  const int64_t by_budget = (floats / (sh.per + 1) - kRowPad) / 8 * 8;
  const int64_t nfull = H / 8 * 8;
  sh.chunk = by_budget < nfull ? by_budget : nfull;
  if (sh.chunk < 8) sh.chunk = 8;
  const size_t smem = size_t((sh.per + 1) * (sh.chunk + kRowPad)) * sizeof(float) + fixed;
  if (smem > kRouteSmemBudget + 64) return cudaErrorInvalidValue;
  const cudaError_t attr = cudaFuncSetAttribute(
      moe_route_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
  if (attr != cudaSuccess) return attr;
  int threads = int(8 * sh.per + 31) / 32 * 32;
  if (threads < kThreads) threads = kThreads;
  const dim3 grid(kRouteSplit, static_cast<unsigned>(S < kMaxBlocks ? S : kMaxBlocks));
  moe_route_kernel<<<grid, threads, smem, stream>>>(x, gate_w, bias, sh, routed_scaling_factor,
                                                    normalize, idx, weight);
  return launch_status();
}

}  // namespace dsv41rt::kernels::cuda
