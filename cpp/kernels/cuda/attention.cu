#include <cooperative_groups.h>
#include <cuda_pipeline.h>

#include <cmath>

#include "kernels/cuda/attention.cuh"
#include "kernels/cuda/common.cuh"

namespace dsv41rt::kernels::cuda {
namespace {

namespace cg = cooperative_groups;

// All heads of a query read the same key rows (one shared KV latent), so a block takes a group of
// kHeadsPerBlock heads and reads each key once for all of them: the first version (one block per
// head) read every key row 64 times at V4.1's 64 heads (72 us per layer at B 1, 4k context;
// 346 us at B 8; 53% of a 4k prefill). The arithmetic is that version's, operation for operation
// (same dot-product order, block reductions, FMA contractions), so each head's output is bitwise
// what it gave while a rank has at most kSuperKeys keys (K <= 4096); past that the online
// softmax rescales every kSuperKeys keys instead of every 1024.
constexpr int kHeadsPerBlock = 8;  // = warps per block
constexpr int kThreadsPerBlock = 32 * kHeadsPerBlock;
constexpr int kChunkKeys = 32;   // key rows staged in shared memory at a time
constexpr int kSuperKeys = 512;  // keys whose logits are held at once (one softmax pass)
constexpr int kMaxD = 512;       // 2 channels per thread in P·V, 16 per lane in Q·K
constexpr int kLaneD = kMaxD / 32;
// A query's key list is split over a cluster of kKvSplit blocks (a constant, so a row's
// summation order never depends on the batch): rank r takes keys [r * per, (r + 1) * per),
// per = ceil(K / kKvSplit), and the partials are combined through distributed shared memory in
// rank order.
constexpr int kKvSplit = 8;

__device__ __forceinline__ float warp_sum(float v) {
  for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
  for (int off = 16; off > 0; off >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, off));
  return v;
}

struct AttnShape {
  int64_t H, D, T1, T, K;
  float scale;
  bool vec_stage;  // key arrays 16-byte aligned: float4 staging loads
};

// Copies key rows rows[0, n) (the valid ones) into keys_sh [kChunkKeys][D]; D % 4 == 0. Aligned
// arrays go through cp.async (every 16-byte piece in flight at once, no registers); the caller's
// __syncthreads() after it publishes the rows.
__device__ void stage_keys(const float* kv, const float* kv2, const AttnShape& sh,
                           const int32_t* rows, int n, float* keys_sh) {
  const int q = int(sh.D / 4), total = n * q;  // <= 32 * 128
  auto src = [&](int32_t j) {
    return int64_t(j) < sh.T1 ? kv + int64_t(j) * sh.D : kv2 + (int64_t(j) - sh.T1) * sh.D;
  };
  if (sh.vec_stage) {
    for (int i = threadIdx.x; i < total; i += blockDim.x) {
      const int32_t j = rows[i / q];
      if (j >= 0) __pipeline_memcpy_async(keys_sh + 4 * i, src(j) + 4 * (i % q), 16);
    }
    __pipeline_commit();
    __pipeline_wait_prior(0);
    return;
  }
  for (int i = threadIdx.x; i < total; i += blockDim.x) {
    const int32_t j = rows[i / q];
    if (j < 0) continue;
    const float* r = src(j) + 4 * (i % q);
    reinterpret_cast<float4*>(keys_sh)[i] = make_float4(r[0], r[1], r[2], r[3]);
  }
}

// Block (query s, head group g; rank r). Per super-chunk of up to kSuperKeys of its keys:
//  1. the row indices are staged (invalid ones, -1 or outside [0, T), become -1 and are skipped);
//  2. Q·K, 32 key rows at a time through shared memory: warp w computes the logits of heads
//     4(w & 1) .. +3 for keys i ≡ w >> 1 (mod 4), lane-strided (lane d, d + 32, ...) and a
//     butterfly sum;
//  3. per head, the max m_new (with the previous super-chunks'), probabilities in place, and
//     their sum (thread-strided partials, warp butterflies, warps in order); running state m_run
//     (-inf before any valid key) and denom = Σ exp(l - m_run);
//  4. P·V, the key rows staged again: thread t adds keys in order to channels 2t, 2t + 1 of every
//     head (after rescaling them to m_new).
// Rank r then combines head h0 + r: the sink joins the max, m = max(sink, m_0 .. m_7), and writes
// out = Σ_r o_r · exp(m_r - m) / (exp(sink - m) + Σ_r denom_r · exp(m_r - m)), ranks in order.
__global__ void __cluster_dims__(1, kKvSplit, 1) __launch_bounds__(kThreadsPerBlock, 2)
    sparse_attention_kernel(const float* __restrict__ q, const float* __restrict__ kv,
                            const float* __restrict__ kv2, const int32_t* __restrict__ indices,
                            const float* __restrict__ sink, AttnShape sh, float* __restrict__ out) {
  pdl_entry();
  extern __shared__ float smem[];
  const int D = int(sh.D);
  float* keys_sh = smem;                                            // [kChunkKeys][D]
  float2* o_sh = reinterpret_cast<float2*>(smem + kChunkKeys * D);  // [heads][D / 2] partials
  float* prob = smem + (kChunkKeys + kHeadsPerBlock) * D;           // [heads][kSuperKeys]
  __shared__ int32_t rows[kSuperKeys];
  __shared__ float red[kHeadsPerBlock][kHeadsPerBlock];  // [head][warp] partial sums
  __shared__ float m_sh[kHeadsPerBlock], rescale_sh[kHeadsPerBlock], denom_sh[kHeadsPerBlock];
  cg::cluster_group cluster = cg::this_cluster();
  const int rank = int(cluster.block_rank());
  const int64_t groups = (sh.H + kHeadsPerBlock - 1) / kHeadsPerBlock;
  const int64_t s = blockIdx.x / groups, h0 = (blockIdx.x % groups) * kHeadsPerBlock;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int quad = warp & 1, key_lane = warp >> 1;  // Q·K role
  const int32_t* idx = indices + s * sh.K;
  const int64_t per = (sh.K + kKvSplit - 1) / kKvSplit;
  const int64_t k0 = rank * per < sh.K ? rank * per : sh.K, k1 = k0 + per < sh.K ? k0 + per : sh.K;
  const bool owns = 2 * int(threadIdx.x) < D;  // channels 2t, 2t + 1

  if (owns) {
    for (int h = 0; h < kHeadsPerBlock; ++h)
      o_sh[h * (D / 2) + threadIdx.x] = make_float2(0.0f, 0.0f);
  }
  if (threadIdx.x < kHeadsPerBlock) m_sh[threadIdx.x] = -INFINITY, denom_sh[threadIdx.x] = 0.0f;

  for (int64_t sbase = k0; sbase < k1; sbase += kSuperKeys) {
    const int ns = static_cast<int>(k1 - sbase < kSuperKeys ? k1 - sbase : kSuperKeys);
    for (int i = threadIdx.x; i < ns; i += blockDim.x) {
      const int32_t j = idx[sbase + i];
      rows[i] = (j >= 0 && int64_t(j) < sh.T) ? j : -1;
    }
    // Q·K. This warp's four heads' query channels lane + 32 t (zero past D or H).
    float qr[4][kLaneD];
#pragma unroll
    for (int hh = 0; hh < 4; ++hh) {
      const int64_t h = h0 + 4 * quad + hh;
#pragma unroll
      for (int t = 0; t < kLaneD; ++t) {
        const int d = lane + 32 * t;
        qr[hh][t] = h < sh.H && d < D ? q[(s * sh.H + h) * D + d] : 0.0f;
      }
    }
    for (int c0 = 0; c0 < ns; c0 += kChunkKeys) {
      const int n = ns - c0 < kChunkKeys ? ns - c0 : kChunkKeys;
      __syncthreads();  // rows are published; the previous chunk's keys are consumed
      stage_keys(kv, kv2, sh, rows + c0, n, keys_sh);
      __syncthreads();
      for (int i = key_lane; i < n; i += 4) {
        if (rows[c0 + i] < 0) continue;  // warp-uniform
        const float* kr = keys_sh + i * D;
        float a[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
        for (int t = 0; t < kLaneD; ++t) {
          const int d = lane + 32 * t;
          if (d >= D) break;
          const float k = kr[d];
#pragma unroll
          for (int hh = 0; hh < 4; ++hh) a[hh] += qr[hh][t] * k;
        }
#pragma unroll
        for (int hh = 0; hh < 4; ++hh) {
          const float l = warp_sum(a[hh]);
          if (lane == 0) prob[(4 * quad + hh) * kSuperKeys + c0 + i] = l * sh.scale;
        }
      }
    }
    __syncthreads();
    // Softmax state per head: the max (exact in any order), then probabilities and their sum.
    {
      float cm = -INFINITY;
      for (int i = lane; i < ns; i += 32) {
        if (rows[i] >= 0) cm = fmaxf(cm, prob[warp * kSuperKeys + i]);
      }
      cm = warp_max(cm);
      if (lane == 0) {
        const float m_run = m_sh[warp], m_new = fmaxf(m_run, cm);
        // m_new == m_run also covers m_run = m_new = -inf (no valid key yet): keep 1. A first
        // valid key after none gives expf(-inf) = 0 on an all-zero partial.
        rescale_sh[warp] = m_new == m_run ? 1.0f : expf(m_run - m_new);
        m_sh[warp] = m_new;
      }
    }
    __syncthreads();
    {
      float psum[kHeadsPerBlock];
#pragma unroll
      for (int h = 0; h < kHeadsPerBlock; ++h) {
        psum[h] = 0.0f;
        const float m_new = m_sh[h];
        for (int i = threadIdx.x; i < ns; i += blockDim.x) {
          const float p = rows[i] >= 0 ? expf(prob[h * kSuperKeys + i] - m_new) : 0.0f;
          prob[h * kSuperKeys + i] = p;
          psum[h] += p;
        }
        psum[h] = warp_sum(psum[h]);
      }
      if (lane == 0) {
#pragma unroll
        for (int h = 0; h < kHeadsPerBlock; ++h) red[h][warp] = psum[h];
      }
    }
    __syncthreads();
    if (threadIdx.x < kHeadsPerBlock) {
      const int h = threadIdx.x;
      float r = red[h][0];
      for (int w = 1; w < kHeadsPerBlock; ++w) r = r + red[h][w];
      denom_sh[h] = denom_sh[h] * rescale_sh[h] + r;
    }
    // P·V over the same keys, staged again.
    float2 acc[kHeadsPerBlock];
    if (owns) {
#pragma unroll
      for (int h = 0; h < kHeadsPerBlock; ++h) {
        const float2 o = o_sh[h * (D / 2) + threadIdx.x];
        acc[h] = make_float2(o.x * rescale_sh[h], o.y * rescale_sh[h]);
      }
    }
    for (int c0 = 0; c0 < ns; c0 += kChunkKeys) {
      const int n = ns - c0 < kChunkKeys ? ns - c0 : kChunkKeys;
      __syncthreads();  // the previous chunk's keys are consumed
      stage_keys(kv, kv2, sh, rows + c0, n, keys_sh);
      __syncthreads();
      if (!owns) continue;
      const float2* keys2 = reinterpret_cast<const float2*>(keys_sh);
      for (int i = 0; i < n; ++i) {
        if (rows[c0 + i] < 0) continue;  // block-uniform
        const float2 v = keys2[i * (D / 2) + threadIdx.x];
#pragma unroll
        for (int h = 0; h < kHeadsPerBlock; ++h) {
          const float p = prob[h * kSuperKeys + c0 + i];
          acc[h].x += p * v.x;
          acc[h].y += p * v.y;
        }
      }
    }
    if (owns) {
#pragma unroll
      for (int h = 0; h < kHeadsPerBlock; ++h) o_sh[h * (D / 2) + threadIdx.x] = acc[h];
    }
    __syncthreads();  // the next super-chunk overwrites rows and probabilities
  }
  cluster.sync();  // every partial is complete and visible to the cluster
  // Rank r combines head h0 + r (one head per rank: the chain of remote reads runs on all ranks at
  // once instead of eight times over on rank 0).
  static_assert(kKvSplit == kHeadsPerBlock, "one head per rank in the combine");
  {
    const int hh = rank;
    if (h0 + hh < sh.H) {
      const int64_t h = h0 + hh;
      float ms[kKvSplit], f[kKvSplit];
      float m = sink[h];
#pragma unroll
      for (int r = 0; r < kKvSplit; ++r) {
        ms[r] = *cluster.map_shared_rank(&m_sh[hh], r);
        m = fmaxf(m, ms[r]);
      }
      float total = m == -INFINITY ? 1.0f : expf(sink[h] - m);  // -inf max: no key, zero output
#pragma unroll
      for (int r = 0; r < kKvSplit; ++r) {
        f[r] = ms[r] == -INFINITY ? 0.0f : expf(ms[r] - m);
        total += *cluster.map_shared_rank(&denom_sh[hh], r) * f[r];
      }
      const float inv = 1.0f / total;
      if (owns) {
        float2 o = make_float2(0.0f, 0.0f);
#pragma unroll
        for (int r = 0; r < kKvSplit; ++r) {
          const float2 v = cluster.map_shared_rank(o_sh, r)[hh * (D / 2) + threadIdx.x];
          o.x += v.x * f[r];
          o.y += v.y * f[r];
        }
        float* oh = out + (s * sh.H + h) * D + 2 * threadIdx.x;
        oh[0] = o.x * inv;
        oh[1] = o.y * inv;
      }
    }
  }
  cluster.sync();  // every rank has read the others' shared memory
}

}  // namespace

cudaError_t sparse_attention_split(const float* q, const float* kv_a, int64_t T_a,
                                   const float* kv_b, int64_t T_b, const int32_t* indices,
                                   const float* sink, int64_t S, int64_t n_heads, int64_t D,
                                   int64_t K, float scale, float* out, cudaStream_t stream) {
  if (S < 0 || n_heads <= 0 || D <= 0 || T_a < 0 || T_b < 0 || K < 0) return cudaErrorInvalidValue;
  if (D > kMaxD || D % 4 != 0) return cudaErrorInvalidValue;  // V4 / V4.1: 512
  if (S == 0) return cudaSuccess;
  const int64_t groups = (n_heads + kHeadsPerBlock - 1) / kHeadsPerBlock;
  if (S > 0x7fffffff / groups) return cudaErrorInvalidValue;
  const bool vec =
      reinterpret_cast<uintptr_t>(kv_a) % 16 == 0 && reinterpret_cast<uintptr_t>(kv_b) % 16 == 0;
  const AttnShape sh{n_heads, D, T_a, T_a + T_b, K, scale, vec};
  const size_t smem =
      (size_t(kChunkKeys + kHeadsPerBlock) * size_t(D) + size_t(kHeadsPerBlock) * kSuperKeys) *
      sizeof(float);
  const cudaError_t attr = cudaFuncSetAttribute(
      sparse_attention_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
  if (attr != cudaSuccess) return attr;
  const dim3 grid(static_cast<unsigned>(S * groups), kKvSplit);
  sparse_attention_kernel<<<grid, kThreadsPerBlock, smem, stream>>>(q, kv_a, kv_b, indices, sink,
                                                                    sh, out);
  return launch_status();
}

}  // namespace dsv41rt::kernels::cuda
