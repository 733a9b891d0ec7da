// Tensor and expert parallelism on the CPU backend (virtual ranks over LocalComm,
// DSV41RT_TEST_CHECKPOINT = tiny-v41: 4 heads, 2 output groups, 8 routed experts; TP 4 gathers
// the heads' outputs instead of the groups'): every rank runs every token with its shards (heads,
// output groups, vocabulary rows; experts) and every collective keeps the one-rank reduction
// order (all-gathers, exact slot sums), so prefill logits and decoded tokens equal one rank's
// bitwise.
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "executor_test_util.h"
#include "held_request.h"
#include "runtime/model/executor.h"

namespace dsv41rt::model {
namespace {

using dsv41rt::testing::bitwise_equal;
using dsv41rt::testing::Held;
using dsv41rt::testing::load;
using dsv41rt::testing::prompt;

int32_t argmax_last(const std::vector<float>& logits, int64_t vocab) {
  auto last = logits.end() - vocab;
  return int32_t(std::max_element(last, logits.end()) - last);
}

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

// Loading `options` fails with `kind` and a message containing `text`.
void expect_load_error(ExecutorOptions options, StatusCode kind, const std::string& text) {
  try {
    load(options);
    ADD_FAILURE() << "loaded; expected: " << text;
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), kind) << e.what();
    EXPECT_NE(std::string(e.what()).find(text), std::string::npos) << e.what();
  }
}

TEST(TensorExpertParallel, SizesThatCannotWorkFailAtLoadNamingWhy) {
  NEED_CHECKPOINT();
  ExecutorOptions o;
  o.ep_size = 3;  // 8 experts
  expect_load_error(o, StatusCode::kInvalidArgument, "does not divide the 8 routed experts");
  o.ep_size = 0;
  expect_load_error(o, StatusCode::kInvalidArgument, "expert_parallel_size 0 must be in [1, 64]");
  o.ep_size = 1, o.tp_size = 8;  // 4 heads
  expect_load_error(o, StatusCode::kInvalidArgument, "does not divide the 4 attention heads");
  o.tp_size = 2, o.ep_size = 4;
  expect_load_error(o, StatusCode::kUnsupported, "needs the same size (or 1)");
}

}  // namespace
}  // namespace dsv41rt::model
