// MoE decode kernels (contract and numerics: moe_decode.cuh). Four launches (six when the
// routed and shared formats are an uncommon pair), all on the caller's stream, none waiting on the
// host:
//   1. prep: CTA 0 groups the (token, slot) pairs by expert (counts, a scan, ranks: the touched
//      experts in ascending id, each with its pairs in ascending token-major order, the CPU's
//      bucket order) and writes each token's positions in (expert id, slot) order for the combine;
//      the other CTAs round x to BF16 into a lane-permuted layout (below).
//   2. gate/up: grid (row tiles of 16 of I) x (routed slots + shared). A CTA whose slot is empty
//      exits at once; otherwise its 4 warps split K (= H), each streams its 16 rows of w1 and w3
//      with 128-bit loads (one chunk prefetched), decodes to BF16 in registers and runs swap-AB
//      mma.sync m16n8k16 (weights in M, tokens in N); the 4 partials are summed in a fixed order,
//      then clamped SwiGLU x routing weight, rounded to BF16 into `hid`.
//   3. down: the same kernel with w2 (K = I) writing each pair's FP32 output row.
//   4. combine: y[t] = 0 + the token's pair rows in (expert id, slot) order + the shared row.
// So each touched expert's weights are read from HBM once per call, however many tokens chose it.
//
// Lane layout: lane (g = lane / 4, t4 = lane % 4) of a warp owns weight rows g and g + 8 of a
// 16-row tile and, in every 128-column chunk, columns [32 t4, 32 t4 + 32): one MXFP4 scale block,
// one 16-byte load. Since a dot product may visit k in any order, k-step s (0..7) of a chunk gives
// the mma's k slots {2t4, 2t4+1} the columns 32 t4 + 4s + {0, 1} and slots {2t4+8, 2t4+9} the
// columns 32 t4 + 4s + {2, 3}, for A (weights) and B (activations) alike. Activations are stored
// permuted (perm_col) so that a lane's B values for two k-steps are one 16-byte load.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <type_traits>

#include "kernels/cuda/bf16_bits.cuh"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/moe_decode.cuh"
#include "kernels/cuda/quant_device.cuh"
#include "kernels/cuda/swiglu.cuh"

