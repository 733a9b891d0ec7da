// Sparse attention with sink on tensor cores (contract: kernels/attention.h; launcher and
// preconditions: kernels/cuda/attention.cuh).
//
// Why the products stay FP32-exact on BF16 tensor cores: every key/value element is a BF16 value
// (the window rows are FP8 x 2^k and the compressed entries E2M1 x E4M3 after the cache QDQ,
// spec §5.5), and the FP32 operands (queries, probabilities) are split into three BF16 parts,
// x = hi + mid + lo, which hold all 24 bits of the significand. Each part's product with a BF16
// key is exact, so Q·K and P·V are the FP32 reference's sums of exact products, added in another
// order (the tensor core's FP32 accumulation): summation order is the only difference.
//
// Layout: a block serves 16 heads of one query (one m16 tile) and one of kSplits slices of its
// key list; the slices of a query are a cluster that combines their partial softmax sums through
// distributed shared memory, in rank order (fixed: a row never depends on the batch). Keys are
// staged 64 at a time, converted to BF16 (exact) in swizzled shared memory. Q·K: warp w owns the
// 16-wide K steps w, w + 8, ... of the head dimension (its query fragments stay in registers for
// the whole key list) and writes partial logits; the softmax sums the 8 partials in warp order.
// P·V: warp w owns output channels [w·D/8, (w+1)·D/8).
#include <cooperative_groups.h>
#include <cuda_bf16.h>

#include <cmath>
#include <cstdint>

#include "kernels/cuda/attention.cuh"
#include "kernels/cuda/attention_keys.cuh"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/mma_bf16.cuh"

