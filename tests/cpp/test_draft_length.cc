// The self-tuning draft length (runtime/engine/draft_length.h): lengths from the observed
// acceptance (engine-wide, then the request's own), the confidence tenths' calibration, probes of
// a request whose rate fell below the break-even, and determinism.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "runtime/engine/draft_length.h"

namespace dsv41rt::engine {
namespace {

constexpr double kBreakEven = DraftLengthModel::kBreakEven;

// The longest j with a^j >= break-even (a request without confidences).
int64_t geometric_length(double a, int64_t k_max) {
  int64_t j = 0;
  double p = 1.0;
  while (j < k_max && (p *= a) >= kBreakEven) ++j;
  return j;
}

TEST(DraftLength, FreshModelUsesTheUniformPrior) {
  DraftLengthModel m;
  EXPECT_DOUBLE_EQ(m.engine_rate(), 0.5);
  EXPECT_DOUBLE_EQ(m.request_rate(7), 0.5);
  EXPECT_EQ(m.before_drafting(7, 3, 5), 5);  // 0.5 >= break-even: draft, the rate trims
  EXPECT_EQ(m.after_drafting(7, 5, {}), geometric_length(0.5, 5));
  EXPECT_EQ(geometric_length(0.5, 5), 3);  // 0.5, 0.25, 0.125 >= 0.1 > 0.0625
  EXPECT_EQ(m.before_drafting(7, 3, 0), 0);
  EXPECT_EQ(m.after_drafting(7, 0, {}), 0);
}

TEST(DraftLength, AcceptedDraftsLengthenRejectedOnesShortenToProbes) {
  DraftLengthModel m;
  for (int i = 0; i < 50; ++i) m.observe(1, 5, 5, {});  // request 1: everything accepted
  EXPECT_GT(m.request_rate(1), 0.98);
  EXPECT_EQ(m.after_drafting(1, 5, {}), 5);
  for (int i = 0; i < 200; ++i) m.observe(2, 3, 0, {});  // request 2: every first draft rejected
  const double a2 = m.request_rate(2);
  EXPECT_LT(a2, kBreakEven);
  // Below the break-even the drafter is skipped but for one draft every kProbeEvery tokens.
  int64_t probes = 0;
  for (int64_t g = 0; g < 64; ++g) {
    const int64_t k = m.before_drafting(2, g, 5);
    EXPECT_TRUE(k == 0 || k == 1) << g;
    probes += k;
    if (k) {
      EXPECT_EQ(m.after_drafting(2, k, {}), 1);  // a probe verifies its one draft
    }
  }
  EXPECT_EQ(probes, 64 / DraftLengthModel::kProbeEvery);
  // A new request starts at the engine's rate (250 verifies: 250 accepted of 450 reached).
  EXPECT_NEAR(m.engine_rate(), 251.0 / 452.0, 1e-12);
  EXPECT_DOUBLE_EQ(m.request_rate(3), m.engine_rate());
  EXPECT_EQ(m.after_drafting(3, 5, {}), geometric_length(m.engine_rate(), 5));
  // A probe that is accepted lifts the rate again (prior weight 4 toward the engine's rate).
  for (int i = 0; i < 40; ++i) m.observe(2, 1, 1, {});
  EXPECT_GE(m.request_rate(2), kBreakEven);
  EXPECT_EQ(m.before_drafting(2, 1, 5), 5);
  m.forget(2);
  EXPECT_DOUBLE_EQ(m.request_rate(2), m.engine_rate());
}

TEST(DraftLength, ConfidenceTenthsAreCalibratedByWhatWasAccepted) {
  DraftLengthModel m;
  // Drafts with confidence logit +3 (sigmoid 0.95, the top tenth) are accepted, those at -3
  // (0.05, the bottom tenth) rejected: request 1 alternates high, high, low.
  for (int i = 0; i < 100; ++i) m.observe(1, 3, 2, {3.0f, 3.0f, -3.0f});
  // Another request with the same rate so far: lengths follow its drafts' confidences.
  for (int i = 0; i < 20; ++i) m.observe(5, 3, 2, {3.0f, 3.0f, -3.0f});
  EXPECT_EQ(m.after_drafting(5, 5, {3.0f, 3.0f, 3.0f, 3.0f, 3.0f}), 5);
  EXPECT_EQ(m.after_drafting(5, 5, {3.0f, -3.0f, 3.0f, 3.0f, 3.0f}), 1);
  EXPECT_EQ(m.after_drafting(5, 5, {3.0f, 3.0f, 3.0f, -3.0f, 3.0f}), 3);
  // At least one draft is verified (the drafter ran) even when the first is unlikely.
  EXPECT_EQ(m.after_drafting(5, 5, {-3.0f, 3.0f, 3.0f, 3.0f, 3.0f}), 1);
  // A NaN confidence counts as the bottom tenth instead of being undefined.
  EXPECT_EQ(m.after_drafting(5, 2, {3.0f, std::nanf("")}), 1);
  // Without confidences the request's rate alone decides (2 of every 3 reached accepted).
  EXPECT_EQ(m.after_drafting(5, 5, {}), geometric_length(m.request_rate(5), 5));
}

TEST(DraftLength, TheSameObservationsGiveTheSameLengths) {
  auto run = [] {
    DraftLengthModel m;
    std::vector<int64_t> lengths;
    for (int64_t step = 0; step < 200; ++step) {
      const int64_t id = step % 3;
      const int64_t k = m.before_drafting(id, step, 5);
      const std::vector<float> conf = {float(step % 7) - 3.0f, 1.0f, -1.0f, 2.0f, 0.0f};
      const int64_t n = k == 0 ? 0 : m.after_drafting(id, k, {conf.begin(), conf.begin() + k});
      lengths.push_back(n);
      if (n) m.observe(id, n, (step * 7919) % (n + 1), {conf.begin(), conf.begin() + n});
    }
    return lengths;
  };
  EXPECT_EQ(run(), run());
}

}  // namespace
}  // namespace dsv41rt::engine
