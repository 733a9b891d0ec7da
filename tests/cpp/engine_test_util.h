// Helpers of the engine-level tests (test_engine_handoff.cc, test_prefix_cache_model.cc): what a
// request produced over its outputs, and running an engine until it is idle.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "runtime/engine/engine.h"

namespace dsv41rt::testing {

/// Everything a request's outputs carried, in order.
struct EngineOutcome {
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;
  std::vector<std::vector<float>> top_logprobs;
  std::vector<uint8_t> handoff;
  engine::FinishReason reason = engine::FinishReason::kNone;
  int64_t cached = -1;  ///< cached prompt tokens, once reported
  std::string error;    ///< why the request could not go on (empty: it did)
};

inline void collect(const engine::RequestOutput& o, EngineOutcome& r) {
  r.tokens.insert(r.tokens.end(), o.new_tokens.begin(), o.new_tokens.end());
  r.logprobs.insert(r.logprobs.end(), o.logprobs.begin(), o.logprobs.end());
  r.top_logprobs.insert(r.top_logprobs.end(), o.top_logprobs.begin(), o.top_logprobs.end());
  if (!o.handoff.empty()) r.handoff = o.handoff;
  if (o.finished) r.reason = o.reason;
  if (o.cached_tokens >= 0) r.cached = o.cached_tokens;
  if (!o.error.empty()) r.error = o.error;
}

/// Runs `engine` until idle, checking its invariants after every step; adds to `out` by id.
inline void drain(engine::Engine& engine, std::map<int64_t, EngineOutcome>& out) {
  while (!engine.idle()) {
    for (const engine::RequestOutput& o : engine.step()) collect(o, out[o.id]);
    engine.check_invariants();
  }
}

inline std::map<int64_t, EngineOutcome> drain(engine::Engine& engine) {
  std::map<int64_t, EngineOutcome> out;
  drain(engine, out);
  return out;
}

}  // namespace dsv41rt::testing
