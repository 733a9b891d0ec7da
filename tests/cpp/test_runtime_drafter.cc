// The DSpark drafter driven by the runtime (RuntimeOptions::load_drafter, Runtime::draft_greedy):
// it reads the target features the sequence's own forwards captured, so its block equals the
// standalone drafter's over the features record_decisions reports; after a rollback it drafts as
// a fresh sequence of the shorter length; a draft -> verify loop gives bitwise plain greedy
// decoding. Needs DSV41RT_TEST_CHECKPOINT (tiny-v41, which has DSpark weights).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "core/status.h"
#include "direct_sequence_test_util.h"
#include "dsv41rt/runtime.hpp"
#include "runtime/model/drafter.h"

namespace {

using dsv41rt::Runtime;
using dsv41rt::StatusCode;

using dsv41rt::testing::code_of;
const char* checkpoint() { return dsv41rt::testing::tiny_checkpoint(); }

dsv41rt::RuntimeOptions options(bool drafter, bool record = false) {
  dsv41rt::RuntimeOptions o;
  o.checkpoint = checkpoint();
  o.pool.kv_memory = 64 << 20;
  o.pool.max_num_seqs = 8;
  o.engine_thread = false;
  o.load_drafter = drafter;
  o.record_decisions = record;
  return o;
}

std::vector<int32_t> ids(int64_t n, uint32_t seed) {
  uint32_t x = seed * 2654435761u + 7u;
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (auto& v : t) {
    x = x * 1664525u + 1013904223u;
    v = int32_t(3 + (x >> 8) % 129000u);
  }
  return t;
}

int32_t last_argmax(Runtime& rt, int64_t seq, const std::vector<int32_t>& t) {
  std::vector<float> logits(size_t(rt.info().vocab_size));
  rt.forward(seq, t.data(), int64_t(t.size()), false, logits.data());
  return int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

}  // namespace

TEST(RuntimeDrafter, DraftsFromTheFeaturesItsForwardsCaptured) {
  NEED_CHECKPOINT();
  Runtime rt(options(true, /*record=*/true));
  dsv41rt::model::Drafter standalone(checkpoint(), /*cache_quant=*/true);
  const dsv41rt::ModelConfig& c = standalone.plan().config;
  const int64_t H = c.hidden_size, T = int64_t(c.dspark->target_layer_ids.size());
  for (const int64_t len : {1, 5, 30}) {
    const std::vector<int32_t> prompt = ids(len, uint32_t(len));
    const int64_t seq = rt.open_sequence();
    const int32_t last = last_argmax(rt, seq, prompt);
    // The features record_decisions reports for the prompt, in the drafter's layout.
    const dsv41rt::Decisions d = rt.decisions();
    std::vector<float> features(size_t(len * T * H));
    for (int64_t t = 0; t < T; ++t) {
      const std::vector<float>& rows = d.dspark_features.at(c.dspark->target_layer_ids[size_t(t)]);
      for (int64_t r = 0; r < len; ++r) {
        std::copy(rows.begin() + r * H, rows.begin() + (r + 1) * H,
                  features.begin() + (r * T + t) * H);
      }
    }
    dsv41rt::model::DraftInputs in;
    in.features = features.data();
    in.context = len;
    in.width = T * H;
    in.anchor = len;
    in.ids.assign(size_t(c.dspark->block_size), c.dspark->noise_token_id);
    in.ids[0] = last;
    in.previous.assign(size_t(c.dspark->block_size), last);
    const dsv41rt::model::DraftOutputs want = standalone.draft_greedy(in);
    const dsv41rt::DraftBlock got = rt.draft_greedy(seq, last);
    EXPECT_EQ(got.tokens, want.tokens) << "prompt of " << len;
    EXPECT_EQ(got.confidence, want.confidence) << "prompt of " << len;
    EXPECT_EQ(int64_t(got.tokens.size()), c.dspark->block_size);
    rt.close_sequence(seq);
  }
}

TEST(RuntimeDrafter, AfterARollbackDraftsAsTheShorterSequence) {
  NEED_CHECKPOINT();
  Runtime rt(options(true));
  const std::vector<int32_t> text = ids(40, 3);
  const std::vector<int32_t> prefix(text.begin(), text.begin() + 20);
  const int64_t seq = rt.open_sequence();
  last_argmax(rt, seq, prefix);
  std::vector<float> logits(size_t(6 * rt.info().vocab_size));
  rt.forward(seq, text.data() + 20, 6, true, logits.data(), /*undoable=*/true);
  rt.rollback(seq, 4);  // 22 positions kept
  const int64_t fresh = rt.open_sequence();
  last_argmax(rt, fresh, std::vector<int32_t>(text.begin(), text.begin() + 22));
  auto same = [&](int32_t last) {
    const dsv41rt::DraftBlock a = rt.draft_greedy(seq, last), b = rt.draft_greedy(fresh, last);
    EXPECT_EQ(a.tokens, b.tokens);
    EXPECT_EQ(a.confidence, b.confidence);
  };
  same(text[22]);
  // Decoding on (decode_greedy keeps the features too) drafts as a fresh sequence does.
  const int32_t fed[2] = {text[22], text[22]};
  int32_t next[2] = {0, 0};
  float logprob[2] = {0, 0};
  rt.decode_greedy({seq, fresh}, fed, next, logprob);
  EXPECT_EQ(next[0], next[1]);
  same(text[23]);
  rt.check_invariants();
}

TEST(RuntimeDrafter, DraftVerifyLoopIsPlainGreedyBitwise) {
  NEED_CHECKPOINT();
  Runtime rt(options(true));
  for (const int64_t len : {3, 40}) {
    const std::vector<int32_t> prompt = ids(len, uint32_t(100 + len));
    const int64_t plain = rt.open_sequence();
    std::vector<int32_t> greedy{last_argmax(rt, plain, prompt)};
    while (greedy.size() < 20) {
      int32_t next = 0;
      float logprob = 0;
      rt.decode_greedy({plain}, &greedy.back(), &next, &logprob);
      greedy.push_back(next);
    }
    const int64_t seq = rt.open_sequence();
    std::vector<int32_t> stream{last_argmax(rt, seq, prompt)};
    while (stream.size() < 16) {
      const std::vector<int32_t> draft = rt.draft_greedy(seq, stream.back()).tokens;
      const std::vector<int32_t> out = rt.verify_greedy(seq, stream.back(), draft);
      rt.check_invariants();
      stream.insert(stream.end(), out.begin(), out.end());
    }
    EXPECT_EQ(stream, std::vector<int32_t>(greedy.begin(), greedy.begin() + int64_t(stream.size())))
        << "prompt of " << len;
    rt.close_sequence(plain);
    rt.close_sequence(seq);
  }
}

TEST(RuntimeDrafter, RefusalsNameTheCause) {
  NEED_CHECKPOINT();
  {
    Runtime plain(options(false));
    const int64_t seq = plain.open_sequence();
    last_argmax(plain, seq, ids(10, 1));
    EXPECT_EQ(code_of([&] { plain.draft_greedy(seq, 5); }), StatusCode::kUnsupported);
  }
  Runtime rt(options(true));
  const int64_t seq = rt.open_sequence();
  last_argmax(rt, seq, ids(12, 2));
  EXPECT_EQ(code_of([&] { rt.draft_greedy(seq + 9, 5); }), StatusCode::kNotFound);
  EXPECT_EQ(code_of([&] { rt.draft_greedy(seq, -1); }), StatusCode::kInvalidArgument);
  // An imported sequence carries no features until it has run sliding_window positions.
  const std::vector<uint8_t> blob = rt.export_sequence(seq);
  const int64_t copy = rt.import_sequence(blob.data(), blob.size());
  EXPECT_EQ(code_of([&] { rt.draft_greedy(copy, 5); }), StatusCode::kOutOfRange);
  last_argmax(rt, copy, ids(8, 4));
  EXPECT_EQ(code_of([&] { rt.draft_greedy(copy, 5); }), StatusCode::kOk);
  dsv41rt::RuntimeOptions tp = options(true);
  tp.parallel.tensor_parallel_size = 2;
  EXPECT_EQ(code_of([&] { Runtime r(tp); }), StatusCode::kUnsupported);
}
