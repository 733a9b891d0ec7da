// Decode GEMM (contract: decode_gemv.cuh). Design:
//   - swap-AB mma.sync m16n8k16 (BF16 in, FP32 accumulate): 16 weight rows fill the MMA's M slot,
//     8 tokens its N slot; a warp owns 2 row tiles (32 rows) so each activation fragment read
//     from shared memory feeds two MMAs; a CTA of 8 warps owns 256 rows.
//   - K is walked in "pieces" of KP columns (KP * bytes-per-value = 128 bytes of every row). Each
//     thread loads 16 contiguous weight bytes per row per "super-step" (4 MMA k-steps): rows g and
//     g + 8 of each row tile, 2 super-steps per piece: 8 x 16-byte ld.global.nc per piece. The next
//     piece's weights are loaded (register double buffer) while the current one is multiplied.
//   - The MMA's logical k order is a permutation of the physical columns chosen so that each
//     thread's 16 bytes are contiguous; the activations are staged (FP32 -> BF16 RNE) into shared
//     memory in the same permuted order, once per CTA and piece.
//   - Dequant by bit placement (E4M3 -> BF16 = value * 2^-120, E2M1 -> BF16 = value * 2^-126),
//     then one bf16x2 multiply by 2^(scale - 127 + bias) carries the block scale (exact).
//   - Split-K over pieces (S splits, a function of n * batch, k and the format only) so that small
//     matrices still spread over the GPU; partials go to the workspace and a second kernel adds
//     them in split order (deterministic, no atomics).
#include <cuda_bf16.h>

#include <utility>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/decode_gemv.cuh"
#include "kernels/cuda/split_k.cuh"

