// Prefill GEMM on Hopper's BF16 tensor cores (contract: gemm_wgmma.cuh).
// Design (the classic sm_90 pipeline, kept small):
//   - A CTA computes a 128 x 128 tile of C. Three warpgroups: the first issues the TMA loads
//     (one thread), the other two each own 64 rows of the tile and run
//     wgmma.m64n128k16 (BF16 in, FP32 accumulators in registers, 64 per thread).
//   - K is walked in 64-column stages (128 bytes of BF16 per row: the 128-byte swizzle's row);
//     a stage is one 128 x 128 B box of A and one of B, landing swizzled; kStages stages in a
//     ring, each with a "full" mbarrier (TMA transaction bytes) and an "empty" one (one arrival
//     per consumer warp once its wgmmas have read the stage).
//   - A consumer keeps one stage's wgmma group in flight (wait_group 1) and releases the stage
//     before it: loads, multiplies and releases overlap.
//   - Parts of a box past m, n or k arrive as zeros (TMA), so tails need no special tiles; the
//     epilogue guards rows and columns.
// Every output is one thread's accumulator, its K walked in stage order and, inside a stage, in
// the instruction's order: the summation order depends on K only.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <type_traits>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/gemm_wgmma.cuh"
#include "kernels/cuda/tma.cuh"
#include "kernels/cuda/weight_decode.cuh"

namespace dsv41rt::kernels::cuda {
namespace {

constexpr int kBM = 128, kBN = 128;
constexpr int kBKBytes = 128;  // 64 BF16 columns per stage
constexpr int kConsumers = 2;  // warpgroups of 64 rows
constexpr int kGemmThreads = 128 * (1 + kConsumers);
constexpr int kATile = kBM * kBKBytes, kBTile = kBN * kBKBytes;  // 16 KB each
constexpr int kStageBytes = kATile + kBTile;
constexpr int kStages = 6;
constexpr int kSmem = 1024 + kStages * kStageBytes;  // + slack to align the ring to 1024

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Keeps the compiler from moving accumulator registers across an asynchronous wgmma.
__device__ __forceinline__ void fence_operands(float (&d)[64]) {
#pragma unroll
  for (int i = 0; i < 64; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// d (64 x 128 FP32, 64 registers per thread) = A (64 x 16, desc a) x B (16 x 128, desc b)
// (+ d when `accumulate`), BF16 inputs, both K-major (no transpose).
__device__ __forceinline__ void wgmma_bf16_n128(float (&d)[64], uint64_t a, uint64_t b,
                                                int accumulate) {
  asm volatile(
      "{.reg .pred p; setp.ne.b32 p, %66, 0; "
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
      "}, %64, %65, p, 1, 1, 0, 0;}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
        "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]),
        "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
        "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]),
        "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]),
        "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]),
        "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]),
        "+f"(d[63])
      : "l"(a), "l"(b), "r"(accumulate));
}

struct Params {
  float* c;
  int64_t ldc;
  int m, n;
  int k_stages;
  bool accumulate;
  const int32_t* tiles;
  int max_tiles, b_rows_per_group, group_lo, group_hi;
  WeightView bw;  // stored B (kStored): rows bw_row0 + ..., k = bw.cols columns
  int64_t bw_row0;
};

// ---- B decoded by the producer warpgroup (kStored) -------------------------------------------
// Thread r of the producer warpgroup owns row r of every stage's 128 x 64 B tile: it loads the
// row's stored codes one stage ahead into registers, then writes the 8 decoded 16-byte chunks
// where a 128-byte-swizzled TMA box would put them (chunk j of row r at 16 (j ^ (r mod 8))), so
// the consumers' descriptors and wgmmas are the staged kernel's. Columns past k and rows past n
// are zeros (as TMA's fill; rows past n only meet discarded outputs).
template <WeightFormat F>
struct StoredChunks {
  // FP8: 8 codes per chunk (uint2); MXFP4: 8 nibbles (uint32); BF16: 8 values (uint4).
  using Word = std::conditional_t<F == WeightFormat::kFp8Block, uint2,
                                  std::conditional_t<F == WeightFormat::kMxfp4, uint32_t, uint4>>;
  Word q[8];
  uint8_t se[8];
};

template <WeightFormat F>
__device__ __forceinline__ void load_stored(const WeightView& w, int64_t row, bool row_ok, int kt,
                                            StoredChunks<F>& out) {
  using Word = typename StoredChunks<F>::Word;
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const int64_t col = int64_t(kt) * 64 + 8 * j;
    out.q[j] = Word{};
    out.se[j] = 127;  // 2^0: zero codes decode to +0 on the fast path
    if (!row_ok || col >= w.cols) continue;
    const uint8_t* base = static_cast<const uint8_t*>(w.data);
    if constexpr (F == WeightFormat::kFp8Block) {
      out.q[j] = __ldg(reinterpret_cast<const uint2*>(base + row * w.cols + col));
      out.se[j] =
          __ldg(&w.scale[(row / w.block_rows) * ((w.cols + w.block_cols - 1) / w.block_cols) +
                         col / w.block_cols]);
    } else if constexpr (F == WeightFormat::kMxfp4) {
      out.q[j] = __ldg(reinterpret_cast<const uint32_t*>(base + row * (w.cols / 2) + col / 2));
      out.se[j] = __ldg(&w.scale[row * ((w.cols + kMxfp4WeightBlock - 1) / kMxfp4WeightBlock) +
                                 col / kMxfp4WeightBlock]);
    } else {
      out.q[j] = __ldg(reinterpret_cast<const uint4*>(base + (row * w.cols + col) * 2));
    }
  }
}

template <WeightFormat F>
__device__ __forceinline__ void store_stored(const StoredChunks<F>& in, uint32_t row_dst, int r) {
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    uint4 v;
    if constexpr (F == WeightFormat::kFp8Block) {
      v = bf16x8_of_fp8(in.q[j], in.se[j]);
    } else if constexpr (F == WeightFormat::kMxfp4) {
      v = bf16x8_of_fp4(in.q[j], in.se[j]);
    } else {
      v = in.q[j];
    }
    asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};" ::"r"(row_dst + 16 * (j ^ (r & 7))),
                 "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w)
                 : "memory");
  }
}

