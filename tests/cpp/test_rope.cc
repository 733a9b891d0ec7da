#include <gtest/gtest.h>

#include <cmath>
#include <numbers>
#include <random>
#include <vector>

#include "core/status.h"
#include "kernels/rope.h"

namespace dsv41rt::kernels::cpu {
namespace {

TEST(Rope, PlainTableIsBasePower) {
  const auto f = rope_inv_freq(64, 10000.0, nullptr);
  ASSERT_EQ(f.size(), 32u);
  EXPECT_EQ(f[0], 1.0f);
  for (int k = 0; k < 32; ++k) {
    const double ref = std::pow(10000.0, -2.0 * k / 64);
    EXPECT_NEAR(f[k], ref, 2e-7 * ref) << k;
  }
  // original_max_position 0 disables YaRN (NeMo's rule).
  YarnParams off;
  off.factor = 16;
  EXPECT_EQ(rope_inv_freq(64, 10000.0, &off), f);
}

TEST(Rope, YarnLowHighAndRamp) {
  YarnParams y{16.0, 65536, 32.0, 1.0};
  int64_t low = -1, high = -1;
  yarn_low_high(64, 160000.0, y, &low, &high);
  EXPECT_EQ(low, 15);
  EXPECT_EQ(high, 25);
  const auto plain = rope_inv_freq(64, 160000.0, nullptr);
  const auto f = rope_inv_freq(64, 160000.0, &y);
  for (int k = 0; k <= 15; ++k) EXPECT_EQ(f[k], plain[k]) << k;          // ramp 0: θ
  for (int k = 25; k < 32; ++k) EXPECT_EQ(f[k], plain[k] / 16.0f) << k;  // ramp 1: θ/16
  for (int k = 16; k < 25; ++k) {                                        // blend
    const double r = (k - 15) / 10.0;
    const double ref = plain[k] / 16.0 * r + plain[k] * (1 - r);
    EXPECT_NEAR(f[k], ref, 1e-6 * ref) << k;
    EXPECT_LT(f[k], plain[k]);
    EXPECT_GT(f[k], plain[k] / 16.0f);
  }
}

TEST(Rope, QuarterTurnOnUnitPair) {
  // θ_0 = 1: position π/2 is not an integer, so use inv_freq = π/2 and position 1.
  const float inv = float(std::numbers::pi / 2);
  std::vector<float> x = {7.0f, 1.0f, 0.0f};  // head_dim 3, rope_dim 2: channel 0 untouched
  const int64_t pos = 1;
  apply_rope(x.data(), 1, 1, 3, 2, &pos, &inv, false);
  EXPECT_EQ(x[0], 7.0f);
  EXPECT_NEAR(x[1], 0.0f, 1e-7);  // cos(π/2) ≈ -4.4e-8 in FP32
  EXPECT_EQ(x[2], 1.0f);
  apply_rope(x.data(), 1, 1, 3, 2, &pos, &inv, true);
  EXPECT_NEAR(x[1], 1.0f, 1e-7);
  EXPECT_NEAR(x[2], 0.0f, 1e-7);
  // Position 0 is the identity, bit for bit.
  std::vector<float> z = {0.3f, -1.7f};
  const int64_t zero = 0;
  apply_rope(z.data(), 1, 1, 2, 2, &zero, &inv, false);
  EXPECT_EQ(z[0], 0.3f);
  EXPECT_EQ(z[1], -1.7f);
}

TEST(Rope, RandomMatchesDoubleAndInverseIsIdentity) {
  const unsigned seed = std::random_device{}();
  std::mt19937 g(seed);
  std::normal_distribution<float> d;
  std::uniform_int_distribution<int64_t> pd(0, 1 << 20);
  const int rows = 9, heads = 3, hd = 40, rd = 16;
  YarnParams y{16.0, 65536, 32.0, 1.0};
  const auto f = rope_inv_freq(rd, 160000.0, &y);
  std::vector<float> x(rows * heads * hd);
  for (auto& v : x) v = d(g);
  std::vector<int64_t> pos(rows);
  for (auto& p : pos) p = pd(g);
  std::vector<float> r = x;
  apply_rope(r.data(), rows, heads, hd, rd, pos.data(), f.data(), false);
  for (int i = 0; i < rows; ++i)
    for (int h = 0; h < heads; ++h) {
      const float* a = x.data() + (i * heads + h) * hd;
      const float* b = r.data() + (i * heads + h) * hd;
      for (int c = 0; c < hd - rd; ++c) EXPECT_EQ(a[c], b[c]);
      for (int k = 0; k < rd / 2; ++k) {
        const float ang = float(pos[i]) * f[k];  // the FP32 angle is part of the contract
        const double cs = std::cos(double(ang)), sn = std::sin(double(ang));
        const double x0 = a[hd - rd + 2 * k], x1 = a[hd - rd + 2 * k + 1];
        const double mag = std::hypot(x0, x1);
        EXPECT_NEAR(b[hd - rd + 2 * k], x0 * cs - x1 * sn, 1e-6 * mag) << "seed " << seed;
        EXPECT_NEAR(b[hd - rd + 2 * k + 1], x0 * sn + x1 * cs, 1e-6 * mag) << "seed " << seed;
      }
    }
  apply_rope(r.data(), rows, heads, hd, rd, pos.data(), f.data(), true);
  for (size_t i = 0; i < x.size(); ++i)
    EXPECT_NEAR(r[i], x[i], 1e-6 * (1 + std::abs(x[i]))) << "seed " << seed;
}

TEST(Rope, BadArgumentsThrow) {
  std::vector<float> x(8), f(2);
  int64_t p = 0;
  EXPECT_THROW(rope_inv_freq(15, 10000.0, nullptr), Error);
  EXPECT_THROW(rope_inv_freq(16, -1.0, nullptr), Error);
  EXPECT_THROW(apply_rope(x.data(), 1, 1, 8, 10, &p, f.data(), false), Error);
  EXPECT_THROW(apply_rope(x.data(), 1, 1, 8, 3, &p, f.data(), false), Error);
  EXPECT_THROW(apply_rope(x.data(), 1, 1, 8, 4, nullptr, f.data(), false), Error);
}

}  // namespace
}  // namespace dsv41rt::kernels::cpu
