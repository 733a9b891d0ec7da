// How many prefill tokens a step may carry beside its decodes so that it takes at most
// `max_decode_slowdown` times a decode-only step, learned from the step times the engine measures
// (the adaptive form of max_prefill_tokens_while_decoding; docs/design/engine.md).
//
// The model is two running estimates:
//   - the time of a decode-only step (`decode_s`), from steps that carried no prefill, for about
//     the number of decodes it was measured at (`decode_ref`);
//   - the time one more prefill token adds to a step (`prefill_token_s`), from steps that carried
//     prefill: (step time - decode_s) / prefill tokens when the step also decoded, step time /
//     prefill tokens (an over-estimate: the step's fixed cost included) until such a step exists.
// A step with prefill is measured at the cap it ran with, so the per-token cost is the marginal
// cost there (small chunks beside a memory-bound decode cost little per token on a GPU, a large
// chunk is compute-bound); cap = (limit - 1) * decode_s / prefill_token_s is then a fixed-point
// iteration towards the chunk whose step takes limit * decode_s. A cap grows at most 2x per step.
//
// When the decode-only time is unknown, or was measured at a decode count more than 25% away from
// this step's, or more than kProbeEvery observed steps ago, the step is a probe: no prefill tokens
// (cap 0), so its time is the decode-only time. Probes cost at most one step per such change.
//
// Thread-safety: none (the engine thread's scheduler owns it).
#pragma once

#include <cstdint>

#include "core/export.h"

namespace dsv41rt::engine {

class DSV41RT_API PrefillCapModel {
 public:
  static constexpr int64_t kProbeEvery = 64;  ///< observed steps a decode-only time stays fresh

  /// `limit` >= 1: a step with prefill may take `limit` times a decode-only step (1: decode-only
  /// steps while anything decodes, i.e. prefill waits until decoding ends).
  explicit PrefillCapModel(double limit);

  /// The prefill tokens a step with `decodes` decode chunks may carry: 0 for a probe step, else
  /// >= 1 (so prefill always progresses), or -1 (no cap: nothing measured yet to cap by).
  int64_t cap(int64_t decodes) const;

  /// A step ran `decodes` decode chunks and `prefill_tokens` prefill tokens in `seconds`.
  void observe(int64_t decodes, int64_t prefill_tokens, double seconds);

  double decode_seconds() const { return decode_s_; }
  double prefill_token_seconds() const { return prefill_token_s_; }

 private:
  bool decode_time_fresh(int64_t decodes) const;

  double limit_;
  double decode_s_ = 0;                 ///< decode-only step time (0: none measured)
  int64_t decode_ref_ = 0;              ///< decode chunks decode_s_ was measured at
  int64_t decode_seen_at_ = 0;          ///< steps_ when decode_s_ was last measured
  double prefill_token_s_ = 0;          ///< seconds one prefill token adds (0: none measured)
  bool prefill_beside_decode_ = false;  ///< prefill_token_s_ comes from steps that also decoded
  int64_t last_cap_ = 0;  ///< prefill tokens of the last step that ran them beside decodes
  int64_t steps_ = 0;     ///< steps observed
};

}  // namespace dsv41rt::engine