namespace dsv41rt::kernels::cuda {
namespace {

using kernels::WeightFormat;
using kernels::WeightView;

constexpr int kWarps = 4;  // K split over the CTA's warps: more loads in flight per row tile
constexpr int kCtaThreads = 32 * kWarps;
constexpr int kChunk = 128;  // columns per warp step (4 lanes x 32)
constexpr int kRouteThreads = 1024;
constexpr int64_t kAlign = 256;

int64_t round_up(int64_t v, int64_t m) { return (v + m - 1) / m * m; }

// Position of column c in the permuted activation layout (rows padded to a multiple of 128).
__host__ __device__ __forceinline__ int64_t perm_col(int64_t c) {
  const int r = int(c & (kChunk - 1));
  const int t4 = r >> 5, s = (r >> 2) & 7, q = r & 3;
  return (c - r) + (s >> 1) * 32 + t4 * 8 + (s & 1) * 4 + q;
}

// The workspace, carved in this order (each array 256-byte aligned).
struct Layout {
  int32_t *slot_expert, *slot_start, *slot_count;  // [nslots] touched experts, ascending id
  int32_t* pos_token;                              // [P] grouped position -> token
  float* pos_weight;                               // [P] grouped position -> routing weight
  int32_t* order;                                  // [S, k] a token's positions, (e, slot) order
  uint16_t* xb;                                    // [S, Hp] BF16 x, permuted
  uint16_t* hid;                                   // [P + S, Ip] BF16 hidden units, permuted
  float* out;                                      // [P + S, H] each pair's down output
  int64_t nslots, P, Hp, Ip, bytes;
};

Layout layout(const MoeDecode& p, char* base) {
  Layout L{};
  L.P = p.S * p.k;
  L.nslots = p.E < L.P ? p.E : L.P;
  L.Hp = round_up(p.H, kChunk);
  L.Ip = round_up(p.I > p.Is ? p.I : p.Is, kChunk);
  int64_t off = 0;
  auto take = [&](int64_t bytes) {
    char* ptr = base ? base + off : nullptr;
    off += round_up(bytes, kAlign);
    return ptr;
  };
  L.slot_expert = reinterpret_cast<int32_t*>(take(4 * L.nslots));
  L.slot_start = reinterpret_cast<int32_t*>(take(4 * L.nslots));
  L.slot_count = reinterpret_cast<int32_t*>(take(4 * L.nslots));
  L.pos_token = reinterpret_cast<int32_t*>(take(4 * L.P));
  L.pos_weight = reinterpret_cast<float*>(take(4 * L.P));
  L.order = reinterpret_cast<int32_t*>(take(4 * L.P));
  L.xb = reinterpret_cast<uint16_t*>(take(2 * p.S * L.Hp));
  L.hid = reinterpret_cast<uint16_t*>(take(2 * (L.P + p.S) * L.Ip));
  L.out = reinterpret_cast<float*>(take(4 * (L.P + p.S) * p.H));
  L.bytes = off;
  return L;
}

// ---- 1. routing + x to BF16 -------------------------------------------------------------------

struct PrepParams {
  const float* x;
  const int32_t* idx;
  const float* weight;
  int S, k, E;
  int64_t H;
  Layout L;
};

__device__ void route(const PrepParams& p) {
  __shared__ int s_cnt[kMoeDecodeMaxExperts], s_off[kMoeDecodeMaxExperts];
  __shared__ int s_e[kMoeDecodeMaxTokens * kMoeDecodeMaxTopK];
  __shared__ int s_pos[kMoeDecodeMaxTokens * kMoeDecodeMaxTopK];
  __shared__ int s_warp[32];
  const int tid = threadIdx.x, lane = tid & 31, wid = tid >> 5, P = p.S * p.k;
  if (tid < p.E) s_cnt[tid] = 0;
  __syncthreads();
  for (int q = tid; q < P; q += kRouteThreads) {
    int e = p.idx[q];
    e = (e >= 0 && e < p.E) ? e : -1;  // out-of-range ids are skipped
    s_e[q] = e;
    if (e >= 0) atomicAdd(&s_cnt[e], 1);  // integer counts: order-independent
  }
  __syncthreads();
  // Block scan of (count << 16 | touched) over experts: pair offsets and slot numbers at once.
  const int c = tid < p.E ? s_cnt[tid] : 0, mine = (c << 16) | (c > 0 ? 1 : 0);
  int v = mine;
  for (int o = 1; o < 32; o <<= 1) {
    const int y = __shfl_up_sync(0xffffffffu, v, o);
    if (lane >= o) v += y;
  }
  if (lane == 31) s_warp[wid] = v;
  __syncthreads();
  if (wid == 0) {
    int w = s_warp[lane];
    for (int o = 1; o < 32; o <<= 1) {
      const int y = __shfl_up_sync(0xffffffffu, w, o);
      if (lane >= o) w += y;
    }
    s_warp[lane] = w;
  }
  __syncthreads();
  const int excl = v + (wid > 0 ? s_warp[wid - 1] : 0) - mine;
  const int touched = s_warp[31] & 0xFFFF;
  if (tid < p.E) {
    s_off[tid] = excl >> 16;
    if (c > 0) {
      const int slot = excl & 0xFFFF;
      p.L.slot_expert[slot] = tid;
      p.L.slot_start[slot] = excl >> 16;
      p.L.slot_count[slot] = c;
    }
  }
  for (int i = touched + tid; i < p.L.nslots; i += kRouteThreads) {
    p.L.slot_expert[i] = 0, p.L.slot_start[i] = 0, p.L.slot_count[i] = 0;  // CTAs exit at once
  }
  __syncthreads();
  // Rank of each pair among its expert's pairs: ascending pair id = token-major (CPU buckets).
  for (int q = tid; q < P; q += kRouteThreads) {
    const int e = s_e[q];
    if (e < 0) {
      s_pos[q] = -1;
      continue;
    }
    int rank = 0;
    for (int r = 0; r < q; ++r) rank += s_e[r] == e ? 1 : 0;
    const int pos = s_off[e] + rank;
    s_pos[q] = pos;
    p.L.pos_token[pos] = q / p.k;
    p.L.pos_weight[pos] = p.weight[q];
  }
  __syncthreads();
  // Each token's slots by (expert id, slot): stable insertion sort of at most 16 entries.
  for (int t = tid; t < p.S; t += kRouteThreads) {
    int list[kMoeDecodeMaxTopK];
    int n = 0;
    for (int j = 0; j < p.k; ++j) {
      const int e = s_e[t * p.k + j];
      if (e < 0) continue;
      int i = n++;
      while (i > 0 && s_e[t * p.k + list[i - 1]] > e) list[i] = list[i - 1], --i;
      list[i] = j;
    }
    for (int j = 0; j < p.k; ++j) p.L.order[t * p.k + j] = j < n ? s_pos[t * p.k + list[j]] : -1;
  }
}

__global__ void __launch_bounds__(kRouteThreads) prep_kernel(const PrepParams p) {
  pdl_entry();
  if (blockIdx.x == 0) {
    route(p);
    return;
  }
  const int64_t n = int64_t(p.S) * p.H, stride = int64_t(gridDim.x - 1) * kRouteThreads;
  for (int64_t i = int64_t(blockIdx.x - 1) * kRouteThreads + threadIdx.x; i < n; i += stride) {
    const int64_t t = i / p.H, c = i - t * p.H;
    p.L.xb[t * p.L.Hp + perm_col(c)] = __bfloat16_as_ushort(__float2bfloat16_rn(p.x[i]));
  }
}

// ---- 2./3. expert GEMMs -----------------------------------------------------------------------

__host__ __device__ constexpr int quads_of(WeightFormat f) {
  return f == WeightFormat::kMxfp4 ? 1 : (f == WeightFormat::kFp8Block ? 2 : 4);
}

// One lane's 32 columns of one weight row, as loaded, and its scale as BF16x2 multipliers:
// decoded bits times m1 times m2 is the exact weight (see scale_mults).
template <WeightFormat F>
struct RowRaw {
  uint4 d[quads_of(F)];
  uint32_t m1, m2;
};

__device__ __forceinline__ uint4 ld_stream(const void* ptr) {
  uint4 v;  // read once: keep it out of L1
  asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(ptr));
  return v;
}

__device__ __forceinline__ uint32_t comp(const uint4& v, int i) {
  return i == 0 ? v.x : (i == 1 ? v.y : (i == 2 ? v.z : v.w));
}

using bits::bmul;
using bits::prmt;

constexpr uint32_t kBf16x2One = 0x3F803F80u;

// Bit-placed codes are value * 2^-126 (E2M1) or * 2^-120 (E4M3), exactly (kernels-wave2 §4.3);
// the UE8M0 scale e adds 2^(e - 127). One multiply by 2^(e - 1) / 2^(e - 7) when that is a normal
// BF16 (every real checkpoint scale; then m2 = 1), else 2^126 / 2^120 then m2 = 2^(e - 127).
template <WeightFormat F>
__device__ __forceinline__ void scale_mults(uint32_t e, uint32_t& m1, uint32_t& m2) {
  constexpr uint32_t bias = F == WeightFormat::kMxfp4 ? 126 : 120;
  constexpr uint32_t emax = 254 - bias;  // largest e with 2^(e - 127 + bias) a normal BF16
  const uint32_t a = e <= emax ? e + bias : 127 + bias, b = e <= emax ? 127 : e;  // b: 2^0 = 1
  m1 = a * 0x00800080u;  // (a << 7) | (a << 23): both halves' exponent fields, one multiply
  m2 = b * 0x00800080u;
}

template <WeightFormat F>
__device__ __forceinline__ void load_row(const WeightView& w, int64_t row, int64_t col0,
                                         RowRaw<F>& r) {
  uint32_t e = 0;
  if constexpr (F == WeightFormat::kMxfp4) {
    r.d[0] = ld_stream(static_cast<const uint8_t*>(w.data) + row * (w.cols / 2) + col0 / 2);
    e = __ldg(w.scale + row * (w.cols / 32) + col0 / 32);
  } else if constexpr (F == WeightFormat::kFp8Block) {
    const uint8_t* ptr = static_cast<const uint8_t*>(w.data) + row * w.cols + col0;
    r.d[0] = ld_stream(ptr), r.d[1] = ld_stream(ptr + 16);
    const int64_t sc = (w.cols + w.block_cols - 1) / w.block_cols;
    e = __ldg(w.scale + (row / w.block_rows) * sc + col0 / w.block_cols);
  } else {
    const uint16_t* ptr = static_cast<const uint16_t*>(w.data) + row * w.cols + col0;
#pragma unroll
    for (int q = 0; q < 4; ++q) r.d[q] = ld_stream(ptr + 8 * q);
  }
  if constexpr (F != WeightFormat::kBF16) scale_mults<F>(e, r.m1, r.m2);
}

// k-step s of a lane's row: lo = columns 4s + {0, 1}, hi = 4s + {2, 3}, as BF16x2.
template <WeightFormat F, bool kTwo>
__device__ __forceinline__ void decode_step(const RowRaw<F>& r, int s, uint32_t& lo, uint32_t& hi) {
  if constexpr (F == WeightFormat::kMxfp4) {
    // Nibble pair -> (n_lo at bits 0-3, n_hi at 16-19, zeros elsewhere: selector 8 replicates the
    // clear top bit of a masked byte); * 0x1040 = << 6 | << 12 (no overlap), then keep the
    // magnitude at bits 6-8 and the sign at bit 15 of each half.
    const uint32_t w = comp(r.d[0], s >> 1), ev = w & 0x0F0F0F0Fu, od = (w >> 4) & 0x0F0F0F0Fu;
    const uint32_t b = (s & 1) * 2;
    lo = (prmt(ev, od, b | 0x80u | ((4 + b) << 8) | 0x8000u) * 0x1040u) & 0x81C081C0u;
    hi = (prmt(ev, od, (b + 1) | 0x80u | ((5 + b) << 8) | 0x8000u) * 0x1040u) & 0x81C081C0u;
  } else if constexpr (F == WeightFormat::kFp8Block) {
    // Byte -> magnitude << 4, sign to bit 15 (selectors 8..B replicate a byte's sign bit).
    const uint32_t w = comp(r.d[s >> 2], s & 3), m = w & 0x7F7F7F7Fu;
    lo = (prmt(m, 0, 0x4140u) << 4) | (prmt(w, 0, 0x9484u) & 0x80008000u);
    hi = (prmt(m, 0, 0x4342u) << 4) | (prmt(w, 0, 0xB4A4u) & 0x80008000u);
  } else {
    lo = comp(r.d[s >> 1], (s & 1) * 2);
    hi = comp(r.d[s >> 1], (s & 1) * 2 + 1);
  }
  if constexpr (F != WeightFormat::kBF16) {
    lo = bmul(lo, r.m1), hi = bmul(hi, r.m1);
    if constexpr (kTwo) lo = bmul(lo, r.m2), hi = bmul(hi, r.m2);  // m2 = 1.0 on other rows
  }
}

__device__ __forceinline__ void mma_bf16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                         uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// acc[m][nt] += rows [row0, row0 + 16) of w[m] times the activation rows bp[nt] over this
// warp's chunks (warp, warp + 4, ...). Lanes past K load nothing and multiply zeros.
template <WeightFormat F, int NMAT, int NT>
__device__ __forceinline__ void mainloop(const WeightView (&w)[NMAT], int64_t row0, int64_t K,
                                         const uint16_t* const (&bp)[NT], int nt_active,
                                         float (&acc)[NMAT][NT][4]) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t4 = lane & 3;
  const int nchunks = int((K + kChunk - 1) / kChunk);
  // This lane's row g of each matrix as a byte pointer to its 32 columns of chunk 0 and, for
  // MXFP4, to their scale (row g + 8 is 8 rows on; a chunk further is kChunk / 2 bytes and 4
  // scales on): no 64-bit index arithmetic per load, few registers.
  const uint8_t* rowp[NMAT];
  const uint8_t* scalep[NMAT];
  const int64_t rows8 = 8 * (K / 32) * 16 * quads_of(F), srows8 = 8 * (K / 32);
#pragma unroll
  for (int m = 0; m < NMAT; ++m) {
    const int64_t row = row0 + g;
    rowp[m] = static_cast<const uint8_t*>(w[m].data) + (row * (K / 32) + t4) * 16 * quads_of(F);
    scalep[m] = nullptr;
    if constexpr (F == WeightFormat::kMxfp4) scalep[m] = w[m].scale + row * (K / 32) + t4;
  }
  auto load = [&](RowRaw<F>(&r)[NMAT][2], int c) {
    const int64_t col0 = int64_t(c) * kChunk + t4 * 32;
#pragma unroll
    for (int m = 0; m < NMAT; ++m) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        if (col0 >= K) {
          for (auto& q : r[m][h].d) q = make_uint4(0, 0, 0, 0);
          r[m][h].m1 = 0, r[m][h].m2 = kBf16x2One;
        } else if constexpr (F == WeightFormat::kMxfp4) {
          r[m][h].d[0] = ld_stream(rowp[m] + h * rows8 + c * (kChunk / 2));
          scale_mults<F>(__ldg(scalep[m] + h * srows8 + c * (kChunk / 32)), r[m][h].m1, r[m][h].m2);
        } else {
          load_row<F>(w[m], row0 + g + 8 * h, col0, r[m][h]);
        }
      }
    }
  };
  // Chunk c of this warp from the registers `now` (loaded before), all lanes past K multiplying
  // zeros. Scales needing two multiplies (never in real checkpoints) take a separate,
  // warp-uniform copy of the body, so the common one has no per-value branch.
  auto compute = [&](const RowRaw<F>(&now)[NMAT][2], int c) {
    const bool valid = int64_t(c) * kChunk + t4 * 32 < K;
    auto body = [&](auto two) {
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        uint4 b[NT];
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
          b[nt] = make_uint4(0, 0, 0, 0);
          if (valid && nt < nt_active) {
            b[nt] = *reinterpret_cast<const uint4*>(bp[nt] + c * kChunk + j * 32);
          }
        }
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          uint32_t a[NMAT][4];
#pragma unroll
          for (int m = 0; m < NMAT; ++m) {
            decode_step<F, decltype(two)::value>(now[m][0], 2 * j + h, a[m][0], a[m][2]);
            decode_step<F, decltype(two)::value>(now[m][1], 2 * j + h, a[m][1], a[m][3]);
          }
#pragma unroll
          for (int nt = 0; nt < NT; ++nt) {
            if (nt >= nt_active) continue;
#pragma unroll
            for (int m = 0; m < NMAT; ++m) {
              mma_bf16(acc[m][nt], a[m], h ? b[nt].z : b[nt].x, h ? b[nt].w : b[nt].y);
            }
          }
        }
      }
    };
    bool two = false;
    if constexpr (F != WeightFormat::kBF16) {
#pragma unroll
      for (int m = 0; m < NMAT; ++m) {
        two = two || now[m][0].m2 != kBf16x2One || now[m][1].m2 != kBf16x2One;
      }
    }
    if (__any_sync(0xffffffffu, two)) {
      body(std::true_type{});
    } else {
      body(std::false_type{});
    }
  };
  RowRaw<F> ra[NMAT][2], rb[NMAT][2];
  if constexpr (F == WeightFormat::kMxfp4) {
    // MXFP4 rows are 16 bytes a lane: the next chunk is in flight during this one. Two register
    // sets in turn (ra, rb), the loop unrolled by two, so nothing is copied between them.
    if (warp < nchunks) load(ra, warp);
    for (int c = warp; c < nchunks; c += 2 * kWarps) {
      if (c + kWarps < nchunks) load(rb, c + kWarps);
      compute(ra, c);
      if (c + kWarps >= nchunks) break;
      if (c + 2 * kWarps < nchunks) load(ra, c + 2 * kWarps);
      compute(rb, c + kWarps);
    }
  } else {
    // FP8 / BF16 rows are 32 / 64 bytes a lane: as many loads in flight without a second set
    // (and fewer registers).
    for (int c = warp; c < nchunks; c += kWarps) {
      load(ra, c);
      compute(ra, c);
    }
  }
}

