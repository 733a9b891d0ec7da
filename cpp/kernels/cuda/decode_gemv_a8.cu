// A8 decode GEMM (contract: decode_gemv_a8.cuh): the quantiser, the argument checks and the
// mma.sync path (the wgmma path: decode_gemv_a8_wgmma.cu). Design of the mma.sync kernel:
//   - swap-AB mma.sync m16n8k32 E4M3 x E4M3 -> FP32: 16 weight rows in the MMA's M slot, 8 tokens
//     in N, one 32-column block in K, so each MMA result is one block's P_b, promoted at once:
//     acc = fma(P_b, sw * sx, acc). No weight decoding at all: the stored bytes are the operands.
//   - The MMA's k slots {4t..4t+3} and {16+4t..16+4t+3} are given the block's physical columns
//     8t..8t+7 (a permutation applied to A and B alike), so a lane reads 8 contiguous bytes per
//     row and block: 4 lanes cover a row's 32-byte block (whole sectors).
//   - A warp owns 2 row tiles (32 rows), a CTA 8 warps (256 rows). K is walked in pieces of 4
//     blocks (128 columns); the next piece's weights and scales are loaded (register double
//     buffer) while the current one is multiplied. Activations (a few KB) come through L1.
//   - Split-K over pieces for small matrices (split_k.cuh); partials to the workspace, added in
//     split order by a second kernel (deterministic, no atomics).
#include <utility>

#include "core/dtype.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/decode_gemv_a8.cuh"
#include "kernels/cuda/decode_gemv_a8_wgmma.cuh"
#include "kernels/cuda/quant_device.cuh"
#include "kernels/cuda/split_k.cuh"

namespace dsv41rt::kernels::cuda {
namespace {

constexpr int kWarps = 8, kBlockThreads = 32 * kWarps;
constexpr int kRT = 2;                  // 16-row tiles per warp
constexpr int kBM = kWarps * kRT * 16;  // rows per CTA
constexpr int kBlocks = 4;              // 32-column blocks per piece
constexpr int kPieceCols = 32 * kBlocks;

struct Params {
  const uint8_t* xq;
  int64_t ldq;
  const uint8_t* w;
  const uint8_t* scale;
  int64_t scale_cols;
  int block_rows, block_cols;
  float* y;
  int64_t ldy;
  float* ws;
  int m, n;
  int64_t k;
  int splits, pieces;
  bool accumulate;
};

__device__ __forceinline__ uint2 ld_stream8(const uint8_t* p) {
  uint2 v;
  asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v2.u32 {%0, %1}, [%2];"
               : "=r"(v.x), "=r"(v.y)
               : "l"(p));
  return v;
}

// d = A (16 x 32 E4M3) * B (32 x 8 E4M3), FP32, from zero.
__device__ __forceinline__ void mma_fp8(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                        uint32_t a3, uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%10, %10, %10, %10};"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1), "f"(0.0f));
}

struct Buf {
  uint2 w[kBlocks][kRT][2];  // rows g, g + 8 of each tile: 8 bytes per block
  uint32_t sw[kRT];          // the 4 blocks' weight scale codes of each tile, byte b
};

template <int NT>
struct Kernel {
  __device__ static void load(const Params& p, const uint8_t* const (&wrow)[kRT][2],
                              const uint8_t* const (&srow)[kRT], int64_t pc, Buf& b) {
    const int t = threadIdx.x % 4;
#pragma unroll
    for (int blk = 0; blk < kBlocks; ++blk) {
      const int64_t col = pc * kPieceCols + blk * 32;
#pragma unroll
      for (int rt = 0; rt < kRT; ++rt) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          b.w[blk][rt][h] = wrow[rt][h] ? ld_stream8(wrow[rt][h] + col + 8 * t) : make_uint2(0, 0);
        }
      }
    }
