#include <cuda_bf16.h>
#include <mma.h>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/gemm_tc.cuh"
#include "kernels/cuda/weight_decode.cuh"

namespace dsv41rt::kernels::cuda {
namespace {

using namespace nvcuda;

constexpr int kBM = int(kTcTileM), kBN = 128, kBK = 32;
constexpr int kPad = 8;  // keeps wmma rows 32-byte aligned and spreads shared-memory banks
constexpr int kLd = kBK + kPad;
constexpr int kTcThreads = 128;  // 4 warps, 2 (M) x 2 (N), each 32 x 64 of the tile

struct TileRows {
  int64_t row0, row_end;
  int group;
};

__device__ __forceinline__ bool tile_rows(const TcGemm& g, TileRows& t) {
  if (g.tile_group == nullptr) {
    t.row0 = int64_t(blockIdx.y) * kBM;
    t.row_end = g.m;
    t.group = 0;
    return t.row0 < g.m;
  }
  t.group = g.tile_group[blockIdx.y];
  if (t.group < 0) return false;
  t.row0 = g.tile_row0[blockIdx.y];
  t.row_end = g.tile_row_end[blockIdx.y];
  return true;
}

__device__ __forceinline__ const float* a_row(const TcGemm& g, const float* a, int64_t r) {
  const int64_t src = g.a_rows ? g.a_rows[r] / g.a_row_div : r;
  return a + src * g.lda;
}

// Registers holding the next k-tile while the current one is multiplied: A 64 x 32 FP32 as 4
// float4 per thread, B 128 x 32 BF16 as 4 uint4 per thread.
struct Stage {
  float4 a[4];
  uint4 b[4];
};

template <bool Vec, WeightFormat F>
__device__ void load_stage(const TcGemm& g, const float* a, int64_t brow0, const TileRows& t,
                           int64_t n0, int64_t k0, Stage& st) {
  const int tid = threadIdx.x;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int idx = tid + i * kTcThreads;
    const int r = idx / (kBK / 4), kc = (idx % (kBK / 4)) * 4;
    const int64_t row = t.row0 + r;
    float v[4] = {0.f, 0.f, 0.f, 0.f};
    if (row < t.row_end && row < t.row0 + kBM) {
      const float* src = a_row(g, a, row) + k0 + kc;
      if (Vec) {
        if (k0 + kc < g.k) {
          const float4 q = *reinterpret_cast<const float4*>(src);
          v[0] = q.x, v[1] = q.y, v[2] = q.z, v[3] = q.w;
        }
      } else {
#pragma unroll
        for (int e = 0; e < 4; ++e) v[e] = k0 + kc + e < g.k ? src[e] : 0.f;
      }
    }
    st.a[i] = make_float4(v[0], v[1], v[2], v[3]);
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int idx = tid + i * kTcThreads;
    const int r = idx / (kBK / 8), kc = (idx % (kBK / 8)) * 8;
    const int64_t col = n0 + r;
    uint4 q = make_uint4(0, 0, 0, 0);
    if (col < g.n) {
      if (Vec) {
        if (k0 + kc < g.k) q = weight_bf16x8<F>(g.b, brow0 + col, k0 + kc);
      } else {
        uint16_t h[8];
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          h[e] = k0 + kc + e < g.k ? f32_to_bf16(weight_at<F>(g.b, brow0 + col, k0 + kc + e))
                                   : uint16_t(0);
        }
        q.x = h[0] | (uint32_t(h[1]) << 16);
        q.y = h[2] | (uint32_t(h[3]) << 16);
        q.z = h[4] | (uint32_t(h[5]) << 16);
        q.w = h[6] | (uint32_t(h[7]) << 16);
      }
    }
    st.b[i] = q;
  }
}

__device__ void store_stage(const Stage& st, __nv_bfloat16 (*as)[kLd], __nv_bfloat16 (*bs)[kLd]) {
  const int tid = threadIdx.x;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int idx = tid + i * kTcThreads;
    const int r = idx / (kBK / 4), kc = (idx % (kBK / 4)) * 4;
    // RNE rounding, the same as f32_to_bf16 for finite values.
    *reinterpret_cast<__nv_bfloat162*>(&as[r][kc]) = __floats2bfloat162_rn(st.a[i].x, st.a[i].y);
    *reinterpret_cast<__nv_bfloat162*>(&as[r][kc + 2]) =
        __floats2bfloat162_rn(st.a[i].z, st.a[i].w);
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int idx = tid + i * kTcThreads;
    const int r = idx / (kBK / 8), kc = (idx % (kBK / 8)) * 8;
    *reinterpret_cast<uint4*>(&bs[r][kc]) = st.b[i];
  }
}