namespace dsv41rt::kernels::cuda {
namespace {

enum Fmt : int { kBf16 = 0, kFp8 = 1, kFp4 = 2 };

constexpr int kWarps = 8, kBlockThreads = 32 * kWarps;
constexpr int kRT = 2;                  // 16-row tiles per warp
constexpr int kBM = kWarps * kRT * 16;  // rows per CTA
constexpr int kU = 2;                   // super-steps per piece
constexpr int kPad = 4;  // BF16 elements of row padding in shared memory (bank spread for FP8)

template <int F>
struct Traits {
  static constexpr int V = F == kBf16 ? 8 : (F == kFp8 ? 16 : 32);  // values per 16-byte load
  static constexpr int KS = 4 * V;                                  // columns per super-step
  static constexpr int KP = kU * KS;                                // columns per piece
  static constexpr int G = F == kFp4 ? 8 : 4;  // staging group (columns permuted together)
};

int fmt_of(WeightFormat f) {
  return f == WeightFormat::kBF16 ? kBf16 : (f == WeightFormat::kFp8Block ? kFp8 : kFp4);
}

int piece_cols(int fmt) {
  return fmt == kBf16 ? Traits<kBf16>::KP : (fmt == kFp8 ? Traits<kFp8>::KP : Traits<kFp4>::KP);
}

struct Params {
  const float* x;
  int64_t ldx, stride_x;
  const uint8_t* w;
  const uint8_t* scale;
  int64_t w_row_bytes, scale_cols, w_rows_per_batch;
  int block_rows, log2_block_cols;
  float* y;
  int64_t ldy, stride_y;
  float* ws;
  int m, n;
  int64_t k;
  int splits, pieces;
  bool accumulate;
};

__device__ __forceinline__ uint4 ld_stream(const uint8_t* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

__device__ __forceinline__ uint32_t bmul(uint32_t a, uint32_t c) {
  uint32_t d;
  asm("mul.rn.bf16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(c));
  return d;
}

__device__ __forceinline__ void mma(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                    uint32_t a3, uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);  // RNE, lo in the low half
  return *reinterpret_cast<const uint32_t*>(&v);
}

// The bf16x2 multipliers for a UE8M0 scale code e: the decoded value is d * c1 (* c2 when the
// scale is too large for one multiplier; never for real checkpoints). Bias: 120 for E4M3 codes
// placed as BF16 (value * 2^-120), 126 for E2M1 (value * 2^-126).
template <int F>
struct Scale {
  uint32_t e, c1;
  bool two;
  __device__ __forceinline__ void set(uint32_t code) {
    constexpr uint32_t kBias = F == kFp8 ? 120 : 126;
    e = code;
    // BF16 exponent field of 2^(e - 127 + bias) is e + bias; it must stay <= 254, else multiply
    // by 2^127 first and by the rest (or NaN for code 255) second.
    two = e + kBias > 254;
    c1 = ((two ? 254 : e + kBias) << 7) * 0x10001u;
  }
  // Two = false: the warp has no scale needing a second multiply (every real checkpoint), so
  // the common path is one multiply per word with no per-value predicate.
  template <bool Two>
  __device__ __forceinline__ uint32_t apply(uint32_t d) const {
    constexpr uint32_t kBias = F == kFp8 ? 120 : 126;
    uint32_t r = bmul(d, c1);
    if constexpr (Two) {
      if (two) r = bmul(r, e == 255 ? 0x7FC07FC0u : ((e + kBias - 127) << 7) * 0x10001u);
    }
    return r;
  }
};

// Two BF16x2 A-operand words (k-step s of a 16-byte chunk) of one row. Word order per format:
//   BF16: raw words 2s, 2s+1 (columns 4s..4s+3 in natural order);
//   FP8:  raw word s = codes c0..c3 -> (c0, c2), (c1, c3);
//   FP4:  raw word s/2 = nibbles n0..n7 -> (n0, n4), (n1, n5) for even s, (n2, n6), (n3, n7) odd.
// stage_x writes the activations in the matching order.
template <int F, int s, bool Two>
__device__ __forceinline__ void decode_step(const uint4& raw, const Scale<F>& sc, uint32_t& lo,
                                            uint32_t& hi) {
  const uint32_t r[4] = {raw.x, raw.y, raw.z, raw.w};
  if constexpr (F == kBf16) {
    lo = r[2 * s], hi = r[2 * s + 1];
  } else if constexpr (F == kFp8) {
    const uint32_t w = r[s], w8 = w << 8;
    // Sign to bit 15 of each half, the 7 magnitude bits to bits 4..10 (E4M3 exponent -> the low
    // bits of the BF16 exponent): BF16 value = E4M3 value * 2^-120, subnormals included.
    lo = sc.template apply<Two>((w8 & 0x80008000u) | ((w8 & 0x7F007F00u) >> 4));
    hi = sc.template apply<Two>((w & 0x80008000u) | ((w & 0x7F007F00u) >> 4));
  } else {
    const uint32_t w = r[s / 2];
    // Nibble bits 0..2 (m, e0, e1) to BF16 bits 6..8, nibble bit 3 (sign) to bit 15:
    // BF16 value = E2M1 value * 2^-126.
    if constexpr (s % 2 == 0) {
      lo = sc.template apply<Two>(((w << 6) & 0x01C001C0u) | ((w << 12) & 0x80008000u));
      hi = sc.template apply<Two>(((w << 2) & 0x01C001C0u) | ((w << 8) & 0x80008000u));
    } else {
      lo = sc.template apply<Two>(((w >> 2) & 0x01C001C0u) | ((w << 4) & 0x80008000u));
      hi = sc.template apply<Two>(((w >> 6) & 0x01C001C0u) | (w & 0x80008000u));
    }
  }
}

template <int F>
struct Buf {
  uint4 raw[kU][kRT][2];
  uint32_t e[kU];  // the 4 scale codes of super-step u, byte rt * 2 + h
};

template <int F, int NT>
struct Kernel {
  using T = Traits<F>;
  static constexpr int kTok = NT * 8;
  static constexpr int kLd = T::KP + kPad;
  static constexpr int kGroups = kTok * (T::KP / T::G);  // staging groups per piece
  static constexpr int kXPer = (kGroups + kBlockThreads - 1) / kBlockThreads;
  // Prefetch the next piece's activations in registers only while that stays small.
  static constexpr bool kPrefetchX = kXPer * (T::G / 4) <= 4;

  struct XRegs {
    float4 v[kXPer][T::G / 4];
  };

  __device__ static void load_x(const Params& p, const float* x, int64_t k0, XRegs& xr) {
#pragma unroll
    for (int i = 0; i < kXPer; ++i) {
      const int idx = threadIdx.x + i * kBlockThreads;
      const int tok = idx / (T::KP / T::G), c = (idx % (T::KP / T::G)) * T::G;
      const int64_t col = k0 + c;
      const bool ok = idx < kGroups && tok < p.m && col < p.k;  // k % G == 0: whole groups
#pragma unroll
      for (int q = 0; q < T::G / 4; ++q) {
        xr.v[i][q] = ok ? __ldg(reinterpret_cast<const float4*>(x + tok * p.ldx + col) + q)
                        : make_float4(0.f, 0.f, 0.f, 0.f);
      }
    }
  }

  __device__ static void store_x(const XRegs& xr, uint16_t (*xs)[kLd]) {
#pragma unroll
    for (int i = 0; i < kXPer; ++i) {
      const int idx = threadIdx.x + i * kBlockThreads;
      if (idx >= kGroups) continue;
      const int tok = idx / (T::KP / T::G), c = (idx % (T::KP / T::G)) * T::G;
      const float4 a = xr.v[i][0];
      uint32_t* dst = reinterpret_cast<uint32_t*>(&xs[tok][c]);
      if constexpr (F == kBf16) {
        dst[0] = pack_bf16(a.x, a.y), dst[1] = pack_bf16(a.z, a.w);
      } else if constexpr (F == kFp8) {
        dst[0] = pack_bf16(a.x, a.z), dst[1] = pack_bf16(a.y, a.w);
      } else {
        const float4 b = xr.v[i][T::G / 4 - 1];
        // 8-byte stores: odd token rows are only 8-byte aligned (kPad).
        reinterpret_cast<uint2*>(dst)[0] = make_uint2(pack_bf16(a.x, b.x), pack_bf16(a.y, b.y));
        reinterpret_cast<uint2*>(dst)[1] = make_uint2(pack_bf16(a.z, b.z), pack_bf16(a.w, b.w));
      }
    }
  }

  // Issues the weight (and scale) loads of the piece starting at column k0.
  __device__ static void load_w(const Params& p, const uint8_t* const (&wrow)[kRT][2],
                                const uint8_t* const (&srow)[kRT][2], int64_t k0, Buf<F>& b) {
    const int t = threadIdx.x % 4;
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const int64_t col = k0 + u * T::KS + T::V * t;
      const int64_t off = F == kBf16 ? col * 2 : (F == kFp8 ? col : col / 2);
#pragma unroll
      for (int rt = 0; rt < kRT; ++rt) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const bool ok = wrow[rt][h] != nullptr && col < p.k;
          b.raw[u][rt][h] = ok ? ld_stream(wrow[rt][h] + off) : make_uint4(0, 0, 0, 0);
          if constexpr (F != kBf16) {
            const int64_t sc = F == kFp8 ? (col >> p.log2_block_cols) : (col >> 5);
            const uint32_t code = ok ? __ldg(srow[rt][h] + sc) : 127u;
            b.e[u] = (rt == 0 && h == 0) ? code : (b.e[u] | code << (8 * (rt * 2 + h)));
          }
        }
      }
    }
  }