#pragma unroll
    for (int rt = 0; rt < kRT; ++rt) {
      uint32_t codes = 0;
#pragma unroll
      for (int blk = 0; blk < kBlocks; ++blk) {
        const int64_t col = pc * kPieceCols + blk * 32;
        const uint32_t c = srow[rt] ? __ldg(srow[rt] + col / p.block_cols) : 127u;
        codes |= c << (8 * blk);
      }
      b.sw[rt] = codes;
    }
  }

  // UE8M0 code -> 2^(code - 127). Fast: the bits alone, right for codes 1..254 (every real
  // scale); exact: e8m0_to_f32 (code 0 is an FP32 subnormal, 255 NaN).
  template <bool Exact>
  __device__ static float scale_of(uint32_t code) {
    if constexpr (Exact) return e8m0_to_f32(uint8_t(code));
    return __uint_as_float(code << 23);
  }

  // Any byte of v equal to 0x00 or 0xFF.
  __device__ static bool has_edge_byte(uint32_t v) {
    const uint32_t n = ~v;
    return (((v - 0x01010101u) & n) | ((n - 0x01010101u) & v)) & 0x80808080u;
  }

  __device__ static void compute(const Params& p, int64_t pc, const Buf& b,
                                 float (&acc)[kRT][NT][4]) {
    const int lane = threadIdx.x % 32, t = lane % 4;
    // B operand: token nt * 8 + g; C columns: tokens nt * 8 + 2t, + 1 (tokens past m repeat the
    // last one: computed, never stored). sx: the piece's 4 scale codes of each C token.
    uint32_t sx[NT][2];
    bool edge = has_edge_byte(b.sw[0]) || has_edge_byte(b.sw[1]);
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const int tok = min(nt * 8 + 2 * t + j, p.m - 1);
        sx[nt][j] = __ldg(reinterpret_cast<const uint32_t*>(p.xq + tok * p.ldq + p.k) + pc);
        edge = edge || has_edge_byte(sx[nt][j]);
      }
    }
    // Warp-uniform: scale codes 0 / 255 (never in real weights; NaN activations) take the exact
    // conversion in their own copy of the loop.
    if (__any_sync(0xffffffffu, edge)) {
      multiply<true>(p, pc, b, sx, acc);
    } else {
      multiply<false>(p, pc, b, sx, acc);
    }
  }

  template <bool Exact>
  __device__ static void multiply(const Params& p, int64_t pc, const Buf& b,
                                  const uint32_t (&sx)[NT][2], float (&acc)[kRT][NT][4]) {
    const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const uint8_t* xb[NT];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      xb[nt] = p.xq + min(nt * 8 + g, p.m - 1) * p.ldq + pc * kPieceCols + 8 * t;
    }
#pragma unroll
    for (int blk = 0; blk < kBlocks; ++blk) {
      float sw[kRT];
#pragma unroll
      for (int rt = 0; rt < kRT; ++rt) sw[rt] = scale_of<Exact>((b.sw[rt] >> (8 * blk)) & 0xFF);
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        const uint2 bx = __ldg(reinterpret_cast<const uint2*>(xb[nt] + blk * 32));
        const float s0x = scale_of<Exact>((sx[nt][0] >> (8 * blk)) & 0xFF);
        const float s1x = scale_of<Exact>((sx[nt][1] >> (8 * blk)) & 0xFF);
#pragma unroll
        for (int rt = 0; rt < kRT; ++rt) {
          float d[4];
          mma_fp8(d, b.w[blk][rt][0].x, b.w[blk][rt][1].x, b.w[blk][rt][0].y, b.w[blk][rt][1].y,
                  bx.x, bx.y);
          const float s0 = sw[rt] * s0x, s1 = sw[rt] * s1x;  // powers of two: exact
          acc[rt][nt][0] = fmaf(d[0], s0, acc[rt][nt][0]);
          acc[rt][nt][1] = fmaf(d[1], s1, acc[rt][nt][1]);
          acc[rt][nt][2] = fmaf(d[2], s0, acc[rt][nt][2]);
          acc[rt][nt][3] = fmaf(d[3], s1, acc[rt][nt][3]);
        }
      }
    }
  }

  __device__ static void run(const Params& p) {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4;
    const int64_t split = blockIdx.y;
    const int64_t row0 = int64_t(blockIdx.x) * kBM + warp * (kRT * 16);
    const uint8_t* wrow[kRT][2];
    const uint8_t* srow[kRT];
#pragma unroll
    for (int rt = 0; rt < kRT; ++rt) {
      const int64_t r0 = row0 + rt * 16;  // block_rows % 16 == 0: one scale row per tile
      srow[rt] = r0 < p.n ? p.scale + (r0 / p.block_rows) * p.scale_cols : nullptr;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int64_t r = r0 + g + 8 * h;
        wrow[rt][h] = r < p.n ? p.w + r * p.k : nullptr;
      }
    }
    const int64_t pc0 = split * p.pieces / p.splits, pc1 = (split + 1) * p.pieces / p.splits;

    float acc[kRT][NT][4];