template <bool Vec, WeightFormat F>
__global__ void __launch_bounds__(kTcThreads) gemm_tc_kernel(const TcGemm g) {
  pdl_entry();
  __shared__ __align__(32) __nv_bfloat16 as[kBM][kLd];
  __shared__ __align__(32) __nv_bfloat16 bs[kBN][kLd];
  __shared__ __align__(32) float scratch[kTcThreads / 32][16 * 16];
  TileRows t;
  if (!tile_rows(g, t)) return;
  const int64_t n0 = int64_t(blockIdx.x) * kBN;
  const float* a = g.a + int64_t(blockIdx.z) * g.stride_a;
  const int64_t brow0 = int64_t(blockIdx.z) * g.b_rows_per_batch + t.group * g.b_rows_per_group;
  float* c = g.c + int64_t(blockIdx.z) * g.stride_c;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int wm = warp / 2, wn = warp % 2;

  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[2][4];
#pragma unroll
  for (int i = 0; i < 2; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) wmma::fill_fragment(acc[i][j], 0.0f);

  Stage st;
  load_stage<Vec, F>(g, a, brow0, t, n0, 0, st);
  for (int64_t k0 = 0; k0 < g.k; k0 += kBK) {
    store_stage(st, as, bs);
    __syncthreads();
    if (k0 + kBK < g.k)
      load_stage<Vec, F>(g, a, brow0, t, n0, k0 + kBK, st);  // in flight meanwhile
#pragma unroll
    for (int kk = 0; kk < kBK; kk += 16) {
      wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> fa[2];
      wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major> fb[4];
#pragma unroll
      for (int i = 0; i < 2; ++i) wmma::load_matrix_sync(fa[i], &as[wm * 32 + i * 16][kk], kLd);
#pragma unroll
      for (int j = 0; j < 4; ++j) wmma::load_matrix_sync(fb[j], &bs[wn * 64 + j * 16][kk], kLd);
#pragma unroll
      for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) wmma::mma_sync(acc[i][j], fa[i], fb[j], acc[i][j]);
    }
    __syncthreads();
  }

  // Epilogue through a per-warp 16 x 16 scratch so edges and accumulate need no special tiles.
  float* sc = scratch[warp];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      wmma::store_matrix_sync(sc, acc[i][j], 16, wmma::mem_row_major);
      __syncwarp();
      for (int e = lane; e < 256; e += 32) {
        const int64_t row = t.row0 + wm * 32 + i * 16 + e / 16;
        const int64_t col = n0 + wn * 64 + j * 16 + e % 16;
        if (row < t.row_end && row < t.row0 + kBM && col < g.n) {
          float* out = c + row * g.ldc + col;
          *out = g.accumulate ? *out + sc[e] : sc[e];
        }
      }
      __syncwarp();
    }
  }
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

}  // namespace

cudaError_t gemm_bf16_tc(const TcGemm& g, cudaStream_t stream) {
  if (g.m < 0 || g.n < 0 || g.k < 0 || g.batch < 1) return cudaErrorInvalidValue;
  if (g.n == 0 || g.batch == 0) return cudaSuccess;
  const bool grouped = g.tile_group != nullptr;
  if (grouped && (!g.tile_row0 || !g.tile_row_end || g.max_tiles < 0)) {
    return cudaErrorInvalidValue;
  }
  const int64_t m_tiles = grouped ? g.max_tiles : (g.m + kBM - 1) / kBM;
  if (m_tiles == 0) return cudaSuccess;
  if (g.k == 0) return cudaErrorInvalidValue;  // C = 0 is not what a caller of a GEMM wants
  const int64_t n_tiles = (g.n + kBN - 1) / kBN;
  if (m_tiles > 65535 || g.batch > 65535 || n_tiles > 2147483647) return cudaErrorInvalidValue;
  // FP32 weights are not BF16-exact: rounding them here would be a silent loss.
  if (g.b.data == nullptr || g.b.cols != g.k || g.b.format == WeightFormat::kF32) {
    return cudaErrorInvalidValue;
  }
  const bool vec = g.k % 8 == 0 && g.lda % 4 == 0 && g.stride_a % 4 == 0 && aligned16(g.a) &&
                   weight_vec8_ok(g.b);
  const dim3 grid(unsigned(n_tiles), unsigned(m_tiles), unsigned(g.batch));
  dispatch_format(g.b.format, [&]<WeightFormat F>() {
    if (vec) {
      gemm_tc_kernel<true, F><<<grid, kTcThreads, 0, stream>>>(g);
    } else {
      gemm_tc_kernel<false, F><<<grid, kTcThreads, 0, stream>>>(g);
    }
  });
  return launch_status();
}

}  // namespace dsv41rt::kernels::cuda
