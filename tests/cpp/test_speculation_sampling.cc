// Rejection sampling of a verify's rows (engine/speculation.h, accept_sampled) on a small
// vocabulary: over many seeds, the first emitted token follows the target's filtered distribution
// (chi-square against sampling_probs) whichever draft is proposed (likely, unlikely, filtered
// out), and the token after an accepted draft follows the next row's; the acceptance rate of a
// draft is its target probability; logprobs are the raw ones the sampler reports. No model.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <vector>

#include "kernels/sampling.h"
#include "runtime/engine/speculation.h"

namespace dsv41rt::engine {
namespace {

constexpr int64_t kV = 8;

// Two verify rows [last, d] of fixed logits over kV tokens.
Verify verify(int32_t draft) {
  Verify v;
  v.fed = {3, draft};
  v.logits = {0.5f, 1.0f,  -0.3f, 2.0f, 0.1f, 1.5f,  -1.0f, 0.7f,   // row 0
              1.2f, -0.5f, 0.3f,  0.0f, 2.2f, -2.0f, 0.9f,  0.4f};  // row 1
  return v;
}

SchedRequest request() {
  SchedRequest r;
  r.id = 1;
  r.tokens = {1, 2, 5, 3};  // prompt [1, 2, 5], then the last generated token 3 (not fed yet)
  r.prompt_len = 3;
  r.max_new_tokens = 100;
  return r;
}

// Pearson's statistic of `counts` against `n` draws of `probs` (cells with p = 0 must be empty).
double chi_square(const std::vector<int64_t>& counts, const std::vector<float>& probs, int64_t n,
                  int* df) {
  double x2 = 0;
  *df = -1;
  for (int64_t t = 0; t < kV; ++t) {
    if (probs[size_t(t)] <= 0) {
      EXPECT_EQ(counts[size_t(t)], 0) << "token " << t << " has probability 0";
      continue;
    }
    const double e = double(probs[size_t(t)]) * double(n);
    x2 += (double(counts[size_t(t)]) - e) * (double(counts[size_t(t)]) - e) / e;
    ++*df;
  }
  return x2;
}

// The 99.9% quantiles of chi-square with 1..7 degrees of freedom.
double critical(int df) {
  static const double q[] = {0, 10.83, 13.82, 16.27, 18.47, 20.52, 22.46, 24.32};
  return q[df];
}

void check_draft(int32_t draft, const kernels::SamplingParams& base) {
  SCOPED_TRACE("draft " + std::to_string(draft) + ", top_k " + std::to_string(base.top_k));
  const Verify v = verify(draft);
  const SchedRequest r = request();
  const auto no_stops = [](int32_t) { return false; };
  std::vector<float> p0(kV), p1(kV);
  const std::vector<int32_t> out0 = {3};
  kernels::cpu::sampling_probs(v.logits.data(), kV, base, r.tokens.data(), 3, out0.data(), 1,
                               p0.data());
  const std::vector<int32_t> out1 = {3, draft};
  kernels::cpu::sampling_probs(v.logits.data() + kV, kV, base, r.tokens.data(), 3, out1.data(), 2,
                               p1.data());
  const int64_t n = 20000;
  std::vector<int64_t> first(kV, 0), second(kV, 0);
  int64_t accepted = 0;
  for (int64_t seed = 0; seed < n; ++seed) {
    kernels::SamplingParams sp = base;
    sp.seed = uint64_t(seed) * 7919 + 1;
    const std::vector<kernels::SampledToken> got = accept_sampled(v, kV, sp, r, no_stops);
    ASSERT_GE(got.size(), 1u);
    ASSERT_LE(got.size(), 2u);
    ++first[size_t(got[0].token)];
    // The raw logprob of the emitted token (what the sampler reports), whatever drew it.
    const float* row = v.logits.data();
    double mx = row[0], sum = 0;
    for (int64_t t = 1; t < kV; ++t) mx = std::max<double>(mx, row[t]);
    for (int64_t t = 0; t < kV; ++t) sum += std::exp(double(row[t]) - mx);
    EXPECT_EQ(got[0].logprob, float(double(row[got[0].token]) - (mx + std::log(sum))));
    if (got[0].token == draft) {
      ++accepted;
      ASSERT_EQ(got.size(), 2u);  // the bonus token of the next row
      ++second[size_t(got[1].token)];
    } else {
      ASSERT_EQ(got.size(), 1u);
    }
  }
  int df = 0;
  const double x0 = chi_square(first, p0, n, &df);
  if (df > 0) {
    EXPECT_LT(x0, critical(df)) << "first token, " << df << " degrees of freedom";
  }
  // Accepted with probability p0(draft): a binomial within 4 standard deviations.
  const double mean = double(p0[size_t(draft)]) * double(n);
  EXPECT_LE(std::abs(double(accepted) - mean), 4 * std::sqrt(mean * (1 - p0[size_t(draft)])) + 1);
  if (accepted > 200) {
    const double x1 = chi_square(second, p1, accepted, &df);
    if (df > 0) {
      EXPECT_LT(x1, critical(df)) << "bonus token";
    }
  }
}

TEST(SpeculationSampling, RejectionSamplingKeepsTheTargetDistribution) {
  kernels::SamplingParams p;
  p.temperature = 1.0f;
  for (int32_t draft : {3, 5, 0, 6}) check_draft(draft, p);  // likely .. unlikely
  p.top_k = 4;                                               // a small slice: 3, 5, 1, 7
  p.temperature = 0.8f;
  for (int32_t draft : {3, 1, 6}) check_draft(draft, p);  // 6 is filtered out: always rejected
  p.top_k = 0;
  p.repetition_penalty = 1.3f;  // penalties follow the accepted draft into the next row
  check_draft(5, p);
}

TEST(SpeculationSampling, StopsAndTheLastAllowedTokenEndTheBlock) {
  kernels::SamplingParams p;
  p.temperature = 1.0f;
  const Verify v = verify(3);
  SchedRequest r = request();
  for (int64_t seed = 0; seed < 200; ++seed) {
    p.seed = uint64_t(seed);
    const auto got = accept_sampled(v, kV, p, r, [](int32_t t) { return t == 3; });
    ASSERT_EQ(got.size(), 1u);  // the draft 3 is a stop token: nothing after it
  }
  r.max_new_tokens = 2;  // one generated, one more allowed
  for (int64_t seed = 0; seed < 200; ++seed) {
    p.seed = uint64_t(seed);
    ASSERT_EQ(accept_sampled(v, kV, p, r, [](int32_t) { return false; }).size(), 1u);
  }
}

}  // namespace
}  // namespace dsv41rt::engine