#pragma unroll
    for (int rt = 0; rt < kRT; ++rt)
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
        acc[rt][nt][0] = acc[rt][nt][1] = acc[rt][nt][2] = acc[rt][nt][3] = 0.f;

    Buf buf[2];
    load(p, wrow, srow, pc0, buf[0]);
    // Two pieces per iteration so the register double buffer needs no copies.
    for (int64_t pc = pc0; pc < pc1; pc += 2) {
      if (pc + 1 < pc1) load(p, wrow, srow, pc + 1, buf[1]);
      compute(p, pc, buf[0], acc);
      if (pc + 1 < pc1) {
        if (pc + 2 < pc1) load(p, wrow, srow, pc + 2, buf[0]);
        compute(p, pc + 1, buf[1], acc);
      }
    }

    // acc[rt][nt]: c0, c1 = (row g, tokens 2t, 2t+1), c2, c3 = (row g + 8, same tokens).
    float* out = p.splits == 1 ? p.y : p.ws + split * int64_t(p.m) * p.n;
    const int64_t ld = p.splits == 1 ? p.ldy : p.n;
    store_mma_tiles<kRT, NT>(acc, out, ld, p.splits == 1 && p.accumulate, row0, p.n, p.m);
  }
};

template <int NT>
__global__ void __launch_bounds__(kBlockThreads, NT == 1 ? 2 : 1) a8_kernel(const Params p) {
  pdl_entry();
  Kernel<NT>::run(p);
}

// One warp per (row, 32-column block): BF16 rounding, then the fp8 window cache codec, bitwise
// the CPU's (kernels::cpu::fp8_act_qdq's codes).
__global__ void __launch_bounds__(kThreads)
    quantize_act_kernel(const float* x, int64_t m, int64_t k, int64_t ldx, uint8_t* q,
                        int64_t ldq) {
  pdl_entry();
  const int lane = threadIdx.x % 32;
  const int64_t blocks = k / 32, warps = int64_t(gridDim.x) * (blockDim.x / 32);
  for (int64_t wb = blockIdx.x * int64_t(blockDim.x / 32) + threadIdx.x / 32; wb < m * blocks;
       wb += warps) {
    const int64_t row = wb / blocks, c = (wb % blocks) * 32 + lane;
    const float v = bf16_to_f32(f32_to_bf16(x[row * ldx + c]));
    qdev::pack_lane<qdev::Format::kFp8Window>(v, true, c, k, q + row * ldq);
  }
}

bool aligned16(const void* ptr) { return (reinterpret_cast<uintptr_t>(ptr) & 15) == 0; }

}  // namespace

cudaError_t quantize_act_fp8(const float* x, int64_t m, int64_t k, int64_t ldx, uint8_t* q,
                             int64_t ldq, cudaStream_t stream) {
  if (m < 0 || k < 32 || k % 32 != 0 || ldx < k || ldq < act_fp8_row_bytes(k)) {
    return cudaErrorInvalidValue;
  }
  if (m == 0) return cudaSuccess;
  if (!x || !q) return cudaErrorInvalidValue;
  quantize_act_kernel<<<blocks_for(m * (k / 32) * 32), kThreads, 0, stream>>>(x, m, k, ldx, q, ldq);
  return launch_status();
}

