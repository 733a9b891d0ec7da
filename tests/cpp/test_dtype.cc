// Exhaustive / edge-case tests of the scalar conversions in core/dtype.h. Reference values are
// computed independently from the format definitions (sign/exponent/mantissa with ldexp), not by
// calling the code under test.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/status.h"

namespace dsv41rt {
namespace {

uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
float float_of(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
bool same_bits(float a, float b) { return bits_of(a) == bits_of(b); }

// OCP e4m3fn reference: bias 7, subnormal m * 2^-9, S.1111.111 = NaN.
double e4m3_reference(int code) {
  const int s = code >> 7, e = (code >> 3) & 15, m = code & 7;
  if (e == 15 && m == 7) return std::numeric_limits<double>::quiet_NaN();
  const double mag = e == 0 ? std::ldexp(m, -9) : std::ldexp(8 + m, e - 10);
  return s ? -mag : mag;
}

double f16_reference(int code) {
  const int s = code >> 15, e = (code >> 10) & 31, m = code & 1023;
  double mag;
  if (e == 31) {
    mag = m ? std::numeric_limits<double>::quiet_NaN() : std::numeric_limits<double>::infinity();
  } else if (e == 0) {
    mag = std::ldexp(m, -24);
  } else {
    mag = std::ldexp(1024 + m, e - 25);
  }
  return s ? -mag : mag;
}

// ---- fp8 e4m3 ----

// A safetensors tensor may start at any byte (after a 1-byte UE8M0 scale): 16-bit values at an odd
// address decode as at an aligned one (the ASan/UBSan build fails an unaligned load here).
TEST(DecodeToF32, SixteenBitValuesAtAnOddAddress) {
  const uint16_t values[] = {0x3F80, 0xC000, 0x0001, 0x7F80, 0x3C00};
  std::vector<uint8_t> bytes(1 + sizeof(values));
  std::memcpy(bytes.data() + 1, values, sizeof(values));
  for (DType t : {DType::kBF16, DType::kF16}) {
    float aligned[5], odd[5];
    decode_to_f32(t, values, 5, aligned);
    decode_to_f32(t, bytes.data() + 1, 5, odd);
    EXPECT_EQ(std::memcmp(aligned, odd, sizeof(odd)), 0);
  }
  float bf[1];
  decode_to_f32(DType::kBF16, bytes.data() + 1, 1, bf);
  EXPECT_EQ(bf[0], 1.0f);
}

TEST(Fp8E4M3, AllCodesDecodeExactlyAndRoundTrip) {
  int nan_count = 0;
  for (int code = 0; code < 256; ++code) {
    const double ref = e4m3_reference(code);
    const float got = fp8_e4m3_to_f32(static_cast<uint8_t>(code));
    if (std::isnan(ref)) {
      EXPECT_TRUE(std::isnan(got)) << "code " << code;
      EXPECT_TRUE(fp8_e4m3_is_nan(static_cast<uint8_t>(code)));
      ++nan_count;
      continue;
    }
    EXPECT_EQ(static_cast<double>(got), ref) << "code " << code;
    EXPECT_EQ(std::signbit(got), (code & 0x80) != 0) << "code " << code;  // covers -0
    EXPECT_EQ(f32_to_fp8_e4m3(got), code) << "code " << code;
  }
  EXPECT_EQ(nan_count, 2);
  EXPECT_EQ(fp8_e4m3_to_f32(0x7E), 448.0f);
  EXPECT_EQ(fp8_e4m3_to_f32(0x01), std::ldexp(1.0f, -9));
  EXPECT_EQ(fp8_e4m3_to_f32(0x08), std::ldexp(1.0f, -6));
}

TEST(Fp8E4M3, MidpointsRoundToEvenBothDirections) {
  int ties_up = 0, ties_down = 0;
  for (int c = 0; c < 0x7E; ++c) {
    const float lo = static_cast<float>(e4m3_reference(c));
    const float hi = static_cast<float>(e4m3_reference(c + 1));
    const float mid = (lo + hi) / 2;  // exact: at most 5 significant bits
    ASSERT_EQ(static_cast<double>(mid), (e4m3_reference(c) + e4m3_reference(c + 1)) / 2);
    const int even = (c % 2 == 0) ? c : c + 1;
    (even == c ? ties_down : ties_up)++;
    EXPECT_EQ(f32_to_fp8_e4m3(mid), even) << "mid between codes " << c << " and " << c + 1;
    EXPECT_EQ(f32_to_fp8_e4m3(-mid), even | 0x80) << "negative mid " << c;
    EXPECT_EQ(f32_to_fp8_e4m3(std::nextafter(mid, 0.0f)), c) << "just below mid " << c;
    EXPECT_EQ(f32_to_fp8_e4m3(std::nextafter(mid, 1e9f)), c + 1) << "just above mid " << c;
  }
  EXPECT_GT(ties_up, 50);
  EXPECT_GT(ties_down, 50);
}

TEST(Fp8E4M3, Saturation) {
  for (float v : {448.0f, 449.0f, 463.99f, 464.0f, 470.0f, 480.0f, 1e9f,
                  std::numeric_limits<float>::max(), std::numeric_limits<float>::infinity()}) {
    EXPECT_EQ(f32_to_fp8_e4m3(v), 0x7E) << v;
    EXPECT_EQ(f32_to_fp8_e4m3(-v), 0xFE) << -v;
  }
  // Just below 448 rounds to 448 or 416 normally.
  EXPECT_EQ(f32_to_fp8_e4m3(447.0f), 0x7E);
  EXPECT_EQ(f32_to_fp8_e4m3(431.0f), 0x7D);  // 416 + 15 < midpoint 432
  EXPECT_EQ(f32_to_fp8_e4m3(432.0f), 0x7E);  // tie 416 (0x7D, odd) / 448 (0x7E, even)
}

TEST(Fp8E4M3, NanZeroAndSubnormals) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(f32_to_fp8_e4m3(nan), 0x7F);
  EXPECT_EQ(f32_to_fp8_e4m3(-nan), 0xFF);
  EXPECT_EQ(f32_to_fp8_e4m3(0.0f), 0x00);
  EXPECT_EQ(f32_to_fp8_e4m3(-0.0f), 0x80);
  const float sub = std::ldexp(1.0f, -9);     // smallest subnormal
  EXPECT_EQ(f32_to_fp8_e4m3(sub / 2), 0x00);  // tie with 0 -> even (0)
  EXPECT_EQ(f32_to_fp8_e4m3(std::nextafter(sub / 2, 1.0f)), 0x01);
  EXPECT_EQ(f32_to_fp8_e4m3(sub / 4), 0x00);
  EXPECT_EQ(f32_to_fp8_e4m3(1e-30f), 0x00);
  EXPECT_EQ(f32_to_fp8_e4m3(-1e-30f), 0x80);
  EXPECT_EQ(f32_to_fp8_e4m3(std::numeric_limits<float>::denorm_min()), 0x00);
  EXPECT_EQ(f32_to_fp8_e4m3(1.5f * sub), 0x02);  // tie 1/2 -> 2
  EXPECT_EQ(f32_to_fp8_e4m3(2.5f * sub), 0x02);  // tie 2/3 -> 2
  EXPECT_EQ(f32_to_fp8_e4m3(7.5f * sub), 0x08);  // tie 7/8 -> smallest normal
  EXPECT_EQ(f32_to_fp8_e4m3(2.4f * sub), 0x02);
  EXPECT_EQ(f32_to_fp8_e4m3(2.6f * sub), 0x03);
}

// ---- fp4 e2m1 ----

TEST(Fp4E2M1, AllCodes) {
  const float table[16] = {0, .5f, 1, 1.5f, 2, 3, 4, 6, -0.0f, -.5f, -1, -1.5f, -2, -3, -4, -6};
  for (int c = 0; c < 16; ++c) {
    const float v = fp4_e2m1_to_f32(static_cast<uint8_t>(c));
    EXPECT_TRUE(same_bits(v, table[c])) << "code " << c << " -> " << v;
    EXPECT_EQ(f32_to_fp4_e2m1(v), c == 8 ? 0 : c) << "code " << c;
  }
}

TEST(Fp4E2M1, TiesToEvenCodeAndClamp) {
  struct Case {
    float in;
    int code;
  };
  const Case cases[] = {{0.25f, 0},
                        {0.75f, 2},
                        {1.25f, 2},
                        {1.75f, 4},
                        {2.5f, 4},
                        {3.5f, 6},
                        {5.0f, 6},
                        {0.26f, 1},
                        {0.74f, 1},
                        {1.3f, 3},
                        {1.7f, 3},
                        {2.6f, 5},
                        {3.4f, 5},
                        {5.1f, 7},
                        {6.5f, 7},
                        {1e9f, 7},
                        {std::numeric_limits<float>::infinity(), 7},
                        {-0.25f, 0},
                        {-0.75f, 10},
                        {-5.0f, 14},
                        {-100.0f, 15},
                        {-std::numeric_limits<float>::infinity(), 15},
                        {-0.1f, 0},
                        {-0.0f, 0}};
  for (const Case& c : cases) EXPECT_EQ(f32_to_fp4_e2m1(c.in), c.code) << "input " << c.in;
  EXPECT_EQ(f32_to_fp4_e2m1(std::numeric_limits<float>::quiet_NaN()), 0);
}

TEST(Fp4E2M1, PackingEvenElementInLowNibble) {
  EXPECT_EQ(fp4_pack(0x2, 0xC), 0xC2);
  EXPECT_EQ(fp4_unpack_lo(0xC2), 0x2);
  EXPECT_EQ(fp4_unpack_hi(0xC2), 0xC);
  const float values[3] = {1.0f, -2.0f, 6.0f};
  uint8_t packed[2] = {0xAA, 0xAA};
  encode_from_f32(DType::kFP4E2M1, values, 3, packed);
  EXPECT_EQ(packed[0], 0xC2);
  EXPECT_EQ(packed[1], 0x07);  // odd tail: high nibble zeroed
  float back[3];
  decode_to_f32(DType::kFP4E2M1, packed, 3, back);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(back[i], values[i]);
}

// ---- e8m0 ----

TEST(E8M0, EdgeCodes) {
  EXPECT_EQ(e8m0_to_f32(0), std::ldexp(1.0f, -127));
  EXPECT_GT(e8m0_to_f32(0), 0.0f);  // code 0 is NOT zero
  EXPECT_EQ(e8m0_to_f32(1), std::ldexp(1.0f, -126));
  EXPECT_EQ(e8m0_to_f32(127), 1.0f);
  EXPECT_EQ(e8m0_to_f32(254), std::ldexp(1.0f, 127));
  EXPECT_TRUE(std::isnan(e8m0_to_f32(255)));
  for (int c = 0; c < 255; ++c) {
    EXPECT_EQ(e8m0_to_f32(static_cast<uint8_t>(c)), std::ldexp(1.0f, c - 127)) << c;
    EXPECT_EQ(f32_to_e8m0(std::ldexp(1.0f, c - 127)), c) << c;
  }
}

TEST(E8M0, CeilPow2) {
  for (int k = -127; k <= 127; ++k) {
    const float p = std::ldexp(1.0f, k);
    EXPECT_EQ(e8m0_ceil_pow2(p), k + 127) << "2^" << k;
    EXPECT_EQ(e8m0_ceil_pow2(std::nextafter(p, 0.0f)), k + 127) << "just below 2^" << k;
    EXPECT_EQ(e8m0_ceil_pow2(std::nextafter(p, INFINITY)), std::min(k + 128, 254))
        << "just above 2^" << k;
  }
  EXPECT_EQ(e8m0_ceil_pow2(3.0f), 129);
  EXPECT_EQ(e8m0_ceil_pow2(448.0f / 448.0f), 127);
  EXPECT_EQ(e8m0_ceil_pow2(449.0f / 448.0f), 128);
  EXPECT_EQ(e8m0_ceil_pow2(std::numeric_limits<float>::denorm_min()), 0);  // clamped
  EXPECT_EQ(e8m0_ceil_pow2(1e-40f), 0);
  EXPECT_EQ(e8m0_ceil_pow2(0.0f), 0);
  EXPECT_EQ(e8m0_ceil_pow2(-5.0f), 0);
  EXPECT_EQ(e8m0_ceil_pow2(std::numeric_limits<float>::infinity()), 254);
  EXPECT_EQ(e8m0_ceil_pow2(std::numeric_limits<float>::max()), 254);
  EXPECT_EQ(e8m0_ceil_pow2(std::numeric_limits<float>::quiet_NaN()), 255);
  EXPECT_EQ(e8m0_from_exponent(0), 127);
  EXPECT_EQ(e8m0_from_exponent(-127), 0);
  EXPECT_EQ(e8m0_from_exponent(127), 254);
  EXPECT_EQ(e8m0_from_exponent(-500), 0);
  EXPECT_EQ(e8m0_from_exponent(500), 254);
}

// ---- bf16 ----

TEST(BF16, RoundToNearestEven) {
  EXPECT_EQ(f32_to_bf16(float_of(0x3F808000u)), 0x3F80);  // tie, even kept
  EXPECT_EQ(f32_to_bf16(float_of(0x3F818000u)), 0x3F82);  // tie, odd rounds up
  EXPECT_EQ(f32_to_bf16(float_of(0x3F808001u)), 0x3F81);
  EXPECT_EQ(f32_to_bf16(float_of(0x3F807FFFu)), 0x3F80);
  EXPECT_EQ(f32_to_bf16(float_of(0xBF818000u)), 0xBF82);
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3F80);
  EXPECT_EQ(f32_to_bf16(-0.0f), 0x8000);
}

TEST(BF16, NanAndOverflow) {
  const uint16_t qnan = f32_to_bf16(std::numeric_limits<float>::quiet_NaN());
  EXPECT_TRUE(std::isnan(bf16_to_f32(qnan)));
  // A signalling NaN whose payload lives only in the low bits must not become infinity.
  const uint16_t snan = f32_to_bf16(float_of(0x7F800001u));
  EXPECT_TRUE(std::isnan(bf16_to_f32(snan)));
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(float_of(0xFF800001u)))));
  EXPECT_EQ(f32_to_bf16(std::numeric_limits<float>::max()), 0x7F80);  // rounds to +inf
  EXPECT_EQ(f32_to_bf16(-std::numeric_limits<float>::max()), 0xFF80);
  EXPECT_EQ(f32_to_bf16(float_of(0x7F7F7FFFu)), 0x7F7F);
  EXPECT_EQ(f32_to_bf16(std::numeric_limits<float>::infinity()), 0x7F80);
}

