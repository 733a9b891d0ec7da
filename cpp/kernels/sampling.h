// Contract: the token sampler (CPU reference). One request's next token from its logits row, with
// the OpenAI / vLLM request parameters (temperature, top_k, top_p, min_p, presence / frequency /
// repetition penalties, seed, top_logprobs).
//
// Pipeline (all arithmetic in FP64 over the FP32 logits; V = vocabulary size):
//   1. Penalties (vLLM apply_penalties), on a copy of the logits:
//        repetition (HF/vLLM): each token id that occurs in prompt ∪ output (once, however often it
//          occurs): l = l > 0 ? l / repetition_penalty : l * repetition_penalty;
//        frequency + presence (OpenAI): for a token generated c > 0 times in `output`:
//          l -= frequency_penalty * c + presence_penalty.   (prompt tokens do not count here)
//   2. Greedy: temperature < 1e-5 (vLLM's _SAMPLING_EPS; 0 is the usual spelling) => the token is
//      the argmax of the penalised logits, ties -> lowest id; top_k/top_p/min_p/seed are ignored
//      and the "filtered distribution" is a one-hot at that token.
//   3. Temperature: p = softmax(l / temperature) over all V tokens.
//   4. top_k (k >= 1 and k < V; 0 or -1 = off): keep the k first tokens in the order
//      (p descending, token id ascending). Exactly k tokens: boundary ties go to the lower ids
//      (vLLM keeps every token tied with the k-th; exact ties are measure-zero for real logits).
//   5. top_p (< 1): renormalise the kept tokens, walk them in the same order and keep a token iff
//      the mass of the kept tokens before it is < top_p, i.e. the smallest prefix whose mass is
//      >= top_p (always at least the first token).
//   6. min_p (> 0): keep a token iff p_i >= min_p * p_max, with p_max the largest probability after
//      temperature (the ratio p_i / p_max = exp((l_i − l_max) / temperature) does not change under
//      renormalisation, so this is also "relative to the current max"). The max always survives.
//   7. Renormalise the kept tokens: that is `sampling_probs`.
//   Order note: this is the order of vLLM v0, SGLang and HF (top-k -> top-p -> min-p). vLLM v1
//   applies min_p before top-k/top-p; the two differ only when top_p < 1 and min_p > 0 are both set
//   (vLLM v1 then computes top-p over the min-p-filtered distribution).
//
// Draw: u in [0, 1) from a counter-based generator keyed by (seed, step), no state:
//   x = mix(seed + G); x = mix(x + (step + 1) * G); u = (x >> 11) * 2^-53
//   with G = 0x9E3779B97F4A7C15 and mix the splitmix64 finaliser
//   (z ^= z >> 30; z *= 0xBF58476D1CE4E5B9; z ^= z >> 27; z *= 0x94D049BB133111EB; z ^= z >> 31).
//   The token is the inverse CDF of the filtered distribution walked in token-id order: the lowest
//   id i with u * Σ w < Σ_{j <= i} w_j, where w are the kept (unnormalised) weights (rounding past
//   the end falls back to the last kept token). `step` is the number of tokens the request
//   generated before this one, so a token does not depend on the rest of the batch, on preemption /
//   recompute, or on the thread: same seed + same logits + same history + same step => same token.
//
// Logprobs: `logprob` and `top_logprobs` are log_softmax of the RAW logits (before penalties,
//   temperature and filtering) — vLLM's default logprobs_mode "raw_logprobs". top_ids are the
//   min(top_logprobs, V) highest raw logits, logprob descending, ties -> lower id; the sampled
//   token is reported separately (it may or may not be among them).
//
// Logits: −inf is allowed (a masked token never gets sampled); NaN or +inf, or a row with no finite
// logit, is an Error. Token ids in prompt / output must lie in [0, V).
#pragma once

#include <cstdint>
#include <vector>

#include "core/export.h"

namespace dsv41rt::kernels {

struct SamplingParams {
  float temperature = 1.0f;                                 // >= 0, finite; < 1e-5 => greedy
  int32_t top_k = 0;                                        // 0 or -1 => off; k >= V => off
  float top_p = 1.0f;                                       // (0, 1]
  float min_p = 0.0f;                                       // [0, 1]
  float presence_penalty = 0.0f, frequency_penalty = 0.0f;  // [-2, 2] (OpenAI), on generated tokens
  float repetition_penalty = 1.0f;  // > 0, finite; on prompt + generated tokens
  uint64_t seed = 0;
  int32_t top_logprobs = 0;  // number of top alternatives to return, [0, 20]
};

/// Throws Error naming the offending field ("top_p must be in (0, 1], got 0") for parameters
/// outside the ranges above, or for vocab < 1 / vocab > INT32_MAX.
DSV41RT_API void validate_sampling_params(const SamplingParams& p, int64_t vocab);

struct SampledToken {
  int32_t token;
  float logprob;                    // raw log_softmax of `token`
  std::vector<int32_t> top_ids;     // min(top_logprobs, V) ids, raw logprob descending
  std::vector<float> top_logprobs;  // their raw logprobs
};

/// The uniform in [0, 1) used for (seed, step): every backend's sampler draws with it.
DSV41RT_API double sampling_uniform(uint64_t seed, uint64_t step);

// Token masks (grammar-constrained decoding, runtime/engine/grammar.h): before sampling, the
// tokens a row's mask does not allow get logit -inf, so the sampler never draws them and the
// reported logprobs are those of the constrained distribution (vLLM applies its grammar bitmask to
// the logits before its sampler too). A mask is token_mask_words(V) 32-bit words: token t is
// allowed iff bit (t % 32) of word t / 32 is set (xgrammar's bitmask layout); bits past V are
// ignored.
inline int64_t token_mask_words(int64_t V) { return (V + 31) / 32; }

}  // namespace dsv41rt::kernels

namespace dsv41rt::kernels::cpu {

/// The filtered distribution actually sampled from (pipeline above), probs [V] (zeros outside the
/// kept set, sums to 1); with greedy temperature a one-hot at the argmax.
///   logits [V], prompt [n_prompt], output [n_output] (the request's generated tokens so far;
///   either may be null when its count is 0).
DSV41RT_API void sampling_probs(const float* logits, int64_t V, const SamplingParams& p,
                                const int32_t* prompt, int64_t n_prompt, const int32_t* output,
                                int64_t n_output, float* probs);

/// Draws one token from `sampling_probs`'s distribution with the (seed, step) uniform above.
DSV41RT_API SampledToken sample_token(const float* logits, int64_t V, const SamplingParams& p,
                                      const int32_t* prompt, int64_t n_prompt,
                                      const int32_t* output, int64_t n_output, uint64_t step);

/// Token masks (above): for i < n, logits row rows[i] ([V] at logits + rows[i] * V) gets -inf at
/// every token its mask words[i * token_mask_words(V) ...] does not allow; allowed ones are left
/// as they are.
DSV41RT_API void mask_tokens(float* logits, const int64_t* rows, int64_t n, int64_t V,
                             const uint32_t* words);

}  // namespace dsv41rt::kernels::cpu
