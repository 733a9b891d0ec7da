#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "core/status.h"
#include "kernels/engram.h"

namespace dsv41rt::kernels::cpu {
namespace {

int64_t fmod_py(int64_t a, int64_t p) { return ((a % p) + p) % p; }

// max_ngram = 3, n_heads = 2: 4 columns [n=2 h0, n=2 h1, n=3 h0, n=3 h1].
TEST(EngramHash, TinyHandExampleWithPadLookbacks) {
  const std::vector<int64_t> mult = {3, 5, 7}, primes = {11, 13, 17, 19}, off = {0, 11, 24, 41};
  const int64_t pad = 2;
  // History slots: 2 (both before the start: -1), then tokens 4, 6, -1 (dead), 9.
  const std::vector<int64_t> ids = {-1, -1, 4, 6, -1, 9};
  std::vector<int64_t> rows(4 * 4, -99);
  engram_hash_rows(ids.data(), 4, 3, 2, mult.data(), primes.data(), off.data(), pad, rows.data());
  // t=0: c = [4, pad, pad] -> r1 = 12 ^ 10 = 6, r2 = 6 ^ 14 = 8.
  EXPECT_EQ(rows[0], 6 % 11 + 0);
  EXPECT_EQ(rows[1], 6 % 13 + 11);
  EXPECT_EQ(rows[2], 8 % 17 + 24);
  EXPECT_EQ(rows[3], 8 % 19 + 41);
  // t=1: c = [6, 4, pad] -> r1 = 18 ^ 20 = 6, r2 = 6 ^ 14 = 8.
  EXPECT_EQ(rows[4], 6 + 0);
  EXPECT_EQ(rows[6], 8 + 24);
  // t=2: the token itself is dead: c = [pad, pad, pad] -> r1 = 6 ^ 10 = 12, r2 = 12 ^ 14 = 2.
  EXPECT_EQ(rows[8], 12 % 11);
  EXPECT_EQ(rows[9], 12 + 11);
  EXPECT_EQ(rows[10], 2 + 24);
  // t=3: c = [9, pad(dead), pad] -> r1 = 27 ^ 10 = 17, r2 = 17 ^ 14 = 31.
  EXPECT_EQ(rows[12], 17 % 11);
  EXPECT_EQ(rows[13], 17 % 13 + 11);
  EXPECT_EQ(rows[14], 31 % 17 + 24);
  EXPECT_EQ(rows[15], 31 % 19 + 41);
}

TEST(EngramHash, WrapAroundAndNegativeFloorMod) {
  // Products overflow int64; the XOR may be negative; the mod is a floor mod.
  const std::vector<int64_t> mult = {76632096046245, 4839876093313}, primes = {16000057},
                             off = {1000};
  const std::vector<int64_t> ids = {99091, 98765};
  int64_t row = -1;
  engram_hash_rows(ids.data(), 1, 2, 1, mult.data(), primes.data(), off.data(), 0, &row);
  const int64_t v0 = int64_t(uint64_t(98765) * uint64_t(mult[0]));
  const int64_t v1 = int64_t(uint64_t(99091) * uint64_t(mult[1]));
  EXPECT_EQ(row, fmod_py(v0 ^ v1, primes[0]) + 1000);
  const std::vector<int64_t> neg_mult = {-3, 1};  // forces a negative XOR
  const std::vector<int64_t> ids2 = {0, 5};
  engram_hash_rows(ids2.data(), 1, 2, 1, neg_mult.data(), primes.data(), off.data(), 0, &row);
  EXPECT_EQ(row, fmod_py(int64_t(-15) ^ int64_t(0), primes[0]) + 1000);
  EXPECT_GE(row, 1000);
  EXPECT_THROW(
      engram_hash_rows(ids.data(), 1, 1, 1, mult.data(), primes.data(), off.data(), 0, &row),
      Error);
}

TEST(EngramForward, RandomMatchesDoubleReference) {
  const unsigned seed = std::random_device{}();
  std::mt19937 g(seed);
  std::normal_distribution<float> nd;
  const int S = 5, n = 3, H = 32, D = 48;
  const float eps = 1e-6f;
  auto rv = [&](size_t m, float sc) {
    std::vector<float> v(m);
    for (auto& a : v) a = sc * nd(g);
    return v;
  };
  auto X = rv(S * n * H, 1.0f), emb = rv(S * D, 1.0f), wkv = rv((n + 1) * H * D, 0.1f);
  auto q = rv(n * H, 1.0f), kw = rv(n * H, 1.0f);
  std::vector<uint8_t> mask = {1, 1, 0, 1, 1};
  auto Y = X;
  engram_forward(Y.data(), emb.data(), wkv.data(), q.data(), kw.data(), mask.data(), S, n, H, D,
                 eps);
  for (int t = 0; t < S; ++t) {
    std::vector<double> kv((n + 1) * H);
    for (int o = 0; o < (n + 1) * H; ++o) {
      double a = 0;
      for (int c = 0; c < D; ++c) a += double(emb[t * D + c]) * wkv[o * D + c];
      kv[o] = a;
    }
    for (int i = 0; i < n; ++i) {
      double sx = 0, sk = 0, sd = 0;
      for (int c = 0; c < H; ++c) {
        const double xv = X[(t * n + i) * H + c], kk = kv[i * H + c];
        sx += xv * xv;
        sk += kk * kk;
        sd += xv * double(q[i * H + c]) * kw[i * H + c] * kk;
      }
      const double dot = sd / std::sqrt(sx / H + eps) / std::sqrt(sk / H + eps) / std::sqrt(H);
      const double z = std::copysign(std::sqrt(std::max(std::abs(dot), 1e-6)), dot);
      const double gate = mask[t] ? 1 / (1 + std::exp(-z)) : 0.0;
      for (int c = 0; c < H; ++c) {
        const double ref = X[(t * n + i) * H + c] + gate * kv[n * H + c];
        EXPECT_NEAR(Y[(t * n + i) * H + c], ref, 1e-5 * (1 + std::abs(ref))) << "seed " << seed;
      }
    }
  }
  EXPECT_THROW(engram_forward(Y.data(), emb.data(), wkv.data(), q.data(), kw.data(), nullptr, S, 0,
                              H, D, eps),
               Error);
}

}  // namespace
}  // namespace dsv41rt::kernels::cpu
