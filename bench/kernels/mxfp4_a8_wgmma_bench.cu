// Measure-first experiment for issue 18's next MoE step (docs/design/gpu-decode.md, "Plan: routed
// experts on the FP8 tensor cores"): MXFP4 expert matrices times FP8 activations on Hopper's FP8
// tensor cores, with the A8 numerics (spec §5.2: E4M3 activations in 1x32 blocks with UE8M0
// scales; E2M1 weights with their UE8M0 per-32 scales, which are exact in E4M3; each 32-column
// block's tensor-core sum promoted to FP32 with sw * sx). Not yet a library kernel: this file
// holds the kernel, its CPU check and its timing, so the design is decided with numbers first.
//
// Kernel design (one warpgroup = 64 rows of one matrix per CTA, tokens in N, split-K over pieces):
//   - Weights: 64-row x 64-byte TMA boxes of the packed E2M1 bytes (128 columns, 4 scale blocks),
//     64-byte swizzle, into a ring of stages on mbarriers. They are NOT expanded in shared memory:
//     each thread reads its own fragment (rows g and g + 8 of its warp, 4 bytes = 8 columns per
//     block and row; the 64-byte swizzle makes the 32 lanes' reads hit 32 banks), expands it to
//     E4M3 in registers (prmt table lookup on the magnitudes, sign bits moved with a second prmt:
//     9 instructions per 8 values) and passes it as wgmma's register A operand. So the stored
//     bytes travel HBM -> shared memory -> registers once.
//   - A thread's 8 columns of a block are 8t .. 8t + 7, which the register fragment places at
//     k slots 4t .. 4t + 3 and 16 + 4t .. 16 + 4t + 3: the activations are stored with the 4-byte
//     units of every 32-column block in the order 0, 2, 4, 6, 1, 3, 5, 7 (a permutation inside a
//     scale block: the block sum is the same set of products). The MoE prep kernel can write them
//     so at no cost; here the host does.
//   - Activations: 16-byte cp.async into K-major planes, as decode_gemv_a8_wgmma.cu.
//   - Scales: the CTA's weight scale codes (a 4-code word per row and piece) and activation
//     scales (FP32) are put in shared memory once at the start.
//
// The check: every output of 2 matrices per configuration against the exact FP64 evaluation with
// decode_gemv_a8's bound (tests/cpp/test_cuda_decode_gemv_a8.cc: eps_tc = 2^-10 per block sum,
// plus the FP32 promotion and split reduce). The timing: kCalls calls captured in one graph, each
// with its own touched experts (random, fixed seed) over kCopies copies of all weights (> 1 GB:
// L2 holds 50 MB), replays timed with events, median of 7; bytes = the touched matrices' codes +
// scales. Printed next to the device-to-device copy bandwidth measured in the same run.
#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "bench_util.cuh"
#include "core/dtype.h"
#include "kernels/cuda/tma.cuh"

namespace tma = dsv41rt::kernels::cuda::tma;
using dsv41rt::e8m0_to_f32;
using dsv41rt::fp4_e2m1_to_f32;
using dsv41rt::fp8_e4m3_to_f32;