namespace dsv41rt::kernels::cuda {
namespace {

namespace cg = cooperative_groups;
using namespace mma;  // NOLINT(google-build-using-namespace): the shared mma helpers

constexpr int kWarps = 8;
constexpr int kBlockThreads = 32 * kWarps;
constexpr int kTileHeads = 16;  // the mma's M
constexpr int kChunk = 64;      // keys staged at a time
constexpr int kSplits = 4;      // key-list slices of a query (the cluster)
constexpr int kMaxD = 512;
constexpr int kMaxQSteps = kMaxD / 16 / kWarps;  // K steps of 16 per warp in Q·K
constexpr int kMaxPvTiles = kMaxD / kWarps / 8;  // n tiles of 8 per warp in P·V
constexpr int kPartStride = kChunk + 4;          // floats per partial-logit row (bank offset)

struct TcShape {
  int64_t H, D, K;
  float scale;
};

// kBlocksPerSm 1 (few queries: the fastest block, no spills) or 2 (many queries: ~500 bytes of
// register spills per thread, but twice the warps to hide latency; bench-40 decode at 64 queries:
// 21.5 -> 15.0 ms per step, at 1 query 2.8 -> 3.1 ms). The two instantiations differ in register
// allocation only, so they give the same bits.
template <class Keys, int kBlocksPerSm>
__global__ void __cluster_dims__(1, kSplits, 1) __launch_bounds__(kBlockThreads, kBlocksPerSm)
    sparse_attention_tc_kernel(const float* __restrict__ q, Keys keys,
                               const int32_t* __restrict__ indices, const float* __restrict__ sink,
                               TcShape sh, float* __restrict__ out) {
  pdl_entry();
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const int D = static_cast<int>(sh.D);
  __nv_bfloat16* keys_sh = reinterpret_cast<__nv_bfloat16*>(smem_raw);  // [kChunk][D], swizzled
  float* part_sh = reinterpret_cast<float*>(smem_raw + size_t(kChunk) * D * 2);  // [w][16][..]
  __nv_bfloat16* p_sh = reinterpret_cast<__nv_bfloat16*>(
      part_sh + kWarps * kTileHeads * kPartStride);  // [part][16][kChunk], swizzled
  float* o_sh = reinterpret_cast<float*>(smem_raw);  // [16][D] after the key loop (aliases keys)
  __shared__ int32_t rows_sh[kChunk];
  __shared__ float m_sh[kTileHeads], l_sh[kTileHeads], alpha_sh[kTileHeads];
  __shared__ float f_sh[kTileHeads / kSplits][kSplits], inv_sh[kTileHeads / kSplits];

  cg::cluster_group cluster = cg::this_cluster();
  const int rank = static_cast<int>(cluster.block_rank());
  const int64_t tiles = (sh.H + kTileHeads - 1) / kTileHeads;
  const int64_t s = blockIdx.x / tiles, h0 = (blockIdx.x % tiles) * kTileHeads;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, t = lane & 3;  // mma fragment row group / thread in group
  const int64_t per = (sh.K + kSplits - 1) / kSplits;
  const int64_t k0 = rank * per < sh.K ? rank * per : sh.K;
  const int64_t k1 = k0 + per < sh.K ? k0 + per : sh.K;
  const int qsteps = D / 16;

  // This warp's query fragments (K steps warp + 8 i), three BF16 parts each; heads past H are 0.
  uint32_t qa[kMaxQSteps][kParts][4];
#pragma unroll
  for (int i = 0; i < kMaxQSteps; ++i) {
    const int ks = warp + kWarps * i;
    if (ks >= qsteps) break;
#pragma unroll
    for (int half = 0; half < 2; ++half) {  // rows g, g + 8
#pragma unroll
      for (int kh = 0; kh < 2; ++kh) {  // columns 2t, 2t + 8
        const int64_t h = h0 + g + 8 * half;
        const int col = ks * 16 + 2 * t + 8 * kh;
        float2 v = make_float2(0.0f, 0.0f);
        if (h < sh.H) v = *reinterpret_cast<const float2*>(q + (s * sh.H + h) * D + col);
        const Parts3 x = split3(v.x), y = split3(v.y);
#pragma unroll
        for (int p = 0; p < kParts; ++p) qa[i][p][half + 2 * kh] = pack_part(x, y, p);
      }
    }
  }
  float acc[kMaxPvTiles][4];
#pragma unroll
  for (int n = 0; n < kMaxPvTiles; ++n) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;
  if (tid < kTileHeads) m_sh[tid] = -INFINITY, l_sh[tid] = 0.0f;
  const int pv_tiles = D / kWarps / 8, d0 = warp * (D / kWarps);

  keys.prepare(s);
  for (int64_t c0 = k0; c0 < k1; c0 += kChunk) {
    const int n = static_cast<int>(k1 - c0 < kChunk ? k1 - c0 : kChunk);
    // Stage keys c0 .. c0 + n as BF16 (rows past n or with an invalid index are zeros).
    keys.stage(keys_sh, rows_sh, indices + s * sh.K, c0, n, kChunk, D, s);
    __syncthreads();
    // A chunk without a valid key adds nothing (every probability 0, alpha 1): skip it, e.g. the
    // unused top-k slots of a layer whose source holds fewer compressed entries than top-k.
    if (!__syncthreads_or(tid < kChunk && rows_sh[tid] >= 0)) continue;
    // Q·K partial logits over this warp's K steps, all 64 keys (8 n tiles, two per ldmatrix).
    if (warp < qsteps) {
      float* part = part_sh + warp * kTileHeads * kPartStride;
#pragma unroll
      for (int nt = 0; nt < kChunk / 8; nt += 2) {
        float c[2][4] = {{0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}};
#pragma unroll
        for (int i = 0; i < kMaxQSteps; ++i) {
          const int ks = warp + kWarps * i;
          if (ks >= qsteps) break;
          const int key = nt * 8 + (lane & 7) + ((lane >> 4) << 3);
          const int col = ks * 16 + (((lane >> 3) & 1) << 3);
          uint32_t b[4];
          ldsm_x4(keys_sh + swz(key, col, D), b);
#pragma unroll
          for (int p = kParts - 1; p >= 0; --p) {
            mma_bf16(c[0], qa[i][p], b[0], b[1]);
            mma_bf16(c[1], qa[i][p], b[2], b[3]);
          }
        }
#pragma unroll
        for (int u = 0; u < 2; ++u) {
          const int col = (nt + u) * 8 + 2 * t;
          *reinterpret_cast<float2*>(part + g * kPartStride + col) = make_float2(c[u][0], c[u][1]);
          *reinterpret_cast<float2*>(part + (g + 8) * kPartStride + col) =
              make_float2(c[u][2], c[u][3]);
        }
      }
    }
    __syncthreads();
    // Online softmax: thread (head tid / 16) takes keys 4 (tid % 16) .. + 3.
    {
      const int h = tid >> 4, j0 = (tid & 15) * 4;
      const int nparts = qsteps < kWarps ? qsteps : kWarps;
      float l[4];
      bool valid[4];
      float cmax = -INFINITY;
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        float sum = 0.0f;
        for (int w = 0; w < nparts; ++w)
          sum += part_sh[(w * kTileHeads + h) * kPartStride + j0 + u];
        l[u] = sum * sh.scale;
        valid[u] = j0 + u < n && rows_sh[j0 + u] >= 0;
        if (valid[u]) cmax = fmaxf(cmax, l[u]);
      }
#pragma unroll
      for (int off = 8; off > 0; off >>= 1)
        cmax = fmaxf(cmax, __shfl_xor_sync(0xffffffffu, cmax, off));
      const float m_run = m_sh[h], m_new = fmaxf(m_run, cmax);
      float psum = 0.0f;
      Parts3 pp[4];
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        const float p = valid[u] ? expf(l[u] - m_new) : 0.0f;
        psum += p;
        pp[u] = split3(p);
      }
#pragma unroll
      for (int off = 8; off > 0; off >>= 1) psum += __shfl_xor_sync(0xffffffffu, psum, off);
#pragma unroll
      for (int p = 0; p < kParts; ++p) {
        uint2 packed;
        packed.x = pack_part(pp[0], pp[1], p);
        packed.y = pack_part(pp[2], pp[3], p);
        *reinterpret_cast<uint2*>(p_sh + p * kTileHeads * kChunk + swz(h, j0, kChunk)) = packed;
      }
      __syncwarp();
      if ((tid & 15) == 0) {
        // m_new == m_run also covers -inf == -inf (no valid key yet): keep the (zero) partials.
        const float alpha = m_new == m_run ? 1.0f : expf(m_run - m_new);
        alpha_sh[h] = alpha;
        l_sh[h] = l_sh[h] * alpha + psum;
        m_sh[h] = m_new;
      }
    }
    __syncthreads();
    // P·V: rescale, then this warp's channels over the 64 keys (two K steps per ldmatrix).
    {
      const float a_lo = alpha_sh[g], a_hi = alpha_sh[g + 8];
#pragma unroll
      for (int nt = 0; nt < kMaxPvTiles; ++nt) {
        acc[nt][0] *= a_lo, acc[nt][1] *= a_lo, acc[nt][2] *= a_hi, acc[nt][3] *= a_hi;
      }
#pragma unroll
      for (int kb = 0; kb < kChunk; kb += 32) {
        uint32_t pa[kParts][2][4];
#pragma unroll
        for (int p = 0; p < kParts; ++p) {
#pragma unroll
          for (int kk = 0; kk < 2; ++kk) {
            const int row = lane & 15, col = kb + 16 * kk + ((lane >> 4) << 3);
            ldsm_x4(p_sh + p * kTileHeads * kChunk + swz(row, col, kChunk), pa[p][kk]);
          }
        }
#pragma unroll
        for (int nt = 0; nt < kMaxPvTiles; ++nt) {
          if (nt >= pv_tiles) break;
          uint32_t b[4];
          ldsm_x4_trans(keys_sh + swz(kb + lane, d0 + nt * 8, D), b);
#pragma unroll
          for (int p = kParts - 1; p >= 0; --p) {
            mma_bf16(acc[nt], pa[p][0], b[0], b[1]);
            mma_bf16(acc[nt], pa[p][1], b[2], b[3]);
          }
        }
      }
    }
    __syncthreads();  // the next chunk overwrites keys, rows, partials and probabilities
  }