struct Side {
  WeightView a, b;  // b: w3 for the gate/up pass, unused in the down pass
  int64_t M, K;     // rows per expert (tile extent), reduction length
};

struct ExpertParams {
  Side routed, shared;
  int nslots, S, P;
  const int32_t *slot_expert, *slot_start, *slot_count, *pos_token;
  const float* pos_weight;
  const uint16_t* act;  // xb (row = token) or hid (row = grouped position)
  int64_t act_stride;
  bool act_by_token;
  uint16_t* hid;  // gate/up output
  int64_t hid_stride;
  float limit;
  float* out;  // down output [P + S, H]
  int64_t out_stride;
};

// NMAT = 2: gate/up (w1, w3) + SwiGLU into hid; NMAT = 1: down (w2) into out. Routed slots read
// format FR, the shared slot FS (one launch for both: a separate launch for the shared expert
// alone would leave most SMs idle); slot = slot0 + blockIdx.y. 128 registers: 4 CTAs / SM.
template <WeightFormat FR, WeightFormat FS, int NMAT, int NT>
__global__ void __launch_bounds__(kCtaThreads, 4) expert_kernel(const ExpertParams p, int slot0) {
  pdl_entry();
  __shared__ float red[kWarps][NMAT][16][NT * 8];
  const int slot = slot0 + int(blockIdx.y);
  const bool shared = slot >= p.nslots;
  const Side& side = shared ? p.shared : p.routed;
  const int64_t tile = int64_t(blockIdx.x) * 16;
  if (tile >= side.M) return;
  int cnt = p.S, start = p.P;
  int64_t rowbase = 0;
  if (!shared) {
    cnt = p.slot_count[slot];
    if (cnt == 0) return;  // fewer experts touched than slots: nothing to stream
    start = p.slot_start[slot];
    rowbase = int64_t(p.slot_expert[slot]) * side.M;
  }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t4 = lane & 3;
  WeightView w[NMAT];
  w[0] = side.a;
  if constexpr (NMAT == 2) w[1] = side.b;
  // More pairs than NT * 8 (an expert repeated inside tokens) re-stream the tile (from L2).
  for (int c0 = 0; c0 < cnt; c0 += NT * 8) {
    const int n = min(NT * 8, cnt - c0), nt_active = (n + 7) / 8;
    const uint16_t* bp[NT];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      const int pos = start + min(c0 + nt * 8 + g, c0 + n - 1);  // pad columns repeat a real row
      const int64_t row = p.act_by_token ? (shared ? pos - p.P : p.pos_token[pos]) : pos;
      bp[nt] = p.act + row * p.act_stride + t4 * 8;  // this lane's 8 values of a 32-column step
    }
    float acc[NMAT][NT][4] = {};
    if (FR == FS || !shared) {
      mainloop<FR, NMAT, NT>(w, rowbase + tile, side.K, bp, nt_active, acc);
    } else if constexpr (FR != FS) {
      mainloop<FS, NMAT, NT>(w, rowbase + tile, side.K, bp, nt_active, acc);
    }
#pragma unroll
    for (int m = 0; m < NMAT; ++m) {
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        red[warp][m][g][nt * 8 + 2 * t4] = acc[m][nt][0];
        red[warp][m][g][nt * 8 + 2 * t4 + 1] = acc[m][nt][1];
        red[warp][m][g + 8][nt * 8 + 2 * t4] = acc[m][nt][2];
        red[warp][m][g + 8][nt * 8 + 2 * t4 + 1] = acc[m][nt][3];
      }
    }
    __syncthreads();
    for (int e = threadIdx.x; e < 16 * n; e += kCtaThreads) {
      const int tok = e >> 4, r = e & 15, pos = start + c0 + tok;
      float v[NMAT];
#pragma unroll
      for (int m = 0; m < NMAT; ++m) {  // fixed order: deterministic
        v[m] = ((red[0][m][r][tok] + red[1][m][r][tok]) + red[2][m][r][tok]) + red[3][m][r][tok];
      }
      if constexpr (NMAT == 2) {
        const float h =
            swiglu_unit(v[0], v[1], p.limit, !shared, shared ? 1.0f : p.pos_weight[pos]);
        p.hid[pos * p.hid_stride + perm_col(tile + r)] =
            __bfloat16_as_ushort(__float2bfloat16_rn(h));
      } else {
        p.out[pos * p.out_stride + tile + r] = v[0];
      }
    }
    __syncthreads();
  }
}

