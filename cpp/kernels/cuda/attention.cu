#include <cooperative_groups.h>

#include <cmath>

#include "kernels/cuda/attention.cuh"
#include "kernels/cuda/common.cuh"

namespace dsv41rt::kernels::cuda {
namespace {

// Keys per chunk held in shared memory (index + logit). K <= kChunk (the usual case: top-k plus
// window) is one pass with the CPU reference's exact structure (global max, then exp-sum);
// longer key lists run an online softmax over chunks (rescaling the partial sums).
constexpr int kChunk = 1024;

struct Sum {
  __device__ float operator()(float a, float b) const { return a + b; }
};
struct Max {
  __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

template <class Op>
__device__ __forceinline__ float warp_reduce(float v, Op op) {
  for (int off = 16; off > 0; off >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, off));
  return v;
}
__device__ __forceinline__ float warp_sum(float v) { return warp_reduce(v, Sum{}); }

// Block reduction: every thread gets the same value (warp partials combined in a fixed order).
// Must be called by all threads of the block; `red` holds >= 32 floats.
template <class Op>
__device__ float block_reduce(float v, float* red, Op op) {
  v = warp_reduce(v, op);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, nwarps = blockDim.x / 32;
  if (lane == 0) red[warp] = v;
  __syncthreads();
  float r = red[0];
  for (int w = 1; w < nwarps; ++w) r = op(r, red[w]);
  __syncthreads();
  return r;
}

// The key list of each (query, head) is split over a cluster of kKvSplit blocks (a constant, so a
// row's summation order never depends on the batch): block r takes keys [r * per, (r + 1) * per)
// with per = ceil(K / kKvSplit), and block 0 combines the partials through distributed shared
// memory, in rank order. At decode sizes this puts 8x more blocks on the key reads.
constexpr int kKvSplit = 8;

// Block (query s * H + h, rank r), blockDim.x a multiple of 32. Per chunk of its keys: the row
// indices are staged in shared memory (invalid ones, -1 or outside [0, T), become -1 and are
// skipped), one warp per key computes the logit, the block takes the max (including the previous
// chunks), turns logits into probabilities in place, and every thread updates its own channels
// d = tid, tid + blockDim, ... of the partial output o_sh [D] (dynamic shared memory). Running
// state: m_run (max so far, -inf before any valid key) and denom (Σ exp(l - m_run)). Then block
// 0 takes the sink into the max, m = max(sink, m_0 .. m_7), and writes
// out = Σ_r o_r · exp(m_r - m) / (exp(sink - m) + Σ_r denom_r · exp(m_r - m)), ranks in order.
// Keys j < T1 are rows of kv, the rest rows j - T1 of kv2 (T = T1 + rows of kv2).
__global__ void __cluster_dims__(1, kKvSplit, 1)
    sparse_attention_kernel(const float* __restrict__ q, const float* __restrict__ kv, int64_t T1,
                            const float* __restrict__ kv2, const int32_t* __restrict__ indices,
                            const float* __restrict__ sink, int64_t H, int64_t D, int64_t T,
                            int64_t K, float scale, float* __restrict__ out) {
  namespace cg = cooperative_groups;
  auto key_row = [&](int32_t j) {
    return int64_t(j) < T1 ? kv + int64_t(j) * D : kv2 + (int64_t(j) - T1) * D;
  };
  extern __shared__ float o_sh[];  // [D]
  __shared__ float logit[kChunk];
  __shared__ int32_t rows[kChunk];
  __shared__ float red[32];
  __shared__ float part_m, part_l;
  cg::cluster_group cluster = cg::this_cluster();
  const int rank = int(cluster.block_rank());
  const int64_t sh = blockIdx.x;  // s * H + h
  const int64_t s = sh / H, h = sh % H;
  const float* qh = q + sh * D;
  const int32_t* idx = indices + s * K;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, nwarps = blockDim.x / 32;
  const int64_t per = (K + kKvSplit - 1) / kKvSplit;
  const int64_t k0 = rank * per < K ? rank * per : K, k1 = k0 + per < K ? k0 + per : K;

  for (int64_t d = threadIdx.x; d < D; d += blockDim.x) o_sh[d] = 0.0f;
  float m_run = -INFINITY;
  float denom = 0.0f;
  for (int64_t base = k0; base < k1; base += kChunk) {
    const int n = static_cast<int>(k1 - base < kChunk ? k1 - base : kChunk);
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
      const int32_t j = idx[base + i];
      rows[i] = (j >= 0 && int64_t(j) < T) ? j : -1;
    }
    __syncthreads();
    for (int i = warp; i < n; i += nwarps) {
      const int32_t j = rows[i];
      if (j < 0) continue;  // warp-uniform
      const float* kr = key_row(j);
      float acc = 0.0f;
#pragma unroll 4
      for (int64_t d = lane; d < D; d += 32) acc += qh[d] * kr[d];
      acc = warp_sum(acc);
      if (lane == 0) logit[i] = acc * scale;
    }
    __syncthreads();
    float cm = -INFINITY;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
      if (rows[i] >= 0) cm = fmaxf(cm, logit[i]);
    }
    cm = block_reduce(cm, red, Max{});
    const float m_new = fmaxf(m_run, cm);
    // m_new == m_run also covers m_run = m_new = -inf (no valid key yet): keep 1. A first valid
    // key after none gives expf(-inf) = 0 on an all-zero partial.
    const float rescale = m_new == m_run ? 1.0f : expf(m_run - m_new);
    float psum = 0.0f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
      const float p = rows[i] >= 0 ? expf(logit[i] - m_new) : 0.0f;
      logit[i] = p;
      psum += p;
    }
    psum = block_reduce(psum, red, Sum{});  // its barriers also publish the probabilities
    denom = denom * rescale + psum;
    for (int64_t d = threadIdx.x; d < D; d += blockDim.x) {
      float acc = o_sh[d] * rescale;
#pragma unroll 8  // independent key loads in flight; the adds keep their order
      for (int i = 0; i < n; ++i) {
        const int32_t j = rows[i];
        if (j >= 0) acc += logit[i] * key_row(j)[d];
      }
      o_sh[d] = acc;
    }
    m_run = m_new;
    __syncthreads();  // the next chunk overwrites rows / logit
  }
  if (threadIdx.x == 0) part_m = m_run, part_l = denom;
  cluster.sync();  // every partial is complete and visible to block 0
  if (rank == 0) {
    float m = sink[h];
    float ms[kKvSplit], ls[kKvSplit];
    const float* os[kKvSplit];
#pragma unroll
    for (int r = 0; r < kKvSplit; ++r) {
      ms[r] = *cluster.map_shared_rank(&part_m, r);
      ls[r] = *cluster.map_shared_rank(&part_l, r);
      os[r] = cluster.map_shared_rank(o_sh, r);
      m = fmaxf(m, ms[r]);
    }
    float f[kKvSplit];
    float total = m == -INFINITY ? 1.0f : expf(sink[h] - m);  // -inf max: no key, zero output
#pragma unroll
    for (int r = 0; r < kKvSplit; ++r) {
      f[r] = ms[r] == -INFINITY ? 0.0f : expf(ms[r] - m);
      total += ls[r] * f[r];
    }
    const float inv = 1.0f / total;
    float* oh = out + sh * D;
    for (int64_t d = threadIdx.x; d < D; d += blockDim.x) {
      float acc = 0.0f;
#pragma unroll
      for (int r = 0; r < kKvSplit; ++r) acc += os[r][d] * f[r];
      oh[d] = acc * inv;
    }
  }
  cluster.sync();  // block 0 has read the other blocks' shared memory
}

}  // namespace

cudaError_t sparse_attention_split(const float* q, const float* kv_a, int64_t T_a,
                                   const float* kv_b, int64_t T_b, const int32_t* indices,
                                   const float* sink, int64_t S, int64_t n_heads, int64_t D,
                                   int64_t K, float scale, float* out, cudaStream_t stream) {
  if (S < 0 || n_heads <= 0 || D <= 0 || T_a < 0 || T_b < 0 || K < 0) return cudaErrorInvalidValue;
  if (S == 0) return cudaSuccess;
  if (S > 0x7fffffff / n_heads) return cudaErrorInvalidValue;
  const int64_t smem = D * int64_t(sizeof(float));
  if (smem > 32 * 1024) return cudaErrorInvalidValue;  // D <= 8192 (V4.1: 512)
  const dim3 grid(static_cast<unsigned>(S * n_heads), kKvSplit);
  sparse_attention_kernel<<<grid, kThreads, size_t(smem), stream>>>(
      q, kv_a, T_a, kv_b, indices, sink, n_heads, D, T_a + T_b, K, scale, out);
  return launch_status();
}

}  // namespace dsv41rt::kernels::cuda