  // Partial outputs to shared memory (over the staged keys), then the cluster combine: rank r
  // finishes kTileHeads / kSplits heads of the tile. m = max(sink, m_0 .. m_last);
  // out = Σ_r o_r e^{m_r-m} / (e^{sink-m} + Σ_r l_r e^{m_r-m}), ranks in order.
#pragma unroll
  for (int nt = 0; nt < kMaxPvTiles; ++nt) {
    if (nt >= pv_tiles) break;
    const int col = d0 + nt * 8 + 2 * t;
    *reinterpret_cast<float2*>(o_sh + g * D + col) = make_float2(acc[nt][0], acc[nt][1]);
    *reinterpret_cast<float2*>(o_sh + (g + 8) * D + col) = make_float2(acc[nt][2], acc[nt][3]);
  }
  cluster.sync();
  constexpr int kHeadsPerRank = kTileHeads / kSplits;
  if (tid < kHeadsPerRank) {
    const int hl = rank * kHeadsPerRank + tid;
    const int64_t h = h0 + hl;
    if (h < sh.H) {
      float ms[kSplits];
      float m = sink[h];
#pragma unroll
      for (int r = 0; r < kSplits; ++r) {
        ms[r] = *cluster.map_shared_rank(&m_sh[hl], r);
        m = fmaxf(m, ms[r]);
      }
      float total = m == -INFINITY ? 1.0f : expf(sink[h] - m);
#pragma unroll
      for (int r = 0; r < kSplits; ++r) {
        const float f = ms[r] == -INFINITY ? 0.0f : expf(ms[r] - m);
        f_sh[tid][r] = f;
        total += *cluster.map_shared_rank(&l_sh[hl], r) * f;
      }
      inv_sh[tid] = 1.0f / total;
    }
  }
  __syncthreads();
  for (int i = tid; i < kHeadsPerRank * D; i += kBlockThreads) {
    const int hh = i / D, d = i % D, hl = rank * kHeadsPerRank + hh;
    const int64_t h = h0 + hl;
    if (h >= sh.H) continue;
    float o = 0.0f;
#pragma unroll
    for (int r = 0; r < kSplits; ++r)
      o += cluster.map_shared_rank(o_sh, r)[hl * D + d] * f_sh[hh][r];
    out[(s * sh.H + h) * D + d] = o * inv_sh[hh];
  }
  cluster.sync();  // every rank has read the others' shared memory
}