// ---- 2b. precision "fp8": the hidden units through the FP8 activation QDQ
// -------------------------

// One warp per (row, logical 32-column block) of hid (routed positions [0, P) over I columns, the
// shared rows [P, P + S) over Is); lane l takes logical column 32 b + l at its permuted place. The
// values are BF16 already (the reference's cast), so this is fp8_act_qdq, in place.
__global__ void hid_qdq_kernel(uint16_t* hid, int64_t stride, int64_t P, int64_t S, int64_t I,
                               int64_t Is) {
  pdl_entry();
  const int lane = threadIdx.x & 31;
  const int64_t bpr = (I > Is ? I : Is) / 32, rows = P + S;
  const int64_t warps = int64_t(gridDim.x) * (blockDim.x / 32);
  for (int64_t wb = blockIdx.x * int64_t(blockDim.x / 32) + threadIdx.x / 32; wb < rows * bpr;
       wb += warps) {
    const int64_t row = wb / bpr, b = wb % bpr;
    if (b * 32 >= (row < P ? I : Is)) continue;  // warp-uniform
    uint16_t* at = hid + row * stride + perm_col(b * 32 + lane);
    const float v = __bfloat162float(__ushort_as_bfloat16(*at));
    const qdev::Quantized q = qdev::quantize_lane<qdev::Format::kFp8Window>(v, true);
    const float d = __fmul_rn(qdev::decode_element<qdev::Format::kFp8Window>(q.code), q.s);
    *at = __bfloat16_as_ushort(__float2bfloat16_rn(d));  // exact: an E4M3 value times 2^e
  }
}