  __device__ static void compute(const Buf<F>& b, const uint16_t (*xs)[kLd],
                                 float (&acc)[kRT][NT][4]) {
    const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      Scale<F> sc[kRT][2];
      if constexpr (F != kBf16) {
#pragma unroll
        for (int rt = 0; rt < kRT; ++rt) {
          sc[rt][0].set((b.e[u] >> (16 * rt)) & 0xFF);
          sc[rt][1].set((b.e[u] >> (16 * rt + 8)) & 0xFF);
        }
      }
      const uint16_t* xb = &xs[g][u * T::KS + T::V * t];
      auto step = [&](auto sconst, auto two) {
        constexpr int s = decltype(sconst)::value;
        constexpr bool kTwo = decltype(two)::value;
        uint32_t a[kRT][4];
#pragma unroll
        for (int rt = 0; rt < kRT; ++rt) {
          decode_step<F, s, kTwo>(b.raw[u][rt][0], sc[rt][0], a[rt][0], a[rt][2]);
          decode_step<F, s, kTwo>(b.raw[u][rt][1], sc[rt][1], a[rt][1], a[rt][3]);
        }
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
          const uint2 bx = *reinterpret_cast<const uint2*>(xb + nt * 8 * kLd + 4 * s);
#pragma unroll
          for (int rt = 0; rt < kRT; ++rt) {
            mma(acc[rt][nt], a[rt][0], a[rt][1], a[rt][2], a[rt][3], bx.x, bx.y);
          }
        }
      };
      auto steps = [&](auto two) {
        [&]<int... S>(std::integer_sequence<int, S...>) {
          (step(std::integral_constant<int, S>{}, two), ...);
        }(std::make_integer_sequence<int, T::V / 4>{});
      };
      bool two = false;
      if constexpr (F != kBf16) {
        two = sc[0][0].two || sc[0][1].two || sc[1][0].two || sc[1][1].two;
      }
      // Warp-uniform: scales needing a second multiply (never in real checkpoints) take their
      // own copy of the super-step.
      if (__any_sync(0xffffffffu, two)) {
        steps(std::true_type{});
      } else {
        steps(std::false_type{});
      }
    }
  }

  __device__ static void run(const Params& p) {
    __shared__ __align__(16) uint16_t xs[kTok][kLd];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4;
    const int64_t bz = blockIdx.z, split = blockIdx.y;
    const float* x = p.x + bz * p.stride_x;
    const int64_t row0 = int64_t(blockIdx.x) * kBM + warp * (kRT * 16);
    const uint8_t* wrow[kRT][2];
    const uint8_t* srow[kRT][2];
#pragma unroll
    for (int rt = 0; rt < kRT; ++rt) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int64_t r = row0 + rt * 16 + g + 8 * h;
        const int64_t wr = bz * p.w_rows_per_batch + r;
        wrow[rt][h] = r < p.n ? p.w + wr * p.w_row_bytes : nullptr;
        srow[rt][h] = nullptr;
        if (F == kFp8 && r < p.n) srow[rt][h] = p.scale + (wr / p.block_rows) * p.scale_cols;
        if (F == kFp4 && r < p.n) srow[rt][h] = p.scale + wr * p.scale_cols;
      }
    }
    const int64_t pc0 = split * p.pieces / p.splits, pc1 = (split + 1) * p.pieces / p.splits;

    float acc[kRT][NT][4];
