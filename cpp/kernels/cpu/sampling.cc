#include "kernels/sampling.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "core/status.h"
#include "kernels/sampling_uniform.h"

namespace dsv41rt::kernels {
namespace cpu {
namespace {

constexpr double kGreedyTemperature = 1e-5;  // vLLM _SAMPLING_EPS

bool is_greedy(const SamplingParams& p) { return p.temperature < kGreedyTemperature; }

void check_inputs(const float* logits, int64_t V, const int32_t* prompt, int64_t n_prompt,
                  const int32_t* output, int64_t n_output) {
  bool any_finite = false;
  for (int64_t i = 0; i < V; ++i) {
    const float l = logits[i];
    DSV41RT_CHECK(!std::isnan(l) && l != INFINITY, "sampling: logits[", i, "] is ", l,
                  " (only finite values and -inf are allowed)");
    any_finite |= std::isfinite(l);
  }
  DSV41RT_CHECK(any_finite, "sampling: no token has a finite logit");
  DSV41RT_CHECK(n_prompt >= 0 && n_output >= 0, "sampling: negative token count");
  DSV41RT_CHECK(n_prompt == 0 || prompt != nullptr, "sampling: prompt is null");
  DSV41RT_CHECK(n_output == 0 || output != nullptr, "sampling: output is null");
  for (int64_t i = 0; i < n_prompt; ++i) {
    DSV41RT_CHECK(prompt[i] >= 0 && prompt[i] < V, "sampling: prompt[", i, "] = ", prompt[i],
                  " is not a token id in [0, ", V, ")");
  }
  for (int64_t i = 0; i < n_output; ++i) {
    DSV41RT_CHECK(output[i] >= 0 && output[i] < V, "sampling: output[", i, "] = ", output[i],
                  " is not a token id in [0, ", V, ")");
  }
}

// Step 1 of the pipeline: the penalised logits, FP64.
std::vector<double> penalised_logits(const float* logits, int64_t V, const SamplingParams& p,
                                     const int32_t* prompt, int64_t n_prompt, const int32_t* output,
                                     int64_t n_output) {
  std::vector<double> l(logits, logits + V);
  if (p.repetition_penalty != 1.0f) {
    const double rp = p.repetition_penalty;
    std::vector<uint8_t> seen(V, 0);
    for (int64_t i = 0; i < n_prompt; ++i) seen[prompt[i]] = 1;
    for (int64_t i = 0; i < n_output; ++i) seen[output[i]] = 1;
    for (int64_t t = 0; t < V; ++t) {
      if (seen[t]) l[t] = l[t] > 0 ? l[t] / rp : l[t] * rp;
    }
  }
  if (p.frequency_penalty != 0.0f || p.presence_penalty != 0.0f) {
    std::vector<int64_t> count(V, 0);
    for (int64_t i = 0; i < n_output; ++i) ++count[output[i]];
    for (int64_t t = 0; t < V; ++t) {
      if (count[t] > 0) {
        l[t] -= double(p.frequency_penalty) * double(count[t]) + double(p.presence_penalty);
      }
    }
  }
  return l;
}

// Steps 1-6: the kept weights (unnormalised, FP64; 0 outside the kept set). The largest weight is
// 1 (exp(0) at the max) except in greedy mode, where the result is a one-hot.
std::vector<double> filtered_weights(const float* logits, int64_t V, const SamplingParams& p,
                                     const int32_t* prompt, int64_t n_prompt, const int32_t* output,
                                     int64_t n_output) {
  std::vector<double> l = penalised_logits(logits, V, p, prompt, n_prompt, output, n_output);
  if (is_greedy(p)) {
    // std::max_element returns the first maximum: ties -> lowest id.
    const int64_t best = std::max_element(l.begin(), l.end()) - l.begin();
    std::vector<double> w(V, 0.0);
    w[best] = 1.0;
    return w;
  }
  const double mx = *std::max_element(l.begin(), l.end());
  const double temp = p.temperature;
  std::vector<double> w(V);
  for (int64_t t = 0; t < V; ++t) w[t] = std::exp((l[t] - mx) / temp);  // exp(-inf) = 0

  const bool use_k = p.top_k >= 1 && p.top_k < V;
  const bool use_p = p.top_p < 1.0f;
  if (use_k || use_p) {
    const int64_t n = use_k ? p.top_k : V;
    std::vector<int32_t> order(V);
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + n, order.end(),
                      [&](int32_t a, int32_t b) { return w[a] > w[b] || (w[a] == w[b] && a < b); });
    double kept_mass = 0;  // mass of the top-k set (all of V when top_k is off)
    for (int64_t j = 0; j < n; ++j) kept_mass += w[order[j]];
    std::vector<uint8_t> keep(V, 0);
    double before = 0;
    for (int64_t j = 0; j < n; ++j) {
      // top_p: keep while the (renormalised) mass of the tokens before this one is < top_p.
      if (use_p && before >= double(p.top_p) * kept_mass) break;
      keep[order[j]] = 1;
      before += w[order[j]];
    }
    for (int64_t t = 0; t < V; ++t) {
      if (!keep[t]) w[t] = 0;
    }
  }
  if (p.min_p > 0.0f) {
    // w[t] = p_t / p_max exactly (the max has weight exp(0) = 1).
    const double min_p = p.min_p;
    for (int64_t t = 0; t < V; ++t) {
      if (w[t] < min_p) w[t] = 0;
    }
  }
  return w;
}

}  // namespace
}  // namespace cpu

