// A8 decode GEMM on Hopper's FP8 tensor cores (contract: decode_gemv_a8.cuh, path kWgmma).
// Design:
//   - swap-AB wgmma.m64nNk32.f32.e4m3.e4m3: a CTA is one warpgroup owning 64 weight rows (the
//     instruction's M), the tokens are N (8, 16, 32 or 64), one instruction is one 32-column
//     block, so each result is that block's P_b and is promoted at once,
//     acc = fma(P_b, sw * sx, acc) (the mma.sync path's arithmetic, in the same order).
//   - Weights: TMA (one thread issues 64-row x 128-byte boxes, 128-byte swizzle, completion on an
//     mbarrier per ring slot; rows past n arrive as zeros). With 16-byte cp.async per thread the
//     kernel moved only ~1.4 TB/s whatever its instruction count (ncu: L2 at 2x the DRAM
//     traffic, warps idle). Activations: 16-byte cp.async into K-major planes without swizzle
//     (a 16-column plane holds the N tokens' 16-byte chunks back to back: LBO = the plane, SBO =
//     128 bytes); tokens past m are zero-filled (src-size 0).
//   - K is cut in pieces of 128 columns (4 blocks: 8 KB of weights + N x 128 B of activations);
//     a stage is kPieces pieces, kStages stages in a ring, the loads of stage i + kStages - 1
//     issued before stage i is multiplied. Nothing is decoded on CUDA cores: the stored bytes are
//     the operands. Per-stage work that is not streaming (barrier, waits, descriptors) is what
//     limits this kernel (ncu, 128-column stages: 340 warp instructions per 2 KB, IPC 1.3), so a
//     stage is as large as shared memory allows at 2 CTAs per SM.
//   - Every scale of the CTA's split (weights: 4 per warp and piece; activations: 4 per token and
//     piece) is read, converted to FP32 and put in shared memory once, at the start: read per
//     stage, their latency was on every stage's critical path, and converted per block they
//     were a third of the instructions.
//   - For N <= 16 a piece's 4 block sums are double-buffered in registers: the next piece's
//     wgmmas run while this one is promoted.
//   - Split-K over pieces for small matrices (split_k.cuh), as on the other decode GEMMs.
#include <cuda_runtime.h>

#include "core/dtype.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/decode_gemv_a8.cuh"
#include "kernels/cuda/decode_gemv_a8_wgmma.cuh"
#include "kernels/cuda/split_k.cuh"
#include "kernels/cuda/tma.cuh"

namespace dsv41rt::kernels::cuda {
namespace {

constexpr int kWgThreads = 128;              // one warpgroup
constexpr int kRows = 64;                    // weight rows per CTA: the wgmma M
constexpr int kBlocks = 4;                   // 32-column blocks per piece
constexpr int kPieceCols = 32 * kBlocks;     // 128
constexpr int kWPiece = kRows * kPieceCols;  // 8 KB of weights per piece (one TMA box)
constexpr int kSwizzleAtom = 1024;           // 8 rows x 128 B: the 128-byte swizzle's period
constexpr int kHeader = 64;                  // mbarriers, before the 1024-aligned tiles
constexpr int kCtasPerSm = 2;  // the split count's assumption (a function of n and k only)

template <int N>
struct Cfg {
  static constexpr int kXPlane = N * 16;
  static constexpr int kXPiece = 2 * kBlocks * kXPlane;
  static constexpr int kPieceBytes = kWPiece + kXPiece;
  static constexpr int kPieces = N <= 16 ? 3 : (N == 32 ? 2 : 1);  // pieces per stage
  static constexpr int kStageBytes = kPieces * kPieceBytes;
  static constexpr int kStages = 3;
  static constexpr int kSmem = kStages * kStageBytes;
  // A piece's 4 block sums fit in registers twice over: the next piece's wgmmas run while this
  // one is promoted. Larger N: kBatch blocks at a time, one batch in flight.
  static constexpr bool kWholePiece = N <= 16;
  static constexpr int kBatch = N <= 16 ? 4 : (N == 32 ? 2 : 1);
  // Register budget: the accumulators and block sums grow with N.
  static constexpr int kMinCtas = N <= 32 ? kCtasPerSm : 1;
  // Shared memory of the scales (FP32, e8m0_to_f32 of each code) for `pieces` pieces: a float4
  // (the piece's 4 blocks) per warp and per token.
  static constexpr int scale_bytes(int pieces) { return 16 * (4 + N) * pieces; }
  static constexpr int kMaxSmem =
      kHeader + kSwizzleAtom + kSmem + scale_bytes(kA8WgmmaMaxPiecesPerSplit);
};

struct Params {
  const uint8_t* xq;
  int64_t ldq;
  const uint8_t* w;
  const uint8_t* scale;
  int64_t scale_cols;
  int block_rows, blocks_per_scale;  // blocks_per_scale = block_cols / 32
  float* y;
  int64_t ldy;
  float* ws;
  int m, n;
  int64_t k;
  int splits, pieces, max_pieces;  // max_pieces: the most pieces a split has
  bool accumulate;
};

__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src),
               "r"(valid ? 16 : 0)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;" ::: "memory");
}
template <int Pending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(Pending) : "memory");
}