#pragma unroll
    for (int rt = 0; rt < kRT; ++rt)
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
        acc[rt][nt][0] = acc[rt][nt][1] = acc[rt][nt][2] = acc[rt][nt][3] = 0.f;

    Buf<F> buf[2];
    XRegs xr;
    // The weights are never written by a kernel of the step: the first piece is requested before
    // waiting for the grids this one depends on (programmatic dependent launch in decode graphs);
    // the activations and every write come after the wait.
    load_w(p, wrow, srow, pc0 * T::KP, buf[0]);
    pdl_entry();
    if constexpr (kPrefetchX) load_x(p, x, pc0 * T::KP, xr);
    // Two pieces per iteration so the register double buffer needs no copies.
    auto piece = [&](int64_t pc, Buf<F>& cur, Buf<F>& next) {
      if constexpr (!kPrefetchX) load_x(p, x, pc * T::KP, xr);
      store_x(xr, xs);
      __syncthreads();
      if (pc + 1 < pc1) {
        load_w(p, wrow, srow, (pc + 1) * T::KP, next);  // in flight during the MMAs below
        if constexpr (kPrefetchX) load_x(p, x, (pc + 1) * T::KP, xr);
      }
      compute(cur, xs, acc);
      __syncthreads();
    };
    for (int64_t pc = pc0; pc < pc1; pc += 2) {
      piece(pc, buf[0], buf[1]);
      if (pc + 1 < pc1) piece(pc + 1, buf[1], buf[0]);
    }

    // acc[rt][nt]: c0, c1 = (row g, tokens 2t, 2t+1), c2, c3 = (row g + 8, same tokens).
    float* out =
        p.splits == 1 ? p.y + bz * p.stride_y : p.ws + (bz * p.splits + split) * int64_t(p.m) * p.n;
    const int64_t ld = p.splits == 1 ? p.ldy : p.n;
    store_mma_tiles<kRT, NT>(acc, out, ld, p.splits == 1 && p.accumulate, row0, p.n, p.m);
  }
};

template <int F, int NT>
__global__ void __launch_bounds__(kBlockThreads, NT == 1 ? 2 : 1)
    decode_gemv_kernel(const Params p) {
  Kernel<F, NT>::run(p);  // pdl_entry() inside, after the first weight loads are issued
}

template <int F>
void launch(const Params& p, int nt, dim3 grid, cudaStream_t s) {
  switch (nt) {
    case 1:
      decode_gemv_kernel<F, 1><<<grid, kBlockThreads, 0, s>>>(p);
      break;
    case 2:
      decode_gemv_kernel<F, 2><<<grid, kBlockThreads, 0, s>>>(p);
      break;
    case 4:
      decode_gemv_kernel<F, 4><<<grid, kBlockThreads, 0, s>>>(p);
      break;
    default:
      decode_gemv_kernel<F, 8><<<grid, kBlockThreads, 0, s>>>(p);
      break;
  }
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

}  // namespace

