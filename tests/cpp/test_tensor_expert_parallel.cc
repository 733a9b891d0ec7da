// Tensor and expert parallelism on the CPU backend (virtual ranks over LocalComm,
// DSV41RT_TEST_CHECKPOINT = tiny-v41: 4 heads, 2 output groups, 8 routed experts; TP 4 gathers
// the heads' outputs instead of the groups'): every rank runs every token with its shards (heads,
// output groups, vocabulary rows; experts) and every collective keeps the one-rank reduction
// order (all-gathers, exact slot sums), so prefill logits and decoded tokens equal one rank's
// bitwise.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "core/safetensors.h"
#include "core/status.h"
#include "held_request.h"
#include "runtime/model/engram_tables.h"
#include "runtime/model/executor.h"
#include "runtime/model/layer_plan.h"
#include "runtime/model/model_config.h"

namespace dsv41rt::model {
namespace {

const char* checkpoint() { return std::getenv("DSV41RT_TEST_CHECKPOINT"); }

std::shared_ptr<Executor> load(ExecutorOptions options) {
  const std::string dir = checkpoint();
  ModelPlan plan = build_model_plan(load_model_config(dir));
  EngramTables tables = load_engram_tables(dir, plan.config);
  ModelWeights weights = load_weights(std::make_shared<Checkpoint>(dir), plan);
  options.kv_memory = 64ll << 20;
  options.max_num_seqs = 4;
  return make_executor(std::move(plan), std::move(weights), std::move(tables), options);
}

std::vector<int32_t> prompt(int64_t n) {
  std::vector<int32_t> p(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) p[size_t(i)] = int32_t((i * 7919 + 13) % 120000 + 3);
  p[0] = 0;
  return p;
}

using dsv41rt::testing::Held;

bool bitwise_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

int32_t argmax_last(const std::vector<float>& logits, int64_t vocab) {
  auto last = logits.end() - vocab;
  return int32_t(std::max_element(last, logits.end()) - last);
}

#define NEED_CHECKPOINT() \
  if (!checkpoint()) GTEST_SKIP() << "set DSV41RT_TEST_CHECKPOINT to a tiny-v41 checkpoint"

TEST(TensorExpertParallel, PrefillAndGreedyDecodeEqualOneRankBitwise) {
  NEED_CHECKPOINT();
  auto one = load({});
  const int64_t V = one->plan().config.vocab_size;
  const std::vector<int32_t> p = prompt(37);
  Held a(*one);
  std::vector<std::vector<float>> want{a.run(p)};
  for (int i = 0; i < 8; ++i) want.push_back(a.run({argmax_last(want.back(), V)}));
  struct Sizes {
    int64_t tp, ep, cp;
  };
  // With cp > 1: a grid of CP ranks over tensor/expert groups (prefill split over the CP ranks).
  for (Sizes z : {Sizes{1, 2, 1}, Sizes{1, 4, 1}, Sizes{2, 1, 1}, Sizes{2, 2, 1}, Sizes{4, 4, 1},
                  Sizes{2, 2, 2}, Sizes{1, 2, 3}}) {
    ExecutorOptions o;
    o.tp_size = z.tp, o.ep_size = z.ep, o.cp_size = z.cp;
    auto group = load(o);
    EXPECT_EQ(group->backend_stats().tp_size, z.tp);
    EXPECT_EQ(group->backend_stats().ep_size, z.ep);
    EXPECT_EQ(group->backend_stats().cp_size, z.cp);
    Held b(*group);
    std::vector<float> got = b.run(p);
    EXPECT_TRUE(bitwise_equal(got, want[0]))
        << "tp " << z.tp << " ep " << z.ep << " cp " << z.cp << ": prefill";
    for (size_t i = 1; i < want.size(); ++i) {
      got = b.run({argmax_last(got, V)});
      EXPECT_TRUE(bitwise_equal(got, want[i]))
          << "tp " << z.tp << " ep " << z.ep << " cp " << z.cp << ": decode step " << i;
    }
  }
}

TEST(TensorExpertParallel, SizesThatCannotWorkFailAtLoadNamingWhy) {
  NEED_CHECKPOINT();
  ExecutorOptions three;
  three.ep_size = 3;  // 8 experts
  try {
    load(three);
    ADD_FAILURE() << "expert_parallel_size 3 over 8 experts loaded";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), StatusCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("does not divide the 8 routed experts"), std::string::npos)
        << e.what();
  }
  ExecutorOptions zero;
  zero.ep_size = 0;
  EXPECT_THROW(load(zero), Error);
  ExecutorOptions tp8;
  tp8.tp_size = 8;  // 4 heads
  try {
    load(tp8);
    ADD_FAILURE() << "tensor_parallel_size 8 over 4 heads loaded";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), StatusCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("does not divide the 4 attention heads"),
              std::string::npos)
        << e.what();
  }
  ExecutorOptions mixed;
  mixed.tp_size = 2, mixed.ep_size = 4;
  try {
    load(mixed);
    ADD_FAILURE() << "tp 2 with ep 4 loaded";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), StatusCode::kUnsupported) << e.what();
  }
}

}  // namespace
}  // namespace dsv41rt::model