// kStored: B is p.bw in its stored format F, decoded by the producer warpgroup (above); else B is
// the BF16 matrix of map_b (F unused).
template <bool kStored, WeightFormat F>
__global__ void __launch_bounds__(kGemmThreads, 1)
    gemm_wgmma_kernel(const __grid_constant__ CUtensorMap map_a,
                      const __grid_constant__ CUtensorMap map_b, const Params p) {
  pdl_entry();
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  __shared__ __align__(8) uint64_t full[kStages], empty[kStages];
  const uint32_t ring = (smem_u32(smem_raw) + 1023u) & ~1023u;
  const int tid = threadIdx.x, wg = tid / 128;
  const int n0 = blockIdx.x * kBN;
  int m0 = blockIdx.y * kBM, m_end = p.m, b_row0 = n0;
  int64_t bw_row = p.bw_row0 + n0;  // kStored: the stored row of the tile's column 0
  if (p.tiles) {  // grouped: the whole CTA leaves together, before any barrier is set up
    const int t = blockIdx.y, group = p.tiles[t];
    if (group < p.group_lo || group >= p.group_hi) return;
    m0 = p.tiles[p.max_tiles + t];
    m_end = min(p.tiles[2 * p.max_tiles + t], p.m);
    b_row0 = (group - p.group_lo) * p.b_rows_per_group + n0;
    bw_row = p.bw_row0 + int64_t(group) * p.b_rows_per_group + n0;
  }
  if (tid == 0) {
    for (int s = 0; s < kStages; ++s) {
      // kStored: the A load's arrival (with its bytes) and one per producer thread's B row.
      tma::mbar_init(smem_u32(&full[s]), kStored ? 1 + 128 : 1);
      tma::mbar_init(smem_u32(&empty[s]), kConsumers * 4);
    }
    tma::mbar_init_fence();
  }
  __syncthreads();

  if (wg == 0 && kStored) {
    const int r = tid;  // this thread's row of every B tile
    const bool row_ok = n0 + r < p.n;
    StoredChunks<F> next;
    load_stored<F>(p.bw, bw_row + r, row_ok, 0, next);
    for (int kt = 0; kt < p.k_stages; ++kt) {
      const int s = kt % kStages;
      const StoredChunks<F> cur = next;
      if (kt + 1 < p.k_stages) load_stored<F>(p.bw, bw_row + r, row_ok, kt + 1, next);
      if (kt >= kStages) tma::mbar_wait(smem_u32(&empty[s]), ((kt / kStages) - 1) & 1);
      const uint32_t bar = smem_u32(&full[s]), a_dst = ring + s * kStageBytes;
      if (r == 0) {
        tma::mbar_expect_tx(bar, kATile);
        tma::load_2d(a_dst, &map_a, kt * kBKBytes, m0, bar);
      }
      store_stored<F>(cur, a_dst + kATile + r * kBKBytes, r);
      asm volatile("fence.proxy.async.shared::cta;" ::: "memory");  // visible to the wgmmas
      tma::mbar_arrive(bar);
    }
    return;
  }
  if (wg == 0) {
    if (tid == 0) {
      for (int kt = 0; kt < p.k_stages; ++kt) {
        const int s = kt % kStages;
        if (kt >= kStages) tma::mbar_wait(smem_u32(&empty[s]), ((kt / kStages) - 1) & 1);
        const uint32_t bar = smem_u32(&full[s]), a_dst = ring + s * kStageBytes;
        tma::mbar_expect_tx(bar, kStageBytes);
        tma::load_2d(a_dst, &map_a, kt * kBKBytes, m0, bar);
        tma::load_2d(a_dst + kATile, &map_b, kt * kBKBytes, b_row0, bar);
      }
    }
    return;
  }

  const int c = wg - 1;  // this warpgroup's 64 rows: m0 + 64 c ..
  // No instruction but the wgmmas may write the accumulators while the pipeline runs (ptxas would
  // serialise them): the first one starts from zero through its scale-d predicate.
  float d[64];
  for (int kt = 0; kt < p.k_stages; ++kt) {
    const int s = kt % kStages;
    tma::mbar_wait(smem_u32(&full[s]), (kt / kStages) & 1);
    const uint32_t a_tile = ring + s * kStageBytes + c * 64 * kBKBytes;
    const uint32_t b_tile = ring + s * kStageBytes + kATile;
    const uint64_t da = tma::desc_sw128(a_tile), db = tma::desc_sw128(b_tile);
    tma::wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) wgmma_bf16_n128(d, da + 2 * kk, db + 2 * kk, kt | kk);
    tma::wgmma_commit();
    tma::wgmma_wait<1>();  // the previous stage's group is done: its tiles may be refilled
    if (kt > 0) {
      __syncwarp();
      if ((tid & 31) == 0) tma::mbar_arrive(smem_u32(&empty[(kt - 1) % kStages]));
    }
  }
  tma::wgmma_wait<0>();
  fence_operands(d);

  // d[4 j + 2 i + e] is row 16 w + lane / 4 + 8 i, column 8 j + 2 (lane % 4) + e of the 64 x 128.
  const int lane = tid & 31, w = (tid / 32) & 3;
  const bool pairs = (p.ldc % 2 == 0) && (reinterpret_cast<uintptr_t>(p.c) % 8 == 0);
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int row = m0 + 64 * c + 16 * w + lane / 4 + 8 * i;
    if (row >= m_end) continue;
    float* out = p.c + int64_t(row) * p.ldc;
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      const int col = n0 + 8 * j + 2 * (lane % 4);
      float v0 = d[4 * j + 2 * i], v1 = d[4 * j + 2 * i + 1];
      if (pairs && col + 1 < p.n) {
        float2* o = reinterpret_cast<float2*>(out + col);
        if (p.accumulate) {
          const float2 old = *o;
          v0 += old.x, v1 += old.y;
        }
        *o = make_float2(v0, v1);
      } else {
        if (col < p.n) out[col] = p.accumulate ? out[col] + v0 : v0;
        if (col + 1 < p.n) out[col + 1] = p.accumulate ? out[col + 1] + v1 : v1;
      }
    }
  }
}

