#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "core/dtype.h"
#include "core/status.h"
#include "kernels/quant.h"

namespace dsv41rt::kernels::cpu {
namespace {

uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

std::vector<float> poisoned(size_t n) { return std::vector<float>(n, std::nanf("")); }

// ---- FP8 window ----

TEST(QuantFp8Window, PowerOfTwoScaleAndRounding) {
  std::vector<float> x(32, 0.0f), y = poisoned(32);
  x[0] = 448.0f;  // amax * f32(1/448) == 1 exactly -> scale 1
  x[1] = 1.0f;
  x[2] = -1.1f;   // E4M3 step 0.125 near 1 -> -1.125
  x[3] = 300.0f;  // step 32 in [256, 512) -> 288
  x[4] = -0.0f;
  fp8_window_qdq(x.data(), 1, 32, y.data());
  EXPECT_EQ(y[0], 448.0f);
  EXPECT_EQ(y[1], 1.0f);
  EXPECT_EQ(y[2], -1.125f);
  EXPECT_EQ(y[3], 288.0f);
  EXPECT_EQ(bits(y[4]), 0x80000000u);  // -0 kept
  for (int i = 5; i < 32; ++i) EXPECT_EQ(bits(y[i]), 0u);
  std::vector<uint8_t> p(fp8_window_row_bytes(32));
  fp8_window_pack(x.data(), 1, 32, p.data());
  EXPECT_EQ(p[0], 0x7E);  // +448 saturates the E4M3 range exactly
  EXPECT_EQ(p[32], 127);  // scale 2^0 follows the data
}

TEST(QuantFp8Window, AmaxJustAbovePowerOfTwoDoublesScale) {
  std::vector<float> x(32, 0.0f), y = poisoned(32);
  x[0] = -std::nextafter(448.0f, 1000.0f);  // * f32(1/448) = 1.0000001 -> scale 2
  x[1] = 3.0f;
  fp8_window_qdq(x.data(), 1, 32, y.data());
  EXPECT_EQ(y[0], -448.0f);  // 224.00002 -> 224 -> * 2
  EXPECT_EQ(y[1], 3.0f);
  x[0] = 3.5f;  // 3.5 * f32(1/448) == 2^-7 exactly
  x[1] = 1.0f / 3.0f;
  fp8_window_qdq(x.data(), 1, 32, y.data());
  EXPECT_EQ(y[0], 3.5f);
  // 1/3 / 2^-7 = 42.67 -> E4M3 step 4 in [32, 64) -> 44 -> 44 * 2^-7
  EXPECT_EQ(y[1], 44.0f / 128.0f);
}

// The GEMM activation QDQ of precision "fp8" (spec 5.2): BF16 first, then the fp8 window codec.
TEST(QuantFp8Act, RoundsToBf16BeforeFp8) {
  std::vector<float> x(32, 0.0f), act = poisoned(32), direct = poisoned(32);
  x[0] = 300.0f;                 // block scale 1 (amax in (224, 448])
  x[1] = 1.0625f + 0x1p-12f;     // above the E4M3 tie 1.0625: direct rounding gives 1.125,
  x[2] = -(1.0625f + 0x1p-12f);  // but BF16 first lands on the tie, which goes to even 1.0
  x[3] = 2.5f;                   // exact in both
  fp8_act_qdq(x.data(), 1, 32, act.data());
  fp8_window_qdq(x.data(), 1, 32, direct.data());
  EXPECT_EQ(direct[1], 1.125f);
  EXPECT_EQ(act[1], 1.0f);
  EXPECT_EQ(act[2], -1.0f);
  EXPECT_EQ(act[0], 288.0f);
  EXPECT_EQ(act[3], 2.5f);
  // Random rows: exactly fp8_window_qdq of the BF16-rounded values; in place too.
  std::mt19937 gen(7);
  std::normal_distribution<float> nd(0.0f, 3.0f);
  std::vector<float> r(4 * 96), b(r.size()), want(r.size()), got(r.size());
  for (float& v : r) v = nd(gen);
  for (size_t i = 0; i < r.size(); ++i) b[i] = bf16_to_f32(f32_to_bf16(r[i]));
  fp8_window_qdq(b.data(), 4, 96, want.data());
  fp8_act_qdq(r.data(), 4, 96, got.data());
  for (size_t i = 0; i < r.size(); ++i) ASSERT_EQ(bits(got[i]), bits(want[i])) << i;
  fp8_act_qdq(r.data(), 4, 96, r.data());
  for (size_t i = 0; i < r.size(); ++i) ASSERT_EQ(bits(r[i]), bits(want[i])) << i;
  // Every value is BF16-exact (so BF16 tensor cores take it unchanged).
  for (float v : got) ASSERT_EQ(bf16_to_f32(f32_to_bf16(v)), v);
}

TEST(QuantFp8Window, AmaxFloorForZeroAndTinyBlocks) {
  std::vector<float> x(64, 0.0f), y = poisoned(64);
  x[32] = 1e-6f;  // floor 1e-4 -> scale 2^-22; 1e-6 / 2^-22 = 4.19 -> 4
  fp8_window_qdq(x.data(), 1, 64, y.data());
  for (int i = 0; i < 32; ++i) EXPECT_EQ(bits(y[i]), 0u);
  EXPECT_EQ(y[32], std::ldexp(4.0f, -22));
  std::vector<uint8_t> p(fp8_window_row_bytes(64));
  fp8_window_pack(x.data(), 1, 64, p.data());
  EXPECT_EQ(p[64], 127 - 22);
  EXPECT_EQ(p[65], 127 - 22);
}

// ---- NVFP4 ----

TEST(QuantNvfp4, E4M3ScaleRounding) {
  std::vector<float> x(32, 0.0f), y = poisoned(32);
  x[0] = 7.0f;     // 7/6 = 1.1667 -> E4M3 1.125; 7/1.125 = 6.2 -> clamp 6 -> 6.75
  x[1] = 1.0f;     // 0.889 -> 1 -> 1.125
  x[16] = 6.375f;  // 6.375/6 = 1.0625: tie between 1.0 and 1.125 -> even (1.0)
  x[17] = -5.0f;   // tie 5 -> 4 (even code)
  fp8_window_qdq(x.data(), 1, 32, y.data());  // (unrelated call: exercises aliasing below)
  nvfp4_qdq(x.data(), 1, 32, y.data());
  EXPECT_EQ(y[0], 6.75f);
  EXPECT_EQ(y[1], 1.125f);
  EXPECT_EQ(y[16], 6.0f);
  EXPECT_EQ(y[17], -4.0f);
  std::vector<uint8_t> p(nvfp4_row_bytes(32));
  ASSERT_EQ(p.size(), 18u);
  nvfp4_pack(x.data(), 1, 32, p.data());
  EXPECT_EQ(p[16], f32_to_fp8_e4m3(1.125f));
  EXPECT_EQ(p[17], f32_to_fp8_e4m3(1.0f));
  EXPECT_EQ(p[0], 0x27);  // ch0 code 7 (6) low, ch1 code 2 (1.0) high
  EXPECT_EQ(p[8], 0xE7);  // ch16 code 7 low, ch17 code 14 (-4) high
}

TEST(QuantNvfp4, E2M1TiesToEvenAndFloor) {
  const float in[16] = {6,     0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5,
                        -0.25, -2.5, 2.75, 0.1,  -0.1, 0,   4.5, 5.5};
  const float want[16] = {6, 0, 1, 1, 2, 2, 4, 4, -0.0f, -2, 3, 0, -0.0f, 0, 4, 6};
  std::vector<float> y = poisoned(16);
  nvfp4_qdq(in, 1, 16, y.data());
  for (int i = 0; i < 16; ++i) EXPECT_EQ(bits(y[i]), bits(want[i])) << i;
  // Tiny and zero blocks: floor 6*2^-9 -> scale 2^-9 (smallest E4M3 subnormal).
  float tiny[16] = {1e-6f, -1e-6f, 0.004f};
  nvfp4_qdq(tiny, 1, 16, y.data());
  EXPECT_EQ(bits(y[0]), 0u);
  EXPECT_EQ(bits(y[1]), 0x80000000u);
  EXPECT_EQ(y[2], 2.0f * 0.001953125f);  // 0.004 / 2^-9 = 2.048 -> 2
}

// ---- MXFP4 ----

TEST(QuantMxfp4, ScalesAndLayout) {
  std::vector<float> x(64, 0.0f), y = poisoned(64);
  x[0] = 0.5f;
  x[1] = -1.0f;
  x[2] = 6.0f;  // amax 6 -> scale 1
  x[3] = -0.0f;
  x[32] = 3.0f;  // 3 * f32(1/6) == 0.5 exactly -> scale 0.5
  x[33] = 0.6f;  // 1.2 -> 1 -> 0.5
  mxfp4_qdq(x.data(), 1, 64, y.data());
  EXPECT_EQ(y[0], 0.5f);
  EXPECT_EQ(y[1], -1.0f);
  EXPECT_EQ(y[2], 6.0f);
  EXPECT_EQ(bits(y[3]), 0x80000000u);
  EXPECT_EQ(y[32], 3.0f);
  EXPECT_EQ(y[33], 0.5f);
  std::vector<uint8_t> p(mxfp4_row_bytes(64));
  ASSERT_EQ(p.size(), 34u);
  mxfp4_pack(x.data(), 1, 64, p.data());
  EXPECT_EQ(p[0], 0xA1);  // even channel (code 1) in the low nibble, odd (code 10) high
  EXPECT_EQ(p[1], 0x87);  // 6 -> 7, -0 -> 8
  EXPECT_EQ(p[32], 127);
  EXPECT_EQ(p[33], 126);
  EXPECT_EQ(mxfp4_row_bytes(128), 68);
  EXPECT_EQ(nvfp4_row_bytes(512), 288);
  EXPECT_EQ(fp8_window_row_bytes(512), 528);
}

TEST(QuantMxfp4, AmaxFloor) {
  std::vector<float> x(32, 0.0f), y = poisoned(32);
  x[5] = 1e-39f;  // subnormal, below 6 * 2^-126: scale 2^-126
  mxfp4_qdq(x.data(), 1, 32, y.data());
  for (int i = 0; i < 32; ++i) EXPECT_EQ(bits(y[i]), 0u) << i;  // 1e-39 / 2^-126 = 0.085 -> 0
  std::vector<uint8_t> p(mxfp4_row_bytes(32));
  mxfp4_pack(x.data(), 1, 32, p.data());
  EXPECT_EQ(p[16], 1);  // 2^-126
}

// ---- Random: independent reference, poisoned outputs, pack/unpack == qdq ----

// Independent brute-force reference of the 5.3 rules (nearest representable value by search).
float nearest(float v, const std::vector<float>& grid) {  // grid: sorted non-negative levels
  const float a = std::fabs(v);
  size_t best = 0;
  for (size_t i = 1; i < grid.size(); ++i) {
    const float d = std::fabs(grid[i] - a), db = std::fabs(grid[best] - a);
    if (d < db) best = i;
    // On a tie keep the even code (indices are the codes of the magnitudes).
    if (d == db && (i % 2 == 0)) best = i;
  }
  return std::copysign(grid[best], v);
}

std::vector<float> e4m3_grid() {
  std::vector<float> g;
  for (int c = 0; c <= 0x7E; ++c) g.push_back(fp8_e4m3_to_f32(static_cast<uint8_t>(c)));
  return g;
}

float pow2_at_least(float v) {  // smallest power of two >= v (v positive normal or subnormal)
  float p = std::ldexp(1.0f, -126);
  while (p < v) p *= 2.0f;
  return p;
}

template <typename Qdq, typename Pack, typename Unpack>
void check_random(const char* name, int block, Qdq qdq, Pack pack, Unpack unpack, int64_t row_bytes,
                  const std::vector<float>& grid, float level_max, bool e4m3_scale) {
  const unsigned seed = std::random_device{}();
  std::mt19937 g(seed);
  std::normal_distribution<float> nd;
  std::uniform_int_distribution<int> ed(-30, 30);
  const int64_t rows = 7, dim = 256;
  std::vector<float> x(rows * dim);
  for (int64_t r = 0; r < rows; ++r) {
    const float mag = std::ldexp(1.0f, ed(g));
    for (int64_t c = 0; c < dim; ++c) x[r * dim + c] = nd(g) * mag;
  }
  std::vector<float> y = poisoned(x.size()), z = poisoned(x.size());
  std::vector<uint8_t> p(rows * row_bytes, 0xAB);
  qdq(x.data(), rows, dim, y.data());
  pack(x.data(), rows, dim, p.data());
  unpack(p.data(), rows, dim, z.data());
  for (size_t i = 0; i < x.size(); i += block) {
    float amax = 0;
    for (int j = 0; j < block; ++j) amax = std::max(amax, std::fabs(x[i + j]));
    float s;
    if (e4m3_scale) {
      s = nearest(std::max(amax, 6.0f * 0.001953125f) / 6.0f, e4m3_grid());
    } else if (level_max == 448.0f) {
      s = pow2_at_least(std::max(amax, static_cast<float>(1e-4)) * static_cast<float>(1.0 / 448));
    } else {
      s = pow2_at_least(std::max(amax, std::ldexp(6.0f, -126)) * static_cast<float>(1.0 / 6));
    }
    for (int j = 0; j < block; ++j) {
      const float v = x[i + j] / s;
      const float clamped = std::max(-level_max, std::min(level_max, v));
      const float want = nearest(clamped, grid) * s;
      ASSERT_EQ(bits(y[i + j]), bits(want))
          << name << " seed " << seed << " at " << i + j << " x=" << x[i + j];
      ASSERT_EQ(bits(z[i + j]), bits(y[i + j])) << name << " unpack(pack) seed " << seed;
    }
  }
}

TEST(QuantRandom, Fp8WindowMatchesBruteForce) {
  check_random("fp8_window", 32, fp8_window_qdq, fp8_window_pack, fp8_window_unpack,
               fp8_window_row_bytes(256), e4m3_grid(), 448.0f, false);
}
TEST(QuantRandom, Nvfp4MatchesBruteForce) {
  check_random("nvfp4", 16, nvfp4_qdq, nvfp4_pack, nvfp4_unpack, nvfp4_row_bytes(256),
               {0, 0.5, 1, 1.5, 2, 3, 4, 6}, 6.0f, true);
}
TEST(QuantRandom, Mxfp4MatchesBruteForce) {
  check_random("mxfp4", 32, mxfp4_qdq, mxfp4_pack, mxfp4_unpack, mxfp4_row_bytes(256),
               {0, 0.5, 1, 1.5, 2, 3, 4, 6}, 6.0f, false);
}

TEST(QuantRandom, InPlaceQdq) {
  std::mt19937 g(std::random_device{}());
  std::normal_distribution<float> nd;
  std::vector<float> x(128);
  for (auto& v : x) v = nd(g);
  std::vector<float> y = poisoned(128), xi = x;
  nvfp4_qdq(x.data(), 2, 64, y.data());
  nvfp4_qdq(xi.data(), 2, 64, xi.data());
  for (int i = 0; i < 128; ++i) EXPECT_EQ(bits(xi[i]), bits(y[i]));
}

// ---- Weight dequantisation ----

TEST(QuantDequant, Fp8BlocksPartialEdges) {
  // 3x5 weight, blocks 2x2 -> scale grid 2x3.
  std::vector<uint8_t> codes(15, 0x38);  // 1.0
  codes[14] = 0xC0;                      // -2.0
  const std::vector<uint8_t> scales = {127, 128, 129, 126, 0, 254};
  std::vector<float> out = poisoned(15);
  dequant_fp8_blocks(codes.data(), scales.data(), 3, 5, 2, 2, out.data());
  const float want[15] = {1,
                          1,
                          2,
                          2,
                          4,
                          1,
                          1,
                          2,
                          2,
                          4,
                          0.5f,
                          0.5f,
                          std::ldexp(1.0f, -127),
                          std::ldexp(1.0f, -127),
                          std::ldexp(-2.0f, 127)};
  for (int i = 0; i < 15; ++i) EXPECT_EQ(bits(out[i]), bits(want[i])) << i;
}

TEST(QuantDequant, Fp4Rows) {
  // 2 rows x 64 cols: byte [r, c/2] holds col c (even) low, c+1 high.
  std::vector<uint8_t> packed(64, 0);
  packed[0] = 0xA7;   // col0 = 6, col1 = -1
  packed[16] = 0x81;  // col32 = 0.5, col33 = code 8 -> +0 (NeMo table)
  packed[32] = 0xF3;  // row 1: col0 = 1.5, col1 = -6
  const std::vector<uint8_t> scales = {128, 126, 127, 0};
  std::vector<float> out = poisoned(128);
  dequant_fp4_rows(packed.data(), scales.data(), 2, 64, out.data());
  EXPECT_EQ(out[0], 12.0f);
  EXPECT_EQ(out[1], -2.0f);
  EXPECT_EQ(out[32], 0.25f);
  EXPECT_EQ(bits(out[33]), 0u);
  EXPECT_EQ(out[64], 1.5f);
  EXPECT_EQ(out[65], -6.0f);
  for (float v : out) EXPECT_FALSE(std::isnan(v));
}

TEST(QuantDequant, Bf16) {
  const uint16_t in[3] = {0x3F80, 0xC040, 0x0000};
  std::vector<float> out = poisoned(3);
  dequant_bf16(in, 3, out.data());
  EXPECT_EQ(out[0], 1.0f);
  EXPECT_EQ(out[1], -3.0f);
  EXPECT_EQ(out[2], 0.0f);
}

// ---- Errors ----

template <typename F>
void expect_error(F f, const char* needle) {
  try {
    f();
    ADD_FAILURE() << "no error, expected one mentioning " << needle;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(QuantErrors, BadDims) {
  std::vector<float> x(64), y(64);
  std::vector<uint8_t> p(128);
  expect_error([&] { fp8_window_qdq(x.data(), 1, 48, y.data()); }, "multiple");
  expect_error([&] { fp8_act_qdq(x.data(), 1, 40, y.data()); }, "fp8_act_qdq");
  expect_error([&] { nvfp4_qdq(x.data(), 1, 24, y.data()); }, "block size 16");
  expect_error([&] { mxfp4_pack(x.data(), 1, 16, p.data()); }, "mxfp4");
  expect_error([&] { fp8_window_unpack(p.data(), 1, 0, y.data()); }, "dim 0");
  expect_error([&] { nvfp4_unpack(p.data(), -1, 16, y.data()); }, "rows");
  expect_error([&] { dequant_fp4_rows(p.data(), p.data(), 1, 7, y.data()); }, "odd");
  expect_error([&] { dequant_fp8_blocks(p.data(), p.data(), 2, 2, 0, 32, y.data()); },
               "block sizes");
}

}  // namespace
}  // namespace dsv41rt::kernels::cpu