void validate_sampling_params(const SamplingParams& p, int64_t vocab) {
  DSV41RT_CHECK(vocab >= 1 && vocab <= std::numeric_limits<int32_t>::max(),
                "sampling: vocab size must be in [1, 2^31), got ", vocab);
  if (!(std::isfinite(p.temperature) && p.temperature >= 0.0f)) {
    DSV41RT_THROW("sampling: temperature must be a finite number >= 0, got ", p.temperature);
  }
  if (p.top_k < -1) DSV41RT_THROW("sampling: top_k must be -1, 0 (off) or >= 1, got ", p.top_k);
  if (!(p.top_p > 0.0f && p.top_p <= 1.0f)) {
    DSV41RT_THROW("sampling: top_p must be in (0, 1], got ", p.top_p);
  }
  if (!(p.min_p >= 0.0f && p.min_p <= 1.0f)) {
    DSV41RT_THROW("sampling: min_p must be in [0, 1], got ", p.min_p);
  }
  if (!(p.presence_penalty >= -2.0f && p.presence_penalty <= 2.0f)) {
    DSV41RT_THROW("sampling: presence_penalty must be in [-2, 2], got ", p.presence_penalty);
  }
  if (!(p.frequency_penalty >= -2.0f && p.frequency_penalty <= 2.0f)) {
    DSV41RT_THROW("sampling: frequency_penalty must be in [-2, 2], got ", p.frequency_penalty);
  }
  if (!(std::isfinite(p.repetition_penalty) && p.repetition_penalty > 0.0f)) {
    DSV41RT_THROW("sampling: repetition_penalty must be a finite number > 0, got ",
                  p.repetition_penalty);
  }
  if (p.top_logprobs < 0 || p.top_logprobs > 20) {
    DSV41RT_THROW("sampling: top_logprobs must be in [0, 20], got ", p.top_logprobs);
  }
}

double sampling_uniform(uint64_t seed, uint64_t step) { return uniform_of(seed, step); }

namespace cpu {

void sampling_probs(const float* logits, int64_t V, const SamplingParams& p, const int32_t* prompt,
                    int64_t n_prompt, const int32_t* output, int64_t n_output, float* probs) {
  validate_sampling_params(p, V);
  check_inputs(logits, V, prompt, n_prompt, output, n_output);
  const std::vector<double> w = filtered_weights(logits, V, p, prompt, n_prompt, output, n_output);
  const double total = std::accumulate(w.begin(), w.end(), 0.0);
  for (int64_t t = 0; t < V; ++t) probs[t] = float(w[t] / total);
}

SampledToken sample_token(const float* logits, int64_t V, const SamplingParams& p,
                          const int32_t* prompt, int64_t n_prompt, const int32_t* output,
                          int64_t n_output, uint64_t step) {
  validate_sampling_params(p, V);
  check_inputs(logits, V, prompt, n_prompt, output, n_output);
  const std::vector<double> w = filtered_weights(logits, V, p, prompt, n_prompt, output, n_output);

  // Inverse CDF in token-id order.
  const double total = std::accumulate(w.begin(), w.end(), 0.0);
  const double target = sampling_uniform(p.seed, step) * total;
  int64_t token = -1;
  double cum = 0;
  for (int64_t t = 0; t < V; ++t) {
    if (w[t] <= 0) continue;
    token = t;  // the last kept token so far: the fallback if rounding runs past the end
    cum += w[t];
    if (target < cum) break;
  }
  DSV41RT_CHECK(token >= 0, "sampling: empty filtered distribution");

  // Raw logprobs: log_softmax of the unmodified logits.
  const double mx = *std::max_element(logits, logits + V);
  double sum = 0;
  for (int64_t t = 0; t < V; ++t) sum += std::exp(double(logits[t]) - mx);
  const double lse = mx + std::log(sum);
  SampledToken out;
  out.token = int32_t(token);
  out.logprob = float(double(logits[token]) - lse);
  const int64_t n_top = std::min<int64_t>(p.top_logprobs, V);
  if (n_top > 0) {
    std::vector<int32_t> order(V);
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + n_top, order.end(), [&](int32_t a, int32_t b) {
      return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
    });
    out.top_ids.assign(order.begin(), order.begin() + n_top);
    for (int32_t id : out.top_ids) out.top_logprobs.push_back(float(double(logits[id]) - lse));
  }
  return out;
}

void mask_tokens(float* logits, const int64_t* rows, int64_t n, int64_t V, const uint32_t* words) {
  const int64_t W = token_mask_words(V);
  for (int64_t i = 0; i < n; ++i) {
    float* row = logits + rows[i] * V;
    const uint32_t* mask = words + i * W;
    for (int64_t t = 0; t < V; ++t) {
      if (!((mask[t / 32] >> (t % 32)) & 1u)) row[t] = -INFINITY;
    }
  }
}

}  // namespace cpu
}  // namespace dsv41rt::kernels
