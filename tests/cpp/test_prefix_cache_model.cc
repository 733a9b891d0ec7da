// Prefix caching on the tiny checkpoint (DSV41RT_TEST_CHECKPOINT), CPU backend, bitwise:
//   - the mechanism: a slot snapshot taken at a page boundary plus the shared pages before it,
//     continued with another suffix, gives the logits of a fresh request over the whole sequence,
//     at boundaries inside the first window, at it, past it, before and after the Engram n-gram
//     span, short and long, and at the prompt's last token but one;
//   - the engine: tokens and logprobs with prefix caching equal those without (hits after the
//     first request finished, a re-sent prompt, the next turn of a conversation, two requests
//     sharing a prefix at once, two computing the same prefix at once), with the dequant
//     workspace's reuse on and off.
// Both on every backend: "cpu", and "cuda" in CUDA builds (the fp32 mode, bitwise as on the CPU;
// the instance skips without a GPU, fails with DSV41RT_REQUIRE_CUDA=1).
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "backend_test_util.h"
#include "core/safetensors.h"
#include "engine_test_util.h"
#include "executor_test_util.h"
#include "held_request.h"
#include "runtime/engine/engine.h"
#include "runtime/model/engram_tables.h"
#include "runtime/model/executor.h"
#include "runtime/model/layer_plan.h"
#include "runtime/model/model_config.h"

namespace dsv41rt::model {
namespace {

using ::dsv41rt::testing::checkpoint;
using ::dsv41rt::testing::salted_prompt;

std::shared_ptr<Executor> load(const std::string& device, int64_t page_tokens,
                               int64_t kv_memory = 64ll << 20) {
  ExecutorOptions options;
  options.device = device;
  options.kv_memory = kv_memory;
  options.max_num_seqs = 8;  // slots: 4 running requests (the engine's limit) + 4 snapshots
  options.page_tokens = page_tokens;
  options.max_num_batched_tokens = 64;
  return ::dsv41rt::testing::load_tiny_executor(options);
}

std::vector<int32_t> concat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

using dsv41rt::testing::Held;

class PrefixCacheModel : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (GetParam() == "cuda") DSV41RT_SKIP_WITHOUT_CUDA();
  }
};

TEST_P(PrefixCacheModel, SnapshotAndSharedPagesContinueBitwise) {
  NEED_CHECKPOINT();
  // Pages of 2 positions (the largest compression ratio), so every boundary kind is a page
  // boundary: the window is 8 positions and the Engram history 3 ids on tiny-v41.
  auto e = load(GetParam(), /*page_tokens=*/2);
  ASSERT_EQ(e->plan().config.sliding_window, 8);
  const int64_t V = e->plan().config.vocab_size;
  const std::vector<int32_t> first = salted_prompt(40, 1);
  for (int64_t c : {2, 4, 6, 8, 10, 16, 32}) {
    SCOPED_TRACE("boundary " + std::to_string(c));
    const std::vector<int32_t> prefix(first.begin(), first.begin() + c);
    const std::vector<int32_t> suffix = salted_prompt(33 - c, 2 + c);  // the new request: 33 tokens
    const std::vector<float> expected = Held(*e).run(concat(prefix, suffix));

    Held a(*e);
    a.run(prefix);
    const int32_t snapshot = e->pool().alloc_slot();
    ASSERT_GE(snapshot, 0);
    e->copy_state({a.view().slot, nullptr, 0, 0}, {e->pool().slot_data(snapshot), nullptr, 0, 0});
    a.run(std::vector<int32_t>(first.begin() + c, first.end()));  // a moves on past the boundary

    Held b(*e);
    b.pages.assign(a.pages.begin(), a.pages.begin() + c / 2);
    e->pool().retain_pages(b.pages);
    e->copy_state({e->pool().slot_data(snapshot), nullptr, 0, 0}, {b.view().slot, nullptr, 0, 0});
    e->pool().free_slot(snapshot);
    b.length = c;
    const std::vector<float> got = b.run(suffix);
    ASSERT_EQ(got.size() + size_t(c * V), expected.size());
    EXPECT_EQ(std::memcmp(got.data(), expected.data() + c * V, got.size() * sizeof(float)), 0);
  }
  EXPECT_EQ(e->pool().usage().pages_used, 0);
}

DSV41RT_INSTANTIATE_BACKENDS(PrefixCacheModel);

}  // namespace
}  // namespace dsv41rt::model

