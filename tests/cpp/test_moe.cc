#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "core/status.h"
#include "kernels/moe.h"
#include "kernels/quant.h"

namespace dsv41rt::kernels::cpu {
namespace {

std::vector<float> random_vec(size_t n, std::mt19937& g, float scale = 1.0f) {
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(g);
  return v;
}

double sps(double z) { return std::sqrt(z > 20 ? z : std::log1p(std::exp(z))); }

// H = 1, gate_w = logits directly: logits = x * gate_w.
TEST(MoeRoute, HandComputedBiasChangesSelectionNotWeights) {
  const float x = 1.0f;
  std::vector<float> gw = {2.0f, -1.0f, 0.5f, 1.0f};  // s = sps(2) > sps(1) > sps(.5) > sps(-1)
  std::vector<int32_t> idx(2, -7);
  std::vector<float> w(2, std::nanf(""));
  moe_route(&x, gw.data(), nullptr, 1, 1, 4, 2, 1.0f, idx.data(), w.data());
  EXPECT_EQ(idx[0], 0);
  EXPECT_EQ(idx[1], 3);
  const double s0 = sps(2), s3 = sps(1), s1 = sps(-1);
  EXPECT_NEAR(w[0], s0 / (s0 + s3), 1e-6);
  EXPECT_NEAR(w[1], s3 / (s0 + s3), 1e-6);
  // A large bias on expert 1 selects it, but its weight comes from the unbiased score.
  std::vector<float> bias = {0.0f, 5.0f, 0.0f, 0.0f};
  moe_route(&x, gw.data(), bias.data(), 1, 1, 4, 2, 2.5f, idx.data(), w.data());
  EXPECT_EQ(idx[0], 1);
  EXPECT_EQ(idx[1], 0);
  EXPECT_NEAR(w[0], 2.5 * s1 / (s1 + s0), 1e-6);
  EXPECT_NEAR(w[1], 2.5 * s0 / (s1 + s0), 1e-6);
  EXPECT_NEAR(w[0] + w[1], 2.5, 1e-6);  // normalised, then scaled
  // k = 1: no normalisation (NeMo: norm_topk_prob and topk > 1), only scaling.
  moe_route(&x, gw.data(), nullptr, 1, 1, 4, 1, 3.0f, idx.data(), w.data());
  EXPECT_EQ(idx[0], 0);
  EXPECT_NEAR(w[0], 3.0 * s0, 1e-5);
  // normalize = false keeps raw scores.
  moe_route(&x, gw.data(), nullptr, 1, 1, 4, 2, 1.0f, idx.data(), w.data(), false);
  EXPECT_NEAR(w[1], s3, 1e-6);
}

TEST(MoeRoute, SoftplusThresholdAndTies) {
  EXPECT_EQ(softplus(25.0f), 25.0f);  // above torch's threshold 20: identity
  EXPECT_EQ(softplus(20.0f), std::log1p(std::exp(20.0f)));
  EXPECT_NEAR(softplus(0.0f), std::log(2.0f), 1e-7);
  const float x = 1.0f;
  std::vector<float> gw = {1.0f, 1.0f, 1.0f};
  std::vector<int32_t> idx(2);
  std::vector<float> w(2);
  moe_route(&x, gw.data(), nullptr, 1, 1, 3, 2, 1.0f, idx.data(), w.data());
  EXPECT_EQ(idx[0], 0);  // ties go to the lower expert index
  EXPECT_EQ(idx[1], 1);
  EXPECT_FLOAT_EQ(w[0], 0.5f);
}

TEST(MoeRoute, RandomMatchesDoubleReference) {
  const unsigned seed = std::random_device{}();
  std::mt19937 g(seed);
  const int S = 13, H = 40, E = 16, k = 4;
  auto x = random_vec(S * H, g), gw = random_vec(E * H, g, 0.3f), b = random_vec(E, g, 0.1f);
  std::vector<int32_t> idx(S * k, -1);
  std::vector<float> w(S * k, std::nanf(""));
  moe_route(x.data(), gw.data(), b.data(), S, H, E, k, 1.5f, idx.data(), w.data());
  for (int t = 0; t < S; ++t) {
    std::vector<double> s(E), c(E);
    for (int e = 0; e < E; ++e) {
      double l = 0;
      for (int i = 0; i < H; ++i) l += double(x[t * H + i]) * gw[e * H + i];
      s[e] = sps(l);
      c[e] = s[e] + b[e];
    }
    double sum = 0;
    for (int j = 0; j < k; ++j) sum += s[idx[t * k + j]];
    for (int j = 0; j < k; ++j) {
      const int e = idx[t * k + j];
      if (j > 0) {
        EXPECT_GE(c[idx[t * k + j - 1]], c[e] - 1e-6) << "seed " << seed;
      }
      int better = 0;  // number of unselected experts clearly better than e
      for (int o = 0; o < E; ++o) {
        bool sel = false;
        for (int jj = 0; jj < k; ++jj) sel |= idx[t * k + jj] == o;
        if (!sel && c[o] > c[e] + 1e-5) ++better;
      }
      EXPECT_EQ(better, 0) << "seed " << seed;
      EXPECT_NEAR(w[t * k + j], 1.5 * s[e] / sum, 1e-5) << "seed " << seed;
    }
  }
}

TEST(MoeRoute, HashVariantAndErrors) {
  const float x[2] = {1.0f, -1.0f};
  std::vector<float> gw = {2.0f, -1.0f, 0.5f};  // H = 1, E = 3
  std::vector<int32_t> table = {2, 1, 0, 2};    // vocab 2, k 2
  std::vector<int64_t> tok = {1, 0};
  std::vector<int32_t> idx(4);
  std::vector<float> w(4);
  moe_route_hash(x, gw.data(), table.data(), tok.data(), 2, 1, 3, 2, 2, 1.0f, idx.data(), w.data());
  EXPECT_EQ(idx[0], 0);
  EXPECT_EQ(idx[1], 2);
  EXPECT_EQ(idx[2], 2);
  EXPECT_EQ(idx[3], 1);
  EXPECT_NEAR(w[0], sps(2) / (sps(2) + sps(0.5)), 1e-6);
  EXPECT_NEAR(w[2], sps(-0.5) / (sps(-0.5) + sps(1)), 1e-6);
  tok[0] = 2;
  EXPECT_THROW(moe_route_hash(x, gw.data(), table.data(), tok.data(), 2, 1, 3, 2, 2, 1.0f,
                              idx.data(), w.data()),
               Error);
  EXPECT_THROW(moe_route(x, gw.data(), nullptr, 1, 1, 3, 4, 1.0f, idx.data(), w.data()), Error);
}

TEST(SwigluExpert, ClampBothSidesByHand) {
  // H = 1, I = 3: g = x * w1, u = x * w3; x = 1.
  const float x = 1.0f;
  std::vector<float> w1 = {15.0f, -15.0f, 2.0f}, w3 = {12.0f, -30.0f, -3.0f},
                     w2 = {1.0f, 1.0f, 1.0f};
  const float L = 10.0f;
  auto silu = [](double v) { return v / (1 + std::exp(-v)); };
  // g: 15 -> 10 (max clamp), -15 stays (one-sided), 2; u: 12 -> 10, -30 -> -10, -3.
  const double ref = silu(10) * 10 + silu(-15) * -10 + silu(2) * -3;
  float y = std::nanf("");
  swiglu_expert(&x, w1.data(), w3.data(), w2.data(), nullptr, 1, 1, 3, L, &y);
  EXPECT_NEAR(y, ref, 1e-5);
  const float rs = 0.25f;
  swiglu_expert(&x, w1.data(), w3.data(), w2.data(), &rs, 1, 1, 3, L, &y);
  EXPECT_NEAR(y, 0.25 * ref, 1e-5);
  float acc = 1.0f;
  swiglu_expert(&x, w1.data(), w3.data(), w2.data(), nullptr, 1, 1, 3, L, &acc, true);
  EXPECT_NEAR(acc, 1 + ref, 1e-5);
  // limit 0: no clamps.
  swiglu_expert(&x, w1.data(), w3.data(), w2.data(), nullptr, 1, 1, 3, 0.0f, &y);
  EXPECT_NEAR(y, silu(15) * 12 + silu(-15) * -30 + silu(2) * -3, 1e-4);
  EXPECT_THROW(swiglu_expert(&x, w1.data(), w3.data(), w2.data(), nullptr, 1, 0, 3, L, &y), Error);
}

// Precision "fp8": x and h (after the routing weight) through fp8_act_qdq before their GEMMs.
TEST(SwigluExpert, Fp8InputsQuantiseXAndTheHiddenUnits) {
  const int64_t m = 3, H = 64, I = 64;
  std::mt19937 gen(11);
  auto rnd = [&](int64_t n, float s) { return random_vec(size_t(n), gen, s); };
  const std::vector<float> x = rnd(m * H, 2.0f), w1 = rnd(I * H, 0.2f), w3 = rnd(I * H, 0.2f),
                           w2 = rnd(H * I, 0.2f), rs = {0.5f, 1.5f, 0.75f};
  const float L = 10.0f;
  // Reference from the pieces: the contract's steps with the codec applied explicitly.
  std::vector<float> xq = x, g(size_t(m * I)), u(g.size()), want(size_t(m * H));
  fp8_act_qdq(xq.data(), m, H, xq.data());
  linear(xq.data(), w1.data(), m, H, I, g.data());
  linear(xq.data(), w3.data(), m, H, I, u.data());
  for (int64_t r = 0; r < m; ++r) {
    for (int64_t c = 0; c < I; ++c) {
      float gv = std::min(g[r * I + c], L), uv = std::clamp(u[r * I + c], -L, L);
      g[r * I + c] = gv / (1.0f + std::exp(-gv)) * uv * rs[r];
    }
  }
  fp8_act_qdq(g.data(), m, I, g.data());
  linear(g.data(), w2.data(), m, I, H, want.data());
  std::vector<float> got(size_t(m * H)), bf16(got.size());
  swiglu_expert(x.data(), w1.data(), w3.data(), w2.data(), rs.data(), m, H, I, L, got.data(), false,
                GemmInputs::kFp8);
  swiglu_expert(x.data(), w1.data(), w3.data(), w2.data(), rs.data(), m, H, I, L, bf16.data(),
                false, GemmInputs::kBf16);
  EXPECT_EQ(got, want);
  EXPECT_NE(got, bf16);
}

// Random routed experts [E] (intermediate I) and a shared expert (intermediate Is) over hidden H.
struct RandomExperts {
  RandomExperts(std::mt19937& g, int E, int H, int I, int Is) : ex(size_t(E)) {
    for (int e = 0; e < E; ++e) {
      W1.push_back(random_vec(size_t(I * H), g));
      W3.push_back(random_vec(size_t(I * H), g));
      W2.push_back(random_vec(size_t(H * I), g, 0.2f));
      ex[size_t(e)] = {W1[e].data(), W3[e].data(), W2[e].data()};
    }
    s1 = random_vec(size_t(Is * H), g), s3 = random_vec(size_t(Is * H), g);
    s2 = random_vec(size_t(H * Is), g, 0.2f);
    sh = {s1.data(), s3.data(), s2.data()};
  }
  std::vector<std::vector<float>> W1, W3, W2;
  std::vector<SwigluWeights> ex;
  std::vector<float> s1, s3, s2;
  SwigluWeights sh;
};

TEST(MoeForward, RandomMatchesPerTokenReferenceAndIsBatchIndependent) {
  const unsigned seed = std::random_device{}();
  std::mt19937 g(seed);
  const int S = 11, H = 24, I = 16, Is = 20, E = 6, k = 2;
  auto x = random_vec(S * H, g, 2.0f);
  const RandomExperts experts(g, E, H, I, Is);
  const auto &W1 = experts.W1, &W3 = experts.W3, &W2 = experts.W2;
  const auto &s1 = experts.s1, &s3 = experts.s3, &s2 = experts.s2;
  const std::vector<SwigluWeights>& ex = experts.ex;
  const SwigluWeights& sh = experts.sh;
  std::vector<int32_t> idx(S * k);
  std::uniform_int_distribution<int> de(0, E - 1);
  for (int t = 0; t < S; ++t) {
    idx[t * k] = de(g);
    do idx[t * k + 1] = de(g);
    while (idx[t * k + 1] == idx[t * k]);
  }
  auto wt = random_vec(S * k, g);
  const float L = 7.0f;
  std::vector<float> y(S * H, std::nanf(""));
  moe_forward(x.data(), idx.data(), wt.data(), S, H, k, E, I, ex.data(), &sh, Is, L, y.data());
  for (int t = 0; t < S; ++t) {
    std::vector<float> ref(H, 0.0f), tmp(H);
    for (int j = 0; j < k; ++j) {
      const int e = idx[t * k + j];
      swiglu_expert(x.data() + t * H, W1[e].data(), W3[e].data(), W2[e].data(), &wt[t * k + j], 1,
                    H, I, L, tmp.data());
      for (int c = 0; c < H; ++c) ref[c] += tmp[c];
    }
    swiglu_expert(x.data() + t * H, s1.data(), s3.data(), s2.data(), nullptr, 1, H, Is, L,
                  tmp.data());
    for (int c = 0; c < H; ++c) {
      ref[c] += tmp[c];
      EXPECT_NEAR(y[t * H + c], ref[c], 1e-4 * (1 + std::abs(ref[c]))) << "seed " << seed;
    }
    // Single-token call is bitwise equal to the batched row.
    std::vector<float> one(H, std::nanf(""));
    moe_forward(x.data() + t * H, idx.data() + t * k, wt.data() + t * k, 1, H, k, E, I, ex.data(),
                &sh, Is, L, one.data());
    for (int c = 0; c < H; ++c) EXPECT_EQ(one[c], y[t * H + c]) << "seed " << seed;
  }
  idx[0] = E;
  EXPECT_THROW(
      moe_forward(x.data(), idx.data(), wt.data(), S, H, k, E, I, ex.data(), &sh, Is, L, y.data()),
      Error);
}

// Expert parallelism: each of P ranks' moe_slots (its contiguous expert share, the others' slots
// zero, poisoned buffers beforehand), summed slot by slot in rank order, then moe_combine, is
// bitwise moe_forward, for P = 1, 2, 3, 6; shapes and ranges are checked.
TEST(MoeSlots, RanksSummedThenCombinedEqualMoeForwardBitwise) {
  const unsigned seed = std::random_device{}();
  std::mt19937 g(seed);
  const int S = 9, H = 16, I = 12, Is = 8, E = 6, k = 3;
  auto x = random_vec(S * H, g, 2.0f);
  const RandomExperts experts(g, E, H, I, Is);
  const std::vector<SwigluWeights>& ex = experts.ex;
  const SwigluWeights& sh = experts.sh;
  std::vector<int32_t> idx(S * k);
  for (int t = 0; t < S; ++t) {  // k distinct experts per token, in random slot order
    std::vector<int32_t> all(E);
    for (int e = 0; e < E; ++e) all[e] = e;
    std::shuffle(all.begin(), all.end(), g);
    std::copy(all.begin(), all.begin() + k, idx.begin() + t * k);
  }
  auto wt = random_vec(S * k, g);
  const float L = 7.0f;
  std::vector<float> want(S * H, std::nanf(""));
  moe_forward(x.data(), idx.data(), wt.data(), S, H, k, E, I, ex.data(), &sh, Is, L, want.data());
  for (int P : {1, 2, 3, 6}) {
    std::vector<float> sum(S * k * H, 0.0f), part(S * k * H);
    for (int r = 0; r < P; ++r) {
      const int per = E / P;
      std::fill(part.begin(), part.end(), std::nanf(""));
      moe_slots(x.data(), idx.data(), wt.data(), S, H, k, E, I, ex.data() + r * per, r * per, per,
                L, part.data());
      for (size_t i = 0; i < sum.size(); ++i) sum[i] += part[i];
    }
    std::vector<float> y(S * H, std::nanf(""));
    moe_combine(x.data(), idx.data(), sum.data(), S, H, k, &sh, Is, L, y.data());
    EXPECT_EQ(0, std::memcmp(y.data(), want.data(), y.size() * sizeof(float)))
        << "P " << P << " seed " << seed;
  }
  std::vector<float> part(S * k * H);
  EXPECT_THROW(
      moe_slots(x.data(), idx.data(), wt.data(), S, H, k, E, I, ex.data(), 4, 3, L, part.data()),
      Error);  // experts [4, 7) outside [0, 6)
}

}  // namespace
}  // namespace dsv41rt::kernels::cpu