// ---- 4. combine -------------------------------------------------------------------------------

__global__ void combine_kernel(const float* out, const int32_t* order, int S, int64_t H, int k,
                               int P, bool has_shared, float* y) {
  pdl_entry();
  const int64_t n4 = int64_t(S) * H / 4;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n4;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = i * 4 / H, c = i * 4 - t * H;
    float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);  // the CPU's y = 0, then y += each row
    auto add = [&](int64_t row) {
      const float4 o = *reinterpret_cast<const float4*>(out + row * H + c);
      acc.x += o.x, acc.y += o.y, acc.z += o.z, acc.w += o.w;
    };
    for (int j = 0; j < k; ++j) {
      const int pos = order[t * k + j];
      if (pos < 0) break;
      add(pos);
    }
    if (has_shared) add(P + t);
    *reinterpret_cast<float4*>(y + t * H + c) = acc;
  }
}

// ---- host -------------------------------------------------------------------------------------

bool aligned16(const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; }

bool view_ok(const WeightView& w, int64_t rows, int64_t cols) {
  if (w.data == nullptr || !aligned16(w.data) || w.rows != rows || w.cols != cols) return false;
  switch (w.format) {
    case WeightFormat::kBF16:
      return true;
    case WeightFormat::kFp8Block:
      return w.scale != nullptr && w.block_rows >= 1 && w.block_cols >= 32 &&
             w.block_cols % 32 == 0;
    case WeightFormat::kMxfp4:
      return w.scale != nullptr;
    case WeightFormat::kF32:
      break;
  }
  return false;
}