// Shared-memory matrix descriptor, no swizzle: start address, LBO, SBO (all in 16-byte units).
__device__ __forceinline__ uint64_t smem_desc(uint32_t addr, uint32_t lbo, uint32_t sbo) {
  return uint64_t((addr & 0x3FFFFu) >> 4) | (uint64_t(lbo >> 4) << 16) | (uint64_t(sbo >> 4) << 32);
}

// d = A (64 x 32 E4M3, desc a) * B (32 x N E4M3, desc b), FP32, not accumulated (predicate
// scale-d false: d's inputs are ignored).
template <int N>
__device__ __forceinline__ void wgmma_fp8(float (&d)[N / 2], uint64_t a, uint64_t b);

template <>
__device__ __forceinline__ void wgmma_fp8<8>(float (&d)[4], uint64_t a, uint64_t b) {
  asm volatile(
      "{.reg .pred p; setp.ne.b32 p, 0, 0; "
      "wgmma.mma_async.sync.aligned.m64n8k32.f32.e4m3.e4m3 {%0, %1, %2, %3}, %4, %5, p, 1, 1;}"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "l"(a), "l"(b));
}
template <>
__device__ __forceinline__ void wgmma_fp8<16>(float (&d)[8], uint64_t a, uint64_t b) {
  asm volatile(
      "{.reg .pred p; setp.ne.b32 p, 0, 0; "
      "wgmma.mma_async.sync.aligned.m64n16k32.f32.e4m3.e4m3 {%0, %1, %2, %3, %4, %5, %6, %7}, "
      "%8, %9, p, 1, 1;}"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
        "+f"(d[7])
      : "l"(a), "l"(b));
}
template <>
__device__ __forceinline__ void wgmma_fp8<32>(float (&d)[16], uint64_t a, uint64_t b) {
  asm volatile(
      "{.reg .pred p; setp.ne.b32 p, 0, 0; "
      "wgmma.mma_async.sync.aligned.m64n32k32.f32.e4m3.e4m3 {%0, %1, %2, %3, %4, %5, %6, %7, "
      "%8, %9, %10, %11, %12, %13, %14, %15}, %16, %17, p, 1, 1;}"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
        "+f"(d[14]), "+f"(d[15])
      : "l"(a), "l"(b));
}
template <>
__device__ __forceinline__ void wgmma_fp8<64>(float (&d)[32], uint64_t a, uint64_t b) {
  asm volatile(
      "{.reg .pred p; setp.ne.b32 p, 0, 0; "
      "wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3 {%0, %1, %2, %3, %4, %5, %6, %7, "
      "%8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, "
      "%26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1;}"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
        "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]),
        "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
        "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "l"(a), "l"(b));
}

// Keeps the compiler from moving accesses to wgmma registers across the async window.
template <int R>
__device__ __forceinline__ void fence_regs(float (&d)[R]) {
#pragma unroll
  for (int i = 0; i < R; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

template <int N>
struct Kernel {
  using C = Cfg<N>;
  static constexpr int kXChunks = (N * 8 + kWgThreads - 1) / kWgThreads;

  // Per-thread activation copy addresses of piece 0 (a piece at column c adds c).
  struct Copies {
    const uint8_t* xsrc[kXChunks];
    uint32_t xdst[kXChunks];
    bool xok[kXChunks], xany[kXChunks];
  };

  __device__ static Copies copies(const Params& p) {
    Copies c;
    const int tid = threadIdx.x, c8 = tid % 8;
#pragma unroll
    for (int i = 0; i < kXChunks; ++i) {
      const int q = tid + i * kWgThreads, tok = q / 8;
      c.xany[i] = q < N * 8;
      c.xok[i] = tok < p.m;
      c.xsrc[i] = p.xq + (c.xok[i] ? tok : 0) * p.ldq + c8 * 16;
      c.xdst[i] = kWPiece + c8 * C::kXPlane + tok * 16;
    }
    return c;
  }

  // Loads the weights of the stage whose first piece is pc into the slot at slot_addr by TMA
  // (thread 0; rows past n arrive as zeros), completing on bar.
  __device__ static void load_weights(const CUtensorMap* wmap, uint32_t slot_addr, uint32_t bar,
                                      int64_t pc, int64_t pc1) {
    const int pieces = int(min(int64_t(C::kPieces), pc1 - pc));
    if (threadIdx.x == 0) {
      tma::mbar_expect_tx(bar, uint32_t(pieces * kWPiece));
      for (int q = 0; q < pieces; ++q) {
        tma::load_2d(slot_addr + q * C::kPieceBytes, wmap, int((pc + q) * kPieceCols),
                     int(blockIdx.x) * kRows, bar);
      }
    }
  }
  // Loads the activations of that stage by cp.async (tokens past m zero-filled), completing in
  // this thread's cp.async group.
  __device__ static void load_acts(const Copies& c, uint32_t slot_addr, int64_t pc, int64_t pc1) {
    const int pieces = int(min(int64_t(C::kPieces), pc1 - pc));
#pragma unroll
    for (int q = 0; q < C::kPieces; ++q) {
      if (q >= pieces) break;  // uniform: the split's last stage may be short
      const int64_t col = (pc + q) * kPieceCols;
      const uint32_t dst = slot_addr + q * C::kPieceBytes;
#pragma unroll
      for (int i = 0; i < kXChunks; ++i) {
        if (c.xany[i]) cp_async16(dst + c.xdst[i], c.xsrc[i] + col, c.xok[i]);
      }
    }
  }

  // Descriptors of block b of the piece whose A / B descriptors are da / db: the start address
  // field is the low 14 bits (in 16-byte units) and every address stays below 256 KB, so
  // advancing is an add (A: 32 bytes along the swizzled row; B: two 16-column planes).
  __device__ static uint64_t block_a(uint64_t da, int b) { return da + (32 * b >> 4); }
  __device__ static uint64_t block_b(uint64_t db, int b) { return db + (2 * b * C::kXPlane >> 4); }

  // Issues the wgmmas of blocks b0 .. b0 + kBatch - 1 of a piece into d (one commit group).
  __device__ static void issue(float (&d)[C::kBatch][N / 2], uint64_t da, uint64_t db, int b0) {
#pragma unroll
    for (int bb = 0; bb < C::kBatch; ++bb) {
#pragma unroll
      for (int r = 0; r < N / 2; ++r) d[bb][r] = 0.f;
      fence_regs(d[bb]);
    }
    tma::wgmma_fence();
#pragma unroll
    for (int bb = 0; bb < C::kBatch; ++bb) {
      wgmma_fp8<N>(d[bb], block_a(da, b0 + bb), block_b(db, b0 + bb));
    }
    tma::wgmma_commit();
  }

  // acc = fma(P_b, sw_b * sx_b, acc) for blocks b0 .. b0 + kBatch - 1 of piece i, in block order.
  __device__ static void promote(const float (&d)[C::kBatch][N / 2], int b0, const float* sws,
                                 const float* sxs, int max_pieces, int i, float (&acc)[N / 2]) {
    const int warp = threadIdx.x / 32, t = threadIdx.x % 4;
    const float4 sw4 = reinterpret_cast<const float4*>(sws)[warp * max_pieces + i];
    const float swv[4] = {sw4.x, sw4.y, sw4.z, sw4.w};
#pragma unroll
    for (int c = 0; c < N / 8; ++c) {
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const float4 sx4 =
            reinterpret_cast<const float4*>(sxs)[(c * 8 + 2 * t + j) * max_pieces + i];
        const float sxv[4] = {sx4.x, sx4.y, sx4.z, sx4.w};
#pragma unroll
        for (int bb = 0; bb < C::kBatch; ++bb) {
          const int b = b0 + bb;
          // Powers of two: the product is exact (as on the mma.sync path).
          const float sc = swv[b] * sxv[b];
          acc[4 * c + j] = fmaf(d[bb][4 * c + j], sc, acc[4 * c + j]);
          acc[4 * c + 2 + j] = fmaf(d[bb][4 * c + 2 + j], sc, acc[4 * c + 2 + j]);
        }
      }
    }
  }

  // One stage of P pieces (N <= 16) whose first piece's descriptors are da / db. Two sets of
  // block sums: piece q + 1's wgmmas run while piece q is promoted.
  template <int P>
  __device__ static void whole_stage(uint64_t da, uint64_t db, const float* sws, const float* sxs,
                                     int max_pieces, int i0, float (&acc)[N / 2]) {
    constexpr uint64_t kStep = C::kPieceBytes >> 4;  // one piece in the descriptors' units
    float d[2][C::kBatch][N / 2];
    issue(d[0], da, db, 0);
#pragma unroll
    for (int q = 0; q < P; ++q) {
      if (q + 1 < P) {
        issue(d[(q + 1) % 2], da + (q + 1) * kStep, db + (q + 1) * kStep, 0);
        tma::wgmma_wait<1>();
      } else {
        tma::wgmma_wait<0>();
      }
#pragma unroll
      for (int bb = 0; bb < C::kBatch; ++bb) fence_regs(d[q % 2][bb]);
      promote(d[q % 2], 0, sws, sxs, max_pieces, i0 + q, acc);
    }
  }

  __device__ static void run(const Params& p, const CUtensorMap* wmap, uint8_t* smem_raw) {
    const int warp = threadIdx.x / 32;
    const int64_t row0 = int64_t(blockIdx.x) * kRows + warp * 16;  // this warp's 16 rows
    const int split = blockIdx.y;
    const int64_t pc0 = int64_t(split) * p.pieces / p.splits;
    const int64_t pc1 = int64_t(split + 1) * p.pieces / p.splits;
    const int npc = int(pc1 - pc0), nst = (npc + C::kPieces - 1) / C::kPieces;
    // mbarriers first, then the tiles on a 1024-byte boundary (the swizzle's period), then the
    // scales.
    const uint32_t raw = uint32_t(__cvta_generic_to_shared(smem_raw));
    const uint32_t base = (raw + kHeader + kSwizzleAtom - 1) & ~uint32_t(kSwizzleAtom - 1);
    uint8_t* smem = smem_raw + (base - raw);
    auto bar = [&](int slot) { return raw + 8 * slot; };
    if (threadIdx.x == 0) {
      for (int s = 0; s < C::kStages; ++s) tma::mbar_init(bar(s), 1);
      tma::mbar_init_fence();
    }
    __syncthreads();
    const Copies cp = copies(p);

    // The weights and their scales are never written by a kernel of the step, so their first
    // stages are requested before waiting for the grids this one depends on (programmatic
    // dependent launch in decode graphs: the previous kernel may still be running); everything
    // that reads the activations or writes comes after the wait (pdl_entry).
#pragma unroll
    for (int s = 0; s < C::kStages - 1; ++s) {
      if (s < nst) load_weights(wmap, base + s * C::kStageBytes, bar(s), pc0 + s * C::kPieces, pc1);
    }

    // The split's scales, while the first stages are in flight: sws[w][i] = warp w's 4 weight
    // scales of piece i (block_rows % 16 == 0: a warp's 16 rows share a scale row), sxs[tok][i]
    // token tok's 4 activation scales (past m: the last token's; never stored). Exact
    // conversions (e8m0_to_f32), done once here instead of per block.
    float* sws = reinterpret_cast<float*>(smem + C::kSmem);
    float* sxs = sws + 4 * 4 * p.max_pieces;
    for (int idx = threadIdx.x; idx < 4 * npc; idx += kWgThreads) {
      const int w = idx / npc, i = idx % npc;
      const int64_t r0 = int64_t(blockIdx.x) * kRows + w * 16;
      float4 v = make_float4(1.f, 1.f, 1.f, 1.f);  // rows past n: their zero sums stay zero
      if (r0 < p.n) {
        const uint8_t* srow = p.scale + (r0 / p.block_rows) * p.scale_cols;
        const int blk0 = int(pc0 + i) * kBlocks;
        v.x = e8m0_to_f32(__ldg(srow + (blk0 + 0) / p.blocks_per_scale));
        v.y = e8m0_to_f32(__ldg(srow + (blk0 + 1) / p.blocks_per_scale));
        v.z = e8m0_to_f32(__ldg(srow + (blk0 + 2) / p.blocks_per_scale));
        v.w = e8m0_to_f32(__ldg(srow + (blk0 + 3) / p.blocks_per_scale));
      }
      reinterpret_cast<float4*>(sws)[w * p.max_pieces + i] = v;
    }

    pdl_entry();
#pragma unroll
    for (int s = 0; s < C::kStages - 1; ++s) {
      if (s < nst) load_acts(cp, base + s * C::kStageBytes, pc0 + s * C::kPieces, pc1);
      cp_async_commit();  // empty groups keep the wait count uniform
    }
    for (int idx = threadIdx.x; idx < N * npc; idx += kWgThreads) {
      const int tok = idx / npc, i = idx % npc;
      const uint8_t* xrow = p.xq + min(tok, p.m - 1) * p.ldq + p.k;
      const uint32_t codes = __ldg(reinterpret_cast<const uint32_t*>(xrow) + pc0 + i);
      reinterpret_cast<float4*>(sxs)[tok * p.max_pieces + i] =
          make_float4(e8m0_to_f32(uint8_t(codes)), e8m0_to_f32(uint8_t(codes >> 8)),
                      e8m0_to_f32(uint8_t(codes >> 16)), e8m0_to_f32(uint8_t(codes >> 24)));
    }

    float acc[N / 2];
#pragma unroll
    for (int i = 0; i < N / 2; ++i) acc[i] = 0.f;
    const uint64_t da0 = tma::desc_sw128(base);
    const uint64_t db0 = smem_desc(base + kWPiece, C::kXPlane, 128);

    for (int st = 0; st < nst; ++st) {
      cp_async_wait<C::kStages - 2>();  // this thread's activation copies of stage st landed
      asm volatile("fence.proxy.async.shared::cta;" ::: "memory");  // visible to the tensor cores
      tma::mbar_wait(bar(st % C::kStages), uint32_t(st / C::kStages) & 1);  // its weights landed
      __syncthreads();  // everyone's copies landed; stage st - 1's slot is no longer read
      const int next = st + C::kStages - 1;
      if (next < nst) {
        const uint32_t slot = base + (next % C::kStages) * C::kStageBytes;
        load_weights(wmap, slot, bar(next % C::kStages), pc0 + next * C::kPieces, pc1);
        load_acts(cp, slot, pc0 + next * C::kPieces, pc1);
      }
      cp_async_commit();

      const uint32_t slot_off = (st % C::kStages) * C::kStageBytes;
      const int i0 = st * C::kPieces, pieces = min(C::kPieces, npc - i0);
      auto da = [&](int q) { return da0 + ((slot_off + q * C::kPieceBytes) >> 4); };
      auto db = [&](int q) { return db0 + ((slot_off + q * C::kPieceBytes) >> 4); };
      if constexpr (C::kWholePiece) {
        // The piece count as a compile-time constant: with a runtime count (a split's last
        // stage may be short) the unrolled loop had early exits and ptxas serialised the wgmmas
        // (C7518, "WG.DP in divergent path").
        static_assert(C::kPieces == 3, "whole-piece stages dispatch on 1..3 pieces");
        if (pieces == 3) {
          whole_stage<3>(da(0), db(0), sws, sxs, p.max_pieces, i0, acc);
        } else if (pieces == 2) {
          whole_stage<2>(da(0), db(0), sws, sxs, p.max_pieces, i0, acc);
        } else {
          whole_stage<1>(da(0), db(0), sws, sxs, p.max_pieces, i0, acc);
        }
      } else {
#pragma unroll
        for (int q = 0; q < C::kPieces; ++q) {
          if (q >= pieces) break;  // uniform
#pragma unroll
          for (int b0 = 0; b0 < kBlocks; b0 += C::kBatch) {
            float d[C::kBatch][N / 2];
            issue(d, da(q), db(q), b0);
            tma::wgmma_wait<0>();
#pragma unroll
            for (int bb = 0; bb < C::kBatch; ++bb) fence_regs(d[bb]);
            promote(d, b0, sws, sxs, p.max_pieces, i0 + q, acc);
          }
        }
      }
    }
    cp_async_wait<0>();

    // acc[4c + q]: the m16n8 C fragment of token chunk c (rows g, g + 8 of this warp).
    float tiles[1][N / 8][4];
#pragma unroll
    for (int c = 0; c < N / 8; ++c)
#pragma unroll
      for (int q = 0; q < 4; ++q) tiles[0][c][q] = acc[4 * c + q];
    float* out = p.splits == 1 ? p.y : p.ws + int64_t(split) * p.m * p.n;
    const int64_t ld = p.splits == 1 ? p.ldy : p.n;
    store_mma_tiles<1, N / 8>(tiles, out, ld, p.splits == 1 && p.accumulate, row0, p.n, p.m);
  }
};

template <int N>
__global__ void __launch_bounds__(kWgThreads, Cfg<N>::kMinCtas)
    a8_wgmma_kernel(const Params p, const __grid_constant__ CUtensorMap wmap) {
  // pdl_entry() inside run(), after the weights' first stages are requested.
  extern __shared__ __align__(16) uint8_t smem[];
  Kernel<N>::run(p, &wmap, smem);
}

template <int N>
cudaError_t launch(const Params& p, const CUtensorMap& wmap, dim3 grid, cudaStream_t stream) {
  // Raised once per instance (thread-safe static initialisation); no stream work, so it is
  // also fine while a graph is being captured.
  static const cudaError_t attr = cudaFuncSetAttribute(
      a8_wgmma_kernel<N>, cudaFuncAttributeMaxDynamicSharedMemorySize, Cfg<N>::kMaxSmem);
  if (attr != cudaSuccess) return attr;
  const int smem = kHeader + kSwizzleAtom + Cfg<N>::kSmem + Cfg<N>::scale_bytes(p.max_pieces);
  a8_wgmma_kernel<N><<<grid, kWgThreads, smem, stream>>>(p, wmap);
  return launch_status();
}

// The weights [n rows, k bytes] as a TMA tensor: 64-row x 128-byte boxes, 128-byte swizzle, rows
// past n read as zeros. Encoded on the host per launch (no device work; graph capture keeps the
// map by value as a kernel parameter).
cudaError_t weight_map(const DecodeGemvA8& g, CUtensorMap* map) {
  return tma::byte_matrix_map(map, g.w.data, g.k, g.n, kPieceCols, kRows,
                              CU_TENSOR_MAP_SWIZZLE_128B);
}

}  // namespace

int64_t decode_gemv_a8_wgmma_splits(int64_t n, int64_t pieces) {
  return split_k_count((n + kRows - 1) / kRows, pieces, int64_t(kCtasPerSm) * 132);
}

cudaError_t decode_gemv_a8_wgmma_launch(const DecodeGemvA8& g, int64_t splits, float* workspace,
                                        cudaStream_t stream) {
  Params p{};
  p.xq = g.xq, p.ldq = g.ldq;
  p.w = static_cast<const uint8_t*>(g.w.data), p.scale = g.w.scale;
  p.scale_cols = g.w.scale_cols();
  p.block_rows = int(g.w.block_rows), p.blocks_per_scale = int(g.w.block_cols / 32);
  p.y = g.y, p.ldy = g.ldy, p.ws = workspace;
  p.m = int(g.m), p.n = int(g.n), p.k = g.k;
  p.splits = int(splits), p.pieces = int(g.k / kPieceCols);
  p.max_pieces = int((p.pieces + splits - 1) / splits);
  p.accumulate = g.accumulate;
  CUtensorMap wmap;
  if (const cudaError_t e = weight_map(g, &wmap); e != cudaSuccess) return e;
  const dim3 grid(unsigned((g.n + kRows - 1) / kRows), unsigned(splits));
  if (g.m <= 8) return launch<8>(p, wmap, grid, stream);
  if (g.m <= 16) return launch<16>(p, wmap, grid, stream);
  if (g.m <= 32) return launch<32>(p, wmap, grid, stream);
  return launch<64>(p, wmap, grid, stream);
}

}  // namespace dsv41rt::kernels::cuda
