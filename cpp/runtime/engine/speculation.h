// Speculative decoding in the engine (issue 24, docs/design/dspark.md): for a decoding request
// (no grammar, not a handoff's prefill), the engine drafts up to k tokens, runs the verify
// rows [last token, d1..dk] as that request's item of the step's one batched forward (undoable,
// all k + 1 rows' logits to the host), and keeps the drafts the target accepts plus one token of
// its own; the other positions are taken back exactly (Executor::undo, model/state_undo.h) and
// their pages given back.
//
// Greedy requests (accept_greedy): the tokens are drawn on the host from each verify row with the
// sampler the device runs (kernels::cpu::sample_token, the request's params, history and step),
// so tokens, logprobs and top logprobs are plain decoding's: bitwise on the CPU backend, whose
// device sampler is that function. Sampling requests (accept_sampled): rejection sampling, the
// same distribution as plain sampling but other draws. A stop token or max_new_tokens inside an
// accepted block ends the output there.
//
// Benchmarks only (accept_forced, SpeculationConfig::forced_acceptance): the engine accepts a
// count of drafts a hook chooses, whatever the target says, so that a synthetic acceptance length
// holds however the verify forward's numerics differ from plain decode's. Not lossless.
//
// This class holds what the drafting needs between steps (each request's last target features,
// for the DSpark drafter) and the counters; the engine step (engine.cc) does the batching.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <map>
#include <vector>

#include "core/export.h"
#include "kernels/sampling.h"
#include "runtime/engine/draft_length.h"
#include "runtime/engine/scheduler.h"
#include "runtime/model/executor.h"
#include "runtime/model/state_undo.h"

namespace dsv41rt::engine {

/// Proposes up to `k` draft tokens for request `id`, whose tokens so far (prompt, then the
/// generated ones; the last is not yet fed) are `tokens`. Fewer (or none) are allowed.
using DraftSource =
    std::function<std::vector<int32_t>(int64_t id, const std::vector<int32_t>& tokens, int64_t k)>;

/// How many of the `drafted` drafts of request `id`'s verify to accept (clamped to [0, drafted]).
using ForcedAcceptance = std::function<int64_t(int64_t id, int64_t drafted)>;

struct SpeculationConfig {
  /// Draft tokens verified per step and request (vLLM's num_speculative_tokens); 0 = off. At most
  /// sliding_window - 1 (a verify forward must be undoable in part) and, with the DSpark
  /// drafter, its block size.
  int64_t num_speculative_tokens = 0;
  /// The length per request and step is chosen (draft_length.h), up to num_speculative_tokens
  /// (speculative-config without a count); otherwise every speculating request drafts that many.
  bool self_tuning = false;
  /// No drafts in a step that runs more than this many requests (vLLM's disable_by_batch_size:
  /// there decoding is compute-bound and a verify row costs as much as a plain token); 0 = never.
  int64_t disable_by_batch_size = 0;
  /// Testing / benchmarking hook: drafts come from here instead of the DSpark drafter (e.g. the
  /// known greedy continuation, to force acceptance on random weights). Unset: the executor's
  /// drafter, which the executor must have (load_drafter).
  DraftSource draft_source;
  /// Benchmarking hook, NOT lossless (SGLang's SGLANG_SIMULATE_ACC_LEN): every verify accepts
  /// exactly clamp(forced_acceptance(id, k), 0, k) of its k drafts whatever the target says
  /// (accept_forced), greedy and sampling requests alike; the counters record that count (fewer
  /// only where a stop token or max_new_tokens ends the output inside the block). With drafts
  /// that are the known continuation, the outputs stay that continuation wherever the target
  /// would have disagreed. Called once per verify, on the engine's thread. Unset: the lossless
  /// acceptance (accept_greedy / accept_sampled).
  ForcedAcceptance forced_acceptance;
};

/// vLLM's spec-decode counters.
struct SpecDecodeStats {
  int64_t drafts = 0;           ///< verify rows run with at least one draft token
  int64_t draft_tokens = 0;     ///< draft tokens verified
  int64_t accepted_tokens = 0;  ///< of them, accepted (the target's greedy token there)
  /// accepted_per_pos[j]: drafts whose token j was accepted (size num_speculative_tokens).
  std::vector<int64_t> accepted_per_pos;
};

/// A request's drafts and, from the DSpark drafter, their confidence logits (else empty).
struct Drafts {
  std::vector<int32_t> tokens;
  std::vector<float> confidence;
};

/// One request's verify item in a step.
struct Verify {
  std::vector<int32_t> fed;       ///< [last token, d1..dk]
  std::vector<float> confidence;  ///< the drafts' confidence logits (empty: none)
  std::vector<float> logits;      ///< [fed.size(), vocab]
  model::UndoRecord undo;
};

/// The tokens plain decoding emits from a verify's rows: row j's token drawn as the device draws
/// it (the request's params; history: its generated tokens, then the emitted ones before row j;
/// step: their count). Row j + 1 is read only while row j's token equals draft j + 1 and is
/// neither a stop token (`stops`) nor the request's last (max_new_tokens).
DSV41RT_API std::vector<kernels::SampledToken> accept_greedy(
    const Verify& v, int64_t vocab, const kernels::SamplingParams& params, const SchedRequest& r,
    const std::function<bool(int32_t)>& stops);

/// The same for a sampling request (temperature > 0), by rejection sampling (spec 7.3; Leviathan
/// et al.), which keeps the target distribution p of each row (`sampling_probs`: penalties,
/// temperature, top-k / top-p / min-p). The drafter proposes its argmax, a point mass q at d, so
/// the rule "accept d with probability min(1, p(d) / q(d))" accepts with probability p(d), and a
/// rejection draws from normalise(max(0, p - q)): p without d. The uniforms come from (seed, step)
/// like the sampler's, on their own streams; the last row (every draft accepted) draws as the
/// sampler does. Logprobs and top logprobs are the raw ones, as the sampler reports them.
DSV41RT_API std::vector<kernels::SampledToken> accept_sampled(
    const Verify& v, int64_t vocab, const kernels::SamplingParams& params, const SchedRequest& r,
    const std::function<bool(int32_t)>& stops);

/// Benchmarks only, NOT lossless (SpeculationConfig::forced_acceptance): the first `accepted`
/// drafts (0 <= accepted <= k) are emitted as they are, whatever the target says, each with the
/// raw logprob and top logprobs of its row (the sampler's arithmetic); then row `accepted`'s token
/// is drawn as accept_greedy draws it (the request's params, greedy or sampling; history: its
/// generated tokens, then the emitted ones; step: their count). A stop token or the request's last
/// allowed token (max_new_tokens) ends the output there, as in accept_greedy.
DSV41RT_API std::vector<kernels::SampledToken> accept_forced(
    const Verify& v, int64_t vocab, const kernels::SamplingParams& params, const SchedRequest& r,
    const std::function<bool(int32_t)>& stops, int64_t accepted);

class Speculator {
 public:
  /// Throws Error naming the problem: k < 0, k past the window or the drafter's block, no drafter
  /// (and no draft_source) with k > 0.
  Speculator(model::Executor& exec, SpeculationConfig config);