namespace dsv41rt::engine {
namespace {

using ::dsv41rt::testing::checkpoint;
using ::dsv41rt::testing::salted_prompt;
using model::concat;
using model::load;
using model::PrefixCacheModel;

using Outcome = ::dsv41rt::testing::EngineOutcome;
using ::dsv41rt::testing::drain;

GenerationParams params(int64_t max_new, uint64_t seed) {
  GenerationParams g;
  g.max_new_tokens = max_new;
  g.ignore_eos = true;
  g.sampling.temperature = seed == 0 ? 0.0f : 0.8f;
  g.sampling.seed = seed;
  g.sampling.top_logprobs = 4;
  return g;
}

// The scenario of the test below; returns every request's outcome by submission order.
std::vector<Outcome> run_scenario(const std::string& device, bool caching, bool workspace_reuse) {
  Engine engine(
      load(device, /*page_tokens=*/4),
      {.max_num_seqs = 4, .max_num_batched_tokens = 16, .enable_prefix_caching = caching});
  engine.executor().workspaces().set_reuse(workspace_reuse);
  std::map<int64_t, Outcome> out;
  std::vector<int64_t> ids;
  auto submit = [&](std::vector<int32_t> p, int64_t max_new, uint64_t seed) {
    ids.push_back(engine.submit(std::move(p), params(max_new, seed)));
  };
  const std::vector<int32_t> a = salted_prompt(37, 1);  // publishes at 36
  submit(a, 6, 0);
  drain(engine, out);
  submit(a, 5, 7);  // re-sent: cached up to the last prompt token but one
  drain(engine, out);
  // The next turn hits 40, inside the first answer (a snapshot taken while decoding).
  submit(concat(concat(a, out[ids[0]].tokens), salted_prompt(3, 9)), 4, 0);
  submit(salted_prompt(5, 2), 3, 0);  // publishes at 4
  drain(engine, out);
  submit(concat(salted_prompt(5, 2), salted_prompt(4, 3)), 3, 5);  // a short cached prefix
  submit(concat(a, salted_prompt(9, 4)), 4, 0);  // two at once on one cached prefix
  submit(concat(a, salted_prompt(2, 5)), 4, 3);
  drain(engine, out);
  submit(salted_prompt(23, 6), 3, 0);  // two at once computing the same new prefix
  submit(salted_prompt(23, 6), 3, 0);
  drain(engine, out);
  submit(concat(salted_prompt(23, 6), salted_prompt(6, 7)), 3, 0);
  drain(engine, out);
  engine.check_invariants();
  const EngineStats s = engine.stats();
  EXPECT_EQ(s.pool.pages_used, s.prefix_cache.pages);
  EXPECT_EQ(s.pool.slots_used, s.prefix_cache.snapshots);
  engine.reset_prefix_cache();
  EXPECT_EQ(engine.stats().pool.pages_used, 0);
  EXPECT_EQ(engine.stats().pool.slots_used, 0);
  std::vector<Outcome> by_order;
  for (int64_t id : ids) by_order.push_back(out[id]);
  return by_order;
}

TEST_P(PrefixCacheModel, EngineTokensWithHitsEqualThoseWithout) {
  NEED_CHECKPOINT();
  const std::vector<Outcome> off = run_scenario(GetParam(), false, true);
  const std::vector<Outcome> on = run_scenario(GetParam(), true, true);
  const std::vector<Outcome> on_no_reuse = run_scenario(GetParam(), true, false);
  ASSERT_EQ(off.size(), on.size());
  for (size_t i = 0; i < off.size(); ++i) {
    SCOPED_TRACE("request " + std::to_string(i));
    EXPECT_EQ(off[i].cached, 0);
    EXPECT_EQ(off[i].tokens, on[i].tokens);
    EXPECT_EQ(off[i].logprobs, on[i].logprobs);  // float ==: bitwise for finite values
    EXPECT_EQ(off[i].top_logprobs, on[i].top_logprobs);
    EXPECT_EQ(on[i].tokens, on_no_reuse[i].tokens);
    EXPECT_EQ(on[i].logprobs, on_no_reuse[i].logprobs);
    EXPECT_EQ(on[i].cached, on_no_reuse[i].cached);
  }
  // What each request found: see the comments in run_scenario (page_tokens 4).
  const std::vector<int64_t> cached = {0, 36, 40, 0, 4, 36, 36, 0, 0, 20};
  for (size_t i = 0; i < on.size(); ++i) EXPECT_EQ(on[i].cached, cached[i]) << "request " << i;
}

}  // namespace
}  // namespace dsv41rt::engine
