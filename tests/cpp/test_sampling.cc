// Hand-computed cases for the token sampler (kernels/sampling.h): greedy and ties, top-k / top-p /
// min-p, each penalty, raw logprobs, parameter validation, and the (seed, step) determinism.
// Distribution-level checks (numpy reference, chi-square) live in tests/python/test_sampling.py.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "core/status.h"
#include "kernels/sampling.h"

namespace dsv41rt::kernels::cpu {
namespace {

const float kNaN = std::nanf("");

std::vector<float> probs_of(const std::vector<float>& logits, const SamplingParams& p,
                            const std::vector<int32_t>& prompt = {},
                            const std::vector<int32_t>& output = {}) {
  std::vector<float> probs(logits.size(), kNaN);
  sampling_probs(logits.data(), int64_t(logits.size()), p, prompt.data(), int64_t(prompt.size()),
                 output.data(), int64_t(output.size()), probs.data());
  return probs;
}

SampledToken draw(const std::vector<float>& logits, const SamplingParams& p, uint64_t step,
                  const std::vector<int32_t>& prompt = {},
                  const std::vector<int32_t>& output = {}) {
  return sample_token(logits.data(), int64_t(logits.size()), p, prompt.data(),
                      int64_t(prompt.size()), output.data(), int64_t(output.size()), step);
}

std::vector<double> softmax(const std::vector<double>& l) {
  const double mx = *std::max_element(l.begin(), l.end());
  std::vector<double> p(l.size());
  double s = 0;
  for (size_t i = 0; i < l.size(); ++i) s += p[i] = std::exp(l[i] - mx);
  for (double& x : p) x /= s;
  return p;
}

void expect_probs(const std::vector<float>& got, const std::vector<double>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-6) << "token " << i;
}

std::vector<float> random_logits(std::mt19937& g, int64_t V, float scale) {
  std::normal_distribution<float> n(0.0f, scale);
  std::vector<float> l(V);
  for (float& x : l) x = n(g);
  return l;
}

std::mt19937 fresh_rng() {
  const unsigned seed = std::random_device{}();
  std::printf("seed %u\n", seed);
  return std::mt19937(seed);
}

TEST(Sampling, GreedyTakesArgmaxLowestIdOnTies) {
  const std::vector<float> logits = {1, 3, 3, 2, -INFINITY};
  SamplingParams p;
  p.temperature = 0;
  expect_probs(probs_of(logits, p), {0, 1, 0, 0, 0});
  for (uint64_t step = 0; step < 20; ++step) {
    p.seed = step * 7919;
    EXPECT_EQ(draw(logits, p, step).token, 1);
  }
  p.temperature = 1e-6f;  // below vLLM's epsilon: greedy too
  EXPECT_EQ(draw(logits, p, 3).token, 1);
}

TEST(Sampling, TopK1IsGreedy) {
  auto g = fresh_rng();
  for (int trial = 0; trial < 20; ++trial) {
    const auto logits = random_logits(g, 300, 2.0f);
    SamplingParams p;
    p.top_k = 1;
    p.temperature = 1.5f;
    p.seed = g();
    const int32_t argmax = int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
    EXPECT_EQ(draw(logits, p, trial).token, argmax);
    const auto probs = probs_of(logits, p);
    EXPECT_EQ(probs[argmax], 1.0f);
  }
  // Ties under top_k = 1 go to the lowest id, as in greedy.
  SamplingParams p;
  p.top_k = 1;
  expect_probs(probs_of({0, 5, 5, 1}, p), {0, 1, 0, 0});
}

TEST(Sampling, TopKKeepsTheKHighest) {
  SamplingParams p;
  p.top_k = 2;
  const auto s = softmax({3, 2});
  expect_probs(probs_of({1, 3, 2, 0}, p), {0, s[0], s[1], 0});
  p.top_k = 4;  // k >= V: off
  expect_probs(probs_of({1, 3, 2, 0}, p), softmax({1, 3, 2, 0}));
  p.top_k = -1;
  expect_probs(probs_of({1, 3, 2, 0}, p), softmax({1, 3, 2, 0}));
}

TEST(Sampling, TopPSmallestPrefixReachingMass) {
  // p = {0.5, 0.3, 0.2} (ids 2, 0, 1 after a permutation to exercise the sort).
  const std::vector<float> logits = {std::log(0.3f), std::log(0.2f), std::log(0.5f)};
  SamplingParams p;
  p.top_p = 0.79f;  // 0.5 < 0.79 <= 0.8: the two largest
  expect_probs(probs_of(logits, p), {0.375, 0, 0.625});
  p.top_p = 0.81f;  // all three
  expect_probs(probs_of(logits, p), {0.3, 0.2, 0.5});
  p.top_p = 0.5f;  // the first token alone reaches 0.5
  expect_probs(probs_of(logits, p), {0, 0, 1});
  p.top_p = 1e-6f;  // tiny: the max only
  expect_probs(probs_of(logits, p), {0, 0, 1});
  // top-k then top-p: top_k 2 renormalises to {0.625, 0.375}; top_p 0.6 keeps only the max.
  p.top_k = 2;
  p.top_p = 0.6f;
  expect_probs(probs_of(logits, p), {0, 0, 1});
}

TEST(Sampling, TopPTinyKeepsTheMaxOnRandomLogits) {
  auto g = fresh_rng();
  const auto logits = random_logits(g, 1000, 3.0f);
  SamplingParams p;
  p.top_p = 1e-7f;
  const auto probs = probs_of(logits, p);
  const auto argmax = std::max_element(logits.begin(), logits.end()) - logits.begin();
  EXPECT_EQ(probs[argmax], 1.0f);
}

TEST(Sampling, MinPRelativeToMaxAfterTemperature) {
  // Weights relative to the max: {1, 0.5, 0.2, 0.1}.
  const std::vector<float> logits = {0, std::log(0.5f), std::log(0.2f), std::log(0.1f)};
  SamplingParams p;
  p.min_p = 0.3f;
  expect_probs(probs_of(logits, p), {2.0 / 3, 1.0 / 3, 0, 0});
  // Temperature 0.5 squares the ratios: {1, 0.25, 0.04, 0.01}; min_p 0.2 keeps two.
  p.temperature = 0.5f;
  p.min_p = 0.2f;
  expect_probs(probs_of(logits, p), {0.8, 0.2, 0, 0});
  p.min_p = 1.0f;  // only the max
  expect_probs(probs_of(logits, p), {1, 0, 0, 0});
}

TEST(Sampling, PenaltiesByHand) {
  const std::vector<float> logits = {2, -1, 1, 0.5};
  const std::vector<int32_t> prompt = {0}, output = {1, 1, 2};
  SamplingParams p;
  // Repetition 2 on prompt ∪ output = {0, 1, 2}: positive / 2, negative * 2.
  p.repetition_penalty = 2;
  expect_probs(probs_of(logits, p, prompt, output), softmax({1, -2, 0.5, 0.5}));
  // Frequency 0.5 on the output counts {1: 2, 2: 1}; the prompt does not count.
  p = SamplingParams{};
  p.frequency_penalty = 0.5f;
  expect_probs(probs_of(logits, p, prompt, output), softmax({2, -2, 0.5, 0.5}));
  // Presence 1 on output tokens {1, 2}.
  p = SamplingParams{};
  p.presence_penalty = 1;
  expect_probs(probs_of(logits, p, prompt, output), softmax({2, -2, 0, 0.5}));
  // All three, with temperature 0.5: ((l rep) - freq*c - pres) / T.
  p.repetition_penalty = 2;
  p.frequency_penalty = 0.5f;
  p.temperature = 0.5f;
  expect_probs(probs_of(logits, p, prompt, output),
               softmax({1 / 0.5, (-2 - 1 - 1) / 0.5, (0.5 - 0.5 - 1) / 0.5, 0.5 / 0.5}));
  // Negative presence rewards a generated token. Penalties change the greedy choice.
  p = SamplingParams{};
  p.temperature = 0;
  p.presence_penalty = 0.5f;
  EXPECT_EQ(draw({2, 1.9f}, p, 0, {}, {0}).token, 1);
  p.presence_penalty = -0.5f;
  EXPECT_EQ(draw({1.9f, 2}, p, 0, {}, {0}).token, 0);
  p.presence_penalty = 0;
  p.repetition_penalty = 1.2f;  // the prompt counts for the repetition penalty
  EXPECT_EQ(draw({2, 1.9f}, p, 0, {0}, {}).token, 1);
}

TEST(Sampling, LogprobsAreRawLogSoftmax) {
  const std::vector<float> logits = {1, 2, 3, 3, -INFINITY};
  const double lse = std::log(std::exp(1.0) + std::exp(2.0) + 2 * std::exp(3.0));
  SamplingParams p;
  p.temperature = 0;
  p.repetition_penalty = 3;  // greedy picks 1 after the penalty: {1, 2, 1, 1}
  p.top_logprobs = 3;
  const auto s = draw(logits, p, 0, {2, 3}, {});
  EXPECT_EQ(s.token, 1);
  EXPECT_NEAR(s.logprob, 2 - lse, 1e-6);  // raw, not the penalised distribution
  ASSERT_EQ(s.top_ids, (std::vector<int32_t>{2, 3, 1}));
  ASSERT_EQ(s.top_logprobs.size(), 3u);
  EXPECT_NEAR(s.top_logprobs[0], 3 - lse, 1e-6);
  EXPECT_NEAR(s.top_logprobs[1], 3 - lse, 1e-6);
  EXPECT_NEAR(s.top_logprobs[2], 2 - lse, 1e-6);
  p.top_logprobs = 20;  // more than V: all V, the masked one at -inf last
  const auto all = draw(logits, p, 0);
  ASSERT_EQ(all.top_ids, (std::vector<int32_t>{2, 3, 1, 0, 4}));
  EXPECT_TRUE(std::isinf(all.top_logprobs[4]) && all.top_logprobs[4] < 0);
  p.top_logprobs = 0;
  EXPECT_TRUE(draw(logits, p, 0).top_ids.empty());
}

TEST(Sampling, InvalidParamsNameTheField) {
  auto expect_error = [](SamplingParams p, const std::string& field) {
    try {
      validate_sampling_params(p, 10);
      ADD_FAILURE() << "no error for " << field;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(field), std::string::npos) << e.what();
    }
    const std::vector<float> logits(10, 0.0f);
    std::vector<float> probs(10);
    EXPECT_THROW(sampling_probs(logits.data(), 10, p, nullptr, 0, nullptr, 0, probs.data()), Error);
    EXPECT_THROW(sample_token(logits.data(), 10, p, nullptr, 0, nullptr, 0, 0), Error);
  };
  SamplingParams p;
  for (float bad : {-0.1f, kNaN, INFINITY}) p.temperature = bad, expect_error(p, "temperature");
  p = {};
  for (float bad : {0.0f, -0.5f, 1.01f, kNaN}) p.top_p = bad, expect_error(p, "top_p");
  p = {};
  for (float bad : {-0.01f, 1.5f, kNaN}) p.min_p = bad, expect_error(p, "min_p");
  p = {};
  for (float bad : {0.0f, -1.0f, kNaN, INFINITY}) {
    p.repetition_penalty = bad, expect_error(p, "repetition_penalty");
  }
  p = {};
  for (float bad : {2.5f, -3.0f, kNaN})
    p.presence_penalty = bad, expect_error(p, "presence_penalty");
  p = {};
  for (float bad : {2.5f, -3.0f, kNaN}) {
    p.frequency_penalty = bad, expect_error(p, "frequency_penalty");
  }
  p = {};
  for (int bad : {-1, 21}) p.top_logprobs = bad, expect_error(p, "top_logprobs");
  p = {};
  p.top_k = -2;
  expect_error(p, "top_k");
  // Valid corners.
  p = {};
  p.temperature = 0, p.top_p = 1, p.min_p = 1, p.top_k = -1, p.top_logprobs = 20;
  p.presence_penalty = -2, p.frequency_penalty = 2, p.repetition_penalty = 1e-3f;
  EXPECT_NO_THROW(validate_sampling_params(p, 10));
  EXPECT_THROW(validate_sampling_params(SamplingParams{}, 0), Error);
}

