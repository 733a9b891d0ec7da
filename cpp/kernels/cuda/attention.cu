#include <cooperative_groups.h>

#include <cmath>

#include "kernels/cuda/attention.cuh"
#include "kernels/cuda/common.cuh"

namespace dsv41rt::kernels::cuda {
namespace {

namespace cg = cooperative_groups;

// All heads of a query read the same key rows (one shared KV latent), so a block takes a group of
// kHeadsPerBlock heads and reads each key once for all of them: the first version (one block per
// head) read every key row 64 times at V4.1's 64 heads (72 us per layer at B 1, 4k context;
// 346 us at B 8; 53% of a 4k prefill).
constexpr int kHeadsPerBlock = 8;  // = warps per block
constexpr int kThreadsPerBlock = 32 * kHeadsPerBlock;
constexpr int kChunkKeys = 32;  // keys staged per pass (one per lane in the softmax)
constexpr int kMaxD = 512;      // 2 channels per thread in P·V, 4 float4 per lane in Q·K
constexpr int kQuads = kMaxD / 128;
// A query's key list is split over a cluster of kKvSplit blocks (a constant, so a row's
// summation order never depends on the batch): rank r takes keys [r * per, (r + 1) * per),
// per = ceil(K / kKvSplit), and rank 0 combines the partials through distributed shared memory in
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

// Copies the chunk's valid key rows into keys_sh [kChunkKeys][D] (invalid rows are not read and
// not used); D % 4 == 0.
__device__ void stage_keys(const float* kv, const float* kv2, const AttnShape& sh,
                           const int32_t* rows, int n, float* keys_sh) {
  const int q = int(sh.D / 4), total = n * q;  // <= 32 * 128
  auto src = [&](int32_t j) {
    return int64_t(j) < sh.T1 ? kv + int64_t(j) * sh.D : kv2 + (int64_t(j) - sh.T1) * sh.D;
  };
  constexpr int kBatch = 4;
  for (int base = threadIdx.x; base < total; base += blockDim.x * kBatch) {
    float4 v[kBatch];
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int i = base + u * int(blockDim.x);
      const int32_t j = i < total ? rows[i / q] : -1;
      if (j < 0) continue;
      const float* r = src(j) + 4 * (i % q);
      v[u] =
          sh.vec_stage ? *reinterpret_cast<const float4*>(r) : make_float4(r[0], r[1], r[2], r[3]);
    }
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int i = base + u * int(blockDim.x);
      if (i < total && rows[i / q] >= 0) reinterpret_cast<float4*>(keys_sh)[i] = v[u];
    }
  }
}