  int64_t k() const { return config_.num_speculative_tokens; }
  /// Requests it speculates for: no grammar, not a handoff's prefill (greedy ones through
  /// accept_greedy, sampling ones through accept_sampled).
  bool eligible(const kernels::SamplingParams& sampling, bool grammar, bool handoff) const;
  /// Whether the forwards of eligible requests capture the drafter's target features.
  bool needs_features() const { return k() > 0 && !config_.draft_source; }

  /// Whether verifies accept a forced count of drafts (forced_acceptance, benchmarks).
  bool forced() const { return bool(config_.forced_acceptance); }
  /// The forced count of request `id`'s verify of `drafted` drafts, in [0, drafted].
  int64_t forced_count(int64_t id, int64_t drafted) const {
    return std::clamp<int64_t>(config_.forced_acceptance(id, drafted), 0, drafted);
  }
  /// Whether a step of `requests` requests drafts at all (disable_by_batch_size).
  bool drafts_in_step(int64_t requests) const {
    return k() > 0 &&
           (config_.disable_by_batch_size <= 0 || requests <= config_.disable_by_batch_size);
  }
  /// How many drafts to ask for, at most `k_max`: k_max, or self-tuned (0: skip the drafter).
  int64_t planned_length(const SchedRequest& r, int64_t k_max) const;
  /// Up to `k` drafts for a request about to decode the token at position r.computed (empty when
  /// it cannot: no features of the last window yet, e.g. after a prefix-cache hit); self-tuned,
  /// the drafts the confidences do not justify are cut.
  Drafts draft(const SchedRequest& r, int64_t k);
  /// Records a forward's target features of a request: `n` rows of `rows` from position `start`
  /// (a gap starts over); keeps the last sliding_window rows.
  void keep_features(int64_t id, int64_t start, const std::vector<float>& rows, int64_t n);
  void forget(int64_t id) {
    features_.erase(id);
    lengths_.forget(id);
  }

  /// Counts request id's verify of `drafted` tokens whose first `accepted` were accepted
  /// (`confidence`: the drafts', or empty).
  void count(int64_t id, int64_t drafted, int64_t accepted, const std::vector<float>& confidence);
  const SpecDecodeStats& stats() const { return stats_; }

 private:
  struct Features {
    int64_t first = 0;  ///< position of the first kept row
    std::vector<float> rows;
  };
  model::Executor& exec_;
  SpeculationConfig config_;
  int64_t width_ = 0, window_ = 0;
  std::map<int64_t, Features> features_;
  DraftLengthModel lengths_;
  SpecDecodeStats stats_;
};

}  // namespace dsv41rt::engine
