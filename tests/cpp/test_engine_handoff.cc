// Prefill/decode handoff between two engines (issue 26) on the tiny checkpoint
// (DSV41RT_TEST_CHECKPOINT): a prefill engine runs each prompt and samples the first token
// (GenerationParams::handoff), a second engine continues from the exported state
// (Engine::submit_handoff). Tokens, logprobs and top logprobs equal one engine's run of the same
// requests, bitwise, for prompts of 1..300 tokens, greedy and seeded sampling, with prefix caching
// on both sides. Bad blobs and a full pool are refused with the decode engine's pool untouched.
// On every backend: "cpu", and "cuda" in CUDA builds (fp32, bitwise as on the CPU).
#include <gtest/gtest.h>

#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "backend_test_util.h"
#include "core/safetensors.h"
#include "core/status.h"
#include "engine_test_util.h"
#include "executor_test_util.h"
#include "runtime/engine/engine.h"
#include "runtime/model/delegating_executor.h"
#include "runtime/model/engram_tables.h"
#include "runtime/model/executor.h"
#include "runtime/model/layer_plan.h"
#include "runtime/model/model_config.h"

namespace dsv41rt::engine {
namespace {

using namespace ::dsv41rt::model;  // NOLINT: the loaders of the checkpoint

using ::dsv41rt::testing::checkpoint;
using ::dsv41rt::testing::salted_prompt;

std::shared_ptr<model::Executor> load(const std::string& device, int64_t kv_memory = 64ll << 20) {
  model::ExecutorOptions options;
  options.device = device;
  options.kv_memory = kv_memory;
  options.max_num_seqs = 8;
  options.page_tokens = 4;
  options.max_num_batched_tokens = 64;
  return ::dsv41rt::testing::load_tiny_executor(options);
}

using Outcome = ::dsv41rt::testing::EngineOutcome;
using ::dsv41rt::testing::drain;

GenerationParams params(int64_t max_new, uint64_t seed, bool handoff = false) {
  GenerationParams g;
  g.max_new_tokens = max_new;
  g.ignore_eos = true;
  g.sampling.temperature = seed == 0 ? 0.0f : 0.8f;
  g.sampling.seed = seed;
  g.sampling.top_logprobs = 3;
  g.handoff = handoff;
  return g;
}

// 16 prompts, 1..300 tokens (page boundaries, the window of 8, the longest compression ratio);
// two share a stem so the prefix cache hits on both sides.
std::vector<std::vector<int32_t>> prompts() {
  std::vector<std::vector<int32_t>> p;
  for (int64_t n : {1, 2, 3, 4, 5, 7, 8, 9, 16, 31, 64, 100, 129, 257, 300}) {
    p.push_back(salted_prompt(n, n));
  }
  std::vector<int32_t> turn = salted_prompt(100, 100);
  const std::vector<int32_t> more = salted_prompt(20, 7);
  turn.insert(turn.end(), more.begin(), more.end());
  p.push_back(turn);
  return p;
}

class EngineHandoff : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (GetParam() == "cuda") DSV41RT_SKIP_WITHOUT_CUDA();
    if (!checkpoint()) GTEST_SKIP() << "set DSV41RT_TEST_CHECKPOINT to a tiny-v41 checkpoint";
  }
};

TEST_P(EngineHandoff, PrefillThenDecodeEqualsOneEngine) {
  const std::vector<std::vector<int32_t>> ps = prompts();
  const EngineConfig cfg{
      .max_num_seqs = 4, .max_num_batched_tokens = 64, .enable_prefix_caching = true};
  for (uint64_t seed : {uint64_t(0), uint64_t(11)}) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    const int64_t max_new = 6;
    Engine single(load(GetParam()), cfg);
    for (size_t i = 0; i < ps.size(); ++i) single.submit(ps[i], params(max_new, seed + i));
    std::map<int64_t, Outcome> expected = drain(single);

    Engine prefill(load(GetParam()), cfg);
    Engine decode(load(GetParam()), cfg);
    std::vector<int64_t> pre_ids;
    for (size_t i = 0; i < ps.size(); ++i) {
      pre_ids.push_back(prefill.submit(ps[i], params(max_new, seed + i, /*handoff=*/true)));
    }
    std::map<int64_t, Outcome> first = drain(prefill);
    EXPECT_EQ(prefill.stats().pool.pages_used, prefill.stats().prefix_cache.pages);
    std::map<int64_t, int64_t> decode_of;  // prefill id -> decode id (16 queued, 4 run at once)
    for (size_t i = 0; i < ps.size(); ++i) {
      const Outcome& f = first.at(pre_ids[i]);
      ASSERT_EQ(f.tokens.size(), 1u) << "request " << i;
      ASSERT_EQ(f.reason, FinishReason::kLength);
      ASSERT_FALSE(f.handoff.empty()) << "request " << i;
      decode_of[pre_ids[i]] = decode.submit_handoff(ps[i], f.tokens[0], f.handoff.data(),
                                                    f.handoff.size(), params(max_new, seed + i));
    }
    const std::map<int64_t, Outcome> rest = drain(decode);
    for (size_t i = 0; i < ps.size(); ++i) {
      SCOPED_TRACE("request " + std::to_string(i) + ", prompt of " + std::to_string(ps[i].size()));
      Outcome got = first.at(pre_ids[i]);
      const Outcome& tail = rest.at(decode_of.at(pre_ids[i]));
      EXPECT_EQ(tail.reason, FinishReason::kLength);
      got.tokens.insert(got.tokens.end(), tail.tokens.begin(), tail.tokens.end());
      got.logprobs.insert(got.logprobs.end(), tail.logprobs.begin(), tail.logprobs.end());
      got.top_logprobs.insert(got.top_logprobs.end(), tail.top_logprobs.begin(),
                              tail.top_logprobs.end());
      const Outcome& want = expected.at(int64_t(i) + 1);
      ASSERT_EQ(want.tokens.size(), size_t(max_new));
      EXPECT_EQ(got.tokens, want.tokens);
      EXPECT_EQ(got.logprobs, want.logprobs);  // float ==: bitwise for finite values
      EXPECT_EQ(got.top_logprobs, want.top_logprobs);
    }
    decode.reset_prefix_cache();
    EXPECT_EQ(decode.stats().pool.pages_used, 0);
    EXPECT_EQ(decode.stats().pool.slots_used, 0);
  }
}

