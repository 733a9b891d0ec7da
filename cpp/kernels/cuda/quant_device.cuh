// Device-side element codecs of the cache formats, shared by the contiguous quantisers
// (quant.cu) and the paged gather/scatter kernels (paged.cu). Internal to kernels/cuda: every
// function reproduces kernels/cpu/quant.cc bit for bit (see quant.cuh).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/dtype.h"

namespace dsv41rt::kernels::cuda::qdev {

// The FP32 constants of kernels/cpu/quant.cc, evaluated the same way (double -> float casts).
constexpr float kFp8AmaxFloor = static_cast<float>(1e-4);
constexpr float kInv448 = static_cast<float>(1.0 / 448.0);
constexpr float kNvfp4AmaxFloor = 6.0f * 0.001953125f;  // 6 * 2^-9, exact
constexpr float kMxfp4AmaxFloor = 6.0f * 0x1p-126f;     // 6 * 2^-126, exact (normal)
constexpr float kInv6 = static_cast<float>(1.0 / 6.0);
constexpr float kF32Max = 3.40282346638528859812e+38f;
constexpr unsigned kFullMask = 0xffffffffu;

enum class Format { kFp8Window, kNvfp4, kMxfp4 };

template <Format F>
__host__ __device__ constexpr int block_of() {
  return F == Format::kNvfp4 ? 16 : 32;
}

/// Bytes of the data part of a packed row (the scale codes follow).
template <Format F>
__host__ __device__ constexpr int64_t data_bytes(int64_t dim) {
  return F == Format::kFp8Window ? dim : dim / 2;
}

template <Format F>
__host__ __device__ constexpr int64_t row_bytes(int64_t dim) {
  return data_bytes<F>(dim) + dim / block_of<F>();
}

// NeMo `_power_of_two_ceiling` on the int32 view (see cpu/quant.cc): a NaN gives -0.
__device__ __forceinline__ float pow2ceil_bits(float v) {
  const uint32_t bits = f32_to_bits(v);
  const uint32_t exponent = (bits >> 23) & 255u;
  const uint32_t increment = (bits & 0x7FFFFFu) != 0 ? 1u : 0u;
  return f32_from_bits((exponent + increment) << 23);
}

// torch clamp_min / clamp: NaN propagates (same comparisons as the CPU reference).
__device__ __forceinline__ float clamp_min(float v, float lo) { return v < lo ? lo : v; }
__device__ __forceinline__ float clamp(float v, float lo, float hi) {
  return v < lo ? lo : (v > hi ? hi : v);
}

// E2M1 code as NeMo rounds it: magnitude (NaN -> level 6), sign of the input kept (passed in).
__device__ __forceinline__ uint8_t e2m1_code(float n, bool negative) {
  const float mag = fabsf(n);
  const uint8_t c = mag != mag ? uint8_t{7} : f32_to_fp4_e2m1(mag);
  return static_cast<uint8_t>(negative ? (c | 0x8u) : c);
}

// a / b (IEEE, round to nearest) with the NaN an x86 host (SSE) produces, so that blocks holding
// inf/NaN quantise like the CPU reference on x86: a NaN operand propagates (the first one, made
// quiet) and an invalid operation (0/0, inf/inf) gives the negative "default NaN" 0xFFC00000. The
// GPU would give its canonical +NaN, whose sign then leaks into E2M1/E4M3 codes (inf/inf -> NaN
// -> level 6 with the NaN's sign -> +-6 * inf).
__device__ __forceinline__ float div_like_host(float a, float b) {
  const float q = __fdiv_rn(a, b);
  if (q == q) return q;
  if (a != a) return f32_from_bits(f32_to_bits(a) | 0x00400000u);
  if (b != b) return f32_from_bits(f32_to_bits(b) | 0x00400000u);
  return f32_from_bits(0xFFC00000u);
}

// v / s for the block scale s of a power-of-two format (fp8 window, MXFP4): s is 2^e with
// e <= 126 (pow2ceil_bits of amax / 448 or amax / 6, amax finite), +inf (an infinite amax) or -0
// (a NaN block), so its reciprocal is exact (2^-e, normal; 0; -inf) and v times it is the exact
// quotient rounded once: the IEEE division's result wherever that is not NaN. Where the product
// is NaN (v NaN, 0 * inf, inf * 0: exactly where the quotient is NaN) the division gives its
// host-like NaN. The per-element IEEE division was the quantisers' largest instruction count.
__device__ __forceinline__ float div_pow2_like_host(float v, float s) {
  const float q = __fmul_rn(v, __frcp_rn(s));
  return q == q ? q : div_like_host(v, s);
}

template <Format F>
__device__ __forceinline__ float decode_element(uint8_t code) {
  if constexpr (F == Format::kFp8Window) {
    return fp8_e4m3_to_f32(code);
  } else {
    return fp4_e2m1_to_f32(code);
  }
}

struct Quantized {
  uint8_t code;        // element code
  uint8_t scale_code;  // storage code of the block scale
  float s;             // the FP32 block scale
};

// The block scale of a block whose amax is `amax` (NaN when the block holds a NaN): NeMo's FP32
// scale s and its storage code, as kernels/cpu/quant.cc quantize_block.
template <Format F>
__device__ __forceinline__ void block_scale(float amax, Quantized& q) {
  if constexpr (F == Format::kNvfp4) {
    q.scale_code = f32_to_fp8_e4m3(__fdiv_rn(clamp_min(amax, kNvfp4AmaxFloor), 6.0f));
    q.s = fp8_e4m3_to_f32(q.scale_code);
  } else {
    const float floor = F == Format::kFp8Window ? kFp8AmaxFloor : kMxfp4AmaxFloor;
    const float inv = F == Format::kFp8Window ? kInv448 : kInv6;
    q.s = pow2ceil_bits(__fmul_rn(clamp_min(amax, floor), inv));
    q.scale_code = amax <= kF32Max ? static_cast<uint8_t>(f32_to_bits(q.s) >> 23) : kE8M0Nan;
  }
}

// The element code of v in a block of scale s.
template <Format F>
__device__ __forceinline__ uint8_t element_code(float v, float s) {
  // The reference's true division (NVFP4's E4M3 scales are not powers of two).
  const float n = F == Format::kNvfp4 ? div_like_host(v, s) : div_pow2_like_host(v, s);
  // The sign is taken from n before the clamp: the clamp keeps it for every value, but LLVM may
  // canonicalise a NaN passing through the compare/select (max.NaN), which would drop the sign.
  const uint8_t sign = static_cast<uint8_t>((f32_to_bits(n) >> 31) << 7);
  if constexpr (F == Format::kFp8Window) {
    return n != n ? static_cast<uint8_t>(sign | 0x7Fu) : f32_to_fp8_e4m3(clamp(n, -448.0f, 448.0f));
  } else {
    return e2m1_code(clamp(n, -6.0f, 6.0f), sign != 0);
  }
}

// Quantises one element per lane; the lanes of an aligned group of block_of<F>() lanes form one
// quantisation block. Must be called by all 32 lanes of the warp (inactive lanes pass
// active = false and are ignored: a group is either entirely active or entirely inactive).
/// |v| as bits: for non-negative floats the unsigned order is the float order and every NaN lies
/// above +inf, so one max-reduction of these gives both a block's amax and whether it holds a NaN
/// (exact and order-independent: the group max equals the CPU's sequential max).
__device__ __forceinline__ uint32_t abs_bits(float v) { return f32_to_bits(v) & 0x7FFFFFFFu; }
/// The amax block_scale takes from a block's max abs_bits: the quiet NaN for a block with a NaN.
__device__ __forceinline__ float amax_of_bits(uint32_t m) {
  return m > 0x7F800000u ? f32_from_bits(0x7FC00000u) : f32_from_bits(m);
}

template <Format F>
__device__ __forceinline__ Quantized quantize_lane(float v, bool active) {
  constexpr int kB = block_of<F>();
  uint32_t m = active ? abs_bits(v) : 0u;
  if constexpr (kB == 32) {
    m = __reduce_max_sync(kFullMask, m);
  } else {
    for (int off = kB / 2; off > 0; off >>= 1) m = max(m, __shfl_xor_sync(kFullMask, m, off));
  }
  Quantized q;
  block_scale<F>(amax_of_bits(m), q);
  q.code = element_code<F>(v, q.s);
  return q;
}

/// Decodes element c of a packed row (data then scale codes).
template <Format F>
__device__ __forceinline__ float unpack_element(const uint8_t* row, int64_t dim, int64_t c) {
  constexpr int kB = block_of<F>();
  const uint8_t sc = row[data_bytes<F>(dim) + c / kB];
  const float s = F == Format::kNvfp4 ? fp8_e4m3_to_f32(sc) : e8m0_to_f32(sc);
  uint8_t code;
  if constexpr (F == Format::kFp8Window) {
    code = row[c];
  } else {
    code = (c & 1) ? fp4_unpack_hi(row[c / 2]) : fp4_unpack_lo(row[c / 2]);
  }
  return __fmul_rn(decode_element<F>(code), s);
}

/// Quantises element (r, c) held by this lane into `row` (the packed row of r). Must be called by
/// all 32 lanes of the warp on 32 consecutive elements of rows whose dim is a block multiple.
template <Format F>
__device__ __forceinline__ void pack_lane(float v, bool active, int64_t c, int64_t dim,
                                          uint8_t* row) {
  constexpr int kB = block_of<F>();
  const Quantized q = quantize_lane<F>(v, active);
  if constexpr (F == Format::kFp8Window) {
    if (active && row) row[c] = q.code;
  } else {
    const unsigned hi = __shfl_down_sync(kFullMask, static_cast<unsigned>(q.code), 1);
    if (active && row && (c & 1) == 0) row[c / 2] = fp4_pack(q.code, static_cast<uint8_t>(hi));
  }
  if (active && row && c % kB == 0) row[data_bytes<F>(dim) + c / kB] = q.scale_code;
}

}  // namespace dsv41rt::kernels::cuda::qdev
