// Sparse attention with sink on tensor cores for forwards with many query rows (prefill; contract:
// kernels/attention.h; launcher and preconditions: kernels/cuda/attention.cuh).
//
// Same products as attention_tc.cu (keys are BF16 values, queries and probabilities split into
// three BF16 parts: every product is the FP32 reference's, only the summation order differs), laid
// out for throughput instead of latency:
//   - a block serves one query and 64 heads (four m16 tiles), so every staged key is used by all
//     64 heads of the query (the latency kernel stages each key once per 16 heads);
//   - the key list runs in 32-key chunks through a two-stage cp.async pipeline from a BF16 copy of
//     the key arrays (written once per call: half the bytes of the FP32 rows, no conversion in
//     the loop); chunks whose 32 indices are all invalid are skipped (the window and top-k lists
//     of early queries end in -1 runs);
//   - the queries stay FP32 in shared memory (split into parts as each warp loads its fragment),
//     the output accumulators in registers (warp w: m tile w % 4, channel half w / 4);
//   - the tensor core's FP32 accumulation truncates, so no sum runs long inside it: Q·K in groups
//     of four K steps and P·V per chunk go to fresh accumulators that are then added in FP32
//     (round to nearest; otherwise thousands of keys drift by more than the latency kernel's
//     four key slices do).
// No cluster and no split of the key list: a row's result depends on its own query only.
#include <cuda_bf16.h>

#include <cmath>
#include <cstdint>

#include "kernels/cuda/attention.cuh"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/mma_bf16.cuh"