// Block (query s, head group g; rank r). Per chunk of its keys: the row indices are staged
// (invalid ones, -1 or outside [0, T), become -1 and are skipped) and the valid rows copied to
// shared memory; warp w computes the logits of heads 4(w & 1) .. +3 for keys i ≡ w >> 1 (mod 4)
// (lane-strided float4 products, then a butterfly sum); warp w then runs the online softmax of
// head w over the chunk (lane = key; running max m_run, -inf before any valid key, and denom =
// Σ exp(l - m_run)); thread t adds the chunk to channels 2t, 2t + 1 of all the group's heads.
// Rank 0 then takes the sink into the max, m = max(sink, m_0 .. m_7), and writes
// out = Σ_r o_r · exp(m_r - m) / (exp(sink - m) + Σ_r denom_r · exp(m_r - m)), ranks in order.
__global__ void __cluster_dims__(1, kKvSplit, 1) __launch_bounds__(kThreadsPerBlock, 2)
    sparse_attention_kernel(const float* __restrict__ q, const float* __restrict__ kv,
                            const float* __restrict__ kv2, const int32_t* __restrict__ indices,
                            const float* __restrict__ sink, AttnShape sh, float* __restrict__ out) {
  extern __shared__ float4 keys4[];  // [kChunkKeys][D / 4], then o_sh
  float* keys_sh = reinterpret_cast<float*>(keys4);
  // The partial outputs [kHeadsPerBlock][D] live in shared memory between chunks (in registers
  // they would stay live across Q·K and push the kernel past 128 registers).
  float2* o_sh = reinterpret_cast<float2*>(keys_sh + kChunkKeys * sh.D);
  __shared__ float prob[kHeadsPerBlock][kChunkKeys];  // logits, then probabilities
  __shared__ int32_t rows[kChunkKeys];
  __shared__ float rescale_sh[kHeadsPerBlock];
  __shared__ float part_m[kHeadsPerBlock], part_l[kHeadsPerBlock];
  cg::cluster_group cluster = cg::this_cluster();
  const int rank = int(cluster.block_rank());
  const int64_t groups = (sh.H + kHeadsPerBlock - 1) / kHeadsPerBlock;
  const int64_t s = blockIdx.x / groups, h0 = (blockIdx.x % groups) * kHeadsPerBlock;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int quad = warp & 1, key_lane = warp >> 1;  // Q·K role
  const int D = int(sh.D), dq = D / 4;
  const int32_t* idx = indices + s * sh.K;
  const int64_t per = (sh.K + kKvSplit - 1) / kKvSplit;
  const int64_t k0 = rank * per < sh.K ? rank * per : sh.K, k1 = k0 + per < sh.K ? k0 + per : sh.K;

  // This warp's four heads' query channels 4 lane + 128 m .. + 3 (zero past D or H).
  float4 qr[4][kQuads];
#pragma unroll
  for (int hh = 0; hh < 4; ++hh) {
    const int64_t h = h0 + 4 * quad + hh;
#pragma unroll
    for (int m = 0; m < kQuads; ++m) {
      const int c = lane + 32 * m;
      qr[hh][m] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      if (h < sh.H && c < dq) {
        const float* p = q + (s * sh.H + h) * D + 4 * c;
        qr[hh][m] = make_float4(p[0], p[1], p[2], p[3]);
      }
    }
  }
  const bool owns = 2 * int(threadIdx.x) < D;  // channels 2t, 2t + 1
  if (owns) {
#pragma unroll
    for (int h = 0; h < kHeadsPerBlock; ++h)
      o_sh[h * (D / 2) + threadIdx.x] = make_float2(0.0f, 0.0f);
  }
  float m_run = -INFINITY, denom = 0.0f;  // softmax state of head h0 + warp

  for (int64_t base = k0; base < k1; base += kChunkKeys) {
    const int n = static_cast<int>(k1 - base < kChunkKeys ? k1 - base : kChunkKeys);
    if (threadIdx.x < kChunkKeys) {
      const int32_t j = threadIdx.x < n ? idx[base + threadIdx.x] : -1;
      rows[threadIdx.x] = (j >= 0 && int64_t(j) < sh.T) ? j : -1;
    }
    __syncthreads();
    stage_keys(kv, kv2, sh, rows, n, keys_sh);
    __syncthreads();
    for (int i = key_lane; i < n; i += 4) {
      if (rows[i] < 0) continue;  // warp-uniform
      float a[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
      for (int m = 0; m < kQuads; ++m) {
        const int c = lane + 32 * m;
        if (c >= dq) break;
        const float4 k = keys4[i * dq + c];
#pragma unroll
        for (int hh = 0; hh < 4; ++hh) {
          a[hh] += qr[hh][m].x * k.x;
          a[hh] += qr[hh][m].y * k.y;
          a[hh] += qr[hh][m].z * k.z;
          a[hh] += qr[hh][m].w * k.w;
        }
      }
#pragma unroll
      for (int hh = 0; hh < 4; ++hh) {
        const float l = warp_sum(a[hh]);
        if (lane == 0) prob[4 * quad + hh][i] = l * sh.scale;
      }
    }
    __syncthreads();
    {
      const bool valid = lane < n && rows[lane] >= 0;
      const float l = valid ? prob[warp][lane] : -INFINITY;
      const float m_new = fmaxf(m_run, warp_max(l));
      // m_new == m_run also covers m_run = m_new = -inf (no valid key yet): keep 1. A first valid
      // key after none gives expf(-inf) = 0 on an all-zero partial.
      const float rescale = m_new == m_run ? 1.0f : expf(m_run - m_new);
      const float p = valid ? expf(l - m_new) : 0.0f;
      denom = denom * rescale + warp_sum(p);
      m_run = m_new;
      prob[warp][lane] = p;
      if (lane == 0) rescale_sh[warp] = rescale;
    }
    __syncthreads();
    if (owns) {
      float2 acc[kHeadsPerBlock];
#pragma unroll
      for (int h = 0; h < kHeadsPerBlock; ++h) {
        acc[h] = o_sh[h * (D / 2) + threadIdx.x];
        acc[h].x *= rescale_sh[h];
        acc[h].y *= rescale_sh[h];
      }
      const float2* keys2 = reinterpret_cast<const float2*>(keys_sh);
      for (int i = 0; i < n; ++i) {
        if (rows[i] < 0) continue;  // block-uniform
        const float2 v = keys2[i * (D / 2) + threadIdx.x];
#pragma unroll
        for (int h = 0; h < kHeadsPerBlock; ++h) {
          const float p = prob[h][i];
          acc[h].x += p * v.x;
          acc[h].y += p * v.y;
        }
      }
#pragma unroll
      for (int h = 0; h < kHeadsPerBlock; ++h) o_sh[h * (D / 2) + threadIdx.x] = acc[h];
    }
    __syncthreads();  // the next chunk overwrites rows, keys and probabilities
  }
  if (lane == 0) part_m[warp] = m_run, part_l[warp] = denom;
  cluster.sync();  // every partial is complete and visible to rank 0
  if (rank == 0) {
    for (int hh = 0; hh < kHeadsPerBlock && h0 + hh < sh.H; ++hh) {
      const int64_t h = h0 + hh;
      float ms[kKvSplit], f[kKvSplit];
      float m = sink[h];
#pragma unroll
      for (int r = 0; r < kKvSplit; ++r) {
        ms[r] = *cluster.map_shared_rank(&part_m[hh], r);
        m = fmaxf(m, ms[r]);
      }
      float total = m == -INFINITY ? 1.0f : expf(sink[h] - m);  // -inf max: no key, zero output
#pragma unroll
      for (int r = 0; r < kKvSplit; ++r) {
        f[r] = ms[r] == -INFINITY ? 0.0f : expf(ms[r] - m);
        total += *cluster.map_shared_rank(&part_l[hh], r) * f[r];
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
  cluster.sync();  // rank 0 has read the other blocks' shared memory
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
  const size_t smem = size_t(kChunkKeys + kHeadsPerBlock) * size_t(D) * sizeof(float);
  const cudaError_t attr = cudaFuncSetAttribute(
      sparse_attention_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
  if (attr != cudaSuccess) return attr;
  const dim3 grid(static_cast<unsigned>(S * groups), kKvSplit);
  sparse_attention_kernel<<<grid, kThreadsPerBlock, smem, stream>>>(q, kv_a, kv_b, indices, sink,
                                                                    sh, out);
  return launch_status();
}

}  // namespace dsv41rt::kernels::cuda