template <WeightFormat FR, WeightFormat FS, int NMAT>
void launch_tiles(const ExpertParams& ep, dim3 grid, int slot0, int64_t S, cudaStream_t s) {
  // Token tiles of 8 (S <= 8) or 16: wider tiles (32, 64 tokens) cost registers, occupancy and
  // instruction cache and ran slower on an H200 at S = 64; an expert with more tokens than a tile
  // (the shared expert, popular experts) loops over tiles, re-reading its rows from L2.
  if (S <= 8) {
    expert_kernel<FR, FS, NMAT, 1><<<grid, kCtaThreads, 0, s>>>(ep, slot0);
  } else {
    expert_kernel<FR, FS, NMAT, 2><<<grid, kCtaThreads, 0, s>>>(ep, slot0);
  }
}

template <int NMAT>
void launch_format(WeightFormat f, const ExpertParams& ep, dim3 grid, int slot0, int64_t S,
                   cudaStream_t s) {
  switch (f) {
    case WeightFormat::kMxfp4:
      return launch_tiles<WeightFormat::kMxfp4, WeightFormat::kMxfp4, NMAT>(ep, grid, slot0, S, s);
    case WeightFormat::kFp8Block:
      return launch_tiles<WeightFormat::kFp8Block, WeightFormat::kFp8Block, NMAT>(ep, grid, slot0,
                                                                                  S, s);
    default:
      return launch_tiles<WeightFormat::kBF16, WeightFormat::kBF16, NMAT>(ep, grid, slot0, S, s);
  }
}