size_t tc_smem_bytes(int64_t D) {
  return size_t(kChunk) * size_t(D) * 2 + size_t(kWarps) * kTileHeads * kPartStride * 4 +
         size_t(kParts) * kTileHeads * kChunk * 2;
}

}  // namespace

bool sparse_attention_tc_supported(int64_t D, const float* q, const float* kv_a,
                                   const float* kv_b) {
  auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  return D >= 64 && D <= kMaxD && D % 64 == 0 && aligned(q) && aligned(kv_a) && aligned(kv_b);
}

namespace {

static_assert(kBlockThreads == attn::kStageThreads, "the key staging assumes the block size");

// From 16 queries (256 blocks of 64 heads, two waves at one block per SM) two blocks share an SM.
constexpr int64_t kTwoBlocksFromQueries = 16;

template <class Keys>
cudaError_t launch_tc(const float* q, const Keys& keys, const int32_t* indices, const float* sink,
                      int64_t S, int64_t n_heads, int64_t D, int64_t K, float scale, float* out,
                      cudaStream_t stream) {
  if (S == 0) return cudaSuccess;
  const int64_t tiles = (n_heads + kTileHeads - 1) / kTileHeads;
  if (S > 0x7fffffff / tiles) return cudaErrorInvalidValue;
  const TcShape sh{n_heads, D, K, scale};
  const size_t smem = tc_smem_bytes(D);
  auto* kernel = S >= kTwoBlocksFromQueries ? sparse_attention_tc_kernel<Keys, 2>
                                            : sparse_attention_tc_kernel<Keys, 1>;
  const cudaError_t attr = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                static_cast<int>(smem));
  if (attr != cudaSuccess) return attr;
  const dim3 grid(static_cast<unsigned>(S * tiles), kSplits);
  kernel<<<grid, kBlockThreads, smem, stream>>>(q, keys, indices, sink, sh, out);
  return launch_status();
}

}  // namespace

cudaError_t sparse_attention_tc(const float* q, const float* kv_a, int64_t T_a, const float* kv_b,
                                int64_t T_b, const int32_t* indices, const float* sink, int64_t S,
                                int64_t n_heads, int64_t D, int64_t K, float scale, float* out,
                                cudaStream_t stream) {
  if (S < 0 || n_heads <= 0 || T_a < 0 || T_b < 0 || K < 0) return cudaErrorInvalidValue;
  if (!sparse_attention_tc_supported(D, q, kv_a, kv_b)) return cudaErrorInvalidValue;
  return launch_tc(q, attn::FlatKeys{kv_a, kv_b, T_a, T_a + T_b}, indices, sink, S, n_heads, D, K,
                   scale, out, stream);
}

cudaError_t sparse_attention_tc_cached(const float* q, const CachedKeys& keys,
                                       const int32_t* indices, const float* sink, int64_t S,
                                       int64_t n_heads, int64_t D, int64_t K, float scale,
                                       float* out, cudaStream_t stream) {
  if (S < 0 || n_heads <= 0 || K < 0 || keys.old_rows < 0 || keys.new_count < 0 ||
      keys.comp_rows < 0)
    return cudaErrorInvalidValue;
  if (!sparse_attention_tc_supported(D, q, keys.new_rows, keys.new_rows))
    return cudaErrorInvalidValue;
  if (keys.old_rows > 0 && keys.ring.ring <= 0) return cudaErrorInvalidValue;
  return launch_tc(q, attn::StoredKeys{keys}, indices, sink, S, n_heads, D, K, scale, out, stream);
}

}  // namespace dsv41rt::kernels::cuda
