#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "kernels/linear.h"

namespace dsv41rt::kernels::cpu {
namespace {

std::vector<float> random_vec(size_t n, std::mt19937& g) {
  std::normal_distribution<float> d;
  std::vector<float> v(n);
  for (auto& x : v) x = d(g);
  return v;
}

TEST(Linear, MatchesDoublePrecisionReference) {
  std::mt19937 g(std::random_device{}());
  for (auto [m, k, n] : {std::tuple{1, 3, 5}, {7, 64, 130}, {33, 100, 17}}) {
    auto x = random_vec(m * k, g), w = random_vec(n * k, g);
    std::vector<float> y(m * n, std::nanf(""));  // poisoned output
    linear(x.data(), w.data(), m, k, n, y.data());
    for (int r = 0; r < m; ++r) {
      for (int c = 0; c < n; ++c) {
        double ref = 0;
        for (int i = 0; i < k; ++i) ref += double(x[r * k + i]) * w[c * k + i];
        EXPECT_NEAR(y[r * n + c], ref, 1e-5 * (1 + std::abs(ref)) * std::sqrt(k));
      }
    }
  }
}

TEST(Linear, RowResultDoesNotDependOnBatch) {
  std::mt19937 g(std::random_device{}());
  const int m = 9, k = 77, n = 40;
  auto x = random_vec(m * k, g), w = random_vec(n * k, g);
  std::vector<float> all(m * n), one(n);
  linear(x.data(), w.data(), m, k, n, all.data());
  for (int r = 0; r < m; ++r) {
    linear(x.data() + r * k, w.data(), 1, k, n, one.data());
    for (int c = 0; c < n; ++c) EXPECT_EQ(one[c], all[r * n + c]);  // bitwise
  }
}

TEST(Linear, AccumulateAndGrouped) {
  std::mt19937 g(std::random_device{}());
  const int m = 3, groups = 2, kg = 5, ng = 4;
  auto x = random_vec(m * groups * kg, g), w = random_vec(groups * ng * kg, g);
  std::vector<float> y(m * groups * ng, std::nanf(""));
  grouped_linear(x.data(), w.data(), m, groups, kg, ng, y.data());
  for (int r = 0; r < m; ++r)
    for (int gi = 0; gi < groups; ++gi)
      for (int c = 0; c < ng; ++c) {
        double ref = 0;
        for (int i = 0; i < kg; ++i)
          ref += double(x[(r * groups + gi) * kg + i]) * w[(gi * ng + c) * kg + i];
        EXPECT_NEAR(y[(r * groups + gi) * ng + c], ref, 1e-5);
      }
  std::vector<float> acc(2, 1.0f), xa = {1, 2}, wa = {3, 4, 5, 6};
  linear(xa.data(), wa.data(), 1, 2, 2, acc.data(), /*accumulate=*/true);
  EXPECT_EQ(acc[0], 12.0f);
  EXPECT_EQ(acc[1], 18.0f);
}

}  // namespace
}  // namespace dsv41rt::kernels::cpu
