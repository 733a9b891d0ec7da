// The self-tuning draft length of speculative decoding (issue 24; speculative-config without
// num_speculative_tokens; docs/design/dspark.md "Draft length").
//
// A verify row costs a fraction of a decode step while the step is memory-bound (the weights are
// read once for every row), so a draft token is worth verifying when the probability that it is
// accepted, together with every draft before it, is at least that fraction: kBreakEven, measured
// on the H200 (bench-40, batch 1: five drafts that are all rejected make the step 1.495x a plain
// one, 0.099 of a step per row; bench/results/2026-12-04-h200-session29-*). Past the batch size
// where decoding is compute-bound a row costs as much as a token of plain decoding, so no draft
// pays: `disable_by_batch_size` (vLLM's name) turns drafting off there.
//
// The acceptance probability of draft position j is estimated from what was observed:
//   - the engine-wide rate a = (accepted + 1) / (reached + 2) over every verified position that
//     was reached (accepted, or the first rejected one);
//   - the request's own rate a_r = (accepted_r + w a) / (reached_r + w), w = kPriorWeight: new
//     requests start at the engine's rate and move to their own;
//   - with the drafter's confidence head (uncalibrated logits): the engine-wide acceptance rate
//     of positions whose sigmoid(confidence) fell in the same tenth, c_b = (accepted_b + w a) /
//     (reached_b + w), scaled by the request's relative rate: c_j = min(1, c_b a_r / a).
// P_j = c_1 ... c_j; the request drafts the longest prefix with P_j >= kBreakEven. A request
// whose rate alone keeps it from one draft (a_r < kBreakEven) skips the drafter, except every
// kProbeEvery-th generated token, when it drafts one token so that its rate can recover.
// Everything is a function of observed outcomes: the same requests give the same lengths.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <vector>

#include "core/export.h"

namespace dsv41rt::engine {

class DSV41RT_API DraftLengthModel {
 public:
  static constexpr double kBreakEven = 0.1;
  static constexpr double kPriorWeight = 4.0;
  static constexpr int64_t kProbeEvery = 16;
  static constexpr int kBins = 10;

  /// How many drafts to ask the drafter for (at most `k_max`; 0 = skip it this step), for
  /// request `id` about to generate its token number `generated`.
  int64_t before_drafting(int64_t id, int64_t generated, int64_t k_max) const;
  /// How many of `n` drafts to verify given the drafter's confidence logits (empty: none).
  /// At least 1 when n > 0: the drafter already ran (the estimate or a probe asked for it), one
  /// row costs a tenth of a step, and low-confidence tenths only get calibrated when verified.
  int64_t after_drafting(int64_t id, int64_t n, const std::vector<float>& confidence) const;
  /// Records a verify of `drafted` tokens whose first `accepted` were accepted; `confidence`:
  /// the drafts' confidence logits (empty: none).
  void observe(int64_t id, int64_t drafted, int64_t accepted, const std::vector<float>& confidence);
  void forget(int64_t id) { requests_.erase(id); }

  /// The estimates (tests, metrics): the engine's rate a, request id's rate a_r.
  double engine_rate() const;
  double request_rate(int64_t id) const;

 private:
  struct Counts {
    double accepted = 0, reached = 0;
  };
  static int bin(float confidence_logit);
  double position_rate(double request_rate, float confidence_logit) const;

  Counts engine_;
  std::array<Counts, kBins> bins_{};
  std::map<int64_t, Counts> requests_;
};

}  // namespace dsv41rt::engine
