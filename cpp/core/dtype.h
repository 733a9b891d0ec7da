// Element types and exact scalar conversions.
//
// The conversion functions below operate on raw codes (uint8_t / uint16_t), never on compiler
// half/fp8 types, so the same code gives bit-identical results on the host, in CUDA kernels
// (they are DSV41RT_HOST_DEVICE) and in tests. Rules:
//
//   bf16      decode exact. encode: round-to-nearest-even (RNE); NaN stays NaN (forced quiet,
//             sign kept); finite values that round past the max become +-inf (IEEE RNE).
//   f16       decode exact incl. subnormals. encode: RNE incl. subnormals; overflow -> +-inf;
//             NaN -> quiet NaN (0x7E00 | sign).
//   fp8 e4m3  OCP "e4m3fn": bias 7, no infinities, max normal 448, codes 0x7F/0xFF are NaN,
//             subnormals m * 2^-9. decode exact for all 256 codes. encode SATURATES: finite values
//             beyond +-448 (including those that would round above 448) and +-inf become +-448
//             (0x7E/0xFE); otherwise RNE (subnormals included). NaN -> 0x7F with the sign bit kept
//             (negative NaN -> 0xFF). Zero keeps its sign (-0 -> 0x80), and so do values that
//             round to zero.
//   e8m0      UE8M0 ("float8_e8m0fnu"): code e -> 2^(e-127) for e in 0..254 (code 0 is 2^-127,
//             NOT zero); 255 is NaN. encode(x) rounds UP to the next power of two (exact powers
//             map to themselves) and clamps the code to [0, 254]; x <= 0 (incl. -0) -> 0
//             (2^-127, the smallest scale), +inf -> 254, NaN -> 255.
//   fp4 e2m1  codes 0..15 -> [0, .5, 1, 1.5, 2, 3, 4, 6, -0, -.5, -1, -1.5, -2, -3, -4, -6].
//             encode clamps to +-6 and rounds to nearest with ties to the EVEN code (0.25 -> 0,
//             0.75 -> 1.0, 1.25 -> 1.0, 1.75 -> 2.0, 2.5 -> 2.0, 3.5 -> 4.0, 5.0 -> 4.0). A zero
//             result is always code 0 (positive zero, so -0.1 -> 0x0), and NaN -> code 0.
//             Packing: two codes per byte, the EVEN element in the LOW nibble.
#pragma once

#include <math.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "core/export.h"

#if defined(__CUDACC__)
#define DSV41RT_HOST_DEVICE __host__ __device__
#else
#define DSV41RT_HOST_DEVICE
#endif

namespace dsv41rt {

enum class DType { kF32, kBF16, kF16, kFP8E4M3, kE8M0, kFP4E2M1, kI8, kI32, kI64, kU8 };

inline constexpr DType kAllDTypes[] = {DType::kF32,  DType::kBF16,    DType::kF16, DType::kFP8E4M3,
                                       DType::kE8M0, DType::kFP4E2M1, DType::kI8,  DType::kI32,
                                       DType::kI64,  DType::kU8};

// "f32", "bf16", "f16", "fp8_e4m3", "e8m0", "fp4_e2m1", "i8", "i32", "i64", "u8".
DSV41RT_API const char* dtype_name(DType dtype);
// Inverse of dtype_name(); throws Error naming the unknown string.
DSV41RT_API DType dtype_from_name(std::string_view name);
// Safetensors dtype strings: F32, BF16, F16, F8_E4M3, F8_E8M0, I8, I32, I64, U8. Anything else
// (including BOOL, F64, I16, ...) throws Error naming the string. fp4 never appears in
// safetensors (packed fp4 is stored as I8/U8), so there is no name for it.
DSV41RT_API DType dtype_from_safetensors(std::string_view name);
// Throws Error for kFP4E2M1.
DSV41RT_API const char* safetensors_name(DType dtype);
// Bits per element: 4 for fp4 (packed two per byte), otherwise 8 * byte size.
DSV41RT_API int dtype_bits(DType dtype);
// Storage bytes for numel elements (fp4 rounds up to whole bytes). Throws Error on numel < 0 or
// overflow.
DSV41RT_API int64_t bytes_for(DType dtype, int64_t numel);

// Host array conversions. For fp4, `src`/`dst` hold ceil(n/2) packed bytes (even element in the
// low nibble; for odd n the last high nibble is ignored on decode and written as 0 on encode).
// decode supports every dtype (integers are converted with a plain cast); encode supports f32,
// bf16, f16, fp8_e4m3, e8m0 and fp4_e2m1 and throws Error(kUnsupported) otherwise.
DSV41RT_API void decode_to_f32(DType dtype, const void* src, int64_t n, float* dst);
DSV41RT_API void encode_from_f32(DType dtype, const float* src, int64_t n, void* dst);

// ---- Scalar conversions (header-only, host and device) --------------------------------------

DSV41RT_HOST_DEVICE inline uint32_t f32_to_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
#endif
}

DSV41RT_HOST_DEVICE inline float f32_from_bits(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
#endif
}