__global__ void rows_to_bf16_kernel(const float* __restrict__ x, int64_t ldx, int64_t m, int64_t k,
                                    uint16_t* __restrict__ y, int64_t ldy,
                                    const int32_t* __restrict__ gather, int64_t gather_div) {
  pdl_entry();
  const int64_t groups = (k + 3) / 4, total = m * groups;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / groups, c = (i % groups) * 4;
    const int64_t src_row = gather ? (gather[r] < 0 ? -1 : gather[r] / gather_div) : r;
    const float* src = x + src_row * ldx + c;
    uint16_t* dst = y + r * ldy + c;
    for (int e = 0; e < 4 && c + e < k; ++e) {
      dst[e] = src_row < 0 ? uint16_t(0) : __bfloat16_as_ushort(__float2bfloat16_rn(src[e]));
    }
  }
}

template <WeightFormat F, bool Vec>
__global__ void weight_to_bf16_kernel(const WeightView w, int64_t row0, int64_t rows,
                                      uint16_t* __restrict__ y, int64_t ldy) {
  pdl_entry();
  const int64_t groups = (w.cols + 7) / 8, total = rows * groups;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / groups, c = (i % groups) * 8;
    uint16_t* dst = y + r * ldy + c;
    if (Vec) {
      *reinterpret_cast<uint4*>(dst) = weight_bf16x8<F>(w, row0 + r, c);
    } else {
      for (int e = 0; e < 8 && c + e < w.cols; ++e) {
        dst[e] = f32_to_bf16(weight_at<F>(w, row0 + r, c + e));
      }
    }
  }
}