namespace {

constexpr int kThreadsWg = 128;
constexpr int kRows = 64;
constexpr int kBlocks = 4;        // 32-column scale blocks per piece
constexpr int kPieceCols = 128;   // columns per piece
constexpr int kWPiece = 64 * 64;  // packed weight bytes per piece (one TMA box)
constexpr int kHeader = 64;
constexpr int kAlign = 1024;

template <int N>
struct Cfg {
  static constexpr int kXPlane = N * 16;
  static constexpr int kXPiece = 8 * kXPlane;  // 128 columns x N tokens
#ifndef MXFP4_PIECES  // pieces per stage for N <= 16 (an experiment's switch)
#define MXFP4_PIECES 4
#endif
  static constexpr int kPieces = N <= 16 ? MXFP4_PIECES : 2;
  static constexpr int kStages = N <= 8 ? 4 : 3;                     // 2 CTAs per SM up to N 16
  static constexpr int kStageBytes = kPieces * (kWPiece + kXPiece);  // a multiple of 1024
  static constexpr int kSmem = kStages * kStageBytes;
  static constexpr bool kWholePiece = N <= 16;
  static constexpr int kBatch = N <= 16 ? 4 : (N == 32 ? 2 : 1);
  static constexpr int kMinCtas = N <= 32 ? 2 : 1;
  static constexpr int scale_bytes(int max_pieces) { return (4 * kRows + 16 * N) * max_pieces; }
};

struct Work {
  int32_t row0;    // first row of the matrix in its stacked tensor
  int32_t map;     // which tensor (0 / 1)
  int32_t m;       // tokens
  int32_t x_row0;  // first activation row
};

struct Params {
  const uint8_t* xq;  // packed rows: k permuted E4M3 codes, then k / 32 UE8M0 codes
  int64_t ldq;
  const uint8_t* scale[2];  // [rows, k / 32] UE8M0 per tensor
  const Work* work;
  float* out;  // [mats][splits][N][rows]
  int rows;
  int k;
  int splits, pieces, max_pieces;
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
__device__ __forceinline__ uint64_t smem_desc(uint32_t addr, uint32_t lbo, uint32_t sbo) {
  return uint64_t((addr & 0x3FFFFu) >> 4) | (uint64_t(lbo >> 4) << 16) | (uint64_t(sbo >> 4) << 32);
}
__device__ __forceinline__ uint32_t lds32(uint32_t addr) {
  uint32_t v;
  asm volatile("ld.shared.b32 %0, [%1];" : "=r"(v) : "r"(addr));
  return v;
}

// 8 E2M1 codes (nibble i = column i) -> 8 E4M3 codes: lo = columns 0..3, hi = 4..7. Exact: every
// E2M1 value (0, 0.5, 1, 1.5, 2, 3, 4, 6, signed) is an E4M3 normal or zero.
__device__ __forceinline__ void e2m1x8_to_e4m3(uint32_t w, uint32_t& lo, uint32_t& hi) {
  constexpr uint32_t kTab0 = 0x3C383000u;  // magnitudes 0..3: 0, 0.5, 1, 1.5
  constexpr uint32_t kTab1 = 0x4C484440u;  // magnitudes 4..7: 2, 3, 4, 6
  const uint32_t mag = w & 0x77777777u;
  const uint32_t e = w << 4;  // the sign bit of even nibbles at bit 7 of their byte
  lo = __byte_perm(kTab0, kTab1, mag) | (__byte_perm(e, w, 0x5140) & 0x80808080u);
  hi = __byte_perm(kTab0, kTab1, mag >> 16) | (__byte_perm(e, w, 0x7362) & 0x80808080u);
}

template <int N>
__device__ __forceinline__ void wgmma_rs(float (&d)[N / 2], const uint32_t (&a)[4], uint64_t b);

#define WGMMA_RS_HEAD(n) \
  "{.reg .pred p; setp.ne.b32 p, 0, 0; wgmma.mma_async.sync.aligned.m64n" #n "k32.f32.e4m3.e4m3 "
template <>
__device__ __forceinline__ void wgmma_rs<8>(float (&d)[4], const uint32_t (&a)[4], uint64_t b) {
  asm volatile(WGMMA_RS_HEAD(8) "{%0, %1, %2, %3}, {%4, %5, %6, %7}, %8, p, 1, 1;}"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b));
}
template <>
__device__ __forceinline__ void wgmma_rs<16>(float (&d)[8], const uint32_t (&a)[4], uint64_t b) {
  asm volatile(
      WGMMA_RS_HEAD(16) "{%0, %1, %2, %3, %4, %5, %6, %7}, {%8, %9, %10, %11}, %12, p, 1, 1;}"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
        "+f"(d[7])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b));
}
template <>
__device__ __forceinline__ void wgmma_rs<64>(float (&d)[32], const uint32_t (&a)[4], uint64_t b) {
  asm volatile(WGMMA_RS_HEAD(64)
               "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, "
               "%18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
               "{%32, %33, %34, %35}, %36, p, 1, 1;}"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
                 "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]),
                 "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]),
                 "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),
                 "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]),
                 "+f"(d[31])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b));
}

template <int R>
__device__ __forceinline__ void fence_regs(float (&d)[R]) {
#pragma unroll
  for (int i = 0; i < R; ++i) asm volatile("" : "+f"(d[i])::"memory");
}
__device__ __forceinline__ void fence_regs_u(uint32_t (&a)[kBlocks][4]) {
#pragma unroll
  for (int b = 0; b < kBlocks; ++b)
#pragma unroll
    for (int i = 0; i < 4; ++i) asm volatile("" : "+r"(a[b][i])::"memory");
}

template <int N>
struct Kernel {
  using C = Cfg<N>;
  static constexpr int kXChunks = (N * 8 + kThreadsWg - 1) / kThreadsWg;