TEST_P(EngineHandoff, NoHandoffWhenTheRequestEndsAtItsFirstToken) {
  Engine prefill(load(GetParam()), {.max_num_seqs = 4});
  const int64_t id = prefill.submit(salted_prompt(9, 1), params(1, 0, /*handoff=*/true));
  const Outcome o = drain(prefill).at(id);
  EXPECT_EQ(o.tokens.size(), 1u);
  EXPECT_EQ(o.reason, FinishReason::kLength);
  EXPECT_TRUE(o.handoff.empty());
}

// An executor whose state stays where the host cannot copy it (host_state_copy() null, as the
// context-parallel drivers of one process per rank): the request asking for a handoff fails with
// the reason, the engine goes on serving the others, and nothing stays allocated.
class NoHostCopy : public model::DelegatingExecutor {
 public:
  explicit NoHostCopy(std::shared_ptr<model::Executor> inner)
      : DelegatingExecutor(inner.get()), keep_(std::move(inner)) {}
  void forward(std::vector<model::BatchItem>& items) override { inner_->forward(items); }
  void copy_state(const model::RequestView& src, const model::RequestView& dst) override {
    inner_->copy_state(src, dst);
  }

 private:
  std::shared_ptr<model::Executor> keep_;
};

TEST_P(EngineHandoff, AnExecutorThatCannotExportFailsTheRequestNotTheEngine) {
  Engine prefill(std::make_shared<NoHostCopy>(load(GetParam())), {.max_num_seqs = 4});
  const int64_t handoff = prefill.submit(salted_prompt(9, 1), params(4, 0, /*handoff=*/true));
  const int64_t plain = prefill.submit(salted_prompt(12, 2), params(3, 0));
  std::map<int64_t, Outcome> out = drain(prefill);
  EXPECT_EQ(out.at(handoff).tokens.size(), 1u);
  EXPECT_TRUE(out.at(handoff).handoff.empty());
  EXPECT_NE(out.at(handoff).error.find("handoff: "), std::string::npos) << out.at(handoff).error;
  EXPECT_NE(out.at(handoff).error.find("cannot copy a sequence's state"), std::string::npos);
  EXPECT_EQ(out.at(plain).tokens.size(), 3u);
  EXPECT_TRUE(out.at(plain).error.empty());
  const int64_t later = prefill.submit(salted_prompt(5, 3), params(2, 0));
  EXPECT_EQ(drain(prefill).at(later).tokens.size(), 2u) << "the engine goes on";
  EXPECT_EQ(prefill.stats().pool.pages_used, 0);
}