// One launch when the formats agree or are the release's (MXFP4 routed, FP8 shared), else two.
template <int NMAT>
cudaError_t launch_experts(const ExpertParams& ep, unsigned tiles, bool has_shared, int64_t S,
                           cudaStream_t s) {
  const WeightFormat fr = ep.routed.a.format, fs = ep.shared.a.format;
  const unsigned all = unsigned(ep.nslots + (has_shared ? 1 : 0));
  if (!has_shared || fs == fr) {
    launch_format<NMAT>(fr, ep, dim3(tiles, all), 0, S, s);
  } else if (fr == WeightFormat::kMxfp4 && fs == WeightFormat::kFp8Block) {
    launch_tiles<WeightFormat::kMxfp4, WeightFormat::kFp8Block, NMAT>(ep, dim3(tiles, all), 0, S,
                                                                      s);
  } else {
    launch_format<NMAT>(fr, ep, dim3(tiles, unsigned(ep.nslots)), 0, S, s);
    if (const cudaError_t e = launch_status(); e != cudaSuccess) return e;
    launch_format<NMAT>(fs, ep, dim3(tiles, 1), ep.nslots, S, s);
  }
  return launch_status();
}

}  // namespace

int64_t moe_decode_workspace_bytes(const MoeDecode& p) {
  return p.S <= 0 ? 0 : layout(p, nullptr).bytes;
}