namespace dsv41rt::kernels::cuda {
namespace {

using namespace mma;  // NOLINT(google-build-using-namespace): the shared mma helpers

constexpr int kWarps = 8;
constexpr int kBlockThreads = 32 * kWarps;
constexpr int kHeads = 64;  // heads per block: four m16 tiles
constexpr int kChunk = 32;  // keys per pipeline stage
constexpr int kMaxD = 512;
constexpr int kMaxPvTiles = kMaxD / 2 / 8;  // n tiles of 8 channels per warp in P·V
constexpr int kPartStride = kChunk + 4;     // floats per partial-logit row (bank offset)

struct PrefillShape {
  int64_t H, D, T, K;
  float scale;
};

// Word offset of (row, col) in the FP32 query tile [kHeads][D]: 8-float groups XOR-swizzled by
// row % 4, so a half-warp's fragment loads (rows g .. g + 3, 8 floats each) hit 32 banks.
__device__ __forceinline__ int q_off(int row, int col, int D) {
  return row * D + (col ^ ((row & 3) << 3));
}
// Element offset of (row, col) in a BF16 probability tile [kHeads][kChunk]: the four 16-byte
// chunks of a row XOR-swizzled by (row / 2) % 4, so 8 consecutive rows of an ldmatrix phase fall
// in 8 different bank groups.
__device__ __forceinline__ int p_off(int row, int col) {
  return row * kChunk + (((col >> 3) ^ ((row >> 1) & 3)) << 3) + (col & 7);
}

size_t prefill_smem_bytes(int64_t D) {
  return size_t(kHeads) * D * 4 +                // queries, FP32
         size_t(2) * kChunk * D * 2 +            // keys, two stages
         size_t(kParts) * kHeads * kChunk * 2 +  // probabilities, three BF16 parts
         size_t(2) * kHeads * kPartStride * 4;   // partial logits of the two K halves
}

__global__ void __launch_bounds__(kBlockThreads, 1)
    sparse_attention_prefill_kernel(const float* __restrict__ q,
                                    const __nv_bfloat16* __restrict__ keys,
                                    const int32_t* __restrict__ indices,
                                    const float* __restrict__ sink, PrefillShape sh,
                                    float* __restrict__ out) {
  pdl_entry();
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const int D = static_cast<int>(sh.D);
  float* q_sh = reinterpret_cast<float*>(smem_raw);
  __nv_bfloat16* k_sh = reinterpret_cast<__nv_bfloat16*>(q_sh + kHeads * D);  // [2][kChunk][D]
  __nv_bfloat16* p_sh = k_sh + 2 * kChunk * D;                                // [3][kHeads][kChunk]
  float* part_sh = reinterpret_cast<float*>(p_sh + kParts * kHeads * kChunk);  // [2][kHeads][..]
  __shared__ int32_t rows_sh[2][kChunk];
  __shared__ float m_sh[kHeads], l_sh[kHeads], alpha_sh[kHeads];

  const int64_t groups = (sh.H + kHeads - 1) / kHeads;
  const int64_t s = blockIdx.x / groups, h0 = (blockIdx.x % groups) * kHeads;
  const int heads = static_cast<int>(sh.H - h0 < kHeads ? sh.H - h0 : kHeads);
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, t = lane & 3;  // mma fragment row group / thread in group
  const int mt = warp & 3, half = warp >> 2;
  const bool tile_live = mt * 16 < heads;  // warp-uniform: an m tile with real heads
  const int32_t* idx = indices + s * sh.K;
  const int64_t chunks = (sh.K + kChunk - 1) / kChunk;

  // Stage chunk c's keys into stage c % 2 (invalid rows as zeros: a zero probability times a
  // zero key, never times whatever the buffer held).
  auto issue_keys = [&](int64_t c) {
    const int st = static_cast<int>(c & 1);
    const int per_row = D / 8;
    for (int i = tid; i < kChunk * per_row; i += kBlockThreads) {
      const int row = i / per_row, col = (i % per_row) * 8;
      const int64_t pos = c * kChunk + row;
      int32_t j = pos < sh.K ? idx[pos] : -1;
      if (j >= sh.T) j = -1;  // out of range: skipped like -1 (attention.cuh)
      if (col == 0) rows_sh[st][row] = j;
      const __nv_bfloat16* src = keys + (j >= 0 ? int64_t(j) * D + col : 0);
      cp_async16(k_sh + (size_t(st) * kChunk * D) + swz(row, col, D), src, j >= 0);
    }
  };

  // The block's queries (heads past H as zeros) and the first chunk: one group.
  for (int i = tid; i < kHeads * (D / 4); i += kBlockThreads) {
    const int row = i / (D / 4), col = (i % (D / 4)) * 4;
    const bool live = row < heads;
    cp_async16(q_sh + q_off(row, col, D), q + ((s * sh.H + h0 + (live ? row : 0)) * D + col), live);
  }
  if (chunks > 0) issue_keys(0);
  cp_async_commit();
  if (tid < kHeads) m_sh[tid] = -INFINITY, l_sh[tid] = 0.0f;

  float acc[kMaxPvTiles][4];
#pragma unroll
  for (int n = 0; n < kMaxPvTiles; ++n) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;
  const int qsteps = D / 16, ks0 = half * (qsteps / 2), ks1 = ks0 + qsteps / 2;
  const int pv_tiles = D / 2 / 8, d0 = half * (D / 2);

  for (int64_t c = 0; c < chunks; ++c) {
    const int st = static_cast<int>(c & 1);
    const __nv_bfloat16* kc = k_sh + size_t(st) * kChunk * D;
    // The next chunk streams in while this one is computed (its stage was freed by the
    // __syncthreads that ended the previous chunk).
    if (c + 1 < chunks) issue_keys(c + 1);
    cp_async_commit();
    cp_async_wait<1>();
    const bool any = __syncthreads_or(tid < kChunk && rows_sh[st][tid] >= 0);
    if (!any) continue;  // uniform: every thread saw the same rows (the stage stays untouched)

    // Q·K partial logits of this warp's m tile over its half of the head dimension.
    if (tile_live) {
      // Four K steps at a time into fresh accumulators, then added in FP32: the tensor core's
      // accumulation truncates, so its chains stay short (12 products) and the long sums round.
      float cq[4][4] = {};
      for (int kg = ks0; kg < ks1; kg += 4) {
        float cg[4][4] = {};
#pragma unroll
        for (int ks = kg; ks < kg + 4; ++ks) {
          if (ks >= ks1) break;  // D / 32 K steps per half: not always a multiple of 4
          uint32_t a[kParts][4];
#pragma unroll
          for (int hh = 0; hh < 2; ++hh) {  // rows g, g + 8
#pragma unroll
            for (int kh = 0; kh < 2; ++kh) {  // columns 2t, 2t + 8
              const int row = mt * 16 + g + 8 * hh, col = ks * 16 + 2 * t + 8 * kh;
              const float2 v = *reinterpret_cast<const float2*>(q_sh + q_off(row, col, D));
              const Parts3 x = split3(v.x), y = split3(v.y);
#pragma unroll
              for (int p = 0; p < kParts; ++p) a[p][hh + 2 * kh] = pack_part(x, y, p);
            }
          }
#pragma unroll
          for (int np = 0; np < 2; ++np) {  // key n tiles 2 np, 2 np + 1
            const int key = np * 16 + (lane & 7) + ((lane >> 4) << 3);
            const int col = ks * 16 + (((lane >> 3) & 1) << 3);
            uint32_t b[4];
            ldsm_x4(kc + swz(key, col, D), b);
#pragma unroll
            for (int p = kParts - 1; p >= 0; --p) {
              mma_bf16(cg[2 * np], a[p], b[0], b[1]);
              mma_bf16(cg[2 * np + 1], a[p], b[2], b[3]);
            }
          }
        }
#pragma unroll
        for (int nt = 0; nt < 4; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e) cq[nt][e] += cg[nt][e];
      }
      float* part = part_sh + half * kHeads * kPartStride;
#pragma unroll
      for (int nt = 0; nt < 4; ++nt) {
        const int col = nt * 8 + 2 * t, row = mt * 16 + g;
        *reinterpret_cast<float2*>(part + row * kPartStride + col) =
            make_float2(cq[nt][0], cq[nt][1]);
        *reinterpret_cast<float2*>(part + (row + 8) * kPartStride + col) =
            make_float2(cq[nt][2], cq[nt][3]);
      }
    }
    __syncthreads();
    // Online softmax: four threads per head (a quad), eight keys each.
    {
      const int h = tid >> 2, j0 = (tid & 3) * 8;
      float l[8];
      bool valid[8];
      float cmax = -INFINITY;
#pragma unroll
      for (int u = 0; u < 8; u += 4) {
        const float4 a = *reinterpret_cast<const float4*>(part_sh + h * kPartStride + j0 + u);
        const float4 b =
            *reinterpret_cast<const float4*>(part_sh + (kHeads + h) * kPartStride + j0 + u);
        l[u] = (a.x + b.x) * sh.scale, l[u + 1] = (a.y + b.y) * sh.scale;
        l[u + 2] = (a.z + b.z) * sh.scale, l[u + 3] = (a.w + b.w) * sh.scale;
      }
#pragma unroll
      for (int u = 0; u < 8; ++u) {
        valid[u] = rows_sh[st][j0 + u] >= 0;
        if (valid[u]) cmax = fmaxf(cmax, l[u]);
      }
      cmax = fmaxf(cmax, __shfl_xor_sync(0xffffffffu, cmax, 1));
      cmax = fmaxf(cmax, __shfl_xor_sync(0xffffffffu, cmax, 2));
      const float m_run = m_sh[h], m_new = fmaxf(m_run, cmax);
      float psum = 0.0f;
      Parts3 pp[8];
#pragma unroll
      for (int u = 0; u < 8; ++u) {
        const float p = valid[u] ? expf(l[u] - m_new) : 0.0f;
        psum += p;
        pp[u] = split3(p);
      }
      psum += __shfl_xor_sync(0xffffffffu, psum, 1);
      psum += __shfl_xor_sync(0xffffffffu, psum, 2);
#pragma unroll
      for (int p = 0; p < kParts; ++p) {
        uint4 packed;
        packed.x = pack_part(pp[0], pp[1], p);
        packed.y = pack_part(pp[2], pp[3], p);
        packed.z = pack_part(pp[4], pp[5], p);
        packed.w = pack_part(pp[6], pp[7], p);
        *reinterpret_cast<uint4*>(p_sh + p * kHeads * kChunk + p_off(h, j0)) = packed;
      }
      __syncwarp();
      if ((tid & 3) == 0) {
        // m_new == m_run also covers -inf == -inf (no valid key yet): keep the (zero) partials.
        const float alpha = m_new == m_run ? 1.0f : expf(m_run - m_new);
        alpha_sh[h] = alpha;
        l_sh[h] = l_sh[h] * alpha + psum;
        m_sh[h] = m_new;
      }
    }
    __syncthreads();
    // P·V: rescale, then this warp's m tile and channel half over the chunk's 32 keys.
    if (tile_live) {
      const float a_lo = alpha_sh[mt * 16 + g], a_hi = alpha_sh[mt * 16 + g + 8];
      uint32_t pa[kParts][2][4];
#pragma unroll
      for (int p = 0; p < kParts; ++p) {
#pragma unroll
        for (int kk = 0; kk < 2; ++kk) {
          const int row = mt * 16 + (lane & 15), col = 16 * kk + ((lane >> 4) << 3);
          ldsm_x4(p_sh + p * kHeads * kChunk + p_off(row, col), pa[p][kk]);
        }
      }
#pragma unroll
      for (int nt = 0; nt < kMaxPvTiles; ++nt) {
        if (nt >= pv_tiles) break;
        uint32_t b[4];
        ldsm_x4_trans(kc + swz(lane, d0 + nt * 8, D), b);
        // The chunk's sum in fresh accumulators (6 products deep), then rescale-and-add in FP32.
        float cv[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
        for (int p = kParts - 1; p >= 0; --p) {
          mma_bf16(cv, pa[p][0], b[0], b[1]);
          mma_bf16(cv, pa[p][1], b[2], b[3]);
        }
        acc[nt][0] = fmaf(acc[nt][0], a_lo, cv[0]), acc[nt][1] = fmaf(acc[nt][1], a_lo, cv[1]);
        acc[nt][2] = fmaf(acc[nt][2], a_hi, cv[2]), acc[nt][3] = fmaf(acc[nt][3], a_hi, cv[3]);
      }
    }
    __syncthreads();  // the next chunk overwrites partials, probabilities and this stage
  }
  cp_async_wait<0>();

  // out = o e^{m - M} / (e^{sink - M} + l e^{m - M}), M = max(sink, m); no valid key: zeros.
  if (!tile_live) return;
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    const int hl = mt * 16 + g + 8 * hh;
    if (hl >= heads) continue;
    const int64_t h = h0 + hl;
    const float m = m_sh[hl], sk = sink[h], mm = fmaxf(m, sk);
    const float f = m == -INFINITY ? 0.0f : expf(m - mm);
    const float inv = f / (expf(sk - mm) + l_sh[hl] * f);
    float* o = out + (s * sh.H + h) * D + d0;
#pragma unroll
    for (int nt = 0; nt < kMaxPvTiles; ++nt) {
      if (nt >= pv_tiles) break;
      *reinterpret_cast<float2*>(o + nt * 8 + 2 * t) =
          make_float2(acc[nt][2 * hh] * inv, acc[nt][2 * hh + 1] * inv);
    }
  }
}

// The key arrays as one BF16 array [T_a + T_b, D] (round to nearest even: exact for BF16 values).
__global__ void keys_to_bf16_kernel(const float4* __restrict__ a, int64_t na,
                                    const float4* __restrict__ b, int64_t n,
                                    uint2* __restrict__ dst) {
  pdl_entry();
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const float4 v = i < na ? a[i] : b[i - na];
    const __nv_bfloat162 lo = __floats2bfloat162_rn(v.x, v.y), hi = __floats2bfloat162_rn(v.z, v.w);
    dst[i] = make_uint2(*reinterpret_cast<const uint32_t*>(&lo),
                        *reinterpret_cast<const uint32_t*>(&hi));
  }
}

}  // namespace