// Rounds `value >> shift` to nearest, ties to even (shift in 1..31).
DSV41RT_HOST_DEVICE inline uint32_t shift_right_rne(uint32_t value, int shift) {
  const uint32_t kept = value >> shift;
  const uint32_t rem = value & ((1u << shift) - 1u);
  const uint32_t half = 1u << (shift - 1);
  return kept + ((rem > half || (rem == half && (kept & 1u))) ? 1u : 0u);
}

// ---- bf16 ----

DSV41RT_HOST_DEVICE inline float bf16_to_f32(uint16_t code) {
  return f32_from_bits(static_cast<uint32_t>(code) << 16);
}

DSV41RT_HOST_DEVICE inline uint16_t f32_to_bf16(float value) {
  const uint32_t bits = f32_to_bits(value);
  if ((bits & 0x7FFFFFFFu) > 0x7F800000u) {
    return static_cast<uint16_t>((bits >> 16) | 0x0040u);  // quiet NaN, sign and payload top kept
  }
  // Adding 0x7FFF plus the lsb of the kept part implements RNE; a carry out of the mantissa
  // correctly bumps the exponent (up to infinity).
  const uint32_t rounded = bits + 0x7FFFu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(rounded >> 16);
}

// ---- f16 ----

DSV41RT_HOST_DEVICE inline float f16_to_f32(uint16_t code) {
  const uint32_t sign = static_cast<uint32_t>(code & 0x8000u) << 16;
  const uint32_t exp = (code >> 10) & 0x1Fu;
  const uint32_t mant = code & 0x3FFu;
  if (exp == 0) {
    // Zero or subnormal: mant * 2^-24 is exact in f32.
    const float mag = static_cast<float>(mant) * 5.9604644775390625e-08f;
    return sign ? -mag : mag;
  }
  if (exp == 31) return f32_from_bits(sign | 0x7F800000u | (mant << 13));
  return f32_from_bits(sign | ((exp + 112u) << 23) | (mant << 13));
}