  // The stage whose first piece is pc into the slot at `slot`: weights by TMA (thread 0),
  // activations by cp.async (tokens past m zero-filled).
  __device__ static void load_stage(const CUtensorMap* map, const Params& p, const Work& wk,
                                    uint32_t slot, uint32_t bar, int pc, int pc1) {
    const int pieces = min(C::kPieces, pc1 - pc);
    if (threadIdx.x == 0) {
      tma::mbar_expect_tx(bar, uint32_t(pieces * kWPiece));
      for (int q = 0; q < pieces; ++q) {
        tma::load_2d(slot + q * kWPiece, map, (pc + q) * (kPieceCols / 2),
                     wk.row0 + int(blockIdx.x) * kRows, bar);
      }
    }
    const int tid = threadIdx.x, c8 = tid % 8;
#pragma unroll
    for (int q = 0; q < C::kPieces; ++q) {
      if (q >= pieces) break;
      const uint32_t dst = slot + C::kPieces * kWPiece + q * C::kXPiece;
#pragma unroll
      for (int i = 0; i < kXChunks; ++i) {
        const int c = tid + i * kThreadsWg, tok = c / 8;
        if (c < N * 8) {
          const bool ok = tok < wk.m;
          const uint8_t* src =
              p.xq + int64_t(wk.x_row0 + (ok ? tok : 0)) * p.ldq + (pc + q) * kPieceCols + c8 * 16;
          cp_async16(dst + c8 * C::kXPlane + tok * 16, src, ok);
        }
      }
    }
  }

  // Piece q of the slot: this thread's fragments of the 4 blocks, expanded to E4M3.
  __device__ static void expand(uint32_t wbase, uint32_t (&a)[kBlocks][4]) {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const int r0 = warp * 16 + g, r1 = r0 + 8;
#pragma unroll
    for (int b = 0; b < kBlocks; ++b) {
      // 64-byte swizzle: 16-byte chunk c of row r sits at chunk c ^ ((r >> 1) & 3).
      const uint32_t w0 = lds32(wbase + r0 * 64 + ((b ^ ((r0 >> 1) & 3)) << 4) + 4 * t);
      const uint32_t w1 = lds32(wbase + r1 * 64 + ((b ^ ((r1 >> 1) & 3)) << 4) + 4 * t);
      e2m1x8_to_e4m3(w0, a[b][0], a[b][2]);
      e2m1x8_to_e4m3(w1, a[b][1], a[b][3]);
    }
  }

  __device__ static void issue(float (&d)[C::kBatch][N / 2], const uint32_t (&a)[kBlocks][4],
                               uint64_t db, int b0) {
#pragma unroll
    for (int bb = 0; bb < C::kBatch; ++bb) {
#pragma unroll
      for (int r = 0; r < N / 2; ++r) d[bb][r] = 0.f;
      fence_regs(d[bb]);
    }
    tma::wgmma_fence();
#pragma unroll
    for (int bb = 0; bb < C::kBatch; ++bb) {
      wgmma_rs<N>(d[bb], a[b0 + bb], db + ((2 * (b0 + bb) * C::kXPlane) >> 4));
    }
    tma::wgmma_commit();
  }

