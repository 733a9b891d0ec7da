// Lightning-indexer scores on tensor cores (contract: kernels/indexer.h; launcher and
// preconditions: kernels/cuda/indexer.cuh).
//
// The index queries and keys are MXFP4 after the cache QDQ (spec §2.7.2): every element is E2M1
// times a power of two, a BF16 value, so each product q·k on BF16 tensor cores is exact and only
// the summation order of a head's dot differs from the CPU's (a 32-element block of such
// products is a small multiple of one quantum, so the dots are mostly exact in any order). The
// head sum Σ_h w_h · relu(dot_h) runs in FP32 in the CPU reference's head order.
//
// Layout: a block takes one query and 64 consecutive entries; warp w computes the dots of all
// heads (m16 tiles) with entries 16 w .. 16 w + 15 (two n8 tiles) over the whole head dimension,
// writes them to shared memory, and thread j then sums entry j over the heads. The keys come from
// an FP32 array (FlatKeys) or from the token pages as stored (PagedKeys, kernels/indexer_cached.h:
// MXFP4 rows decoded by the codecs, exactly the FP32 array's values), so both give the same bits.
#include <cuda_bf16.h>

#include <cmath>
#include <cstdint>

#include "kernels/cuda/cache_row_decode.cuh"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/indexer.cuh"
#include "kernels/cuda/mma_bf16.cuh"
#include "kernels/indexer_cached.h"

namespace dsv41rt::kernels::cuda {
namespace {

using namespace mma;  // NOLINT(google-build-using-namespace): the shared mma helpers

constexpr int kWarps = 4;
constexpr int kBlockThreads = 32 * kWarps;
constexpr int kEntries = 16 * kWarps;  // entries per block
constexpr int kMaxHeads = 64;
constexpr int kMaxD = 256;
constexpr int kDotStride = kEntries + 4;  // floats per head row of the dot tile

size_t tc_smem_bytes(int64_t H, int64_t D) {
  const int64_t rows = (H + 15) / 16 * 16;
  return size_t(rows + kEntries) * D * 2 + size_t(rows) * kDotStride * 4;
}

// Keys of query s: rows key_offset[s] + j of an FP32 array [.., D].
struct FlatKeys {
  const float* keys;
  const int64_t* key_offset;

  __device__ int64_t visible(int64_t /*s*/, int64_t n_visible) const { return n_visible; }
  // Entries [j0, j0 + kEntries) as BF16 into k_sh (zeros from vis on).
  __device__ void stage(__nv_bfloat16* k_sh, int64_t s, int64_t j0, int64_t vis, int D) const {
    const float* base = keys + ((key_offset ? key_offset[s] : 0) + j0) * D;
    for (int i = threadIdx.x; i < kEntries * (D / 4); i += kBlockThreads) {
      const int e = i / (D / 4), col = (i % (D / 4)) * 4;
      float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      if (j0 + e < vis) v = *reinterpret_cast<const float4*>(base + int64_t(e) * D + col);
      *reinterpret_cast<uint2*>(k_sh + swz(e, col, D)) =
          make_uint2(pack_bf16x2(v.x, v.y), pack_bf16x2(v.z, v.w));
    }
  }
};

// Keys of query s: entries of item query_item[s] in the token pages, decoded in pieces of 16.
struct PagedKeys {
  IndexKeys k;