TEST(BF16, AllCodesRoundTrip) {
  for (int c = 0; c < 65536; ++c) {
    const float v = bf16_to_f32(static_cast<uint16_t>(c));
    ASSERT_EQ(bits_of(v), static_cast<uint32_t>(c) << 16);
    if (std::isnan(v)) {
      EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(v))));
    } else {
      ASSERT_EQ(f32_to_bf16(v), c) << c;
    }
  }
}

// ---- f16 ----

TEST(F16, AllCodesDecodeAndRoundTrip) {
  for (int c = 0; c < 65536; ++c) {
    const double ref = f16_reference(c);
    const float v = f16_to_f32(static_cast<uint16_t>(c));
    if (std::isnan(ref)) {
      ASSERT_TRUE(std::isnan(v)) << c;
      ASSERT_TRUE(std::isnan(f16_to_f32(f32_to_f16(v)))) << c;
      continue;
    }
    ASSERT_EQ(static_cast<double>(v), ref) << c;
    ASSERT_EQ(std::signbit(v), (c & 0x8000) != 0) << c;
    ASSERT_EQ(f32_to_f16(v), c) << c;
  }
}

TEST(F16, SubnormalsOverflowTies) {
  const float tiny = std::ldexp(1.0f, -24);
  EXPECT_EQ(f32_to_f16(tiny), 0x0001);
  EXPECT_EQ(f32_to_f16(tiny / 2), 0x0000);  // tie -> even
  EXPECT_EQ(f32_to_f16(std::nextafter(tiny / 2, 1.0f)), 0x0001);
  EXPECT_EQ(f32_to_f16(1.5f * tiny), 0x0002);
  EXPECT_EQ(f32_to_f16(2.5f * tiny), 0x0002);
  EXPECT_EQ(f32_to_f16(-tiny / 4), 0x8000);
  EXPECT_EQ(f32_to_f16(1023.5f * tiny), 0x0400);  // tie rounds up into the smallest normal
  EXPECT_EQ(f32_to_f16(65504.0f), 0x7BFF);
  EXPECT_EQ(f32_to_f16(65519.0f), 0x7BFF);
  EXPECT_EQ(f32_to_f16(65520.0f), 0x7C00);  // tie with odd max -> inf
  EXPECT_EQ(f32_to_f16(1e9f), 0x7C00);
  EXPECT_EQ(f32_to_f16(-1e9f), 0xFC00);
  EXPECT_EQ(f32_to_f16(1.0f + std::ldexp(1.0f, -11)), 0x3C00);  // tie, even kept
  EXPECT_EQ(f32_to_f16(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3C02);
  EXPECT_EQ(f32_to_f16(std::numeric_limits<float>::quiet_NaN()) & 0x7C00, 0x7C00);
  EXPECT_NE(f32_to_f16(std::numeric_limits<float>::quiet_NaN()) & 0x3FF, 0);
}

#if defined(__FLT16_MAX__)
// Cross-check random f32 bit patterns against the compiler's own f32 -> _Float16 conversion.
TEST(F16, MatchesCompilerFloat16OnRandomInputs) {
  std::mt19937 rng(1234);
  for (int i = 0; i < 200000; ++i) {
    const float v = float_of(rng());
    if (std::isnan(v)) continue;
    const _Float16 h = static_cast<_Float16>(v);
    uint16_t ref;
    std::memcpy(&ref, &h, 2);
    ASSERT_EQ(f32_to_f16(v), ref) << "bits 0x" << std::hex << bits_of(v);
  }
}
#endif

// ---- names and sizes ----

TEST(DTypeNames, RoundTripAndSafetensors) {
  const char* names[] = {"f32",      "bf16", "f16", "fp8_e4m3", "e8m0",
                         "fp4_e2m1", "i8",   "i32", "i64",      "u8"};
  int i = 0;
  for (DType d : kAllDTypes) {
    EXPECT_STREQ(dtype_name(d), names[i++]);
    EXPECT_EQ(dtype_from_name(dtype_name(d)), d);
    if (d != DType::kFP4E2M1) {
      EXPECT_EQ(dtype_from_safetensors(safetensors_name(d)), d);
    }
  }
  EXPECT_EQ(dtype_from_safetensors("F8_E4M3"), DType::kFP8E4M3);
  EXPECT_EQ(dtype_from_safetensors("F8_E8M0"), DType::kE8M0);
  EXPECT_THROW(safetensors_name(DType::kFP4E2M1), Error);
  for (const char* bad : {"BOOL", "F64", "I16", "f32", ""}) {
    try {
      dtype_from_safetensors(bad);
      ADD_FAILURE() << "accepted " << bad;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(std::string("'") + bad + "'"), std::string::npos)
          << e.what();
    }
  }
}

