// The DSpark drafter forward on the CPU backend (runtime/model/draft_runner.h) on the tiny
// checkpoint (DSV41RT_TEST_CHECKPOINT): shapes, determinism, which inputs reach which outputs
// (the ring of the last `window` target positions before the anchor, the block rows seeing each
// other, the Markov head per row), and errors naming the bad input. Agreement with NeMo's
// DeepseekV41DSparkModel is tests/python/test_oracle_dspark_drafter.py.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "core/safetensors.h"
#include "core/status.h"
#include "executor_test_util.h"
#include "runtime/model/cache_bytes.h"
#include "runtime/model/drafter.h"
#include "runtime/model/model_executor.h"
#include "runtime/model/weights.h"

namespace dsv41rt::model {
namespace {

// One drafter for the suite (loading is the slow part).
Drafter& drafter() {
  static std::unique_ptr<Drafter> d =
      std::make_unique<Drafter>(testing::checkpoint(), /*cache_quant=*/true);
  return *d;
}

struct Case {
  DraftInputs in;
  std::vector<float> features;
};

// Deterministic features [context, T * H] and a block anchored at `anchor`.
Case make_case(const ModelPlan& plan, int64_t context, int64_t anchor) {
  const ModelConfig& c = plan.config;
  const DSparkSpec& d = *c.dspark;
  Case k;
  k.in.width = int64_t(d.target_layer_ids.size()) * c.hidden_size;
  k.in.context = context;
  k.features.resize(size_t(context * k.in.width));
  for (size_t i = 0; i < k.features.size(); ++i) {
    k.features[i] = float(std::sin(0.37 * double(i) + 0.1));
  }
  k.in.features = k.features.data();
  k.in.anchor = anchor;
  k.in.ids.assign(size_t(d.block_size), d.noise_token_id);
  k.in.ids[0] = 4242;
  for (int64_t i = 0; i < d.block_size; ++i) k.in.previous.push_back(int32_t(100 + 17 * i));
  return k;
}

// max |a - b| over row `row` of [rows, V] logits (all rows when row < 0).
float max_diff(const DraftOutputs& a, const DraftOutputs& b, int64_t row = -1) {
  float m = 0.0f;
  for (int64_t r = 0; r < a.block; ++r) {
    if (row >= 0 && r != row) continue;
    for (int64_t v = 0; v < a.vocab; ++v) {
      const size_t i = size_t(r * a.vocab + v);
      m = std::max(m, std::abs(a.logits[i] - b.logits[i]));
    }
  }
  return m;
}

TEST(DraftRunner, ShapesFiniteAndDeterministic) {
  NEED_CHECKPOINT();
  Drafter& d = drafter();
  const ModelConfig& c = d.plan().config;
  Case k = make_case(d.plan(), 20, 12);
  const DraftOutputs a = d.draft(k.in), b = d.draft(k.in);
  EXPECT_EQ(a.block, c.dspark->block_size);
  EXPECT_EQ(a.vocab, c.vocab_size);
  ASSERT_EQ(a.logits.size(), size_t(a.block * a.vocab));
  ASSERT_EQ(a.confidence.size(), size_t(a.block));
  for (float x : a.logits) ASSERT_TRUE(std::isfinite(x));
  for (float x : a.confidence) ASSERT_TRUE(std::isfinite(x));
  EXPECT_EQ(a.logits, b.logits);
  EXPECT_EQ(a.confidence, b.confidence);
}

// The keys of the target side are the rows [anchor - window, anchor): a change elsewhere is
// invisible (bitwise), a change inside moves every row's logits.
TEST(DraftRunner, ReadsTheWindowBeforeTheAnchorOnly) {
  NEED_CHECKPOINT();
  Drafter& d = drafter();
  const int64_t W = d.plan().config.sliding_window, anchor = W + 4, context = anchor + 6;
  Case base = make_case(d.plan(), context, anchor);
  const DraftOutputs ref = d.draft(base.in);
  for (int64_t row : {int64_t(0), anchor - W - 1, anchor, context - 1, anchor - W, anchor - 1}) {
    Case k = make_case(d.plan(), context, anchor);
    for (int64_t j = 0; j < k.in.width; ++j) k.features[size_t(row * k.in.width + j)] += 0.5f;
    const DraftOutputs got = d.draft(k.in);
    const bool inside = row >= anchor - W && row < anchor;
    if (inside) {
      for (int64_t r = 0; r < ref.block; ++r) EXPECT_GT(max_diff(got, ref, r), 1e-3f) << row;
    } else {
      EXPECT_EQ(got.logits, ref.logits) << "feature row " << row << " is outside the window";
      EXPECT_EQ(got.confidence, ref.confidence) << row;
    }
  }
}

// No causal mask inside the block: the last noise token reaches the first row. The Markov head
// reads each row's own previous token only.
TEST(DraftRunner, BlockRowsSeeEachOtherAndMarkovIsPerRow) {
  NEED_CHECKPOINT();
  Drafter& d = drafter();
  Case base = make_case(d.plan(), 20, 12);
  const DraftOutputs ref = d.draft(base.in);
  Case k = make_case(d.plan(), 20, 12);
  k.in.ids.back() = 777;
  EXPECT_GT(max_diff(d.draft(k.in), ref, 0), 1e-4f);
  Case m = make_case(d.plan(), 20, 12);
  m.in.previous[2] = 9999;
  const DraftOutputs got = d.draft(m.in);
  for (int64_t r = 0; r < ref.block; ++r) {
    if (r == 2) {
      EXPECT_GT(max_diff(got, ref, r), 1e-4f);
      EXPECT_NE(got.confidence[2], ref.confidence[2]);
    } else {
      EXPECT_EQ(max_diff(got, ref, r), 0.0f) << r;
      EXPECT_EQ(got.confidence[size_t(r)], ref.confidence[size_t(r)]) << r;
    }
  }
}

// Greedy drafting in order: each row's Markov head reads the token drafted at the row before, so
// the outputs are run()'s with those tokens as `previous`, bitwise, and each token its row's
// argmax.
TEST(DraftRunner, GreedyDraftsInOrderThroughTheMarkovHead) {
  NEED_CHECKPOINT();
  Drafter& d = drafter();
  for (const int64_t anchor : {0, 5, 12, 20}) {
    Case k = make_case(d.plan(), 20, anchor);
    const DraftOutputs g = d.draft_greedy(k.in);
    ASSERT_EQ(int64_t(g.tokens.size()), g.block);
    DraftInputs in = k.in;
    for (int64_t i = 1; i < g.block; ++i) in.previous[size_t(i)] = g.tokens[size_t(i - 1)];
    const DraftOutputs ref = d.draft(in);
    EXPECT_EQ(g.logits, ref.logits) << anchor;
    EXPECT_EQ(g.confidence, ref.confidence) << anchor;
    for (int64_t r = 0; r < g.block; ++r) {
      const auto row = ref.logits.begin() + r * ref.vocab;
      EXPECT_EQ(g.tokens[size_t(r)], int32_t(std::max_element(row, row + ref.vocab) - row)) << r;
    }
  }
}

// Features given from a later first position (what a serving sequence keeps) draft the same.
TEST(DraftRunner, FeaturesFromALaterFirstPosition) {
  NEED_CHECKPOINT();
  Drafter& d = drafter();
  const int64_t W = d.plan().config.sliding_window, anchor = W + 6;
  Case k = make_case(d.plan(), 20, anchor);
  DraftInputs in = k.in;
  in.first = anchor - W;
  in.context = 20 - in.first;
  in.features = k.features.data() + in.first * in.width;
  EXPECT_EQ(d.draft(in).logits, d.draft(k.in).logits);
}

TEST(DraftRunner, AnchorZeroHasNoTargetKeys) {
  NEED_CHECKPOINT();
  Drafter& d = drafter();
  Case a = make_case(d.plan(), 0, 0);
  Case b = make_case(d.plan(), 20, 0);  // features exist, none precedes the anchor
  EXPECT_EQ(d.draft(a.in).logits, d.draft(b.in).logits);
}

void expect_error(Drafter& d, const DraftInputs& in, const std::string& needle) {
  try {
    d.draft(in);
    ADD_FAILURE() << "no error, expected one naming " << needle;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(DraftRunner, BadInputsAreNamed) {
  NEED_CHECKPOINT();
  Drafter& d = drafter();
  const int32_t V = int32_t(d.plan().config.vocab_size);
  Case k = make_case(d.plan(), 20, 12);
  DraftInputs in = k.in;
  in.width -= 1;
  expect_error(d, in, "columns");
  in = k.in, in.anchor = 21;
  expect_error(d, in, "anchor 21 reads the features of positions [13, 21), the rows hold [0, 20)");
  in = k.in, in.first = 5;  // the ring of anchor 12 starts at 4
  expect_error(d, in, "positions [4, 12), the rows hold [5, 25)");
  in = k.in, in.anchor = -1;
  expect_error(d, in, "anchor -1");
  in = k.in, in.ids.pop_back();
  expect_error(d, in, "ids has 4 tokens");
  in = k.in, in.previous[3] = V;
  expect_error(d, in, "previous[3] = " + std::to_string(V));
  in = k.in, in.ids[1] = -5;
  expect_error(d, in, "ids[1] = -5");
}

TEST(DraftRunner, NeedsWeightsLoadedWithDrafts) {
  NEED_CHECKPOINT();
  const ModelPlan& plan = drafter().plan();
  ModelWeights plain = load_weights(std::make_shared<Checkpoint>(testing::checkpoint()), plan);
  EXPECT_FALSE(plain.drafts.has_value());
  std::unique_ptr<Backend> be = make_cpu_backend();
  const BackendWeights w = be->load_weights(plan, plain, rope_inv_freqs(plan));
  EXPECT_TRUE(w.drafts.empty());
  try {
    DraftRunner runner(plan, *be, w, CacheFormats::of(true).window);
    ADD_FAILURE() << "a runner over weights without drafts";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("loaded with their drafts"), std::string::npos)
        << e.what();
  }
}

// Sharded weights hold no drafts: the drafter reads the whole head and runs unsharded.
TEST(DraftRunner, ShardsDropTheDrafts) {
  NEED_CHECKPOINT();
  const ModelPlan& plan = drafter().plan();
  ModelWeights all = load_weights(std::make_shared<Checkpoint>(testing::checkpoint()), plan, true,
                                  {}, /*drafts=*/true);
  ASSERT_TRUE(all.drafts.has_value());
  EXPECT_EQ(all.drafts->stages.size(), plan.draft_layers.size());
  EXPECT_FALSE(expert_shard(all, plan, 0, 2).drafts.has_value());
  EXPECT_FALSE(tensor_shard(std::move(all), plan, 0, 2).drafts.has_value());
}

}  // namespace
}  // namespace dsv41rt::model