// y row r: for part p of x[r, :] (hi, mid, lo BF16 parts) and copy q < repeat, the k columns at
// (p * repeat + q) * k.
__global__ void split3_kernel(const float* __restrict__ x, int64_t ldx, int64_t m, int64_t k,
                              uint16_t* __restrict__ y, int64_t ldy, int repeat) {
  pdl_entry();
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < m * k;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / k, col = i % k;
    const float v = x[r * ldx + col];
    const __nv_bfloat16 hi = __float2bfloat16_rn(v);
    const float r1 = v - __bfloat162float(hi);
    const __nv_bfloat16 mid = __float2bfloat16_rn(r1);
    const __nv_bfloat16 lo = __float2bfloat16_rn(r1 - __bfloat162float(mid));
    const uint16_t parts[3] = {__bfloat16_as_ushort(hi), __bfloat16_as_ushort(mid),
                               __bfloat16_as_ushort(lo)};
    uint16_t* row = y + r * ldy + col;
    for (int p = 0; p < 3; ++p) {
      for (int q = 0; q < repeat; ++q) row[(p * repeat + q) * k] = parts[p];
    }
  }
}

bool aligned16(const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; }

int grid_for(int64_t items) {
  const int64_t blocks = (items + 255) / 256;
  return int(blocks < 132 * 16 ? (blocks > 0 ? blocks : 1) : 132 * 16);
}

}  // namespace

// The stored B of g (bw): a format the producer decodes, read with its vector loads, k columns,
// and every row a tile may read inside the matrix.
bool stored_b_ok(const WgmmaGemm& g) {
  const WeightView& w = g.bw;
  if (!w.data || w.format == WeightFormat::kF32 || !weight_vec8_ok(w) || w.cols != g.k) {
    return false;
  }
  if (w.format != WeightFormat::kBF16 && !w.scale) return false;
  if (w.format == WeightFormat::kFp8Block && (w.block_rows < 1 || w.block_cols < 8)) return false;
  const int64_t last = g.tiles ? int64_t(g.group_hi) * g.b_rows_per_group : g.n;
  return g.bw_row0 >= 0 && g.bw_row0 + last <= w.rows;
}

