#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "core/status.h"
#include "kernels/mhc.h"

namespace dsv41rt::kernels::cpu {
namespace {

TEST(Mhc, CollapseAndExpandOnIntegers) {
  // S = 1, n = 2, H = 3.
  std::vector<float> X = {1, 2, 3, 10, 20, 30}, w = {2, -1};
  std::vector<float> u(3, std::nanf(""));
  hc_collapse(X.data(), w.data(), 1, 2, 3, u.data());
  EXPECT_EQ(u, (std::vector<float>{-8, -16, -24}));
  std::vector<float> y = {1, 1, 2}, post = {3, 5};
  // comb[i][o]: out_0 = 3y + 1·X_0 + 4·X_1; out_1 = 5y + 2·X_0 + 0·X_1 (transposed use).
  std::vector<float> comb = {1, 2, 4, 0};
  std::vector<float> out(6, std::nanf(""));
  hc_expand(X.data(), y.data(), post.data(), comb.data(), 1, 2, 3, out.data());
  EXPECT_EQ(out, (std::vector<float>{3 + 1 + 40, 3 + 2 + 80, 6 + 3 + 120, 5 + 2, 5 + 4, 10 + 6}));
}

TEST(Mhc, SinkhornIsDoublyStochastic) {
  const unsigned seed = std::random_device{}();
  std::mt19937 g(seed);
  std::normal_distribution<float> d;
  for (int n : {2, 4}) {
    std::vector<float> c(3 * n * n);
    for (auto& v : c) v = d(g);  // spread 1: 300 iterations converge well below 1e-4
    // 20 iterations (the model's T) leave row sums ~1e-2 off for logits this spread, so converge
    // with more iterations to test the fixed point; T = 20 is covered against double in MixRandom.
    hc_sinkhorn(c.data(), 3, n, 1e-6f, 300);
    for (int t = 0; t < 3; ++t) {
      for (int i = 0; i < n; ++i) {
        double row = 0, col = 0;
        for (int j = 0; j < n; ++j) {
          row += c[t * n * n + i * n + j];
          col += c[t * n * n + j * n + i];
          EXPECT_GT(c[t * n * n + i * n + j], 0.0f);
        }
        EXPECT_NEAR(col, 1.0, 1e-5) << "seed " << seed;  // last step normalises columns
        EXPECT_NEAR(row, 1.0, 1e-4) << "seed " << seed;
      }
    }
  }
  // One iteration: softmax + eps, then column normalisation only. Equal logits -> 1/n everywhere.
  std::vector<float> e(4, 0.5f);
  hc_sinkhorn(e.data(), 1, 2, 0.0f, 1);
  for (float v : e) EXPECT_EQ(v, 0.5f);
}

// Straightforward double-precision model of the mixer, for random comparisons. zerr[s * W + j]:
// a bound on the FP32 evaluation's error in the mixer logit z_j (Higham's gamma_n for a K-term
// dot product, the rms factor and the scale/base steps: u * ((K + 4) * r * |scale| * sum |f fn| +
// 4 |z|), u = 2^-24), from which the sigmoid outputs' bounds follow.
void mix_ref(const std::vector<float>& X, const std::vector<float>& fn,
             const std::vector<float>& base, const std::vector<float>& scale, int S, int n, int H,
             double rms_eps, double hc_eps, int iters, std::vector<double>& pre,
             std::vector<double>& post, std::vector<double>& comb, std::vector<double>& zerr) {
  const int W = (2 + n) * n, K = n * H;
  for (int s = 0; s < S; ++s) {
    double ms = 0;
    for (int k = 0; k < K; ++k) ms += double(X[s * K + k]) * X[s * K + k];
    const double r = 1 / std::sqrt(ms / K + rms_eps);
    std::vector<double> z(W);
    const double u = std::ldexp(1.0, -24);
    for (int j = 0; j < W; ++j) {
      double acc = 0, mag = 0;
      for (int k = 0; k < K; ++k) {
        acc += double(fn[j * K + k]) * X[s * K + k];
        mag += std::abs(double(fn[j * K + k]) * X[s * K + k]);
      }
      const double sc = scale[j < n ? 0 : (j < 2 * n ? 1 : 2)];
      z[j] = base[j] + acc * r * sc;
      zerr[s * W + j] = u * ((K + 4) * r * std::abs(sc) * mag + 4 * std::abs(z[j]));
    }
    for (int i = 0; i < n; ++i) {
      pre[s * n + i] = 1 / (1 + std::exp(-z[i])) + hc_eps;
      post[s * n + i] = 2 / (1 + std::exp(-z[n + i]));
    }
    double* c = comb.data() + s * n * n;
    for (int i = 0; i < n; ++i) {
      double m = -1e300, sum = 0;
      for (int o = 0; o < n; ++o) m = std::max(m, z[2 * n + i * n + o]);
      for (int o = 0; o < n; ++o) sum += (c[i * n + o] = std::exp(z[2 * n + i * n + o] - m));
      for (int o = 0; o < n; ++o) c[i * n + o] = c[i * n + o] / sum + hc_eps;
    }
    auto cols = [&] {
      for (int o = 0; o < n; ++o) {
        double t = hc_eps;
        for (int i = 0; i < n; ++i) t += c[i * n + o];
        for (int i = 0; i < n; ++i) c[i * n + o] /= t;
      }
    };
    cols();
    for (int it = 1; it < iters; ++it) {
      for (int i = 0; i < n; ++i) {
        double t = hc_eps;
        for (int o = 0; o < n; ++o) t += c[i * n + o];
        for (int o = 0; o < n; ++o) c[i * n + o] /= t;
      }
      cols();
    }
  }
}

TEST(Mhc, MixRandomMatchesDouble) {
  const unsigned seed = std::random_device{}();
  std::mt19937 g(seed);
  std::normal_distribution<float> d;
  for (int n : {2, 4}) {
    const int S = 5, H = 48, W = (2 + n) * n, K = n * H;
    std::vector<float> X(S * K), fn(W * K), base(W), scale = {0.7f, 1.3f, 2.1f};
    for (auto& v : X) v = d(g);
    for (auto& v : fn) v = 0.1f * d(g);
    for (auto& v : base) v = 0.5f * d(g);
    std::vector<float> pre(S * n, std::nanf("")), post(S * n, std::nanf("")),
        comb(S * n * n, std::nanf(""));
    hc_mix(X.data(), fn.data(), base.data(), scale.data(), S, n, H, 1e-20f, 1e-6f, 20, pre.data(),
           post.data(), comb.data());
    std::vector<double> rp(S * n), rq(S * n), rc(S * n * n), zerr(S * W);
    mix_ref(X, fn, base, scale, S, n, H, 1e-20, 1e-6, 20, rp, rq, rc, zerr);
    // pre = sigmoid(z) + eps and post = 2 sigmoid(z) move by sigmoid' = s (1 - s) times the logit's
    // error, plus a few ulps of expf and the division (a fixed relative 1e-6 failed on correct code
    // when cancellation in the dot product left z with an absolute error near 1e-6: seed 41126489).
    const double u = std::ldexp(1.0, -24);
    for (int s = 0; s < S; ++s) {
      for (int i = 0; i < n; ++i) {
        const int at = s * n + i;
        const double sp = rp[at] - 1e-6, sq = rq[at] / 2;
        EXPECT_NEAR(pre[at], rp[at], sp * (1 - sp) * zerr[s * W + i] + 4 * u * rp[at])
            << "seed " << seed;
        EXPECT_NEAR(post[at], rq[at], 2 * sq * (1 - sq) * zerr[s * W + n + i] + 4 * u * rq[at])
            << "seed " << seed;
      }
    }
    for (int i = 0; i < S * n * n; ++i)
      EXPECT_NEAR(comb[i], rc[i], 1e-5 * rc[i] + 1e-7) << "seed " << seed;
  }
}

TEST(Mhc, CollapseExpandRandomMatchesDouble) {
  const unsigned seed = std::random_device{}();
  std::mt19937 g(seed);
  std::normal_distribution<float> d;
  const int S = 3, n = 4, H = 33;
  std::vector<float> X(S * n * H), w(S * n), y(S * H), post(S * n), comb(S * n * n);
  for (auto* v : {&X, &w, &y, &post, &comb})
    for (auto& e : *v) e = d(g);
  std::vector<float> u(S * H, std::nanf("")), out(S * n * H, std::nanf(""));
  hc_collapse(X.data(), w.data(), S, n, H, u.data());
  hc_expand(X.data(), y.data(), post.data(), comb.data(), S, n, H, out.data());
  for (int s = 0; s < S; ++s)
    for (int h = 0; h < H; ++h) {
      double ref = 0, mag = 0;
      for (int i = 0; i < n; ++i) {
        ref += double(w[s * n + i]) * X[(s * n + i) * H + h];
        mag += std::abs(double(w[s * n + i]) * X[(s * n + i) * H + h]);
      }
      EXPECT_NEAR(u[s * H + h], ref, 4e-7 * mag) << "seed " << seed;
      for (int o = 0; o < n; ++o) {
        double r2 = double(post[s * n + o]) * y[s * H + h], m2 = std::abs(r2);
        for (int i = 0; i < n; ++i) {
          const double t = double(comb[(s * n + i) * n + o]) * X[(s * n + i) * H + h];
          r2 += t;
          m2 += std::abs(t);
        }
        EXPECT_NEAR(out[(s * n + o) * H + h], r2, 5e-7 * m2) << "seed " << seed;
      }
    }
}

TEST(Mhc, BadArgumentsThrow) {
  std::vector<float> a(64), b(64), c(64), e(64), f(64);
  EXPECT_THROW(hc_mix(a.data(), b.data(), c.data(), e.data(), 1, 2, 2, 1e-6f, 1e-6f, 0, f.data(),
                      f.data(), f.data()),
               Error);
  EXPECT_THROW(hc_mix(nullptr, b.data(), c.data(), e.data(), 1, 2, 2, 1e-6f, 1e-6f, 2, f.data(),
                      f.data(), f.data()),
               Error);
  EXPECT_THROW(hc_collapse(a.data(), b.data(), 1, 0, 2, c.data()), Error);
  EXPECT_THROW(hc_expand(a.data(), b.data(), c.data(), e.data(), 1, 2, -1, f.data()), Error);
}

}  // namespace
}  // namespace dsv41rt::kernels::cpu
