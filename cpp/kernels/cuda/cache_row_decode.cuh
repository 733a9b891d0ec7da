// Device decode of stored cache rows (kernels/paged.h RowFormat) in pieces of 16 channels, for
// kernels that read the caches in place (attention_keys.cuh, indexer_tc.cu). A piece's bytes are
// loaded first (load_row_piece: one 16- or 8-byte load where the row's alignment allows it), then
// decoded (decode_row_piece), so a caller can keep several loads in flight before decoding. The
// values are kernels/quant.h's codecs bitwise (paged.h decode_row): code times scale, one FP32
// product. Internal to kernels/cuda.
#pragma once

#include <cstdint>

#include "core/dtype.h"
#include "kernels/cuda/bf16_bits.cuh"
#include "kernels/paged.h"

namespace dsv41rt::kernels::cuda {

// `bytes` (8 or 16) of a stored row at p, with the widest loads its alignment allows (a row's
// alignment is the same for all its pieces, so the branch is uniform over a warp's row).
// Rows that are not 8- / 16-byte aligned (small head dims): byte loads, out of line so that the
// callers' unrolled loops do not carry a copy of this loop each (kernel code size).
static __device__ __noinline__ uint4 load_piece_bytes(const uint8_t* p, int bytes) {
  uint32_t w[4] = {0u, 0u, 0u, 0u};
  for (int i = 0; i < bytes; ++i) w[i / 4] |= uint32_t(p[i]) << (8 * (i % 4));
  return make_uint4(w[0], w[1], w[2], w[3]);
}

__device__ __forceinline__ uint4 load_piece(const uint8_t* p, int bytes) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  if (bytes == 16 && a % 16 == 0) return *reinterpret_cast<const uint4*>(p);
  if (bytes == 8 && a % 8 == 0) {
    const uint2 v = *reinterpret_cast<const uint2*>(p);
    return make_uint4(v.x, v.y, 0u, 0u);
  }
  return load_piece_bytes(p, bytes);
}

__device__ __forceinline__ uint8_t byte_of(const uint4& r, int i) {
  const uint32_t w = i < 4 ? r.x : i < 8 ? r.y : i < 12 ? r.z : r.w;
  return static_cast<uint8_t>(w >> (8 * (i % 4)));
}

/// The codes and the scale code of channels [16 piece, + 16) of a stored row p of D channels in
/// format f (kFp8Window, kNvfp4 or kMxfp4; anything else leaves raw and sc zero).
__device__ __forceinline__ void load_row_piece(int f, const uint8_t* p, int piece, int D,
                                               uint4& raw, uint8_t& sc) {
  raw = make_uint4(0u, 0u, 0u, 0u);
  sc = 0;
  if (f == int(RowFormat::kFp8Window)) {
    raw = load_piece(p + piece * 16, 16);
    sc = p[D + piece / 2];
  } else if (f == int(RowFormat::kNvfp4) || f == int(RowFormat::kMxfp4)) {
    raw = load_piece(p + piece * 8, 8);
    sc = p[D / 2 + (f == int(RowFormat::kNvfp4) ? piece : piece / 2)];
  }
}

/// The 16 FP32 values of a piece load_row_piece loaded (zeros for another format).
__device__ __forceinline__ void decode_row_piece(int f, const uint4& raw, uint8_t sc, float v[16]) {
  if (f == int(RowFormat::kFp8Window)) {
    const float scale = e8m0_to_f32(sc);
#pragma unroll
    for (int e = 0; e < 16; ++e) v[e] = __fmul_rn(fp8_e4m3_to_f32(byte_of(raw, e)), scale);
  } else if (f == int(RowFormat::kNvfp4) || f == int(RowFormat::kMxfp4)) {
    const float scale = f == int(RowFormat::kNvfp4) ? fp8_e4m3_to_f32(sc) : e8m0_to_f32(sc);
#pragma unroll
    for (int e = 0; e < 16; ++e) {
      const uint8_t b = byte_of(raw, e / 2);
      const uint8_t code = (e & 1) ? fp4_unpack_hi(b) : fp4_unpack_lo(b);
      v[e] = __fmul_rn(fp4_e2m1_to_f32(code), scale);
    }
  } else {
#pragma unroll
    for (int e = 0; e < 16; ++e) v[e] = 0.0f;
  }
}

}  // namespace dsv41rt::kernels::cuda

