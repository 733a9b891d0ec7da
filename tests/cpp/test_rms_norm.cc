#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "core/status.h"
#include "kernels/rms_norm.h"

namespace dsv41rt::kernels::cpu {
namespace {

TEST(RmsNorm, ConstantVectorIsWeight) {
  // x = c·1 -> mean(x²) = c², y = w · c / |c| (eps negligible) = ±w exactly for c = 2^k.
  const int dim = 64;
  std::vector<float> x(2 * dim), w(dim), y(2 * dim, std::nanf(""));
  for (int i = 0; i < dim; ++i) {
    x[i] = 4.0f;
    x[dim + i] = -0.5f;
    w[i] = 0.25f * float(i + 1);
  }
  rms_norm(x.data(), w.data(), 2, dim, 1e-20f, y.data());
  for (int i = 0; i < dim; ++i) {
    EXPECT_EQ(y[i], w[i]);
    EXPECT_EQ(y[dim + i], -w[i]);
  }
  rms_normalize(x.data(), 2, dim, 1e-20f, y.data());
  for (int i = 0; i < dim; ++i) {
    EXPECT_EQ(y[i], 1.0f);
    EXPECT_EQ(y[dim + i], -1.0f);
  }
}

TEST(RmsNorm, EpsMatters) {
  // x = (3, 4): mean(x²) = 12.5; with eps = 3.5, r = 1/4.
  std::vector<float> x = {3, 4}, w = {1, 2}, y(2, std::nanf(""));
  rms_norm(x.data(), w.data(), 1, 2, 3.5f, y.data());
  EXPECT_EQ(y[0], 0.75f);
  EXPECT_EQ(y[1], 2.0f);
}

TEST(RmsNorm, RandomMatchesDouble) {
  const unsigned seed = std::random_device{}();
  std::mt19937 g(seed);
  std::normal_distribution<float> d;
  for (int dim : {1, 7, 64, 1000}) {
    const int rows = 5;
    std::vector<float> x(rows * dim), w(dim), y(rows * dim, std::nanf(""));
    for (auto& v : x) v = d(g) * 3;
    for (auto& v : w) v = d(g);
    rms_norm(x.data(), w.data(), rows, dim, 1e-6f, y.data());
    for (int r = 0; r < rows; ++r) {
      double ms = 0;
      for (int i = 0; i < dim; ++i) ms += double(x[r * dim + i]) * x[r * dim + i];
      const double inv = 1 / std::sqrt(ms / dim + 1e-6);
      for (int i = 0; i < dim; ++i) {
        const double ref = double(w[i]) * x[r * dim + i] * inv;
        EXPECT_NEAR(y[r * dim + i], ref, 1e-6 * std::abs(ref) + 1e-30) << "seed " << seed;
      }
    }
    // In place gives the same bits.
    std::vector<float> z = x;
    rms_norm(z.data(), w.data(), rows, dim, 1e-6f, z.data());
    for (int i = 0; i < rows * dim; ++i) EXPECT_EQ(z[i], y[i]) << "seed " << seed;
  }
}

TEST(RmsNorm, BadArgumentsThrow) {
  std::vector<float> x(4), y(4);
  EXPECT_THROW(rms_norm(nullptr, nullptr, 1, 4, 1e-6f, y.data()), Error);
  EXPECT_THROW(rms_norm(x.data(), nullptr, 1, 0, 1e-6f, y.data()), Error);
  EXPECT_THROW(rms_norm(x.data(), nullptr, -1, 4, 1e-6f, y.data()), Error);
  EXPECT_THROW(rms_norm(x.data(), nullptr, 1, 4, -1.0f, y.data()), Error);
}

}  // namespace
}  // namespace dsv41rt::kernels::cpu