bool moe_decode_supported(const MoeDecode& p) {
  if (p.S < 0 || p.S > kMoeDecodeMaxTokens || p.k < 1 || p.k > kMoeDecodeMaxTopK || p.E < 1 ||
      p.E > kMoeDecodeMaxExperts) {
    return false;
  }
  if (p.H < 32 || p.H % 32 != 0 || p.I < 32 || p.I % 32 != 0 || p.Is < 0 || p.Is % 32 != 0) {
    return false;
  }
  if (p.S > 0 && (!p.x || !p.idx || !p.weight || !p.y || !aligned16(p.x) || !aligned16(p.y))) {
    return false;
  }
  if (!view_ok(p.w1, p.E * p.I, p.H) || !view_ok(p.w3, p.E * p.I, p.H) ||
      !view_ok(p.w2, p.E * p.H, p.I) || p.w1.format != p.w3.format) {
    return false;
  }
  if (p.Is > 0 && (!view_ok(p.sw1, p.Is, p.H) || !view_ok(p.sw3, p.Is, p.H) ||
                   !view_ok(p.sw2, p.H, p.Is) || p.sw1.format != p.sw3.format)) {
    return false;
  }
  return true;
}

cudaError_t moe_decode_bf16(const MoeDecode& p, void* workspace, int64_t workspace_bytes,
                            cudaStream_t s) {
  if (!moe_decode_supported(p)) return cudaErrorInvalidValue;
  if (p.S == 0) return cudaSuccess;
  const Layout L = layout(p, static_cast<char*>(workspace));
  if (workspace == nullptr || workspace_bytes < L.bytes ||
      reinterpret_cast<uintptr_t>(workspace) % kAlign != 0) {
    return cudaErrorInvalidValue;
  }
  const bool has_shared = p.Is > 0;
  const PrepParams pp{p.x, p.idx, p.weight, int(p.S), int(p.k), int(p.E), p.H, L};
  const int64_t conv_blocks =
      std::min<int64_t>((p.S * p.H + kRouteThreads - 1) / kRouteThreads, 264);
  prep_kernel<<<int(1 + conv_blocks), kRouteThreads, 0, s>>>(pp);
  if (const cudaError_t e = launch_status(); e != cudaSuccess) return e;

  ExpertParams ep{};
  ep.nslots = int(L.nslots), ep.S = int(p.S), ep.P = int(L.P);
  ep.slot_expert = L.slot_expert, ep.slot_start = L.slot_start, ep.slot_count = L.slot_count;
  ep.pos_token = L.pos_token, ep.pos_weight = L.pos_weight;
  ep.hid = L.hid, ep.hid_stride = L.Ip, ep.limit = p.limit, ep.out = L.out, ep.out_stride = p.H;

  // gate/up: K = H, rows I (routed) / Is (shared); activations = x in BF16, by token.
  ep.routed = Side{p.w1, p.w3, p.I, p.H};
  ep.shared = has_shared ? Side{p.sw1, p.sw3, p.Is, p.H} : Side{p.w1, p.w3, 0, p.H};
  ep.act = L.xb, ep.act_stride = L.Hp, ep.act_by_token = true;
  const int64_t gu_rows = std::max(p.I, p.Is);
  if (const cudaError_t e = launch_experts<2>(ep, unsigned(gu_rows / 16), has_shared, p.S, s);
      e != cudaSuccess) {
    return e;
  }
  if (p.fp8_inputs) {
    const int64_t warps = (L.P + p.S) * (std::max(p.I, p.Is) / 32);
    hid_qdq_kernel<<<blocks_for(warps * 32), kThreads, 0, s>>>(L.hid, L.Ip, L.P, p.S, p.I, p.Is);
    if (const cudaError_t e = launch_status(); e != cudaSuccess) return e;
  }
  // down: K = I / Is, rows H; activations = hidden units, by grouped position.
  ep.routed = Side{p.w2, WeightView{}, p.H, p.I};
  ep.shared = has_shared ? Side{p.sw2, WeightView{}, p.H, p.Is} : Side{p.w2, WeightView{}, 0, p.I};
  ep.act = L.hid, ep.act_stride = L.Ip, ep.act_by_token = false;
  if (const cudaError_t e = launch_experts<1>(ep, unsigned(p.H / 16), has_shared, p.S, s);
      e != cudaSuccess) {
    return e;
  }
  combine_kernel<<<blocks_for(p.S * p.H / 4), kThreads, 0, s>>>(
      L.out, L.order, int(p.S), p.H, int(p.k), int(L.P), has_shared, p.y);
  return launch_status();
}

}  // namespace dsv41rt::kernels::cuda
