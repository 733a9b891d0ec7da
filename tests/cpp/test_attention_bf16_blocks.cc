// sparse_attention_bf16_blocks (kernels/attention.h): the official sparse_attn kernel's numerics
// (docs/design/fp8-attention-numerics.md), checked three ways:
//   - a hand-computed case;
//   - the closed form of the same definition, written independently of the recurrence: with M_t
//     the running maximum after block t and M the last,
//       o = sum_j bf16(p_j) e^(M_t(j) - M) k_j,  l = sum_j p_j e^(M_t(j) - M) + e^(sink - M),
//       p_j = fp32(exp(s_j - M_t(j))),
//     so the two differ by FP64 rounding only: out == bf16(o / l) except where o / l lies within
//     1e-12 (relative) of a BF16 rounding boundary;
//   - against FP32 attention (sparse_attention_split): the BF16 roundings of q (moving a score by
//     at most d_j = 2^-9 scale sum_d |q_d k_d|), of p (2^-9) and of the output (2^-9) bound the
//     difference by 2 (e^(2 max d_j) - 1 + 2^-9) max|k| + 2^-8 |out| + 1e-6 max|k| (weights of
//     a convex combination perturbed by a relative e move it by at most 2e max|k|; FP32 sums).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "core/dtype.h"
#include "core/status.h"
#include "kernels/attention.h"