TEST_P(EngineHandoff, BadStatesAreRefusedWithThePoolUntouched) {
  Engine prefill(load(GetParam()), {.max_num_seqs = 4});
  const std::vector<int32_t> prompt = salted_prompt(30, 3);
  const int64_t id = prefill.submit(prompt, params(4, 0, /*handoff=*/true));
  const Outcome o = drain(prefill).at(id);
  ASSERT_FALSE(o.handoff.empty());

  Engine decode(load(GetParam()), {.max_num_seqs = 4});
  auto refused = [&](const std::vector<int32_t>& p, int32_t first, std::vector<uint8_t> blob,
                     const GenerationParams& g, const std::string& says) {
    try {
      decode.submit_handoff(p, first, blob.data(), blob.size(), g);
      ADD_FAILURE() << "accepted; expected: " << says;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(says), std::string::npos) << e.what();
    }
    EXPECT_EQ(decode.stats().pool.pages_used, 0);
    EXPECT_EQ(decode.stats().pool.slots_used, 0);
    decode.check_invariants();
  };
  std::vector<uint8_t> corrupt = o.handoff;
  corrupt[corrupt.size() / 2] ^= 1;
  refused(prompt, o.tokens[0], corrupt, params(4, 0), "checksum mismatch");
  refused(prompt, o.tokens[0], {o.handoff.begin(), o.handoff.end() - 1}, params(4, 0), "truncated");
  refused(salted_prompt(29, 3), o.tokens[0], o.handoff, params(4, 0), "the prompt has 29 tokens");
  refused(prompt, -1, o.handoff, params(4, 0), "first token -1");
  refused(prompt, o.tokens[0], o.handoff, params(1, 0), "leaves nothing to decode");
  refused(prompt, o.tokens[0], o.handoff, params(4, 0, true), "handed off again");
}

TEST_P(EngineHandoff, AHandoffWaitsForRoomAndThenRunsAsTheOthers) {
  Engine prefill(load(GetParam()), {.max_num_seqs = 4});
  const std::vector<int32_t> prompt = salted_prompt(120, 5);  // 30 pages of 4
  const int64_t id = prefill.submit(prompt, params(3, 0, /*handoff=*/true));
  const Outcome o = drain(prefill).at(id);
  ASSERT_FALSE(o.handoff.empty());
  Engine decode(load(GetParam()), {.max_num_seqs = 2});
  model::KvPool& pool = decode.executor().pool();
  auto submit = [&] {
    return decode.submit_handoff(prompt, o.tokens[0], o.handoff.data(), o.handoff.size(),
                                 params(3, 0));
  };
  // Someone else holds all but 29 pages: its 120 computed positions + 1 need 31.
  std::vector<int32_t> held;
  const int64_t page_tokens = pool.geometry().page_tokens;
  ASSERT_TRUE(pool.ensure_pages(held, (pool.usage().pages_total - 29) * page_tokens));
  const model::PoolUsage before = pool.usage();
  const int64_t first = submit();
  EXPECT_TRUE(decode.step().empty());
  EXPECT_EQ(decode.stats().scheduler.waiting, 1);
  EXPECT_EQ(pool.usage().pages_used, before.pages_used);
  EXPECT_EQ(pool.usage().slots_used, before.slots_used);
  pool.free_pages(held);
  // Three more than max_num_seqs 2 run at once: they queue and all end alike. The last two take
  // the checked path (Runtime's): one blob, checked once, held by both requests, never copied.
  auto blob = std::make_shared<const std::vector<uint8_t>>(o.handoff);
  const Engine::CheckedHandoff checked =
      decode.check_handoff(prompt, o.tokens[0], blob, params(3, 0));
  EXPECT_EQ(checked.blob.get(), blob.get());
  EXPECT_GE(checked.view.slot, blob->data());
  EXPECT_LT(checked.view.pages, blob->data() + blob->size());
  decode.submit_handoff(prompt, o.tokens[0], checked, params(3, 0));
  decode.submit_handoff(prompt, o.tokens[0], checked, params(3, 0));
  EXPECT_GE(blob.use_count(), 4);  // ours, `checked`'s and the two waiting requests'
  const std::map<int64_t, Outcome> rest = drain(decode);
  ASSERT_EQ(rest.size(), 3u);
  for (const auto& [rid, r] : rest) {
    EXPECT_EQ(r.tokens, rest.at(first).tokens) << "request " << rid;
    EXPECT_EQ(r.logprobs, rest.at(first).logprobs) << "request " << rid;
    EXPECT_EQ(r.tokens.size(), 2u);
  }
  EXPECT_EQ(pool.usage().pages_used, 0);
  decode.check_invariants();
}

TEST_P(EngineHandoff, AHandoffThatWouldNeverFitIsRefusedAtSubmit) {
  Engine prefill(load(GetParam()), {.max_num_seqs = 4});
  const std::vector<int32_t> prompt = salted_prompt(40, 6);
  const int64_t id = prefill.submit(prompt, params(3, 0, /*handoff=*/true));
  const Outcome o = drain(prefill).at(id);
  Engine decode(load(GetParam()), {.max_num_seqs = 2, .max_model_len = 41});
  try {
    decode.submit_handoff(prompt, o.tokens[0], o.handoff.data(), o.handoff.size(), params(3, 0));
    ADD_FAILURE() << "a request longer than max_model_len was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("max_model_len"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(decode.idle());
}

DSV41RT_INSTANTIATE_BACKENDS(EngineHandoff);

}  // namespace
}  // namespace dsv41rt::engine
