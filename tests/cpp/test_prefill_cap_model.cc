// PrefillCapModel (max_decode_slowdown's cap) against a simulated step clock, and the scheduler
// using it: probes when the decode-only time is unknown or stale, convergence to the chunk whose
// step takes `limit` decode-only steps, no starvation, bad limits refused by name.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"
#include "runtime/engine/prefill_cap_model.h"
#include "runtime/engine/scheduler.h"
#include "runtime/model/kv_pool.h"

namespace dsv41rt::engine {
namespace {

// A GPU-like step: weight-bound (a fixed time) until the batch's tokens make it compute-bound.
double gpu_like_step(int64_t decodes, int64_t prefill) {
  const double fixed = 0.020;       // the weights' read: 20 ms
  const double per_token = 0.0004;  // compute per token once past the knee
  const double knee = 64;           // tokens the fixed time covers
  const double tokens = double(decodes + prefill);
  return fixed + 0.0001 * double(decodes) + per_token * std::max(tokens - knee, 0.0);
}

// Runs `steps` steps of `decodes` decodes beside unlimited prefill under the model's cap; returns
// the caps it gave.
std::vector<int64_t> drive(PrefillCapModel& m, int64_t decodes, int steps, int64_t budget) {
  std::vector<int64_t> caps;
  for (int i = 0; i < steps; ++i) {
    const int64_t cap = m.cap(decodes);
    const int64_t prefill = cap < 0 ? budget : std::min(cap, budget);
    caps.push_back(cap);
    m.observe(decodes, prefill, gpu_like_step(decodes, prefill));
  }
  return caps;
}

TEST(PrefillCapModel, ProbesThenConvergesToTheLimit) {
  PrefillCapModel m(2.0);
  EXPECT_EQ(m.cap(0), -1);                   // nothing decodes: no cap
  EXPECT_EQ(m.cap(16), 0);                   // decode-only time unknown: a probe
  m.observe(0, 512, gpu_like_step(0, 512));  // a prefill-only step: a first (high) estimate
  EXPECT_EQ(m.cap(16), 0);
  const std::vector<int64_t> caps = drive(m, 16, 40, 512);
  EXPECT_EQ(caps[0], 0);  // the probe
  EXPECT_GE(caps[1], 1);
  for (size_t i = 2; i < caps.size(); ++i) {
    if (caps[i] > 0) EXPECT_LE(caps[i], 2 * std::max<int64_t>(caps[i - 1], 1)) << "step " << i;
  }
  // The step that takes 2x the decode-only step (21.6 ms): 16 + p - 64 = 21.6 / 0.4 -> p = 102.
  const double decode_only = gpu_like_step(16, 0);
  const int64_t last = caps.back() > 0 ? caps.back() : caps[caps.size() - 2];
  EXPECT_NEAR(gpu_like_step(16, last) / decode_only, 2.0, 0.1) << "cap " << last;
  EXPECT_NEAR(m.decode_seconds(), decode_only, 1e-9);
  // Probes: the first, then one per kProbeEvery observed steps.
  const int64_t probes = std::count(caps.begin(), caps.end(), 0);
  EXPECT_EQ(probes, 1);
}

TEST(PrefillCapModel, DecodeCountChangeOrAgeMeansAProbe) {
  PrefillCapModel m(3.0);
  m.observe(10, 0, 0.010);
  m.observe(10, 20, 0.012);
  EXPECT_GT(m.cap(10), 0);
  EXPECT_GT(m.cap(12), 0);  // within 25%
  EXPECT_GT(m.cap(8), 0);
  EXPECT_EQ(m.cap(13), 0);  // 30% more decodes: the decode-only time is measured again
  EXPECT_EQ(m.cap(7), 0);
  for (int64_t i = 0; i < PrefillCapModel::kProbeEvery; ++i) m.observe(10, 20, 0.012);
  EXPECT_EQ(m.cap(10), 0);  // too old
  m.observe(10, 0, 0.010);
  EXPECT_GT(m.cap(10), 0);
}

TEST(PrefillCapModel, CheapPrefillGrowsTheCapAtMostTwicePerStep) {
  PrefillCapModel m(2.0);
  m.observe(4, 0, 0.010);
  m.observe(4, 8, 0.010);  // no slower than the decodes alone
  const int64_t c1 = m.cap(4);
  EXPECT_EQ(c1, 16);
  m.observe(4, c1, 0.010);
  EXPECT_EQ(m.cap(4), 32);
  m.observe(4, 0, -1.0);  // a clock hiccup changes nothing but the step count
  EXPECT_EQ(m.cap(4), 32);
}

TEST(PrefillCapModel, LimitOneMeansDecodeOnlySteps) {
  PrefillCapModel m(1.0);
  m.observe(2, 0, 0.010);
  m.observe(2, 10, 0.020);
  EXPECT_EQ(m.cap(2), 1);  // prefill still progresses, a token per step
}

TEST(PrefillCapModel, RefusesBadLimits) {
  for (double bad : {0.5, -1.0, 0.0}) {
    try {
      PrefillCapModel m(bad);
      FAIL() << bad << " accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("max_decode_slowdown"), std::string::npos) << e.what();
    }
  }
}

std::vector<int32_t> prompt(int64_t n) { return std::vector<int32_t>(size_t(n), 7); }

// The scheduler: a probe step, then prefill capped by the learned cost; every request finishes.
TEST(SchedulerDecodeSlowdown, CapsPrefillBesideDecodesAndFinishes) {
  model::KvPool pool(model::PoolGeometry{4, 0, 0}, 256, 8);
  Scheduler s({.max_num_seqs = 8, .max_num_batched_tokens = 256, .max_decode_slowdown = 2.0}, pool);
  const int64_t a = s.submit(prompt(40), 200);
  std::vector<int64_t> ids{a};
  int probes = 0, capped = 0, steps = 0;
  while (!s.idle() && steps < 2000) {
    if (steps == 2) {
      for (int i = 0; i < 4; ++i) ids.push_back(s.submit(prompt(300), 4));
    }
    const StepPlan p = s.schedule();
    ASSERT_FALSE(p.chunks.empty()) << "step " << steps;
    if (p.decodes > 0 && p.prefill_tokens == 0 && !s.stats().waiting) {
      // decode-only because nothing else is there: not a probe
    } else if (p.decodes > 0 && p.prefill_tokens == 0) {
      ++probes;
    } else if (p.decodes > 0) {
      ++capped;
      const int64_t cap = s.adaptive_prefill_cap(p.decodes);
      if (cap > 0) EXPECT_LE(p.prefill_tokens, cap) << "step " << steps;
    }
    s.complete(p);
    s.observe_step(p, gpu_like_step(p.decodes, p.prefill_tokens));
    for (const ScheduledChunk& c : p.chunks) {
      if (!c.samples) continue;
      const SchedRequest& r = s.request(c.request_id);
      if (r.generated() + 1 >= r.max_new_tokens) {
        s.finish(c.request_id, FinishReason::kLength);
      } else {
        s.append_token(c.request_id, 1);
      }
    }
    s.check_invariants();
    ++steps;
  }
  EXPECT_TRUE(s.idle()) << "after " << steps << " steps";
  EXPECT_GE(probes, 1);
  EXPECT_GE(capped, 4);
  EXPECT_THROW(Scheduler({.max_decode_slowdown = 0.5}, pool), Error);
}

}  // namespace
}  // namespace dsv41rt::engine