TEST(Sampling, InvalidInputsThrow) {
  SamplingParams p;
  std::vector<float> probs(3);
  EXPECT_THROW(probs_of({0, kNaN, 1}, p), Error);
  EXPECT_THROW(probs_of({0, INFINITY, 1}, p), Error);
  EXPECT_THROW(probs_of({-INFINITY, -INFINITY}, p), Error);
  EXPECT_THROW(probs_of({0, 1, 2}, p, {3}), Error);
  EXPECT_THROW(probs_of({0, 1, 2}, p, {}, {-1}), Error);
}

TEST(Sampling, MaskedTokensAreNeverDrawn) {
  std::vector<float> logits(64, 0.0f);
  for (size_t i = 0; i < logits.size(); i += 2) logits[i] = -INFINITY;
  SamplingParams p;
  for (uint64_t step = 0; step < 500; ++step) EXPECT_EQ(draw(logits, p, step).token % 2, 1);
}

TEST(Sampling, PoisonedOutputsFullyWritten) {
  auto g = fresh_rng();
  const auto logits = random_logits(g, 777, 2.0f);
  SamplingParams p;
  p.temperature = 0.7f, p.top_k = 50, p.top_p = 0.9f, p.min_p = 0.05f;
  std::vector<float> probs(logits.size(), kNaN);
  sampling_probs(logits.data(), int64_t(logits.size()), p, nullptr, 0, nullptr, 0, probs.data());
  double sum = 0;
  int kept = 0;
  for (float x : probs) {
    ASSERT_TRUE(std::isfinite(x));
    ASSERT_GE(x, 0.0f);
    sum += x;
    kept += x > 0;
  }
  EXPECT_NEAR(sum, 1.0, 1e-5);
  EXPECT_GE(kept, 1);
  EXPECT_LE(kept, 50);
}