bool gemm_bf16_wgmma_supported(const WgmmaGemm& g) {
  const bool stored = g.bw.data != nullptr;
  const bool b_ok =
      stored ? stored_b_ok(g) : g.b && g.ldb % 8 == 0 && g.ldb >= g.k && aligned16(g.b);
  const bool shape = g.a && b_ok && g.c && g.m > 0 && g.n > 0 && g.k > 0 && g.k % 8 == 0 &&
                     g.lda % 8 == 0 && g.lda >= g.k && g.ldc >= g.n && aligned16(g.a) &&
                     g.m <= (int64_t(1) << 30) && g.n <= (int64_t(1) << 30);
  if (!shape || !g.tiles) return shape;
  return g.max_tiles > 0 && g.tile_entries > 0 && g.tile_entries <= g.max_tiles &&
         g.tile_entries <= 65535 && g.max_tiles <= (int64_t(1) << 30) &&
         g.b_rows_per_group >= g.n && g.group_lo >= 0 && g.group_hi > g.group_lo &&
         int64_t(g.group_hi - g.group_lo) * g.b_rows_per_group <= (int64_t(1) << 30);
}

cudaError_t gemm_bf16_wgmma(const WgmmaGemm& g, cudaStream_t stream) {
  if (!gemm_bf16_wgmma_supported(g)) return cudaErrorInvalidValue;
  const bool stored = g.bw.data != nullptr;
  CUtensorMap map_a, map_b;
  cudaError_t e = tma::byte_matrix_map(&map_a, g.a, g.k * 2, g.m, kBKBytes, kBM,
                                       CU_TENSOR_MAP_SWIZZLE_128B, g.lda * 2);
  if (e != cudaSuccess) return e;
  if (stored) {
    map_b = map_a;  // unused: the producer decodes B from g.bw
  } else {
    const int64_t b_rows = g.tiles ? int64_t(g.group_hi - g.group_lo) * g.b_rows_per_group : g.n;
    e = tma::byte_matrix_map(&map_b, g.b, g.k * 2, b_rows, kBKBytes, kBN,
                             CU_TENSOR_MAP_SWIZZLE_128B, g.ldb * 2);
    if (e != cudaSuccess) return e;
  }
  // The kernel instance: the BF16 operand, or the stored format's decoding producer.
  auto kernel = gemm_wgmma_kernel<false, WeightFormat::kBF16>;
  if (stored) {
    dispatch_format(g.bw.format, [&]<WeightFormat F>() {
      if constexpr (F != WeightFormat::kF32) kernel = gemm_wgmma_kernel<true, F>;
    });
  }
  const cudaError_t attr =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
  if (attr != cudaSuccess) return attr;
  Params p;
  p.bw = g.bw, p.bw_row0 = g.bw_row0;
  p.c = g.c, p.ldc = g.ldc, p.m = int(g.m), p.n = int(g.n);
  p.k_stages = int((g.k * 2 + kBKBytes - 1) / kBKBytes);
  p.accumulate = g.accumulate;
  p.tiles = g.tiles, p.max_tiles = int(g.max_tiles), p.b_rows_per_group = int(g.b_rows_per_group);
  p.group_lo = g.group_lo, p.group_hi = g.group_hi;
  const int64_t m_tiles = g.tiles ? g.tile_entries : (g.m + kBM - 1) / kBM;
  const dim3 grid(unsigned((g.n + kBN - 1) / kBN), unsigned(m_tiles));
  if (grid.y > 65535) return cudaErrorInvalidValue;
  kernel<<<grid, kGemmThreads, kSmem, stream>>>(map_a, map_b, p);
  return launch_status();
}