bool decode_gemv_supported(const DecodeGemv& g) {
  const WeightView& w = g.w;
  if (g.m < 1 || g.m > kDecodeGemvMaxM || g.n < 1 || g.k < 1) return false;
  if (g.batch < 1 || g.batch > 65535 || g.n > (int64_t(1) << 30)) return false;
  if (!g.x || !g.y || !w.data || !aligned16(g.x) || !aligned16(w.data)) return false;
  if (g.ldx % 4 != 0 || g.stride_x % 4 != 0 || w.cols != g.k) return false;
  if (g.m > 1 && (g.ldx < g.k || g.ldy < g.n)) return false;
  if (g.batch > 1 && g.w_rows_per_batch < 0) return false;
  const int64_t last_row = (g.batch > 1 ? (g.batch - 1) * g.w_rows_per_batch : 0) + g.n;
  if (last_row > w.rows) return false;
  switch (w.format) {
    case WeightFormat::kBF16:
      return g.k % 8 == 0;
    case WeightFormat::kFp8Block:
      return g.k % 32 == 0 && w.scale && w.block_rows >= 1 && w.block_cols >= 16 &&
             (w.block_cols & (w.block_cols - 1)) == 0;
    case WeightFormat::kMxfp4:
      return g.k % 32 == 0 && w.scale != nullptr;
    default:
      return false;
  }
}

int64_t decode_gemv_splits(const DecodeGemv& g) {
  if (g.n < 1 || g.k < 1 || g.batch < 1) return 1;
  const int fmt = fmt_of(g.w.format);
  const int64_t pieces = (g.k + piece_cols(fmt) - 1) / piece_cols(fmt);
  const int64_t n = g.split_n > 0 ? g.split_n : g.n,
                batch = g.split_batch > 0 ? g.split_batch : g.batch;
  return split_k_count((n + kBM - 1) / kBM * batch, pieces);
}

int64_t decode_gemv_workspace_floats(const DecodeGemv& g) {
  const int64_t s = decode_gemv_splits(g);
  return s > 1 ? g.batch * s * g.m * g.n : 0;
}

cudaError_t decode_gemv_bf16(const DecodeGemv& g, float* workspace, int64_t workspace_floats,
                             cudaStream_t stream) {
  if (!decode_gemv_supported(g)) return cudaErrorInvalidValue;
  const int64_t splits = decode_gemv_splits(g), need = decode_gemv_workspace_floats(g);
  if (need > 0 && (workspace == nullptr || workspace_floats < need)) return cudaErrorInvalidValue;
  const int fmt = fmt_of(g.w.format);
  Params p{};
  p.x = g.x, p.ldx = g.ldx, p.stride_x = g.stride_x;
  p.w = static_cast<const uint8_t*>(g.w.data), p.scale = g.w.scale;
  p.w_row_bytes = fmt == kBf16 ? g.k * 2 : (fmt == kFp8 ? g.k : g.k / 2);
  p.scale_cols = g.w.scale_cols(), p.w_rows_per_batch = g.w_rows_per_batch;
  p.block_rows = g.w.block_rows > 0 ? g.w.block_rows : 1;
  p.log2_block_cols = 0;
  while (fmt == kFp8 && (1 << p.log2_block_cols) < g.w.block_cols) ++p.log2_block_cols;
  p.y = g.y, p.ldy = g.ldy, p.stride_y = g.stride_y, p.ws = workspace;
  p.m = int(g.m), p.n = int(g.n), p.k = g.k;
  p.splits = int(splits), p.pieces = int((g.k + piece_cols(fmt) - 1) / piece_cols(fmt));
  p.accumulate = g.accumulate;
  const int nt = g.m <= 8 ? 1 : (g.m <= 16 ? 2 : (g.m <= 32 ? 4 : 8));
  const dim3 grid(unsigned((g.n + kBM - 1) / kBM), unsigned(splits), unsigned(g.batch));
  if (fmt == kBf16) launch<kBf16>(p, nt, grid, stream);
  if (fmt == kFp8) launch<kFp8>(p, nt, grid, stream);
  if (fmt == kFp4) launch<kFp4>(p, nt, grid, stream);
  if (splits > 1) {
    const cudaError_t e = launch_status();
    if (e != cudaSuccess) return e;
    return reduce_splits(
        SplitPartials{workspace, splits, g.m, g.n, g.batch, g.y, g.ldy, g.stride_y, g.accumulate},
        stream);
  }
  return launch_status();
}

}  // namespace dsv41rt::kernels::cuda