DSV41RT_HOST_DEVICE inline uint16_t f32_to_f16(float value) {
  const uint32_t bits = f32_to_bits(value);
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  const uint32_t abs_bits = bits & 0x7FFFFFFFu;
  if (abs_bits > 0x7F800000u) return static_cast<uint16_t>(sign | 0x7E00u);
  if (abs_bits == 0x7F800000u) return static_cast<uint16_t>(sign | 0x7C00u);
  const int exp = static_cast<int>(abs_bits >> 23) - 127;
  if (exp > 15) return static_cast<uint16_t>(sign | 0x7C00u);
  if (exp >= -14) {
    // Normal range. A rounding carry may propagate into the exponent, reaching 0x7C00 (inf) for
    // values >= 65520, which is the IEEE RNE result.
    const uint32_t mant = abs_bits & 0x7FFFFFu;
    const uint32_t h = (static_cast<uint32_t>(exp + 15) << 10) | (mant >> 13);
    const uint32_t rem = mant & 0x1FFFu;
    const uint32_t rounded = h + ((rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ? 1u : 0u);
    return static_cast<uint16_t>(sign | rounded);
  }
  if (exp < -25) return sign;  // below half the smallest subnormal (2^-25): rounds to zero
  // Subnormal: value = sig * 2^(exp-23) in units of 2^-24 is sig >> (-1 - exp). Rounding up to
  // 0x400 yields the smallest normal, which is the correct encoding.
  const uint32_t sig = (abs_bits & 0x7FFFFFu) | 0x800000u;
  return static_cast<uint16_t>(sign | shift_right_rne(sig, -1 - exp));
}

// ---- fp8 e4m3 (e4m3fn) ----

inline constexpr float kFp8E4M3Max = 448.0f;

DSV41RT_HOST_DEVICE inline bool fp8_e4m3_is_nan(uint8_t code) { return (code & 0x7Fu) == 0x7Fu; }

DSV41RT_HOST_DEVICE inline float fp8_e4m3_to_f32(uint8_t code) {
  const uint32_t sign = static_cast<uint32_t>(code & 0x80u) << 24;
  const uint32_t exp = (code >> 3) & 0xFu;
  const uint32_t mant = code & 0x7u;
  if ((code & 0x7Fu) == 0x7Fu) return f32_from_bits(sign | 0x7FC00000u);
  if (exp == 0) {
    const float mag = static_cast<float>(mant) * 0.001953125f;  // mant * 2^-9, exact
    return sign ? -mag : mag;
  }
  return f32_from_bits(sign | ((exp + 120u) << 23) | (mant << 20));
}

DSV41RT_HOST_DEVICE inline uint8_t f32_to_fp8_e4m3(float value) {
  const uint32_t bits = f32_to_bits(value);
  const uint8_t sign = static_cast<uint8_t>((bits >> 24) & 0x80u);
  const uint32_t abs_bits = bits & 0x7FFFFFFFu;
  if (abs_bits > 0x7F800000u) return static_cast<uint8_t>(sign | 0x7Fu);
  if (abs_bits >= 0x43E00000u) return static_cast<uint8_t>(sign | 0x7Eu);  // >= 448 or inf
  const int exp = static_cast<int>(abs_bits >> 23) - 127;
  if (exp >= -6) {
    const uint32_t mant = abs_bits & 0x7FFFFFu;
    const uint32_t c = (static_cast<uint32_t>(exp + 7) << 3) | (mant >> 20);
    const uint32_t rem = mant & 0xFFFFFu;
    uint32_t rounded = c + ((rem > 0x80000u || (rem == 0x80000u && (c & 1u))) ? 1u : 0u);
    // Values below 448 round at most to 448 (0x7E); keep the clamp as a guard against NaN code.
    if (rounded > 0x7Eu) rounded = 0x7Eu;
    return static_cast<uint8_t>(sign | rounded);
  }
  if (exp < -10) return sign;  // below half the smallest subnormal (2^-10): rounds to zero
  // Subnormal: units of 2^-9 -> sig >> (14 - exp). Rounding up to 8 gives the smallest normal.
  const uint32_t sig = (abs_bits & 0x7FFFFFu) | 0x800000u;
  return static_cast<uint8_t>(sign | shift_right_rne(sig, 14 - exp));
}

// ---- e8m0 (UE8M0) ----

inline constexpr uint8_t kE8M0Nan = 0xFF;
inline constexpr uint8_t kE8M0One = 127;

DSV41RT_HOST_DEVICE inline float e8m0_to_f32(uint8_t code) {
  if (code == 0xFFu) return f32_from_bits(0x7FC00000u);
  if (code == 0) return f32_from_bits(0x00400000u);  // 2^-127 is an f32 subnormal
  return f32_from_bits(static_cast<uint32_t>(code) << 23);
}

// Code for 2^k, clamped to [0, 254] (2^-127 .. 2^127).
DSV41RT_HOST_DEVICE inline uint8_t e8m0_from_exponent(int k) {
  const int code = k + 127;
  return static_cast<uint8_t>(code < 0 ? 0 : (code > 254 ? 254 : code));
}

// Code of the smallest power of two >= x, clamped to [0, 254]. Exact (frexp, no log2
// rounding): used by quantisers computing scale = 2^ceil(log2(amax / 448)). x <= 0 -> 0,
// +inf -> 254, NaN -> 255.
DSV41RT_HOST_DEVICE inline uint8_t e8m0_ceil_pow2(float x) {
  if (x != x) return kE8M0Nan;
  if (!(x > 0.0f)) return 0;
  if (x > 3.4028234663852886e+38f) return 254;  // +inf
  int e = 0;
  const float frac = frexpf(x, &e);  // x = frac * 2^e, frac in [0.5, 1)
  const int k = (frac == 0.5f) ? e - 1 : e;
  return e8m0_from_exponent(k);
}

// General encode: rounds up to the next power of two (see e8m0_ceil_pow2).
DSV41RT_HOST_DEVICE inline uint8_t f32_to_e8m0(float x) { return e8m0_ceil_pow2(x); }

// ---- fp4 e2m1 ----

DSV41RT_HOST_DEVICE inline float fp4_e2m1_to_f32(uint8_t code) {
  // Magnitudes for codes 0..7 are 0, .5, 1, 1.5, 2, 3, 4, 6.
  const uint32_t mag_code = code & 0x7u;
  const uint32_t exp = mag_code >> 1;
  const uint32_t mant = mag_code & 1u;
  const float mag = exp == 0
                        ? 0.5f * static_cast<float>(mant)
                        : static_cast<float>(2u + mant) * static_cast<float>(1u << exp) * 0.25f;
  return (code & 0x8u) ? -mag : mag;
}

DSV41RT_HOST_DEVICE inline uint8_t f32_to_fp4_e2m1(float value) {
  if (value != value) return 0;
  const float a = value < 0.0f ? -value : value;
  // Decision boundaries are the midpoints; at a midpoint the even code wins, hence the mix of
  // <= (even code below) and < (odd code below).
  uint8_t c;
  if (a <= 0.25f) {
    c = 0;
  } else if (a < 0.75f) {
    c = 1;
  } else if (a <= 1.25f) {
    c = 2;
  } else if (a < 1.75f) {
    c = 3;
  } else if (a <= 2.5f) {
    c = 4;
  } else if (a < 3.5f) {
    c = 5;
  } else if (a <= 5.0f) {
    c = 6;
  } else {
    c = 7;  // includes clamping of everything above 6 and inf
  }
  if (c != 0 && value < 0.0f) c = static_cast<uint8_t>(c | 0x8u);
  return c;
}

DSV41RT_HOST_DEVICE inline uint8_t fp4_pack(uint8_t lo, uint8_t hi) {
  return static_cast<uint8_t>((lo & 0xFu) | ((hi & 0xFu) << 4));
}
DSV41RT_HOST_DEVICE inline uint8_t fp4_unpack_lo(uint8_t byte) {
  return static_cast<uint8_t>(byte & 0xFu);
}
DSV41RT_HOST_DEVICE inline uint8_t fp4_unpack_hi(uint8_t byte) {
  return static_cast<uint8_t>(byte >> 4);
}

}  // namespace dsv41rt