  // acc += P_b * (sw_row * sx_tok) for blocks b0 .. b0 + kBatch - 1 of piece i, in block order.
  __device__ static void promote(const float (&d)[C::kBatch][N / 2], int b0, const uint32_t* swc,
                                 const float* sxs, int max_pieces, int i, float (&acc)[N / 2]) {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const uint32_t c0 = swc[(warp * 16 + g) * max_pieces + i];
    const uint32_t c1 = swc[(warp * 16 + g + 8) * max_pieces + i];
    float sw0[kBlocks], sw1[kBlocks];
#pragma unroll
    for (int b = 0; b < kBlocks; ++b) {
      sw0[b] = e8m0_to_f32(uint8_t(c0 >> (8 * b)));
      sw1[b] = e8m0_to_f32(uint8_t(c1 >> (8 * b)));
    }
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
          const float s0 = sw0[b] * sxv[b];  // powers of two: exact
          const float s1 = sw1[b] * sxv[b];
          acc[4 * c + j] = fmaf(d[bb][4 * c + j], s0, acc[4 * c + j]);
          acc[4 * c + 2 + j] = fmaf(d[bb][4 * c + 2 + j], s1, acc[4 * c + 2 + j]);
        }
      }
    }
  }

  // A stage's pieces in shared memory: weights at wslot + q * kWPiece, activation descriptor
  // db0 + q * kXPiece / 16.
  struct Stage {
    uint32_t wslot;
    uint64_t db0;
    const uint32_t* swc;
    const float* sxs;
    int max_pieces, i0;
  };

  // The P pieces of a stage, N <= 16: piece q + 1 is expanded and its wgmmas issued while piece
  // q's run, then q is promoted. P is a compile-time count (whole_stage_of picks it): with a
  // runtime count the unrolled loop has early exits, the compiler merges the promotes of both
  // accumulator sets, and ptxas then serialises every wgmma of the kernel (C7514 / C7511).
  template <int P>
  __device__ static void whole_stage(const Stage& sg, float (&acc)[N / 2]) {
    uint32_t a[2][kBlocks][4];
    float d[2][C::kBatch][N / 2];
    expand(sg.wslot, a[0]);
    issue(d[0], a[0], sg.db0, 0);
#pragma unroll
    for (int q = 0; q < P; ++q) {
      if (q + 1 < P) {
        expand(sg.wslot + (q + 1) * kWPiece, a[(q + 1) % 2]);
        issue(d[(q + 1) % 2], a[(q + 1) % 2], sg.db0 + (((q + 1) * C::kXPiece) >> 4), 0);
        tma::wgmma_wait<1>();
      } else {
        tma::wgmma_wait<0>();
      }
#pragma unroll
      for (int bb = 0; bb < C::kBatch; ++bb) fence_regs(d[q % 2][bb]);
      fence_regs_u(a[q % 2]);
      promote(d[q % 2], 0, sg.swc, sg.sxs, sg.max_pieces, sg.i0 + q, acc);
    }
  }
  template <int P>
  __device__ static void whole_stage_of(int pieces, const Stage& sg, float (&acc)[N / 2]) {
    if (pieces == P) {
      whole_stage<P>(sg, acc);
    } else if constexpr (P > 1) {
      whole_stage_of<P - 1>(pieces, sg, acc);
    }
  }

  __device__ static void run(const Params& p, const CUtensorMap* map, uint8_t* smem_raw) {
    const Work wk = p.work[blockIdx.z];
    const int split = blockIdx.y;
    const int pc0 = split * p.pieces / p.splits, pc1 = (split + 1) * p.pieces / p.splits;
    const int npc = pc1 - pc0, nst = (npc + C::kPieces - 1) / C::kPieces;
    const uint32_t raw = uint32_t(__cvta_generic_to_shared(smem_raw));
    const uint32_t base = (raw + kHeader + kAlign - 1) & ~uint32_t(kAlign - 1);
    uint8_t* smem = smem_raw + (base - raw);
    auto bar = [&](int s) { return raw + 8 * s; };
    if (threadIdx.x == 0) {
      for (int s = 0; s < C::kStages; ++s) tma::mbar_init(bar(s), 1);
      tma::mbar_init_fence();
    }
    __syncthreads();
#pragma unroll
    for (int s = 0; s < C::kStages - 1; ++s) {
      if (s < nst)
        load_stage(map, p, wk, base + s * C::kStageBytes, bar(s), pc0 + s * C::kPieces, pc1);
      cp_async_commit();
    }
    // Scales: swc[row][i] = the row's 4 codes of piece i; sxs[tok][i] = the token's 4 FP32 scales.
    uint32_t* swc = reinterpret_cast<uint32_t*>(smem + C::kSmem);
    float* sxs = reinterpret_cast<float*>(swc + kRows * p.max_pieces);
    const uint8_t* scale = wk.map ? p.scale[1] : p.scale[0];  // no local-memory indexing
    const int scols = p.k / 32;
    for (int idx = threadIdx.x; idx < kRows * npc; idx += kThreadsWg) {
      const int r = idx / npc, i = idx % npc;
      const int64_t row = int64_t(wk.row0) + int64_t(blockIdx.x) * kRows + r;
      swc[r * p.max_pieces + i] =
          __ldg(reinterpret_cast<const uint32_t*>(scale + row * scols) + pc0 + i);
    }
    for (int idx = threadIdx.x; idx < N * npc; idx += kThreadsWg) {
      const int tok = idx / npc, i = idx % npc;
      const uint8_t* xrow = p.xq + int64_t(wk.x_row0 + min(tok, wk.m - 1)) * p.ldq + p.k;
      const uint32_t codes = __ldg(reinterpret_cast<const uint32_t*>(xrow) + pc0 + i);
      reinterpret_cast<float4*>(sxs)[tok * p.max_pieces + i] =
          make_float4(e8m0_to_f32(uint8_t(codes)), e8m0_to_f32(uint8_t(codes >> 8)),
                      e8m0_to_f32(uint8_t(codes >> 16)), e8m0_to_f32(uint8_t(codes >> 24)));
    }

    float acc[N / 2];
#pragma unroll
    for (int i = 0; i < N / 2; ++i) acc[i] = 0.f;
    const uint64_t db0 = smem_desc(base, C::kXPlane, 128);

    for (int st = 0; st < nst; ++st) {
      cp_async_wait<C::kStages - 2>();
      asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
      tma::mbar_wait(bar(st % C::kStages), uint32_t(st / C::kStages) & 1);
      __syncthreads();
      const int next = st + C::kStages - 1;
      if (next < nst) {
        load_stage(map, p, wk, base + (next % C::kStages) * C::kStageBytes, bar(next % C::kStages),
                   pc0 + next * C::kPieces, pc1);
      }
      cp_async_commit();
      const uint32_t slot = base + (st % C::kStages) * C::kStageBytes;
      const int i0 = st * C::kPieces, pieces = min(C::kPieces, npc - i0);
      auto wq = [&](int q) { return slot + q * kWPiece; };
      auto db = [&](int q) {
        return db0 + ((slot - base + C::kPieces * kWPiece + q * C::kXPiece) >> 4);
      };
      if constexpr (C::kWholePiece) {
        const Stage sg{slot, db(0), swc, sxs, p.max_pieces, i0};
        whole_stage_of<C::kPieces>(pieces, sg, acc);
      } else {
#pragma unroll
        for (int q = 0; q < C::kPieces; ++q) {
          if (q >= pieces) break;
          uint32_t a[kBlocks][4];
          expand(wq(q), a);
#pragma unroll
          for (int b0 = 0; b0 < kBlocks; b0 += C::kBatch) {
            float d[C::kBatch][N / 2];
            issue(d, a, db(q), b0);
            tma::wgmma_wait<0>();
#pragma unroll
            for (int bb = 0; bb < C::kBatch; ++bb) fence_regs(d[bb]);
            promote(d, b0, swc, sxs, p.max_pieces, i0 + q, acc);
          }
          fence_regs_u(a);
        }
      }
    }
    cp_async_wait<0>();

    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    float* out = p.out + (int64_t(blockIdx.z) * p.splits + split) * N * p.rows;
#pragma unroll
    for (int c = 0; c < N / 8; ++c) {
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const int r = int(blockIdx.x) * kRows + warp * 16 + g + (q >= 2 ? 8 : 0);
        const int tok = c * 8 + 2 * t + (q & 1);
        if (tok < wk.m) out[int64_t(tok) * p.rows + r] = acc[4 * c + q];
      }
    }
  }
};

