// Backend::sample (contract: kernels/sampling.h; CUDA: kernels/cuda/sampling.cuh).
//
// References and bounds:
//   - The distribution: N = 20000 draws (seeds 0..N-1) of one logits row, chi-square goodness of
//     fit against kernels::cpu::sampling_probs, bins with an expected count < 5 merged; the test
//     fails when p < 1e-4 (df = bins − 1), so a correct sampler fails one setting in 10^4 runs.
//     Tokens outside the filtered support must never be drawn (exact).
//   - Tokens: EXACTLY kernels::cpu::sample_token's for the same logits, history, seed and step, on
//     both instances (sampling.cuh: the same FP64 pipeline, sums in the CPU's order, the CPU's
//     counter-based uniform). Greedy: the first argmax of the penalised logits (exact).
//   - Raw logprobs and top alternatives: top ids exactly (logit descending, ties to the lower id);
//     logprobs on the CPU within one FP32 ulp of a float64 log_softmax written here (both round an
//     FP64 value once), on CUDA within 1e-5 of the CPU's (device exp/log in a different sum order).
//   - Token masks (Backend::mask_tokens): EXACT on both instances against a naive loop written
//     here (masked tokens -inf, every other logit untouched, rows not named untouched).
//   - Logits the CPU sampler refuses (NaN, +inf, nothing finite): the CPU backend throws Error, the
//     CUDA backend draws token −1 for that row and samples the other rows normally.
#include <algorithm>
#include <numeric>

#include "backend_test_util.h"
#include "core/status.h"
#include "kernels/sampling.h"