size_t sparse_attention_prefill_tc_workspace(int64_t T_a, int64_t T_b, int64_t D) {
  return size_t(T_a + T_b) * size_t(D) * 2;
}

cudaError_t sparse_attention_prefill_tc(const float* q, const float* kv_a, int64_t T_a,
                                        const float* kv_b, int64_t T_b, const int32_t* indices,
                                        const float* sink, int64_t S, int64_t n_heads, int64_t D,
                                        int64_t K, float scale, void* workspace, float* out,
                                        cudaStream_t stream) {
  if (S < 0 || n_heads <= 0 || T_a < 0 || T_b < 0 || K < 0) return cudaErrorInvalidValue;
  if (!sparse_attention_tc_supported(D, q, kv_a, kv_b)) return cudaErrorInvalidValue;
  if (S == 0) return cudaSuccess;
  if (workspace == nullptr || reinterpret_cast<uintptr_t>(workspace) % 16 != 0)
    return cudaErrorInvalidValue;
  const int64_t groups = (n_heads + kHeads - 1) / kHeads;
  if (S > 0x7fffffff / groups || T_a + T_b > 0x7fffffff) return cudaErrorInvalidValue;
  auto* keys = static_cast<__nv_bfloat16*>(workspace);
  const int64_t n4 = (T_a + T_b) * D / 4;
  if (n4 > 0) {
    keys_to_bf16_kernel<<<blocks_for(n4), kThreads, 0, stream>>>(
        reinterpret_cast<const float4*>(kv_a), T_a * D / 4, reinterpret_cast<const float4*>(kv_b),
        n4, reinterpret_cast<uint2*>(keys));
    if (const cudaError_t e = launch_status(); e != cudaSuccess) return e;
  }
  const PrefillShape sh{n_heads, D, T_a + T_b, K, scale};
  const size_t smem = prefill_smem_bytes(D);
  const cudaError_t attr =
      cudaFuncSetAttribute(sparse_attention_prefill_kernel,
                           cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
  if (attr != cudaSuccess) return attr;
  sparse_attention_prefill_kernel<<<static_cast<unsigned>(S * groups), kBlockThreads, smem,
                                    stream>>>(q, keys, indices, sink, sh, out);
  return launch_status();
}

}  // namespace dsv41rt::kernels::cuda