template <int N>
__global__ void __launch_bounds__(kThreadsWg, Cfg<N>::kMinCtas)
    mxfp4_a8_kernel(const Params p, const __grid_constant__ CUtensorMap map0,
                    const __grid_constant__ CUtensorMap map1) {
  extern __shared__ __align__(16) uint8_t smem[];
  const Work wk = p.work[blockIdx.z];
  Kernel<N>::run(p, wk.map ? &map1 : &map0, smem);
}

// y[mat][tok][r] = sum over splits, in split order.
__global__ void reduce_splits(const float* ws, float* y, int splits, int64_t per_mat) {
  const int64_t mat = blockIdx.y;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < per_mat;
       i += int64_t(gridDim.x) * blockDim.x) {
    float s = 0.f;
    for (int q = 0; q < splits; ++q) s += ws[(mat * splits + q) * per_mat + i];
    y[mat * per_mat + i] = s;
  }
}

template <int N>
void launch(const Params& p, const CUtensorMap& m0, const CUtensorMap& m1, int mats,
            cudaStream_t stream) {
  const int smem = kHeader + kAlign + Cfg<N>::kSmem + Cfg<N>::scale_bytes(p.max_pieces);
  static bool once = [] {
    CHECK(cudaFuncSetAttribute(mxfp4_a8_kernel<N>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               200 * 1024));
    return true;
  }();
  (void)once;
  const dim3 grid(unsigned(p.rows / kRows), unsigned(p.splits), unsigned(mats));
  mxfp4_a8_kernel<N><<<grid, kThreadsWg, smem, stream>>>(p, m0, m1);
  CHECK(cudaGetLastError());
}

// ---- host side ------------------------------------------------------------------------------

// Packed activation rows: k E4M3 codes then k / 32 scale codes in [120, 126].
__global__ void fill_act_rows(uint8_t* p, int64_t rows, int k, int64_t ldq, uint32_t seed) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < rows * ldq;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t c = i % ldq;
    uint8_t b = uint8_t(hash(uint64_t(i), seed));
    if (c < k) {
      if ((b & 0x7F) == 0x7F) b ^= 1;
    } else {
      b = uint8_t(120 + b % 7);
    }
    p[i] = b;
  }
}

uint8_t* device_bytes(int64_t n, uint32_t seed, int kind, int lo = 0) {
  uint8_t* p = nullptr;
  CHECK(cudaMalloc(&p, size_t(n)));
  fill_bytes<<<1024, 256>>>(p, n, seed, kind, lo);
  CHECK(cudaGetLastError());
  return p;
}