namespace dsv41rt::testing {
namespace {

using kernels::SamplingParams;

// Q(a, x) = Γ(a, x) / Γ(a), the upper regularised incomplete gamma (series below a + 1, Lentz's
// continued fraction above): the chi-square tail is Q(df / 2, χ² / 2).
double gamma_q(double a, double x) {
  if (x <= 0) return 1.0;
  const double front = std::exp(-x + a * std::log(x) - std::lgamma(a));
  if (x < a + 1) {
    double ap = a, term = 1.0 / a, sum = term;
    for (int n = 0; n < 10000 && std::abs(term) > std::abs(sum) * 1e-16; ++n)
      sum += term *= x / ++ap;
    return 1.0 - sum * front;
  }
  double b = x + 1 - a, c = 1e300, d = 1.0 / b, h = d;
  for (int i = 1; i < 10000; ++i) {
    const double an = -i * (i - a);
    b += 2;
    d = an * d + b, c = b + an / c;
    d = 1.0 / (std::abs(d) < 1e-300 ? 1e-300 : d), c = std::abs(c) < 1e-300 ? 1e-300 : c;
    h *= d * c;
    if (std::abs(d * c - 1) < 1e-16) break;
  }
  return front * h;
}

// One Backend::sample call, host side: row r samples logits row logit_rows[r]; its prompt is
// history[prompt_off[r]..prompt_off[r+1]) and its output history[output_off[r]..output_off[r+1]).
struct Batch {
  std::vector<float> logits;
  int64_t V = 0;
  std::vector<int64_t> logit_rows, prompt_off = {0}, output_off = {0};  // output_off: into outputs
  std::vector<SamplingParams> params;
  std::vector<int32_t> prompts, outputs;  // history = prompts then outputs
  std::vector<uint64_t> steps;
  int32_t max_top = 0;
  void add(int64_t logit_row, const SamplingParams& p, uint64_t step,
           const std::vector<int32_t>& prompt = {}, const std::vector<int32_t>& output = {}) {
    logit_rows.push_back(logit_row), params.push_back(p), steps.push_back(step);
    prompts.insert(prompts.end(), prompt.begin(), prompt.end());
    outputs.insert(outputs.end(), output.begin(), output.end());
    prompt_off.push_back(int64_t(prompts.size()));
    output_off.push_back(int64_t(outputs.size()));
  }
  int64_t rows() const { return int64_t(params.size()); }
  // The CPU reference for row r.
  kernels::SampledToken reference(int64_t r) const {
    return kernels::cpu::sample_token(
        &logits[logit_rows[r] * V], V, params[r], prompts.data() + prompt_off[r],
        prompt_off[r + 1] - prompt_off[r], outputs.data() + output_off[r],
        output_off[r + 1] - output_off[r], steps[r]);
  }
};

struct Drawn {
  std::vector<int32_t> tokens, top_ids;
  std::vector<float> logprobs, top_logprobs;
};

Drawn sample(Backend& b, const Batch& in) {
  std::vector<int32_t> history = in.prompts;
  history.insert(history.end(), in.outputs.begin(), in.outputs.end());
  std::vector<int64_t> output_off = in.output_off;  // the outputs follow the prompts
  for (int64_t& o : output_off) o += int64_t(in.prompts.size());
  const int64_t rows = in.rows();
  Buffer<float> logits = upload(b, in.logits);
  Buffer<int64_t> logit_rows = upload(b, in.logit_rows), poff = upload(b, in.prompt_off),
                  ooff = upload(b, output_off);
  Buffer<SamplingParams> params = upload(b, in.params);
  Buffer<int32_t> hist = upload(b, history.empty() ? std::vector<int32_t>{0} : history);
  Buffer<uint64_t> steps = upload(b, in.steps);
  Buffer<int32_t> tokens = poisoned<int32_t>(b, rows, kIndexPoison),
                  top_ids = poisoned<int32_t>(b, rows * in.max_top, kIndexPoison);
  Buffer<float> logprobs = poisoned<float>(b, rows), top_lp = poisoned<float>(b, rows * in.max_top);
  ScratchArena scratch(b);
  b.sample(logits.get(), logit_rows.get(), rows, in.V, params.get(), hist.get(), poff.get(),
           ooff.get(), steps.get(), tokens.get(), logprobs.get(), in.max_top, top_ids.get(),
           top_lp.get(), scratch.get(), b.stream(0));
  return {tokens.download(), top_ids.download(), logprobs.download(), top_lp.download()};
}

class BackendSampling : public BackendTest {};

TEST(BackendSamplingStats, ChiSquareTailMatchesTables) {
  // Upper 5% / 0.01% points of the chi-square distribution (standard tables).
  EXPECT_NEAR(gamma_q(0.5, 3.841459 / 2), 0.05, 1e-6);
  EXPECT_NEAR(gamma_q(5.0, 18.307038 / 2), 0.05, 1e-6);
  EXPECT_NEAR(gamma_q(31.5, 113.504993 / 2), 1e-4, 1e-9);  // df 63
}

TEST_P(BackendSampling, DrawsFollowSamplingProbsAndEqualTheCpuTokens) {
  const int64_t V = 64, N = 20000;
  const std::vector<float> logits = normal(V, 2.0);
  std::vector<int32_t> prompt(10), output(12);
  for (int32_t& t : prompt) t = int32_t(randint(0, V - 1));
  for (int32_t& t : output) t = int32_t(randint(0, V - 1));
  struct Setting {
    float temperature;
    int32_t top_k;
    float top_p, min_p, presence, frequency, repetition;
  };
  for (const Setting& st : {Setting{1, 0, 1, 0, 0, 0, 1}, Setting{0.7f, 20, 1, 0, 0, 0, 1},
                            Setting{1.3f, 0, 0.8f, 0, 0, 0, 1}, Setting{1, 0, 1, 0.05f, 0, 0, 1},
                            Setting{0.9f, 40, 0.9f, 0, 0.5f, 0.3f, 1.3f}}) {
    SamplingParams p;
    p.temperature = st.temperature, p.top_k = st.top_k, p.top_p = st.top_p, p.min_p = st.min_p;
    p.presence_penalty = st.presence, p.frequency_penalty = st.frequency,
    p.repetition_penalty = st.repetition;
    SCOPED_TRACE("temperature " + std::to_string(p.temperature) + " top_k " +
                 std::to_string(p.top_k) + " top_p " + std::to_string(p.top_p) + " min_p " +
                 std::to_string(p.min_p) + " penalties " + std::to_string(st.presence) + "/" +
                 std::to_string(st.frequency) + "/" + std::to_string(st.repetition));
    Batch in;
    in.logits = logits, in.V = V;
    const uint64_t step = uint64_t(randint(0, 1000));
    for (int64_t r = 0; r < N; ++r) {
      p.seed = uint64_t(r);
      in.add(0, p, step, prompt, output);
    }
    const Drawn got = sample(backend(), in);
    std::vector<int64_t> counts(static_cast<size_t>(V), 0);
    int64_t mismatches = 0;
    for (int64_t r = 0; r < N; ++r) {
      ASSERT_TRUE(got.tokens[r] >= 0 && got.tokens[r] < V)
          << "row " << r << " token " << got.tokens[r];
      ++counts[got.tokens[r]];
      mismatches += got.tokens[r] != in.reference(r).token;
    }
    EXPECT_EQ(mismatches, 0) << "tokens differing from kernels::cpu::sample_token";
    std::vector<float> probs(static_cast<size_t>(V));
    kernels::cpu::sampling_probs(logits.data(), V, p, prompt.data(), int64_t(prompt.size()),
                                 output.data(), int64_t(output.size()), probs.data());
    double chi2 = 0, small_expected = 0, small_observed = 0;
    int64_t bins = 0;
    for (int64_t t = 0; t < V; ++t) {
      const double expected = double(N) * probs[t];
      if (probs[t] == 0) {
        EXPECT_EQ(counts[t], 0) << "token " << t << " is outside the filtered support";
      }
      if (expected >= 5) {
        chi2 += (counts[t] - expected) * (counts[t] - expected) / expected, ++bins;
      } else {
        small_expected += expected, small_observed += double(counts[t]);
      }
    }
    if (small_expected >
        0) {  // the merged bin (tested as one bin even when its expectation is < 5)
      chi2 +=
          (small_observed - small_expected) * (small_observed - small_expected) / small_expected,
          ++bins;
    }
    if (bins < 2) {  // the filter kept one token: every draw is it (no distribution to test)
      EXPECT_EQ(*std::max_element(counts.begin(), counts.end()), N);
      continue;
    }
    const double p_value = gamma_q(double(bins - 1) / 2, chi2 / 2);
    EXPECT_GT(p_value, 1e-4) << "chi2 " << chi2 << " with " << bins - 1 << " degrees of freedom";
  }
}

TEST_P(BackendSampling, GreedyPenaltiesLogprobsAndTopAlternatives) {
  // Three logits rows (one of the release vocabulary size), read through a non-monotone row map;
  // logits with many exact ties and a masked (−inf) token.
  const int64_t V = 129280;
  Batch in;
  in.V = V, in.max_top = 5;
  in.logits = normal(3 * V, 2.0);
  for (float& l : in.logits) l = std::round(l * 2) / 2;
  in.logits[7] = -INFINITY;
  // Penalties: token 5 leads row 2 (30), token 9 is second (29.5).
  in.logits[2 * V + 5] = 30.0f, in.logits[2 * V + 9] = 29.5f;
  SamplingParams greedy;
  greedy.temperature = 0;
  SamplingParams freq = greedy, rep = greedy, presence = greedy;
  freq.frequency_penalty = 0.5f, rep.repetition_penalty = 2.0f, presence.presence_penalty = 2.0f;
  in.add(2, freq, 0, {}, {5, 5, 1, 5});   // 30 − 3·0.5 = 28.5 < 29.5: token 9
  in.add(2, greedy, 0, {5, 5}, {});       // no penalty: token 5
  in.add(2, rep, 0, {5}, {});             // 30 / 2 = 15: token 9
  in.add(2, presence, 0, {5, 5, 5}, {});  // presence counts generated tokens only: token 5
  const int32_t want_penalised[] = {9, 5, 9, 5};
  SamplingParams tiny = greedy;
  tiny.temperature = 1e-6f;  // below vLLM's epsilon: greedy too
  in.add(1, tiny, 3);
  for (int r = 0; r < 12; ++r) {  // sampled rows with random penalties, histories and top_logprobs
    SamplingParams p;
    p.temperature = float(randint(1, 20)) / 10, p.top_k = int32_t(randint(0, 50)),
    p.seed = uint64_t(randint(0, 1 << 30));
    p.presence_penalty = float(randint(-4, 4)) / 2, p.frequency_penalty = float(randint(-4, 4)) / 2;
    p.repetition_penalty = float(randint(5, 20)) / 10,
    p.top_logprobs = int32_t(r < 4 ? r : randint(0, 20));
    std::vector<int32_t> prompt(static_cast<size_t>(randint(0, 20))),
        output(static_cast<size_t>(randint(0, 20)));
    for (int32_t& t : prompt) t = int32_t(randint(0, V - 1));
    for (int32_t& t : output) t = int32_t(randint(0, V - 1));
    in.add(r % 3 == 0 ? 0 : 1, p, uint64_t(randint(0, 1 << 20)), prompt, output);
  }
  const Drawn got = sample(backend(), in);
  const Drawn cpu_got = on_cuda() ? sample(cpu(), in) : Drawn{};
  for (int r = 0; r < 4; ++r)
    EXPECT_EQ(got.tokens[r], want_penalised[r]) << "penalised greedy row " << r;
  const float* row1 = &in.logits[V];
  EXPECT_EQ(got.tokens[4], int32_t(std::max_element(row1, row1 + V) - row1))
      << "greedy: the first argmax";
  for (int64_t r = 0; r < in.rows(); ++r) {
    SCOPED_TRACE("row " + std::to_string(r));
    const kernels::SampledToken want = in.reference(r);
    EXPECT_EQ(got.tokens[r], want.token);
    // Raw log_softmax in float64; top ids by (logit desc, id asc).
    const float* l = &in.logits[in.logit_rows[r] * V];
    const double mx = *std::max_element(l, l + V);
    double sum = 0;
    for (int64_t t = 0; t < V; ++t) sum += std::exp(double(l[t]) - mx);
    const double lse = mx + std::log(sum);
    auto expect_logprob = [&](float value, int64_t token, int64_t cpu_index,
                              const std::vector<float>& cpu_values) {
      const double ref = on_cuda() ? double(cpu_values[cpu_index]) : double(l[token]) - lse;
      EXPECT_NEAR(value, ref, on_cuda() ? 1e-5 : 0x1p-22 * std::abs(ref))
          << "logprob of token " << token;
    };
    expect_logprob(got.logprobs[r], got.tokens[r], r, cpu_got.logprobs);
    std::vector<int32_t> order(static_cast<size_t>(V));
    std::iota(order.begin(), order.end(), 0);
    const int64_t n_top = std::min<int64_t>(in.params[r].top_logprobs, in.max_top);
    std::partial_sort(order.begin(), order.begin() + n_top, order.end(),
                      [&](int32_t a, int32_t b) { return l[a] > l[b] || (l[a] == l[b] && a < b); });
    for (int64_t j = 0; j < in.max_top; ++j) {
      const int32_t id = got.top_ids[r * in.max_top + j];
      if (j >= n_top) {  // beyond min(top_logprobs, max_top): left untouched
        EXPECT_EQ(uint32_t(id), 0xA5A5A5A5u) << "top " << j;
        EXPECT_EQ(bits_of(got.top_logprobs[r * in.max_top + j]), 0xFFFFFFFFu) << "top " << j;
        continue;
      }
      EXPECT_EQ(id, order[j]) << "top " << j;
      expect_logprob(got.top_logprobs[r * in.max_top + j], order[j], r * in.max_top + j,
                     cpu_got.top_logprobs);
    }
  }
}

TEST_P(BackendSampling, RefusedLogitsThrowOnCpuAndDrawMinusOneOnCuda) {
  const int64_t V = 50;
  Batch in;
  in.V = V;
  in.logits = normal(5 * V);
  in.logits[1 * V + 17] = NAN;
  in.logits[2 * V + 3] = INFINITY;
  std::fill_n(&in.logits[3 * V], V, -INFINITY);
  SamplingParams p;
  for (int64_t r = 0; r < 5; ++r) p.seed = uint64_t(randint(0, 1000)), in.add(r, p, uint64_t(r));
  if (!on_cuda()) {
    EXPECT_THROW(sample(backend(), in), Error);
    return;
  }
  const Drawn got = sample(backend(), in);
  for (const int64_t r : {1, 2, 3}) EXPECT_EQ(got.tokens[r], -1) << "row " << r;
  for (const int64_t r : {0, 4}) EXPECT_EQ(got.tokens[r], in.reference(r).token) << "row " << r;
}

TEST_P(BackendSampling, RejectsAnEmptyVocabulary) {
  Batch in;
  in.V = 0;
  in.logits = {0.0f};
  in.add(0, SamplingParams{}, 0);
  EXPECT_THROW(sample(backend(), in), Error);
}

TEST_P(BackendSampling, MaskTokensSetsDisallowedLogitsToMinusInfinity) {
  const int64_t rows = 5, V = 1003;  // V not a multiple of 32: the last word is partial
  const int64_t W = kernels::token_mask_words(V);
  const std::vector<float> logits = normal(rows * V);
  const std::vector<int64_t> masked = {3, 0, 4};  // rows 1 and 2 keep their logits
  std::vector<uint32_t> words(masked.size() * size_t(W));
  for (uint32_t& w : words) w = uint32_t(randint(0, 0xFFFFFFFFll));
  words[1 * W] = 0;                 // a word with nothing allowed
  words[2 * W + 3] = 0xFFFFFFFFu;  // and one with everything
  std::vector<float> want = logits;
  for (size_t i = 0; i < masked.size(); ++i) {
    for (int64_t t = 0; t < V; ++t) {
      const bool allowed = (words[i * W + t / 32] >> (t % 32)) & 1u;
      if (!allowed) want[masked[i] * V + t] = -INFINITY;
    }
  }
  Backend& b = backend();
  Buffer<float> dl = upload(b, logits);
  Buffer<int64_t> dr = upload(b, masked);
  Buffer<uint32_t> dw = upload(b, words);
  b.mask_tokens(dl.get(), dr.get(), int64_t(masked.size()), V, dw.get(), b.stream(0));
  EXPECT_TRUE(bitwise_equal(dl.download(), want));
}

DSV41RT_INSTANTIATE_BACKENDS(BackendSampling);

}  // namespace
}  // namespace dsv41rt::testing