namespace dsv41rt::kernels::cuda {

namespace row_bf16 {

using bits::bmul;
using bits::prmt;

// Both halves 2^k (a normal BF16: -126 <= k <= 127).
__device__ __forceinline__ uint32_t pow2x2(int k) { return uint32_t(k + 127) * 0x00800080u; }

// Whether a byte of w is an E4M3 NaN (magnitude 0x7F): +1 carries into bit 7 of that byte only.
__device__ __forceinline__ uint32_t e4m3_nan_bytes(uint32_t w) {
  return ((w & 0x7F7F7F7Fu) + 0x01010101u) & 0x80808080u;
}

}  // namespace row_bf16

/// The piece load_row_piece loaded as 8 BF16 pairs (pair i = channels 2i, 2i + 1, the first in
/// the low half), bitwise what rounding decode_row_piece's FP32 values to BF16 gives, by bit
/// placement instead of per-value conversions (~5 instructions per pair instead of ~40): an E4M3
/// byte's magnitude placed at bits 4-10 of a BF16 is its value * 2^-120, an E2M1 nibble's at
/// bits 6-8 its value * 2^-126 (subnormals included), and one exact BF16 multiply applies the
/// scale. Every product is a BF16 exactly (E4M3 x 2^k and E2M1 x E4M3 need <= 6 significant
/// bits), so rounding the FP32 product to BF16 gives the same bits. Returns false, writing
/// nothing, where that does not hold: NaN codes or scales, and scales whose products could leave
/// BF16's normal range (never in a cache written by the QDQ); the caller then takes the FP32 path.
/// Formats other than the three stored ones return false.
__device__ __forceinline__ bool decode_row_piece_bf16(int f, const uint4& raw, uint8_t sc,
                                                      uint32_t out[8]) {
  using row_bf16::bmul;
  using row_bf16::pow2x2;
  using row_bf16::prmt;
  if (f == int(RowFormat::kFp8Window)) {
    // value = code * 2^(sc - 127) = placed * 2^(sc - 7); results >= 2^-9 * 2^(sc - 127) stay
    // normal for sc >= 16, the multiplier is a normal BF16 for sc <= 134.
    if (sc < 16 || sc > 134) return false;
    const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
    if (row_bf16::e4m3_nan_bytes(w[0]) | row_bf16::e4m3_nan_bytes(w[1]) |
        row_bf16::e4m3_nan_bytes(w[2]) | row_bf16::e4m3_nan_bytes(w[3])) {
      return false;
    }
    const uint32_t m1 = pow2x2(int(sc) - 7);
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      // Bytes (0, 1) and (2, 3): magnitudes to bits 4-10 of each half, signs to bit 15 (the
      // selectors 8/9/A/B replicate a byte's sign bit).
      const uint32_t m = w[q] & 0x7F7F7F7Fu;
      const uint32_t lo = (prmt(m, 0, 0x4140u) << 4) | (prmt(w[q], 0, 0x9484u) & 0x80008000u);
      const uint32_t hi = (prmt(m, 0, 0x4342u) << 4) | (prmt(w[q], 0, 0xB4A4u) & 0x80008000u);
      out[2 * q] = bmul(lo, m1);
      out[2 * q + 1] = bmul(hi, m1);
    }
    return true;
  }
  if (f == int(RowFormat::kNvfp4) || f == int(RowFormat::kMxfp4)) {
    uint32_t m2;  // the scale as a BF16 pair, after the placed nibble's 2^126
    if (f == int(RowFormat::kMxfp4)) {
      // value = nibble * 2^(sc - 127): >= 2^-1 * 2^(sc - 127) is normal for sc >= 2.
      if (sc < 2 || sc > 254) return false;
      m2 = pow2x2(int(sc) - 127);
    } else {
      if ((sc & 0x7Fu) == 0x7Fu) return false;  // a NaN scale
      // An E4M3 scale is a BF16 exactly (placed like the window codes, times 2^120); nibble *
      // scale needs <= 6 significant bits and stays in [2^-10, 6 * 448]: a normal BF16.
      const uint32_t b = ((sc & 0x7Fu) << 4) | ((sc & 0x80u) << 8);
      m2 = bmul(b | (b << 16), pow2x2(120));
    }
    const uint32_t m1 = pow2x2(126);
    const uint32_t w[2] = {raw.x, raw.y};
#pragma unroll
    for (int q = 0; q < 2; ++q) {
      // Byte i holds channels 2i (low nibble) and 2i + 1: the even nibbles to the low halves, the
      // odd ones to the high halves; * 0x1040 puts a nibble's magnitude at bits 6-8 and its sign
      // at bit 15 of its half (selector 8 yields the zero top byte of a masked word).
      const uint32_t ev = w[q] & 0x0F0F0F0Fu, od = (w[q] >> 4) & 0x0F0F0F0Fu;
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const uint32_t sel = uint32_t(i) | 0x80u | (uint32_t(4 + i) << 8) | 0x8000u;
        const uint32_t placed = (prmt(ev, od, sel) * 0x1040u) & 0x81C081C0u;
        out[4 * q + i] = bmul(bmul(placed, m1), m2);
      }
    }
    return true;
  }
  return false;
}

}  // namespace dsv41rt::kernels::cuda