namespace dsv41rt::kernels::cpu {
namespace {

const float kNaN = std::nanf("");

float bf16(float v) { return bf16_to_f32(f32_to_bf16(v)); }

// Whether v lies within `rel` (relative) of the midpoint between the BF16 value it rounds to and a
// neighbour, where a difference of that size may round either way.
bool near_bf16_boundary(double v, double rel) {
  const uint16_t c = f32_to_bf16(float(v));
  for (const int step : {-1, 1}) {
    const double mid = (double(bf16_to_f32(c)) + bf16_to_f32(uint16_t(c + step))) / 2;
    if (std::abs(v - mid) <= rel * std::abs(v)) return true;
  }
  return false;
}

struct Problem {
  int64_t S, H, D, T, K;
  std::vector<float> q, kv, sink;
  std::vector<int32_t> idx;
};

Problem random_problem(uint32_t seed, int64_t S, int64_t H, int64_t D, int64_t T, int64_t K) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> n(0.0f, 1.0f);
  Problem p{S, H, D, T, K, {}, {}, {}, {}};
  for (int64_t i = 0; i < S * H * D; ++i) p.q.push_back(n(rng));
  for (int64_t i = 0; i < T * D; ++i) p.kv.push_back(bf16(n(rng)));  // cache rows: BF16 values
  for (int64_t h = 0; h < H; ++h) p.sink.push_back(n(rng));
  std::uniform_int_distribution<int32_t> row(0, int32_t(T - 1));
  for (int64_t s = 0; s < S; ++s) {
    for (int64_t k = 0; k < K; ++k) {
      // Query 0's first block is all invalid; elsewhere a tenth of the entries.
      const bool invalid = (s == 0 && k < kSparseAttentionBf16Block) || rng() % 10 == 0;
      p.idx.push_back(invalid ? -1 : row(rng));
    }
  }
  return p;
}

std::vector<float> run(const Problem& p, float scale) {
  std::vector<float> out(size_t(p.S * p.H * p.D), kNaN);
  sparse_attention_bf16_blocks(p.q.data(), p.kv.data(), p.T, nullptr, 0, p.idx.data(),
                               p.sink.data(), p.S, p.H, p.D, p.K, scale, out.data());
  return out;
}

TEST(SparseAttentionBf16Blocks, HandComputed) {
  // One head, D = 2, three keys with equal scores (q·k = 1): every p is exp(0) = 1, so the output
  // is the keys' sum over 3 + e^(sink - 1), rounded to BF16.
  std::vector<float> q = {1, 0}, kv = {1, 2, 1, -4, 1, 0.5f}, sink = {0.25f}, out(2, kNaN);
  std::vector<int32_t> idx = {0, 1, -1, 2};
  sparse_attention_bf16_blocks(q.data(), kv.data(), 3, nullptr, 0, idx.data(), sink.data(), 1, 1, 2,
                               4, 1.0f, out.data());
  const double l = 3 + std::exp(0.25 - 1.0);
  EXPECT_EQ(out[0], bf16(float(3 / l)));
  EXPECT_EQ(out[1], bf16(float(-1.5 / l)));
}

TEST(SparseAttentionBf16Blocks, EqualsTheClosedFormOfItsDefinition) {
  for (const uint32_t seed : {1u, 2u, 3u}) {
    // K 200: three full blocks and a partial one; query 0's first block has no valid index.
    const Problem p = random_problem(seed, 3, 4, 64, 300, 200);
    const float scale = 0.125f;
    const std::vector<float> out = run(p, scale);
    int64_t near_boundary = 0;
    for (int64_t s = 0; s < p.S; ++s) {
      for (int64_t h = 0; h < p.H; ++h) {
        const float* qh = p.q.data() + (s * p.H + h) * p.D;
        std::vector<float> sc(size_t(p.K)), mt(size_t(p.K));
        double m = -std::numeric_limits<double>::infinity();
        for (int64_t k = 0; k < p.K; ++k) {
          if (k % kSparseAttentionBf16Block == 0) {  // the running maximum after this block
            for (int64_t j = k; j < std::min(p.K, k + kSparseAttentionBf16Block); ++j) {
              const int32_t r = p.idx[size_t(s * p.K + j)];
              if (r < 0) continue;
              double dot = 0;
              for (int64_t d = 0; d < p.D; ++d)
                dot += double(bf16(qh[d])) * p.kv[size_t(r * p.D + d)];
              sc[size_t(j)] = float(dot) * scale;
              m = std::max(m, double(sc[size_t(j)]));
            }
          }
          mt[size_t(k)] = float(m);
        }
        std::vector<double> o(size_t(p.D), 0.0);
        double l = std::exp(double(p.sink[size_t(h)]) - m);
        for (int64_t k = 0; k < p.K; ++k) {
          const int32_t r = p.idx[size_t(s * p.K + k)];
          if (r < 0) continue;
          const float pj = float(std::exp(double(sc[size_t(k)] - mt[size_t(k)])));
          const double w = std::exp(double(mt[size_t(k)]) - m);
          l += double(pj) * w;
          for (int64_t d = 0; d < p.D; ++d)
            o[size_t(d)] += double(bf16(pj)) * w * p.kv[size_t(r * p.D + d)];
        }
        for (int64_t d = 0; d < p.D; ++d) {
          const double want = o[size_t(d)] / l;
          const float got = out[size_t((s * p.H + h) * p.D + d)];
          if (got == bf16(float(want))) continue;
          ASSERT_TRUE(near_bf16_boundary(want, 1e-12))
              << "seed " << seed << " s " << s << " h " << h << " d " << d << ": " << got << " vs "
              << want;
          ++near_boundary;
        }
      }
    }
    EXPECT_LE(near_boundary, 2) << "seed " << seed;
  }
}

TEST(SparseAttentionBf16Blocks, IsFp32AttentionUpToItsBf16Roundings) {
  const Problem p = random_problem(7, 4, 8, 128, 500, 640);
  const float scale = 1.0f / std::sqrt(128.0f);
  const std::vector<float> out = run(p, scale);
  std::vector<float> exact(out.size(), kNaN);
  sparse_attention_split(p.q.data(), p.kv.data(), p.T, nullptr, 0, p.idx.data(), p.sink.data(), p.S,
                         p.H, p.D, p.K, scale, exact.data());
  float kmax = 0;
  for (const float v : p.kv) kmax = std::max(kmax, std::abs(v));
  double worst = 0;
  for (int64_t s = 0; s < p.S; ++s) {
    for (int64_t h = 0; h < p.H; ++h) {
      const float* qh = p.q.data() + (s * p.H + h) * p.D;
      double dmax = 0;  // the largest score move from rounding q
      for (int64_t k = 0; k < p.K; ++k) {
        const int32_t r = p.idx[size_t(s * p.K + k)];
        if (r < 0) continue;
        double a = 0;
        for (int64_t d = 0; d < p.D; ++d) a += std::abs(double(qh[d]) * p.kv[size_t(r * p.D + d)]);
        dmax = std::max(dmax, std::ldexp(1.0, -9) * scale * a);
      }
      const double e = std::expm1(2 * dmax) + std::ldexp(1.0, -9);
      for (int64_t d = 0; d < p.D; ++d) {
        const size_t i = size_t((s * p.H + h) * p.D + d);
        const double bound = 2 * e * kmax + std::ldexp(1.0, -8) * std::abs(out[i]) + 1e-6 * kmax;
        const double err = std::abs(double(out[i]) - exact[i]);
        ASSERT_LE(err, bound) << "s " << s << " h " << h << " d " << d;
        worst = std::max(worst, err / bound);
      }
    }
  }
  std::printf("largest |bf16 blocks - fp32| / bound: %.3g\n", worst);
}

TEST(SparseAttentionBf16Blocks, SplitKeysNoValidKeyAndBadIndex) {
  const Problem p = random_problem(11, 2, 2, 32, 90, 130);
  const std::vector<float> whole = run(p, 0.3f);
  // The same keys as two arrays (rows 0..39 and 40..89): bitwise the same.
  std::vector<float> split(whole.size(), kNaN);
  sparse_attention_bf16_blocks(p.q.data(), p.kv.data(), 40, p.kv.data() + 40 * p.D, 50,
                               p.idx.data(), p.sink.data(), p.S, p.H, p.D, p.K, 0.3f, split.data());
  EXPECT_EQ(split, whole);
  std::vector<int32_t> none(size_t(p.K), -1), bad(size_t(p.K), 0);
  bad[5] = int32_t(p.T);
  std::vector<float> out(size_t(p.H * p.D), kNaN);
  sparse_attention_bf16_blocks(p.q.data(), p.kv.data(), p.T, nullptr, 0, none.data(), p.sink.data(),
                               1, p.H, p.D, p.K, 0.3f, out.data());
  EXPECT_EQ(out, std::vector<float>(out.size(), 0.0f));
  EXPECT_THROW(sparse_attention_bf16_blocks(p.q.data(), p.kv.data(), p.T, nullptr, 0, bad.data(),
                                            p.sink.data(), 1, p.H, p.D, p.K, 0.3f, out.data()),
               Error);
}

}  // namespace
}  // namespace dsv41rt::kernels::cpu
