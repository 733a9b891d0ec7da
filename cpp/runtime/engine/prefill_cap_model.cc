#include "runtime/engine/prefill_cap_model.h"

#include <algorithm>
#include <cmath>

#include "core/status.h"

namespace dsv41rt::engine {
namespace {

// Weight of a new measurement in the running estimates: steps jitter (host scheduling, other
// streams), and the workload drifts (contexts grow, the batch changes), so neither one sample nor
// a long history.
constexpr double kDecodeWeight = 0.5;
constexpr double kPrefillWeight = 0.3;

double blend(double old, double sample, double weight) {
  return old > 0 ? old + weight * (sample - old) : sample;
}

}  // namespace

PrefillCapModel::PrefillCapModel(double limit) : limit_(limit) {
  DSV41RT_CHECK(std::isfinite(limit) && limit >= 1,
                "max_decode_slowdown must be >= 1 (0: off), got ", limit);
}

bool PrefillCapModel::decode_time_fresh(int64_t decodes) const {
  return decode_s_ > 0 && steps_ - decode_seen_at_ < kProbeEvery &&
         decodes * 4 <= decode_ref_ * 5 && decodes * 5 >= decode_ref_ * 4;
}

int64_t PrefillCapModel::cap(int64_t decodes) const {
  if (decodes < 1) return -1;
  if (!decode_time_fresh(decodes)) return 0;  // probe
  if (prefill_token_s_ <= 0) return -1;       // nothing to cap by yet: the budget decides
  const double room = (limit_ - 1) * decode_s_ / prefill_token_s_;
  int64_t cap = room >= 1e15 ? int64_t(1e15) : std::max<int64_t>(int64_t(room), 1);
  if (prefill_beside_decode_ && last_cap_ > 0) cap = std::min(cap, 2 * last_cap_);
  return cap;
}

void PrefillCapModel::observe(int64_t decodes, int64_t prefill_tokens, double seconds) {
  ++steps_;
  if (!(seconds > 0) || !std::isfinite(seconds)) return;  // a clock hiccup teaches nothing
  if (prefill_tokens <= 0) {
    if (decodes < 1) return;
    decode_s_ = decode_time_fresh(decodes) ? blend(decode_s_, seconds, kDecodeWeight) : seconds;
    decode_ref_ = decodes;
    decode_seen_at_ = steps_;
    return;
  }
  if (decodes < 1) {  // prefill alone: a first estimate, until a step with decodes measures
    if (!prefill_beside_decode_) {
      prefill_token_s_ = blend(prefill_token_s_, seconds / double(prefill_tokens), kPrefillWeight);
    }
    return;
  }
  last_cap_ = prefill_tokens;
  if (!decode_time_fresh(decodes)) return;  // no decode-only time to subtract
  const double sample = std::max(seconds - decode_s_, 0.0) / double(prefill_tokens);
  // A step no slower than its decodes alone says a prefill token costs (next to) nothing there;
  // a floor keeps the cap finite (it still grows, 2x per step).
  const double floor = decode_s_ * 1e-6;
  prefill_token_s_ = prefill_beside_decode_
                         ? blend(prefill_token_s_, std::max(sample, floor), kPrefillWeight)
                         : std::max(sample, floor);
  prefill_beside_decode_ = true;
}

}  // namespace dsv41rt::engine
