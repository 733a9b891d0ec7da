// The DeepSeek-V4 forward on the CPU executor (issue 25, docs/design/v4.md) on a tiny-v4
// checkpoint (DSV41RT_TEST_V4_CHECKPOINT, made by scripts/test.sh): chunked prefill and decode give
// one-shot prefill's logits bitwise (the CPU's rows do not depend on the batch; every compressor's
// decode form is its prefill form), and two requests in one forward give each one's own logits.
// Agreement with transformers is tests/python/test_oracle_v4.py's; here the forward also runs
// under the sanitizer builds. The same with V4's quantised cache rows (cache_quant: 584-byte
// window / compressed rows, Hadamard-rotated MXFP4 index keys) on a tiny-v4-d512 checkpoint
// (DSV41RT_TEST_V4_D512_CHECKPOINT: the one head_dim those rows hold).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "core/safetensors.h"
#include "held_request.h"
#include "runtime/model/engram_tables.h"
#include "runtime/model/executor.h"
#include "runtime/model/layer_plan.h"
#include "runtime/model/model_config.h"
#include "runtime/model/weights.h"

namespace dsv41rt {
namespace {

using testing::Held;

const char* checkpoint() { return std::getenv("DSV41RT_TEST_V4_CHECKPOINT"); }
const char* d512_checkpoint() { return std::getenv("DSV41RT_TEST_V4_D512_CHECKPOINT"); }

#define REQUIRE_V4_CHECKPOINT() \
  if (!checkpoint()) GTEST_SKIP() << "set DSV41RT_TEST_V4_CHECKPOINT to a tiny-v4 checkpoint"
#define REQUIRE_D512_CHECKPOINT()                                          \
  if (!d512_checkpoint())                                                  \
  GTEST_SKIP() << "set DSV41RT_TEST_V4_D512_CHECKPOINT to a tiny-v4-d512 " \
                  "checkpoint (dsv41rt make-checkpoint --preset tiny-v4-d512)"

std::shared_ptr<model::Executor> load_v4(const std::string& dir = checkpoint(),
                                         bool cache_quant = false) {
  ModelPlan plan = build_model_plan(load_model_config(dir));
  model::EngramTables tables = model::load_engram_tables(dir, plan.config);
  model::ModelWeights weights =
      model::load_weights(std::make_shared<Checkpoint>(dir), plan, /*host_values=*/true);
  model::ExecutorOptions o;
  o.cache_quant = cache_quant;
  o.page_tokens = 128;
  o.kv_memory = 64ll << 20;
  o.max_num_seqs = 4;
  return model::make_executor(std::move(plan), std::move(weights), std::move(tables), o);
}

std::vector<int32_t> prompt(int64_t n, int64_t salt) {
  std::vector<int32_t> p(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i)
    p[size_t(i)] = int32_t((i * 7919 + salt * 104729 + 13) % 120000 + 3);
  return p;
}

bool bitwise_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

void chunks_and_decode_equal_one_shot(model::Executor& ex) {
  model::Executor* e = &ex;
  const std::vector<int32_t> p = prompt(140, 1);  // crosses the HCA group at 128 while decoding
  Held whole(*e), parts(*e);
  const std::vector<float> want = whole.run(p);
  for (float v : want) ASSERT_TRUE(std::isfinite(v));
  std::vector<float> got;
  int64_t at = 0;
  for (int64_t size : {5, 50, 71}) {
    const std::vector<float> l = parts.run({p.begin() + at, p.begin() + at + size});
    got.insert(got.end(), l.begin(), l.end());
    at += size;
  }
  for (; at < int64_t(p.size()); ++at) {
    const std::vector<float> l = parts.run({p[size_t(at)]});
    got.insert(got.end(), l.begin(), l.end());
  }
  EXPECT_TRUE(bitwise_equal(got, want));
}

void two_requests_equal_each_alone(model::Executor& ex) {
  model::Executor* e = &ex;
  const std::vector<int32_t> a = prompt(130, 2), b = prompt(9, 3);
  std::vector<float> alone_a, alone_b;
  {
    Held x(*e), y(*e);
    alone_a = x.run(a);
    alone_b = y.run(b);
  }
  Held x(*e), y(*e);
  ASSERT_TRUE(e->pool().ensure_pages(x.pages, int64_t(a.size())));
  ASSERT_TRUE(e->pool().ensure_pages(y.pages, int64_t(b.size())));
  const int64_t V = e->plan().config.vocab_size;
  std::vector<float> la(a.size() * size_t(V)), lb(b.size() * size_t(V));
  std::vector<model::BatchItem> batch(2);
  batch[0].request = x.view(), batch[0].tokens = a.data(), batch[0].n = int64_t(a.size());
  batch[0].logits = la.data();
  batch[1].request = y.view(), batch[1].tokens = b.data(), batch[1].n = int64_t(b.size());
  batch[1].logits = lb.data();
  e->forward(batch);
  EXPECT_TRUE(bitwise_equal(la, alone_a));
  EXPECT_TRUE(bitwise_equal(lb, alone_b));
}

TEST(V4Forward, ChunksAndDecodeEqualOneShotPrefill) {
  REQUIRE_V4_CHECKPOINT();
  chunks_and_decode_equal_one_shot(*load_v4());
}

TEST(V4Forward, TwoRequestsInOneForwardEqualEachAlone) {
  REQUIRE_V4_CHECKPOINT();
  two_requests_equal_each_alone(*load_v4());
}

// The forward QDQs its own rows with the cache codec (cache_qdq), so tokens read back from the
// 584-byte rows and this forward's agree: chunking and batching stay bitwise.
TEST(V4ForwardQuantised, ChunksAndDecodeEqualOneShotPrefill) {
  REQUIRE_D512_CHECKPOINT();
  chunks_and_decode_equal_one_shot(*load_v4(d512_checkpoint(), true));
}

TEST(V4ForwardQuantised, TwoRequestsInOneForwardEqualEachAlone) {
  REQUIRE_D512_CHECKPOINT();
  two_requests_equal_each_alone(*load_v4(d512_checkpoint(), true));
}

TEST(V4ForwardQuantised, TheQuantisedRowsAreReallyUsed) {
  REQUIRE_D512_CHECKPOINT();
  auto q = load_v4(d512_checkpoint(), true), f = load_v4(d512_checkpoint(), false);
  EXPECT_EQ(q->layout().window_row_bytes(), 584);
  EXPECT_EQ(f->layout().window_row_bytes(), 512 * 4);
  const std::vector<int32_t> p = prompt(40, 4);
  Held hq(*q), hf(*f);
  const std::vector<float> lq = hq.run(p), lf = hf.run(p);
  ASSERT_EQ(lq.size(), lf.size());
  double worst = 0.0, scale = 0.0;
  for (size_t i = 0; i < lq.size(); ++i) {
    ASSERT_TRUE(std::isfinite(lq[i]));
    worst = std::max(worst, double(std::fabs(lq[i] - lf[i])));
    scale = std::max(scale, double(std::fabs(lf[i])));
  }
  EXPECT_GT(worst, 0.0);    // the QDQ moved something
  EXPECT_LT(worst, scale);  // and the rows still carry the values (closeness: the oracle test)
}

}  // namespace
}  // namespace dsv41rt