TEST(Sampling, DrawIsInverseCdfOfTheUniform) {
  auto g = fresh_rng();
  for (int trial = 0; trial < 200; ++trial) {
    const auto logits = random_logits(g, 50, 1.5f);
    SamplingParams p;
    p.temperature = 0.8f, p.top_p = 0.95f, p.seed = (uint64_t(g()) << 32) | g();
    const uint64_t step = g() % 1000;
    const auto probs = probs_of(logits, p);
    const double u = sampling_uniform(p.seed, step);
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
    const int32_t t = draw(logits, p, step).token;
    ASSERT_GT(probs[t], 0.0f);
    double before = 0;
    for (int32_t i = 0; i < t; ++i) before += probs[i];
    EXPECT_LE(before, u + 1e-6);
    EXPECT_LT(u, before + probs[t] + 1e-6);
  }
}

TEST(Sampling, UniformLooksUniform) {
  // Mean and the four quartile counts over 40k (seed, step) pairs: crude, catches a broken mix.
  double sum = 0;
  int quart[4] = {0, 0, 0, 0};
  const int n = 40000;
  for (int i = 0; i < n; ++i) {
    const double u = sampling_uniform(uint64_t(i / 200), uint64_t(i % 200));
    sum += u;
    ++quart[std::min(3, int(u * 4))];
  }
  EXPECT_NEAR(sum / n, 0.5, 0.01);
  for (int q : quart) EXPECT_NEAR(q, n / 4, 600);
  EXPECT_NE(sampling_uniform(0, 0), sampling_uniform(0, 1));
  EXPECT_NE(sampling_uniform(0, 0), sampling_uniform(1, 0));
}

