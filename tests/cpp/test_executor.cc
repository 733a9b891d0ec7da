// The executor through its C++ interface on the tiny checkpoint (DSV41RT_TEST_CHECKPOINT, generated
// by scripts/test.sh): context parallelism over LocalComm threads, state copies (fork), the bf16
// emulation and sampling inside the forward. The Python suites check these against references;
// they are here so that the sanitizer builds (ASan + UBSan, TSan) run the same code paths.
#include <gtest/gtest.h>

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

TEST(Executor, ContextParallelPrefillEqualsOneRank) {
  NEED_CHECKPOINT();
  auto one = load({});
  ExecutorOptions cp;
  cp.cp_size = 3;
  auto three = load(cp);
  const std::vector<int32_t> p = prompt(37);
  Held a(*one), b(*three);
  EXPECT_TRUE(bitwise_equal(a.run(p), b.run(p)));
  EXPECT_TRUE(bitwise_equal(a.run({17}), b.run({17})));  // decode continues from the replicas
}

TEST(Executor, ForkedStateContinuesAsTheSource) {
  NEED_CHECKPOINT();
  auto e = load({});
  Held src(*e), dst(*e);
  src.run(prompt(21));
  ASSERT_TRUE(e->pool().ensure_pages(dst.pages, src.length));
  dst.length = src.length;
  e->copy_state(src.view(), dst.view());
  for (int32_t t : {5, 900, 77}) EXPECT_TRUE(bitwise_equal(src.run({t}), dst.run({t})));
}

TEST(Executor, Bf16EmulationIsDeterministicAndNearFp32) {
  NEED_CHECKPOINT();
  ExecutorOptions bf16;
  bf16.precision = "bf16";
  auto e = load(bf16), ref = load({});
  const std::vector<int32_t> p = prompt(24);
  Held a(*e), b(*e), c(*ref);
  const std::vector<float> x = a.run(p), y = b.run(p), z = c.run(p);
  EXPECT_TRUE(bitwise_equal(x, y));
  double err = 0, scale = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    err = std::max(err, double(std::abs(x[i] - z[i])));
    scale = std::max(scale, double(std::abs(z[i])));
  }
  EXPECT_GT(err, 0.0);           // the emulation rounds: not the FP32 path
  EXPECT_LT(err, 0.25 * scale);  // ... but the same model
}

TEST(Executor, SamplesInsideTheForward) {
  NEED_CHECKPOINT();
  auto e = load({});
  Held a(*e);
  const std::vector<int32_t> p = prompt(9);
  ASSERT_TRUE(e->pool().ensure_pages(a.pages, int64_t(p.size())));
  SampleSpec spec;
  spec.params.temperature = 0.7f;
  spec.params.seed = 3;
  spec.params.top_logprobs = 2;
  spec.prompt = p.data();
  spec.n_prompt = int64_t(p.size());
  kernels::SampledToken out{-1, 0.0f, {}, {}};
  std::vector<BatchItem> batch(1);
  batch[0].request = a.view();
  batch[0].tokens = p.data();
  batch[0].n = int64_t(p.size());
  batch[0].sample = &spec;
  batch[0].sampled = &out;
  e->forward(batch);
  EXPECT_GE(out.token, 0);
  EXPECT_LT(out.token, e->plan().config.vocab_size);
  EXPECT_LE(out.logprob, 0.0f);
  EXPECT_EQ(out.top_ids.size(), 2u);
  batch[0].sampled = nullptr;  // a sampling item without an output is refused, not written
  EXPECT_THROW(e->forward(batch), Error);
}

}  // namespace
}  // namespace dsv41rt::model