// Position of column c in a permuted activation row (4-byte units 0, 2, 4, 6, 1, 3, 5, 7).
int64_t perm_pos(int64_t c) {
  const int64_t u = (c % 32) / 4, j = c % 4;
  const int64_t nu = (u % 2 == 0) ? u / 2 : 4 + u / 2;
  return c - c % 32 + nu * 4 + j;
}

double gamma_n(int n) {
  const double u = std::ldexp(1.0, -24);
  return n * u / (1 - n * u);
}

float median(std::vector<float> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

double copy_bandwidth(int64_t bytes) {
  void *a = nullptr, *b = nullptr;
  CHECK(cudaMalloc(&a, size_t(bytes)));
  CHECK(cudaMalloc(&b, size_t(bytes)));
  CHECK(cudaMemset(a, 1, size_t(bytes)));
  cudaEvent_t e0, e1;
  CHECK(cudaEventCreate(&e0));
  CHECK(cudaEventCreate(&e1));
  CHECK(cudaMemcpyAsync(b, a, size_t(bytes), cudaMemcpyDeviceToDevice));
  std::vector<float> ms;
  for (int r = 0; r < 5; ++r) {
    CHECK(cudaEventRecord(e0));
    CHECK(cudaMemcpyAsync(b, a, size_t(bytes), cudaMemcpyDeviceToDevice));
    CHECK(cudaEventRecord(e1));
    CHECK(cudaEventSynchronize(e1));
    float t = 0;
    CHECK(cudaEventElapsedTime(&t, e0, e1));
    ms.push_back(t);
  }
  CHECK(cudaFree(a));
  CHECK(cudaFree(b));
  return 2.0 * double(bytes) / (double(median(ms)) * 1e-3);
}

constexpr int64_t kE = 32, kH = 5120, kI = 2304;
constexpr int kCalls = 10, kCopies = 2;

struct Tensor {  // one stacked MXFP4 tensor [E * rows, k]
  uint8_t* codes;
  uint8_t* scales;
  int64_t rows, k;
};

struct Shape {
  const char* name;
  int64_t rows, k;  // per matrix
  bool pair;        // gate + up: two tensors per expert
};

template <int N>
void run_config(const Shape& sh, const std::vector<std::vector<Tensor>>& copies, int experts, int m,
                int splits, double copy_bw, std::mt19937& rng, bool check) {
  const int mats = experts * (sh.pair ? 2 : 1);
  const int64_t ldq = (sh.k + sh.k / 32 + 15) / 16 * 16;  // 16-byte aligned rows
  const int pieces = int(sh.k / kPieceCols);
  if (splits > pieces) return;
  const int max_pieces = (pieces + splits - 1) / splits;
  // Activations: kCalls x experts x N rows.
  uint8_t* xq = nullptr;
  const int64_t xrows = int64_t(kCalls) * experts * N;
  CHECK(cudaMalloc(&xq, size_t(xrows * ldq)));
  fill_act_rows<<<1024, 256>>>(xq, xrows, int(sh.k), ldq, 77u + uint32_t(N));
  CHECK(cudaGetLastError());
  float *ws = nullptr, *y = nullptr;
  const int64_t per_mat = int64_t(N) * sh.rows;
  CHECK(cudaMalloc(&ws, size_t(kCalls) * mats * splits * per_mat * 4));
  CHECK(cudaMalloc(&y, size_t(kCalls) * mats * per_mat * 4));
  Work* work = nullptr;
  CHECK(cudaMalloc(&work, size_t(kCalls) * mats * sizeof(Work)));
  std::vector<Work> host_work(size_t(kCalls) * mats);
  std::vector<std::vector<int>> touched(kCalls);
  for (int c = 0; c < kCalls; ++c) {
    std::vector<int> perm(kE);
    for (int e = 0; e < kE; ++e) perm[size_t(e)] = e;
    std::shuffle(perm.begin(), perm.end(), rng);
    perm.resize(size_t(experts));
    std::sort(perm.begin(), perm.end());
    touched[size_t(c)] = perm;
    for (int j = 0; j < experts; ++j) {
      for (int h = 0; h < (sh.pair ? 2 : 1); ++h) {
        Work& w = host_work[size_t(c * mats + j * (sh.pair ? 2 : 1) + h)];
        w.row0 = int32_t(perm[size_t(j)] * sh.rows), w.map = h, w.m = m;
        w.x_row0 = int32_t((c * experts + j) * N);
      }
    }
  }
  CHECK(
      cudaMemcpy(work, host_work.data(), host_work.size() * sizeof(Work), cudaMemcpyHostToDevice));

  cudaStream_t stream;
  CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  std::vector<CUtensorMap> maps(size_t(kCopies) * 2);
  for (int cp = 0; cp < kCopies; ++cp) {
    for (int h = 0; h < 2; ++h) {
      const Tensor& t = copies[size_t(cp)][size_t(sh.pair ? h : 2)];
      CHECK(tma::byte_matrix_map(&maps[size_t(cp * 2 + h)], t.codes, t.k / 2, t.rows, 64, 64,
                                 CU_TENSOR_MAP_SWIZZLE_64B));
    }
  }
  auto params = [&](int c) {
    const std::vector<Tensor>& cp = copies[size_t(c % kCopies)];
    Params p{};
    p.xq = xq, p.ldq = ldq;
    p.scale[0] = cp[sh.pair ? 0 : 2].scales, p.scale[1] = cp[sh.pair ? 1 : 2].scales;
    p.work = work + c * mats;
    p.out =
        splits == 1 ? y + int64_t(c) * mats * per_mat : ws + int64_t(c) * mats * splits * per_mat;
    p.rows = int(sh.rows), p.k = int(sh.k);
    p.splits = splits, p.pieces = pieces, p.max_pieces = max_pieces;
    return p;
  };
  auto call = [&](int c) {
    const Params p = params(c);
    launch<N>(p, maps[size_t((c % kCopies) * 2)], maps[size_t((c % kCopies) * 2 + 1)], mats,
              stream);
    if (splits > 1) {
      reduce_splits<<<dim3(unsigned((per_mat + 255) / 256), unsigned(mats)), 256, 0, stream>>>(
          p.out, y + int64_t(c) * mats * per_mat, splits, per_mat);
      CHECK(cudaGetLastError());
    }
  };
  // Poison y, run every call once eagerly, check call 0.
  CHECK(cudaMemset(y, 0xFF, size_t(kCalls) * mats * per_mat * 4));
  for (int c = 0; c < kCalls; ++c) call(c);
  CHECK(cudaStreamSynchronize(stream));
  double worst = 0;
  int64_t bad = 0, checked = 0;
  if (check) {
    const std::vector<Tensor>& cp = copies[0];
    std::vector<uint8_t> hx(size_t(int64_t(experts) * N * ldq));
    CHECK(cudaMemcpy(hx.data(), xq, hx.size(), cudaMemcpyDeviceToHost));
    std::vector<float> hy(size_t(mats * per_mat));
    CHECK(cudaMemcpy(hy.data(), y, hy.size() * 4, cudaMemcpyDeviceToHost));
    const int nb = int(sh.k / 32);
    for (int mat : {0, mats - 1}) {
      const Work& w = host_work[size_t(mat)];
      const Tensor& t = cp[size_t(sh.pair ? w.map : 2)];
      std::vector<uint8_t> codes(size_t(sh.rows * sh.k / 2)), sc(size_t(sh.rows * nb));
      CHECK(cudaMemcpy(codes.data(), t.codes + int64_t(w.row0) * sh.k / 2, codes.size(),
                       cudaMemcpyDeviceToHost));
      CHECK(cudaMemcpy(sc.data(), t.scales + int64_t(w.row0) * nb, sc.size(),
                       cudaMemcpyDeviceToHost));
      for (int tok = 0; tok < m; ++tok) {
        const uint8_t* xr = hx.data() + int64_t(w.x_row0 + tok) * ldq;
        for (int64_t r = 0; r < sh.rows; ++r) {
          double sum = 0, mag = 0, tc = 0;
          for (int b = 0; b < nb; ++b) {
            double pb = 0, pabs = 0;
            for (int64_t c = b * 32; c < b * 32 + 32; ++c) {
              const uint8_t byte = codes[size_t(r * sh.k / 2 + c / 2)];
              const uint8_t code = (c & 1) ? uint8_t(byte >> 4) : uint8_t(byte & 0xF);
              const double wv = code == 8 ? 0.0 : double(fp4_e2m1_to_f32(code));
              const double pr = double(fp8_e4m3_to_f32(xr[perm_pos(c)])) * wv;
              pb += pr, pabs += std::fabs(pr);
            }
            const double s =
                double(e8m0_to_f32(xr[sh.k + b])) * e8m0_to_f32(sc[size_t(r * nb + b)]);
            sum += pb * s, mag += std::fabs(pb) * s, tc += std::ldexp(1.0, -10) * pabs * s;
          }
          const double got = hy[size_t(mat * per_mat + int64_t(tok) * sh.rows + r)];
          const double fp32_part = 2 * gamma_n(nb + splits + 2) * mag;
          const double err = std::fabs(got - sum);
          ++checked;
          if (!(err <= tc + fp32_part)) ++bad;
          if (tc > 0)
            worst = std::max(worst, std::max(0.0, err - fp32_part) / tc * std::ldexp(1.0, -10));
        }
      }
    }
  }
  // Timing: all calls in one graph.
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  for (int c = 0; c < kCalls; ++c) call(c);
  CHECK(cudaStreamEndCapture(stream, &graph));
  CHECK(cudaGraphInstantiate(&exec, graph, 0));
  CHECK(cudaGraphLaunch(exec, stream));
  cudaEvent_t e0, e1;
  CHECK(cudaEventCreate(&e0));
  CHECK(cudaEventCreate(&e1));
  std::vector<float> ms;
  for (int r = 0; r < 7; ++r) {
    CHECK(cudaEventRecord(e0, stream));
    CHECK(cudaGraphLaunch(exec, stream));
    CHECK(cudaEventRecord(e1, stream));
    CHECK(cudaEventSynchronize(e1));
    float t = 0;
    CHECK(cudaEventElapsedTime(&t, e0, e1));
    ms.push_back(t);
  }
  const double us = double(median(ms)) * 1e3 / kCalls;
  const double bytes = double(mats) * (sh.rows * sh.k / 2 + sh.rows * sh.k / 32);
  const double gbs = bytes / (us * 1e-6) * 1e-9;
  std::printf("| %s | %d | %d | %d | %d | %.1f | %.2f | %.0f | %.1f%% | %s |\n", sh.name, experts,
              m, N, splits, us, bytes * 1e-6, gbs, 100.0 * gbs * 1e9 / copy_bw,
              check ? (bad ? "FAIL" : "ok") : "-");
  if (check) {
    std::printf(
        "<!-- %s experts %d m %d splits %d: %lld outputs checked, %lld over the bound, "
        "largest block-sum error / bound %.3g (of eps_tc 2^-10) -->\n",
        sh.name, experts, m, splits, (long long)checked, (long long)bad, worst * 1024);
  }
  CHECK(cudaGraphExecDestroy(exec));
  CHECK(cudaGraphDestroy(graph));
  CHECK(cudaStreamDestroy(stream));
  CHECK(cudaFree(xq));
  CHECK(cudaFree(ws));
  CHECK(cudaFree(y));
  CHECK(cudaFree(work));
}

Tensor mxfp4(int64_t rows, int64_t k, uint32_t seed) {
  return {device_bytes(rows * k / 2, seed, 0), device_bytes(rows * k / 32, seed + 1, 2, 118), rows,
          k};
}

}  // namespace