TEST(Sampling, DeterministicInSeedAndStepOnly) {
  auto g = fresh_rng();
  const auto logits = random_logits(g, 500, 1.0f);
  const auto other = random_logits(g, 500, 1.0f);
  const std::vector<int32_t> prompt = {3, 4, 5}, output = {7, 7, 9};
  SamplingParams p;
  p.temperature = 0.9f, p.top_k = 100, p.presence_penalty = 0.3f, p.seed = g();
  std::vector<int32_t> first;
  for (uint64_t step = 0; step < 64; ++step)
    first.push_back(draw(logits, p, step, prompt, output).token);
  // Different order, interleaved with other requests (other seeds / logits), on other threads.
  std::vector<int32_t> again(64, -1);
  std::vector<std::thread> threads;
  for (int th = 0; th < 4; ++th) {
    threads.emplace_back([&, th] {
      SamplingParams q = p;
      q.seed = p.seed + 1 + th;
      for (int64_t step = 63 - th; step >= 0; step -= 4) {
        (void)draw(other, q, uint64_t(step));
        again[step] = draw(logits, p, uint64_t(step), prompt, output).token;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(first, again);
  // The token varies with the step and with the seed.
  std::vector<int32_t> sorted = first;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_GT(std::unique(sorted.begin(), sorted.end()) - sorted.begin(), 10);
  int differ = 0;
  SamplingParams q = p;
  q.seed = p.seed ^ 0x5555;
  for (uint64_t step = 0; step < 64; ++step) {
    differ += draw(logits, q, step, prompt, output).token != first[step];
  }
  EXPECT_GT(differ, 32);
}

}  // namespace
}  // namespace dsv41rt::kernels::cpu