cudaError_t gemm_f32_split3(const float* a, int64_t lda, const float* b, int64_t ldb, int64_t m,
                            int64_t n, int64_t k, float* c, int64_t ldc, uint16_t* a_ws,
                            int64_t a_ws_elems, uint16_t* b_ws, int64_t b_ws_elems,
                            cudaStream_t stream) {
  if (!a || !b || !c || !a_ws || !b_ws || m <= 0 || n <= 0 || k <= 0 || k % 8 != 0 || lda < k ||
      ldb < k || ldc < n || a_ws_elems < 9 * k * kBM || b_ws_elems < 3 * k * kBN ||
      !aligned16(a_ws) || !aligned16(b_ws)) {
    return cudaErrorInvalidValue;
  }
  const int64_t m_chunk = std::min(m, a_ws_elems / (9 * k) / kBM * kBM);
  const int64_t n_chunk = std::min(n, b_ws_elems / (3 * k) / kBN * kBN);
  for (int64_t n0 = 0; n0 < n; n0 += n_chunk) {
    const int64_t nc = std::min(n_chunk, n - n0);
    split3_kernel<<<grid_for(nc * k), 256, 0, stream>>>(b + n0 * ldb, ldb, nc, k, b_ws, 3 * k, 1);
    cudaError_t e = launch_status();
    if (e != cudaSuccess) return e;
    for (int64_t m0 = 0; m0 < m; m0 += m_chunk) {
      const int64_t mc = std::min(m_chunk, m - m0);
      split3_kernel<<<grid_for(mc * k), 256, 0, stream>>>(a + m0 * lda, lda, mc, k, a_ws, 9 * k, 3);
      if ((e = launch_status()) != cudaSuccess) return e;
      for (int part = 0; part < 3; ++part) {
        WgmmaGemm g;
        g.a = a_ws + 3 * k * part, g.lda = 9 * k, g.b = b_ws, g.ldb = 3 * k;
        g.c = c + m0 * ldc + n0, g.ldc = ldc, g.m = mc, g.n = nc, g.k = 3 * k;
        g.accumulate = part > 0;
        if ((e = gemm_bf16_wgmma(g, stream)) != cudaSuccess) return e;
      }
    }
  }
  return cudaSuccess;
}

cudaError_t rows_to_bf16(const float* x, int64_t ldx, int64_t m, int64_t k, uint16_t* y,
                         int64_t ldy, cudaStream_t stream, const int32_t* gather,
                         int64_t gather_div) {
  if (m < 0 || k < 0 || ldx < k || ldy < k || gather_div < 1 || (m > 0 && k > 0 && (!x || !y))) {
    return cudaErrorInvalidValue;
  }
  if (m == 0 || k == 0) return cudaSuccess;
  rows_to_bf16_kernel<<<grid_for(m * ((k + 3) / 4)), 256, 0, stream>>>(x, ldx, m, k, y, ldy, gather,
                                                                       gather_div);
  return launch_status();
}

cudaError_t weight_to_bf16(const WeightView& w, int64_t row0, int64_t rows, uint16_t* y,
                           int64_t ldy, cudaStream_t stream) {
  if (!w.data || !y || row0 < 0 || rows < 0 || row0 + rows > w.rows || ldy < w.cols ||
      w.format == WeightFormat::kF32) {
    return cudaErrorInvalidValue;
  }
  if (rows == 0 || w.cols == 0) return cudaSuccess;
  const bool vec = weight_vec8_ok(w) && ldy % 8 == 0 && aligned16(y);
  const int grid = grid_for(rows * ((w.cols + 7) / 8));
  dispatch_format(w.format, [&]<WeightFormat F>() {
    if (vec) {
      weight_to_bf16_kernel<F, true><<<grid, 256, 0, stream>>>(w, row0, rows, y, ldy);
    } else {
      weight_to_bf16_kernel<F, false><<<grid, 256, 0, stream>>>(w, row0, rows, y, ldy);
    }
  });
  return launch_status();
}

}  // namespace dsv41rt::kernels::cuda