int main() {
  cudaDeviceProp prop{};
  CHECK(cudaGetDeviceProperties(&prop, 0));
  const double copy_bw = copy_bandwidth(int64_t(2) << 30);
  std::printf(
      "# MXFP4 x FP8 on wgmma (register A, E2M1 -> E4M3 in registers) on %s\n\n"
      "copy bandwidth (D2D, read + write, median of 5): %.0f GB/s\n\n",
      prop.name, copy_bw * 1e-9);
  // kCopies copies of w1, w3 [E * I, H] and w2 [E * H, I].
  std::vector<std::vector<Tensor>> copies;
  for (int c = 0; c < kCopies; ++c) {
    const uint32_t s = 100u * uint32_t(c + 1);
    copies.push_back(
        {mxfp4(kE * kI, kH, s), mxfp4(kE * kI, kH, s + 10), mxfp4(kE * kH, kI, s + 20)});
  }
  CHECK(cudaDeviceSynchronize());
  std::printf(
      "| matrices | experts | tokens each | N | splits | us / call | MB / call | GB/s | %% of "
      "copy | check |\n|---|---|---|---|---|---|---|---|---|---|\n");
  std::mt19937 rng(1234);
  const Shape gate_up{"gate+up 2304x5120", kI, kH, true};
  const Shape down{"down 5120x2304", kH, kI, false};
  for (int splits : {1, 2, 3})
    run_config<8>(gate_up, copies, 6, 1, splits, copy_bw, rng, splits != 3);
  for (int splits : {1, 2, 3}) run_config<8>(down, copies, 6, 1, splits, copy_bw, rng, splits != 3);
  run_config<8>(gate_up, copies, 24, 2, 1, copy_bw, rng, true);
  run_config<8>(down, copies, 24, 2, 1, copy_bw, rng, false);
  run_config<16>(gate_up, copies, 32, 12, 1, copy_bw, rng, true);
  run_config<16>(down, copies, 32, 12, 1, copy_bw, rng, true);
#ifndef MXFP4_QUICK
  run_config<64>(gate_up, copies, 32, 64, 1, copy_bw, rng, true);
#endif
  return 0;
}