  __device__ int64_t visible(int64_t s, int64_t n_visible) const {
    return k.query_item[s] < 0 ? 0 : n_visible;
  }
  __device__ void stage(__nv_bfloat16* k_sh, int64_t s, int64_t j0, int64_t vis, int D) const {
    __shared__ const uint8_t* row_sh[kEntries];
    const PagedRows& p = k.rows;
    const int tid = threadIdx.x;
    if (tid < kEntries) {
      const int64_t j = j0 + tid;
      const uint8_t* row = nullptr;
      if (j < vis) {
        const int32_t page = p.page_table[int64_t(k.query_item[s]) * p.max_pages + j / p.per_page];
        row = p.pool + int64_t(page) * p.page_bytes + p.offset + (j % p.per_page) * p.row_bytes;
      }
      row_sh[tid] = row;
    }
    __syncthreads();
    const int pieces = D / 16, f = int(k.format);
    for (int i = tid; i < kEntries * pieces; i += kBlockThreads) {
      const int e = i / pieces, piece = i % pieces;
      uint4 raw = make_uint4(0u, 0u, 0u, 0u);
      uint8_t sc = 0;
      if (row_sh[e]) load_row_piece(f, row_sh[e], piece, D, raw, sc);
      float v[16];
      decode_row_piece(row_sh[e] ? f : -1, raw, sc, v);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const uint4 packed = make_uint4(
            pack_bf16x2(v[8 * h], v[8 * h + 1]), pack_bf16x2(v[8 * h + 2], v[8 * h + 3]),
            pack_bf16x2(v[8 * h + 4], v[8 * h + 5]), pack_bf16x2(v[8 * h + 6], v[8 * h + 7]));
        *reinterpret_cast<uint4*>(k_sh + swz(e, piece * 16 + 8 * h, D)) = packed;
      }
    }
  }
};

template <class Keys>
__global__ void __launch_bounds__(kBlockThreads)
    indexer_scores_tc_kernel(const float* __restrict__ q, Keys keys, const float* __restrict__ w,
                             const int64_t* __restrict__ n_visible, int64_t H, int64_t D, int64_t T,
                             float* __restrict__ scores) {
  pdl_entry();
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const int Dn = static_cast<int>(D), Hn = static_cast<int>(H);
  const int mtiles = (Hn + 15) / 16;
  __nv_bfloat16* q_sh = reinterpret_cast<__nv_bfloat16*>(smem_raw);  // [mtiles·16][D]
  __nv_bfloat16* k_sh = q_sh + mtiles * 16 * Dn;                     // [kEntries][D]
  float* dot_sh = reinterpret_cast<float*>(k_sh + kEntries * Dn);    // [mtiles·16][..]

  const int64_t tiles = (T + kEntries - 1) / kEntries;
  const int64_t s = blockIdx.x / tiles, j0 = (blockIdx.x % tiles) * kEntries;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  int64_t vis = keys.visible(s, n_visible[s]);
  vis = vis < 0 ? 0 : (vis > T ? T : vis);
  if (j0 >= vis) {  // nothing visible in this tile (block-uniform)
    for (int j = tid; j < kEntries; j += kBlockThreads)
      if (j0 + j < T) scores[s * T + j0 + j] = -INFINITY;
    return;
  }
  // Queries and keys to BF16 (exact: they are BF16 values); heads past H and entries past the
  // visible ones as zeros.
  for (int i = tid; i < mtiles * 16 * (Dn / 4); i += kBlockThreads) {
    const int row = i / (Dn / 4), col = (i % (Dn / 4)) * 4;
    float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (row < Hn) v = *reinterpret_cast<const float4*>(q + (s * H + row) * D + col);
    *reinterpret_cast<uint2*>(q_sh + swz(row, col, Dn)) =
        make_uint2(pack_bf16x2(v.x, v.y), pack_bf16x2(v.z, v.w));
  }
  keys.stage(k_sh, s, j0, vis, Dn);
  __syncthreads();
  const int g = lane >> 2, t = lane & 3;
  for (int mt = 0; mt < mtiles; ++mt) {
    float c[2][4] = {};
    for (int ks = 0; ks < Dn / 16; ++ks) {
      uint32_t a[4], b[4];
      ldsm_x4(q_sh + swz(mt * 16 + (lane & 15), ks * 16 + ((lane >> 4) << 3), Dn), a);
      const int key = warp * 16 + (lane & 7) + ((lane >> 4) << 3);
      ldsm_x4(k_sh + swz(key, ks * 16 + (((lane >> 3) & 1) << 3), Dn), b);
      mma_bf16(c[0], a, b[0], b[1]);
      mma_bf16(c[1], a, b[2], b[3]);
    }
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) {
      const int col = warp * 16 + nt * 8 + 2 * t, row = mt * 16 + g;
      *reinterpret_cast<float2*>(dot_sh + row * kDotStride + col) = make_float2(c[nt][0], c[nt][1]);
      *reinterpret_cast<float2*>(dot_sh + (row + 8) * kDotStride + col) =
          make_float2(c[nt][2], c[nt][3]);
    }
  }
  __syncthreads();
  for (int j = tid; j < kEntries; j += kBlockThreads) {
    if (j0 + j >= T) continue;
    float total = -INFINITY;
    if (j0 + j < vis) {
      total = 0.0f;
      for (int h = 0; h < Hn; ++h) total += fmaxf(dot_sh[h * kDotStride + j], 0.0f) * w[s * H + h];
    }
    scores[s * T + j0 + j] = total;
  }
}

}  // namespace

bool indexer_scores_tc_supported(int64_t H, int64_t D, const float* q, const float* keys) {
  auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  return H >= 1 && H <= kMaxHeads && D >= 64 && D <= kMaxD && D % 64 == 0 && aligned(q) &&
         aligned(keys);
}

namespace {

template <class Keys>
cudaError_t launch_scores_tc(const float* q, const Keys& keys, const float* w,
                             const int64_t* n_visible, int64_t S, int64_t H, int64_t D, int64_t T,
                             float* scores, cudaStream_t stream) {
  if (S == 0 || T == 0) return cudaSuccess;
  const int64_t tiles = (T + kEntries - 1) / kEntries;
  if (S > 0x7fffffff / tiles) return cudaErrorInvalidValue;
  const size_t smem = tc_smem_bytes(H, D);
  const cudaError_t attr =
      cudaFuncSetAttribute(indexer_scores_tc_kernel<Keys>,
                           cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
  if (attr != cudaSuccess) return attr;
  indexer_scores_tc_kernel<Keys><<<static_cast<unsigned>(S * tiles), kBlockThreads, smem, stream>>>(
      q, keys, w, n_visible, H, D, T, scores);
  return launch_status();
}

}  // namespace

cudaError_t indexer_scores_tc(const float* q, const float* keys, const int64_t* key_offset,
                              const float* w, const int64_t* n_visible, int64_t S, int64_t H,
                              int64_t D, int64_t T, float* scores, cudaStream_t stream) {
  if (S < 0 || T < 0 || !indexer_scores_tc_supported(H, D, q, keys)) return cudaErrorInvalidValue;
  return launch_scores_tc(q, FlatKeys{keys, key_offset}, w, n_visible, S, H, D, T, scores, stream);
}

cudaError_t indexer_scores_tc_cached(const float* q, const IndexKeys& keys, const float* w,
                                     const int64_t* n_visible, int64_t S, int64_t H, int64_t D,
                                     int64_t T, float* scores, cudaStream_t stream) {
  const bool stored = keys.format == RowFormat::kFp8Window || keys.format == RowFormat::kNvfp4 ||
                      keys.format == RowFormat::kMxfp4;
  if (S < 0 || T < 0 || !stored || !keys.query_item || !keys.rows.pool || !keys.rows.page_table ||
      keys.rows.per_page < 1 || !indexer_scores_tc_supported(H, D, q, nullptr)) {
    return cudaErrorInvalidValue;
  }
  return launch_scores_tc(q, PagedKeys{keys}, w, n_visible, S, H, D, T, scores, stream);
}

}  // namespace dsv41rt::kernels::cuda