TEST(DTypeNames, BitsAndBytes) {
  EXPECT_EQ(dtype_bits(DType::kFP4E2M1), 4);
  EXPECT_EQ(dtype_bits(DType::kBF16), 16);
  EXPECT_EQ(dtype_bits(DType::kI64), 64);
  EXPECT_EQ(bytes_for(DType::kFP4E2M1, 7), 4);
  EXPECT_EQ(bytes_for(DType::kFP4E2M1, 8), 4);
  EXPECT_EQ(bytes_for(DType::kF32, 3), 12);
  EXPECT_EQ(bytes_for(DType::kU8, 0), 0);
  EXPECT_THROW(bytes_for(DType::kF32, -1), Error);
  EXPECT_THROW(bytes_for(DType::kI64, std::numeric_limits<int64_t>::max() / 4), Error);
}

TEST(ArrayHelpers, EncodeDecodeAllFormats) {
  const std::vector<float> in = {0.0f, 1.0f, -2.5f, 448.0f, 1000.0f, 0.1f};
  std::vector<uint16_t> u16(in.size());
  std::vector<uint8_t> u8(in.size());
  std::vector<float> out(in.size());
  encode_from_f32(DType::kBF16, in.data(), 6, u16.data());
  decode_to_f32(DType::kBF16, u16.data(), 6, out.data());
  for (size_t i = 0; i < in.size(); ++i) EXPECT_EQ(out[i], bf16_to_f32(f32_to_bf16(in[i])));
  encode_from_f32(DType::kFP8E4M3, in.data(), 6, u8.data());
  EXPECT_EQ(u8[4], 0x7E);  // 1000 saturates
  decode_to_f32(DType::kFP8E4M3, u8.data(), 6, out.data());
  EXPECT_EQ(out[4], 448.0f);
  EXPECT_EQ(out[2], -2.5f);
  encode_from_f32(DType::kF16, in.data(), 6, u16.data());
  decode_to_f32(DType::kF16, u16.data(), 6, out.data());
  EXPECT_EQ(out[4], 1000.0f);
  const int32_t ints[3] = {-7, 0, 1 << 20};
  decode_to_f32(DType::kI32, ints, 3, out.data());
  EXPECT_EQ(out[0], -7.0f);
  EXPECT_EQ(out[2], 1048576.0f);
  EXPECT_THROW(encode_from_f32(DType::kI32, in.data(), 3, u8.data()), Error);
}

}  // namespace
}  // namespace dsv41rt