bool decode_gemv_a8_supported(const DecodeGemvA8& g) {
  const WeightView& w = g.w;
  if (g.m < 1 || g.m > kDecodeGemvA8MaxM || g.n < 1 || g.k < kPieceCols) return false;
  if (g.k % kPieceCols != 0 || g.n > (int64_t(1) << 30)) return false;
  if (!g.xq || !g.y || !w.data || !w.scale || !aligned16(g.xq) || !aligned16(w.data)) return false;
  if (g.ldq % 16 != 0 || g.ldq < act_fp8_row_bytes(g.k)) return false;
  if (g.m > 1 && g.ldy < g.n) return false;
  if (g.path != A8Path::kWgmma && g.path != A8Path::kMmaSync) return false;
  if (g.path == A8Path::kWgmma && g.k / kPieceCols > kA8WgmmaMaxPiecesPerSplit) return false;
  if (w.format != WeightFormat::kFp8Block || w.cols != g.k || g.n > w.rows) return false;
  return w.block_cols >= 32 && w.block_cols % 32 == 0 && w.block_rows >= 16 &&
         w.block_rows % 16 == 0;
}

int64_t decode_gemv_a8_splits(const DecodeGemvA8& g) {
  if (g.n < 1 || g.k < kPieceCols) return 1;
  const int64_t n = g.split_n > 0 ? g.split_n : g.n;
  if (g.path == A8Path::kWgmma) return decode_gemv_a8_wgmma_splits(n, g.k / kPieceCols);
  return split_k_count((n + kBM - 1) / kBM, g.k / kPieceCols);
}

int64_t decode_gemv_a8_workspace_floats(const DecodeGemvA8& g) {
  const int64_t s = decode_gemv_a8_splits(g);
  return s > 1 ? s * g.m * g.n : 0;
}

cudaError_t decode_gemv_a8(const DecodeGemvA8& g, float* workspace, int64_t workspace_floats,
                           cudaStream_t stream) {
  if (!decode_gemv_a8_supported(g)) return cudaErrorInvalidValue;
  const int64_t splits = decode_gemv_a8_splits(g), need = decode_gemv_a8_workspace_floats(g);
  if (need > 0 && (workspace == nullptr || workspace_floats < need)) return cudaErrorInvalidValue;
  if (g.path == A8Path::kWgmma) {
    if (const cudaError_t e = decode_gemv_a8_wgmma_launch(g, splits, workspace, stream);
        e != cudaSuccess || splits == 1) {
      return e;
    }
    return reduce_splits(SplitPartials{workspace, splits, g.m, g.n, 1, g.y, g.ldy, 0, g.accumulate},
                         stream);
  }
  Params p{};
  p.xq = g.xq, p.ldq = g.ldq;
  p.w = static_cast<const uint8_t*>(g.w.data), p.scale = g.w.scale;
  p.scale_cols = g.w.scale_cols();
  p.block_rows = int(g.w.block_rows), p.block_cols = int(g.w.block_cols);
  p.y = g.y, p.ldy = g.ldy, p.ws = workspace;
  p.m = int(g.m), p.n = int(g.n), p.k = g.k;
  p.splits = int(splits), p.pieces = int(g.k / kPieceCols);
  p.accumulate = g.accumulate;
  const dim3 grid(unsigned((g.n + kBM - 1) / kBM), unsigned(splits));
  if (g.m <= 8) {
    a8_kernel<1><<<grid, kBlockThreads, 0, stream>>>(p);
  } else if (g.m <= 16) {
    a8_kernel<2><<<grid, kBlockThreads, 0, stream>>>(p);
  } else if (g.m <= 32) {
    a8_kernel<4><<<grid, kBlockThreads, 0, stream>>>(p);
  } else {
    a8_kernel<8><<<grid, kBlockThreads, 0, stream>>>(p);
  }
  if (splits > 1) {
    if (const cudaError_t e = launch_status(); e != cudaSuccess) return e;
    return reduce_splits(SplitPartials{workspace, splits, g.m, g.n, 1, g.y, g.ldy, 0, g.accumulate},
                         stream);
  }
  return launch_status();
}

}  // namespace dsv41rt::kernels::cuda
